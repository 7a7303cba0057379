"""A family's ``torch_aoti`` settings (family.json): what each may be, what they mean
together, and how the torch-aoti target reads them.

Why here: they are the torch-aoti target's business, not the family loader's. The loader
(``bundler.families``) hands each engine target its own section of family.json through the
registry (``EngineTarget.settings_path``) and knows none of the keys; a new target with
family settings brings a module like this one. Imports nothing heavy (families load it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

from bundler.families import KNOWN_PRECISIONS

#: family.json's key of this target's section.
SECTION = "torch_aoti"
TORCH_AOTI_LAYOUTS = ("nhwc", "as_is")
#: ``torch_aoti.fp16_layout``: the fp16 engine as the NHWC rewrite, or as the model itself in
#: channels_last memory format (what torch.compile users run; bundler.targets.torch_aoti).
TORCH_AOTI_FP16_LAYOUTS = ("nhwc", "channels_last")
#: ``torch_aoti.fp8_layout``: the fp8 engine as the NHWC rewrite, or as the model in
#: channels_last memory format with its FP8 layers reading the NHWC view of their input
#: (``bundler.targets.torch_aoti.model.rewrite_channels_last``).
TORCH_AOTI_FP8_LAYOUTS = ("nhwc", "channels_last")
#: ``torch_aoti.fp8_depthwise``: how the channels_last fp8 form runs depthwise convolutions
#: (the meaning of each: bundler.targets.torch_aoti.model.CHANNELS_LAST_DEPTHWISE); "cudnn"
#: unless named.
TORCH_AOTI_FP8_DEPTHWISE = ("cudnn", "slices", "triton", "triton-rows", "triton-skip")
#: The forms of it that run the Triton depthwise-to-e4m3 kernel.
TORCH_AOTI_TRITON_DEPTHWISE = ("triton", "triton-rows", "triton-skip")
#: ``torch_aoti.fp8_triton_pointwise`` entries' epilogues: "raw" (the layer's output read by
#: the next depthwise kernel) or "skip" (a residual block's last layer, its shortcut added
#: in the epilogue); bundler.targets.torch_aoti.nhwc_modules.SkipAddBlock.
TRITON_POINTWISE_EPILOGUES = ("raw", "skip")
#: ``torch_aoti.small_batch_layout``: the static graphs of at most 8 images in the
#: precision's own form ("same") or as the NHWC rewrite ("nhwc": timm_xception, whose
#: channels_last form is the faster at batch 32 and the rewrite at batch 1 on the H200).
TORCH_AOTI_SMALL_BATCH_LAYOUTS = ("same", "nhwc")
#: ``torch_aoti.static_batches``: at most this many batch sizes get a graph of their own (each
#: is one more AOTInductor compile at make time: about 2 minutes for ViT-B/16 on the H200).
MAX_STATIC_BATCHES = 8
#: ``torch_aoti.fp8_gemm``: how the torch-aoti fp8 engine runs its FP8 layers (the meaning
#: of each: bundler.targets.torch_aoti.fp8_layers.FP8_GEMMS); ``torch_aoti.fp8_fast_accum``:
#: torch._scaled_mm's ``use_fast_accum`` (Hopper's FP8 accumulation without the periodic
#: promotion to fp32).
TORCH_AOTI_FP8_GEMMS = ("rowwise", "tensorwise", "rowwise-fp16", "dequantized")
#: ``torch_aoti.fp8_conv``: how the torch-aoti fp8 engine runs dense k x k FP8 convolutions
#: (the meaning of each: bundler.targets.torch_aoti.fp8_layers.FP8_CONVS); "im2col" unless the
#: family names another; ``$TRT_BUNDLE_FP8_CONV`` overrides it for one build. For a layout
#: "as_is" family (Linear layers) only "triton-fused" means something: its transformer MLPs
#: run fc1 on the same Triton kernel with GELU and fc2's quantize fused
#: (bundler.targets.torch_aoti.fused_mlp).
TORCH_AOTI_FP8_CONVS = ("im2col", "triton", "triton-fused", "triton-fused-tma",
                        "triton-fused-tma-small", "triton-fused-tma-3x3")
#: The fused-bottleneck forms: "triton-fused-tma" is "triton-fused" with the dense 1x1
#: stride-1 layers on the TMA kernel (``kernels/fp8_conv_tma.py``; image families only),
#: except in the graphs of a small static batch; "triton-fused-tma-small" puts them on it
#: there too, with the tiles measured at that batch (``MEASURED_TMA_TILES_BY_BATCH``);
#: "triton-fused-tma-3x3" is "triton-fused-tma-small" with the 3x3 layers (and strided 1x1
#: ones) on the box TMA kernel too (``fp8_conv_box_tma``) outside the small static graphs,
#: where their feature maps have measured tiles (``MEASURED_BOX_TILES``).
TORCH_AOTI_FUSED_FP8_CONVS = ("triton-fused", "triton-fused-tma", "triton-fused-tma-small",
                              "triton-fused-tma-3x3")
#: The forms with TMA layers (Hopper or newer; exported with Dynamo).
TORCH_AOTI_TMA_FP8_CONVS = ("triton-fused-tma", "triton-fused-tma-small", "triton-fused-tma-3x3")
#: Of those, the forms whose small static graphs take TMA with their own tiles.
TORCH_AOTI_SMALL_TMA_FP8_CONVS = ("triton-fused-tma-small", "triton-fused-tma-3x3")
#: Of those, the forms whose k x k layers take the box kernel (``fp8_conv_box_tma``).
TORCH_AOTI_BOX_TMA_FP8_CONVS = ("triton-fused-tma-3x3",)
#: ``torch_aoti.fp8_pointwise_small_batch``: how the FP8 1x1 convolutions (a layout "as_is"
#: family's FP8 Linear layers: gemm or dequantized) run in a static-batch graph of at most 8
#: images (``torch_aoti.static_batches``; the meaning of each:
#: bundler.targets.torch_aoti.fp8_layers.SMALL_BATCH_POINTWISE); "gemm" unless named.
#: "triton-split-k": "triton", with the reduction of a Linear layer whose rows leave SMs idle
#: split in two (``kernels/fp8_split_k.py``; Linear layers only: a layout "as_is" family's).
TORCH_AOTI_SMALL_BATCH_POINTWISE = ("gemm", "triton", "dequantized", "triton-split-k")
#: The forms that run the Triton kernels (triton must be importable where they are built).
TORCH_AOTI_TRITON_SMALL_BATCH = ("triton", "triton-split-k")
#: The forms only Linear layers have (a layout "as_is" family's), not 1x1 convolutions.
TORCH_AOTI_LINEAR_ONLY_SMALL_BATCH = ("triton-split-k",)


@dataclass(frozen=True)
class TorchAotiSettings:
    """A family's ``torch_aoti`` section, read (``from_section``), defaults filled in."""

    #: the layout rule: "nhwc" (images) or "as_is" (tokens)
    layout: str = "nhwc"
    #: how the fp16 engine holds images (``TORCH_AOTI_FP16_LAYOUTS``)
    fp16_layout: str = "nhwc"
    #: how the fp8 engine holds images (``TORCH_AOTI_FP8_LAYOUTS``)
    fp8_layout: str = "nhwc"
    #: how the channels_last fp8 form runs depthwise convolutions (``TORCH_AOTI_FP8_DEPTHWISE``)
    fp8_depthwise: str = "cudnn"
    #: the FP8 1x1 layers the depthwise form "triton-skip" runs on the Triton implicit GEMM:
    #: (in channels, out channels, epilogue) -> tiles (measured per family and GPU by
    #: ``benchmarks/pointwise_kernel_bench.py``)
    fp8_triton_pointwise: Mapping[tuple[int, int, str], tuple[int, ...]] = field(
        default_factory=dict)
    #: the form of the static graphs of at most 8 images: "same" or "nhwc"
    small_batch_layout: str = "same"
    #: batch sizes compiled with a static batch: one list for every precision, or per precision
    static_batches: Any = ()
    #: how the fp8 engine runs its FP8 layers (``TORCH_AOTI_FP8_GEMMS``)
    fp8_gemm: str = "rowwise"
    #: how the fp8 engine runs dense k x k FP8 convolutions (``TORCH_AOTI_FP8_CONVS``)
    fp8_conv: str = "im2col"
    #: how FP8 1x1 convolutions (Linear layers) run in small static-batch graphs
    fp8_pointwise_small_batch: str = "gemm"
    #: whether the FP8 GEMMs use fast accumulation
    fp8_fast_accum: bool = False
    #: whether a fused ``fp8_conv`` form also fuses a timm ResNet's stem (its bias, ReLU,
    #: max pool and the first block's quantize in one kernel: ``fused.rewrite_fused``)
    fp8_fuse_stem: bool = False
    #: whether the runtime times cuDNN's algorithms in a CUDA graph's warm-up
    #: (``runtime_py.engines.torch_aoti.timed_cudnn_algorithms``), every precision: true
    #: (every graph size), false, or the batch sizes whose graphs it times (ascending)
    cudnn_benchmark: bool | tuple[int, ...] = False

    @classmethod
    def from_section(cls, section: Mapping[str, Any] | None) -> "TorchAotiSettings":
        """The settings of a section ``section_problems`` found nothing wrong with."""
        known = {f.name for f in fields(cls)}
        s = {k: v for k, v in (section or {}).items() if k in known}   # notes ignored
        entries = s.pop("fp8_triton_pointwise", None) or []
        table = {(int(e["in"]), int(e["out"]), str(e["epilogue"])): tuple(int(t) for t in e["tiles"])
                 for e in entries}
        sizes = s.pop("static_batches", ())
        sizes = (MappingProxyType({k: tuple(v) for k, v in sizes.items()})
                 if isinstance(sizes, Mapping) else tuple(sizes))
        timed = s.pop("cudnn_benchmark", False)
        timed = timed if isinstance(timed, bool) else tuple(sorted(timed))
        return cls(fp8_triton_pointwise=MappingProxyType(table), static_batches=sizes,
                   cudnn_benchmark=timed, **s)

    def image_layout(self, precision: str) -> str:
        """The layout form of the engine of ``precision`` for an image family: "nhwc" or
        "channels_last" (fp16: ``fp16_layout``, fp8: ``fp8_layout``; fp32 keeps the model
        as it is and is "nhwc" only when a caller asks)."""
        if precision == "fp16":
            return self.fp16_layout
        if precision == "fp8":
            return self.fp8_layout
        return "nhwc"

    def static_batches_for(self, precision: str) -> tuple[int, ...]:
        """Batch sizes the engine of ``precision`` also compiles with a static batch
        (ascending; empty: the one dynamic-batch graph). Inductor specializes kernels for
        static sizes, as ``torch.compile(dynamic=False)`` does (timm_xception: batches 1
        and 32 for fp16 and fp8, none for fp32)."""
        sizes = self.static_batches
        if isinstance(sizes, Mapping):
            sizes = sizes.get(precision, ())
        return tuple(sorted(sizes))


#: the settings of a section ``section_problems`` found nothing wrong with
from_section = TorchAotiSettings.from_section


def settings_of(family: Any) -> TorchAotiSettings:
    """``family``'s torch_aoti settings (``Family.target_settings``)."""
    return family.target_settings("torch-aoti")


def cudnn_benchmark_valid(value: Any) -> bool:
    """Whether ``torch_aoti.cudnn_benchmark`` is a form the runtime reads (true, false, or
    batch sizes: ``runtime_py.engines.torch_aoti.cudnn_timed_sizes``, the one rule)."""
    from runtime_py.engines.torch_aoti import cudnn_timed_sizes

    try:
        cudnn_timed_sizes(value)
    except ValueError:
        return False
    return value is not None


def cudnn_benchmark_record(value: bool | tuple[int, ...]) -> bool | list[int]:
    """The setting as the manifest records it (``compile_options.cudnn_benchmark``, when
    not false): true, or the batch sizes ascending (``runtime_py.engines.torch_aoti``'s
    ``cudnn_record``, whose form the runner reads back)."""
    from runtime_py.engines.torch_aoti import cudnn_record, cudnn_timed_sizes

    return cudnn_record(cudnn_timed_sizes(value if isinstance(value, bool) else list(value)))


def section_problems(aoti: Any, batch: Any) -> list[str]:
    """What is wrong with a family's ``torch_aoti`` section (all of it at once; ``batch``:
    the family's ``input.batch`` range)."""
    problems: list[str] = []
    if not (isinstance(aoti, dict) and aoti.get("layout", "nhwc") in TORCH_AOTI_LAYOUTS):
        return [f"torch_aoti.layout: must be one of {list(TORCH_AOTI_LAYOUTS)}"]
    if aoti.get("fp16_layout", "nhwc") not in TORCH_AOTI_FP16_LAYOUTS:
        problems.append(f"torch_aoti.fp16_layout: must be one of {list(TORCH_AOTI_FP16_LAYOUTS)}")
    if aoti.get("small_batch_layout", "same") not in TORCH_AOTI_SMALL_BATCH_LAYOUTS:
        problems.append("torch_aoti.small_batch_layout: must be one of "
                        f"{list(TORCH_AOTI_SMALL_BATCH_LAYOUTS)}")
    if aoti.get("fp8_layout", "nhwc") not in TORCH_AOTI_FP8_LAYOUTS:
        problems.append(f"torch_aoti.fp8_layout: must be one of {list(TORCH_AOTI_FP8_LAYOUTS)}")
    elif (aoti.get("fp8_layout") == "channels_last"
          and aoti.get("fp8_conv", "im2col") in TORCH_AOTI_FUSED_FP8_CONVS):
        problems.append("torch_aoti.fp8_layout: channels_last is a form of its own; "
                        f"fp8_conv {aoti.get('fp8_conv')} is another (channels_last with "
                        "fused bottlenecks): name one")
    if aoti.get("fp8_depthwise", "cudnn") not in TORCH_AOTI_FP8_DEPTHWISE:
        problems.append("torch_aoti.fp8_depthwise: must be one of "
                        f"{list(TORCH_AOTI_FP8_DEPTHWISE)}")
    elif (aoti.get("fp8_depthwise", "cudnn") != "cudnn"
          and aoti.get("fp8_layout", "nhwc") != "channels_last"):
        problems.append("torch_aoti.fp8_depthwise: a form of the channels_last fp8 model; "
                        "set fp8_layout channels_last, or leave fp8_depthwise out")
    problems += _triton_pointwise_problems(aoti.get("fp8_triton_pointwise"),
                                           aoti.get("fp8_depthwise", "cudnn"))
    if aoti.get("fp8_gemm", "rowwise") not in TORCH_AOTI_FP8_GEMMS:
        problems.append(f"torch_aoti.fp8_gemm: must be one of {list(TORCH_AOTI_FP8_GEMMS)}")
    if aoti.get("fp8_conv", "im2col") not in TORCH_AOTI_FP8_CONVS:
        problems.append(f"torch_aoti.fp8_conv: must be one of {list(TORCH_AOTI_FP8_CONVS)}")
    fuse_stem = aoti.get("fp8_fuse_stem", False)
    if not isinstance(fuse_stem, bool):
        problems.append("torch_aoti.fp8_fuse_stem: must be true or false")
    elif fuse_stem and aoti.get("fp8_conv", "im2col") not in TORCH_AOTI_FUSED_FP8_CONVS:
        problems.append("torch_aoti.fp8_fuse_stem: the stem is fused only in the fused "
                        f"bottleneck forms; set fp8_conv to one of "
                        f"{list(TORCH_AOTI_FUSED_FP8_CONVS)}, or leave fp8_fuse_stem out")
    if not cudnn_benchmark_valid(aoti.get("cudnn_benchmark", False)):
        problems.append("torch_aoti.cudnn_benchmark: must be true, false, or a list of the "
                        "batch sizes (positive integers, each once) whose graphs time it")
    small_gemm = aoti.get("fp8_pointwise_small_batch", "gemm")
    if small_gemm not in TORCH_AOTI_SMALL_BATCH_POINTWISE:
        problems.append("torch_aoti.fp8_pointwise_small_batch: must be one of "
                        f"{list(TORCH_AOTI_SMALL_BATCH_POINTWISE)}")
    elif (small_gemm in TORCH_AOTI_LINEAR_ONLY_SMALL_BATCH
          and aoti.get("layout", "nhwc") != "as_is"):
        problems.append(f"torch_aoti.fp8_pointwise_small_batch: {small_gemm} is the Linear "
                        "layers' form (a layout as_is family); convolutions take triton")
    conv = aoti.get("fp8_conv", "im2col")
    if aoti.get("layout", "nhwc") == "as_is" and conv == "triton":
        problems.append("torch_aoti.fp8_conv: a layout as_is family has no convolutions; "
                        "of the fp8_conv forms only triton-fused applies (fused MLPs)")
    elif aoti.get("layout", "nhwc") == "as_is" and conv in TORCH_AOTI_TMA_FP8_CONVS:
        problems.append(f"torch_aoti.fp8_conv: {conv} puts ResNet bottlenecks' 1x1 "
                        "convolutions on the TMA kernel; a layout as_is family's fused MLPs "
                        "are triton-fused")
    elif (aoti.get("layout", "nhwc") == "as_is" and conv == "triton-fused"
          and small_gemm != "gemm"):
        problems.append("torch_aoti.fp8_conv: the fused MLPs (triton-fused) have one form "
                        "at every batch; leave fp8_pointwise_small_batch out")
    if not isinstance(aoti.get("fp8_fast_accum", False), bool):
        problems.append("torch_aoti.fp8_fast_accum: must be true or false")
    problems += _static_batch_problems(aoti.get("static_batches", []), batch)
    return problems


def _static_batch_problems(sizes: Any, batch: Any) -> list[str]:
    """``torch_aoti.static_batches``: distinct sizes inside the family's batch range, for
    every precision (a list) or per precision (an object of lists)."""
    where = "torch_aoti.static_batches"
    if isinstance(sizes, Mapping):
        unknown = sorted(k for k in sizes if k not in KNOWN_PRECISIONS)
        if unknown:
            return [f"{where}: {unknown} are not precisions ({', '.join(KNOWN_PRECISIONS)})"]
        return [p.replace(where, f"{where}.{k}", 1)
                for k, v in sizes.items() for p in _static_batch_problems(v, batch)]
    if not (isinstance(sizes, list) and len(sizes) <= MAX_STATIC_BATCHES
            and all(isinstance(n, int) and not isinstance(n, bool) for n in sizes)):
        return [f"{where}: must be a list of at most {MAX_STATIC_BATCHES} batch sizes (integers)"]
    if len(set(sizes)) != len(sizes):
        return [f"{where}: {sizes} lists a size twice"]
    if None in (batch.min, batch.max):
        return []
    outside = [n for n in sizes if not batch.min <= n <= batch.max]
    if outside:
        return [f"{where}: {outside} outside input.batch {batch.min}..{batch.max}"]
    if sizes and batch.min == batch.max:
        return [f"{where}: the batch range {batch.min}..{batch.max} is static already"]
    return []


def _triton_pointwise_problems(entries: Any, depthwise: str) -> list[str]:
    """What is wrong with ``torch_aoti.fp8_triton_pointwise`` (a list of {"in", "out",
    "epilogue", "tiles"}), given the family's ``fp8_depthwise``: the table is what the form
    "triton-skip" reads, and that form has nothing to do without it."""
    where = "torch_aoti.fp8_triton_pointwise"
    if entries is None:
        return ([f"{where}: the depthwise form triton-skip needs this table of the 1x1 "
                 "layers to run on the Triton GEMM (benchmarks/pointwise_kernel_bench.py "
                 "measures it)"] if depthwise == "triton-skip" else [])
    if depthwise != "triton-skip":
        return [f"{where}: read by fp8_depthwise triton-skip only; set it, or leave the "
                "table out"]
    if not (isinstance(entries, list) and entries):
        return [f"{where}: must be a non-empty list of layers"]
    problems, seen = [], set()
    for i, e in enumerate(entries):
        ok = (isinstance(e, dict) and set(e) == {"in", "out", "epilogue", "tiles"}
              and all(type(e[k]) is int and e[k] > 0 for k in ("in", "out"))
              and e["epilogue"] in TRITON_POINTWISE_EPILOGUES
              and isinstance(e["tiles"], list) and len(e["tiles"]) == 6
              and all(type(t) is int and t > 0 for t in e["tiles"]))
        if not ok:
            problems.append(f"{where}[{i}]: must be {{\"in\": channels, \"out\": channels, "
                            f"\"epilogue\": one of {list(TRITON_POINTWISE_EPILOGUES)}, "
                            "\"tiles\": [block_m, block_n, block_k, warps, stages, group_m]}")
            continue
        key = (e["in"], e["out"], e["epilogue"])
        if key in seen:
            problems.append(f"{where}[{i}]: {key} is listed twice")
        seen.add(key)
    return problems
