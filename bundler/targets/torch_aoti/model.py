"""The family's torch model rewritten for the torch-aoti engine: channels-last, FP8 GEMMs.

Why a rewrite and not ``torch.compile`` of the model as it is: the FP8 recipe quantizes
1x1 convolutions, and the fast FP8 kernels on Hopper are matrix multiplications
(``torch._scaled_mm``, cuBLASLt) on row-major ``[pixels, channels]`` operands. A 1x1
convolution on an NHWC tensor *is* such a product with no data movement, so this module
keeps every activation NHWC (logically, not as a strided NCHW view) from the stem to the
head:

* 1x1 convolutions the recipe selects -> ``Fp8Pointwise``: quantize (fp32 division by the
  calibrated per-tensor scale, saturate to +-448, round to nearest even, as ONNX
  ``QuantizeLinear`` does), ``_scaled_mm`` against the per-output-channel quantized weight
  with the activation scale, the per-channel weight scales and the bias applied in the
  GEMM's own epilogue (rowwise scaling; bf16 out, or fp16 out with ``rowwise-fp16``,
  which timm_xception and timm_vit_base name; ``FP8_GEMMS``). The activation scale is folded into the
  per-channel row, so the row-scale operand is a slice of one column of ones shared by
  all GEMMs (``OnesColumn``): no kernel builds it.
  Channel counts are padded to multiples of ``FP8_ALIGN`` inside the module (728 -> 736):
  the pad is fused into the quantize (zeros), the weight's padded rows are zero, and the
  output's padded columns are dropped by a free slice (or, with ``rewrite_nhwc``'s
  ``pad_channels``, the padded width is carried from module to module instead);
* depthwise convolutions -> ``DepthwiseNHWC``: the k x k taps written as shifted slices,
  multiplied and summed. Inductor turns that (with the zero padding, the preceding ReLU
  and the *following quantize*) into one Triton kernel, which is the point: cuDNN's
  depthwise kernel is opaque to Inductor, so the quantize after it would be a separate
  pass over the activations. In the ``fp8-depthwise`` variant its input and weights are
  quantized-dequantized as the ONNX graph does (there is no FP8 depthwise kernel);
* dense k x k convolutions the recipe selects (timm_resnet50's 3x3) -> ``Fp8ConvNHWC``:
  im2col by shifted slices, then the same FP8 GEMM; or, with ``fp8_conv="triton"``
  (``FP8_CONVS``), the quantize and an implicit-GEMM Triton kernel that reads the taps in
  place (``kernels/fp8_conv.py``);
* other convolutions (the stem) -> ``ConvNHWC`` (cuDNN through a permuted view), other
  1x1 convolutions -> ``PointwiseNHWC`` (a plain matmul), the global average pool ->
  ``GlobalAvgPoolNHWC``, max/average pools -> ``NCHWView`` (the pool on the NCHW view).

The channels_last form (``rewrite_channels_last``, family.json ``torch_aoti.fp8_layout:
channels_last``) keeps the model as it is, in fp16 and channels_last memory (the layout a
``torch.compile`` user runs: cuDNN's convolutions on NHWC strides), and puts only the
selected layers in the modules above, each applied to the NHWC view of its input
(``ChannelsLastView``: a channels_last NCHW tensor *is* a contiguous NHWC one, so the
permutes are views).

Families whose activations are not images (timm_vit_base: tokens) keep their layout
(``rewrite_as_is``, family layout rule ``"as_is"``): their selected Linear layers become
``Fp8Linear``, the same FP8 GEMM over the last axis, and a patch embedding (a
convolution whose kernel is its stride) becomes one GEMM over the patches (``PatchGemm``).

Other modules are kept as they are (activations, dropout, containers); channel norms are
refused by name (``rewrite_nhwc``); and ``check_rewrite`` compares the rewritten fp32 model
with the original on one input, so a module whose ``forward`` is not layout-agnostic is
caught. A family may replace modules itself (``family.py``'s ``nhwc_module`` hook).

Where each piece is: the FP8 GEMM layers (``Fp8Pointwise``, ``Fp8Linear``,
``Fp8ConvNHWC``, ``OnesColumn``) and their scales, which are the graph's bit for bit, in
``fp8_layers.py``; the layout modules (``DepthwiseNHWC``, ``ChannelsLastView``,
``PatchGemm``, ``EngineModule``, ...) in ``nhwc_modules.py``; this module holds the
rewrites that put them in place of the family's modules (``rewrite_nhwc``,
``rewrite_channels_last``, ``rewrite_as_is``) and the checks of a rewrite
(``check_rewrite``, ``shape_pass``).

This module imports torch: it is imported only when a torch-aoti engine is built.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from bundler.targets.torch_aoti.fp8_layers import (ROWWISE_GEMMS, Fp8ConvNHWC, Fp8Gemm, Fp8Linear,
                                                   Fp8Pointwise, OnesColumn, fp8_conv_kernel,
                                                   padded)
from bundler.targets.torch_aoti.nhwc_modules import (ChannelsLastView, ConvNHWC, DepthwiseE4m3,
                                                     DepthwiseNHWC, EngineModule,
                                                     GlobalAvgPoolNHWC, NCHWView, PatchGemm,
                                                     PointwiseNHWC, SkipAddBlock, is_patchify)
from bundler.targets.torch_aoti.settings import (TORCH_AOTI_FP8_DEPTHWISE,
                                                 TORCH_AOTI_TRITON_DEPTHWISE,
                                                 TORCH_AOTI_TRITON_SMALL_BATCH)
from runtime_py.errors import UsageError

__all__ = ["map_nodes_to_modules", "rewrite_nhwc", "rewrite_channels_last", "feeds_fp8_gemm",
           "rewrite_as_is", "fp8_gemm_rows", "shape_pass", "check_rewrite",
           "CHANNELS_LAST_DEPTHWISE"]

#: Spatial layers with no channel arithmetic: run on the NCHW view of NHWC data (``NCHWView``).
_SPATIAL = (nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveMaxPool2d, nn.AdaptiveAvgPool2d)
#: Layers that mix along the channel axis of NCHW data and that the rewrite cannot lay out.
_CHANNEL_NORMS = (nn.modules.batchnorm._BatchNorm, nn.GroupNorm,
                  nn.modules.instancenorm._InstanceNorm, nn.LocalResponseNorm)


# --- ONNX node -> torch module -----------------------------------------------------------

def map_nodes_to_modules(model: torch.nn.Module, nodes: list[str],
                         weights: Mapping[str, np.ndarray] | None = None) -> dict[str, str]:
    """ONNX node name -> torch module path, for the selected layers (Conv2d, Linear).

    The exporter names a parameter node by its module path (``bundler.export``), so the
    name is looked up first. Should a node name not be a module path (another exporter),
    ``weights`` (node -> fp32 kernel from the fp32 graph) is matched against every
    convolution's kernel. Raises UsageError naming the nodes that match no module.
    """
    convs = {n: m for n, m in model.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))}
    found: dict[str, str] = {}
    missing = []
    for node in nodes:
        path = node.removesuffix(".weight")
        if path in convs:
            found[node] = path
            continue
        if weights is not None and node in weights:
            w = np.asarray(weights[node], np.float32)
            hits = [n for n, m in convs.items()
                    if tuple(m.weight.shape) == w.shape
                    and np.allclose(m.weight.detach().float().cpu().numpy(), w, rtol=0, atol=1e-6)]
            if len(hits) == 1:
                found[node] = hits[0]
                continue
        missing.append(node)
    if missing:
        raise UsageError(f"{len(missing)} fp8-selected ONNX node(s) match no layer of the "
                         f"torch model (first: {missing[0]!r}); the exporter's naming changed",
                         problems=missing)
    return found


def _pointwise_on_triton(body: nn.Module, table: Mapping[tuple[int, int, str], tuple]
                         ) -> dict[str, int]:
    """The layers of ``body`` that ``table`` names run on the Triton kernel: the blocks
    whose last layer it names as "skip" become ``SkipAddBlock``s, the GEMMs that hand over
    their raw output it names as "raw" switch kernels. How many of each.

    ``table``: (in channels, out channels, "raw" or "skip") -> the kernel's tiles
    (``kernels.fp8_conv.Fp8ConvConfig`` fields); a family's ``torch_aoti.
    fp8_triton_pointwise``, measured per layer shape with its epilogue against cuBLASLt
    (``benchmarks/pointwise_kernel_bench.py``): on the H200 the Triton kernel won on
    timm_xception's narrow entry layers (up to 1.67x with the skip add) and lost on its
    728-channel ones (0.61-0.87x), docs/measurements/h200-2026-12-04."""
    blocks = []
    for name, m in body.named_modules():
        if name and SkipAddBlock.applies(m):
            pw = m.stack[-1].conv_pw.layer
            if (pw.cin, pw.cout, "skip") in table:
                blocks.append((name, table[(pw.cin, pw.cout, "skip")]))
    for name, tiles in blocks:
        body.set_submodule(name, SkipAddBlock(body.get_submodule(name), tiles))
    raw = [m for m in body.modules() if isinstance(m, Fp8Pointwise) and m.raw_out
           and m.stride == (1, 1) and (m.cin, m.cout, "raw") in table]
    for m in raw:
        m.run_on_triton(table[(m.cin, m.cout, "raw")])
    return {"skip": len(blocks), "raw": len(raw)}


def _patchify_as_gemms(body: nn.Module) -> None:
    """Replace, in ``body``, every patchifying convolution by a ``PatchGemm``."""
    for name in [n for n, m in body.named_modules() if n and is_patchify(m)]:
        body.set_submodule(name, PatchGemm(body.get_submodule(name)))




def _global_pool(module) -> Any:
    """The NHWC replacement of a global average pool, or None if ``module`` is not one."""
    kind = type(module).__name__
    if kind == "SelectAdaptivePool2d" and getattr(module, "pool_type", "") == "avg":
        flatten = not isinstance(getattr(module, "flatten", nn.Identity()), nn.Identity)
        return GlobalAvgPoolNHWC(flatten)
    if isinstance(module, nn.AdaptiveAvgPool2d) and module.output_size in (1, (1, 1)):
        return GlobalAvgPoolNHWC(False)
    return None


def _check_small_batch_kernel(small_batch_pointwise: str, fp8: bool, emulate: bool) -> None:
    """Refuse, by name and before any work, a Triton small-batch form where triton is
    missing (both rewrites' FP8 GEMM layers take it)."""
    if small_batch_pointwise in TORCH_AOTI_TRITON_SMALL_BATCH and fp8 and not emulate:
        fp8_conv_kernel("triton")


def _rewrite_start(model: torch.nn.Module, fp8: Mapping, fp8_depthwise: Mapping, *,
                   fp8_conv: str, small_batch_pointwise: str, emulate: bool,
                   fp8_rows: int | None, fp8_gemm: str):
    """(copy of ``model``, its modules by path, the shared ones column or None) for a
    rewrite, after refusing unknown kernels and fp8 paths that are not in the model."""
    fp8_conv_kernel(fp8_conv, emulate=True)          # a known name, before any work
    _check_small_batch_kernel(small_batch_pointwise, bool(fp8), emulate)
    ones = OnesColumn(fp8_rows) if fp8 and fp8_rows and fp8_gemm in ROWWISE_GEMMS else None
    body = copy.deepcopy(model).eval()
    modules = dict(body.named_modules())
    unknown = sorted(set(fp8) - set(modules)) + sorted(set(fp8_depthwise) - set(modules))
    if unknown:
        raise UsageError(f"fp8 modules not in the model: {unknown[:5]}")
    return body, modules, ones


def _fp8_conv_module(name: str, conv: nn.Conv2d, scales: tuple[float, Any], problems: list[str],
                     *, dtype: torch.dtype, emulate: bool, fast_accum: bool, gemm: str,
                     ones: OnesColumn | None, conv_kernel: str, small_batch_kernel: str,
                     padded_io: bool = False) -> nn.Module | None:
    """The NHWC FP8 module of a selected dense convolution (1x1: ``Fp8Pointwise``, k x k:
    ``Fp8ConvNHWC``); None, with the problem noted, for a grouped one."""
    if conv.groups != 1:
        problems.append(f"{name}: fp8 selects a grouped convolution (fp8-depthwise "
                        "variants quantize depthwise ones)")
        return None
    if conv.kernel_size == (1, 1) and conv.padding in ((0, 0), "valid"):
        return Fp8Pointwise(conv, *scales, dtype=dtype, emulate=emulate, fast_accum=fast_accum,
                            gemm=gemm, padded_io=padded_io, ones=ones,
                            small_batch_kernel=small_batch_kernel)
    return Fp8ConvNHWC(conv, *scales, dtype=dtype, emulate=emulate, fast_accum=fast_accum,
                       gemm=gemm, ones=ones, conv_kernel=conv_kernel)


def _rewrite_finish(body: torch.nn.Module, replaced: Mapping[str, nn.Module],
                    problems: list[str], dtype: torch.dtype) -> None:
    """Refuse with every problem found, else put the ``replaced`` modules into ``body`` and
    cast the leaves not replaced to ``dtype``."""
    if problems:
        raise UsageError("cannot build the torch-aoti engine model: " + "; ".join(problems[:5]),
                         problems=problems)
    for name, new in replaced.items():
        body.set_submodule(name, new)
    for name, m in body.named_modules():
        if (not list(m.children()) and name not in replaced
                and not any(name.startswith(r + ".") for r in replaced)):
            m.to(dtype)


def rewrite_nhwc(model: torch.nn.Module, dtype: torch.dtype, *,
                 fp8: Mapping[str, tuple[float, Any]] | None = None,
                 fp8_depthwise: Mapping[str, tuple[float, Any]] | None = None,
                 emulate: bool = False, fast_accum: bool = False,
                 fp8_gemm: str = "rowwise", pad_channels: bool = False,
                 fp8_rows: int | None = None, fp8_conv: str = "im2col",
                 small_batch_pointwise: str = "gemm", hook=None) -> torch.nn.Module:
    """A copy of ``model`` (BN-folded, eval) computing NHWC in ``dtype``.

    ``fp8_rows`` (rowwise GEMMs): the most rows any FP8 GEMM will see (``fp8_gemm_rows``);
    given, the GEMMs share one column of ones as their row scale (``OnesColumn``) and the
    model refuses larger inputs; not given, each GEMM builds its row-scale column (one
    kernel per GEMM per inference).

    ``pad_channels``: every convolution output whose channel count is not a multiple of
    ``FP8_ALIGN`` keeps the padded count (728 -> 736, zeros in the padding) and every
    convolution that reads one takes it as it is, so FP8 GEMMs need no pad before their
    quantize and no slice after them. Convolutions other than 1x1 and depthwise
    (``ConvNHWC``: the stem) read unpadded inputs, as does the classifier: a model whose
    padded tensor reaches one of them fails ``check_rewrite``. The torch-aoti target turns
    it on for fp8 engines (``default_pad_channels``: 1.24 ms less Triton work at batch 32
    on the H200, families/timm_xception/README.md).

    ``fp8``: module path -> (activation scale, per-channel weight scales) of the dense
    convolutions to run as FP8 GEMMs (1x1: ``Fp8Pointwise``; k x k: ``Fp8ConvNHWC``);
    ``fp8_depthwise``: the same for depthwise convolutions to quantize-dequantize (variant
    fp8-depthwise). ``fp8_conv`` (``FP8_CONVS``): how the k x k ones run
    (``fp8_conv_kernel``); ``small_batch_pointwise`` (``SMALL_BATCH_POINTWISE``): how the 1x1
    ones run in a graph traced for a small static batch (``Fp8Pointwise``). ``hook(name, module, dtype)``: the family's own NHWC replacement
    (``family.py``'s ``nhwc_module``), asked first; None keeps the rules here.

    The layout rules: convolutions and global average pools are replaced; spatial layers
    (``_SPATIAL``: max and average pools) run on the NCHW view of the NHWC data
    (``NCHWView``); channel norms are refused by name (a folded model has none); every
    other leaf (activations, dropout, Linear on the last axis) is kept as it is, and
    ``check_rewrite`` compares the result with the model, so a layer or container whose
    ``forward`` depends on the layout is caught there.
    """
    fp8, fp8_depthwise = dict(fp8 or {}), dict(fp8_depthwise or {})
    body, modules, ones = _rewrite_start(model, fp8, fp8_depthwise, fp8_conv=fp8_conv,
                                         small_batch_pointwise=small_batch_pointwise,
                                         emulate=emulate, fp8_rows=fp8_rows, fp8_gemm=fp8_gemm)
    replaced: dict[str, nn.Module] = {}
    problems = []

    def width(c: int) -> int:
        return padded(c) if pad_channels else c

    for name, m in modules.items():
        if not name or any(name.startswith(r + ".") for r in replaced):
            continue
        new = hook(name, m, dtype) if hook is not None else None
        if new is not None:
            pass
        elif isinstance(m, nn.Conv2d):
            depthwise = m.groups == m.in_channels == m.out_channels and m.groups > 1
            pointwise = m.kernel_size == (1, 1) and m.groups == 1 and m.padding in ((0, 0), "valid")
            if name in fp8:
                new = _fp8_conv_module(name, m, fp8[name], problems, dtype=dtype,
                                       emulate=emulate, fast_accum=fast_accum, gemm=fp8_gemm,
                                       ones=ones, conv_kernel=fp8_conv,
                                       small_batch_kernel=small_batch_pointwise,
                                       padded_io=pad_channels)
            elif depthwise:
                a, w = fp8_depthwise.get(name, (None, None))
                new = DepthwiseNHWC(m, dtype, a, w, channels=width(m.out_channels))
            elif name in fp8_depthwise:
                problems.append(f"{name}: fp8-depthwise selects a convolution that is not depthwise")
            elif pointwise:
                new = PointwiseNHWC(m, dtype, width(m.in_channels), width(m.out_channels))
            else:
                new = ConvNHWC(m, dtype, width(m.out_channels))
        elif (pool := _global_pool(m)) is not None:
            new = pool
        elif isinstance(m, _SPATIAL):
            new = NCHWView(m)
        elif isinstance(m, _CHANNEL_NORMS):
            problems.append(f"{name}: {type(m).__name__} has no NHWC form in the torch-aoti rewrite")
        elif name in fp8:
            problems.append(f"{name}: fp8 selects a {type(m).__name__}, which the NHWC rewrite "
                            "does not quantize")
        if new is not None:
            replaced[name] = new
    _rewrite_finish(body, replaced, problems, dtype)     # the leaves kept (fc): to dtype
    return body.eval().requires_grad_(False)


#: How ``rewrite_channels_last`` runs depthwise convolutions: "cudnn" (the model's own,
#: as the fp16 channels_last engine and a torch.compile user run them), "slices"
#: (``DepthwiseNHWC``: shifted slices, which Inductor fuses with the quantize after them)
#: or "triton" (those that feed an FP8 GEMM directly: ``DepthwiseE4m3``, one Triton
#: kernel writing the GEMM's e4m3 rows; the others stay cuDNN's) or "triton-rows" (the
#: same, its stride-1 layers on the kernel's row-strip tile, ``kernels.dw_conv.
#: ROW_STRIP_CONFIG``: each input row loaded once instead of three times; 3% slower than
#: "triton" over the 728x19x19 layers on the H200, kept to compare) or "triton-skip"
#: ("triton", and the 1x1 layers that measured faster on the Triton implicit GEMM than on
#: cuBLASLt run on it, a block's last one with the skip add in its epilogue: the family's
#: ``torch_aoti.fp8_triton_pointwise``, ``SkipAddBlock``); family.json
#: ``torch_aoti.fp8_depthwise``.
CHANNELS_LAST_DEPTHWISE = TORCH_AOTI_FP8_DEPTHWISE


def feeds_fp8_gemm(body: nn.Module, name: str, fp8: Mapping) -> tuple[str, str | None] | None:
    """(path of the FP8 1x1 layer that depthwise convolution ``name`` feeds, path of a ReLU
    between them or None), or None. The rule is the separable convolution's shape (timm's
    ``SeparableConv2d``): a ``conv_dw``, then ``bn_dw`` (Identity after BatchNorm folding)
    and ``act_dw`` (Identity or ReLU), then a ``conv_pw`` the recipe selects."""
    parent_name, _, child = name.rpartition(".")
    if child != "conv_dw":
        return None
    parent = body.get_submodule(parent_name) if parent_name else body
    prefix = f"{parent_name}." if parent_name else ""
    conv_pw = getattr(parent, "conv_pw", None)
    bn, act = getattr(parent, "bn_dw", None), getattr(parent, "act_dw", None)
    if not (type(parent).__name__ == "SeparableConv2d" and prefix + "conv_pw" in fp8
            and isinstance(conv_pw, nn.Conv2d) and conv_pw.kernel_size == (1, 1)
            and conv_pw.groups == 1 and isinstance(bn, nn.Identity)
            and isinstance(act, (nn.Identity, nn.ReLU))):
        return None
    return prefix + "conv_pw", (prefix + "act_dw" if isinstance(act, nn.ReLU) else None)


def rewrite_channels_last(model: torch.nn.Module, dtype: torch.dtype, *,
                          fp8: Mapping[str, tuple[float, Any]] | None = None,
                          fp8_depthwise: Mapping[str, tuple[float, Any]] | None = None,
                          emulate: bool = False, fast_accum: bool = False,
                          fp8_gemm: str = "rowwise", fp8_rows: int | None = None,
                          fp8_conv: str = "im2col", small_batch_pointwise: str = "gemm",
                          depthwise: str = "cudnn",
                          triton_pointwise: Mapping[tuple[int, int, str], tuple] | None = None
                          ) -> torch.nn.Module:
    """A copy of ``model`` (BN-folded, eval) in ``dtype`` and channels_last memory with the
    ``fp8`` convolutions as the NHWC rewrite's FP8 modules (1x1: ``Fp8Pointwise``, dense
    k x k: ``Fp8ConvNHWC``) and the ``fp8_depthwise`` ones quantized-dequantized
    (``DepthwiseNHWC``), each on the NHWC view of its input (``ChannelsLastView``).

    Why: the NHWC rewrite runs every layer as Inductor code (depthwise convolutions as
    shifted slices, 1x1 as matmuls), which on the H200 left timm_xception's fp16 engine
    slower at batch 32 than the same model in channels_last memory under torch.compile
    (5.58 against 4.28 ms, docs/measurements/h200-2026-12-02-e). Here everything but the
    FP8 layers is the model as that user runs it, so the FP8 GEMMs add to that form
    instead of to the rewrite. The price: a quantize pass after a cuDNN convolution,
    which Inductor cannot fuse into it (``depthwise="slices"`` runs depthwise
    convolutions as ``DepthwiseNHWC`` instead, where it can; ``depthwise="triton"`` runs
    those that feed an FP8 GEMM as ``DepthwiseE4m3``, convolution and quantize in one
    kernel: timm_xception's fp8 engine 3.61 against 3.88 ms at batch 32 on the H200).

    The arguments mean what they mean for ``rewrite_nhwc``; channel counts are not
    carried padded (each FP8 layer pads into its quantize and slices its output).
    ``triton_pointwise``: "triton-skip"'s table of the 1x1 layers on the Triton kernel
    (``_pointwise_on_triton``; family.json ``torch_aoti.fp8_triton_pointwise``).
    """
    if depthwise not in CHANNELS_LAST_DEPTHWISE:
        raise UsageError(f"depthwise form {depthwise!r}: choose one of "
                         f"{', '.join(CHANNELS_LAST_DEPTHWISE)}")
    fp8, fp8_depthwise = dict(fp8 or {}), dict(fp8_depthwise or {})
    if depthwise == "triton-skip" and fp8 and not triton_pointwise:
        raise UsageError("depthwise form triton-skip runs the 1x1 layers of a table on the "
                         "Triton GEMM, and none was given: set the family's "
                         "torch_aoti.fp8_triton_pointwise (benchmarks/pointwise_kernel_bench.py "
                         "measures it), or use depthwise triton")
    if depthwise in TORCH_AOTI_TRITON_DEPTHWISE and fp8_depthwise:
        raise UsageError("depthwise form triton writes e4m3 from fp16 depthwise convolutions; "
                         "the fp8-depthwise recipe quantizes them itself: use cudnn or slices")
    if depthwise in TORCH_AOTI_TRITON_DEPTHWISE and not emulate:
        from bundler.targets.torch_aoti.kernels import available

        ok, why = available()
        if not ok:
            raise UsageError(f"depthwise form triton was asked for, but {why}: install the "
                             "triton that matches this torch, or use depthwise cudnn")
    body, modules, ones = _rewrite_start(model, fp8, fp8_depthwise, fp8_conv=fp8_conv,
                                         small_batch_pointwise=small_batch_pointwise,
                                         emulate=emulate, fp8_rows=fp8_rows, fp8_gemm=fp8_gemm)
    replaced: dict[str, nn.Module] = {}
    problems = []
    for name, m in modules.items():
        if not isinstance(m, nn.Conv2d):
            if name in fp8 or name in fp8_depthwise:
                problems.append(f"{name}: fp8 selects a {type(m).__name__}, which the "
                                "channels_last form does not quantize")
            continue
        dw = m.groups == m.in_channels == m.out_channels and m.groups > 1
        triton_dw = dw and depthwise in TORCH_AOTI_TRITON_DEPTHWISE
        feeds = feeds_fp8_gemm(body, name, fp8) if triton_dw else None
        if feeds is not None:
            pw, relu = feeds
            replaced[name] = ChannelsLastView(DepthwiseE4m3(
                m, fp8[pw][0], padded(modules[pw].in_channels), relu=relu is not None,
                row_strips=depthwise == "triton-rows"))
            if relu is not None:                      # in the kernel now
                replaced[relu] = nn.Identity()
            continue
        if name in fp8:
            new = _fp8_conv_module(name, m, fp8[name], problems, dtype=dtype, emulate=emulate,
                                   fast_accum=fast_accum, gemm=fp8_gemm, ones=ones,
                                   conv_kernel=fp8_conv,
                                   small_batch_kernel=small_batch_pointwise)
            if new is None:
                continue
        elif name in fp8_depthwise and not dw:
            problems.append(f"{name}: fp8-depthwise selects a convolution that is not depthwise")
            continue
        elif name in fp8_depthwise or (dw and depthwise == "slices"):
            a, w = fp8_depthwise.get(name, (None, None))
            new = DepthwiseNHWC(m, dtype, a, w)
        else:
            continue
        replaced[name] = ChannelsLastView(new)
    if depthwise in TORCH_AOTI_TRITON_DEPTHWISE:
        _relus_into_depthwise(body, replaced)
    _rewrite_finish(body, replaced, problems, dtype)     # the model's own leaves: to dtype
    if depthwise == "triton-skip" and fp8:
        _pointwise_on_triton(body, triton_pointwise)
    return body.to(memory_format=torch.channels_last).eval().requires_grad_(False)


def _relus_into_depthwise(body: nn.Module, replaced: dict[str, nn.Module]) -> None:
    """In each ``nn.Sequential`` of ``body`` (timm's Xception blocks: ReLU, separable
    convolution, ReLU, ...): a ReLU right before a separable convolution whose depthwise
    half is ``DepthwiseE4m3`` moves into it (``relu_in``, applied as it loads; the ReLU
    becomes Identity), and where the child before that ReLU is a separable convolution
    whose 1x1 half is an FP8 GEMM with nothing after it, that GEMM hands over its raw
    output (``raw_out``): the convert-and-ReLU pass between them is gone. Inside a
    Sequential each output has one reader, the next child, so nothing else sees the change."""
    def sub(prefix: str, key: str) -> str:
        return f"{prefix}.{key}" if prefix else key

    for seq_name, seq in body.named_modules():
        if not isinstance(seq, nn.Sequential):
            continue
        keys = list(seq._modules)
        for i in range(1, len(keys)):
            dw = replaced.get(sub(sub(seq_name, keys[i]), "conv_dw"))
            if not (isinstance(seq._modules[keys[i - 1]], nn.ReLU)
                    and isinstance(dw, ChannelsLastView) and isinstance(dw.layer, DepthwiseE4m3)):
                continue
            replaced[sub(seq_name, keys[i - 1])] = nn.Identity()
            dw.layer.relu_in = True
            if i < 2:
                continue
            before = seq._modules[keys[i - 2]]
            pw = replaced.get(sub(sub(seq_name, keys[i - 2]), "conv_pw"))
            if (type(before).__name__ == "SeparableConv2d" and isinstance(pw, ChannelsLastView)
                    and isinstance(pw.layer, Fp8Gemm)
                    and all(isinstance(getattr(before, n, None), nn.Identity)
                            for n in ("bn_pw", "act_pw"))):
                pw.layer.raw_out = True
                dw.layer.raw_in = True


def _gemm_rows(out: torch.Tensor) -> int:
    """The GEMM rows of one image's layer output: H*W of an NCHW convolution output, the
    tokens of a Linear's [1, T, features] output."""
    return int(out.numel() // (out.shape[1] if out.dim() == 4 else out.shape[-1]))


def rewrite_as_is(model: torch.nn.Module, dtype: torch.dtype, *,
                  fp8: Mapping[str, tuple[float, Any]] | None = None, emulate: bool = False,
                  fast_accum: bool = False, fp8_gemm: str = "rowwise",
                  fp8_rows: int | None = None,
                  small_batch_pointwise: str = "gemm",
                  fp8_conv: str = "im2col") -> torch.nn.Module:
    """A copy of ``model`` in ``dtype``, its layout as it is (a transformer's tokens are
    already row-major ``[tokens, features]`` GEMM operands), with the ``fp8`` Linear
    layers (module path -> (activation scale, weight scales)) as ``Fp8Linear`` and its
    patch embedding (a convolution whose kernel is its stride) as ``PatchGemm``. The family
    layout rule ``"as_is"`` (``family.json`` ``torch_aoti.layout``);
    ``small_batch_pointwise``: the layers' form in small static-batch graphs
    (``Fp8Linear``: "gemm", "dequantized" or "triton"). ``fp8_conv="triton-fused"``: every transformer
    MLP whose fc1 and fc2 are FP8 runs fc1 on the Triton FP8 kernel with GELU and fc2's
    input quantize in its epilogue (``fused_mlp.FusedMlp``); the other modes have no
    convolution to act on here."""
    fp8 = dict(fp8 or {})
    _check_small_batch_kernel(small_batch_pointwise, bool(fp8), emulate)
    ones = OnesColumn(fp8_rows) if fp8 and fp8_rows and fp8_gemm in ROWWISE_GEMMS else None
    body = copy.deepcopy(model).eval().to(dtype)
    modules = dict(body.named_modules())
    problems = [f"{p}: not a Linear layer of the model" for p in fp8
                if not isinstance(modules.get(p), nn.Linear)]
    if problems:
        raise UsageError("cannot build the torch-aoti engine model: " + "; ".join(problems[:5]),
                         problems=problems)
    _patchify_as_gemms(body)
    for name, (act, weights) in fp8.items():
        linear = copy.deepcopy(model.get_submodule(name))     # the fp32 kernel, as the graph
        body.set_submodule(name, Fp8Linear(linear, act, weights, dtype, emulate=emulate,
                                           fast_accum=fast_accum, gemm=fp8_gemm, ones=ones,
                                           small_batch_kernel=small_batch_pointwise))
    if fp8 and fp8_conv == "triton-fused":
        from bundler.targets.torch_aoti.fused_mlp import fuse_mlps

        if small_batch_pointwise != "gemm":
            raise UsageError("the fused MLPs (fp8_conv triton-fused) have one form at every "
                             "batch: leave fp8_pointwise_small_batch out")
        if not fuse_mlps(body, model, fp8, dtype, emulate=emulate, fast_accum=fast_accum,
                         gemm=fp8_gemm, ones=ones):
            raise UsageError("fp8_conv triton-fused fuses transformer MLPs whose fc1 and fc2 "
                             "are both FP8; this model has none: leave fp8_conv out")
    return body.requires_grad_(False)


def fp8_gemm_rows(model: torch.nn.Module, paths: list[str], input_shape: tuple[int, ...],
                  max_batch: int) -> int:
    """The most rows (pixels) any of the convolutions at ``paths`` outputs for a batch of
    ``max_batch``: what ``rewrite_nhwc``'s shared ones column must hold.

    A shape-only pass (meta tensors: no memory, no arithmetic) of ``model`` on one input
    of ``input_shape``, reading each convolution's output size.
    """
    if not paths:
        return 0
    pixels = shape_pass(model, paths, input_shape, lambda _inputs, out: _gemm_rows(out))
    return int(max_batch) * max(pixels.values())


def shape_pass(model: torch.nn.Module, paths: list[str], input_shape: tuple[int, ...],
               read) -> dict[str, Any]:
    """Module path -> ``read(inputs, output)`` of the modules at ``paths``, from a
    shape-only pass (meta tensors: no memory, no arithmetic) of a copy of ``model`` on one
    input of ``input_shape``. Raises UsageError naming paths that are not in the model."""
    probe = copy.deepcopy(model).to("meta").eval()
    modules = dict(probe.named_modules())
    missing = [p for p in paths if p not in modules]
    if missing:
        raise UsageError(f"fp8 modules not in the model: {missing[:5]}")
    found: dict[str, Any] = {}
    hooks = [modules[p].register_forward_hook(
        lambda _m, inputs, out, p=p: found.__setitem__(p, read(inputs, out)))
        for p in paths]
    try:
        with torch.no_grad():
            probe(torch.empty(1, *input_shape, device="meta"))
    finally:
        for h in hooks:
            h.remove()
    return found


def check_rewrite(model: torch.nn.Module, x: torch.Tensor, rtol: float = 1e-3, *,
                  pad_channels: bool = False, hook=None) -> float:
    """Relative max difference between ``model`` and its fp32 NHWC rewrite on ``x``.

    Raises UsageError above ``rtol``: then some container's ``forward`` is not
    layout-agnostic (it concatenates, reshapes or pools along NCHW's axes).
    """
    nhwc = EngineModule(rewrite_nhwc(model, torch.float32, pad_channels=pad_channels, hook=hook),
                        torch.float32, True).to(x.device)
    with torch.no_grad():
        ref = model(x).float()
        got = nhwc(x)
    err = float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-12))
    if not math.isfinite(err) or err > rtol:
        raise UsageError(f"the NHWC rewrite of the model differs from it (relative max "
                         f"difference {err:.3g} > {rtol:g}): a module's forward depends on the "
                         "NCHW layout; this family cannot use the torch-aoti fp8 engine as is")
    return err
