"""ViT-B's MLP on one GPU: the fused FP8 MLP against the shipped FP8 form and fp16, per tile
config and accumulation mode (issue 18: timm_vit_base fp8 >= 1.4x fp16 at batch 32).

Why: the GELU pass between fc1 and fc2 was 16% of the fp8 engine's time on the H200
(families/timm_vit_base/README.md). ``fused_mlp.FusedMlp`` puts fc1, its GELU and fc2's
input quantize in one Triton kernel (``kernels/fp8_conv.py`` as a 1x1 convolution over the
tokens); whether that pays depends on how close the Triton GEMM comes to cuBLASLt's, which
this measures first, then the whole MLP.

Shapes: 768 -> 3072 -> 768, rows = 197 x batch (``--batch-sizes``, default 32,1); random
weights, per-channel weight scales and per-tensor activation scales from amax / 448.

  gemm       fc1's GEMM alone on e4m3 input: ``torch._scaled_mm`` rowwise, fp16 bias and
             out (the shipped ``rowwise-fp16``) vs the Triton kernel (fp16 out, no GELU)
             per tile config: the kernel's GEMM speed, the fusion left out
  mlp        fp16: F.linear + GELU + F.linear; fp8: ``Fp8Linear`` fc1 -> GELU ->
             ``Fp8Linear`` fc2 (Inductor fuses the GELU and fc2's quantize into one pass:
             the shipped form); fused: ``FusedMlp`` per tile config, ``--imprecise`` (0:
             Triton's default on sm_90, FP8 accumulation over the whole reduction; n:
             partial sums promoted to fp32 every n elements) and ``--gelu`` form; each
             torch.compile-d (default mode, static shapes)

Timing: CUDA graph replay, median of ``--iters`` (``fp8_conv_bench.graph_time``). Errors:
the fused MLP's output against the fp8 form's (max |diff| / max |ref|) and its e4m3 hidden
rows against the fp8 form's quantize of GELU(fc1) (share of codes that differ, largest
distance in e4m3 steps).

    PYTHONPATH=. python benchmarks/fp8_mlp_bench.py [--batch-sizes 32,1] [--iters 100]
        [--configs all|default] [--imprecise 0,32] [--json PATH]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fp8_conv_bench import graph_time  # noqa: E402

DIM, HIDDEN, TOKENS = 768, 3072, 197
#: fc1 tile candidates (block_m, block_n, block_k, warps, stages, group_m) besides the rule's.
CONFIGS = (
    (128, 128, 128, 8, 3, 8), (128, 256, 64, 8, 3, 8), (128, 256, 128, 8, 3, 8),
    (256, 128, 64, 8, 3, 8), (256, 128, 128, 8, 3, 8), (128, 128, 64, 4, 4, 8),
    (64, 128, 128, 4, 4, 8), (128, 64, 128, 4, 4, 8), (64, 64, 128, 4, 4, 8),
)
#: fc1 epilogues timed apart: (GELU, fp16 out, e4m3 out).
EPILOGUES = ((None, True, False), ("erf", True, False), ("erfc", True, False),
             (None, False, True), ("erf", False, True), ("erfc", False, True))
STARTED = time.monotonic()


def log(msg: str) -> None:
    print(f"[{time.monotonic() - STARTED:6.1f}s] {msg}", flush=True)


def e4m3_steps(a, b) -> tuple[float, int]:
    """(share of e4m3 codes that differ, largest distance in steps) of two e4m3 tensors."""
    import torch

    ia, ib = a.view(torch.uint8).int(), b.view(torch.uint8).int()
    sa, sb = ia >> 7, ib >> 7
    ma, mb = ia & 0x7F, ib & 0x7F
    dist = (sa == sb) * (ma - mb).abs() + (sa != sb) * (ma + mb)
    return float((dist > 0).float().mean()), int(dist.max())


def build(seed: int = 0):
    """fc1, fc2 (fp32 Linear), a token batch source and their FP8 scales."""
    import numpy as np
    import torch
    from torch import nn

    torch.manual_seed(seed)
    fc1, fc2 = nn.Linear(DIM, HIDDEN), nn.Linear(HIDDEN, DIM)
    for fc in (fc1, fc2):
        nn.init.normal_(fc.weight, std=0.02)
        nn.init.normal_(fc.bias, std=0.02)
    x = torch.randn(4, TOKENS, DIM)
    with torch.no_grad():
        h = nn.functional.gelu(fc1(x))

    def per_channel(fc):
        return (fc.weight.detach().abs().amax(1) / 448).numpy().astype(np.float32)

    scales1 = (float(x.abs().max()) / 448, per_channel(fc1))
    scales2 = (float(h.abs().max()) / 448, per_channel(fc2))
    return fc1, fc2, scales1, scales2


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch-sizes", default="32,1")
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--configs", default="all", choices=("all", "default"))
    p.add_argument("--imprecise", default="0,32")
    p.add_argument("--gelu", default="erfc,erf", help="fc1 epilogue GELU forms (GELU_FORMS)")
    p.add_argument("--no-mlp", action="store_true", help="the GEMM and epilogue tables only")
    p.add_argument("--budget-s", type=float, default=240,
                   help="no new fused variant starts after this many seconds")
    p.add_argument("--json")
    args = p.parse_args(argv)

    import torch
    import torch.nn.functional as F

    from bundler.targets.torch_aoti.fused_mlp import MLP_TILES, FusedMlp
    from bundler.targets.torch_aoti.kernels.fp8_conv import (Fp8ConvConfig, config_for,
                                                             fp8_conv, fp8_conv_fused)
    from bundler.targets.torch_aoti.fp8_layers import Fp8Linear, OnesColumn, quantize

    if not torch.cuda.is_available():
        print("fp8_mlp_bench.py needs a CUDA GPU of compute capability >= 8.9 (none visible)",
              file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    log(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    fc1, fc2, s1, s2 = build()
    rule = tuple(config_for(DIM, HIDDEN, (1, 1), (1, 1)))
    configs = [rule] + [c for c in CONFIGS if c != rule] if args.configs == "all" else [rule]
    imprecise = [int(v) for v in args.imprecise.split(",")]
    results: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                     "rule": list(rule), "batches": {}}
    for batch in [int(b) for b in args.batch_sizes.split(",")]:
        rows = batch * TOKENS
        ones = OnesColumn(rows)
        opts = dict(gemm="rowwise-fp16", ones=ones)
        l1 = Fp8Linear(fc1, *s1, torch.float16, **opts).to(dev)
        l2 = Fp8Linear(fc2, *s2, torch.float16, **opts).to(dev)
        x = (torch.randn(batch, TOKENS, DIM, device=dev) * 0.5).half()
        out: dict = {"rows": rows, "gemm": {}, "mlp": {}}
        results["batches"][batch] = out

        # fc1's GEMM alone, on the same e4m3 rows
        q = quantize(x, l1.act_scale).reshape(-1, DIM)
        ms, ref16 = graph_time(lambda: l1.matmul(q), args.iters)
        out["gemm"]["scaled_mm"] = ms
        log(f"batch {batch}: fc1 GEMM _scaled_mm rowwise-fp16 {ms:.4f} ms")
        scale = (l1.weight_scale_row[0] * l1.act_scale).contiguous()
        bias = l1.bias_out.float().contiguous()
        for cfg in configs:
            name = ",".join(map(str, cfg))
            try:
                ms, y = graph_time(lambda cfg=cfg: fp8_conv(
                    q.reshape(-1, 1, 1, DIM), l1.weight_fp8, scale, bias, HIDDEN, (1, 1),
                    (1, 1), (0, 0), config=Fp8ConvConfig(*cfg)), args.iters)
            except Exception as e:   # a config the GPU cannot hold (shared memory)
                log(f"batch {batch}: triton {name}: {type(e).__name__}: {str(e)[:160]}")
                continue
            err = float((y.reshape(rows, HIDDEN).float() - ref16.float()).abs().max()
                        / ref16.float().abs().max())
            out["gemm"][f"triton {name}"] = ms
            log(f"batch {batch}: fc1 GEMM triton {name}: {ms:.4f} ms "
                f"(_scaled_mm/this {out['gemm']['scaled_mm'] / ms:.3f}x, rel err {err:.2e})")

        # fc1's epilogues apart (the fused op, the rule's tiles and the best GEMM's):
        # what GELU and the e4m3 output each add to the GEMM
        best = min((k for k in out["gemm"] if k.startswith("triton ")),
                   key=lambda k: out["gemm"][k], default=None)
        epi_configs = {rule} | ({tuple(int(v) for v in best.split()[1].split(","))}
                                if best else set())
        out_scale = torch.full((16,), float(s2[0]), device=dev)
        for cfg in sorted(epi_configs):
            for gelu, f16, f8 in EPILOGUES:
                name = (f"{','.join(map(str, cfg))} gelu-{gelu or 'none'} "
                        f"{'+'.join(o for o, on in (('f16', f16), ('e4m3', f8)) if on)}")
                ms, _ = graph_time(lambda cfg=cfg, gelu=gelu, f16=f16, f8=f8: fp8_conv_fused(
                    q.reshape(-1, 1, 1, DIM), l1.weight_fp8, scale, bias, HIDDEN, (1, 1),
                    (1, 1), (0, 0), gelu=gelu, out_f16=f16, out_scale=out_scale if f8 else None,
                    config=Fp8ConvConfig(*cfg)), args.iters)
                out.setdefault("epilogue", {})[name] = ms
                log(f"batch {batch}: fc1 epilogue {name}: {ms:.4f} ms")

        if args.no_mlp:
            continue
        # the whole MLP
        def fp16_mlp(t, w1=fc1.weight.half().to(dev), b1=fc1.bias.half().to(dev),
                     w2=fc2.weight.half().to(dev), b2=fc2.bias.half().to(dev)):
            return F.linear(F.gelu(F.linear(t, w1, b1)), w2, b2)

        def fp8_mlp(t):
            return l2(F.gelu(l1(t)))

        for name, fn in (("fp16", fp16_mlp), ("fp8", fp8_mlp)):
            compiled = torch.compile(fn, dynamic=False)
            ms, y = graph_time(lambda compiled=compiled: compiled(x), args.iters)
            out["mlp"][name] = ms
            if name == "fp8":
                ref_out = y.float()
                ref_hidden = quantize(F.gelu(l1(x)), l2.act_scale).reshape(rows, HIDDEN)
            log(f"batch {batch}: MLP {name} (torch.compile) {ms:.4f} ms")
        mlp_configs = list(dict.fromkeys([tuple(MLP_TILES.get((DIM, HIDDEN), rule)), rule]
                                         + (configs if args.configs == "all" else [])))
        for cfg, acc, gelu in itertools.product(mlp_configs, imprecise, args.gelu.split(",")):
            name = f"fused {','.join(map(str, cfg))} acc{acc} gelu-{gelu}"
            if time.monotonic() - STARTED > args.budget_s:
                log(f"batch {batch}: {name}: skipped (--budget-s)")
                continue
            fused = FusedMlp(fc1, fc2, s1, s2, torch.float16, imprecise_acc=acc,
                             tiles=cfg, gelu=gelu, **opts).to(dev)
            try:      # compiled as the others: the input quantize is one fused pass
                run = torch.compile(fused, dynamic=False)
                ms, y = graph_time(lambda run=run: run(x), args.iters)
            except Exception as e:
                log(f"batch {batch}: {name}: {type(e).__name__}: {str(e)[:160]}")
                continue
            share, steps = e4m3_steps(fused.hidden_e4m3(x), ref_hidden)
            err = float((y.float() - ref_out).abs().max() / ref_out.abs().max())
            out["mlp"][name] = {"ms": ms, "hidden_codes_differ": share,
                                "hidden_max_steps": steps, "out_rel_err": err}
            log(f"batch {batch}: MLP {name}: {ms:.4f} ms (fp8/this "
                f"{out['mlp']['fp8'] / ms:.3f}x, fp16/this {out['mlp']['fp16'] / ms:.3f}x; "
                f"hidden codes differing {share:.2e}, max {steps} step(s); "
                f"out rel err {err:.2e})")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
