"""Issue 18, timm_resnet50: would TMA loads make the stride-1 3x3 FP8 convolutions faster
than the shipped implicit-GEMM kernel? One GPU call, ~3 minutes.

Why: at batch 32 on the H200, timm_resnet50's fp8 engine is 1.154x its fp16 one against the
1.2x target, and its replay timeline says the distance is kernel time, not gaps between
kernels (docs/measurements/h200-2026-12-06-l). The dense 1x1 layers already load with TMA
(``kernels/fp8_conv_tma.py``: 1.22x the shipped kernel over those layers). The 3x3 layers
(13 of the 16 have stride 1, about 0.29 of 0.35 ms over the 3x3 layers on an H100,
h100-2026-12-06-d) still gather their rows with each thread's 16-byte ``cp.async``: a
window tap of a flat row tile is not one rectangle of memory.

It is one for a tile of output pixels that is itself a rectangle: ``BI`` images x ``BH``
rows x ``BW`` columns. For tap (r, s) its inputs are the box that starts at
(image, row + r - PH, column + s - PW) of the NHWC input seen as a 4-D tensor, and TMA fills
what lies outside the image with zeros (negative coordinates included), which is the
convolution's zero padding. So each tap is one TMA box ``[BI, BH, BW, BLOCK_K]``, reshaped to
the GEMM's ``[BLOCK_M, BLOCK_K]`` rows; the weight tile is ``[BLOCK_N, BLOCK_K]`` of the
``[Cout, KH*KW*C]`` buffer both kernels share; the output tile is stored as one box, which TMA
clips at the image edges. The cost: Triton's blocks are powers of two, so an image side
that is not a multiple of the box side computes rows that are thrown away (28, 14 and 7:
87.5% useful with the candidates here; 56: all).

The epilogue is the shipped kernel's for these layers (scale and bias, the fp16 rounding,
ReLU, e4m3 out with the next layer's scale, and optionally fp16 out), so the outputs are
the same bits (``--interpret-check`` on the CPU, e4m3 steps on the GPU).

    python3 benchmarks/fp8_tma3x3_probe.py [--batch 32] [--iters 50] [--aoti]
    TRITON_INTERPRET=1 python3 benchmarks/fp8_tma3x3_probe.py --interpret-check   # CPU: JSON
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

if str(Path(__file__).resolve().parents[1]) not in sys.path:   # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bundler.fp8 import E4M3_MAX  # noqa: E402
from bundler.targets.torch_aoti.kernels.fp8_conv import (  # noqa: E402
    Fp8ConvConfig, _grouped_tile, _quantize_e4m3, config_for, fp8_conv_fused)

#: (images, rows, columns) of a tile of output pixels, (block_n, block_k, warps, stages)
Tiles = tuple[int, int, int, int, int, int, int]
GROUP_M = 8
#: The widest descriptor row AOTInductor encodes (``fp8_conv_tma.MAX_BOX_ROW_BYTES``).
MAX_BOX_ROW_BYTES = 128


@triton.jit
def _tma_conv_s1_kernel(x_desc, w_desc, o_desc, q_desc, scale_ptr, bias_ptr, q_scale_ptr,
                        N, H, W, C, COUT,
                        KH: tl.constexpr, KW: tl.constexpr, PH: tl.constexpr, PW: tl.constexpr,
                        RELU: tl.constexpr, OUT_F16: tl.constexpr, OUT_F8: tl.constexpr,
                        QMAX: tl.constexpr, BI: tl.constexpr, BH: tl.constexpr,
                        BW: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        GROUP_M: tl.constexpr):
    """One tile of BI x BH x BW output pixels by BLOCK_N channels of a stride-1 convolution:
    the reduction over (tap, C) with one TMA box per tap and channel block."""
    BLOCK_M: tl.constexpr = BI * BH * BW
    tiles_h = tl.cdiv(H, BH)
    tiles_w = tl.cdiv(W, BW)
    num_m = tl.cdiv(N, BI) * tiles_h * tiles_w
    pid_m, pid_n = _grouped_tile(tl.program_id(0), num_m * BLOCK_M, COUT, BLOCK_M, BLOCK_N,
                                 GROUP_M)
    n0 = (pid_m // (tiles_h * tiles_w)) * BI
    h0 = ((pid_m // tiles_w) % tiles_h) * BH
    w0 = (pid_m % tiles_w) * BW
    off_n = pid_n * BLOCK_N

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    c_tiles = tl.cdiv(C, BLOCK_K)
    for it in range(0, KH * KW * c_tiles):
        tap = it // c_tiles
        k0 = (it % c_tiles) * BLOCK_K
        a = x_desc.load([n0, h0 + tap // KW - PH, w0 + tap % KW - PW, k0])
        b = w_desc.load([off_n, tap * C + k0])
        acc = tl.dot(a.reshape(BLOCK_M, BLOCK_K), b.T, acc)

    offs_n = off_n + tl.arange(0, BLOCK_N)
    n_ok = offs_n < COUT
    scale = tl.load(scale_ptr + offs_n, mask=n_ok, other=0.0)
    bias = tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0)
    y = acc * scale[None, :] + bias[None, :]
    if RELU:
        y = tl.maximum(y, 0.0)
    y16 = y.to(tl.float16)
    if OUT_F16:
        o_desc.store([n0, h0, w0, off_n], y16.reshape(BI, BH, BW, BLOCK_N))
    if OUT_F8:
        q_scale = tl.load(q_scale_ptr)
        q_inv = tl.math.div_rn(tl.full([], 1.0, tl.float32), q_scale)
        q = _quantize_e4m3(y16.to(tl.float32), q_scale, q_inv, QMAX)
        q_desc.store([n0, h0, w0, off_n], q.reshape(BI, BH, BW, BLOCK_N))


def tma_conv_s1(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor,
                cout: int, kernel: tuple[int, int], padding: tuple[int, int], *,
                relu: bool = False, out_f16: bool = True,
                out_scale: torch.Tensor | None = None, tiles: Tiles = (1, 8, 8, 64, 64, 4, 3)
                ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``fp8_conv_fused`` for a stride-1, undilated layer whose output has the input's size
    (padding = kernel // 2) on dense NHWC e4m3 ``x``; ``weight``: the shared e4m3
    ``[>= cout, >= KH*KW*C]`` buffer. Needs C a multiple of BLOCK_K (a channel block never
    straddles two taps) and 16-byte rows."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    n, h, w, c = x.shape
    kh, kw = kernel
    bi, bh, bw, bn, bk, warps, stages = tiles
    if (kh - 1 != 2 * padding[0]) or (kw - 1 != 2 * padding[1]):
        raise ValueError("tma_conv_s1: needs 'same' padding (kernel // 2)")
    if c % bk or c % 16 or weight.stride(0) % 16 or cout % 16:
        raise ValueError(f"tma_conv_s1: C {c} must be a multiple of BLOCK_K {bk} and 16, "
                         f"cout {cout} of 16")
    if bk > MAX_BOX_ROW_BYTES or bn > MAX_BOX_ROW_BYTES or (out_f16 and 2 * bn > MAX_BOX_ROW_BYTES):
        raise ValueError(f"tma_conv_s1: tiles {tiles} have rows over {MAX_BOX_ROW_BYTES} bytes")
    x = x.contiguous()
    out = torch.empty((n, h, w, cout) if out_f16 else (0,), dtype=torch.float16,
                      device=x.device)
    q = torch.empty((n, h, w, cout) if out_scale is not None else (0,),
                    dtype=torch.float8_e4m3fn, device=x.device)
    a = TensorDescriptor.from_tensor(x, [bi, bh, bw, bk])
    o = TensorDescriptor.from_tensor(out, [bi, bh, bw, bn]) if out_f16 else a
    qd = TensorDescriptor.from_tensor(q, [bi, bh, bw, bn]) if out_scale is not None else a
    num_m = triton.cdiv(n, bi) * triton.cdiv(h, bh) * triton.cdiv(w, bw)
    grid = (num_m * triton.cdiv(cout, bn),)
    _tma_conv_s1_kernel[grid](
        a, TensorDescriptor.from_tensor(weight[:cout, :kh * kw * c], [bn, bk]), o, qd,
        scale, bias, out_scale if out_scale is not None else scale, n, h, w, c, cout,
        KH=kh, KW=kw, PH=padding[0], PW=padding[1], RELU=relu, OUT_F16=out_f16,
        OUT_F8=out_scale is not None, QMAX=E4M3_MAX, BI=bi, BH=bh, BW=bw, BLOCK_N=bn,
        BLOCK_K=bk, GROUP_M=GROUP_M, num_warps=warps, num_stages=stages)
    return (out if out_f16 else None), (q if out_scale is not None else None)


def useful_share(n: int, h: int, w: int, bi: int, bh: int, bw: int) -> float:
    """Output pixels over the pixels the tiles compute (the rest lies past an edge)."""
    return (n * h * w) / (triton.cdiv(n, bi) * bi * triton.cdiv(h, bh) * bh
                          * triton.cdiv(w, bw) * bw)


def pixel_boxes(n: int, h: int, w: int, rows: int, count: int = 3) -> list[tuple[int, int, int]]:
    """The ``count`` (images, rows, columns) boxes of ``rows`` pixels that waste the least,
    ties broken towards wider rows (longer contiguous runs for TMA)."""
    found = []
    for bw in (1, 2, 4, 8, 16, 32, 64):
        for bh in (1, 2, 4, 8, 16, 32, 64):
            bi = rows // (bw * bh)
            if bi < 1 or bi * bh * bw != rows or bi > max(n, 1) or bh > 2 * h or bw > 2 * w:
                continue
            found.append((-useful_share(n, h, w, bi, bh, bw), -bw, (bi, bh, bw)))
    return [box for *_key, box in sorted(found)[:count]]


def candidates(n: int, h: int, w: int, c: int, cout: int) -> list[Tiles]:
    """Tiles tried per layer: the two least wasteful 64- and 128-pixel boxes, 64 or 128
    channels a side, the widest channel block C allows (128 bytes: 3 stages; 64: 4)."""
    bk, stages = (128, 3) if c % 128 == 0 else (64, 4)
    out = []
    for rows, bn, warps in ((64, 64, 4), (128, 64, 4), (128, 128, 8), (64, 128, 4)):
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


def e4m3_steps(a: torch.Tensor, b: torch.Tensor) -> int:
    """Largest distance in e4m3 codes between two e4m3 tensors."""
    ia, ib = a.view(torch.uint8).int(), b.view(torch.uint8).int()
    same = torch.where((ia >> 7) == (ib >> 7), ((ia & 0x7F) - (ib & 0x7F)).abs(),
                       (ia & 0x7F) + (ib & 0x7F))
    return int(same.max()) if same.numel() else 0


def compare(case: tuple, cout: int, k: int, tiles: Tiles, shipped: Fp8ConvConfig,
            out_f16: bool) -> dict:
    """Both kernels on one case (ReLU, e4m3 out, fp16 out if asked): the largest fp16
    difference and the e4m3 steps apart."""
    x, weight, scale, bias = case
    out_scale = torch.tensor(0.05, device=x.device)
    kw = dict(relu=True, out_f16=out_f16, out_scale=out_scale)
    s16, s8 = fp8_conv_fused(x, weight, scale, bias, cout, (k, k), (1, 1), (k // 2, k // 2),
                             config=shipped, **kw)
    t16, t8 = tma_conv_s1(x, weight, scale, bias, cout, (k, k), (k // 2, k // 2), tiles=tiles,
                          **kw)
    result = {"e4m3_steps": e4m3_steps(s8, t8), "e4m3_nonzero": int((s8.float() != 0).sum())}
    if out_f16:
        result["f16_max_diff"] = float((s16.float() - t16.float()).abs().max())
        result["f16_scale"] = float(s16.float().abs().max())
    return result


def interpret_check() -> dict:
    """Under ``TRITON_INTERPRET=1`` on the CPU: against the shipped kernel on small cases
    whose sides are not multiples of the box (edge tiles, padding at every border), with
    and without the fp16 output, a box over several images and a 1x1 layer."""
    shipped = Fp8ConvConfig(16, 16, 32, 4, 2, 2)
    cases = {"3x3 6x6 box 1x4x4": (3, 6, (1, 4, 4, 16, 32, 4, 2), True),
             "3x3 5x5 box 2x2x4 e4m3 only": (3, 5, (2, 2, 4, 32, 32, 4, 2), False),
             "1x1 5x5 box 1x2x8": (1, 5, (1, 2, 8, 16, 32, 4, 2), True)}
    results = {}
    for name, (k, hw, tiles, out_f16) in cases.items():
        case = _case(3, hw, 64, 48, k, "cpu")
        results[name] = compare(case, 48, k, tiles, shipped, out_f16)
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
            _y16, y8 = tma_conv_s1(x.to(torch.float8_e4m3fn), self.weight, self.scale,
                                   self.bias, 64, (3, 3), (1, 1), relu=True, out_f16=False,
                                   out_scale=self.out_scale, tiles=(1, 8, 8, 64, 64, 4, 3))
            return y8.view(torch.uint8)

    module = Layer().eval()
    x = (torch.randn(batch, 14, 14, 64, device="cuda").clamp_min(0) * 40).half()
    try:
        with tempfile.TemporaryDirectory() as tmp, aoti_toolchain():
            dim = torch.export.Dim("batch", min=1, max=32)
            program = torch.export.export(module, (x,), dynamic_shapes=({0: dim},), strict=True)
            path = torch._inductor.aoti_compile_and_package(
                program, package_path=str(Path(tmp) / "tma3x3.pt2"))
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
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--per-graph", type=int, default=20, metavar="N",
                   help="calls of a layer captured in one CUDA graph (its time / N)")
    p.add_argument("--aoti", action="store_true",
                   help="also build a package on the kernel (4-D host descriptors)")
    p.add_argument("--interpret-check", action="store_true",
                   help="CPU, TRITON_INTERPRET=1: compare with the shipped kernel, print JSON")
    args = p.parse_args()
    if args.interpret_check:
        print(json.dumps(interpret_check()))
        return 0
    if not torch.cuda.is_available():
        print("fp8_tma3x3_probe.py times a GPU, and none is visible; on the CPU run "
              "TRITON_INTERPRET=1 python3 benchmarks/fp8_tma3x3_probe.py --interpret-check",
              file=sys.stderr)
        return 2
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from fp8_conv_bench import fused_layer_epilogues, graph_time

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton "
          f"{triton.__version__}, batch {args.batch}", flush=True)
    total = {"shipped": 0.0, "tma": 0.0}
    for shape, by_epilogue in fused_layer_epilogues().items():
        cin, cout, hw, k, stride, _pad = shape
        if k != 3 or stride != 1:
            continue
        shipped = config_for(cin, cout, (3, 3), (1, 1), batch=args.batch)
        for epilogue, count in by_epilogue.items():
            relu, residual, out16, out8 = epilogue
            if residual or not relu or not out8:
                print(f"3x3 {cin}->{cout} @{hw} {epilogue}: not a form this probe has", flush=True)
                continue
            case = _case(args.batch, hw, cin, cout, 3, "cuda")
            x, weight, scale, bias = case
            kw = dict(relu=True, out_f16=out16, out_scale=torch.tensor(0.05, device="cuda"))
            ms_shipped, _ = graph_time(lambda: fp8_conv_fused(
                x, weight, scale, bias, cout, (3, 3), (1, 1), (1, 1), config=shipped, **kw),
                args.iters, calls=args.per_graph)
            best = None
            for tiles in candidates(args.batch, hw, hw, cin, cout):
                if out16 and 2 * tiles[3] > MAX_BOX_ROW_BYTES:
                    continue
                try:
                    ms, _ = graph_time(lambda t=tiles: tma_conv_s1(
                        x, weight, scale, bias, cout, (3, 3), (1, 1), tiles=t, **kw),
                        args.iters, calls=args.per_graph)
                except Exception as e:      # shared memory, or no support for the reshape
                    print(f"  {tiles} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
                    continue
                print(f"  {tiles} {ms:.4f} ms (useful {useful_share(args.batch, hw, hw, *tiles[:3]):.3f})",
                      flush=True)
                best = min(best or (ms, tiles), (ms, tiles))
            if best is None:
                print(f"3x3 {cin}->{cout} @{hw} x{count}: shipped {ms_shipped:.4f} ms | no tile ran",
                      flush=True)
                total["tma"] = float("nan")
                continue
            diff = compare(case, cout, 3, best[1], shipped, out16)
            print(f"3x3 {cin}->{cout} @{hw} {epilogue} x{count}: shipped {ms_shipped:.4f} ms "
                  f"{tuple(shipped)} | tma {best[0]:.4f} ms {best[1]} "
                  f"({ms_shipped / best[0]:.2f}x) {diff}", flush=True)
            total["shipped"] += count * ms_shipped
            total["tma"] += count * best[0]
    print(f"== stride-1 3x3 layers, count-weighted: shipped {total['shipped']:.3f} ms; TMA "
          f"{total['tma']:.3f} ms ({total['shipped'] / total['tma']:.2f}x)", flush=True)
    if args.aoti:
        print("== AOTInductor, 4-D host descriptors:", aoti_check(args.batch), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
