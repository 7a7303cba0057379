"""timm_xception's FP8 1x1 convolutions on cuBLASLt (``torch._scaled_mm``, as the fp8 engine
runs them) against the Triton implicit GEMM (``kernels/fp8_conv.py``), each with the
epilogue the engine gives the layer, per layer shape.

Why: issue 18's timm_xception fp8 target is 1.25x fp16 at batch 32; the bundle is at
1.18-1.22x. A first run (docs/measurements/h200-2026-12-04, ``skip-layers.log``) put the
blocks' skip adds in the Triton kernel's epilogue: on the 19x19 layers the Triton GEMM is
slower than cuBLASLt's by more than the add costs (the add pass, fused with the convert,
is only 6 us), but on the entry blocks' narrow layers (128 and 256 channels on 75x75 and
38x38 maps) the Triton kernel *with* the add was 1.4-1.7x faster than cuBLASLt's GEMM and
the add. So each layer shape gets the faster kernel; this says which, for the 39 layers
the depthwise kernel feeds (the 4 stride-2 shortcut layers, which quantize a strided view
of fp16, stay on cuBLASLt).

What it prints for the layers Triton wins is what a family's ``torch_aoti.
fp8_triton_pointwise`` (family.json) lists, for its depthwise form "triton-skip".

Epilogues, as ``rewrite_channels_last(depthwise="triton")`` builds them:

  raw   the GEMM's output read by the next depthwise kernel (``raw_out``): cuBLASLt's bf16
        as it is; Triton: fp16 out
  skip  the block's last layer, then ``+ shortcut`` (fp16): cuBLASLt + the add pass
        (convert and add fused by Inductor); Triton: the shortcut as its residual
  relu  the exit block's last three: ReLU after the layer (convert + ReLU pass); Triton:
        ReLU in the epilogue

Input: e4m3 NHWC as the depthwise kernel writes it (channels padded to 16), random weights.
Each timing is a CUDA graph replay (median of --iters); cuBLASLt's side is torch.compile'd
(static shapes) as in the engine. Triton: every tile set of ``CANDIDATE_CONFIGS`` and
``default_config``. Totals are count-weighted over the 39 layers; the best Triton tiles of
the shapes where Triton wins are printed as family.json entries.

  PYTHONPATH=. python3 benchmarks/pointwise_kernel_bench.py [--batch 32] [--iters 100]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: (cin, cout, map side, epilogue, layers) of timm_xception's FP8 1x1 convolutions at
#: 299x299 that a depthwise kernel feeds (stride 1), read off the model
#: (tests/test_torch_aoti_channels_last.py checks them against the rewritten model).
XCEPTION_POINTWISE = (
    (64, 128, 150, "raw", 1), (128, 128, 150, "raw", 1), (128, 128, 75, "skip", 1),
    (128, 256, 75, "raw", 1), (256, 256, 75, "raw", 1), (256, 256, 38, "skip", 1),
    (256, 728, 38, "raw", 1), (728, 728, 38, "raw", 1), (728, 728, 19, "skip", 9),
    (728, 728, 19, "raw", 17), (728, 1024, 19, "raw", 1), (1024, 1024, 10, "skip", 1),
    (1024, 1536, 10, "relu", 1), (1536, 1536, 10, "relu", 1), (1536, 2048, 10, "relu", 1),
)


def log(msg: str) -> None:
    print(msg, flush=True)


def layer_case(cin: int, cout: int, side: int, batch: int, device):
    """(Fp8Pointwise on ``device``, e4m3 NHWC input, fp16 NHWC view of a channels_last
    tensor of the output's shape) for a ``cin`` -> ``cout`` layer, random weights."""
    import numpy as np
    import torch

    from bundler.targets.torch_aoti.fp8_layers import Fp8Pointwise, OnesColumn, padded

    gen = torch.Generator().manual_seed(cin * 7 + cout)
    conv = torch.nn.Conv2d(cin, cout, 1, bias=True)
    with torch.no_grad():
        conv.weight.copy_(torch.randn(cout, cin, 1, 1, generator=gen) * cin ** -0.5)
        conv.bias.copy_(torch.randn(cout, generator=gen) * 0.1)
    wscale = (conv.weight.detach().abs().amax(dim=(1, 2, 3)) / 448).numpy().astype(np.float32)
    layer = Fp8Pointwise(conv, 0.02, wscale, torch.float16,
                         ones=OnesColumn(batch * side * side))
    layer.implicit_gemm_scale()
    layer = layer.to(device)
    kpad = padded(cin)
    x = torch.randn(batch, side, side, kpad, generator=gen) * 4
    x[..., cin:] = 0
    x8 = x.clamp(-448, 448).to(torch.float8_e4m3fn).to(device)
    skip = torch.randn(batch, cout, side, side, generator=gen).half().to(device).contiguous(
        memory_format=torch.channels_last).permute(0, 2, 3, 1)
    return layer, x8, skip


def cublas_run(layer, x8, skip, epilogue: str):
    """The engine's form of the layer, torch.compile'd."""
    import torch

    if epilogue == "raw":
        layer.raw_out = True
        return torch.compile(lambda: layer(x8), dynamic=False)
    if epilogue == "skip":
        return torch.compile(lambda: layer(x8) + skip, dynamic=False)
    return torch.compile(lambda: torch.relu(layer(x8)), dynamic=False)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--iters", type=int, default=100)
    args = p.parse_args(argv)

    import torch

    from bundler.targets.torch_aoti.kernels.fp8_conv import (CANDIDATE_CONFIGS,
                                                             default_config, fp8_conv_fused)
    from fp8_conv_bench import graph_time, rel_err

    dev = torch.device("cuda")
    log(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, batch {args.batch}")
    totals = {"cublas": 0.0, "triton-best": 0.0, "faster-of-two": 0.0}
    table = {}
    for cin, cout, side, epilogue, count in XCEPTION_POINTWISE:
        layer, x8, skip = layer_case(cin, cout, side, args.batch, dev)
        with torch.no_grad():
            t_cublas, ref = graph_time(cublas_run(layer, x8, skip, epilogue), args.iters)
        default = default_config(cin, cout, (1, 1))
        tried = {}
        for cfg in dict.fromkeys((default, *CANDIDATE_CONFIGS)):
            def run(cfg=cfg):
                return fp8_conv_fused(x8, layer.weight_fp8, layer.conv_scale, layer.bias_out,
                                      cout, (1, 1), (1, 1), (0, 0),
                                      residual=skip if epilogue == "skip" else None,
                                      relu=epilogue == "relu", config=cfg)[0]
            try:
                t, out = graph_time(run, args.iters)
                tried[cfg] = (t, rel_err(out, ref))
            except Exception as exc:  # noqa: BLE001 - a tile set that does not fit is skipped
                log(f"  {cin}->{cout}@{side} {tuple(cfg)}: failed ({type(exc).__name__}: "
                    f"{str(exc).splitlines()[0][:120]})")
        best = min(tried, key=lambda k: tried[k][0])
        t_best = tried[best][0]
        log(f"{cin:4d}->{cout:4d} @{side:3d} {epilogue:4s} x{count:2d}: cublas {t_cublas:.4f} "
            f"ms, triton best {t_best:.4f} {tuple(best)} ({t_cublas / t_best:.3f}x), "
            f"default {tried[default][0]:.4f}; err {tried[best][1]:.2e}")
        totals["cublas"] += count * t_cublas
        totals["triton-best"] += count * t_best
        totals["faster-of-two"] += count * min(t_cublas, t_best)
        if t_best < t_cublas and epilogue in ("raw", "skip"):
            table[(cin, cout, epilogue)] = (best, f"@{side}: {t_best:.4f} ms, cuBLASLt "
                                                  f"{t_cublas:.4f}")
        torch.compiler.reset()
    log("\ntotals over the 39 layers (ms): " + ", ".join(f"{k} {v:.4f}"
                                                        for k, v in totals.items()))
    log(f"the faster kernel per layer saves {totals['cublas'] - totals['faster-of-two']:.4f} "
        "ms per batch")
    log("\nthe layers where the Triton kernel wins (\"relu\" ones left out: the table takes "
        "raw and skip), as family.json torch_aoti.fp8_triton_pointwise entries:")
    for (cin, cout, epilogue), (cfg, note) in table.items():
        log(f'    {{"in": {cin}, "out": {cout}, "epilogue": "{epilogue}", '
            f'"tiles": {list(cfg)}}},   {note}')
    return 0


if __name__ == "__main__":
    sys.exit(main())
