"""Issue 18: what a family's first convolution (3 input channels) costs in fp16 on the GPU,
as the bundles run it and with its input channels padded to 4 or 8. One GPU call, ~1 min.

Why: in timm_xception's fp16 bundle at batch 32 on the H200 (and in the torch.compile peer,
so not a layout decision of the package) the stem's 3x3 stride-2 convolution from 3 to 32
channels ran cuDNN's ``precomputed_convolve_sgemm`` (0.144 ms) after an ``nhwcToNchw``
conversion of its input (0.088 ms): 0.23 ms of ~4.1 (docs/measurements/h200-2026-12-04-b).
timm_resnet50's 7x7 stem, also 3 channels, runs cuDNN's NHWC ``image_first_layer`` kernel,
which pads the channels to 4 itself (``nhwcAddPaddingKernel``, 0.015 ms). If padding the
input to 4 or 8 channels (zeros, and zero weights for them: the same output) lets cuDNN
pick an NHWC tensor-core kernel for xception's stem too, the saving is the ~0.09 ms the
fp8 bundle needs for 1.25x its fp16 engine at batch 32 (the fp16 engine would gain too).

Variants, each compiled with ``torch.compile`` (static shapes) from the engine's float32
NCHW input, as the bundle's graph starts (cast to fp16, channels_last) and timed by CUDA
graph replay (``fp8_conv_bench.graph_time``), with the kernels of one call at the largest
batch (``kernel_profile.kernel_table``):

* ``as-is``: cast, channels_last, the convolution (the bundle's form);
* ``pad4`` / ``pad8``: the same with zero channels appended before the convolution (Inductor
  fuses the pad into the cast) and the weight padded with zeros to match;
* ``nchw``: cast and the convolution on contiguous (NCHW) memory;
* ``w-oihw``: as-is with the weight left in contiguous (OIHW) memory, as the fp8 bundle's
  NHWC rewrite keeps its stem (``ConvNHWC``; the channels_last form converts every weight).

``--pixels``: each variant behind the bundles' uint8 head (NHWC pixels -> float, NCHW view,
``x * scale + bias``) with a bias and a ReLU after the convolution, as the engines run their
BN-folded stem. Why: on the H100 (h100-2026-12-07-f) the probe's as-is form ran an NHWC
kernel (0.054 ms at batch 32) while the fp16 bundle and the peer ran the NCHW
``precomputed_convolve_sgemm`` (0.154 ms) after ``nhwcToNchw`` (0.094 ms), and the fp8 bundle
(weight in OIHW memory) the NHWC kernel; the pixel head and the weight's memory are what
the bundles' forms add.

    python3 benchmarks/first_conv_probe.py [--family timm_xception] [--batch-sizes 1,32] [--pixels]
    python3 benchmarks/first_conv_probe.py --list     # the convolution's shape, no GPU
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

VARIANTS = ("as-is", "pad4", "pad8", "nchw", "w-oihw")


def first_conv(family_name: str):
    """(the family's input shape (C, H, W), its model's first Conv2d, that conv's path):
    the convolution that reads the image."""
    from torch import nn

    from bundler.families import load_family
    from bundler.torch_model import build_torch_model

    family = load_family(family_name)
    model = build_torch_model(family, seed=0)
    for path, module in model.named_modules():
        if isinstance(module, nn.Conv2d):
            return tuple(family.input.shape), module, path
    raise SystemExit(f"{family_name}: its model has no Conv2d")


def variant_module(conv, variant: str, device: str = "cuda", pixels: bool = False):
    """fp32 NCHW image in (``pixels``: uint8 NHWC pixels), the convolution's fp16 output
    (``pixels``: with a bias and a ReLU): the engine's first steps."""
    import torch
    from torch import nn

    channels = {"pad4": 4, "pad8": 8}.get(variant, conv.in_channels)
    weight = conv.weight.detach().half()
    if channels > conv.in_channels:
        weight = torch.cat([weight, weight.new_zeros(weight.shape[0],
                                                     channels - conv.in_channels,
                                                     *weight.shape[2:])], dim=1)
    memory = torch.contiguous_format if variant == "nchw" else torch.channels_last
    weight_memory = torch.contiguous_format if variant == "w-oihw" else memory
    bias = conv.bias.detach().half() if conv.bias is not None else None
    if pixels and bias is None:     # a folded stem has one
        bias = torch.linspace(-0.5, 0.5, conv.out_channels, dtype=torch.half)

    class First(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("weight", weight.contiguous(memory_format=weight_memory))
            self.register_buffer("bias", bias)

        def forward(self, x):
            if pixels:      # build.pixel_head's steps, a [-1, 1] normalization
                x = x.permute(0, 3, 1, 2).float() * (2 / 255) - 1
            x = x.half()
            if channels > x.shape[1]:
                x = nn.functional.pad(x, (0, 0, 0, 0, 0, channels - x.shape[1]))
            x = x.contiguous(memory_format=memory)
            y = nn.functional.conv2d(x, self.weight, self.bias, conv.stride, conv.padding,
                                     conv.dilation, conv.groups)
            return torch.relu(y) if pixels else y

    return First().to(device).eval()


def probe_inputs(shape, batch_sizes, pixels: bool, device: str = "cuda"):
    """batch -> input: float32 NCHW images, or (``pixels``) uint8 NHWC pixels."""
    import torch

    if not pixels:
        return {n: torch.randn(n, *shape, device=device) for n in batch_sizes}
    c, h, w = shape
    return {n: torch.randint(0, 256, (n, h, w, c), dtype=torch.uint8, device=device)
            for n in batch_sizes}


def main(argv: list[str] | None = None) -> int:
    from bench_args import positive_ints

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--family", default="timm_xception")
    p.add_argument("--batch-sizes", type=positive_ints, default=[1, 32])
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--pixels", action="store_true",
                   help="uint8 NHWC pixels in, through the bundles' pixel head; bias and ReLU after")
    p.add_argument("--list", action="store_true",
                   help="print the first convolution's shape and stop (no GPU)")
    args = p.parse_args(argv)
    shape, conv, path = first_conv(args.family)
    print(f"{args.family}: {path} {tuple(conv.weight.shape)} stride {conv.stride} padding "
          f"{conv.padding} on {shape}", flush=True)
    if args.list:
        return 0
    import torch

    if not torch.cuda.is_available():
        print("first_conv_probe.py needs a CUDA GPU; none is visible (--list works without)",
              file=sys.stderr)
        return 2
    from fp8_conv_bench import graph_time
    from kernel_profile import kernel_table

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    inputs = probe_inputs(shape, args.batch_sizes, args.pixels)
    with torch.no_grad():     # what every variant must compute: the as-is form, eager
        as_is = variant_module(conv, "as-is", pixels=args.pixels)
        reference = {n: as_is(x).float() for n, x in inputs.items()}
    rows = []
    for variant in VARIANTS:
        compiled = torch.compile(variant_module(conv, variant, pixels=args.pixels), dynamic=False)
        for n, x in inputs.items():
            with torch.no_grad():
                ms, out = graph_time(lambda: compiled(x), args.iters)
                diff = float((out.float() - reference[n]).abs().max())
            rows.append((variant, n, ms, diff))
            print(f"{variant:6s} batch {n:3d}: {ms:.4f} ms (max |diff| against the as-is form in eager: {diff:.3g})",
                  flush=True)
        with torch.no_grad():
            n = max(inputs)
            kernel_table(lambda: compiled(inputs[n]), f"{variant}, batch {n}", rows=4)
    print("\nvariant  " + "  ".join(f"batch {n:>3d}" for n in args.batch_sizes)
          + "   (ms; x = as-is / variant)")
    base = {n: ms for v, n, ms, _ in rows if v == "as-is"}
    for variant in VARIANTS:
        cells = [f"{ms:.4f} {base[n] / ms:.2f}x" for v, n, ms, _ in rows if v == variant]
        print(f"{variant:8s} " + "  ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
