"""Issue 18, timm_resnet50: which fused FP8 convolutions gain from a split reduction at batch
32, and by how much. One GPU call, ~2 minutes, no bundles.

Why: at batch 32 ResNet-50's 14x14 and 7x7 layers run at 4.5-6x their byte/FLOP floor on
the H200 (docs/measurements/h200-2026-12-07-a, desk analysis): 104-392 programs for 132
SMs, each walking 8-36 reduction steps alone, ViT's batch-1 problem. Split, more programs
walk fewer steps each; the kernels add the splits up themselves and the tile's last split
runs the fused epilogue (``kernels/fp8_split_k.sum_of_splits``).

For each fused layer of timm_resnet50 with each epilogue the fused model gives it
(``fp8_conv_bench.fused_layer_epilogues``), on the kernel and tiles the family's form gives
it at batch 32 (dense 1x1: the TMA kernel with ``MEASURED_TMA_TILES``; the rest: the
shipped kernel with ``MEASURED_TILES``), it times the launch with each number of splits
(20 calls a CUDA graph, as the model's layers run), says how far the outputs are from the
unsplit ones (the accumulation order changes, so the last bits may), and what
``conv_splits_for``'s rule picks. It ends with the count-weighted totals and a
``MEASURED_CONV_SPLITS`` table of the fastest splits per layer shape.

    python3 benchmarks/fp8_split_k_probe.py [--batch 32] [--splits 1,2,3,4] [--iters 50]
    TRITON_INTERPRET=1 python3 benchmarks/fp8_split_k_probe.py --interpret-check   # CPU: JSON
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

if str(Path(__file__).resolve().parents[1]) not in sys.path:   # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bundler.targets.torch_aoti.kernels.fp8_conv import (  # noqa: E402
    Fp8ConvConfig, config_for, fp8_conv_fused, tile_key)
from bundler.targets.torch_aoti.kernels.fp8_conv_tma import (  # noqa: E402
    fp8_conv_1x1_tma, tma_eligible, tma_tiles_for)
from bundler.targets.torch_aoti.kernels.fp8_split_k import conv_splits_for  # noqa: E402


def operands(n: int, hw: int, cin: int, cout: int, k: int, residual_hw: int | None,
             device: str, seed: int = 0):
    """One layer's operands as the fused model has them: e4m3 NHWC input, the e4m3 weight
    buffer ((kh, kw, C) order, rows and columns padded as built), per-channel scales, bias,
    an fp16 residual of the output's size (``residual_hw``; None: no residual)."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, hw, hw, cin, generator=g).clamp_min(0) * 40).to(torch.float8_e4m3fn)
    weight = torch.zeros(cout + 16, k * k * cin + 16).to(torch.float8_e4m3fn)
    weight[:cout, :k * k * cin] = (torch.randn(cout, k * k * cin, generator=g) * 100
                                   ).to(torch.float8_e4m3fn)
    scale = (torch.rand(cout, generator=g) + 0.5) * 2e-4 / k
    bias = torch.randn(cout, generator=g) * 0.3
    res = (torch.randn(n, residual_hw, residual_hw, cout, generator=g) * 2).half() \
        if residual_hw is not None else None
    to = (lambda t: t.to(device) if t is not None else None)
    return to(x), to(weight), to(scale), to(bias), to(res)


def launcher(cin: int, cout: int, k: int, stride: int, pad: int, epilogue: tuple,
             ops: tuple, out_scale, tma_tiles=None, config: Fp8ConvConfig | None = None):
    """A function of ``splits`` that launches the layer as ``fused.FusedConv`` does: the
    TMA kernel with ``tma_tiles`` where given, else the shipped kernel with ``config``."""
    relu, residual, out16, out8 = epilogue
    x, weight, scale, bias, res = ops
    kw = dict(residual=res if residual else None, relu=relu, out_f16=out16,
              out_scale=out_scale if out8 else None)
    if tma_tiles is not None:
        return lambda splits: fp8_conv_1x1_tma(x, weight, scale, bias, cout, tiles=tma_tiles,
                                               splits=splits, **kw)
    return lambda splits: fp8_conv_fused(x, weight, scale, bias, cout, (k, k),
                                         (stride, stride), (pad, pad), config=config,
                                         splits=splits, **kw)


def apart(a: tuple, b: tuple) -> dict:
    """How far two launches' (fp16, e4m3) outputs are: the largest fp16 difference over the
    largest value, and the largest distance in e4m3 codes."""
    from fp8_tma_probe import e4m3_steps

    out = {}
    if a[0] is not None:
        out["f16_rel"] = float((a[0].float() - b[0].float()).abs().max()
                               / b[0].float().abs().max().clamp_min(1e-6))
    if a[1] is not None:
        out["e4m3_steps"] = e4m3_steps(a[1], b[1])
    return out


def interpret_check() -> dict:
    """Under ``TRITON_INTERPRET=1`` on the CPU: both kernels with 2, 3 and more splits than
    steps against one split, on cases with edge tiles, each with a residual, ReLU and both
    outputs; and a 3x3 layer of each stride. The interpreter adds exactly, so the outputs
    must be equal bit for bit."""
    out_scale = torch.full((16,), 0.05)
    epilogue = (True, True, True, True)
    results = {}
    tma = launcher(256, 48, 1, 1, 0, epilogue, operands(2, 5, 256, 48, 1, 5, "cpu"),
                   out_scale, tma_tiles=(32, 32, 32, 4, 2))
    shipped_1x1 = launcher(256, 48, 1, 1, 0, epilogue, operands(2, 5, 256, 48, 1, 5, "cpu"),
                           out_scale, config=Fp8ConvConfig(16, 16, 32, 4, 2, 2))
    for stride in (1, 2):
        conv3 = launcher(64, 48, 3, stride, 1, (True, False, True, True),
                         operands(2, 6, 64, 48, 3, None, "cpu"), out_scale,
                         config=Fp8ConvConfig(16, 16, 32, 4, 2, 2))
        results[f"3x3 s{stride}"] = {s: bits_apart(conv3(s), conv3(1)) for s in (2, 4, 19)}
    results["1x1 tma"] = {s: bits_apart(tma(s), tma(1)) for s in (2, 3, 9)}
    results["1x1 shipped"] = {s: bits_apart(shipped_1x1(s), shipped_1x1(1)) for s in (2, 3, 9)}
    return results


def bits_apart(a: tuple, b: tuple) -> dict:
    """fp16 bits and e4m3 codes that differ between two launches' outputs, and how many."""
    return {"f16_bits": int((a[0].view(torch.int16) != b[0].view(torch.int16)).sum()),
            "e4m3_codes": int((a[1].view(torch.uint8) != b[1].view(torch.uint8)).sum()),
            "values": a[0].numel(), "f16_max": float(b[0].float().abs().max()),
            "e4m3_nonzero": int((b[1].float() != 0).sum())}


def main() -> int:
    from bench_args import positive_int, positive_ints

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=positive_int, default=32)
    p.add_argument("--splits", type=positive_ints, default=[1, 2, 3, 4],
                   help="split counts to time per layer (1, the unsplit launch, always)")
    p.add_argument("--iters", type=positive_int, default=50)
    p.add_argument("--per-graph", type=positive_int, default=20, metavar="N",
                   help="calls of a layer captured in one CUDA graph (its time / N)")
    p.add_argument("--min-steps", type=positive_int, default=2, metavar="N",
                   help="time a split only where each keeps at least N reduction steps")
    p.add_argument("--interpret-check", action="store_true",
                   help="CPU, TRITON_INTERPRET=1: split against unsplit outputs, print JSON")
    args = p.parse_args()
    from fp8_tma_probe import cpu_or_no_gpu

    early = cpu_or_no_gpu(args.interpret_check, interpret_check, "fp8_split_k_probe.py")
    if early is not None:
        return early
    import triton
    from fp8_conv_bench import fused_layer_epilogues, graph_time

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton "
          f"{triton.__version__}, batch {args.batch}", flush=True)
    counts = sorted(set(args.splits) | {1})
    out_scale = torch.full((16,), 0.05, device="cuda")
    totals = {"unsplit": 0.0, "best": 0.0, "rule": 0.0}
    table = {}
    for shape, by_epilogue in fused_layer_epilogues().items():
        cin, cout, hw, k, stride, pad = shape
        ho = hw // stride
        if tma_eligible(cin, cout, (k, k), (stride, stride), (pad, pad), (1, 1)):
            tma_tiles, config = tma_tiles_for(cin, cout), None
            bm, bn, bk = tma_tiles[:3]
            kind = f"tma {tma_tiles}"
        else:
            tma_tiles, config = None, config_for(cin, cout, (k, k), (stride, stride))
            bm, bn, bk = config[:3]
            kind = f"shipped {tuple(config)}"
        programs = triton.cdiv(args.batch * ho * ho, bm) * triton.cdiv(cout, bn)
        steps = k * k * triton.cdiv(cin, bk)
        rule = conv_splits_for(tile_key(cin, cout, (k, k), (stride, stride)), programs, steps,
                               table={})
        tried = [s for s in counts if s == 1 or steps // s >= args.min_steps]
        by_splits = dict.fromkeys(tried, 0.0)
        for epilogue, count in by_epilogue.items():
            ops = operands(args.batch, hw, cin, cout, k, ho if epilogue[1] else None, "cuda")
            launch = launcher(cin, cout, k, stride, pad, epilogue, ops, out_scale,
                              tma_tiles=tma_tiles, config=config)
            line = (f"{k}x{k} s{stride} {cin}->{cout} @{hw} {epilogue} x{count}, {programs} "
                    f"programs of {steps} steps, {kind}:")
            reference = launch(1)
            for s in tried:
                try:
                    ms, got = graph_time(lambda s=s: launch(s), args.iters,
                                         calls=args.per_graph)
                except Exception as e:   # noqa: BLE001 - report and go on to the next
                    line += f" | s{s} failed {type(e).__name__}: {str(e)[:120]}"
                    by_splits[s] = float("inf")
                    continue
                by_splits[s] += count * ms
                line += f" | s{s} {ms:.4f} ms"
                if s > 1:
                    line += f" {apart(got, reference)}"
            print(line, flush=True)
        best = min(by_splits, key=by_splits.get)
        print(f"   -> best s{best} ({by_splits[1] / by_splits[best]:.2f}x unsplit), rule "
              f"s{rule}", flush=True)
        totals["unsplit"] += by_splits[1]
        totals["best"] += by_splits[best]
        totals["rule"] += by_splits.get(rule, by_splits[1])
        if best > 1:
            table[(cin, cout, k, k, stride, stride)] = (best, shape, by_splits[1],
                                                        by_splits[best])
    print(f"== fused layers at batch {args.batch}, count-weighted: unsplit "
          f"{totals['unsplit']:.4f} ms, best splits {totals['best']:.4f} ms "
          f"({totals['unsplit'] - totals['best']:.4f} less), the rule's "
          f"{totals['rule']:.4f} ms")
    print("MEASURED_CONV_SPLITS: dict[tuple[int, int, int, int, int, int], int] = {")
    for key, (best, shape, ms1, msb) in table.items():
        print(f"    {key}: {best},  # @{shape[2]}: {msb:.4f} ms, unsplit {ms1:.4f}")
    print("}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
