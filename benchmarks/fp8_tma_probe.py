"""Issue 18, timm_resnet50: would TMA loads and stores make the dense 1x1 FP8 convolutions
faster than the shipped implicit-GEMM kernel? One GPU call, ~4-5 minutes.

Why: the shipped kernel (``kernels/fp8_conv.py``) moves the 1x1 layers' bytes at about half
the memory bandwidth, and runs its compute-bound layers at 12-19% of the FP8 peak, on the H200
and the H100 alike. Fewer stages, the residual loaded early, and persistent programs did not
change that (docs/measurements/h100-2026-12-06-d), and its stores are already 16-byte vector
stores. Hopper GEMMs that get near the peak load their operand tiles with TMA, which copies
a whole tile into shared memory in one request, instead of each thread's 16-byte cp.async.
A 1x1 stride-1 convolution over NHWC rows is a dense GEMM, so TMA can load its tiles as they
are.

This probe is a TMA version of the fused op for those layers only (``tma_1x1``): the same
operands, scales and epilogue (residual, ReLU, fp16 and e4m3 outputs), with TMA descriptors
for the operands, the residual and both outputs, made either in the kernel
(``tl.make_tensor_descriptor``: each program writes its descriptors to Triton's global
scratch) or on the host (``TensorDescriptor`` arguments). For each dense 1x1 layer of timm
ResNet-50 with the epilogue the fused model gives it (``fp8_conv_bench.
fused_layer_epilogues``), it prints the shipped op with its measured tiles next to this
kernel's best of ``TILES`` for each kind of descriptor, and how far their outputs are apart
(e4m3 steps). ``--aoti`` then builds a small module on each kind with AOTInductor (dynamic
batch) and compares the package with eager: whether its C++ wrapper launches a kernel that
needs the global scratch, or encodes host descriptors.

If it pays, the next step is ``fused.FusedConv`` choosing it for those layers. Not built:
a 3x3 or strided layer gathers its rows, which a tiled TMA load cannot do.

    python3 benchmarks/fp8_tma_probe.py [--batch 32] [--iters 50] [--descriptors device,host] [--aoti]
    TRITON_INTERPRET=1 python3 benchmarks/fp8_tma_probe.py --interpret-check   # CPU: JSON
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

if str(Path(__file__).resolve().parents[1]) not in sys.path:   # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bundler.fp8 import E4M3_MAX  # noqa: E402
from bundler.targets.torch_aoti.kernels.fp8_conv import (  # noqa: E402
    Fp8ConvConfig, config_for, fp8_conv_fused)
from bundler.targets.torch_aoti.kernels.fp8_conv_tma import (  # noqa: E402
    GROUP_M, _tma_1x1_host_kernel, _tma_1x1_tile)

#: Tiles tried per layer: (block_m, block_n, block_k, num_warps, num_stages).
TILES = ((128, 64, 64, 4, 3), (64, 128, 64, 4, 3), (128, 128, 64, 8, 3),
         (128, 128, 128, 8, 3), (64, 64, 128, 4, 3), (128, 256, 64, 8, 3))
#: ``--fit``: tiles whose rows AOTInductor's descriptors can hold (``fp8_conv_tma.tiles_fit``:
#: BLOCK_N <= 64, BLOCK_K <= 128), what a bundle's TMA layers may take.
FIT_TILES = ((128, 64, 64, 4, 3), (64, 64, 128, 4, 3), (128, 64, 128, 4, 3),
             (128, 64, 128, 8, 3), (64, 64, 64, 4, 4), (256, 64, 64, 8, 3),
             (128, 64, 64, 4, 4), (64, 64, 128, 4, 4), (64, 32, 128, 4, 3))
#: ``--fit`` at a batch of at most ``fp8_layers.SMALL_BATCH``: at batch 1-8 a layer has 49 to
#: 25,088 rows, and the shipped kernel's tables there (``MEASURED_TILES_BATCH1/2/4``) mostly
#: chose 16-64-row tiles. FIT_TILES' 64-128-row ones left batch 1 slower with TMA (0.370 ms
#: against 0.356, h100-2026-12-06-e); these are small-row tiles that fit, and three of
#: FIT_TILES: the default (``fp8_conv_tma.DEFAULT_TMA_TILES``) and two of 64 rows.
SMALL_FIT_TILES = ((16, 32, 128, 4, 4), (16, 64, 128, 4, 3), (32, 32, 128, 4, 4),
                   (32, 64, 128, 4, 3), (32, 64, 64, 4, 4), (64, 32, 128, 4, 3),
                   (64, 64, 128, 4, 4), (128, 64, 64, 4, 3))
#: Where the TMA descriptors are made: in the kernel (``tl.make_tensor_descriptor``, Triton's
#: global scratch holds them) or on the host (``TensorDescriptor`` arguments).
DESCRIPTORS = ("device", "host")


@triton.jit
def _tma_1x1_kernel(x_ptr, w_ptr, scale_ptr, bias_ptr, out_ptr, res_ptr, q_ptr, q_scale_ptr,
                    M, C, COUT, ldw,
                    RELU: tl.constexpr, RESIDUAL: tl.constexpr, OUT_F16: tl.constexpr,
                    OUT_F8: tl.constexpr, QMAX: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """``_tma_1x1_tile`` with device-side descriptors (made by the kernel: Triton's global
    scratch holds them). An output or residual that is off gets the input's descriptor as a
    stand-in, never used."""
    a_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, C], strides=[C, 1],
                                       block_shape=[BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(w_ptr, shape=[COUT, C], strides=[ldw, 1],
                                       block_shape=[BLOCK_N, BLOCK_K])
    r_desc = a_desc
    o_desc = a_desc
    q_desc = a_desc
    if RESIDUAL:
        r_desc = tl.make_tensor_descriptor(res_ptr, shape=[M, COUT], strides=[COUT, 1],
                                           block_shape=[BLOCK_M, BLOCK_N])
    if OUT_F16:
        o_desc = tl.make_tensor_descriptor(out_ptr, shape=[M, COUT], strides=[COUT, 1],
                                           block_shape=[BLOCK_M, BLOCK_N])
    if OUT_F8:
        q_desc = tl.make_tensor_descriptor(q_ptr, shape=[M, COUT], strides=[COUT, 1],
                                           block_shape=[BLOCK_M, BLOCK_N])
    _tma_1x1_tile(a_desc, b_desc, r_desc, o_desc, q_desc, scale_ptr, bias_ptr, q_scale_ptr,
                  M, C, COUT, RELU, RESIDUAL, OUT_F16, OUT_F8, QMAX, BLOCK_M, BLOCK_N,
                  BLOCK_K, GROUP_M)


def _scratch(size: int, alignment: int, stream) -> torch.Tensor:
    """Triton's global scratch for device-side descriptors (eager launches)."""
    del alignment, stream
    return torch.empty(size, dtype=torch.int8, device="cuda" if torch.cuda.is_available()
                       else "cpu")


def tma_1x1(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor,
            cout: int, *, residual: torch.Tensor | None = None, relu: bool = False,
            out_f16: bool = True, out_scale: torch.Tensor | None = None,
            tiles: tuple = TILES[0], descriptors: str = "device", wrap: bool = False
            ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``fp8_conv_fused`` for a 1x1 stride-1 layer on dense NHWC e4m3 ``x``, on the TMA
    kernel, its descriptors made on the device or the host (``DESCRIPTORS``). TMA needs
    16-byte row strides: C and ``weight``'s row a multiple of 16 bytes, ``cout`` of 16
    elements. ``wrap``: launch through ``torch.library.wrap_triton`` (``kernels.launch``;
    inside a ``triton_op``, so that export and AOTInductor see the kernel)."""
    if descriptors not in DESCRIPTORS:
        raise ValueError(f"descriptors {descriptors!r}: choose one of {', '.join(DESCRIPTORS)}")
    n, h, w, c = x.shape
    m = n * h * w
    if c % 16 or weight.stride(0) % 16 or cout % 16 or not x.is_contiguous():
        raise ValueError("tma_1x1: needs dense NHWC rows of 16-byte multiples")
    out = torch.empty((n, h, w, cout) if out_f16 else (0,), dtype=torch.float16,
                      device=x.device)
    q = torch.empty((n, h, w, cout) if out_scale is not None else (0,),
                    dtype=torch.float8_e4m3fn, device=x.device)
    res = residual.contiguous() if residual is not None else out
    bm, bn, bk, warps, stages = tiles
    grid = (triton.cdiv(m, bm) * triton.cdiv(cout, bn),)
    q_scale = out_scale if out_scale is not None else scale
    switches = dict(RELU=relu, RESIDUAL=residual is not None, OUT_F16=out_f16,
                    OUT_F8=out_scale is not None, QMAX=E4M3_MAX, BLOCK_M=bm, BLOCK_N=bn,
                    BLOCK_K=bk, GROUP_M=GROUP_M, num_warps=warps, num_stages=stages)
    from bundler.targets.torch_aoti.kernels.launch import traceable

    launch = traceable if wrap else (lambda kernel: kernel)
    if descriptors == "device":
        triton.set_allocator(_scratch)
        launch(_tma_1x1_kernel)[grid](x, weight, scale, bias, out, res, q, q_scale, m, c, cout,
                                      weight.stride(0), **switches)
    else:
        from triton.tools.tensor_descriptor import TensorDescriptor

        a = TensorDescriptor.from_tensor(x.view(m, c), [bm, bk])

        def rows(t, on):       # an output or the residual as [m, cout] tiles; off: a stand-in
            return TensorDescriptor.from_tensor(t.view(m, cout), [bm, bn]) if on else a

        launch(_tma_1x1_host_kernel)[grid](
            a, TensorDescriptor.from_tensor(weight[:cout, :c], [bn, bk]),
            rows(res, residual is not None), rows(out, out_f16), rows(q, out_scale is not None),
            scale, bias, q_scale, m, c, cout, **switches)
    return (out if out_f16 else None), (q if out_scale is not None else None)


def e4m3_steps(a: torch.Tensor, b: torch.Tensor) -> int:
    """Largest distance in e4m3 codes between two e4m3 tensors of the same signs."""
    ia, ib = a.view(torch.uint8).int(), b.view(torch.uint8).int()
    same = torch.where((ia >> 7) == (ib >> 7), ((ia & 0x7F) - (ib & 0x7F)).abs(),
                       (ia & 0x7F) + (ib & 0x7F))
    return int(same.max()) if same.numel() else 0


def _case(n: int, hw: int, c: int, cout: int, residual: bool, device: str, seed: int = 0):
    """Operands of one 1x1 layer as the fused model has them (e4m3 input, a weight buffer
    padded past cout and C as the shipped op's, per-channel scales, bias, a residual)."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, hw, hw, c, generator=g).clamp_min(0) * 40).to(torch.float8_e4m3fn)
    weight = torch.zeros(cout + 16, c + 16).to(torch.float8_e4m3fn)
    weight[:cout, :c] = (torch.randn(cout, c, generator=g) * 100).to(torch.float8_e4m3fn)
    scale = (torch.rand(cout, generator=g) + 0.5) * 2e-4
    bias = torch.randn(cout, generator=g) * 0.3
    res = (torch.randn(n, hw, hw, cout, generator=g) * 2).half() if residual else None
    to = (lambda t: t.to(device) if t is not None else None)
    return to(x), to(weight), to(scale), to(bias), to(res)


def compare(n: int, hw: int, c: int, cout: int, epilogue: tuple, device: str,
            tiles: tuple, shipped: Fp8ConvConfig, descriptors: str = "device") -> dict:
    """The two kernels on one case: largest fp16 difference and e4m3 steps apart."""
    relu, residual, out16, out8 = epilogue
    x, weight, scale, bias, res = _case(n, hw, c, cout, residual, device)
    out_scale = torch.tensor(0.05, device=device) if out8 else None
    kw = dict(residual=res, relu=relu, out_f16=out16, out_scale=out_scale)
    s16, s8 = fp8_conv_fused(x, weight, scale, bias, cout, (1, 1), (1, 1), (0, 0),
                             config=shipped, **kw)
    t16, t8 = tma_1x1(x, weight, scale, bias, cout, tiles=tiles, descriptors=descriptors, **kw)
    result = {}
    if out16:
        result["f16_max_diff"] = float((s16.float() - t16.float()).abs().max())
        result["f16_scale"] = float(s16.float().abs().max())
    if out8:
        result["e4m3_steps"] = e4m3_steps(s8, t8)
    return result


def interpret_check() -> dict:
    """Under ``TRITON_INTERPRET=1`` on the CPU: the TMA kernel against the shipped one on
    small cases with edge tiles (rows and columns that do not fill a tile), each epilogue."""
    shipped = Fp8ConvConfig(16, 16, 32, 4, 2, 2)
    cases = {"res+relu>f16+f8": (True, True, True, True), "relu>f8": (True, False, False, True),
             ">f16": (False, False, True, False), "res+relu>f16": (True, True, True, False)}
    return {f"{kind}:{name}": compare(2, 5, 64, 48, epi, "cpu", (16, 16, 32, 4, 2), shipped,
                                      kind)
            for kind in DESCRIPTORS for name, epi in cases.items()}


def main() -> int:
    from bench_args import positive_int

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--per-graph", type=positive_int, default=20, metavar="N",
                   help="calls of a layer captured in one CUDA graph (its time / N): one call "
                        "a replay times the replay's own ~10 us at batch 1-8")
    p.add_argument("--aoti", action="store_true", help="also build a package on the kernel")
    p.add_argument("--aoti-only", default=None, metavar="KINDS",
                   help="only build the packages: device, host, host-strict (comma-separated)")
    p.add_argument("--descriptors", default=",".join(DESCRIPTORS),
                   help="where the TMA descriptors are made: device, host or both")
    p.add_argument("--fit", action="store_true",
                   help="try only tiles AOTInductor's host descriptors can hold (FIT_TILES; "
                        "SMALL_FIT_TILES at a batch of 8 or less)")
    p.add_argument("--interpret-check", action="store_true",
                   help="CPU, TRITON_INTERPRET=1: compare with the shipped kernel, print JSON")
    args = p.parse_args()
    early = cpu_or_no_gpu(args.interpret_check, interpret_check, "fp8_tma_probe.py")
    if early is not None:
        return early
    if args.aoti_only:
        for kind in args.aoti_only.split(","):
            print(f"== AOTInductor, {kind}:", aoti_check(kind), flush=True)
        return 0
    from fp8_conv_bench import fused_layer_epilogues, graph_time

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton "
          f"{triton.__version__}, batch {args.batch}", flush=True)
    kinds = [k for k in args.descriptors.split(",") if k]
    candidates = fit_candidates(args.batch) if args.fit else TILES
    total = {"shipped": 0.0, **{k: 0.0 for k in kinds}}
    for shape, by_epilogue in fused_layer_epilogues().items():
        cin, cout, hw, k, stride, _pad = shape
        if k != 1 or stride != 1:
            continue
        shipped = config_for(cin, cout, (1, 1), (1, 1), batch=args.batch)
        for epilogue, count in by_epilogue.items():
            relu, residual, out16, out8 = epilogue
            x, weight, scale, bias, res = _case(args.batch, hw, cin, cout, residual, "cuda")
            out_scale = torch.tensor(0.05, device="cuda") if out8 else None
            kw = dict(residual=res, relu=relu, out_f16=out16, out_scale=out_scale)
            ms_shipped, _ = graph_time(lambda: fp8_conv_fused(
                x, weight, scale, bias, cout, (1, 1), (1, 1), (0, 0), config=shipped, **kw),
                args.iters, calls=args.per_graph)
            line = f"1x1 {cin}->{cout} @{hw} {epilogue} x{count}: shipped {ms_shipped:.4f} ms"
            total["shipped"] += count * ms_shipped
            for kind in kinds:
                best = best_tiles(graph_time, args.iters, kind, x, weight, scale, bias, cout, kw,
                                  candidates, args.per_graph)
                if best is None:
                    line += f" | {kind}: no tile ran"
                    total[kind] = float("nan")
                    continue
                diff = compare(args.batch, hw, cin, cout, epilogue, "cuda", best[1], shipped,
                               kind)
                line += (f" | {kind} {best[0]:.4f} ms {best[1]} ({ms_shipped / best[0]:.2f}x) "
                         f"{diff}")
                total[kind] += count * best[0]
            print(line, flush=True)
    print(f"== dense 1x1 layers, count-weighted: shipped {total['shipped']:.3f} ms; " + "; ".join(
        f"TMA {k}-side descriptors {total[k]:.3f} ms ({total['shipped'] / total[k]:.2f}x)"
        for k in kinds))
    if args.aoti:
        for kind in kinds:
            print(f"== AOTInductor, {kind}-side descriptors:", aoti_check(kind), flush=True)
    return 0


def cpu_or_no_gpu(interpret: bool, check, script: str) -> int | None:
    """A probe's CPU paths, shared by the TMA probes: ``--interpret-check`` prints
    ``check()``'s JSON (exit 0); without a visible GPU it says how to run on the CPU
    (exit 2); None: time the GPU."""
    if interpret:
        print(json.dumps(check()))
        return 0
    if not torch.cuda.is_available():
        print(f"{script} times a GPU, and none is visible; on the CPU run "
              f"TRITON_INTERPRET=1 python3 benchmarks/{script} --interpret-check",
              file=sys.stderr)
        return 2
    return None


def fit_candidates(batch: int) -> tuple:
    """The tiles ``--fit`` tries at ``batch``: SMALL_FIT_TILES for a small static batch's
    graph, FIT_TILES otherwise."""
    from bundler.targets.torch_aoti.fp8_layers import SMALL_BATCH

    return SMALL_FIT_TILES if batch <= SMALL_BATCH else FIT_TILES


def best_tiles(graph_time, iters: int, kind: str, x, weight, scale, bias, cout: int,
               kw: dict, candidates: tuple = TILES, per_graph: int = 1
               ) -> tuple[float, tuple] | None:
    """(ms, tiles) of the fastest of ``candidates`` for one layer (``per_graph`` calls
    a replay), or None if none ran."""
    best = None
    for tiles in candidates:
        try:
            ms, _ = graph_time(lambda t=tiles: tma_1x1(
                x, weight, scale, bias, cout, tiles=t, descriptors=kind, **kw), iters,
                calls=per_graph)
        except Exception as e:     # a tile that does not fit (shared memory), or no support
            print(f"  {kind} {tiles} failed: {type(e).__name__}: {str(e)[:160]}", flush=True)
            continue
        best = min(best or (ms, tiles), (ms, tiles))
    return best


def aoti_check(kind: str) -> str:
    """A module on the TMA kernel (``kind``-side descriptors, the residual and both outputs)
    through torch.export with a dynamic batch and AOTInductor: the package's outputs against
    eager, or why it failed.

    ``device`` and ``host``: the kernel inside a ``triton_op``, exported as the family's
    model is (non-strict). torch traces a ``triton_op`` without Dynamo, and that tracer
    records no host descriptors (torch 2.11 and 2.14: "TMA descriptor capturing not yet
    supported in non-dynamo tracing"). ``host-strict``: the kernel called as it is, next to
    the shipped op, in a strict (Dynamo) export, which records them: what the family's model
    would need to use host descriptors."""
    import tempfile

    from torch.library import triton_op

    strict = kind == "host-strict"
    kind = "host" if strict else kind

    @triton_op(f"trt_bundle_probe::tma_1x1_{kind}", mutates_args={})
    def op(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor,
           residual: torch.Tensor, out_scale: torch.Tensor, cout: int
           ) -> tuple[torch.Tensor, torch.Tensor]:
        return tma_1x1(x, weight, scale, bias, cout, residual=residual, relu=True,
                       out_scale=out_scale, tiles=TILES[0], descriptors=kind, wrap=True)

    def direct(x, weight, scale, bias, residual, out_scale, cout):
        y16, y8 = tma_1x1(x, weight, scale, bias, cout, residual=residual, relu=True,
                          out_scale=out_scale, tiles=TILES[0], descriptors=kind)
        shipped = fp8_conv_fused(x, weight, scale, bias, cout, (1, 1), (1, 1), (0, 0),
                                 residual=residual, relu=True)
        return y16 + 0 * shipped[0], y8

    class Layer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            _x, weight, scale, bias, _r = _case(1, 1, 64, 256, False, "cuda")
            self.register_buffer("weight", weight)
            self.register_buffer("scale", scale)
            self.register_buffer("bias", bias)
            self.register_buffer("out_scale", torch.full((16,), 0.05, device="cuda"))

        def forward(self, x, residual):
            y16, y8 = (direct if strict else op)(
                x.to(torch.float8_e4m3fn), self.weight, self.scale, self.bias, residual,
                self.out_scale, 256)
            return y16, y8.view(torch.uint8)

    module = Layer().eval()
    x = (torch.randn(4, 14, 14, 64, device="cuda").clamp_min(0) * 40).half()
    residual = torch.randn(4, 14, 14, 256, device="cuda").half()
    from bundler.targets.torch_aoti.toolchain import aoti_toolchain

    try:
        # the family's toolchain: a package linked with the static libstdc++ crashes its loader
        with tempfile.TemporaryDirectory() as tmp, aoti_toolchain():
            batch = torch.export.Dim("batch", min=1, max=32)
            program = torch.export.export(module, (x, residual),
                                          dynamic_shapes=({0: batch}, {0: batch}),
                                          strict=strict)
            path = torch._inductor.aoti_compile_and_package(
                program, package_path=str(Path(tmp) / "tma.pt2"),
                inductor_configs=json.loads(os.environ.get("TMA_PROBE_INDUCTOR", "{}")))
            loaded = torch._inductor.aoti_load_package(path)
            got, want = loaded(x, residual), module(x, residual)
            f16 = float((got[0].float() - want[0].float()).abs().max())
            codes = int((got[1].int() != want[1].int()).sum())
        return f"ok, package vs eager: fp16 max |diff| {f16:.3g}, e4m3 codes that differ {codes}"
    except Exception as e:
        return f"FAILED {type(e).__name__}: {str(e)[:400]}"


if __name__ == "__main__":
    sys.exit(main())
