"""ViT-B's four Linear shapes at batch 1 (and 2): can an FP8 GEMM beat fp16's there at all?
(issue 18: timm_vit_base fp8 >= 1.0x fp16 at batch 1; today 0.78-0.83x.)

Why: at batch 1 each Linear has 197 rows, and the family's FP8 GEMM (cuBLASLt through
``torch._scaled_mm``, rowwise scales, fp16 out) runs them slower than cuBLAS's fp16 GEMM;
the dequantized form (fp16 GEMMs on FP8 operands) reached 0.964x. timm_resnet50 reached
fp8 >= fp16 at batch 1 with the Triton kernel (``kernels/fp8_conv.py``) on small tiles in a
static batch-1 graph. This measures whether the same kernel, as a Linear over the tokens
(a 1x1 convolution, as ``fused_mlp`` uses it), gives ViT's shapes a faster FP8 GEMM than
fp16's, per tile set, before any model form is built on it.

Per shape and batch: fp16 ``F.linear`` with bias (cuBLAS), the dynamic graph's
``Fp8Linear.matmul`` on e4m3 rows (``rowwise-fp16``), and the Triton kernel as the
batch-1 graph launches it (the fused op, fp16 out, bias) per tile set: the project's
``SMALL_BATCH_CONFIGS`` and ``CANDIDATE_CONFIGS`` and ``linear_small_batch_config``'s. Timing: ``fp8_conv_bench.graph_time`` with ``--per-graph`` calls in each
CUDA graph (one call a replay hides everything under the replay's ~10 us). The last table
weighs each shape by its count in the model (12 blocks, one of each) and sums the best
Triton tile set's time per shape: the GEMM time of a whole batch-1 forward, fp16 against
FP8, with the quantizes left out (they sit in the LayerNorm / GELU kernels).

    PYTHONPATH=. python benchmarks/vit_gemm_small_probe.py [--batch-sizes 1,2]
        [--per-graph 20] [--iters 50] [--budget-s 150] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_args import positive_int, positive_ints  # noqa: E402
from fp8_conv_bench import graph_time  # noqa: E402

TOKENS, BLOCKS = 197, 12
#: (name, in, out) of ViT-B's Linear layers, one of each per block.
SHAPES = (("qkv", 768, 2304), ("proj", 768, 768), ("fc1", 768, 3072), ("fc2", 3072, 768))

STARTED = time.monotonic()


def log(msg: str) -> None:
    print(f"[{time.monotonic() - STARTED:6.1f}s] {msg}", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch-sizes", type=positive_ints, default=[1, 2])
    p.add_argument("--per-graph", type=positive_int, default=20,
                   help="calls of a GEMM captured in one CUDA graph (default 20)")
    p.add_argument("--iters", type=positive_int, default=50)
    p.add_argument("--budget-s", type=float, default=150,
                   help="no new tile set starts after this many seconds")
    p.add_argument("--json")
    args = p.parse_args(argv)

    import torch
    import torch.nn.functional as F
    from torch import nn

    from bundler.targets.torch_aoti.fp8_layers import Fp8Linear, OnesColumn, quantize
    from bundler.targets.torch_aoti.kernels.fp8_conv import (
        CANDIDATE_CONFIGS, SMALL_BATCH_CONFIGS, Fp8ConvConfig, fp8_conv_fused,
        linear_small_batch_config)

    # the project's small-batch and Hopper-sized candidates, and the Linear rule's own
    tile_sets = list(dict.fromkeys(
        tuple(c) for c in (*SMALL_BATCH_CONFIGS, *CANDIDATE_CONFIGS,
                           linear_small_batch_config(768), linear_small_batch_config(3072))))

    if not torch.cuda.is_available():
        print("vit_gemm_small_probe.py needs a CUDA GPU of compute capability >= 8.9 "
              "(none visible)", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    log(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, "
        f"{args.per_graph} calls a graph")
    torch.manual_seed(0)
    results: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                     "per_graph": args.per_graph, "batches": {}}

    def timed(fn):
        return graph_time(fn, args.iters, calls=args.per_graph)

    for batch in args.batch_sizes:
        rows = batch * TOKENS
        per_batch: dict = {}
        results["batches"][batch] = per_batch
        for name, cin, cout in SHAPES:
            fc = nn.Linear(cin, cout)
            nn.init.normal_(fc.weight, std=0.02)
            nn.init.normal_(fc.bias, std=0.02)
            x = (torch.randn(rows, cin, device=dev) * 0.5).half()
            act_scale = float(x.abs().max()) / 448
            w_scale = (fc.weight.detach().abs().amax(1) / 448).numpy()
            lin = Fp8Linear(fc, act_scale, w_scale, torch.float16, gemm="rowwise-fp16",
                            ones=OnesColumn(rows)).to(dev)
            w16, b16 = fc.weight.half().to(dev), fc.bias.half().to(dev)
            row: dict = {}
            row["fp16"], ref = timed(lambda: F.linear(x, w16, b16))
            q = quantize(x, lin.act_scale)
            row["scaled_mm"], y = timed(lambda: lin.matmul(q))
            err = float((y.float() - ref.float()).abs().max() / ref.float().abs().max())
            log(f"batch {batch} {name} {cin}->{cout}: fp16 {row['fp16']:.4f} ms, "
                f"_scaled_mm {row['scaled_mm']:.4f} ms (fp16/this "
                f"{row['fp16'] / row['scaled_mm']:.3f}x, rel err vs fp16 {err:.1e})")
            scale = (lin.weight_scale_row[0] * lin.act_scale).contiguous()
            bias = lin.bias_out.float().contiguous()
            for tiles in tile_sets:
                if time.monotonic() - STARTED > args.budget_s:
                    log(f"budget spent: tile set {tiles} and after not tried")
                    break
                key = "triton " + ",".join(map(str, tiles))
                try:
                    ms, (y, _) = timed(lambda tiles=tiles: fp8_conv_fused(
                        q.reshape(rows, 1, 1, cin), lin.weight_fp8, scale, bias, cout,
                        (1, 1), (1, 1), (0, 0), config=Fp8ConvConfig(*tiles)))
                except Exception as e:   # a tile set the GPU cannot hold
                    log(f"  {key}: {type(e).__name__}: {str(e)[:120]}")
                    continue
                err = float((y.reshape(rows, cout).float() - ref.float()).abs().max()
                            / ref.float().abs().max())
                row[key] = ms
                log(f"  {key}: {ms:.4f} ms (fp16/this {row['fp16'] / ms:.3f}x, "
                    f"rel err {err:.1e})")
            per_batch[name] = row

        print(f"\nbatch {batch}: a forward's GEMMs ({BLOCKS} blocks x one of each), ms")
        print("| shape | fp16 | _scaled_mm | best Triton | its tiles |")
        print("| --- | --- | --- | --- | --- |")
        totals = {"fp16": 0.0, "scaled_mm": 0.0, "triton": 0.0}
        for name, row in per_batch.items():
            tri = {k: v for k, v in row.items() if k.startswith("triton ")}
            best = min(tri, key=tri.get) if tri else None
            totals["fp16"] += BLOCKS * row["fp16"]
            totals["scaled_mm"] += BLOCKS * row["scaled_mm"]
            totals["triton"] += BLOCKS * min(row["scaled_mm"], tri.get(best, float("inf")))
            print(f"| {name} | {row['fp16']:.4f} | {row['scaled_mm']:.4f} | "
                  f"{tri[best]:.4f} | {best[7:]} |" if best else
                  f"| {name} | {row['fp16']:.4f} | {row['scaled_mm']:.4f} | - | - |")
        print(f"| sum x{BLOCKS} | {totals['fp16']:.3f} | {totals['scaled_mm']:.3f} | "
              f"{totals['triton']:.3f} (best of both) | |")
        print(f"fp16 / FP8 GEMM time: _scaled_mm {totals['fp16'] / totals['scaled_mm']:.3f}x, "
              f"best of _scaled_mm and Triton {totals['fp16'] / totals['triton']:.3f}x\n")
        per_batch["totals"] = totals
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
