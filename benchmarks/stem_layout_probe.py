"""Issue 18, timm_resnet50: which memory layout AOTInductor gives the fused stem's
convolution. One GPU call, ~2-3 minutes, no bundles.

Why: with the stem fused (``fused.StemConv`` then ``StemPool``, 2026-12-07) the module
under ``torch.compile`` ran 62 us faster at batch 32 on an H100, but the bundle's
package ran the stem's convolution on NCHW data: cuDNN converted its input and weight
to NHWC and its output back (0.065 + 0.053 ms), and a copy made the pool's NHWC input
(0.033 ms), where the unfused stem had none of these (docs/measurements/h100-2026-12-07-d).

Each variant is a stem-only engine module (fp32 NCHW in, the first block's e4m3 input
out, as float), exported with a dynamic batch and compiled by AOTInductor as a bundle
build does (``build.compile_package``), then profiled at batch 32: every kernel a replay
launches, with its time. Variants:

* ``unfused``: the stem as the fused model had it before (the convolution with its bias,
  ReLU, max pool, then the quantize);
* ``fused``: ``StemConv`` then ``StemPool``;
* ``fused-nhwc-out``: the same with ``StemConv``'s output made channels_last explicitly;
* ``fused-force-layout``: ``fused`` compiled with Inductor's ``force_layout_optimization``;
* ``model`` and ``model-unfused``: the whole fused fp8 timm_resnet50 (random weights, the
  family's TMA form) with the stem fused and not, a dynamic-batch graph only (no static
  ones), its stem's kernels printed (the whole model's were where the layout went wrong).

    python3 benchmarks/stem_layout_probe.py [--variants unfused,fused,...] [--batch 32]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn

if str(Path(__file__).resolve().parents[1]) not in sys.path:   # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VARIANTS = ("unfused", "fused", "fused-nhwc-out", "fused-force-layout", "model",
            "model-unfused")


def model_module(fuse_stem: bool) -> nn.Module:
    """The whole fused fp8 timm_resnet50 engine module (module docstring)."""
    import numpy as np

    from bundler.families import load_family
    from bundler.targets.torch_aoti.fused import rewrite_fused
    from bundler.targets.torch_aoti.kernels.fp8_conv_tma import MEASURED_TMA_TILES_BY_BATCH
    from bundler.targets.torch_aoti.nhwc_modules import EngineModule
    from bundler.torch_model import build_torch_model

    model = build_torch_model(load_family("timm_resnet50"), seed=0)
    fp8 = {n: (0.02, np.full(m.out_channels, 1e-3, np.float32))
           for n, m in model.named_modules() if isinstance(m, nn.Conv2d) and n != "conv1"}
    body = rewrite_fused(model, fp8, tma=True, tma_batch_tiles=MEASURED_TMA_TILES_BY_BATCH,
                         fuse_stem=fuse_stem)
    return EngineModule(body, torch.float16, False, True).cuda().eval()


def stem_module(variant: str) -> nn.Module:
    """The stem-only engine module of ``variant`` (module docstring)."""
    if variant.startswith("model"):
        return model_module(variant == "model")
    from bundler.targets.torch_aoti.fp8_layers import quantize
    from bundler.targets.torch_aoti.fused import StemConv, StemPool, scale_tensor
    from bundler.targets.torch_aoti.nhwc_modules import EngineModule

    torch.manual_seed(0)
    conv = nn.Conv2d(3, 64, 7, 2, 3)

    class Unfused(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 64, 7, 2, 3).half()
            self.conv.load_state_dict(conv.half().state_dict())
            self.act, self.pool = nn.ReLU(), nn.MaxPool2d(3, 2, 1)
            self.register_buffer("scale", scale_tensor(0.01))

        def forward(self, x):
            y = self.pool(self.act(self.conv(x)))
            return quantize(y.permute(0, 2, 3, 1), self.scale[:1]).float()

    class Fused(nn.Module):
        def __init__(self, nhwc_out: bool) -> None:
            super().__init__()
            self.conv, self.pool = StemConv(conv), StemPool(conv, 0.01, out16=False)
            self.nhwc_out = nhwc_out

        def forward(self, x):
            y = self.conv(x)
            if self.nhwc_out:
                y = y.contiguous(memory_format=torch.channels_last)
            return self.pool(y)[1].float()

    body = Unfused() if variant == "unfused" else Fused(variant == "fused-nhwc-out")
    return EngineModule(body.to(memory_format=torch.channels_last), torch.float16, False,
                        True).cuda().eval()


def profile_package(path: Path, batch: int, label: str) -> list[dict]:
    """The kernels of one call of the package at ``batch`` (``kernel_profile.kernel_table``:
    name, ms, calls per run), by time, without printing them."""
    from kernel_profile import kernel_table

    runner = torch._inductor.aoti_load_package(str(path))
    x = torch.randn(batch, 3, 224, 224, device="cuda")
    return kernel_table(lambda: runner(x), label, rows=200, log=lambda _line: None)["top"]


def main() -> int:
    from bench_args import positive_int

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--batch", type=positive_int, default=32)
    p.add_argument("--strict", action="store_true",
                   help="export with Dynamo (strict=True), as a build does for a model with "
                        "TMA layers (fused.uses_tma: the family's fp8 form)")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("stem_layout_probe.py needs a CUDA GPU; none is visible", file=sys.stderr)
        return 2
    from bundler.targets.torch_aoti import build
    from bundler.targets.torch_aoti.build import DEFAULT_COMPILE_OPTIONS, compile_package

    if args.strict:      # this process only: every variant exported as a TMA model is
        build.export_strict = lambda *modules: True

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    for variant in args.variants.split(","):
        if variant not in VARIANTS:
            print(f"{variant}: unknown; choose from {', '.join(VARIANTS)}")
            continue
        options = dict(DEFAULT_COMPILE_OPTIONS)
        if variant == "fused-force-layout":
            options["force_layout_optimization"] = True
        try:
            with tempfile.TemporaryDirectory() as tmp:
                path, _ = compile_package(stem_module(variant), (3, 224, 224),
                                          {"min": 1, "max": 32}, "cuda", options,
                                          Path(tmp) / "stem.pt2")
                rows = profile_package(path, args.batch, variant)
        except Exception as e:   # noqa: BLE001 - report and go on to the next variant
            print(f"== {variant}: failed {type(e).__name__}: {str(e)[:300]}", flush=True)
            continue
        total = sum(r["ms"] for r in rows)
        print(f"== {variant}{' (strict export)' if args.strict else ''}: {total:.4f} ms of kernels at batch {args.batch}", flush=True)
        for row in rows:
            name, n, t = row["name"], row["calls"], row["ms"]
            if variant.startswith("model") and not any(
                    k in name for k in ("nchw", "nhwc", "Nhwc", "Nchw", "permute", "maxpool",
                                        "max_pool", "image_first", "convolution", "relu_1")):
                continue      # the whole model: the stem's kernels
            print(f"   {t:.4f} ms  x{n}  {name[:110]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
