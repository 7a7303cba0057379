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

``--split-k S,...`` (default 2,3,4; 0 for none): the same FP8 operands with the reduction
split S ways. Why: at 197 rows a 64-row tile leaves proj and fc2 (768 outputs) 48 programs
on the H200's 132 SMs, each walking the whole reduction (fc2: 3,072 deep) alone; fc2 was
the slowest shape in either precision (h200-2026-12-06-k). Each split writes fp32 partial
sums ([S, rows, out]); a second kernel adds them and applies the scale and bias (fp16 out).
Timed both ways: the two kernels ("split-k"), and the first alone ("split-k gemm only"),
the cost if a model's next kernel (Inductor's residual add / LayerNorm / GELU, which reads
the output anyway) did the sum.

    TRITON_INTERPRET=1 python benchmarks/vit_gemm_small_probe.py --interpret-check
checks on the CPU that the split form gives the fused kernel's fp16 output (JSON).

    PYTHONPATH=. python benchmarks/vit_gemm_small_probe.py [--batch-sizes 1,2]
        [--per-graph 20] [--iters 50] [--budget-s 150] [--split-k 2,3,4] [--json PATH]
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

#: Tile sets (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) tried with each split count: the
#: Linear rule's two (``linear_small_batch_config``) and a 32-row one (more programs).
SPLIT_TILES = ((64, 64, 128, 4, 3), (64, 64, 256, 4, 3), (32, 64, 128, 4, 3))

STARTED = time.monotonic()
_REDUCE_KERNEL = None


def reduce_kernel():
    """The probe's second kernel (the sum of the splits, scale, bias, fp16 out), made on
    first use: triton is imported only where it runs (a GPU, or the CPU under
    ``TRITON_INTERPRET=1``). The package leaves this step to the graph
    (``Fp8Linear.split_k_gemm``); timed here as the cost of a kernel of its own."""
    global _REDUCE_KERNEL
    if _REDUCE_KERNEL is not None:
        return _REDUCE_KERNEL
    import triton
    import triton.language as tl

    @triton.jit
    def reduce_splits(ws_ptr, scale_ptr, bias_ptr, out_ptr, MN, COUT, SPLITS: tl.constexpr,
                      BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        ok = offs < MN
        acc = tl.load(ws_ptr + offs, mask=ok, other=0.0)
        for s in tl.static_range(1, SPLITS):
            acc += tl.load(ws_ptr + s * MN + offs, mask=ok, other=0.0)
        n = offs % COUT
        y = acc * tl.load(scale_ptr + n, mask=ok, other=0.0) + tl.load(bias_ptr + n, mask=ok,
                                                                        other=0.0)
        tl.store(out_ptr + offs, y.to(tl.float16), mask=ok)

    _REDUCE_KERNEL = reduce_splits
    return _REDUCE_KERNEL


def fp8_linear_split_k(q, weight, scale, bias, cout: int, splits: int, tiles: tuple,
                       reduce: bool = True):
    """e4m3 rows ``q`` [rows, C] through the Linear (``weight``: e4m3 [>= cout, >= C],
    ``scale``/``bias``: fp32 per output) with the reduction split ``splits`` ways (fewer if
    C has fewer ``BLOCK_K`` tiles), the package's kernel (``kernels/fp8_split_k.py``):
    (fp16 [rows, cout] or None without ``reduce``, the fp32 partial sums [S, rows, cout])."""
    import torch
    import triton

    from bundler.targets.torch_aoti.kernels.fp8_split_k import SplitKConfig, fp8_rows_partials

    ws = fp8_rows_partials(q, weight, cout, SplitKConfig(splits, *tiles[:5]))
    if not reduce:
        return None, ws
    rows = q.shape[0]
    out = torch.empty((rows, cout), dtype=torch.float16, device=q.device)
    block = 1024
    reduce_kernel()[(triton.cdiv(rows * cout, block),)](ws, scale, bias, out, rows * cout, cout,
                                                        SPLITS=ws.shape[0], BLOCK=block)
    return out, ws


def interpret_check() -> dict:
    """Under ``TRITON_INTERPRET=1`` on the CPU: the split form against the fused kernel
    (``fp8_conv_fused`` as a 1x1 convolution over the rows, the model's batch-1 path) on
    rows and outputs that leave edge tiles, a reduction that does and does not fill the
    k tiles, 1 to 4 splits. The fp32 sums are added in another order, so the fp16 outputs
    may differ by a rounding: reported as the largest difference over the largest value."""
    import torch

    from bundler.targets.torch_aoti.kernels.fp8_conv import Fp8ConvConfig, fp8_conv_fused

    results = {}
    for rows, c, cout in ((37, 96, 40), (20, 80, 24)):
        g = torch.Generator().manual_seed(rows)
        q = (torch.randn(rows, c, generator=g) * 40).to(torch.float8_e4m3fn)
        weight = torch.zeros(cout + 8, c + 16).to(torch.float8_e4m3fn)
        weight[:cout, :c] = (torch.randn(cout, c, generator=g) * 100).to(torch.float8_e4m3fn)
        scale = (torch.rand(cout, generator=g) + 0.5) * 2e-4
        bias = torch.randn(cout, generator=g) * 0.3
        ref, _ = fp8_conv_fused(q.reshape(rows, 1, 1, c), weight, scale, bias, cout, (1, 1),
                                (1, 1), (0, 0), config=Fp8ConvConfig(16, 16, 32, 4, 2, 1))
        ref = ref.reshape(rows, cout).float()
        exact = (q.float() @ weight[:cout, :c].float().T) * scale + bias
        for splits in (1, 2, 3, 4):
            y, ws = fp8_linear_split_k(q, weight, scale, bias, cout, splits, (16, 16, 32, 4, 2))
            results[f"{rows}x{c}->{cout}:split{splits}"] = {
                "splits_made": ws.shape[0],
                "max_diff_over_max": float((y.float() - ref).abs().max() / ref.abs().max()),
                "partials_vs_exact": float((ws.sum(0) * scale + bias - exact).abs().max()
                                           / exact.abs().max())}
    return results


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
    p.add_argument("--split-k", type=lambda v: [] if v == "0" else positive_ints(v),
                   default=[2, 3, 4], metavar="S,...",
                   help="split counts of the reduction to time (default 2,3,4; 0: none)")
    p.add_argument("--interpret-check", action="store_true",
                   help="CPU, TRITON_INTERPRET=1: the split form against the fused kernel, "
                        "JSON out")
    p.add_argument("--json")
    args = p.parse_args(argv)
    if args.interpret_check:
        print(json.dumps(interpret_check()))
        return 0

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
            for splits in args.split_k:
                for tiles in SPLIT_TILES:
                    if time.monotonic() - STARTED > args.budget_s:
                        break
                    tag = f"{splits}:" + ",".join(map(str, tiles))
                    try:
                        ms, (y, ws) = timed(lambda splits=splits, tiles=tiles: fp8_linear_split_k(
                            q, lin.weight_fp8, scale, bias, cout, splits, tiles))
                        gemm_ms, _ = timed(lambda splits=splits, tiles=tiles: fp8_linear_split_k(
                            q, lin.weight_fp8, scale, bias, cout, splits, tiles, reduce=False))
                    except Exception as e:
                        log(f"  split-k {tag}: {type(e).__name__}: {str(e)[:120]}")
                        continue
                    err = float((y.float() - ref.float()).abs().max() / ref.float().abs().max())
                    row[f"split-k {tag}"], row[f"split-k gemm only {tag}"] = ms, gemm_ms
                    log(f"  split-k {tag} (made {ws.shape[0]}): {ms:.4f} ms with the "
                        f"reduction, {gemm_ms:.4f} without (fp16/this {row['fp16'] / ms:.3f}x "
                        f"/ {row['fp16'] / gemm_ms:.3f}x, rel err {err:.1e})")
            per_batch[name] = row

        print(f"\nbatch {batch}: a forward's GEMMs ({BLOCKS} blocks x one of each), ms")
        print("| shape | fp16 | _scaled_mm | best Triton | its tiles | best split-k "
              "(splits:tiles) | its GEMM alone |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        totals = {"fp16": 0.0, "scaled_mm": 0.0, "triton": 0.0, "split_k": 0.0,
                  "split_k_gemm_only": 0.0}

        def best_of(row: dict, prefix: str) -> tuple:
            """(key suffix, ms) of the fastest entry named ``prefix`` + tiles, or (None, inf)."""
            found = {k[len(prefix):]: v for k, v in row.items() if k.startswith(prefix)
                     and k[len(prefix):][:1].isdigit()}
            best = min(found, key=found.get) if found else None
            return best, found.get(best, float("inf"))

        def cell(ms: float) -> str:
            return f"{ms:.4f}" if ms != float("inf") else "-"

        for name, row in per_batch.items():
            tiles, tri = best_of(row, "triton ")
            split, split_ms = best_of(row, "split-k ")
            split_gemm = row.get(f"split-k gemm only {split}", float("inf"))
            direct = min(row["scaled_mm"], tri)
            totals["fp16"] += BLOCKS * row["fp16"]
            totals["scaled_mm"] += BLOCKS * row["scaled_mm"]
            totals["triton"] += BLOCKS * direct
            totals["split_k"] += BLOCKS * min(direct, split_ms)
            totals["split_k_gemm_only"] += BLOCKS * min(direct, split_gemm)
            print(f"| {name} | {row['fp16']:.4f} | {row['scaled_mm']:.4f} | {cell(tri)} | "
                  f"{tiles or '-'} | {cell(split_ms)} ({split or '-'}) | {cell(split_gemm)} |")
        print(f"| sum x{BLOCKS} | {totals['fp16']:.3f} | {totals['scaled_mm']:.3f} | "
              f"{totals['triton']:.3f} (best of both) | | {totals['split_k']:.3f} (best of "
              f"all) | {totals['split_k_gemm_only']:.3f} |")
        print(f"fp16 / FP8 GEMM time: _scaled_mm {totals['fp16'] / totals['scaled_mm']:.3f}x, "
              f"best of _scaled_mm and Triton {totals['fp16'] / totals['triton']:.3f}x, with "
              f"split-k {totals['fp16'] / totals['split_k']:.3f}x (its sum left to the next "
              f"kernel {totals['fp16'] / totals['split_k_gemm_only']:.3f}x)\n")
        per_batch["totals"] = totals
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
