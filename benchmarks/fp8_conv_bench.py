"""FP8 convolutions of ResNet-50 on one GPU: cuDNN fp16 vs im2col + _scaled_mm vs the Triton
implicit GEMM, layer by layer (and, with --model, the whole torch-aoti engine model).

Why: timm_resnet50's fp8 bundle should be >= 1.2x its fp16 bundle at batch 32 (issue 18),
and its 3x3 convolutions are over half its FLOPs. The torch-aoti model runs them as im2col
(``bundler.targets.torch_aoti.fp8_layers.Fp8ConvNHWC``: nine shifted views concatenated, 9x the
activation bytes, then one FP8 GEMM) or, opt-in, as ``kernels/fp8_conv.py``'s implicit GEMM.
This script says which is faster than cuDNN's fp16 convolution, by how much, per layer.

Per layer shape of timm's resnet50 at 224x224 (the 52 convolutions the family quantizes:
all but the stem; ``RESNET50_CONVS``, checked against timm by tests/test_fp8_conv_kernel.py),
at ``--batch`` (32), NHWC fp16 activations:

  cudnn     F.conv2d on channels_last fp16 (cudnn.benchmark on): the fp16 bundle's conv
  im2col    Fp8ConvNHWC (3x3) / Fp8Pointwise (1x1) as the fp8 model has them, eager:
            quantize, (3x3) concatenated taps, rowwise _scaled_mm, fp16 out
  gemm      the _scaled_mm alone on an already built im2col buffer: the floor of im2col
  im2col-c  torch.compile of the im2col module (Inductor fuses pad, concat and quantize)
  triton    the Triton kernel alone on already quantized input, best of its tile configs
            (``CANDIDATE_CONFIGS`` and ``default_config``; --configs), tiles printed
  triton-c  torch.compile of the Triton module (quantize + kernel, default_config tiles)
  cudnn-fp8 cuDNN's own FP8 convolution through the cuDNN frontend (``import cudnn``, pip
            nvidia-cudnn-frontend; skipped, with the reason, where it is not installed):
            e4m3 NHWC operands, per-channel scale and bias in its epilogue, fp16 out

Timing: each variant is captured in a CUDA graph and replayed; median of --iters replays
(CUDA events) after warm-up. Errors: max |x - cudnn| / max |cudnn| (FP8 itself is a few
percent). Totals: sum over the 52 layers of count x time (the layers' share of a forward
pass), with ratios cudnn / variant (> 1: faster than fp16).

--model: timm_resnet50 (random weights, BN folded), fp32 NCHW in: fp16 (the model in
channels_last, as the family's fp16 bundle and the torch.compile peer run it), and the
torch-aoti fp8 engine module (``build.engine_model``) with its 3x3 layers on the Triton
kernel, on im2col, or in fp16 (fp8-pointwise), and the fused form (fp8-fused: the
channels_last model, bottlenecks fused, ``fp8_conv="triton-fused"``; fp8-fused-allf16: the
same with every block writing its fp16 output, also where the next block reads only e4m3,
as before 2026-12-01's seventh session; fp8-fused-tma: the family's form; fp8-fused-tma-stem:
the same with the stem's bias, ReLU, max pool and quantize in one kernel,
``rewrite_fused(fuse_stem=True)``); ``--model-variants``,
``--model-only`` (no per-layer tables). Each is
``torch.compile``-d (default mode, batch static) and CUDA-graph replayed: ms per batch,
ratios to fp16, top-1 agreement with fp16. Needs timm.

--fused-layers (issue 18: why fp8-fused is slower than the per-layer kernel times): the fused
op (``fp8_conv_fused``) on every layer shape with the epilogue the fused model gives that layer
(read off ``fused.rewrite_fused``'s timm resnet50: conv1 and conv2 ReLU -> e4m3, conv3
residual + ReLU -> fp16 + e4m3, the last conv3 fp16 only, downsample fp16), for every tile
config (``default_config`` and ``CANDIDATE_CONFIGS``), next to the plain op with the same tiles
(fp16 out, the same ReLU, no residual, no e4m3): the epilogue's cost and the tiles' are told
apart. It prints per layer the default tiles' and the best tiles' times, the totals over the
52 layers, and the best tiles per layer shape as a ``MEASURED_TILES`` literal (at another
``--batch``: ``MEASURED_TILES_BATCH<n>``, for ``MEASURED_TILES_BY_BATCH``; at ``--batch`` <= 8
the candidates include ``SMALL_BATCH_CONFIGS``, above it ``FEW_STAGE_CONFIGS``); variant
fp8-fused-tuned is built with them, and "-eager" variants (fp8-fused-eager, ...) run without
torch.compile: the model's launches as the per-layer measurements make them.

Order: --fused-layers, the eager variants of every layer, then --model, then the compiled
variants.
--budget-s: no new measurement starts after that many seconds (default 180; a model
compile starts only with --model-reserve-s left); what was skipped is printed as such, and
the tables are printed whatever failed.

    PYTHONPATH=. python benchmarks/fp8_conv_bench.py [--batch 32] [--iters 50] [--model]
        [--model-only] [--model-variants fp16,fp8-fused,...] [--fused-layers]
        [--kinds 3x3,1x1] [--compile-kinds 3x3] [--configs all|default] [--json PATH]
        [--quiet] [--budget-s 180]

Needs torch with a CUDA GPU of compute capability >= 8.9, triton, numpy and this repository
(its own imports: ml_dtypes).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import signal
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: (in channels, out channels, input height = width, kernel, stride, padding) -> how many
#: of timm resnet50's 52 non-stem convolutions have that shape at a 224x224 input.
RESNET50_CONVS = {
    (64, 64, 56, 1, 1, 0): 1, (64, 64, 56, 3, 1, 1): 3, (64, 256, 56, 1, 1, 0): 4,
    (256, 64, 56, 1, 1, 0): 2, (256, 128, 56, 1, 1, 0): 1, (128, 128, 56, 3, 2, 1): 1,
    (128, 512, 28, 1, 1, 0): 4, (256, 512, 56, 1, 2, 0): 1, (512, 128, 28, 1, 1, 0): 3,
    (128, 128, 28, 3, 1, 1): 3, (512, 256, 28, 1, 1, 0): 1, (256, 256, 28, 3, 2, 1): 1,
    (256, 1024, 14, 1, 1, 0): 6, (512, 1024, 28, 1, 2, 0): 1, (1024, 256, 14, 1, 1, 0): 5,
    (256, 256, 14, 3, 1, 1): 5, (1024, 512, 14, 1, 1, 0): 1, (512, 512, 14, 3, 2, 1): 1,
    (512, 2048, 7, 1, 1, 0): 3, (1024, 2048, 14, 1, 2, 0): 1, (2048, 512, 7, 1, 1, 0): 2,
    (512, 512, 7, 3, 1, 1): 2,
}
VARIANTS = ("cudnn", "im2col", "gemm", "im2col-c", "triton", "triton-c", "cudnn-fp8")
STARTED = time.monotonic()


def log(msg: str) -> None:
    print(f"[{time.monotonic() - STARTED:6.1f}s] {msg}", flush=True)


def shape_name(shape: tuple) -> str:
    cin, cout, hw, k, s, _ = shape
    return f"{k}x{k} s{s} {cin}->{cout} @{hw}"


def flops(shape: tuple, batch: int) -> float:
    cin, cout, hw, k, s, p = shape
    ho = (hw + 2 * p - k) // s + 1
    return 2.0 * batch * ho * ho * cout * cin * k * k


class Interrupted(BaseException):
    """SIGTERM (``timeout``): stop measuring, print what there is."""


def _interrupt(_signum, _frame):
    raise Interrupted()


class Budget:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def left(self) -> float:
        return self.seconds - (time.monotonic() - STARTED)


def graph_time(fn, iters: int, warmup: int = 5, calls: int = 1):
    """Median ms of one call of ``fn`` from CUDA-graph replays of ``calls`` calls (warmed up
    on a side stream first), and the output of the last captured call.

    Why ``calls``: a replay costs ~10 us of its own (launch and events), more than a layer
    takes at batch 1-8, so with one call a graph every such layer read 0.010-0.016 ms
    whatever its tiles (fortieth session's tma-small). The calls reuse one input, which
    stays in L2 as a small batch's weights and activations do between a model's layers."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls - 1):
            fn()
        out = fn()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times) / calls, out


def rel_err(got, ref) -> float:
    return float((got.float() - ref.float()).abs().max() / ref.float().abs().max())


class Layer:
    """One convolution shape: its fp16 tensors, the fp8 modules the engine model would use."""

    def __init__(self, shape: tuple, batch: int) -> None:
        import torch
        from torch import nn

        from bundler.targets.torch_aoti import fp8_layers as tam

        cin, cout, hw, k, s, p = shape
        self.shape, self.k = shape, k
        gen = torch.Generator().manual_seed(hash(shape) % 2**31)
        self.conv = nn.Conv2d(cin, cout, k, s, p)
        with torch.no_grad():
            self.conv.weight.copy_(torch.randn(self.conv.weight.shape, generator=gen)
                                   * math.sqrt(2.0 / (cin * k * k)))
            self.conv.bias.copy_(torch.randn(cout, generator=gen) * 0.1)
        # post-ReLU-like activations, as the convolutions after the first see
        self.x = torch.randn(batch, hw, hw, cin, generator=gen).clamp_min(0).half().cuda()
        self.act_scale = float(self.x.float().abs().max()) / 448.0
        self.weight_scales = (self.conv.weight.detach().abs().amax(dim=(1, 2, 3)) / 448.0
                              ).clamp_min(1e-8).numpy()
        ho = (hw + 2 * p - k) // s + 1
        self.rows = batch * ho * ho
        self.ones = tam.OnesColumn(self.rows)
        self.tam = tam

    def im2col_module(self):
        import torch

        cls = self.tam.Fp8Pointwise if self.k == 1 else self.tam.Fp8ConvNHWC
        return cls(self.conv, self.act_scale, self.weight_scales, torch.float16,
                   ones=self.ones).cuda()

    def triton_module(self):
        import torch

        return self.tam.Fp8ConvNHWC(self.conv, self.act_scale, self.weight_scales,
                                    torch.float16, ones=self.ones, conv_kernel="triton").cuda()

    def cudnn(self):
        import torch
        import torch.nn.functional as F

        w = self.conv.weight.detach().half().cuda().to(memory_format=torch.channels_last)
        b = self.conv.bias.detach().half().cuda()
        x = self.x.permute(0, 3, 1, 2)                  # NCHW view of NHWC: channels_last
        stride, padding = self.conv.stride, self.conv.padding
        return lambda: F.conv2d(x, w, b, stride, padding)


def cudnn_fp8_conv(layer: Layer, q, weight_fp8, scale, bias):
    """A callable running ``layer`` as cuDNN's FP8 convolution (cuDNN frontend graph):
    e4m3 NHWC input and [K, R, S, C] weight, fp32 accumulation, ``* scale + bias`` per
    channel, fp16 NHWC out."""
    import cudnn
    import torch

    cin, cout, hw, k, stride, pad = layer.shape
    n = q.shape[0]
    ho = (hw + 2 * pad - k) // stride + 1
    handle = cudnn.create_handle()
    g = cudnn.pygraph(io_data_type=cudnn.data_type.FP8_E4M3,
                      intermediate_data_type=cudnn.data_type.FLOAT,
                      compute_data_type=cudnn.data_type.FLOAT, handle=handle)
    x_nchw = q.permute(0, 3, 1, 2)                                   # NHWC strides
    w = weight_fp8[:cout, :k * k * cin].contiguous().view(cout, k, k, cin).permute(0, 3, 1, 2)
    per_channel = dict(dim=[1, cout, 1, 1], stride=[cout, 1, cout, cout],
                       data_type=cudnn.data_type.FLOAT)
    X = g.tensor(name="X", dim=list(x_nchw.shape), stride=list(x_nchw.stride()),
                 data_type=cudnn.data_type.FP8_E4M3)
    W = g.tensor(name="W", dim=list(w.shape), stride=list(w.stride()),
                 data_type=cudnn.data_type.FP8_E4M3)
    S = g.tensor(name="S", **per_channel)
    B = g.tensor(name="B", **per_channel)
    conv = g.conv_fprop(image=X, weight=W, padding=[pad, pad], stride=[stride, stride],
                        dilation=[1, 1])
    Y = g.add(a=g.mul(a=conv, b=S), b=B)
    Y.set_output(True).set_data_type(cudnn.data_type.HALF).set_dim(
        [n, cout, ho, ho]).set_stride([ho * ho * cout, 1, ho * cout, cout])
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    workspace = torch.empty(max(1, g.get_workspace_size()), device="cuda", dtype=torch.uint8)
    out = torch.empty(n, ho, ho, cout, device="cuda", dtype=torch.float16)
    pack = {X: x_nchw, W: w, S: scale[:cout].reshape(1, cout, 1, 1).contiguous(),
            B: bias[:cout].reshape(1, cout, 1, 1).contiguous(), Y: out.permute(0, 3, 1, 2)}

    def run():
        # the stream of the moment: a CUDA graph captures on a stream of its own
        cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
        g.execute(pack, workspace, handle=handle)
        return out

    return run


def measure_layer(layer: Layer, which: str, args, configs) -> dict:
    """One variant of one layer: {"ms", "err" or "error", and "tiles" for triton}."""
    import torch

    x = layer.x
    if which == "cudnn":
        ms, out = graph_time(layer.cudnn(), args.iters, calls=args.per_graph)
        layer.ref = out.permute(0, 2, 3, 1)
        return {"ms": ms}
    if which == "im2col":
        m = layer.im2col_module()
        ms, out = graph_time(lambda: m(x), args.iters, calls=args.per_graph)
        layer.im2col_out = out
        return {"ms": ms, "err": rel_err(out, layer.ref)}
    if which == "gemm":
        m = layer.im2col_module()
        q = layer.tam.quantize(x, m.act_scale)
        if layer.k > 1:
            taps, _, _ = layer.tam.conv_taps(q.view(torch.uint8), m.kernel, m.stride,
                                             m.padding, m.dilation)
            q = torch.cat(taps, dim=-1).view(torch.float8_e4m3fn)
        elif m.stride != (1, 1):
            q = q[:, ::m.stride[0], ::m.stride[1], :]
        a = q.contiguous().reshape(-1, m.kpad)
        ones = layer.ones.tensor[:a.shape[0]]
        ms, _ = graph_time(lambda: torch._scaled_mm(
            a, m.weight_fp8.t(), scale_a=ones, scale_b=m.gemm_scale_row, bias=m.bias_row,
            out_dtype=torch.bfloat16), args.iters, calls=args.per_graph)
        return {"ms": ms}
    if which in ("im2col-c", "triton-c"):
        m = layer.im2col_module() if which == "im2col-c" else layer.triton_module()
        torch._dynamo.reset()    # a fresh compile: no recompile limit across the layers
        compiled = torch.compile(m, dynamic=False)
        ms, out = graph_time(lambda: compiled(x), args.iters, calls=args.per_graph)
        return {"ms": ms, "err": rel_err(out, layer.ref)}
    if which == "cudnn-fp8":
        try:
            import cudnn  # noqa: F401
        except ImportError as e:
            return {"skipped": f"no cuDNN frontend ({e}): pip install nvidia-cudnn-frontend"}
        m = layer.triton_module()
        q = layer.tam.quantize(x, m.act_scale).contiguous()
        ms, out = graph_time(cudnn_fp8_conv(layer, q, m.weight_fp8, m.conv_scale, m.bias_out),
                             args.iters, calls=args.per_graph)
        return {"ms": ms, "err": rel_err(out, layer.ref)}
    if which == "triton":
        from bundler.targets.torch_aoti.kernels.fp8_conv import fp8_conv

        m = layer.triton_module()
        q = layer.tam.quantize(x, m.act_scale).contiguous()
        best, tried = None, {}
        for cfg in configs(layer):
            name = "x".join(map(str, cfg[:3])) + f"/w{cfg[3]}s{cfg[4]}"
            try:
                ms, out = graph_time(lambda cfg=cfg: fp8_conv(
                    q, m.weight_fp8, m.conv_scale, m.bias_out, m.out, m.kernel, m.stride,
                    m.padding, m.dilation, config=cfg), args.iters, calls=args.per_graph)
            except Exception as e:   # a config that does not compile (shared memory)
                tried[name] = f"failed: {type(e).__name__}"
                continue
            tried[name] = round(ms, 4)
            if best is None or ms < best["ms"]:
                best = {"ms": ms, "tiles": name, "err": rel_err(out, layer.ref),
                        "vs_im2col": rel_err(out, getattr(layer, "im2col_out", layer.ref))}
        if best is None:
            raise RuntimeError(f"no tile config ran: {tried}")
        best["tried"] = tried
        return best
    raise ValueError(which)


#: Cheap eager measurements of every layer first, then torch.compile (seconds per layer),
#: so that a short budget still gives a whole table; --model runs between the two.
EAGER_PHASE = ("cudnn", "im2col", "gemm", "triton", "cudnn-fp8")
COMPILED_PHASE = ("im2col-c", "triton-c")


def run_layers(args, budget: Budget, phase: tuple[str, ...], results: dict,
               layers: dict) -> dict:
    """Measure the variants of ``phase`` on every layer shape of ``--kinds`` into
    ``results`` (layer name -> {"shape", "count", "v": variant -> result})."""
    import torch

    from bundler.targets.torch_aoti.kernels.fp8_conv import CANDIDATE_CONFIGS, default_config

    kinds = {int(k.split("x")[0]) for k in args.kinds.split(",") if k}
    compile_kinds = {int(k.split("x")[0]) for k in args.compile_kinds.split(",") if k}
    shapes = [s for s in RESNET50_CONVS if s[3] in kinds]

    def configs(layer: Layer):
        cin, cout, _, k, _, _ = layer.shape
        base = default_config(cin, cout, (k, k))
        if args.configs == "default" or (k == 1 and args.configs != "all-1x1"):
            return [base]
        return [base] + [c for c in CANDIDATE_CONFIGS if c != base]

    torch.backends.cudnn.benchmark = True
    for s in shapes:
        results.setdefault(shape_name(s), {"shape": list(s), "count": RESNET50_CONVS[s], "v": {}})
    said: set[str] = set()
    for which in phase:
        log(f"phase: {which}")
        for s in shapes:
            row = results[shape_name(s)]["v"]
            if which in COMPILED_PHASE and s[3] not in compile_kinds:
                row[which] = {"skipped": "not compiled (--compile-kinds)"}
                continue
            if which == "triton-c" and s[3] == 1:
                row[which] = {"skipped": "1x1: the model keeps Fp8Pointwise"}
                continue
            if budget.left() <= 0:
                row[which] = {"skipped": "budget"}
                continue
            try:
                if s not in layers:
                    layers[s] = Layer(s, args.batch)
                if which != "cudnn" and not hasattr(layers[s], "ref"):
                    raise RuntimeError("no cudnn reference")
                row[which] = measure_layer(layers[s], which, args, configs)
                if "skipped" in row[which]:
                    if row[which]["skipped"] not in said:
                        said.add(row[which]["skipped"])
                        log(f"{which}: skipped: {row[which]['skipped']}")
                    continue
                if not args.quiet:
                    log(f"{shape_name(s):28s} {which:9s} {row[which]['ms']:.4f} ms"
                        + (f"  err {row[which]['err']:.3g}" if "err" in row[which] else "")
                        + (f"  tiles {row[which]['tiles']}" if "tiles" in row[which] else ""))
            except Exception as e:
                row[which] = {"error": f"{type(e).__name__}: {e}"[:400]}
                log(f"{shape_name(s):28s} {which:9s} FAILED {row[which]['error']}")
                if args.verbose:
                    traceback.print_exc()
        torch.cuda.empty_cache()
    return results


def print_layers(results: dict, batch: int) -> None:
    print(f"\n== ResNet-50 convolutions at batch {batch}: ms (median CUDA-graph replay); "
          "x = cudnn / variant (> 1: faster than fp16 cuDNN)")
    head = f"{'layer':28s} {'n':>2s} {'GFLOP':>6s}"
    for v in VARIANTS:
        head += f" {v:>9s} {'x':>5s}"
    print(head + f" {'err-im2col':>10s} {'err-triton':>10s}  triton tiles")
    totals = {kind: {v: 0.0 for v in VARIANTS} for kind in ("3x3", "1x1", "all")}
    complete = {kind: {v: True for v in VARIANTS} for kind in totals}
    for name, r in results.items():
        v, count = r["v"], r["count"]
        base = v.get("cudnn", {}).get("ms")
        line = f"{name:28s} {count:2d} {flops(tuple(r['shape']), batch) / 1e9:6.1f}"
        kind = f"{r['shape'][3]}x{r['shape'][3]}"
        for var in VARIANTS:
            ms = v.get(var, {}).get("ms")
            if ms is None:
                tag = ("-" if var not in v else "skip" if "skipped" in v[var]
                       else "FAIL")
                line += f" {tag:>9s} {'':>5s}"
                for k in (kind, "all"):
                    complete[k][var] = False
                continue
            line += f" {ms:9.4f} {base / ms if base else float('nan'):5.2f}"
            for k in (kind, "all"):
                totals[k][var] += count * ms
        line += f" {v.get('im2col', {}).get('err', float('nan')):10.3g}"
        line += f" {v.get('triton', {}).get('err', float('nan')):10.3g}"
        line += f"  {v.get('triton', {}).get('tiles', '')}"
        print(line)
    print("\n== totals over the layers (sum of count x ms: their time in one forward pass)")
    print(f"{'layers':8s}" + "".join(f" {v:>9s} {'x':>5s}" for v in VARIANTS))
    present = {f"{r['shape'][3]}x{r['shape'][3]}" for r in results.values()} | {"all"}
    for kind, t in totals.items():
        if kind not in present:
            continue
        base = t["cudnn"]
        line = f"{kind:8s}"
        for var in VARIANTS:
            mark = "" if complete[kind][var] else "*"
            ratio = base / t[var] if t[var] else float("nan")
            line += f" {t[var]:8.3f}{mark or ' '} {ratio:5.2f}"
        print(line)
    print("(* some layers missing from that total: failed, skipped or not run (-))")
    tried = {n: r["v"]["triton"]["tried"] for n, r in results.items()
             if len(r["v"].get("triton", {}).get("tried", {})) > 1}
    if tried:
        print("\n== Triton tiles tried (ms; the first is default_config's)")
        for n, t in tried.items():
            print(f"{n:28s} " + ", ".join(f"{cfg} {ms}" for cfg, ms in t.items()))
    errors = [(n, var, x["error"]) for n, r in results.items() for var, x in r["v"].items()
              if "error" in x]
    for n, var, err in errors:
        print(f"FAILED {n} {var}: {err}")


# --- the fused op per layer (--fused-layers) --------------------------------------------------

#: A fused convolution's epilogue as fused.FusedConv runs it: (ReLU, residual added, fp16
#: written, e4m3 written with the next scale).
EPILOGUE_NAMES = {(True, False, False, True): "relu>f8", (True, True, True, True): "res+relu>f16+f8",
                  (True, True, True, False): "res+relu>f16", (False, False, True, False): ">f16",
                  (True, False, True, True): "relu>f16+f8", (True, False, True, False): "relu>f16"}


def epilogue_name(epilogue: tuple) -> str:
    return EPILOGUE_NAMES.get(epilogue, str(epilogue))


def config_name(cfg) -> str:
    return "x".join(map(str, cfg[:3])) + f"/w{cfg[3]}s{cfg[4]}"


def fused_layer_epilogues() -> dict[tuple, dict[tuple, int]]:
    """RESNET50_CONVS shape -> {epilogue: how many layers}, read off timm resnet50 as
    ``fused.rewrite_fused`` builds it (CPU; the scales do not change the structure, except
    that every convolution is FP8, as in the fp8-fused variant)."""
    import numpy as np
    import torch

    from bundler.families import load_family
    from bundler.targets.torch_aoti.fused import (FusedBottleneck, bottleneck_parts,
                                                  rewrite_fused)
    from bundler.torch_model import build_torch_model

    model = build_torch_model(load_family("timm_resnet50"), seed=0)
    fp8 = {n: (0.01, np.full(m.out_channels, 1e-3, np.float32)) for n, m in model.named_modules()
           if isinstance(m, torch.nn.Conv2d) and n != "conv1"}
    by_key = {(cin, cout, k, st): shape for shape in RESNET50_CONVS
              for cin, cout, _hw, k, st, _p in [shape]}
    assert len(by_key) == len(RESNET50_CONVS), "RESNET50_CONVS: (cin, cout, k, s) not unique"
    found: dict[tuple, dict[tuple, int]] = {}
    for name, block in rewrite_fused(model, fp8).named_modules():
        if not isinstance(block, FusedBottleneck):
            continue
        originals = bottleneck_parts(model.get_submodule(name))
        for role, original in zip(("conv1", "conv2", "conv3", "downsample"), originals):
            conv = getattr(block, role)
            if conv is None or not conv.fp8:
                continue
            shape = by_key[(original.in_channels, original.out_channels,
                            original.kernel_size[0], original.stride[0])]
            epilogue = (conv.relu, role == "conv3", conv.out16, conv.out_scale is not None)
            row = found.setdefault(shape, {})
            row[epilogue] = row.get(epilogue, 0) + 1
    counted = {sh: sum(e.values()) for sh, e in found.items()}
    if counted != RESNET50_CONVS:
        raise RuntimeError(f"the fused model's layers are not RESNET50_CONVS: {counted}")
    return found


def measure_fused_entry(layer: Layer, epilogue: tuple, configs: list, iters: int,
                        plain: str = "chosen", calls: int = 1) -> dict:
    """One (layer shape, epilogue): for each tile config (``configs[0]``: the default), the
    fused op with that epilogue; and the plain op (fp16 out, the same ReLU, no residual, no
    e4m3) with the same tiles as the default and the best config ("chosen") or all."""
    import torch

    from bundler.targets.torch_aoti.kernels.fp8_conv import fp8_conv, fp8_conv_fused

    relu, residual, out16, out8 = epilogue
    m = layer.triton_module()
    q = layer.tam.quantize(layer.x, m.act_scale).contiguous()
    geometry = (m.kernel, m.stride, m.padding, m.dilation)
    ref = fp8_conv(q, m.weight_fp8, m.conv_scale, m.bias_out, m.out, *geometry, relu=relu)
    gen = torch.Generator(device=ref.device).manual_seed(1)
    res = (torch.randn(ref.shape, device=ref.device, generator=gen, dtype=torch.float16)
           * ref.float().std()).half() if residual else None
    out_scale = (ref.float().abs().amax() / 448.0).reshape(()) if out8 else None
    tried: dict[str, dict] = {}
    for cfg in configs:
        try:
            tried[config_name(cfg)] = {"fused": graph_time(lambda cfg=cfg: fp8_conv_fused(
                q, m.weight_fp8, m.conv_scale, m.bias_out, m.out, *geometry, residual=res,
                relu=relu, out_f16=out16, out_scale=out_scale, config=cfg), iters,
                calls=calls)[0]}
        except Exception as e:   # a config that does not compile (shared memory, registers)
            tried[config_name(cfg)] = {"failed": f"{type(e).__name__}: {e}"[:200]}
    ran = [c for c in configs if "fused" in tried[config_name(c)]]
    best = min(ran, key=lambda c: tried[config_name(c)]["fused"]) if ran else None
    # the plain op with the tiles of the default and of the best (all of them: plain="all")
    for cfg in configs if plain == "all" else {configs[0], best} - {None}:
        if "fused" in tried[config_name(cfg)]:
            tried[config_name(cfg)]["plain"], _ = graph_time(lambda cfg=cfg: fp8_conv(
                q, m.weight_fp8, m.conv_scale, m.bias_out, m.out, *geometry, relu=relu,
                config=cfg), iters, calls=calls)
    return tried


def run_fused_layers(args, budget: Budget, results: dict) -> dict:
    """--fused-layers: every RESNET50_CONVS shape with each epilogue the fused model gives
    it, every tile config (``default_config``'s first, then ``CANDIDATE_CONFIGS``), into
    ``results`` ("layers": name -> entry, "tiles": the best config per shape)."""
    import torch

    from bundler.targets.torch_aoti.kernels.fp8_conv import (CANDIDATE_CONFIGS,
                                                             FEW_STAGE_CONFIGS,
                                                             SMALL_BATCH_CONFIGS, default_config)

    candidates = CANDIDATE_CONFIGS + (SMALL_BATCH_CONFIGS if args.batch <= SMALL_BATCH
                                      else FEW_STAGE_CONFIGS)
    log("phase: fused layers (the fused op with each layer's epilogue, every tile config"
        + (", small-batch tiles too)" if args.batch <= SMALL_BATCH else ")"))
    epilogues = fused_layer_epilogues()
    reserve = args.model_reserve_s * args.fused_reserve_models if args.model else 0.0
    rows = results.setdefault("layers", {})
    for shape, by_epilogue in epilogues.items():
        cin, cout, _hw, k, st, _p = shape
        base = default_config(cin, cout, (k, k))
        configs = [base] + [c for c in candidates if c != base]
        if args.fused_configs == "default":
            configs = [base]
        layer = None
        for epilogue, count in by_epilogue.items():
            name = f"{shape_name(shape)} {epilogue_name(epilogue)}"
            if budget.left() <= reserve:
                rows[name] = {"shape": list(shape), "epilogue": list(epilogue), "count": count,
                              "skipped": "budget (kept for the models)"}
                continue
            try:
                layer = layer or Layer(shape, args.batch)
                tried = measure_fused_entry(layer, epilogue, configs, args.iters,
                                            args.fused_plain, args.per_graph)
            except Exception as e:
                rows[name] = {"shape": list(shape), "epilogue": list(epilogue), "count": count,
                              "error": f"{type(e).__name__}: {e}"[:400]}
                log(f"{name:44s} FAILED {rows[name]['error']}")
                continue
            rows[name] = {"shape": list(shape), "epilogue": list(epilogue), "count": count,
                          "default": config_name(base), "tried": tried}
            ok = {c: t for c, t in tried.items() if "fused" in t}
            if ok:
                best = min(ok, key=lambda c: ok[c]["fused"])
                d, nan = ok.get(config_name(base), {}), float("nan")
                log(f"{name:40s} x{count}  best {best} {ok[best]['fused']:.4f} ms "
                    f"(plain {ok[best].get('plain', nan):.4f})  default "
                    f"{d.get('fused', nan):.4f} (plain {d.get('plain', nan):.4f})")
        del layer
        torch.cuda.empty_cache()
    results["tiles"] = choose_tiles(rows)
    return results


#: --batch at or below which --fused-layers also tries ``SMALL_BATCH_CONFIGS``.
SMALL_BATCH = 8


def choose_tiles(rows: dict) -> dict:
    """Per layer shape, the config with the least count-weighted fused time over the
    epilogues that shape has (the table is keyed by shape: ``kernels.fp8_conv.tile_key``);
    shapes with a failed or skipped epilogue are left out (they keep ``default_config``)."""
    by_shape: dict[tuple, list] = {}
    for r in rows.values():
        by_shape.setdefault(tuple(r["shape"]), []).append(r)
    chosen = {}
    for shape, entries in by_shape.items():
        if any("tried" not in e for e in entries):
            continue
        names = set.intersection(*({c for c, t in e["tried"].items() if "fused" in t}
                                   for e in entries))
        if not names:
            continue
        cost = {c: sum(e["count"] * e["tried"][c]["fused"] for e in entries) for c in names}
        best = min(cost, key=cost.get)
        default = entries[0]["default"]
        chosen[shape] = {"tiles": best, "ms": cost[best], "default_ms": cost.get(default)}
    return chosen


def tiles_from_name(name: str):
    """``config_name``'s string back to an Fp8ConvConfig (group_m: the default)."""
    from bundler.targets.torch_aoti.kernels.fp8_conv import Fp8ConvConfig

    blocks, rest = name.split("/w")
    warps, stages = rest.split("s")
    bm, bn, bk = map(int, blocks.split("x"))
    return Fp8ConvConfig(bm, bn, bk, int(warps), int(stages))


def tile_table(chosen: dict) -> dict:
    """The measured choice as ``rewrite_fused(tiles=...)`` takes it."""
    from bundler.targets.torch_aoti.kernels.fp8_conv import tile_key

    return {tile_key(cin, cout, (k, k), (st, st)): tiles_from_name(c["tiles"])
            for (cin, cout, _hw, k, st, _p), c in chosen.items()}


def print_fused_layers(results: dict, batch: int) -> None:
    rows, chosen = results.get("layers", {}), results.get("tiles", {})
    print(f"\n== the fused op per layer at batch {batch} (ms, CUDA-graph replay): its epilogue in "
          "the fused model; 'plain' = the unfused op (fp16 out, no residual, no e4m3) with the "
          "same tiles")
    print(f"{'layer':28s} {'epilogue':16s} {'n':>2s} {'default tiles':>16s} {'fused':>7s} "
          f"{'plain':>7s} {'best tiles':>16s} {'fused':>7s} {'plain':>7s} {'dflt/best':>9s}")
    tot = {"default": 0.0, "default_plain": 0.0, "best": 0.0, "best_plain": 0.0}
    complete = True
    for name, r in rows.items():
        shape = tuple(r["shape"])
        head = f"{shape_name(shape):28s} {epilogue_name(tuple(r['epilogue'])):16s} {r['count']:2d}"
        ok = {c: t for c, t in r.get("tried", {}).items() if "fused" in t}
        if not ok:
            complete = False
            print(f"{head} {r.get('error') or r.get('skipped') or 'no config ran'}")
            continue
        nan = float("nan")
        d = {"fused": nan, "plain": nan, **ok.get(r["default"], {})}
        best = min(ok, key=lambda c: ok[c]["fused"])
        b = {"plain": nan, **ok[best]}
        print(f"{head} {r['default']:>16s} {d['fused']:7.4f} {d['plain']:7.4f} {best:>16s} "
              f"{b['fused']:7.4f} {b['plain']:7.4f} {d['fused'] / b['fused']:9.2f}")
        n = r["count"]
        tot["default"] += n * d["fused"]
        tot["default_plain"] += n * d["plain"]
        tot["best"] += n * b["fused"]
        tot["best_plain"] += n * b["plain"]
    mark = "" if complete else " (* some layers missing)"
    print(f"\n== totals over the 52 layers (sum of count x ms){mark}: fused op with default tiles "
          f"{tot['default']:.3f} ms (plain {tot['default_plain']:.3f}); best tiles per "
          f"(layer, epilogue) {tot['best']:.3f} ms (plain {tot['best_plain']:.3f})")
    print("(the fp8-fused model's conv kernels took 2.45 ms on 2026-12-01: far above these "
          "sums means the compiled graph launches it differently, see fp8-fused-eager)")
    for name, r in rows.items():
        for cfg, t in r.get("tried", {}).items():
            if "failed" in t:
                print(f"FAILED {name} {cfg}: {t['failed']}")
    if chosen:
        name = ("MEASURED_TILES" if batch == 32 else f"MEASURED_TILES_BATCH{batch}")
        print("\n== tiles per layer shape, count-weighted over its epilogues (paste into "
              f"bundler/targets/torch_aoti/kernels/fp8_conv.py as {name}"
              + ("" if batch == 32 else f", listed in MEASURED_TILES_BY_BATCH under {batch}")
              + ")")
        print(f"{name}: TileTable = {{")
        for shape, c in chosen.items():
            cin, cout, _hw, k, st, _p = shape
            cfg = tiles_from_name(c["tiles"])
            saved = (f", default {c['default_ms']:.4f}" if c.get("default_ms") is not None
                     else "")
            print(f"    ({cin}, {cout}, {k}, {k}, {st}, {st}): Fp8ConvConfig{tuple(cfg)},"
                  f"  # {shape_name(shape)}: {c['ms']:.4f} ms{saved}")
        print("}")


class PtxasResources(NamedTuple):
    """What ptxas and the PTX say of one compiled kernel."""

    registers: str
    spill_bytes: str
    shared_bytes: int
    narrow_loads: int     #: global loads narrower than 16 bytes (scalars, .v2)
    wide_loads: int       #: 16-byte global loads (ld.global.v4 of 32-bit words, ...)


def triton_ptxas(arch: int) -> Path:
    """The ptxas Triton itself assembles sm_``arch`` code with. Triton 3.9 (torch 2.15)
    writes PTX 9.x for sm_90 and assembles it with its CUDA 13 ``ptxas-blackwell``; the
    CUDA 12.9 ``bin/ptxas`` beside it refuses that PTX ("Unsupported .version 9.4")."""
    import triton

    try:
        from triton.backends.nvidia.compiler import get_ptxas
    except ImportError:       # a Triton without the per-arch choice: its one ptxas
        return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    return Path(get_ptxas(arch).path)


def ptxas_resources(kernel, signature: dict, constexprs: dict, attrs: dict, options: dict,
                    arch: int, tmp: Path) -> PtxasResources:
    """``kernel`` compiled for sm_``arch`` by Triton (no GPU needed) and assembled by its
    bundled ptxas: registers, spills, shared memory, and how wide its global loads are
    (a load Triton could not prove aligned shows as many narrow ones)."""
    import re
    import subprocess

    import triton
    from triton.backends.compiler import GPUTarget

    ptxas = triton_ptxas(arch)
    compiled = triton.compile(
        triton.compiler.ASTSource(fn=kernel, signature=signature, constexprs=constexprs,
                                  attrs=attrs),
        target=GPUTarget("cuda", arch, 32), options=options)
    ptx = tmp / "k.ptx"
    text = compiled.asm["ptx"]
    ptx.write_text(text)
    run = subprocess.run([str(ptxas), f"-arch=sm_{arch}a", "-v", str(ptx),
                          "-o", str(tmp / "k.cubin")], capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"{ptxas} failed (exit {run.returncode}): {run.stderr.strip()[:400]}")
    out = run.stderr
    loads = re.findall(r"ld\.global(?:\.\w+)*?(\.v[248])?\.[bfsu](\d+)\s", text)
    wide = sum(1 for vec, bits in loads if int(vec[2:] if vec else 1) * int(bits) >= 128)
    return PtxasResources(re.search(r"Used (\d+) registers", out).group(1),
                          re.search(r"(\d+) bytes spill stores", out).group(1),
                          compiled.metadata.shared, len(loads) - wide, wide)


def ptxas_report(arch: int = 90) -> int:
    """--ptxas (no GPU needed): compile the kernel for sm_``arch`` with each tile config and
    epilogue of --fused-layers and print ptxas' registers, spills and the shared memory per
    program: a spill or a register count that halves the programs per SM shows before any
    timing. Integer arguments are marked divisible by 16 as Triton's JIT marks ResNet-50's."""
    import tempfile

    from bundler.fp8 import E4M3_MAX
    from bundler.targets.torch_aoti.kernels import fp8_conv as kernels

    kernel = kernels._fp8_conv_nhwc_kernel
    names = kernel.arg_names
    pointers = ["*fp8e4nv", "*fp8e4nv", "*fp32", "*fp32", "*fp16", "*fp16", "*fp8e4nv", "*fp32"]
    configs = list(dict.fromkeys([kernels.Fp8ConvConfig(128, 64, 64, 4, 4),
                                  kernels.Fp8ConvConfig(128, 128, 64, 8, 4),
                                  kernels.Fp8ConvConfig(128, 128, 128, 8, 3),
                                  *kernels.CANDIDATE_CONFIGS]))
    epilogues = {"plain": (False, False, True, False), **{
        epilogue_name(e): e for e in ((True, False, False, True), (True, True, True, True),
                                      (False, False, True, False))}}
    print(f"== ptxas -arch=sm_{arch}a: registers / spill bytes / shared memory per program")
    with tempfile.TemporaryDirectory() as tmp:
        for cfg in configs:
            for k in (1, 3):
                for ename, (relu, residual, out16, out8) in epilogues.items():
                    consts = dict(KH=k, KW=k, SH=1, SW=1, PH=k // 2, PW=k // 2, DH=1, DW=1,
                                  RELU=relu, EVEN_C=True, RESIDUAL=residual,
                                  RES_CONTIG=residual, OUT_F16=out16, OUT_F8=out8,
                                  QMAX=E4M3_MAX, BLOCK_M=cfg[0], BLOCK_N=cfg[1],
                                  BLOCK_K=cfg[2], GROUP_M=cfg[5])
                    loose = [n for n in names if n not in consts]
                    sig = {n: "constexpr" if n in consts else
                           (pointers[loose.index(n)] if loose.index(n) < 8 else "i32")
                           for n in names}
                    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
                             if n in loose and n not in ("M", "H", "W", "HO", "WO")}
                    try:
                        regs, spill, smem, *_ = ptxas_resources(
                            kernel, sig, consts, attrs,
                            dict(num_warps=cfg[3], num_stages=cfg[4]), arch, Path(tmp))
                        print(f"{config_name(cfg):18s} {k}x{k} {ename:16s} regs {regs:>3s} "
                              f"spill {spill:>4s} B  smem {smem:6d} B", flush=True)
                    except Exception as e:
                        print(f"{config_name(cfg):18s} {k}x{k} {ename:16s} FAILED "
                              f"{type(e).__name__}: {str(e)[:150]}", flush=True)
    return 0


# --- the whole model ------------------------------------------------------------------------

#: --model's variants: fp16 = the model in fp16 channels_last (cuDNN convolutions; what the
#: family's fp16 bundle and the torch.compile peer are), fp8-triton / fp8-im2col = the fp8
#: NHWC engine module with its 3x3 layers on the Triton kernel / im2col, fp8-pointwise = FP8
#: on the 1x1 layers only (3x3 in fp16 through cuDNN), fp16-nhwc = the fp16 NHWC rewrite,
#: fp8-fused = the channels_last model with fused bottlenecks (``fp8_conv="triton-fused"``:
#: every FP8 conv on the Triton kernel, e4m3 written for the next layer, residual + ReLU in
#: the epilogue), fp8-fused-pointwise = the same with the 3x3 layers in fp16, fp8-fused-tuned
#: = fp8-fused with the tiles --fused-layers measured best per layer shape (run in the same
#: call, before the models). A "-eager" suffix on any of them: the module not compiled,
#: its eager forward CUDA-graph replayed (no Inductor: for the fused variants, the kernel
#: launches as the per-layer measurements launch it).
MODEL_VARIANTS = ("fp16", "fp8-triton", "fp8-pointwise", "fp8-im2col", "fp16-nhwc",
                  "fp8-fused", "fp8-fused-pointwise", "fp8-fused-tuned", "fp8-fused-allf16",
                  "fp8-fused-tma", "fp8-fused-tma3x3", "fp8-fused-tma-stem")


def run_model(args, budget: Budget, results: dict, tiles: dict | None = None) -> dict:
    """timm_resnet50 engine modules (random weights), compiled, CUDA-graph replayed, into
    ``results`` (variant -> result). ``tiles``: --fused-layers' choice (``choose_tiles``)
    for fp8-fused-tuned."""
    import numpy as np
    import torch

    from bundler.families import load_family
    from bundler.targets.torch_aoti.build import default_pad_channels, engine_model
    from bundler.targets.torch_aoti.nhwc_modules import EngineModule
    from bundler.torch_model import build_torch_model

    family = load_family("timm_resnet50")
    shape = tuple(family.input.shape)
    model = build_torch_model(family, seed=0).cuda()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(args.batch, *shape, generator=gen).cuda()
    paths = [n for n, m in model.named_modules()
             if isinstance(m, torch.nn.Conv2d) and n != "conv1"]
    amax: dict[str, float] = {}
    modules = dict(model.named_modules())
    hooks = [modules[p].register_forward_hook(
        lambda _m, inp, _o, p=p: amax.__setitem__(p, max(amax.get(p, 0.0),
                                                         float(inp[0].abs().max()))))
        for p in paths]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    fp8 = {p: (amax[p] / 448.0, (modules[p].weight.detach().abs().amax(dim=(1, 2, 3)) / 448.0)
               .clamp_min(1e-8).cpu().numpy()) for p in paths}
    model = model.cpu()
    pointwise = {p: s for p, s in fp8.items() if modules[p].kernel_size == (1, 1)}
    x_cl = x.contiguous(memory_format=torch.channels_last)
    outputs = {}
    for name in args.model_variants.split(","):
        # "+pkg": compiled with the Inductor options a package is built with
        # (torch_aoti.build.DEFAULT_COMPILE_OPTIONS: no pointwise autotuning), to tell
        # them from the rest of what differs between a bundle and its module
        name_base, plus, opts = name.partition("+")
        if plus and opts != "pkg":
            results[name] = {"error": f"unknown suffix +{opts}; the one suffix is +pkg"}
            continue
        eager = name_base.endswith("-eager")
        variant = name_base.removesuffix("-eager")
        if variant not in MODEL_VARIANTS:
            results[name] = {"error": f"unknown; choose from {', '.join(MODEL_VARIANTS)}"}
            continue
        if budget.left() < args.model_reserve_s:
            results[name] = {"skipped": f"budget ({budget.left():.0f} s left)"}
            log(f"model {name}: skipped, {budget.left():.0f} s of budget left")
            continue
        try:
            started = time.monotonic()
            inputs = x
            if variant == "fp16":           # the model as it is, fp16 channels_last (cuDNN)
                body = copy.deepcopy(model).half().to(memory_format=torch.channels_last)
                module, inputs = EngineModule(body, torch.float16, False), x_cl
            elif variant == "fp8-fused-tuned":   # fp8-fused, --fused-layers' tiles
                from bundler.targets.torch_aoti.fused import rewrite_fused

                if not tiles:
                    raise RuntimeError("no measured tiles: run with --fused-layers")
                table = tile_table(tiles)
                log(f"model {name}: {len(table)} layer shapes with measured tiles")
                module = EngineModule(rewrite_fused(model, fp8, tiles=table), torch.float16,
                                      False, True)
            elif variant == "fp8-fused-allf16":   # every block writes fp16 (the older form)
                from bundler.targets.torch_aoti.fused import rewrite_fused

                module = EngineModule(rewrite_fused(model, fp8, drop_unread_f16=False),
                                      torch.float16, False, True)
            elif variant == "fp8-fused-tma-stem":   # the family's form, stem fused
                from bundler.targets.torch_aoti.fused import rewrite_fused
                from bundler.targets.torch_aoti.kernels.fp8_conv_tma import (
                    MEASURED_TMA_TILES_BY_BATCH)

                module = EngineModule(rewrite_fused(
                    model, fp8, tma=True, tma_batch_tiles=MEASURED_TMA_TILES_BY_BATCH,
                    fuse_stem=True), torch.float16, False, True)
            elif variant in ("fp8-fused-tma", "fp8-fused-tma3x3"):   # the TMA forms
                form = {"fp8-fused-tma": "triton-fused-tma-small",
                        "fp8-fused-tma3x3": "triton-fused-tma-3x3"}[variant]
                module, _ = engine_model(model, "fp8", fp8, fp8_conv=form)
            elif variant.startswith("fp8-fused"):   # channels_last, bottlenecks fused
                layers = pointwise if variant.endswith("-pointwise") else fp8
                module, _ = engine_model(model, "fp8", layers, fp8_conv="triton-fused")
            else:
                precision = "fp16" if variant == "fp16-nhwc" else "fp8"
                layers = {"fp8-pointwise": pointwise, "fp16-nhwc": None}.get(variant, fp8)
                module, _ = engine_model(model, precision, layers,
                                         pad_channels=default_pad_channels(precision),
                                         input_shape=shape, max_batch=args.batch,
                                         fp8_conv="triton" if variant == "fp8-triton"
                                         else "im2col")
            module = module.cuda().eval()
            torch._dynamo.reset()
            compiled = module if eager else torch.compile(module, dynamic=False)
            patched = contextlib.nullcontext()
            if plus:
                import torch._inductor.config as inductor_config

                from bundler.targets.torch_aoti.build import DEFAULT_COMPILE_OPTIONS

                patched = inductor_config.patch(DEFAULT_COMPILE_OPTIONS)
            with torch.no_grad(), patched:
                ms, out = graph_time(lambda: compiled(inputs), args.iters, warmup=3)
            outputs[name] = out.float().clone()
            results[name] = {"ms": ms, "build_s": time.monotonic() - started}
            log(f"model {name}: {ms:.3f} ms at batch {args.batch} "
                f"({'eager, built' if eager else 'compiled'} in "
                f"{time.monotonic() - started:.0f} s)")
            if name in args.profile.split(",") or args.profile == "all":
                from kernel_profile import kernel_table   # (benchmarks/ is on sys.path)

                with torch.no_grad():
                    results[name]["kernels"] = kernel_table(
                        lambda: compiled(inputs), f"model {name}, batch {args.batch}",
                        rows=args.rows)
        except Exception as e:
            results[name] = {"error": f"{type(e).__name__}: {e}"[:400]}
            log(f"model {name}: FAILED {results[name]['error']}")
            if args.verbose:
                traceback.print_exc()
    ref = outputs.get("fp16")
    if ref is not None:
        results["fp16"]["max_abs_logit"] = float(ref.abs().max())
    for name, out in outputs.items():
        if ref is not None and name != "fp16":
            results[name]["top1_vs_fp16"] = float(
                np.mean((out.argmax(1) == ref.argmax(1)).cpu().numpy()))
            results[name]["max_logit_diff"] = float((out - ref).abs().max())
    return results


def print_model(results: dict, batch: int) -> None:
    print(f"\n== timm_resnet50 engine module (random weights), torch.compile + CUDA graph, "
          f"batch {batch}")
    if "max_abs_logit" in results.get("fp16", {}):
        print(f"(fp16 logits reach {results['fp16']['max_abs_logit']:.3g}: random weights)")
    base = results.get("fp16", {}).get("ms")
    for name, r in results.items():
        if "ms" in r:
            extra = (f"  top-1 vs fp16 {r['top1_vs_fp16']:.3f}, max |logit diff| "
                     f"{r['max_logit_diff']:.3g}" if "top1_vs_fp16" in r else "")
            ratio = f"{base / r['ms']:.3f}x fp16" if base else ""
            print(f"{name:22s} {r['ms']:8.3f} ms  {ratio}{extra}")
        else:
            print(f"{name:22s} {r.get('error') or 'skipped: ' + r.get('skipped', '')}")


def main(argv: list[str] | None = None) -> int:
    from bench_args import positive_int

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--per-graph", type=positive_int, default=None, metavar="N",
                   help="calls of a layer captured in one CUDA graph, its time divided by N "
                        "(default 20 at a batch of at most 8, else 1): a replay's own ~10 us "
                        "is more than a layer takes at small batches")
    p.add_argument("--kinds", default="3x3,1x1", help="layer kinds to measure")
    p.add_argument("--compile-kinds", default="3x3",
                   help="layer kinds also measured under torch.compile (seconds each)")
    p.add_argument("--configs", default="all", choices=("all", "default", "all-1x1"),
                   help="Triton tiles: all candidates on 3x3 layers (and on 1x1 with "
                        "all-1x1), or default_config only")
    p.add_argument("--model", action="store_true", help="also time the whole engine module")
    p.add_argument("--model-only", action="store_true",
                   help="skip the per-layer tables: only --model's variants")
    p.add_argument("--model-variants", default="fp16,fp8-fused,fp8-triton,fp8-pointwise,fp8-im2col",
                   help=f"in this order, while the budget lasts: {', '.join(MODEL_VARIANTS)}; "
                        "a name ending in +pkg is compiled with a package's Inductor options")
    p.add_argument("--model-reserve-s", type=float, default=45.0,
                   help="start a model compile only with this much budget left")
    p.add_argument("--fused-layers", action="store_true",
                   help="the fused op per layer with the epilogue the fused model gives it, "
                        "every tile config, next to the plain op (runs before --model, even "
                        "with --model-only); its best tiles feed fp8-fused-tuned")
    p.add_argument("--fused-configs", default="all", choices=("all", "default"),
                   help="--fused-layers' tiles: default_config and CANDIDATE_CONFIGS, or "
                        "default_config only")
    p.add_argument("--ptxas", action="store_true",
                   help="no GPU: ptxas' registers, spills and shared memory of the kernel for "
                        "sm_90 per tile config and epilogue, then exit")
    p.add_argument("--fused-plain", default="chosen", choices=("chosen", "all"),
                   help="--fused-layers: the plain op with the default and the best tiles "
                        "only, or with every config")
    p.add_argument("--fused-reserve-models", type=float, default=2.0,
                   help="--fused-layers stops with this many --model-reserve-s of budget "
                        "left (for the model compiles after it)")
    p.add_argument("--budget-s", type=float, default=180.0)
    p.add_argument("--profile", default="",
                   help="model variants to profile per kernel (kernel_profile.py), or all")
    p.add_argument("--rows", type=int, default=25, help="top kernels printed per profile")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--verbose", action="store_true", help="print tracebacks of failures")
    p.add_argument("--quiet", action="store_true",
                   help="no line per measurement (phases, failures and the tables only)")
    args = p.parse_args(argv)
    if args.per_graph is None:
        args.per_graph = 20 if args.batch <= SMALL_BATCH else 1
    if args.ptxas:
        return ptxas_report()

    import torch

    if not torch.cuda.is_available():
        print("needs a CUDA GPU; none is visible", file=sys.stderr)
        return 5
    cc = torch.cuda.get_device_capability()
    log(f"{torch.cuda.get_device_name()} sm_{cc[0]}{cc[1]}, torch {torch.__version__}, "
        f"batch {args.batch}, {args.iters} iters, budget {args.budget_s:.0f} s")
    try:
        import triton

        log(f"triton {triton.__version__}")
    except ImportError as e:
        log(f"triton is missing ({e}): the triton variants will fail")
    budget = Budget(args.budget_s)
    report: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                    "batch": args.batch, "iters": args.iters,
                    "per_graph": args.per_graph}
    layers: dict = {}
    report["layers"] = {}
    signal.signal(signal.SIGTERM, _interrupt)
    args.model = args.model or args.model_only
    fused: dict = {}
    try:
        if args.fused_layers:
            report["fused"] = fused
            run_fused_layers(args, budget, fused)
            print_fused_layers(fused, args.batch)
        if not args.model_only:
            run_layers(args, budget, EAGER_PHASE, report["layers"], layers)
        if args.model:
            report["model"] = {}
            run_model(args, budget, report["model"], fused.get("tiles"))
        if not args.model_only:
            run_layers(args, budget, COMPILED_PHASE, report["layers"], layers)
    except Interrupted:
        log("interrupted (SIGTERM): the tables below hold what was measured")
    except Exception as e:
        log(f"FAILED {type(e).__name__}: {e}")
        traceback.print_exc()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if fused.get("layers") and "tiles" not in fused:      # interrupted in that phase
        fused["tiles"] = choose_tiles(fused["layers"])
        print_fused_layers(fused, args.batch)
    if report["layers"]:
        print_layers(report["layers"], args.batch)
    if report.get("model"):
        print_model(report["model"], args.batch)
    log("done")
    if args.json:
        if "tiles" in fused:      # shape tuples -> strings (JSON keys)
            fused["tiles"] = {shape_name(k): {**v, "shape": list(k)}
                              for k, v in fused["tiles"].items()}
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
