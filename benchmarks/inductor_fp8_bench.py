"""fp16 vs fp8 engine modules of a family, compiled by Inductor just in time, side by side.

The modules the torch-aoti target packages (``bundler.targets.torch_aoti.engine_model``,
with the family's layout rule and defaults, as ``build_engine`` makes them), compiled with
``torch.compile`` (Inductor, default mode, no max-autotune) instead of AOTInductor: the
same code generator's kernels, and no package build. One process, so every ratio is
measured side by side; results print as they come.

    PYTHONPATH=. python benchmarks/inductor_fp8_bench.py --family timm_vit_base \\
        [--variants fp16,fp8,...] [--batch-sizes 32,1] [--profile fp16,fp8|all]
        [--budget-s 330] [--json PATH] [--eager --device cpu]   (the dry run)

Weights and scales: ``--data DIR`` (timm_xception only: the bundles' weights seed and
calibration prepared by ``benchmarks/aoti_bench.py prepare``) or, by default, random weights
(``--seed``) with the family's FP8 layers selected and calibrated ("max", on
``--calib-count`` synthetic images, make's default data) from the torch model itself
(``benchmarks/torch_fp8_recipe.py``: the same layers and the same scale rules as
``bundle make``, no ONNX export).

Variants: a base and suffixes.
  fp16         the family's fp16 engine (family.json torch_aoti: the NHWC rewrite, the model
               in channels_last memory, or the model as it is for "as_is" families)
  fp16-nhwc    fp16, NHWC rewrite;  fp16-nchw: ``.half()`` of the model as it is;
               fp16-cl: the model in fp16 and channels_last memory
  fp8          the fp8 engine with the family's recipe; an fp8 variant of the family by
               its name (fp8-depthwise, fp8-pointwise) with that variant's recipe
suffixes of an fp8 base (``fp8_layers.FP8_GEMMS``):
  (without a GEMM suffix: the family's ``torch_aoti.fp8_gemm``, with its fast accumulation)
  -fastacc     use_fast_accum=True (FP8 accumulation without periodic fp32 promotion)
  -fp16out     GEMM mode "rowwise-fp16": fp16 bias and fp16 output in the epilogue, no
               bf16 -> fp16 pass (timm_xception's and timm_vit_base's own)
  -bf16out     GEMM mode "rowwise": bf16 output, then a pass to fp16 (the default of a
               family that names none)
  -tensorwise  GEMM mode "tensorwise": per-channel scale and bias in a pass after it
  -dequant     GEMM mode "dequantized": the same FP8 operands dequantized, fp16 GEMM (the
               ONNX graph's arithmetic; isolates the FP8 GEMMs' gain from the quantize cost)
  -rowcols     rowwise with a row-scale column built per GEMM (no shared ones column)
  -sbtriton    NHWC families: at a static batch <= 8 (--static), the FP8 1x1 convolutions on
               the Triton implicit-GEMM kernel with small tiles instead of _scaled_mm
               (``fp8_layers.Fp8Pointwise(small_batch_kernel="triton")``)
  -sbdequant   at a static batch <= 8 (--static), the FP8 1x1 convolutions (Linear layers
               of "as_is" families) as their FP8 operands dequantized through fp16 GEMMs
               (``small_batch_kernel="dequantized"``: timm_xception's batch-1 graph)
  -cl          image families: the channels_last form (the model in channels_last memory,
               its FP8 layers on the NHWC view of their input: ``model.rewrite_channels_last``,
               family.json ``torch_aoti.fp8_layout: channels_last``); -nhwc: the NHWC rewrite
  -dwslices    the channels_last form with depthwise convolutions as shifted slices
               (``DepthwiseNHWC``, the quantize after them fused) instead of cuDNN's
  -dwtriton    the channels_last form with each depthwise convolution that feeds an FP8
               GEMM as one Triton kernel writing the GEMM's e4m3 rows (``DepthwiseE4m3``,
               ``kernels/dw_conv.py``: convolution, bias, ReLU, quantize) instead of
               cuDNN's kernel and a quantize pass; -dwcudnn: cuDNN's kernel and the quantize
               pass; -dwskip: -dwtriton and the 1x1 layers of the family's
               ``torch_aoti.fp8_triton_pointwise`` on the Triton GEMM, skip adds in its
               epilogue (``SkipAddBlock``). Without one of these, the family's ``torch_aoti.fp8_depthwise``
               (timm_xception: triton since 2026-12-02; the older logs' -cl was cuDNN's)
  -tfused      fp8_conv "triton-fused": image families, the channels_last model with fused
               ResNet bottlenecks; "as_is" families, the fused MLPs (fc1 + GELU + fc2's
               quantize on the Triton kernel: ``fused_mlp.FusedMlp``)
  -unpadded    NHWC families: channel counts not carried padded to 16 (-padded: carried,
               the fp8 default since 2026-11-29; the older logs' plain "fp8" was unpadded)
suffix of any variant (fp16 too):
  -patchconv   "as_is" families: the patch embedding as the model's convolution (cuDNN), as
               before 2026-12-05, instead of the one GEMM over the patches the target now
               builds (``nhwc_modules.PatchGemm``): the change measured in one process
Default: fp16,fp8,fp8-fp16out-fastacc,fp8-fp16out,fp8-fastacc,fp8-dequant.

Boundary: fp32 NCHW input on the device, logits out; CUDA graph replay of the compiled
module, median of --iters replays (CUDA events), copies excluded. The batch dimension is
marked dynamic, as in the AOTI package (batch 1 still a specialization of its own, as
Dynamo makes it), or, with --static, every batch size is a compile of its own (as the
torch.compile peer). Quality: top-1 agreement and max
|logit diff| vs the fp32 eager model (TF32 off) on --eval-count synthetic inputs (the
bundle's reference-input generator) at the largest batch size.

--profile: per-kernel table of plain runs (no CUDA graph) at each batch size, grouped into
FP8 GEMM, fp16 GEMM, attention, layernorm, activation, quantize/convert, other, with how
many norm/activation kernels carry the fused quantize (``benchmarks/kernel_profile.py``).
Before the variants, a probe says which ``torch._scaled_mm`` forms this torch/GPU runs
(rowwise with bf16 or fp16 out, fast accumulation).

--budget-s: no variant starts when the time spent plus the slowest variant so far (60 s
before the first) would pass it; skipped variants are listed. ViT-B on an H200: about
30-60 s per variant (two compiles). --eager: no torch.compile (a dry run; with
--device cpu it runs on any host whose torch._scaled_mm CPU kernel takes rowwise scales:
torch >= 2.14; on older ones the probe says "refused" and the rowwise variants fail).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bundler.targets.torch_aoti.settings import settings_of  # noqa: E402

DEFAULT_VARIANTS = "fp16,fp8,fp8-fp16out-fastacc,fp8-fp16out,fp8-fastacc,fp8-dequant"
#: suffix -> (field of ``Variant``, value)
SUFFIXES = {"-fastacc": ("fast_accum", True), "-fp16out": ("gemm", "rowwise-fp16"),
            "-bf16out": ("gemm", "rowwise"),
            "-tensorwise": ("gemm", "tensorwise"), "-dequant": ("gemm", "dequantized"),
            "-rowcols": ("shared_ones", False), "-unpadded": ("padded", False),
            "-padded": ("padded", True), "-sbtriton": ("small_batch_pointwise", "triton"),
            "-sbdequant": ("small_batch_pointwise", "dequantized"),
            "-cl": ("form", "channels_last"), "-nhwc": ("form", "nhwc"),
            "-dwslices": ("depthwise", "slices"), "-dwtriton": ("depthwise", "triton"),
            "-dwcudnn": ("depthwise", "cudnn"), "-dwskip": ("depthwise", "triton-skip"),
            "-tfused": ("conv", "triton-fused")}
#: the suffix that keeps an "as_is" family's patch embedding a convolution
PATCH_CONV = "-patchconv"
STARTED = time.monotonic()


def log(msg: str) -> None:
    print(msg, flush=True)


@dataclass
class Variant:
    """One engine module to measure (``parse_variant``)."""

    name: str
    precision: str
    recipe: str | None = None        # the family's fp8 variant, "fp8-depthwise" (None: base)
    fp16_form: str = "family"        # "family", "nhwc", "nchw" or "cl"
    gemm: str | None = None          # None: the family's torch_aoti.fp8_gemm
    fast_accum: bool | None = None   # None: the family's torch_aoti.fp8_fast_accum
    shared_ones: bool = True
    padded: bool | None = None       # None: the target's default
    small_batch_pointwise: str = "gemm"
    form: str = "family"             # fp8: "family", "nhwc" or "channels_last"
    depthwise: str = "family"        # channels_last fp8: "cudnn", "slices", "triton" or the family's
    conv: str | None = None          # fp8_conv ("triton-fused"); None: the family's / env's
    patch_conv: bool = False         # the patch embedding as the convolution (-patchconv)


def parse_variant(name: str, family) -> Variant:
    """``name`` (module docstring) -> Variant; ValueError naming what is wrong."""
    if name.endswith(PATCH_CONV):
        if settings_of(family).layout != "as_is":
            raise ValueError(f"{name}: {PATCH_CONV} applies to layout as_is families (a "
                             "patch embedding); this one has no PatchGemm")
        variant = parse_variant(name.removesuffix(PATCH_CONV), family)
        variant.name, variant.patch_conv = name, True
        return variant
    if name in ("fp16", "fp16-nhwc", "fp16-nchw", "fp16-cl"):
        return Variant(name, "fp16", fp16_form=name.removeprefix("fp16-") if "-" in name else "family")
    base, fields = name, {}
    found = True
    while found:
        found = False
        for suffix, (field, value) in SUFFIXES.items():
            if base.endswith(suffix):
                if field in fields:
                    raise ValueError(f"{name}: two suffixes set {field}")
                base, fields[field], found = base.removesuffix(suffix), value, True
    if base == "fp16":
        raise ValueError(f"{name}: {', '.join(fields)} apply to fp8 variants only")
    if base == "fp8" or (base in family.variants
                         and family.variants[base].get("precision") == "fp8"):
        if fields.get("depthwise") in ("slices", "triton", "triton-skip"):
            if fields.get("form") == "nhwc":
                raise ValueError(f"{name}: -dw{fields['depthwise']} is a channels_last form")
            fields["form"] = "channels_last"
        return Variant(name, "fp8", recipe=None if base == "fp8" else base, **fields)
    known = ", ".join(sorted(family.variants)) or "none"
    raise ValueError(f"{name}: not fp16, fp16-nhwc, fp16-nchw, fp8 or an fp8 variant of the "
                     f"family ({known}), with suffixes {', '.join(SUFFIXES)}")


def engine_module(variant: Variant, model, family, fp8: dict | None, max_batch: int):
    """The engine module as ``build_engine`` would compile it for ``variant``."""
    from bundler.targets.torch_aoti.build import (default_fp8_conv, default_nhwc,
                                                  default_pad_channels, depthwise_form,
                                                  engine_model, fp8_gemm_options)

    layout = settings_of(family).layout
    nhwc, channels_last = None, False
    if variant.precision == "fp16":
        if variant.fp16_form == "nhwc":
            nhwc = True
        elif variant.fp16_form == "nchw":
            nhwc = False
        elif variant.fp16_form == "cl" or settings_of(family).fp16_layout == "channels_last":
            nhwc, channels_last = False, True
    elif layout != "as_is":
        form = settings_of(family).fp8_layout if variant.form == "family" else variant.form
        if form == "channels_last":
            nhwc, channels_last = False, True
    nhwc = default_nhwc(variant.precision, False if channels_last else nhwc, layout)
    pad = default_pad_channels(variant.precision, variant.padded) if nhwc else False
    shape = tuple(family.input.shape)
    ext = family.extension()
    gemm, fast_accum = fp8_gemm_options(family, variant.gemm, variant.fast_accum)
    module, _padding = engine_model(
        model, variant.precision, fp8, nhwc=nhwc, fast_accum=fast_accum,
        fp8_gemm=gemm, pad_channels=pad,
        input_shape=shape if variant.shared_ones else None,
        max_batch=max_batch if variant.shared_ones else None, layout=layout,
        fp8_conv=(variant.conv or default_fp8_conv(None, settings_of(family).fp8_conv)
                  if variant.precision == "fp8" else "im2col"),
        hook=getattr(ext, "nhwc_module", None), channels_last=channels_last and not nhwc,
        small_batch_pointwise=variant.small_batch_pointwise,
        depthwise=(depthwise_form(family, variant.precision, variant.recipe)
                   if variant.depthwise == "family" else variant.depthwise),
        triton_pointwise=settings_of(family).fp8_triton_pointwise)
    return patch_convolutions(module) if variant.patch_conv else module


def patch_convolutions(module):
    """``module`` with each ``PatchGemm`` back as the convolution it replaced (same
    weights and dtype): the engine model before 2026-12-05, for -patchconv."""
    from torch import nn

    from bundler.targets.torch_aoti.nhwc_modules import PatchGemm

    for name, gemm in [(n, m) for n, m in module.named_modules() if isinstance(m, PatchGemm)]:
        cin = gemm.weight.shape[1] // (gemm.patch[0] * gemm.patch[1])
        conv = nn.Conv2d(cin, gemm.cout, gemm.patch, stride=gemm.patch,
                         bias=gemm.bias is not None).to(gemm.weight.dtype)
        conv.weight.data = gemm.weight.reshape(gemm.cout, cin, *gemm.patch).clone()
        if gemm.bias is not None:
            conv.bias.data = gemm.bias.clone()
        module.set_submodule(name, conv.requires_grad_(False))
    return module


def probe_scaled_mm(device) -> dict[str, str]:
    """Which rowwise ``torch._scaled_mm`` forms run here: "ok" or the error's first line."""
    import torch

    a = torch.randn(64, 64, device=device).to(torch.float8_e4m3fn)
    b = torch.randn(32, 64, device=device).to(torch.float8_e4m3fn).t()
    sa, sb = torch.ones(64, 1, device=device), torch.ones(1, 32, device=device)
    found = {}
    for out, fast in ((torch.bfloat16, False), (torch.float16, False), (torch.bfloat16, True),
                      (torch.float16, True)):
        key = f"rowwise {str(out).removeprefix('torch.')} out{', fast accum' if fast else ''}"
        try:
            y = torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=out,
                                 bias=torch.zeros(32, dtype=out, device=device),
                                 use_fast_accum=fast)
            ref = a.float() @ b.float()
            err = float((y.float() - ref).abs().max() / ref.abs().max())
            found[key] = f"ok (relative max diff {err:.1e})"
        except Exception as exc:  # noqa: BLE001 - the probe reports whatever refuses
            found[key] = f"refused: {str(exc).splitlines()[0][:160]}"
    return found


def fp8_scales(variant: Variant, model, family, args, device, cache: dict) -> dict:
    """Module path -> (activation scale, weight scales) of the variant's recipe (cached)."""
    if variant.recipe in cache:
        return cache[variant.recipe]
    if args.data:
        from aoti_bench import fp8_modules

        scales = fp8_modules(model, Path(args.data), variant.recipe or "fp8")
    else:
        from bundler.calibration.data import synthetic_calibration_set
        from bundler.make import SYNTHETIC_CALIBRATION_SEED
        from torch_fp8_recipe import max_scales, select_modules

        paths = select_modules(model, family, variant.recipe)
        data = synthetic_calibration_set(family.input.shape, args.calib_count,
                                         seed=SYNTHETIC_CALIBRATION_SEED)
        t0 = time.monotonic()
        scales = max_scales(model.to(device), paths,
                            (b for b, _l, _k in data.iter_batches(args.calib_batch)), device)
        model.cpu()
        log(f"[calibration] {family.name} {variant.recipe or 'base'} recipe: {len(paths)} "
            f"layers, max calibration on {args.calib_count} synthetic images in "
            f"{time.monotonic() - t0:.1f} s")
    cache[variant.recipe] = scales
    return scales


def time_run(run, x, args, device) -> float:
    """Median ms of one inference: CUDA graph replays on a GPU, wall clock on the CPU."""
    import torch

    if device.type == "cuda":
        from fp8_conv_bench import graph_time

        with torch.no_grad():   # as compiled: grad mode is a guard (another compile)
            ms, _out = graph_time(lambda: run(x), args.iters)
        return ms
    times = []
    for _ in range(max(1, args.iters)):
        t = time.perf_counter()
        with torch.no_grad():
            run(x)
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def measure(variant: Variant, model, family, scales: dict | None, x_eval, ref,
            sizes: list[int], args, results: dict) -> dict:
    """Compile one variant, check it against the fp32 model, time (and profile) it at each
    batch size, printing as it goes."""
    import torch

    from kernel_profile import kernel_table

    from torch._dynamo.utils import counters

    dev = x_eval.device
    t0 = time.monotonic()
    graphs_before = counters["stats"]["unique_graphs"]
    # the shared ones column sized for the family's largest batch, as in the package (sized
    # for the largest measured batch, a dynamic batch would be specialized to it)
    rows_for = max(sizes + [family.input.batch.max])
    module = engine_module(variant, model, family, scales, rows_for).to(dev).eval()
    run = module if args.eager else torch.compile(module, dynamic=False if args.static else None)
    gen = torch.Generator().manual_seed(1)
    out: dict = {"ms": {}, "compile_s": {}, "kernels": {}}
    base = results.get("fp16", {}).get("ms", {})
    for n in sorted(sizes, reverse=True):
        x = torch.randn(n, *family.input.shape, generator=gen).to(dev)
        if not (args.static or args.eager):
            torch._dynamo.mark_dynamic(x, 0)
        started = time.monotonic()
        with torch.no_grad():
            run(x)
            if dev.type == "cuda":
                torch.cuda.synchronize()
        out["compile_s"][n] = time.monotonic() - started
        if n == max(sizes):
            with torch.no_grad():
                got = torch.cat([run(x_eval[i:i + n].clone()).float()
                                 for i in range(0, len(x_eval) - n + 1, n)])
            agree = float((got.argmax(1) == ref[:len(got)].argmax(1)).float().mean())
            out["agree"], out["diff"] = agree, float((got - ref[:len(got)]).abs().max())
            log(f"[{variant.name}] vs fp32 on {len(got)} inputs: top-1 agreement {agree:.4f}, "
                f"max |diff| {out['diff']:.4g} (|logit| max {float(ref.abs().max()):.3g})")
        ms = time_run(run, x, args, dev)
        out["ms"][n] = ms
        ratio = f", fp16/this {base[n] / ms:.3f}x" if n in base and variant.name != "fp16" else ""
        log(f"[{variant.name}] batch {n}: {ms:.3f} ms (first call {out['compile_s'][n]:.1f} s)"
            f"{ratio}")
        if variant.name in args.profile or "all" in args.profile:
            with torch.no_grad():
                out["kernels"][n] = kernel_table(lambda: run(x), f"{variant.name}, batch {n}",
                                                 args.rows, log=log, device=dev.type)
    out["seconds"] = time.monotonic() - t0
    out["graphs"] = counters["stats"]["unique_graphs"] - graphs_before
    log(f"[{variant.name}] {out['seconds']:.0f} s, {out['graphs']} graph(s) compiled "
        f"(expected {len(sizes) if args.static else min(2, len(sizes))}; more: a recompile)"
        if not args.eager else f"[{variant.name}] {out['seconds']:.0f} s")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--family", default="timm_xception")
    p.add_argument("--data", help="timm_xception: weights seed and bundle calibration from "
                                  "benchmarks/aoti_bench.py prepare (default: synthetic)")
    p.add_argument("--seed", type=int, default=0, help="random weights seed (without --data)")
    p.add_argument("--variants", default=DEFAULT_VARIANTS)
    p.add_argument("--batch-sizes", default="32,1")
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--eval-count", type=int, default=64)
    p.add_argument("--calib-count", type=int, default=32)
    p.add_argument("--calib-batch", type=int, default=8)
    p.add_argument("--eager", action="store_true", help="no torch.compile (a dry run)")
    p.add_argument("--static", action="store_true",
                   help="a compile per batch size (default: the batch dimension dynamic)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--profile", default="", help="variants to profile per kernel, or all")
    p.add_argument("--rows", type=int, default=20, help="top kernels printed per profile")
    p.add_argument("--budget-s", type=float, default=330.0)
    p.add_argument("--json", help="append one JSON line per variant to this file")
    args = p.parse_args(argv)
    args.profile = [v for v in args.profile.split(",") if v]

    import numpy as np
    import torch

    from bundler.calibration.data import synthetic_calibration_set
    from bundler.families import load_family
    from bundler.make import REFERENCE_SEED
    from bundler.torch_model import build_torch_model

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    for knob in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 64)
    dev = torch.device(args.device)
    family = load_family(args.family)
    variants = []
    for name in [v for v in args.variants.split(",") if v]:
        try:
            variants.append(parse_variant(name, family))
        except ValueError as exc:
            log(f"error: {exc}")
            return 2
    seed = args.seed
    if args.data:
        seed = json.loads((Path(args.data) / "bench.json").read_text())["seed"]
    model = build_torch_model(family, seed=seed).eval()
    if dev.type == "cuda":
        log(f"host: {torch.cuda.get_device_name()} cc {torch.cuda.get_device_capability()}, "
            f"torch {torch.__version__}, CUDA {torch.version.cuda}")
    else:
        log(f"host: CPU, torch {torch.__version__}")
    log(f"family {family.name} ({'bundle scales from ' + args.data if args.data else f'random weights seed {seed}, synthetic calibration'}); "
        f"variants {', '.join(v.name for v in variants)}; batch sizes {args.batch_sizes}; "
        f"{'eager' if args.eager else 'torch.compile ' + ('static shapes' if args.static else 'dynamic batch')}")
    for form, verdict in probe_scaled_mm(dev).items():
        log(f"[probe] torch._scaled_mm {form}: {verdict}")
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    count = max(max(sizes), args.eval_count // max(sizes) * max(sizes))
    evalset = synthetic_calibration_set(family.input.shape, count, seed=REFERENCE_SEED)
    inputs = np.concatenate([b for b, _l, _k in evalset.iter_batches(count)])
    x_eval = torch.from_numpy(np.ascontiguousarray(inputs)).to(dev)   # NCHW strides, as timed
    with torch.no_grad():
        ref = model.to(dev)(x_eval).float()
    model = model.cpu()
    results: dict[str, dict] = {}
    skipped, cache, took = [], {}, []
    for variant in variants:
        spent, slowest = time.monotonic() - STARTED, max(took, default=60.0)
        if spent + slowest > args.budget_s:
            skipped.append(variant.name)
            log(f"[{variant.name}] skipped: {spent:.0f} s spent, the slowest variant took "
                f"{slowest:.0f} s, budget {args.budget_s:.0f} s")
            continue
        torch._dynamo.reset()     # each variant compiles from scratch
        try:
            scales = (fp8_scales(variant, model, family, args, dev, cache)
                      if variant.precision == "fp8" else None)
            results[variant.name] = measure(variant, model, family, scales, x_eval, ref, sizes,
                                            args, results)
        except Exception as exc:  # noqa: BLE001 - one variant's failure keeps the others'
            log(f"[{variant.name}] FAILED: {type(exc).__name__}: {str(exc)[:800]}")
            log(traceback.format_exc(limit=4))
            continue
        finally:
            if dev.type == "cuda":
                torch.cuda.empty_cache()
        took.append(results[variant.name]["seconds"])
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps({"family": family.name, "variant": variant.name,
                                    **results[variant.name]}, sort_keys=True, default=str) + "\n")
    summary(results, sizes, skipped)
    return 0 if results else 1


def summary(results: dict, sizes: list[int], skipped: list[str]) -> None:
    base = results.get("fp16", {}).get("ms", {})
    log("\nvariant                    batch       ms   fp16/this   top-1 agree   max |diff|")
    for n in sorted(sizes, reverse=True):
        for name, r in results.items():
            if n in r["ms"]:
                ratio = f"{base[n] / r['ms'][n]:8.3f}x" if n in base else "       -"
                log(f"{name:<26} {n:>5} {r['ms'][n]:8.3f}   {ratio}   {r.get('agree', float('nan')):10.4f}"
                    f"   {r.get('diff', float('nan')):.3g}")
    if skipped:
        log(f"skipped (budget): {', '.join(skipped)}")
    log(f"total {time.monotonic() - STARTED:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
