"""What a torch-aoti bundle must record for ``bundle make --reuse`` and ``bundle study`` to
take it as this build's: the settings of the family and this build that change the
compiled package without changing the graph (``bundler.reuse`` checks the rest)."""

from __future__ import annotations

from bundler.targets.torch_aoti.build import (DEFAULT_COMPILE_OPTIONS, FP8_GEMM_DESCRIPTIONS,
                                              FUSED_FP8_CONVS,
                                              SMALL_BATCH_POINTWISE_DESCRIPTIONS,
                                              build_fp8_conv, default_pad_channels,
                                              depthwise_form,
                                              effective_small_batch_pointwise, engine_form,
                                              fp8_conv_named, fp8_conv_recorded,
                                              fp8_gemm_options, layout_description,
                                              model_code_digest,
                                              small_batch_form)
from bundler.targets.torch_aoti.settings import cudnn_benchmark_record, settings_of


def recorded_capability(details: dict) -> tuple[int, int] | None:
    """The compute capability a package records ("9.0"), or None (a CPU package)."""
    text = details.get("compute_capability")
    if not text:
        return None
    major, _, minor = str(text).partition(".")
    return int(major), int(minor or 0)


def reuse_checks(details: dict, family, req) -> dict[str, tuple[object, object]]:
    """``{what: (the bundle's, this build's)}``, in the order they are compared."""
    checks: dict[str, tuple[object, object]] = {
        "static-batch graph list": (details.get("static_batches", []),
                                    list(settings_of(family).static_batches_for(req.precision))),
        # a CPU package (target option device cpu) is no GPU package, and the other way round
        "device": (details.get("device"), req.target_options.get("device", "cuda")),
    }
    options = details.get("compile_options", {})
    # the code of the model rewrite and its kernels (an editable install between releases:
    # a bundle built before a kernel change was reused)
    checks["model code (rewrite and kernels)"] = (options.get("model_code"),
                                                   model_code_digest())
    # the Inductor options this build would pass (an older package timed its pointwise
    # block sizes while compiling: rebuilt)
    for key, value in DEFAULT_COMPILE_OPTIONS.items():
        checks[f"Inductor option {key}"] = (options.get("inductor", {}).get(key), value)
    # the family's torch_aoti.fp8_conv (or $TRT_BUNDLE_FP8_CONV) as this make would build
    # it: a bundle of another convolution form is rebuilt, not reused
    conv = (build_fp8_conv(None, settings_of(family).fp8_conv,
                           recorded_capability(details))
            if req.precision == "fp8" else "im2col")
    if req.precision == "fp8":
        # image families: the convolution form; tokens (layout as_is): whether the
        # MLPs are fused (fp8_conv triton-fused) or not
        layout = settings_of(family).layout
        checks["fp8 MLP form" if layout == "as_is" else "fp8 convolution form"] = (
            fp8_conv_named(layout, options.get("fp8_conv")),
            fp8_conv_named(layout, fp8_conv_recorded("fp8", layout, conv)))
        # the small-batch form of its FP8 GEMM layers (1x1 convolutions, Linear layers;
        # recorded only where a small static graph has it)
        want_pw = effective_small_batch_pointwise(
            settings_of(family).fp8_pointwise_small_batch, "fp8",
            settings_of(family).static_batches_for("fp8"), layout=layout, fp8_conv=conv)
        have_pw = options.get("fp8_pointwise_small_batch")
        pw_names = {text: name for name, text in SMALL_BATCH_POINTWISE_DESCRIPTIONS.items()}
        checks["fp8 small-batch GEMM form"] = (pw_names.get(have_pw, have_pw or "gemm"),
                                              want_pw)
        # how the FP8 GEMMs run (torch_aoti.fp8_gemm, fp8_fast_accum, or the build's
        # own target options): a bundle of the family's earlier rowwise bf16-out form
        # was reused after family.json moved to rowwise-fp16 (2026-12-04)
        gemm, fast = fp8_gemm_options(family, req.target_options.get("fp8_gemm"),
                                      req.target_options.get("fp8_fast_accum"))
        gemm_names = {text: name for name, text in FP8_GEMM_DESCRIPTIONS.items()}
        have_gemm = options.get("fp8_gemm")
        checks["fp8 GEMM form"] = (gemm_names.get(have_gemm, have_gemm), gemm)
        checks["fp8 fast accumulation"] = (options.get("fp8_fast_accum"), fast)
        # the fused stem (torch_aoti.fp8_fuse_stem, in a fused convolution form): a bundle
        # built before the family named it, or after it stopped, is rebuilt
        checks["fp8 stem fused"] = (options.get("fp8_stem") is not None,
                                    settings_of(family).fp8_fuse_stem
                                    and conv in FUSED_FP8_CONVS)
    # cuDNN's algorithms timed in the graphs' warm-ups (torch_aoti.cudnn_benchmark): read
    # by the runtime from the bundle, so a bundle that says otherwise is rebuilt
    timed = settings_of(family).cudnn_benchmark
    checks["cuDNN algorithms timed"] = (options.get("cudnn_benchmark", False),
                                        cudnn_benchmark_record(timed) if timed else False)
    # the model form (NHWC rewrite, channels_last, ...) the family's settings build now
    form = engine_form(family, req.precision, conv)
    checks["model form"] = (
        options.get("layout"),
        layout_description(req.precision, nhwc=form == "nhwc",
                           pad_channels=form == "nhwc"
                           and default_pad_channels(req.precision),
                           layout=settings_of(family).layout,
                           channels_last=form == "channels_last", fp8_conv=conv,
                           depthwise=depthwise_form(family, req.precision,
                                                    req.variant)))
    checks["small-batch graph form"] = (
        options.get("small_batch_layout"),
        small_batch_form(settings_of(family).small_batch_layout, req.precision,
                         settings_of(family).static_batches_for(req.precision),
                         channels_last=form == "channels_last",
                         layout=settings_of(family).layout, fp8_conv=conv))
    return checks
