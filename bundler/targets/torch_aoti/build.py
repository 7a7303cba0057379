"""The torch-aoti target: the family's torch model compiled by AOTInductor into a package.

Why this target exists: TensorRT cannot be installed on the GPU hosts this project can
use, PyTorch can; an AOTInductor package (``torch._inductor.aoti_compile_and_package``) is
a compiled, weights-included engine that loads without Python model code, so fp16 and
FP8 bundles run and are measured on a real GPU and are checked against the same
``reference.safetensors`` as every other engine.

What is compiled, per precision (the torch model is ``bundler.torch_model``'s BN-folded fp32
module; IO stays fp32, like the typed ONNX graphs):

* fp32: the model as it is (Inductor picks channels-last for cuDNN);
* fp16: ``bundler.targets.torch_aoti.model.rewrite_nhwc`` in fp16 (``default_nhwc``:
  1.69x faster than ``.half()`` of the NCHW model at batch 32 on an H200), or, where the
  family says so (family.json ``torch_aoti.fp16_layout: channels_last``), the model in
  fp16 and channels_last memory, as a ``torch.compile`` user runs it;
* fp8: the same NHWC rewrite, with exactly the layers of the bundle's graph (make's
  selection, handed over in the ``BuildContext``) as FP8 GEMMs (and, in the fp8-depthwise
  variant, the depthwise ones quantized-dequantized), with the activation and weight
  scales of the bundle's ``calibration.safetensors``; or (``torch_aoti.fp8_layout:
  channels_last``) the channels_last model with those layers on the NHWC view of their
  input (``model.rewrite_channels_last``); or (``torch_aoti.fp8_conv: triton-fused``) the
  channels_last model with its ResNet bottlenecks fused (``fused.rewrite_fused``).

Families whose layout rule is ``"as_is"`` (``family.json`` ``torch_aoti.layout``: a ViT's
tokens) skip the NHWC rewrite: the model in fp16, and for fp8 its selected Linear layers as
FP8 GEMMs (``model.rewrite_as_is``).

Exported with ``torch.export`` (batch dynamic over the family's range) and compiled with
the Inductor options in ``DEFAULT_COMPILE_OPTIONS`` (never max-autotune: on xception41 it
took over 9 minutes for a few percent; no timing of pointwise block sizes either, which a
shared GPU turns into slow picks). The package is a zip of generated C++/Triton code,
compiled kernels (cubins), the shared library and the weights as raw constant blobs; it is
loaded with torch's package loader (``runtime_py/engines/aoti_load.py``), which unpickles
nothing.

torch is imported inside the functions.
"""

from __future__ import annotations

import functools
import os
import platform
import tempfile
import time
import warnings
from pathlib import Path
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Callable

from bundler.targets.torch_aoti.settings import (TORCH_AOTI_FUSED_FP8_CONVS as FUSED_FP8_CONVS,
                                                 TORCH_AOTI_TMA_FP8_CONVS as TMA_FP8_CONVS,
                                                 TORCH_AOTI_BOX_TMA_FP8_CONVS,
                                                 TORCH_AOTI_SMALL_TMA_FP8_CONVS,
                                                 TORCH_AOTI_SMALL_BATCH_LAYOUTS,
                                                 TORCH_AOTI_TRITON_DEPTHWISE,
                                                 cudnn_benchmark_record, settings_of)
from bundler.targets import TargetBuild
from runtime_py.errors import BundleError, EngineUnavailableError, UsageError

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from bundler.build_context import BuildContext

BACKEND = "torch-aoti"
MEMBER = "engine.pt2"
#: Inductor options every package is compiled with (recorded in the manifest).
#: ``triton.autotune_pointwise`` off: Inductor otherwise times each pointwise kernel's
#: candidate block sizes while it compiles, and on a GPU that other work shares (parallel
#: builds, a serving process) it picks slow ones. On the H200 (docs/measurements/
#: h200-2026-12-04-b) timm_xception's fp16 package built beside three other builds ran
#: 4.37-4.44 ms at batch 32 against 4.23 built alone: one bias + ReLU kernel (27 launches)
#: took 0.31 ms instead of 0.18. With the option off the heuristic block sizes are taken
#: without timing: 4.18-4.25 ms (0.18 ms for that kernel), the same package whatever else
#: runs, and the fp8 package as fast as before (3.53 ms).
DEFAULT_COMPILE_OPTIONS: dict[str, Any] = {"max_autotune": False,
                                           "triton.autotune_pointwise": False}
#: Options this target refuses: they cost minutes of compile time for little (module doc).
REFUSED_COMPILE_OPTIONS = ("max_autotune", "max_autotune_gemm", "max_autotune_pointwise")
#: Compute capability of the first GPUs with FP8 tensor cores (Ada; Hopper is 9.0).
FP8_MIN_CC = (8, 9)
PRECISIONS = {"fp32": "float32", "fp16": "float16", "fp8": "float16"}
#: The environment variable that picks the fp8 k x k convolution kernel of a build when the
#: caller does not (``default_fp8_conv``): how ``bundle make`` on a GPU host selects it.
FP8_CONV_ENV = "TRT_BUNDLE_FP8_CONV"


def import_torch():
    try:
        import torch
    except ImportError:
        raise EngineUnavailableError(
            "the torch-aoti target compiles the model with PyTorch, which is not installed: "
            "pip install 'trt-bundle[export]' on a host with an NVIDIA GPU") from None
    return torch


def check_host(device: str = "cuda", precision: str | None = None, **_options: Any) -> None:
    """Raise EngineUnavailableError unless this host can compile the package (before any
    heavy work): torch importable, and for ``device="cuda"`` a visible CUDA GPU (of compute
    capability >= 8.9 for fp8)."""
    torch = import_torch()
    if device not in ("cuda", "cpu"):
        raise UsageError(f"torch-aoti device must be 'cuda' or 'cpu', not {device!r}")
    if device == "cpu":
        if precision not in (None, "fp32"):
            raise UsageError(f"torch-aoti packages for the CPU are fp32 only (asked: {precision})")
        return
    if not torch.cuda.is_available():
        raise EngineUnavailableError(
            f"the torch-aoti target compiles for a CUDA GPU, and torch {torch.__version__} "
            f"(CUDA {torch.version.cuda}) sees none on this host: build on a GPU host, or "
            "use --backend onnxruntime")
    cc = torch.cuda.get_device_capability()
    if precision == "fp8" and cc < FP8_MIN_CC:
        raise EngineUnavailableError(
            f"fp8 GEMMs need compute capability >= 8.9; {torch.cuda.get_device_name()} is "
            f"sm_{cc[0]}{cc[1]}")


# --- the model that is compiled ---------------------------------------------------------

def default_nhwc(precision: str, nhwc: bool | None = None, layout: str = "nhwc") -> bool:
    """Whether the engine model is the NHWC rewrite: fp8 always; fp16 by default, because
    on an H200 (torch 2.11, Inductor) the fp16 rewrite ran 1.69x faster than the NCHW
    model at batch 32 and 1.04x at batch 1 (families/timm_xception/README.md); fp32 keeps
    the model as it is unless asked (not measured)."""
    if layout == "as_is":           # the family's layout rule: tokens, not images
        return False
    return precision in ("fp8", "fp16") if nhwc is None else bool(nhwc)


def default_pad_channels(precision: str, pad_channels: bool | None = None) -> bool:
    """Whether channel counts are carried padded to FP8 GEMM alignment (728 as 736) through
    the model: fp8 by default, because on an H200 (torch 2.11, Inductor, run D in
    families/timm_xception/README.md) it removed the pad/slice kernels around the FP8 GEMMs
    and took batch 32 from 5.61 to 4.30 ms (1.27x the fp16 engine's 5.48 ms in the same
    run); fp16 and fp32 GEMMs need no padding, so they keep the model's channel counts."""
    return precision == "fp8" if pad_channels is None else bool(pad_channels)


def default_fp8_conv(fp8_conv: str | None = None, family_default: str = "im2col") -> str:
    """How fp8 builds run dense k x k convolutions (``fp8_layers.FP8_CONVS``): ``fp8_conv`` if
    given, else ``$TRT_BUNDLE_FP8_CONV`` (one build's override, e.g. im2col on a host
    without triton), else ``family_default`` (family.json ``torch_aoti.fp8_conv``), else
    "im2col". A family opts into a Triton kernel only once ``benchmarks/fp8_conv_bench.py``
    and ``bundle study`` have measured it against cuDNN's fp16 convolution on the GPU."""
    from bundler.targets.torch_aoti.fp8_layers import FP8_CONVS

    chosen = fp8_conv if fp8_conv is not None else (os.environ.get(FP8_CONV_ENV) or family_default)
    if chosen not in FP8_CONVS:
        source = ("fp8_conv" if fp8_conv is not None
                  else f"${FP8_CONV_ENV}" if os.environ.get(FP8_CONV_ENV)
                  else "the family's torch_aoti.fp8_conv")
        raise UsageError(f"{source} is {chosen!r}: choose one of {', '.join(FP8_CONVS)}")
    return chosen


#: The compute capability from which a GPU has TMA (Hopper), which the TMA forms need.
TMA_CAPABILITY = (9, 0)


def build_fp8_conv(fp8_conv: str | None, family_default: str,
                   capability: tuple[int, int] | None) -> str:
    """The FP8 convolution form a build on a GPU of ``capability`` makes (None: no GPU, as
    named): ``default_fp8_conv``, except that where the form is the family's (neither
    ``fp8_conv`` nor ``$TRT_BUNDLE_FP8_CONV`` names one) and it is a TMA form
    (``TMA_FP8_CONVS``) on a GPU without TMA, "triton-fused": the same layers and numerics
    on the shipped kernel.
    Why: the family's default must build on every FP8 GPU (an sm_89 L4 or L40S too); a
    form asked for by name is refused there instead (``engine_model``). One rule for the
    build and the reuse check (which passes the capability the bundle records)."""
    chosen = default_fp8_conv(fp8_conv, family_default)
    from_family = fp8_conv is None and not os.environ.get(FP8_CONV_ENV)
    if (from_family and chosen in TMA_FP8_CONVS and capability is not None
            and tuple(capability) < TMA_CAPABILITY):
        return "triton-fused"
    return chosen


def engine_model(torch_model: torch.nn.Module, precision: str,
                 fp8: dict[str, tuple[float, Any]] | None = None, *, nhwc: bool | None = None,
                 fast_accum: bool = False, fp8_gemm: str = "rowwise",
                 pad_channels: bool = False, input_shape: tuple[int, ...] | None = None,
                 max_batch: int | None = None, layout: str = "nhwc",
                 fp8_conv: str = "im2col", hook=None, channels_last: bool = False,
                 small_batch_pointwise: str = "gemm",
                 depthwise: str = "cudnn",
                 triton_pointwise: Mapping[tuple[int, int, str], tuple] | None = None,
                 fuse_stem: bool = False) -> tuple[torch.nn.Module, dict]:
    """The module to export (fp32 NCHW in, fp32 out) and its fp8 padding record.

    ``input_shape`` and ``max_batch`` (both or neither): rowwise FP8 GEMMs then share one
    column of ones sized for that batch (``rewrite.fp8_gemm_rows``) instead of building
    a row-scale column each, and the module refuses larger batches.

    ``fp8``: module path -> (activation scale, weight scales) (paths from
    ``rewrite.map_nodes_to_modules``); 1x1 ones become FP8 GEMMs, depthwise ones are
    quantized-dequantized. ``nhwc`` (default: ``default_nhwc``) selects the NHWC rewrite;
    ``fp8_gemm``: ``fp8_layers.FP8_GEMMS``; ``pad_channels``: ``rewrite.rewrite_nhwc``'s.
    ``layout``: the family's layout rule (``family.json`` ``torch_aoti.layout``): "nhwc"
    (images: the NHWC rewrite) or "as_is" (tokens: ``rewrite_as_is``, FP8 Linear layers);
    ``hook``: the family's ``nhwc_module`` (``rewrite_nhwc``); ``fp8_conv``: how dense k x k
    FP8 convolutions run (``fp8_layers.FP8_CONVS``; "triton-fused": no NHWC rewrite but
    ``fused.rewrite_fused``, the channels_last model with fused ResNet bottlenecks). ``channels_last`` (without ``nhwc``): the
    model as it is in channels_last memory format, the torch.compile user's form
    (family.json ``torch_aoti.fp16_layout``); for fp8, that model with its FP8 layers on
    the NHWC view of their input (``rewrite.rewrite_channels_last``, family.json
    ``torch_aoti.fp8_layout``; ``depthwise``: its ``CHANNELS_LAST_DEPTHWISE`` form;
    ``triton_pointwise``: the 1x1 layers its "triton-skip" form runs on the Triton GEMM,
    family.json ``torch_aoti.fp8_triton_pointwise``). ``fuse_stem``: with a fused
    ``fp8_conv``, a timm ResNet's stem hands the first block its e4m3 input from one kernel
    (``fused.rewrite_fused``; family.json ``torch_aoti.fp8_fuse_stem``).
    ``small_batch_pointwise``: how the FP8 1x1 convolutions (the Linear layers of an
    "as_is" family) run in a static-batch graph of a small batch
    (``fp8_layers.SMALL_BATCH_POINTWISE``).
    """
    torch = import_torch()
    from bundler.targets.torch_aoti import model as rewrite
    from bundler.targets.torch_aoti.fp8_layers import fp8_conv_kernel, padded
    from bundler.targets.torch_aoti.nhwc_modules import EngineModule

    if precision not in PRECISIONS:
        raise UsageError(f"torch-aoti builds {', '.join(PRECISIONS)}, not {precision!r}")
    dtype = getattr(torch, PRECISIONS[precision])
    if precision != "fp8" and fp8:
        raise UsageError(f"fp8 layers given for a {precision} build")
    if layout == "as_is":
        if nhwc or pad_channels:
            raise UsageError("this family keeps its layout (torch_aoti.layout \"as_is\"): "
                             "no NHWC rewrite, no channel padding")
        if precision == "fp8" and fp8_conv in TMA_FP8_CONVS:
            raise UsageError(f"fp8_conv {fp8_conv} puts ResNet bottlenecks' 1x1 "
                             "convolutions on the TMA kernel; this family (torch_aoti.layout "
                             "\"as_is\") has fused MLPs instead: name triton-fused")
        rows = None
        if fp8 and input_shape is not None and max_batch is not None:
            rows = rewrite.fp8_gemm_rows(torch_model, list(fp8), tuple(input_shape),
                                            int(max_batch))
        body = rewrite.rewrite_as_is(torch_model, dtype, fp8=fp8, fast_accum=fast_accum,
                                        fp8_gemm=fp8_gemm, fp8_rows=rows,
                                        small_batch_pointwise=small_batch_pointwise,
                                        fp8_conv=fp8_conv if precision == "fp8" else "im2col")
        return EngineModule(body, dtype, False), {}
    if layout != "nhwc":
        raise UsageError(f"torch_aoti.layout {layout!r}: choose nhwc or as_is")
    if precision == "fp8" and fp8_conv in FUSED_FP8_CONVS:
        if nhwc or pad_channels:
            raise UsageError(f"fp8_conv={fp8_conv} keeps the model in channels_last memory: "
                             "no NHWC rewrite, no channel padding")
        from bundler.targets.torch_aoti.fused import rewrite_fused

        fp8_conv_kernel(fp8_conv)            # refuses a missing triton by name
        if (fp8_conv in TMA_FP8_CONVS and torch.cuda.is_available()
                and torch.cuda.get_device_capability() < TMA_CAPABILITY):
            raise UsageError(f"fp8_conv {fp8_conv} needs TMA, which a GPU of compute "
                             f"capability 9.0 (Hopper) or newer has; this one is "
                             f"{torch.cuda.get_device_name()}: build with "
                             "TRT_BUNDLE_FP8_CONV=triton-fused")
        small_tma = None          # the small static graphs' TMA tiles, where the form has them
        if fp8_conv in TORCH_AOTI_SMALL_TMA_FP8_CONVS:
            from bundler.targets.torch_aoti.kernels.fp8_conv_tma import (
                MEASURED_TMA_TILES_BY_BATCH as small_tma)
        return EngineModule(rewrite_fused(torch_model, fp8 or {}, tma=fp8_conv in TMA_FP8_CONVS,
                                          tma_batch_tiles=small_tma,
                                          box_tma=fp8_conv in TORCH_AOTI_BOX_TMA_FP8_CONVS,
                                          fuse_stem=fuse_stem),
                            dtype, False, True), {}
    if channels_last and nhwc:
        raise UsageError("channels_last and the NHWC rewrite are two forms: ask for one")
    nhwc = default_nhwc(precision, False if channels_last else nhwc)
    if precision == "fp8" and not nhwc and not channels_last:
        raise UsageError("the fp8 torch-aoti model is the NHWC rewrite or the channels_last "
                         "form (family.json torch_aoti.fp8_layout), not the NCHW model")
    if precision != "fp8" and fp8:
        raise UsageError(f"fp8 layers given for a {precision} build")
    if pad_channels and not nhwc:
        raise UsageError("padded channels are a form of the NHWC rewrite; the NCHW model has none")
    padding: dict = {}
    if precision == "fp8" and channels_last:
        dense = dict(_dense(torch_model, fp8 or {}))      # FP8 GEMMs; the rest: depthwise
        rows = None
        if dense and input_shape is not None and max_batch is not None:
            rows = rewrite.fp8_gemm_rows(torch_model, list(dense), tuple(input_shape),
                                         int(max_batch))
        body = rewrite.rewrite_channels_last(
            torch_model, dtype, fp8=dense,
            fp8_depthwise={p: s for p, s in (fp8 or {}).items() if p not in dense},
            fast_accum=fast_accum, fp8_gemm=fp8_gemm, fp8_rows=rows, fp8_conv=fp8_conv,
            small_batch_pointwise=small_batch_pointwise, depthwise=depthwise,
            triton_pointwise=triton_pointwise)
        return EngineModule(body, dtype, False, True), padding
    if not nhwc:
        import copy

        body = copy.deepcopy(torch_model).to(dtype).eval()
        if channels_last:
            body = body.to(memory_format=torch.channels_last)
        return EngineModule(body, dtype, False, channels_last), padding
    modules = dict(torch_model.named_modules())
    pointwise, depthwise = {}, {}
    for path, scales in (fp8 or {}).items():
        conv = modules[path]
        if conv.groups > 1:
            depthwise[path] = scales
            continue
        pointwise[path] = scales
        if conv.kernel_size != (1, 1):
            continue                       # Fp8ConvNHWC reads its input unpadded
        kpad, npad = padded(conv.in_channels), padded(conv.out_channels)
        if (kpad, npad) != (conv.in_channels, conv.out_channels):
            padding[path] = {"in": [conv.in_channels, kpad], "out": [conv.out_channels, npad]}
    rows = None
    if pointwise and input_shape is not None and max_batch is not None:
        rows = rewrite.fp8_gemm_rows(torch_model, list(pointwise), tuple(input_shape),
                                        int(max_batch))
    body = rewrite.rewrite_nhwc(torch_model, dtype, fp8=pointwise, fp8_depthwise=depthwise,
                                   fast_accum=fast_accum, fp8_gemm=fp8_gemm,
                                   pad_channels=pad_channels, fp8_rows=rows,
                                   fp8_conv=fp8_conv, hook=hook,
                                   small_batch_pointwise=small_batch_pointwise)
    return EngineModule(body, dtype, True), padding


def _dense(torch_model, fp8: dict) -> list[tuple[str, Any]]:
    """The (path, scales) of ``fp8`` that are dense (not grouped) convolutions: the FP8
    GEMMs; the others are the fp8-depthwise variant's quantized-dequantized ones."""
    modules = dict(torch_model.named_modules())
    return [(p, s) for p, s in fp8.items()
            if p not in modules or getattr(modules[p], "groups", 1) == 1]


def compile_package(module: torch.nn.Module, input_shape: tuple[int, ...], batch: dict,
                    device: str, compile_options: dict, package_path: Path,
                    static_batches: Sequence[int] = (),
                    static_modules: Mapping[int, Any] | None = None) -> tuple[Path, str]:
    """torch.export (dynamic batch min..max) + AOTInductor -> (the package file, the C++
    toolchain it was linked with).

    ``static_batches``: sizes that also get a graph exported and compiled with that static
    batch, in the same package (``package_graphs``); the dynamic graph stays the package's
    default model, so a loader that knows nothing of them runs every size on it.
    ``static_modules``: size -> the module that size's graph is exported from (another
    form of the same model, e.g. the NHWC rewrite for batch 1), default ``module``.

    Linked against the shared libstdc++ whatever the host's compiler does by default, and
    checked for it (``bundler.targets.torch_aoti.toolchain``: a statically linked C++ runtime
    crashed every package's loader on the H200 image).
    """
    from bundler.targets.torch_aoti.fp8_layers import exporting_batch
    from bundler.targets.torch_aoti.toolchain import aoti_toolchain, check_package_libraries
    from runtime_py.engines.torch_aoti import DYNAMIC_MODEL, static_model_name

    torch = import_torch()
    lo, hi = int(batch["min"]), int(batch["max"])
    dtype = module_input_dtype(module)
    example = random_input(max(2, lo) if hi >= 2 else 1, input_shape, dtype, device)
    dynamic = ({0: torch.export.Dim("batch", min=lo, max=hi)},) if hi > lo else None
    module = module.to(device).eval()
    strict = export_strict(module, *(static_modules or {}).values())
    if strict:
        compile_options = {**compile_options, **TMA_COMPILE_OPTIONS}
    with torch.no_grad(), aoti_toolchain() as toolchain, warnings.catch_warnings(), \
            torch._dynamo.config.patch(fake_tensor_cache_enabled=FAKE_TENSOR_CACHE):
        # torch 2.11 copies its own pytree specs with a deprecated isinstance check and
        # warns once per graph on every build: not the user's to act on
        warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)",
                                category=FutureWarning)
        with exporting_batch(None if dynamic else example.shape[0]):
            program = torch.export.export(module, (example,), dynamic_shapes=dynamic,
                                          strict=strict)
        if not static_batches:
            path = torch._inductor.aoti_compile_and_package(
                program, package_path=str(package_path), inductor_configs=dict(compile_options))
        else:
            programs = {DYNAMIC_MODEL: program}
            for n in static_batches:
                own = (static_modules or {}).get(n, module).to(device).eval()
                with exporting_batch(n):
                    programs[static_model_name(n)] = torch.export.export(
                        own, (random_input(n, input_shape, dtype, device),), strict=strict)
            path = package_graphs(programs, package_path, compile_options)
    check_package_libraries(Path(path))
    return Path(path), toolchain.description


#: Whether export and AOTInductor may use the fake-tensor dispatch cache while a package
#: is built. Off: in the whole fp8 timm_resnet50 (a dynamic batch, strict export) the cache
#: held an NCHW answer for the stem convolution's NHWC input and weight, where the fake
#: convolution itself says NHWC; Inductor then laid the convolution out NCHW, and cuDNN
#: converted its input, weight and output around it and a copy made the next kernel's
#: NHWC input (0.14 ms of 1.19 at batch 32 on an H100; with the cache off the same graph
#: ran 1.055 ms, docs/measurements/h100-2026-12-07-e, ``stem_layout_probe.py --explain``).
#: Every fake result is then computed from its inputs; the price is compile time: the
#: family's fp8 ResNet compiled in 155-161 s with it off, 135-155 s in earlier calls (each
#: with other builds running beside it).
FAKE_TENSOR_CACHE = False

#: Inductor options of a build whose model launches the TMA kernel (``fused.uses_tma``): with
#: compile-time autotuning on, AOTInductor's generated tuning script failed to parse (torch
#: 2.11 on an H100: "invalid decimal literal"); without it the package builds, loads and
#: equals eager (docs/measurements/h100-2026-12-06-e). The model's Triton kernels carry
#: their tiles, so nothing is left to tune.
TMA_COMPILE_OPTIONS = {"triton.autotune_at_compile_time": False}


def export_strict(*modules: torch.nn.Module) -> bool:
    """Whether the graphs of ``modules`` must be exported with Dynamo (``strict=True``): the
    TMA layers' host descriptors are recorded only then (``fused.uses_tma``). The rest
    export as before, without Dynamo."""
    from bundler.targets.torch_aoti.fused import uses_tma

    return any(uses_tma(m) for m in modules)


def package_graphs(programs: dict[str, Any], package_path: Path, compile_options: dict) -> str:
    """Compile each exported program with AOTInductor and write them into one package, one
    model each (``torch._inductor.package.package_aoti`` with a dict of models: what the
    docstring of ``aoti_compile_and_package`` gives for several models in one ``.pt2``).
    The weights are compiled into each model's library, so each graph carries its own copy:
    the package grows by the size of the weights per static batch size, and so does the GPU
    memory of a loaded bundle. The bundle file stores the copies about once (the writer
    compresses a member this large with long-distance matching: ``writer.LONG_RANGE_MIN``)."""
    torch = import_torch()
    from torch._inductor.package import package_aoti

    files = {}
    for name, program in programs.items():
        args, kwargs = program.example_inputs
        files[name] = torch._inductor.aot_compile(
            program.module(), args, kwargs,
            options={**compile_options, "aot_inductor.package": True})
    return package_aoti(str(package_path), files)


def smoke_check(package_path: Path, module: torch.nn.Module, input_shape: tuple[int, ...],
                batch_sizes: list[int], device: str,
                static_batches: Sequence[int] = (),
                static_modules: Mapping[int, Any] | None = None) -> dict[str, float]:
    """Run the compiled package at ``batch_sizes`` (its dynamic graph) and each static graph
    at its own size against the eager module: max |diff| per run.

    Catches a package that compiles but computes something else (a mis-lowered op) at build
    time rather than in `bundle verify --numerics`.
    """
    from runtime_py.engines.torch_aoti import DYNAMIC_MODEL, load_graphs, static_model_name

    torch = import_torch()
    names = [static_model_name(n) for n in static_batches]
    graphs = load_graphs(torch, package_path, [DYNAMIC_MODEL, *names])
    runs = [(f"batch {n}", graphs[DYNAMIC_MODEL], n, module) for n in batch_sizes]
    runs += [(f"batch {n} (static graph)", graphs[name], n, (static_modules or {}).get(n, module))
             for n, name in zip(static_batches, names)]
    diffs = {}
    gen = torch.Generator(device="cpu").manual_seed(0)
    with torch.no_grad():
        for label, runner, n, eager in runs:
            x = random_input(n, input_shape, module_input_dtype(module), device, gen)
            got = runner(x)
            got = got[0] if isinstance(got, (list, tuple)) else got
            ref = eager.to(device)(x)
            if got.shape != ref.shape or not torch.isfinite(got).all():
                raise BundleError(f"the compiled package gave {tuple(got.shape)} (finite: "
                                  f"{bool(torch.isfinite(got).all())}) for {label}, expected "
                                  f"{tuple(ref.shape)}")
            diffs[label] = float((got - ref).abs().max())
    return diffs


def host_details(device: str) -> dict:
    """torch/CUDA versions, compute capability and device name of the build host."""
    torch = import_torch()
    if device == "cpu":
        return {"torch_version": str(torch.__version__), "cuda_version": None,
                "compute_capability": None,
                "device_name": platform.processor() or platform.machine() or "cpu",
                "device": "cpu"}
    cc = torch.cuda.get_device_capability()
    return {"torch_version": str(torch.__version__), "cuda_version": torch.version.cuda,
            "compute_capability": f"{cc[0]}.{cc[1]}",
            "device_name": torch.cuda.get_device_name(), "device": "cuda"}


def static_sizes(static_batches: Sequence[int], lo: int, hi: int) -> list[int]:
    """The static batch sizes to compile, ascending; UsageError for a size outside lo..hi,
    or any when the range is one size (the dynamic graph is static then)."""
    sizes = sorted({int(n) for n in static_batches})
    outside = [n for n in sizes if not lo <= n <= hi]
    if outside:
        raise UsageError(f"static batch sizes {outside} are outside the batch range {lo}..{hi}")
    if sizes and lo == hi:
        raise UsageError(f"the batch range {lo}..{hi} is one size: its graph is static already")
    return sizes


def effective_small_batch_pointwise(requested: str, precision: str,
                                    static_batches: Sequence[int], *, layout: str = "nhwc",
                                    fp8_conv: str = "im2col") -> str:
    """The small-batch GEMM form a build records (``fp8_layers.SMALL_BATCH_POINTWISE``):
    ``requested`` where it applies (an fp8 model whose GEMM layers are ``Fp8Pointwise`` or
    ``Fp8Linear``: the NHWC rewrite or the channels_last form of an image family, i.e.
    every fp8 form but ``fp8_conv`` "triton-fused", or an "as_is" ``layout``; with a
    static graph of at most ``fp8_layers.SMALL_BATCH`` images), else "gemm" (nothing it would
    change: not recorded). `bundle study` asks the same to decide whether a bundle can be
    reused."""
    from bundler.targets.torch_aoti.fp8_layers import SMALL_BATCH

    gemm_layers = layout == "as_is" or fp8_conv not in FUSED_FP8_CONVS
    applies = (precision == "fp8" and gemm_layers
               and any(n <= SMALL_BATCH for n in static_batches))
    return requested if applies else "gemm"


#: family.json ``torch_aoti.small_batch_layout``: "same" (every graph in the model form
#: of its precision) or "nhwc" (``build_engine``: the small static graphs as the NHWC rewrite).
SMALL_BATCH_LAYOUTS = TORCH_AOTI_SMALL_BATCH_LAYOUTS


def small_static_batches(static_batches: Sequence[int]) -> list[int]:
    """The static sizes that count as small (<= ``fp8_layers.SMALL_BATCH``)."""
    from bundler.targets.torch_aoti.fp8_layers import SMALL_BATCH

    return [int(n) for n in static_batches if n <= SMALL_BATCH]


def small_batch_form(small_batch_layout: str | None, precision: str,
                     static_batches: Sequence[int], *, channels_last: bool,
                     layout: str = "nhwc", fp8_conv: str = "im2col") -> str | None:
    """What ``engine.details.compile_options.small_batch_layout`` says when the small
    static graphs are the NHWC rewrite while the model form is channels_last; None where
    every graph has the model form (nothing recorded). `bundle study` compares it too."""
    if small_batch_layout not in (None, *SMALL_BATCH_LAYOUTS):
        raise UsageError(f"small-batch layout {small_batch_layout!r}: choose one of "
                         f"{', '.join(SMALL_BATCH_LAYOUTS)}")
    small = small_static_batches(static_batches)
    if not (small_batch_layout == "nhwc" and small and channels_last and layout != "as_is"
            and precision in ("fp16", "fp8")
            and not (precision == "fp8" and fp8_conv in FUSED_FP8_CONVS)):
        return None
    return (layout_description(precision, nhwc=True,
                               pad_channels=default_pad_channels(precision))
            + f" (static graphs of batch {', '.join(map(str, small))})")


def compile_options_for(compile_options: dict | None) -> dict:
    options = {**DEFAULT_COMPILE_OPTIONS, **(compile_options or {})}
    refused = [k for k in REFUSED_COMPILE_OPTIONS if options.get(k)]
    if refused:
        raise UsageError(f"torch-aoti refuses {', '.join(refused)}: it took over 9 minutes on "
                         "xception41 for a few percent (see families/timm_xception/README.md)")
    return options


def build_engine(torch_model: torch.nn.Module, precision: str, input_shape: tuple[int, ...],
                 batch: dict, *, fp8: dict[str, tuple[float, Any]] | None = None,
                 device: str = "cuda", batch_sizes: list[int] | None = None,
                 compile_options: dict | None = None, nhwc: bool | None = None,
                 fast_accum: bool = False, fp8_gemm: str = "rowwise",
                 pad_channels: bool | None = None, smoke: bool = True,
                 log: Callable[[str], None] | None = None,
                 pixel_scale_bias: tuple[Any, Any] | None = None, layout: str = "nhwc",
                 fp8_conv: str | None = None, hook=None, channels_last: bool = False,
                 static_batches: Sequence[int] = (),
                 small_batch_pointwise: str = "gemm",
                 small_batch_layout: str | None = None,
                 depthwise: str = "cudnn",
                 triton_pointwise: Mapping[tuple[int, int, str], tuple] | None = None,
                 fuse_stem: bool = False,
                 cudnn_benchmark: bool | tuple[int, ...] = False
                 ) -> tuple[bytes, dict]:
    """Compile one package from a torch model; returns (package bytes, engine details).

    ``fp8`` maps *module paths* to (activation scale, weight scales); ``build_target``
    derives it from the bundle. Used directly by ``benchmarks/aoti_bench.py``.
    ``smoke``: load the package in this process and compare it with the eager module at
    ``batch_sizes`` (``smoke=False`` skips that load: seconds, and on a host whose compiler
    linked libstdc++ statically it was what crashed, before ``aoti_toolchain``).
    ``pixel_scale_bias``: (scale, bias) of a uint8 pixel head (``pixel_head``); the package
    then takes uint8 [N, H, W, 3] where ``input_shape`` is (3, H, W).
    ``fp8_conv``: the k x k FP8 convolution kernel (``default_fp8_conv``). ``channels_last``:
    ``engine_model``'s (used when the model is not the NHWC rewrite). ``static_batches``:
    sizes compiled once more with a static batch, into the same package (``compile_package``;
    family.json ``torch_aoti.static_batches``). ``small_batch_pointwise``: how FP8 1x1
    convolutions (Linear layers of an "as_is" family) run in the static graphs of small
    batches (``engine_model``; family.json ``torch_aoti.fp8_pointwise_small_batch``).
    ``small_batch_layout="nhwc"``: the static graphs of at most ``fp8_layers.SMALL_BATCH``
    images are the NHWC rewrite even where the model form is channels_last (family.json
    ``torch_aoti.small_batch_layout``: on the H200 timm_xception's channels_last form
    was the faster at batch 32 and the NHWC rewrite at batch 1, where cuDNN's depthwise
    convolutions cost more than the rewrite's fused slices). ``depthwise``: the
    channels_last fp8 form's depthwise convolutions (``model.CHANNELS_LAST_DEPTHWISE``,
    family.json ``torch_aoti.fp8_depthwise``); ``triton_pointwise`` and ``fuse_stem``:
    ``engine_model``'s; ``cudnn_benchmark``: recorded for the runtime (``engine_details``).
    """
    log = log or (lambda _msg: None)
    check_host(device=device, precision=precision)
    started = time.monotonic()
    options = compile_options_for(compile_options)
    nhwc = default_nhwc(precision, nhwc, layout)
    pad_channels = (default_pad_channels(precision, pad_channels) if nhwc
                    else bool(pad_channels))  # engine_model refuses padding without NHWC
    lo, hi = int(batch["min"]), int(batch["max"])
    fp8_conv = default_fp8_conv(fp8_conv) if precision == "fp8" else "im2col"
    if fp8_conv in FUSED_FP8_CONVS and layout != "as_is":   # channels_last, bottlenecks fused
        nhwc, pad_channels, channels_last = False, False, True
    static = static_sizes(static_batches, lo, hi)
    small_batch_pointwise = effective_small_batch_pointwise(
        small_batch_pointwise, precision, static, layout=layout, fp8_conv=fp8_conv)
    module, padding = engine_model(torch_model, precision, fp8, nhwc=nhwc, fast_accum=fast_accum,
                                   fp8_gemm=fp8_gemm, pad_channels=pad_channels,
                                   input_shape=input_shape, max_batch=hi, layout=layout,
                                   fp8_conv=fp8_conv, hook=hook,
                                   channels_last=channels_last and not nhwc,
                                   small_batch_pointwise=small_batch_pointwise,
                                   depthwise=depthwise, triton_pointwise=triton_pointwise,
                                   fuse_stem=fuse_stem)
    small_modules = {}
    small_form = small_batch_form(small_batch_layout, precision, static,
                                  channels_last=channels_last and not nhwc, layout=layout,
                                  fp8_conv=fp8_conv)
    if small_form is not None:
        small = small_static_batches(static)
        small_module, padding = engine_model(
            torch_model, precision, fp8, nhwc=True, fast_accum=fast_accum, fp8_gemm=fp8_gemm,
            pad_channels=default_pad_channels(precision), input_shape=input_shape,
            max_batch=max(small), layout=layout, fp8_conv=fp8_conv, hook=hook,
            small_batch_pointwise=small_batch_pointwise)
        small_modules = dict.fromkeys(small, small_module)
    export_shape = tuple(input_shape)
    if pixel_scale_bias is not None:
        module = pixel_head(module, *pixel_scale_bias)
        small_modules = {n: pixel_head(m, *pixel_scale_bias) for n, m in small_modules.items()}
        export_shape = (*input_shape[1:], input_shape[0])
    module = module.to(device)
    sizes = sorted({int(b) for b in (batch_sizes or [lo, hi])})
    if any(not lo <= b <= hi for b in sizes):
        raise UsageError(f"batch sizes {sizes} are outside the family's range {lo}..{hi}")
    if nhwc or small_modules:
        import copy

        from bundler.targets.torch_aoti.model import check_rewrite

        err = check_rewrite(copy.deepcopy(torch_model).to(device), _example(input_shape, device),
                            pad_channels=pad_channels if nhwc else default_pad_channels(precision),
                            hook=hook)
        log(f"NHWC rewrite matches the model (relative max difference {err:.2g})")
    with tempfile.TemporaryDirectory(prefix="trt-bundle-aoti-") as tmp:
        log(f"exporting and compiling the {precision} package for {device} "
            f"(batch {lo}..{hi}{''.join(f', static {n}' for n in static)}, {options})")
        path, cxx = compile_package(module, export_shape, batch, device, options,
                                    Path(tmp) / MEMBER, static, small_modules)
        log(f"compiled in {time.monotonic() - started:.0f} s")
        if smoke:
            diffs = smoke_check(path, module, export_shape, sizes, device, static,
                                small_modules)
            log("compiled package vs eager module, max |diff|: "
                + ", ".join(f"{label}: {d:.3g}" for label, d in diffs.items()))
        data = path.read_bytes()
    details = engine_details(host_details(device), precision, options,
                             nhwc=nhwc, fast_accum=fast_accum, fp8_gemm=fp8_gemm,
                             pad_channels=pad_channels, padding=padding, batch_sizes=sizes,
                             seconds=time.monotonic() - started, cxx=cxx, layout=layout,
                             fp8_conv=fp8_conv, channels_last=channels_last and not nhwc,
                             static_batches=static, small_batch_pointwise=small_batch_pointwise,
                             depthwise=depthwise, fused_stem=fuse_stem and has_fused_stem(module),
                             cudnn_benchmark=cudnn_benchmark)
    if small_form is not None:
        details["compile_options"]["small_batch_layout"] = small_form
    if pixel_scale_bias is not None:
        details["compile_options"]["input"] = "uint8 NHWC pixels; rescale, normalize, layout " \
                                              "and cast in the graph"
    log(f"package: {len(data) / 1e6:.1f} MB in {time.monotonic() - started:.0f} s")
    return data, details


#: The sources whose code becomes a package's model: the rewrites, the FP8 layers and
#: their Triton kernels (relative to this folder; a folder means its ``*.py`` files).
MODEL_CODE_SOURCES = ("model.py", "nhwc_modules.py", "fp8_layers.py", "fused.py",
                      "fused_mlp.py", "kernels")


@functools.lru_cache(maxsize=None)
def model_code_digest(folder: Path | None = None) -> str:
    """sha256 of ``MODEL_CODE_SOURCES`` (paths and bytes), recorded as
    ``compile_options.model_code``. Why: a package compiles the model rewrite and its
    kernels in, and `bundle make --reuse` / `bundle study` took a bundle built before a
    kernel or tile-table change as this build's (the trt-bundle version does not move
    between commits): the TMA tile table of 2026-12-06 needed the old bundle removed by
    hand. With the digest such a bundle is rebuilt. ``folder``: another copy of this
    target's folder (tests)."""
    import hashlib

    here = folder or Path(__file__).resolve().parent
    files: list[Path] = []
    for name in MODEL_CODE_SOURCES:
        path = here / name
        files += sorted(path.glob("*.py")) if path.is_dir() else [path]
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.relative_to(here).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return "sha256:" + digest.hexdigest()


#: ``compile_options.fp8_stem`` of a build whose ResNet stem is fused
#: (``fused.StemConv``, ``StemPool``)
STEM_DESCRIPTION = ("fp16 cuDNN convolution; bias, ReLU, 3x3 max pool and the first "
                    "block's e4m3 quantize in one Triton kernel")


def has_fused_stem(module: torch.nn.Module) -> bool:
    """Whether ``module`` runs a fused stem (``fused.StemPool``): what a build asked of
    ``rewrite_fused`` is recorded only where the model had such a stem."""
    from bundler.targets.torch_aoti.fused import StemPool

    return any(isinstance(m, StemPool) for m in module.modules())


def engine_details(host: dict, precision: str, options: dict, *, nhwc: bool,
                   fast_accum: bool, padding: dict, batch_sizes: list[int],
                   seconds: float | None, fp8_gemm: str = "rowwise",
                   pad_channels: bool = False, cxx: str | None = None,
                   layout: str = "nhwc", fp8_conv: str = "im2col",
                   channels_last: bool = False, static_batches: Sequence[int] = (),
                   small_batch_pointwise: str = "gemm", depthwise: str = "cudnn",
                   fused_stem: bool = False,
                   cudnn_benchmark: bool | tuple[int, ...] = False) -> dict:
    """The manifest's ``engine.details`` (schema ``$defs/torch_aoti_details``): the build
    host (``host_details``), what was compiled and how, the fp8 padding per layer, the
    batch sizes the package was checked at, and the sizes with a static graph of their own
    (``static_batches``, only when there are some); ``fused_stem``: the model's stem runs
    fused (``has_fused_stem``); ``cudnn_benchmark``: the runtime times cuDNN's algorithms
    in each CUDA graph's warm-up, or in those of the batch sizes given (family.json
    ``torch_aoti.cudnn_benchmark``; the runner reads ``compile_options.cudnn_benchmark``).
    No floats (manifest rule)."""
    from bundler.quality import decimal
    from bundler.targets.torch_aoti.fp8_layers import FP8_ALIGN

    details = dict(host)
    recorded_conv = fp8_conv_recorded(precision, layout, fp8_conv)
    details["compile_options"] = {
        "inductor": dict(options),
        "export": "torch.export, dynamic batch" + (
            f"; static batch {', '.join(map(str, static_batches))} (a graph each)"
            if static_batches else ""),
        "layout": layout_description(precision, nhwc=nhwc, pad_channels=pad_channels,
                                     layout=layout, channels_last=channels_last,
                                     fp8_conv=fp8_conv, depthwise=depthwise),
        "dtype": PRECISIONS[precision],
        **({"fp8_gemm": FP8_GEMM_DESCRIPTIONS[fp8_gemm],
            "fp8_fast_accum": bool(fast_accum)} if precision == "fp8" else {}),
        **({"fp8_conv": recorded_conv} if recorded_conv is not None else {}),
        **({"fp8_pointwise_small_batch": SMALL_BATCH_POINTWISE_DESCRIPTIONS[small_batch_pointwise]}
           if small_batch_pointwise != "gemm" else {}),
        **({"fp8_stem": STEM_DESCRIPTION} if fused_stem else {}),
        **({"cudnn_benchmark": cudnn_benchmark_record(cudnn_benchmark)}
           if cudnn_benchmark else {}),
        **({"cxx": cxx} if cxx else {}),
        "model_code": model_code_digest(),
    }
    if precision == "fp8":
        details["fp8_padding"] = {"align": FP8_ALIGN, "layers": dict(padding)}
    details["batch_sizes"] = [int(b) for b in batch_sizes]
    if static_batches:
        details["static_batches"] = [int(b) for b in static_batches]
    if seconds is not None:
        details["build_seconds"] = decimal(seconds)
    return details


def layout_description(precision: str, *, nhwc: bool, pad_channels: bool = False,
                       layout: str = "nhwc", channels_last: bool = False,
                       fp8_conv: str = "im2col", depthwise: str = "cudnn") -> str:
    """What ``engine.details.compile_options.layout`` says of a package's model form (and
    what `bundle study` compares before it reuses a bundle)."""
    if nhwc:
        return "nhwc, channels padded to multiples of 16" if pad_channels else "nhwc"
    if layout == "as_is":   # (a package from before PatchGemm said "as is (tokens)")
        return "as is (tokens), patch embedding as one GEMM"
    if not channels_last:
        return "nchw"
    if precision == "fp8" and fp8_conv not in FUSED_FP8_CONVS:
        form = "channels_last (the model as it is), FP8 layers on the NHWC view of their input"
        return form + DEPTHWISE_DESCRIPTIONS[depthwise]
    return "channels_last (the model as it is)"


#: What the layout description adds for the channels_last fp8 form's depthwise convolutions
#: (family.json ``torch_aoti.fp8_depthwise``): nothing for cuDNN's, the form before it had
#: a name, so that bundles built then still read as what they are.
DEPTHWISE_DESCRIPTIONS = {
    "cudnn": "",
    "slices": "; depthwise convolutions as shifted slices",
    "triton": "; depthwise convolutions that feed an FP8 GEMM as one Triton kernel writing "
              "its e4m3 rows",
    "triton-rows": "; depthwise convolutions that feed an FP8 GEMM as one Triton kernel "
                   "writing its e4m3 rows (row strips at stride 1)",
    "triton-skip": "; depthwise convolutions that feed an FP8 GEMM as one Triton kernel "
                   "writing its e4m3 rows; the 1x1 layers measured faster on the Triton "
                   "implicit GEMM run on it, with the skip adds of their blocks in its "
                   "epilogue",
}


FP8_GEMM_DESCRIPTIONS = {
    "rowwise": "torch._scaled_mm e4m3 x e4m3, rowwise scales and bias in the GEMM epilogue "
               "(activation scale folded into the per-channel weight scales; row scales: one "
               "shared column of ones), bf16 out",
    "tensorwise": "torch._scaled_mm e4m3 x e4m3, tensorwise scales, bf16 out, per-channel "
                  "scale and bias in a pointwise pass after it",
    "rowwise-fp16": "torch._scaled_mm e4m3 x e4m3, rowwise scales and fp16 bias in the GEMM "
                    "epilogue (activation scale folded into the per-channel weight scales; row "
                    "scales: one shared column of ones), fp16 out",
    "dequantized": "no FP8 GEMM: the FP8 operands dequantized to fp16 (DequantizeLinear), "
                   "fp16 GEMM",
}


SMALL_BATCH_POINTWISE_DESCRIPTIONS = {
    "gemm": "FP8 1x1 convolutions and Linear layers on torch._scaled_mm at every batch",
    "triton": "in the static graphs of batches up to 8: FP8 1x1 convolutions and Linear "
              "layers on the implicit-GEMM Triton kernel with small tiles "
              "(torch._scaled_mm elsewhere)",
    "dequantized": "in the static graphs of batches up to 8: the operands of the FP8 1x1 "
                   "convolutions and Linear layers dequantized, fp16 GEMMs "
                   "(torch._scaled_mm elsewhere)",
    "triton-split-k": "in the static graphs of batches up to 8: FP8 Linear layers on the "
                      "implicit-GEMM Triton kernel with small tiles, those whose rows leave "
                      "SMs idle with the reduction split in two (fp32 partial sums added, "
                      "scaled and biased in the next kernel; torch._scaled_mm elsewhere)",
}


FP8_CONV_DESCRIPTIONS = {
    "im2col": "dense k x k FP8 convolutions: im2col (shifted NHWC views concatenated), "
              "then the FP8 GEMM",
    "triton": "dense k x k FP8 convolutions: implicit-GEMM Triton kernel (taps gathered "
              "in place, fp32 accumulation, per-channel scale and bias, fp16 out)",
    "triton-fused": "channels_last model, ResNet bottlenecks fused: every FP8 convolution "
                    "(1x1 and 3x3) on the implicit-GEMM Triton kernel, ReLU and residual "
                    "add in its epilogue, e4m3 written with the next layer's activation "
                    "scale (no quantize pass between FP8 layers)",
    "triton-fused-tma": "channels_last model, ResNet bottlenecks fused: every FP8 "
                        "convolution on a Triton kernel, the dense 1x1 stride-1 ones with "
                        "TMA loads and stores (the rest on the implicit-GEMM kernel), ReLU "
                        "and residual add in its epilogue, e4m3 written with the next "
                        "layer's activation scale (no quantize pass between FP8 layers)",
    "triton-fused-tma-small": "channels_last model, ResNet bottlenecks fused: every FP8 "
                              "convolution on a Triton kernel, the dense 1x1 stride-1 ones "
                              "with TMA loads and stores in every graph, small static "
                              "batches with their own TMA tiles (the rest on the "
                              "implicit-GEMM kernel), ReLU and residual add in its "
                              "epilogue, e4m3 written with the next layer's activation "
                              "scale (no quantize pass between FP8 layers)",
    "triton-fused-tma-3x3": "channels_last model, ResNet bottlenecks fused: every FP8 "
                            "convolution on a Triton kernel, the dense 1x1 stride-1 ones "
                            "with TMA loads and stores in every graph, small static "
                            "batches with their own TMA tiles, the 3x3 and strided 1x1 ones "
                            "with one TMA box per window tap outside small static batches "
                            "where their maps have measured tiles (the rest on the "
                            "implicit-GEMM kernel), ReLU and residual add "
                            "in its epilogue, e4m3 written with the next layer's "
                            "activation scale (no quantize pass between FP8 layers)",
}


#: ``fp8_conv`` "triton-fused" of a layout "as_is" family (``fused_mlp``), as recorded.
FUSED_MLP_DESCRIPTION = ("transformer MLPs fused: fc1 on the implicit-GEMM Triton kernel "
                         "(a 1x1 convolution over the tokens) with bias, GELU (erfc form, "
                         "|error| <= 1.5e-7) and fc2's input quantize in its epilogue, e4m3 "
                         "out; fc2 and the other FP8 Linear layers on torch._scaled_mm")


def fp8_conv_recorded(precision: str, layout: str, fp8_conv: str) -> str | None:
    """What ``compile_options.fp8_conv`` records of a build: an image family's FP8
    convolution form; for a layout "as_is" family (tokens), the fused-MLP form where its
    ``fp8_conv`` is "triton-fused" and nothing otherwise; nothing below fp8. One rule for
    ``engine_details`` and ``bundle study``'s reuse check (``fp8_conv_named``)."""
    if precision != "fp8":
        return None
    if layout != "as_is":
        return FP8_CONV_DESCRIPTIONS[fp8_conv]
    return FUSED_MLP_DESCRIPTION if fp8_conv == "triton-fused" else None


def fp8_conv_named(layout: str, recorded: str | None) -> str | None:
    """The form a recorded ``compile_options.fp8_conv`` stands for, as a user names it:
    an ``fp8_conv`` value (image families; an unknown text as it is), or "triton-fused" /
    "separate" for the MLPs of a layout "as_is" family."""
    if layout == "as_is":
        return "triton-fused" if recorded == FUSED_MLP_DESCRIPTION else "separate"
    names = {text: name for name, text in FP8_CONV_DESCRIPTIONS.items()}
    return names.get(recorded, recorded) if recorded is not None else None


def _example(input_shape: tuple[int, ...], device: str):
    torch = import_torch()
    return torch.randn(1, *input_shape, generator=torch.Generator().manual_seed(1)).to(device)


def random_input(n: int, shape: tuple[int, ...], dtype, device: str, generator=None):
    """A batch for export and checks: normal floats, or uint8 pixels for a pixel head."""
    torch = import_torch()
    if dtype == torch.uint8:
        return torch.randint(0, 256, (n, *shape), dtype=torch.uint8,
                             generator=generator).to(device)
    return torch.randn(n, *shape, generator=generator).to(device)


def module_input_dtype(module):
    """uint8 for a module behind a pixel head, else float32."""
    torch = import_torch()
    return torch.uint8 if getattr(module, "takes_pixels", False) else torch.float32


def pixel_head(module, scale, bias):
    """``module`` (float32 NCHW in) behind the preprocessing's device steps: uint8 NHWC
    pixels -> float -> NCHW -> ``x * scale + bias`` (per channel, the float32 constants of
    the host ``Preprocessor``). Inside the compiled graph Inductor fuses it with the
    engine's own cast and NHWC permute into one elementwise kernel."""
    torch = import_torch()

    class PixelHead(torch.nn.Module):
        takes_pixels = True

        def __init__(self) -> None:
            super().__init__()
            self.body = module
            self.register_buffer("scale", torch.tensor(scale, dtype=torch.float32).reshape(1, 3, 1, 1))
            self.register_buffer("bias", torch.tensor(bias, dtype=torch.float32).reshape(1, 3, 1, 1))

        def forward(self, x):
            return self.body(x.permute(0, 3, 1, 2).float() * self.scale + self.bias)

    return PixelHead()


def engine_form(family, precision: str, fp8_conv: str = "im2col") -> str:
    """The model form a build of ``family`` in ``precision`` compiles, unless its caller
    asks: "as_is" (tokens), "channels_last" (family.json ``fp16_layout`` / ``fp8_layout``,
    or fp8 with ``fp8_conv`` triton-fused) or "nhwc" (fp32: "nchw", the model as it is)."""
    if settings_of(family).layout == "as_is":
        return "as_is"
    if precision == "fp8" and fp8_conv in FUSED_FP8_CONVS:
        return "channels_last"
    if precision == "fp32":
        return "nchw"
    return settings_of(family).image_layout(precision)


def depthwise_form(family, precision: str, variant: str | None = None) -> str:
    """How the channels_last fp8 form runs the depthwise convolutions of a build of
    ``family``'s ``variant``: family.json ``torch_aoti.fp8_depthwise``, except that a recipe
    which quantizes the depthwise layers itself (timm_xception's ``fp8-depthwise``) gets
    cuDNN's form: the Triton kernel computes a depthwise layer in fp16 and quantizes its
    output for the FP8 GEMM after it, while such a recipe quantizes the layer's own input
    and weights. Build and ``bundle study`` both ask here, so a variant's bundle is reused,
    not rebuilt each time.
    "cudnn" outside fp8 (nothing to choose there)."""
    if precision != "fp8":
        return "cudnn"
    form = settings_of(family).fp8_depthwise
    if form in TORCH_AOTI_TRITON_DEPTHWISE and family.fp8 is not None and any(
            rule.get("depthwise") for rule in family.recipe(variant)["select"]["include"]):
        return "cudnn"
    return form


def fp8_gemm_options(family, fp8_gemm: str | None = None,
                     fp8_fast_accum: bool | None = None) -> tuple[str, bool]:
    """(GEMM mode, fast accumulation) of a build's FP8 layers: what the caller asks, else
    the family's ``torch_aoti.fp8_gemm`` / ``fp8_fast_accum`` (family.json; rowwise
    without fast accumulation unless it says otherwise). Refuses an unknown mode."""
    from bundler.targets.torch_aoti.settings import TORCH_AOTI_FP8_GEMMS

    gemm = settings_of(family).fp8_gemm if fp8_gemm is None else fp8_gemm
    if gemm not in TORCH_AOTI_FP8_GEMMS:
        raise UsageError(f"fp8 GEMM mode {gemm!r}: choose one of {', '.join(TORCH_AOTI_FP8_GEMMS)}")
    fast = settings_of(family).fp8_fast_accum if fp8_fast_accum is None else bool(fp8_fast_accum)
    return gemm, fast


def build_target(onnx_bytes: bytes, *, batch: dict, log: Callable[[str], None] | None = None,
                 context: BuildContext | None = None, device: str = "cuda",
                 batch_sizes: list[int] | None = None, compile_options: dict | None = None,
                 nhwc: bool | None = None, fp8_fast_accum: bool | None = None,
                 fp8_gemm: str | None = None, pad_channels: bool | None = None,
                 fp8_conv: str | None = None, smoke_check: bool = False) -> TargetBuild:
    """The bundle's engine: its torch model in its precision, compiled (module docstring).

    Everything the bundle's graph was made with comes from ``context`` (``bundler.
    build_context``: family, precision, the fp8 layers with the scales of its
    ``calibration.safetensors``, the torch model, the pixel head); ``onnx_bytes`` is not
    re-read. ``smoke_check`` is off by default (a load in the build process; see
    ``build_engine``): ``bundle verify --numerics`` loads the package in the runtime and
    checks it against the ONNX Runtime reference instead. ``fp8_conv``: how dense k x k
    FP8 convolutions run, default ``$TRT_BUNDLE_FP8_CONV``, else the family's
    ``torch_aoti.fp8_conv``, else im2col (``default_fp8_conv``).
    ``fp8_gemm`` and ``fp8_fast_accum``: how the FP8 layers run (``fp8_layers.FP8_GEMMS``,
    ``use_fast_accum``), default the family's ``torch_aoti.fp8_gemm`` and
    ``torch_aoti.fp8_fast_accum`` (family.json).
    """
    if context is None:
        raise UsageError("the torch-aoti target compiles the family's torch model: it needs "
                         "the build context (bundle make and bundle rebuild pass it)")
    family, precision = context.family, context.precision
    fp8 = None
    if precision == "fp8":
        from bundler.targets.torch_aoti.model import map_nodes_to_modules

        paths = map_nodes_to_modules(context.torch_model, list(context.fp8))
        fp8 = {paths[node]: (layer.act_scale, layer.weight_scales)
               for node, layer in context.fp8.items()}
        if log:
            log(f"fp8 recipe {context.variant or 'base'}: {len(fp8)} layers from the bundle")
    ext = family.extension()
    fp8_gemm, fp8_fast_accum = fp8_gemm_options(family, fp8_gemm, fp8_fast_accum)
    if precision == "fp8":    # the caller's, else $TRT_BUNDLE_FP8_CONV, else the family's
        capability = None
        if device != "cpu":
            torch = import_torch()
            capability = torch.cuda.get_device_capability() if torch.cuda.is_available() else None
        named = default_fp8_conv(fp8_conv, settings_of(family).fp8_conv)
        fp8_conv = build_fp8_conv(fp8_conv, settings_of(family).fp8_conv, capability)
        if fp8_conv != named and log:
            log(f"fp8 convolutions: the family's {named} needs TMA (compute capability "
                f"{TMA_CAPABILITY[0]}.{TMA_CAPABILITY[1]}+), this GPU is "
                f"{capability[0]}.{capability[1]}: building {fp8_conv}")
        elif log and settings_of(family).layout != "as_is":
            log(f"fp8 convolutions: {fp8_conv}")
    # the family's form (family.json torch_aoti.fp16_layout / fp8_layout) unless nhwc is asked
    channels_last = nhwc is None and engine_form(family, precision, fp8_conv) == "channels_last"
    if channels_last:
        nhwc = False
    data, details = build_engine(context.torch_model, precision, tuple(family.input.shape), batch,
                                 fp8=fp8, device=device, batch_sizes=batch_sizes,
                                 compile_options=compile_options, nhwc=nhwc,
                                 fast_accum=fp8_fast_accum, fp8_gemm=fp8_gemm,
                                 pad_channels=pad_channels, smoke=smoke_check, log=log,
                                 pixel_scale_bias=context.pixel_scale_bias,
                                 layout=settings_of(family).layout, fp8_conv=fp8_conv,
                                 hook=getattr(ext, "nhwc_module", None),
                                 channels_last=channels_last,
                                 static_batches=settings_of(family).static_batches_for(precision),
                                 small_batch_pointwise=settings_of(family).fp8_pointwise_small_batch,
                                 small_batch_layout=settings_of(family).small_batch_layout,
                                 depthwise=depthwise_form(family, precision,
                                                          context.variant),
                                 triton_pointwise=settings_of(family).fp8_triton_pointwise,
                                 fuse_stem=settings_of(family).fp8_fuse_stem,
                                 cudnn_benchmark=settings_of(family).cudnn_benchmark)
    return TargetBuild(backend=BACKEND, member=MEMBER, engine_bytes=data, details=details,
                       tag=BACKEND)
