"""Issue 18, timm_resnet50: do TMA loads make the 3x3 FP8 convolutions (and the strided 1x1
downsamples) faster than the shipped implicit-GEMM kernel? One GPU call, ~4 minutes.

Why: at batch 32 on the H200, timm_resnet50's fp8 engine is 1.154x its fp16 one against the
1.2x target, and its replay timeline says the distance is kernel time, not gaps between
kernels (docs/measurements/h200-2026-12-06-l). The dense 1x1 layers already load with TMA
(``kernels/fp8_conv_tma.py``: 1.22x the shipped kernel over those layers). The 3x3 layers
gather their rows with each thread's 16-byte ``cp.async``: a window tap of a flat row tile
is not one rectangle of memory.

It is one for a tile of output pixels that is itself a box, ``BI`` images x ``BH`` rows x
``BW`` columns (``fp8_conv_tma.fp8_conv_box_tma``): each tap is one TMA box of the input
(at stride 2, of its parity view), TMA's zero fill is the padding, and the output box is
stored whole, clipped at the edges. The cost: Triton's blocks are powers of two, so a side
that is not a multiple of the box side computes pixels that are thrown away
(``useful_share``). The epilogue is the shipped kernel's, so the outputs are the same bits
(``--interpret-check`` on the CPU, e4m3 steps on the GPU).

For each box-eligible layer of the fused model with its epilogue it prints the shipped
op's time, each candidate's (``candidates``), the best with its distance from the shipped
outputs, and the ``MEASURED_BOX_TILES`` entry to record (None where the shipped kernel
stays faster). Measured on an H100 at stride 1 (docs/measurements/h100-2026-12-07-a):
0.256 ms against 0.308 over those layers, 56x56 the one map where TMA lost.

    python3 benchmarks/fp8_tma3x3_probe.py [--batch 32] [--iters 50] [--strides 1,2] [--aoti]
    TRITON_INTERPRET=1 python3 benchmarks/fp8_tma3x3_probe.py --interpret-check   # CPU: JSON
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton

if str(Path(__file__).resolve().parents[1]) not in sys.path:   # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bundler.targets.torch_aoti.kernels.fp8_conv import (  # noqa: E402
    Fp8ConvConfig, config_for, fp8_conv_fused)
from bundler.targets.torch_aoti.kernels.fp8_conv_tma import (  # noqa: E402
    BoxTiles, box_eligible, fp8_conv_box_tma, pixel_boxes, rows_fit, useful_share)

sys.path.insert(0, str(Path(__file__).resolve().parent))   # the benchmarks' own modules
from fp8_tma_probe import cpu_or_no_gpu, e4m3_steps  # noqa: E402

from bundler.targets.torch_aoti.build import TMA_COMPILE_OPTIONS  # noqa: E402


def candidates(n: int, h: int, w: int, c: int, cout: int) -> list[BoxTiles]:
    """Tiles tried per layer: the two least wasteful 64-, 128- and 256-pixel boxes, 64 or
    128 channels a side (128 x 64 with 4 and 8 warps), the widest channel block C allows
    (128 bytes: 3 stages; 64: 4)."""
    bk, stages = (128, 3) if c % 128 == 0 else (64, 4)
    out = []
    for rows, bn, warps in ((64, 64, 4), (128, 64, 4), (128, 64, 8), (128, 128, 8),
                            (64, 128, 4), (256, 64, 8)):
        if bn <= cout:
            out += [(*box, bn, bk, warps, stages) for box in pixel_boxes(n, h, w, rows, 2)]
    return out


def _case(n: int, hw: int, c: int, cout: int, k: int, device: str, seed: int = 0):
    """Operands of one layer as the fused model has them (e4m3 input, a weight buffer padded
    past cout and KH*KW*C as the shipped op's, per-channel scales, bias)."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, hw, hw, c, generator=g).clamp_min(0) * 40).to(torch.float8_e4m3fn)
    weight = torch.zeros(cout + 16, k * k * c + 16).to(torch.float8_e4m3fn)
    weight[:cout, :k * k * c] = (torch.randn(cout, k * k * c, generator=g) * 100
                                 ).to(torch.float8_e4m3fn)
    scale = (torch.rand(cout, generator=g) + 0.5) * 2e-4 / k
    bias = torch.randn(cout, generator=g) * 0.3
    return tuple(t.to(device) for t in (x, weight, scale, bias))


def epilogue_kwargs(epilogue: tuple, device: str) -> dict:
    """The fused op's keywords for an epilogue (relu, residual, fp16 out, e4m3 out); the
    box kernel has no residual."""
    relu, residual, out16, out8 = epilogue
    if residual:
        raise ValueError("the box kernel has no residual")
    return dict(relu=relu, out_f16=out16,
                out_scale=torch.tensor(0.05, device=device) if out8 else None)


def compare(case: tuple, cout: int, k: int, stride: int, tiles: BoxTiles,
            shipped: Fp8ConvConfig, epilogue: tuple) -> dict:
    """Both kernels on one case: the e4m3 steps apart and the largest fp16 difference, for
    the outputs the epilogue writes."""
    x, weight, scale, bias = case
    kw = epilogue_kwargs(epilogue, x.device)
    s16, s8 = fp8_conv_fused(x, weight, scale, bias, cout, (k, k), (stride, stride),
                             (k // 2, k // 2), config=shipped, **kw)
    t16, t8 = fp8_conv_box_tma(x, weight, scale, bias, cout, (k, k), (k // 2, k // 2),
                               stride=stride, tiles=tiles, **kw)
    result = {}
    if s8 is not None:
        result["e4m3_steps"] = e4m3_steps(s8, t8)
        result["e4m3_nonzero"] = int((s8.float() != 0).sum())
    if s16 is not None:
        result["f16_max_diff"] = float((s16.float() - t16.float()).abs().max())
        result["f16_scale"] = float(s16.float().abs().max())
        result["f16_nonzero"] = int((s16.float() != 0).sum())
    return result


def interpret_check() -> dict:
    """Under ``TRITON_INTERPRET=1`` on the CPU: against the shipped kernel on small cases
    whose sides are not multiples of the box (edge tiles, padding at every border), with
    and without the fp16 output, a box over several images, a 1x1 layer, and at stride 2
    a 3x3 layer (both parities of rows and columns) and a 1x1 downsample (fp16 out, no
    ReLU)."""
    shipped = Fp8ConvConfig(16, 16, 32, 4, 2, 2)
    both, e4m3, f16 = (True, False, True, True), (True, False, False, True), \
        (False, False, True, False)
    cases = {"3x3 6x6 box 1x4x4": (3, 1, 6, (1, 4, 4, 32, 32, 4, 2), both),
             "3x3 5x5 box 2x2x4 e4m3 only": (3, 1, 5, (2, 2, 4, 32, 32, 4, 2), e4m3),
             "1x1 5x5 box 1x2x8": (1, 1, 5, (1, 2, 8, 32, 32, 4, 2), both),
             "3x3 s2 10x10 box 1x4x4": (3, 2, 10, (1, 4, 4, 32, 32, 4, 2), both),
             "1x1 s2 6x6 box 2x2x4 fp16 only": (1, 2, 6, (2, 2, 4, 32, 32, 4, 2), f16)}
    results = {}
    for name, (k, stride, hw, tiles, epilogue) in cases.items():
        case = _case(3, hw, 64, 48, k, "cpu")
        results[name] = compare(case, 48, k, stride, tiles, shipped, epilogue)
    return results


def aoti_check(batch: int) -> str:
    """A module on the kernel (host descriptors, 4-D), exported with Dynamo and a dynamic
    batch as the family's TMA layers are (``build.export_strict``), through AOTInductor:
    the package against eager, or why it failed."""
    import tempfile

    from bundler.targets.torch_aoti.toolchain import aoti_toolchain

    class Layer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            _x, weight, scale, bias = _case(1, 1, 64, 64, 3, "cuda")
            self.register_buffer("weight", weight)
            self.register_buffer("scale", scale)
            self.register_buffer("bias", bias)
            self.register_buffer("out_scale", torch.full((16,), 0.05, device="cuda"))

        def forward(self, x):
            _y16, y8 = fp8_conv_box_tma(x.to(torch.float8_e4m3fn), self.weight, self.scale,
                                        self.bias, 64, (3, 3), (1, 1), relu=True,
                                        out_f16=False, out_scale=self.out_scale,
                                        tiles=(1, 8, 8, 64, 64, 4, 3))
            return y8.view(torch.uint8)

    module = Layer().eval()
    x = (torch.randn(batch, 14, 14, 64, device="cuda").clamp_min(0) * 40).half()
    try:
        with tempfile.TemporaryDirectory() as tmp, aoti_toolchain():
            dim = torch.export.Dim("batch", min=1, max=32)
            program = torch.export.export(module, (x,), dynamic_shapes=({0: dim},), strict=True)
            path = torch._inductor.aoti_compile_and_package(
                program, package_path=str(Path(tmp) / "tma3x3.pt2"),
                inductor_configs=dict(TMA_COMPILE_OPTIONS))   # as a bundle build does
            loaded = torch._inductor.aoti_load_package(path)
            results = []
            for b in (1, batch):
                xb = x[:b].contiguous()
                codes = int((loaded(xb).int() != module(xb).int()).sum())
                results.append(f"batch {b}: e4m3 codes that differ {codes}")
        return "ok, package vs eager: " + "; ".join(results)
    except Exception as e:
        return f"FAILED {type(e).__name__}: {str(e)[:400]}"


def main() -> int:
    from bench_args import positive_ints

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--per-graph", type=int, default=20, metavar="N",
                   help="calls of a layer captured in one CUDA graph (its time / N)")
    p.add_argument("--strides", type=positive_ints, default=[1, 2], metavar="S[,S]",
                   help="the layers' strides to time (default 1,2)")
    p.add_argument("--aoti", action="store_true",
                   help="also build a package on the kernel (4-D host descriptors)")
    p.add_argument("--interpret-check", action="store_true",
                   help="CPU, TRITON_INTERPRET=1: compare with the shipped kernel, print JSON")
    args = p.parse_args()
    early = cpu_or_no_gpu(args.interpret_check, interpret_check, "fp8_tma3x3_probe.py")
    if early is not None:
        return early
    from fp8_conv_bench import fused_layer_epilogues, graph_time

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton "
          f"{triton.__version__}, batch {args.batch}", flush=True)
    totals: dict[int, dict[str, float]] = {}
    for shape, by_epilogue in fused_layer_epilogues().items():
        cin, cout, hw, k, stride, _pad = shape
        if (stride not in args.strides
                or not box_eligible(cin, cout, (k, k), (stride, stride), (k // 2, k // 2),
                                    (1, 1))):
            continue                 # (the dense 1x1 layers: fp8_tma_probe.py's)
        total = totals.setdefault(stride, {"shipped": 0.0, "tma": 0.0})
        shipped = config_for(cin, cout, (k, k), (stride, stride), batch=args.batch)
        out_hw = hw // stride
        for epilogue, count in by_epilogue.items():
            name = f"{k}x{k} s{stride} {cin}->{cout} @{hw} {epilogue} x{count}"
            if epilogue[1]:
                print(f"{name}: a residual, which the box kernel has not", flush=True)
                continue
            case = _case(args.batch, hw, cin, cout, k, "cuda")
            x, weight, scale, bias = case
            kw = epilogue_kwargs(epilogue, "cuda")
            geometry = ((k, k), (stride, stride), (k // 2, k // 2))
            ms_shipped, _ = graph_time(lambda: fp8_conv_fused(
                x, weight, scale, bias, cout, *geometry, config=shipped, **kw),
                args.iters, calls=args.per_graph)
            best = None
            for tiles in candidates(args.batch, out_hw, out_hw, cin, cout):
                if not rows_fit(tiles[3], tiles[4], fp16_rows=epilogue[2],
                                e4m3_rows=epilogue[3]):
                    continue        # rows the launch would refuse for this epilogue
                try:
                    ms, _ = graph_time(lambda t=tiles: fp8_conv_box_tma(
                        x, weight, scale, bias, cout, (k, k), (k // 2, k // 2), stride=stride,
                        tiles=t, **kw), args.iters, calls=args.per_graph)
                except Exception as e:      # shared memory, or no support for the reshape
                    print(f"  {tiles} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
                    continue
                share = useful_share(args.batch, out_hw, out_hw, *tiles[:3])
                print(f"  {tiles} {ms:.4f} ms (useful {share:.3f})", flush=True)
                best = min(best or (ms, tiles), (ms, tiles))
            if best is None:
                print(f"{name}: shipped {ms_shipped:.4f} ms | no tile ran", flush=True)
                total["tma"] = float("nan")
                continue
            diff = compare(case, cout, k, stride, best[1], shipped, epilogue)
            print(f"{name}: shipped {ms_shipped:.4f} ms {tuple(shipped)} | tma "
                  f"{best[0]:.4f} ms {best[1]} ({ms_shipped / best[0]:.2f}x) {diff}",
                  flush=True)
            print(f"   MEASURED_BOX_TILES[{(cin, cout, k, stride, hw, hw)}] = "
                  f"{best[1] if best[0] < ms_shipped else None}", flush=True)
            total["shipped"] += count * ms_shipped
            total["tma"] += count * best[0]
    for stride, total in totals.items():
        print(f"== stride-{stride} box layers, count-weighted: shipped {total['shipped']:.3f} "
              f"ms; TMA {total['tma']:.3f} ms ({total['shipped'] / total['tma']:.2f}x)",
              flush=True)
    if args.aoti:
        print("== AOTInductor, 4-D host descriptors:", aoti_check(args.batch), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
