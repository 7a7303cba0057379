"""fp16 vs fp8 engine modules of timm_xception compiled by Inductor just in time, on a GPU.

The same modules that the torch-aoti target packages (bundler.targets.torch_aoti.
engine_model: BN-folded, NHWC, FP8 `_scaled_mm` on the recipe's 43 convolutions with the
bundle's calibration scales), compiled with `torch.compile` (Inductor, default mode, no
max-autotune, dynamic batch) instead of AOTInductor: the kernels Inductor generates are the
same code generator's, and a run needs no package build. Written when AOTInductor packages
could not be loaded on the H200 (its compiler linked libstdc++ statically; fixed by
bundler/targets/torch_aoti/toolchain.py); still the quickest engine-only comparison of variants.

Boundary: CUDA graph replay of the compiled module on a device-resident input, one
synchronization per replay, copies excluded; median of --iters replays (CUDA events).
Quality: top-1 agreement and max |logit diff| vs the fp32 eager model (TF32 off) on
--eval-count seeded synthetic inputs (the bundle's reference-input generator).

    python benchmarks/inductor_fp8_bench.py [--data .bench] [--variants fp16,fp8] [--eager]
        [--profile fp16,fp8] [--json PATH]

Variants: fp16 (the fp16 target's module: the NHWC rewrite in fp16, the fp8 module's
structure without FP8; ``fp16-nhwc`` is the same), fp16-nchw (``.half()`` of the model;
Inductor picks its layouts), fp8, fp8-depthwise, and the suffixes ``-fastacc``
(``use_fast_accum``), ``-tensorwise`` (per-channel scale and bias in a pointwise pass
after the GEMM instead of its epilogue; ``bundler.targets.torch_aoti.model.FP8_GEMMS``) and ``-rowcols`` (rowwise
with a row-scale column built per GEMM, as before ``bundler.targets.torch_aoti.model.OnesColumn``) of either fp8, and
``-padded`` of any NHWC one (channels padded to multiples of 16 through the model,
``rewrite_nhwc(pad_channels=True)``). Only the batch dimension is dynamic, as in the AOTI package
(``dynamic=True`` would make H and W symbolic too: minutes of symbolic reasoning over the
depthwise taps' slices); batch 1 is a specialization of its own, as Dynamo makes it. ``--profile`` prints a per-kernel table
(torch.profiler, plain runs, no CUDA graph) at each batch size.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

FAMILY = "timm_xception"


def log(msg: str) -> None:
    print(msg, flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=".bench")
    p.add_argument("--variants", default="fp16,fp8")
    p.add_argument("--batch-sizes", default="32,1")
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--eval-count", type=int, default=64)
    p.add_argument("--eager", action="store_true", help="no torch.compile (a dry run)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--profile", default="", help="variants to profile per kernel")
    p.add_argument("--rows", type=int, default=25)
    p.add_argument("--json", help="append one JSON line per variant to this file")
    args = p.parse_args()

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bundler.calibration.data import synthetic_calibration_set
    from bundler.families import load_family
    from bundler.make import REFERENCE_SEED
    from bundler.torch_model import build_torch_model

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch._dynamo.config.cache_size_limit = 64
    dev = torch.device(args.device)
    data = Path(args.data)
    meta = json.loads((data / "bench.json").read_text())
    family = load_family(FAMILY)
    model = build_torch_model(family, seed=meta["seed"])
    if dev.type == "cuda":
        log(f"host: {torch.cuda.get_device_name()} cc {torch.cuda.get_device_capability()}, "
            f"torch {torch.__version__}, CUDA {torch.version.cuda}")
    evalset = synthetic_calibration_set(family.input.shape, args.eval_count, seed=REFERENCE_SEED)
    inputs = np.concatenate([b for b, _l, _k in evalset.iter_batches(args.eval_count)])
    x_eval = torch.from_numpy(inputs).to(dev)
    with torch.no_grad():
        ref = model.to(dev).eval()(x_eval).float()
    model = model.cpu()
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    results = {}
    for variant in args.variants.split(","):
        torch._dynamo.reset()   # each variant compiles from scratch; none falls back to eager
        try:
            results[variant] = measure(variant, model, family, data, x_eval, ref, sizes, args)
        except Exception as exc:  # one variant's failure must not lose the others' figures
            log(f"[{variant}] FAILED: {type(exc).__name__}: {str(exc)[:800]}")
            continue
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps({"variant": variant, **results[variant]}, sort_keys=True) + "\n")
    base = {n: min(r["ms"][n] for v, r in results.items() if v.startswith("fp16") and n in r["ms"])
            for n in sizes if any(v.startswith("fp16") for v in results)}
    if base:
        log("\nvariant              batch   ms      best fp16/this  top-1 agree  max |diff|")
        for v, r in results.items():
            for n, ms in r["ms"].items():
                log(f"{v:<20} {n:>5} {ms:8.3f}   {base[n] / ms:8.3f}x   {r['agree']:10.4f}  "
                    f"{r['diff']:.3g}")


def measure(variant: str, model, family, data: Path, x_eval, ref, sizes: list[int], args) -> dict:
    """Compile one variant, check it against the fp32 model, time it at each batch size."""
    import torch

    from aoti_bench import fp8_modules, kernel_table
    from bundler.targets.torch_aoti import engine_model

    dev = x_eval.device
    t0 = time.monotonic()
    precision = "fp8" if variant.startswith("fp8") else "fp16"
    base = variant
    for suffix in ("-padded", "-tensorwise", "-fastacc", "-rowcols"):
        base = base.replace(suffix, "")
    fp8 = fp8_modules(model, data, base) if precision == "fp8" else None
    shared_ones = "-rowcols" not in variant   # else: a row-scale column per GEMM
    module, _pad = engine_model(model, precision, fp8, nhwc=False if variant == "fp16-nchw" else None,
                                fast_accum="-fastacc" in variant,
                                fp8_gemm="tensorwise" if "-tensorwise" in variant else "rowwise",
                                pad_channels="-padded" in variant,
                                input_shape=tuple(family.input.shape) if shared_ones else None,
                                max_batch=max(sizes + [32]) if shared_ones else None)
    module = module.to(dev).eval()
    run = module if args.eager else torch.compile(module)

    def batch_dynamic(t):
        if not args.eager:
            torch._dynamo.mark_dynamic(t, 0)
        return t

    with torch.no_grad():
        out = torch.cat([run(batch_dynamic(x_eval[i:i + 32].clone()))
                         for i in range(0, len(x_eval), 32)]).float()
    compile_s = time.monotonic() - t0
    agree = float((out.argmax(1) == ref.argmax(1)).float().mean())
    diff = float((out - ref).abs().max())
    log(f"[{variant}] compiled + eval in {compile_s:.0f} s: top-1 agreement "
        f"{agree:.4f}, max |diff| {diff:.4g} (|logit| max {float(ref.abs().max()):.3g})")
    timings, kernels = {}, {}
    for n in sizes:
        x = torch.randn(n, *family.input.shape, device=dev)
        with torch.no_grad():
            for _ in range(3):
                run(x)
            if dev.type == "cuda":
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    run(x)
                start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                times = []
                for i in range(args.iters + 10):
                    start.record()
                    graph.replay()
                    end.record()
                    end.synchronize()
                    if i >= 10:
                        times.append(start.elapsed_time(end))
            else:
                times = []
                for _ in range(3):
                    t = time.perf_counter()
                    run(x)
                    times.append((time.perf_counter() - t) * 1e3)
        timings[n] = statistics.median(times)
        log(f"[{variant}] batch {n}: {timings[n]:.3f} ms per replay")
        if dev.type == "cuda" and variant in args.profile.split(","):
            with torch.no_grad():
                kernels[n] = kernel_table(lambda: run(x), f"{variant}, batch {n}", args.rows)
    return {"agree": agree, "diff": diff, "ms": timings, "compile_eval_s": compile_s,
            "kernels": kernels}


if __name__ == "__main__":
    main()
