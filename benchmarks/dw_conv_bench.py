"""timm_xception's depthwise convolutions on one GPU: cuDNN plus the quantize pass (what the
channels_last fp8 form runs today) against the Triton kernel that writes the FP8 GEMM's
e4m3 rows itself (``kernels/dw_conv.py``, family.json ``torch_aoti.fp8_depthwise: triton``),
layer by layer, for each of its tiles.

Why: the sixth session's profile of the fp8 engine at batch 32 (3.82 ms of kernels) had
1.23 ms of cuDNN depthwise convolutions and 1.30 ms of pointwise kernels, 40 of them the
quantize after a depthwise convolution; fp8 stood at 1.11x fp16 against issue 18's 1.25x.
This says, before any bundle is built, whether the kernel is faster than the pair it
replaces, by how much over a forward pass, and with which tile.

Per layer shape (every ``SeparableConv2d`` whose 1x1 half is an FP8 layer, as the Triton
form has them: ``xception_dw_layers``, read off timm's model), at ``--batch`` (32):

  cudnn      F.conv2d on channels_last fp16 (+ bias, + ReLU where the model has one): the
             fp16 engine's layer alone, fp16 out
  cudnn+q    what the fp8 engine runs around it today, torch.compile'd: the pass before it
             (the block's ReLU, and the convert of a GEMM's bf16 output), cuDNN's kernel,
             Inductor's pad + QuantizeLinear kernel: e4m3 rows out
  triton     the Triton kernel (ReLU on load, bf16 read in place), each tile of
             ``DW_CONFIGS``: e4m3 rows out

Timing: CUDA graph replay, median of --iters (``fp8_conv_bench.graph_time``). Check: the
Triton codes against cudnn+q's (share of codes that differ; FP8 rounding of the same fp16
values should make it ~0). Totals: sum over layers of count x time, and cudnn+q / triton.

  PYTHONPATH=. python3 benchmarks/dw_conv_bench.py [--batch 32] [--iters 50] [--list]

``--list`` prints the layer table only, ``--ptxas`` compiles the kernel for sm_90 and prints
ptxas' registers and spills per tile (neither needs a GPU).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def xception_dw_layers() -> list[tuple[tuple, int]]:
    """((channels, height, width, stride, relu, relu_in, raw_in), count) of timm_xception's
    depthwise convolutions that ``rewrite_channels_last(depthwise="triton")`` replaces
    (random weights; shapes only), in model order: ``relu`` a ReLU after it, ``relu_in``
    the block's ReLU before it moved into its load, ``raw_in`` its input an FP8 GEMM's raw
    bf16 output."""
    import numpy as np
    import torch

    from bundler.families import load_family
    from bundler.targets.torch_aoti.model import rewrite_channels_last, shape_pass
    from bundler.targets.torch_aoti.nhwc_modules import ChannelsLastView, DepthwiseE4m3
    from bundler.torch_model import build_torch_model

    family = load_family("timm_xception")
    model = build_torch_model(family, seed=0)
    fp8 = {n: (0.05, np.full(m.out_channels, 0.01, np.float32))
           for n, m in model.named_modules()
           if isinstance(m, torch.nn.Conv2d) and m.kernel_size == (1, 1)}
    body = rewrite_channels_last(model, torch.float16, fp8=fp8, emulate=True, depthwise="triton")
    layers = {n: v.layer for n, v in body.named_modules()
              if isinstance(v, ChannelsLastView) and isinstance(v.layer, DepthwiseE4m3)}
    inputs = shape_pass(model, list(layers), tuple(family.input.shape),
                        lambda ins, _out: tuple(ins[0].shape[1:]))
    shapes = Counter()
    for name, m in layers.items():
        c, h, w = inputs[name]
        shapes[(c, h, w, m.stride[0], m.relu, m.relu_in, m.raw_in)] += 1
    return list(shapes.items())


def shape_name(shape: tuple) -> str:
    c, h, w, stride, relu, relu_in, raw_in = shape
    return (f"{c}x{h}x{w} s{stride}" + (" relu-in" if relu_in else "")
            + (" bf16-in" if raw_in else "") + (" relu" if relu else ""))


def measure(shape: tuple, args) -> dict:
    """ms of each form of one layer shape, and the share of e4m3 codes that differ from
    cudnn+q's. The "before" forms include what the Triton form removes around the
    layer: the ReLU before it (and, for a GEMM's raw bf16 output, the convert) as the
    Inductor pass it is, fused with nothing else."""
    import torch
    import torch.nn.functional as F

    from bundler.targets.torch_aoti.kernels.dw_conv import dw_conv_e4m3
    from bundler.targets.torch_aoti.fp8_layers import padded, quantize
    from bundler.targets.torch_aoti.nhwc_modules import DepthwiseE4m3
    from fp8_conv_bench import graph_time

    c, h, w, stride, relu, relu_in, raw_in = shape
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(c, c, 3, stride, 1, groups=c)
    layer = DepthwiseE4m3(conv, 0.02, padded(c), relu=relu, relu_in=relu_in).cuda()
    if raw_in:        # the GEMM's [rows, npad] bf16 output, its first c columns
        rows = torch.randn(args.batch * h * w, padded(c), device="cuda").bfloat16()
        x_in = rows[:, :c].reshape(args.batch, h, w, c)
    else:
        x_in = torch.randn(args.batch, h, w, c, device="cuda").half()
    weight = conv.weight.detach().half().cuda().contiguous(memory_format=torch.channels_last)
    bias = conv.bias.detach().half().cuda()

    def before():     # the Inductor pass before cuDNN: convert and ReLU, as the model has
        y = x_in.half()
        return (F.relu(y) if relu_in else y).permute(0, 3, 1, 2)

    def cudnn(x):
        y = F.conv2d(x, weight, bias, stride, 1, groups=c)
        return F.relu(y) if relu else y

    def to_rows(y):
        y = y.permute(0, 2, 3, 1)
        return quantize(F.pad(y, (0, layer.cpad - c)), layer.act_scale)

    x16 = before().contiguous(memory_format=torch.channels_last)
    compiled = torch.compile(lambda: to_rows(cudnn(before())), dynamic=False)
    row = {}
    with torch.no_grad():
        row["cudnn"], _ = graph_time(lambda: cudnn(x16), args.iters)
        row["cudnn+q"], ref = graph_time(compiled, args.iters)
        for cfg in tiles(args.tiles):
            key = "triton " + "x".join(map(str, cfg if cfg.rows else cfg[:3]))
            ms, got = graph_time(lambda cfg=cfg: dw_conv_e4m3(
                x_in, layer.weight_taps, layer.bias, layer.act_scale, layer.cpad, (3, 3),
                (stride, stride), (1, 1), relu=relu, relu_in=relu_in, config=cfg), args.iters)
            row[key] = ms
            row[key + " differ"] = float((got.view(torch.uint8) != ref.view(torch.uint8))
                                         .float().mean())
    torch._dynamo.reset()
    return row


def tiles(which: str) -> list:
    """--tiles: "all" (``DW_CONFIGS``, the pixel kernel's tiles), "rows" (``DW_ROW_CONFIGS``,
    the row-strip kernel's: ``block_p x block_c x warps x rows``; a stride-2 layer runs the
    pixel kernel with the same tile), "default" (the first of ``DW_CONFIGS``), or a
    comma-separated mix of these."""
    from bundler.targets.torch_aoti.kernels.dw_conv import DW_CONFIGS, DW_ROW_CONFIGS

    chosen: list = []
    for part in which.split(","):
        part = part.strip()
        chosen += {"all": list(DW_CONFIGS), "rows": list(DW_ROW_CONFIGS),
                   "default": [DW_CONFIGS[0]]}[part]
    return list(dict.fromkeys(chosen))


def launch_options(cfg) -> dict:
    from bundler.targets.torch_aoti.kernels.dw_conv import launch_options as options

    return options(cfg)


def ptxas_report(arch: int = 90) -> int:
    """--ptxas (no GPU needed): compile the kernel for sm_``arch`` for each tile of
    ``DW_CONFIGS``, fp16 and bf16 input, with and without the ReLUs, as the 728-channel
    layers (26 of the 39) call it, and print ptxas' registers, spill bytes, shared memory
    per program and how many of its global loads are 16 bytes wide (as ``fp8_conv_bench.py
    --ptxas`` does for the FP8 convolution): a kernel that does not build for the H200,
    spills, holds enough registers to halve the programs per SM, or loads its input in
    2-byte pieces (the first H200 run: 0.4x cuDNN on those layers) shows before any device
    time."""
    import tempfile

    from bundler.fp8 import E4M3_MAX
    from bundler.targets.torch_aoti.kernels import dw_conv
    from fp8_conv_bench import ptxas_resources

    channels, width = 728, 19
    # Triton's JIT marks an integer argument divisible by 16 only when it is: 728 is not,
    # nor are the pixel strides; the kernel learns 728's factor 8 from ALIGN.
    align = dw_conv.element_alignment(channels, channels * width * width, channels * width,
                                      channels, 0, 0)
    failed = 0
    print(f"== ptxas -arch=sm_{arch}a, {channels} channels (ALIGN {align}): registers / spill "
          "bytes / shared memory per program / global loads 16 bytes wide of all")
    with tempfile.TemporaryDirectory() as tmp:
        for cfg in (*dw_conv.DW_CONFIGS, *dw_conv.DW_ROW_CONFIGS):
            kernel = dw_conv._dw_rows_kernel if cfg.rows else dw_conv._dw_conv_nhwc_e4m3_kernel
            names = kernel.arg_names
            for source in ("fp16", "bf16"):
                for relu, relu_in in ((False, False), (False, True), (True, False)):
                    if cfg.rows:
                        consts = dict(KW=3, PH=1, PW=1, DW=1, RELU=relu, RELU_IN=relu_in,
                                      QMAX=E4M3_MAX, ALIGN=align, BLOCK_W=cfg.block_p,
                                      BLOCK_C=cfg.block_c, ROWS=cfg.rows, UNROLL=False)
                    else:
                        consts = dict(KH=3, KW=3, SH=1, SW=1, PH=1, PW=1, DH=1, DW=1,
                                      RELU=relu, RELU_IN=relu_in, QMAX=E4M3_MAX, ALIGN=align,
                                      BLOCK_P=cfg.block_p, BLOCK_C=cfg.block_c)
                    pointers = {"x_ptr": f"*{source}", "w_ptr": "*fp32", "bias_ptr": "*fp32",
                                "q_ptr": "*fp8e4nv", "q_scale_ptr": "*fp32"}
                    sig = {n: "constexpr" if n in consts else pointers.get(n, "i32")
                           for n in names}
                    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
                             if n in pointers or n == "CPAD"}
                    label = (f"{'x'.join(map(str, cfg)):10s} {source} "
                             f"{'relu-in ' if relu_in else ''}{'relu' if relu else ''}")
                    try:
                        res = ptxas_resources(kernel, sig, consts, attrs,
                                              launch_options(cfg), arch, Path(tmp))
                        print(f"  {label:30s} regs {res.registers:>3s}  spill "
                              f"{res.spill_bytes:>4s} B  smem {res.shared_bytes:6d} B  "
                              f"wide loads {res.wide_loads}/"
                              f"{res.wide_loads + res.narrow_loads}", flush=True)
                    except Exception as e:  # noqa: BLE001 - reported, the others go on
                        failed += 1
                        print(f"  {label:30s} FAILED {type(e).__name__}: {str(e)[:200]}",
                              flush=True)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--list", action="store_true", help="print the layer table and stop")
    p.add_argument("--ptxas", action="store_true",
                   help="compile the kernel for sm_90 and print ptxas' resource use (no GPU)")
    p.add_argument("--tiles", default="all",
                   help="which tiles to time: all (the pixel kernel's), rows (the row-strip "
                        "kernel's), default, or a comma-separated mix (e.g. default,rows)")
    p.add_argument("--shapes", default="",
                   help="time only the layer shapes whose name contains this (e.g. 728x19x19: "
                        "26 of the 39 layers); the totals are then over those")
    p.add_argument("--budget-s", type=float, default=240.0,
                   help="no new layer starts after this many seconds")
    args = p.parse_args(argv)
    if args.ptxas:
        return ptxas_report()
    started = time.monotonic()
    layers = xception_dw_layers()
    print(f"timm_xception depthwise layers feeding an FP8 GEMM: "
          f"{sum(n for _, n in layers)} in {len(layers)} shapes", flush=True)
    for shape, count in layers:
        print(f"  {shape_name(shape):<22} x{count}", flush=True)
    if args.list:
        return 0
    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU here: --list is what runs without one", file=sys.stderr)
        return 2
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, batch {args.batch}",
          flush=True)
    totals: Counter = Counter()
    for shape, count in layers:
        if args.shapes not in shape_name(shape):
            continue
        if time.monotonic() - started > args.budget_s:
            print(f"  {shape_name(shape)}: skipped (budget)", flush=True)
            continue
        row = measure(shape, args)
        times = {k: v for k, v in row.items() if not k.endswith("differ")}
        for k, v in times.items():
            totals[k] += count * v
        tiles = {k: v for k, v in times.items() if k.startswith("triton")}
        if tiles:       # what a tile chosen per layer shape would give
            totals["triton, best tile per shape"] += count * min(tiles.values())
        print(f"  {shape_name(shape):<22} x{count}  " + "  ".join(
            f"{k} {v * 1000:.1f}us" for k, v in times.items()) + "  differ " + " ".join(
            f"{row[k]:.1e}" for k in row if k.endswith("differ")), flush=True)
    if totals:
        base = totals["cudnn+q"]
        print("totals over a forward pass (ms; cudnn+q / this):", flush=True)
        for k, v in totals.items():
            print(f"  {k:<22} {v:.3f}  {base / v:.3f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
