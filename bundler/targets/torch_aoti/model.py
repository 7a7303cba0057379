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

Scales: exactly those of the bundle's ``calibration.safetensors``, which are the ones the
ONNX graph stores (the one rule ``bundler.fp8.stored_scale``), and the weights are
quantized with ``bundler.fp8.quantize`` from the fp16 kernels: the FP8 operands are
bit-identical to the graph's.

This module imports torch: it is imported only when a torch-aoti engine is built.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bundler.targets.torch_aoti.settings import (TORCH_AOTI_FP8_CONVS, TORCH_AOTI_FP8_DEPTHWISE,
                                                 TORCH_AOTI_FP8_GEMMS,
                                                 TORCH_AOTI_SMALL_BATCH_POINTWISE,
                                                 TORCH_AOTI_TRITON_DEPTHWISE)
from bundler.fp8 import E4M3_MAX, quantize as quantize_fp8, stored_scale
from runtime_py.errors import UsageError

__all__ = ["FP8_ALIGN", "FP8_GEMMS", "FP8_CONVS", "SMALL_BATCH", "SMALL_BATCH_POINTWISE", "fp8_conv_kernel", "padded", "map_nodes_to_modules", "rewrite_nhwc",
           "rewrite_channels_last", "ChannelsLastView", "DepthwiseE4m3", "feeds_fp8_gemm", "rewrite_as_is", "PatchGemm", "is_patchify", "fp8_gemm_rows", "shape_pass", "EngineModule", "check_rewrite",
           "fake_quant_reference"]

#: FP8 GEMM operands need both dimensions of the weight to be multiples of 16 (cuBLASLt).
FP8_ALIGN = 16
#: How ``Fp8Pointwise`` scales its GEMM. "rowwise": activation scale per row, weight scale
#: per output channel and the bias, all in the GEMM's epilogue (bf16 out); "tensorwise":
#: unit weight scale in the GEMM, per-channel scale and bias in a pointwise pass after it.
#: On an H200 (torch 2.11, Inductor) rowwise cut the fp8 kernel time at batch 32 from
#: 6.20 to 5.50 ms; the shared ones column then took batch 1 from 0.66 to 0.47 ms
#: (families/timm_xception/README.md).
#: "rowwise-fp16": rowwise, with the fp16 bias in the epilogue and fp16 out (cuBLASLt's
#: outer-vector scaling gives fp16, bf16 or fp32 D; torch >= 2.9 takes that path on sm_90
#: with cuBLAS >= 12.9, the CUTLASS fallback elsewhere gave bf16 only): no bf16 -> fp16
#: pass after the GEMM (one per ViT block, where the qkv output feeds the attention, which
#: Inductor cannot fuse a convert into), and the output rounded as the fp16 graph rounds it
#: (11 bits, not bf16's 8). "dequantized": no FP8 GEMM, the same FP8 operands
#: dequantized to fp16 and an fp16 GEMM (the ONNX graph's DequantizeLinear -> MatMul
#: arithmetic): the baseline that separates what the FP8 GEMMs gain from what the
#: quantize around them costs (benchmarks/inductor_fp8_bench.py), and the small-batch form
#: where FP8 GEMMs do not pay.
FP8_GEMMS = TORCH_AOTI_FP8_GEMMS          # what family.json's torch_aoti.fp8_gemm may name
#: The modes with the scales in the GEMM's epilogue (and the shared ones column).
ROWWISE_GEMMS = ("rowwise", "rowwise-fp16")
#: How ``Fp8ConvNHWC`` runs a dense k x k FP8 convolution. "im2col": the shifted views
#: concatenated (kh*kw times the input's bytes, written and read again) and one
#: ``_scaled_mm``; "triton": ``kernels/fp8_conv.py``'s implicit GEMM, which gathers the
#: taps as it loads its tiles. "triton-fused": not this NHWC rewrite but the channels_last
#: model with its ResNet bottlenecks fused (``fused.rewrite_fused``: every FP8 convolution,
#: 1x1 too, on that kernel, writing e4m3 for the next one, residual add and ReLU in its
#: epilogue). A family picks one in family.json (``torch_aoti.fp8_conv``, default im2col);
#: timm_resnet50 runs triton-fused, measured on the H200 (its README).
FP8_CONVS = TORCH_AOTI_FP8_CONVS
#: How ``Fp8Pointwise`` (and ``Fp8Linear``) runs in a graph traced for a small static
#: batch: "gemm" (``torch._scaled_mm``, as at every batch), "triton" (the implicit-GEMM
#: kernel with small tiles; 1x1 convolutions only) or "dequantized" (the FP8 operands
#: dequantized, an fp16 GEMM); family.json ``torch_aoti.fp8_pointwise_small_batch``.
SMALL_BATCH_POINTWISE = TORCH_AOTI_SMALL_BATCH_POINTWISE

#: Spatial layers with no channel arithmetic: run on the NCHW view of NHWC data (``NCHWView``).
_SPATIAL = (nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveMaxPool2d, nn.AdaptiveAvgPool2d)
#: Layers that mix along the channel axis of NCHW data and that the rewrite cannot lay out.
_CHANNEL_NORMS = (nn.modules.batchnorm._BatchNorm, nn.GroupNorm,
                  nn.modules.instancenorm._InstanceNorm, nn.LocalResponseNorm)


def padded(n: int, align: int = FP8_ALIGN) -> int:
    """``n`` rounded up to a multiple of ``align`` (728 -> 736)."""
    return -(-int(n) // align) * align


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


# --- the modules -------------------------------------------------------------------------


def static_batch(x: torch.Tensor) -> int | None:
    """The batch of ``x`` when it is a plain int (eager, or traced for a static batch:
    ``torch.export`` without a dynamic batch, ``torch.compile(dynamic=False)``), None when
    symbolic (a graph exported with a dynamic batch)."""
    n = x.shape[0]
    return n if isinstance(n, int) else None


def quantize(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp8(x / scale): fp32 division, saturation, round to nearest even (QuantizeLinear)."""
    return torch.clamp(x.float() / scale, -E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)

def fake_quant(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Quantize-dequantize, back in x's dtype (QuantizeLinear -> DequantizeLinear)."""
    return (quantize(x, scale).float() * scale).to(x.dtype)

def conv_output_hw(h: int, w: int, kernel: tuple[int, int], stride: tuple[int, int],
                   padding: tuple[int, int], dilation: tuple[int, int]) -> tuple[int, int]:
    """Output height and width of a convolution (``torch.nn.Conv2d``'s formula)."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel, stride, padding, dilation
    return (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1

def conv_taps(x: torch.Tensor, kernel: tuple[int, int], stride: tuple[int, int],
              padding: tuple[int, int], dilation: tuple[int, int]
              ) -> tuple[list[torch.Tensor], int, int]:
    """The k x k shifted, strided views of NHWC ``x`` (zero-padded) that a convolution
    reads, in row-major kernel order, and the output height and width: what the im2col
    FP8 convolution concatenates and the depthwise one weights and sums."""
    _, h, w, _ = x.shape
    (kh, kw), (sh, sw) = kernel, stride
    (ph, pw), (dh, dw) = padding, dilation
    ho, wo = conv_output_hw(h, w, kernel, stride, padding, dilation)
    xp = F.pad(x, (0, 0, pw, pw, ph, ph)) if ph or pw else x
    taps = [xp[:, i * dh: i * dh + sh * (ho - 1) + 1: sh,
               j * dw: j * dw + sw * (wo - 1) + 1: sw, :]
            for i in range(kh) for j in range(kw)]
    return taps, ho, wo


class OnesColumn:
    """One fp32 column of ``rows`` ones, shared by every ``Fp8Pointwise`` of a model.

    Why: rowwise ``_scaled_mm`` wants a contiguous [M, 1] activation-scale operand.
    Built per GEMM (``expand(M, 1).contiguous()``), that was about 50 extra kernels
    per inference (H200 profile at batch 1), most of what FP8 added there. With the
    activation scale folded into the per-channel row, the column is all ones, and a
    slice of one column is a view: no kernel. It is a plain tensor attribute of the
    modules, not a buffer, so that ``torch.export`` lifts it once (buffers registered
    in 43 modules would be 43 constants); ``follow`` moves it with ``module.to``.
    """

    def __init__(self, rows: int) -> None:
        self.rows = int(rows)
        self.tensor = torch.ones(self.rows, 1, dtype=torch.float32)
        self._applied = None

    def follow(self, fn) -> torch.Tensor:
        """The column after ``fn`` (``nn.Module._apply``'s): applied once per call of
        ``module.to`` however many modules share it."""
        if fn is not self._applied:
            self._applied, self.tensor = fn, fn(self.tensor)
        return self.tensor

class Fp8Gemm(nn.Module):
    """``x[M, K] @ W[N, K]^T + b`` as an FP8 GEMM: the quantize, ``torch._scaled_mm`` and
    its scales (module docstring). The layers below shape their input into ``[M, K]``.

    ``small_batch_kernel`` (``SMALL_BATCH_KERNELS``): the layer's form in graphs traced
    for a small static batch (``small_batch``, ``rows_matmul``): "gemm" (as at every
    batch) or "dequantized" (the same FP8 operands through an fp16 GEMM); ``Fp8Pointwise``
    also has "triton".

    ``emulate``: compute the product in fp32 from the same FP8 operands (for hosts
    without FP8 GEMMs, e.g. the CPU tests); the GPU path is ``torch._scaled_mm``.
    """

    LAYER = "GEMM layer"
    SMALL_BATCH_KERNELS: tuple[str, ...] = ("gemm", "dequantized")

    def __init__(self, kernel: torch.Tensor, bias: torch.Tensor | None, act_scale: float,
                 weight_scale: Any, dtype: torch.dtype, emulate: bool = False,
                 fast_accum: bool = False, gemm: str = "rowwise", padded_io: bool = False,
                 ones: OnesColumn | None = None, small_batch_kernel: str = "gemm") -> None:
        super().__init__()
        if small_batch_kernel not in self.SMALL_BATCH_KERNELS:
            raise UsageError(f"small-batch pointwise kernel {small_batch_kernel!r} of a "
                             f"{self.LAYER}: choose "
                             f"{' or '.join(self.SMALL_BATCH_KERNELS)}")
        cout, cin = kernel.shape
        self.cin, self.cout = cin, cout
        self.kpad, self.npad = padded(cin), padded(cout)
        self.dtype, self.emulate, self.fast_accum = dtype, emulate, fast_accum
        if gemm not in FP8_GEMMS:
            raise UsageError(f"fp8 GEMM mode {gemm!r} is not one of {', '.join(FP8_GEMMS)}")
        self.gemm = gemm
        # padded_io: the input already has kpad channels and the output keeps npad
        # (zeros in the padding), so no pad before the quantize and no slice after
        self.padded_io = padded_io
        self.out = self.npad if padded_io else cout
        self.raw_out = False       # set by rewrite_channels_last(depthwise="triton")
        w16 = kernel.detach().to(torch.float16).cpu().numpy()
        ws = stored_scale(weight_scale).reshape(-1)
        if ws.shape[0] != cout:
            raise UsageError(f"{ws.shape[0]} weight scales for a layer of {cout} channels")
        q = quantize_fp8(w16, ws.reshape(-1, 1))
        wq = np.zeros((self.npad, self.kpad), np.uint8)
        wq[:cout, :cin] = q.view(np.uint8)
        self.register_buffer("weight_fp8", torch.from_numpy(wq).view(torch.float8_e4m3fn))
        bias = bias.detach().float() if bias is not None else torch.zeros(cout)
        bias = bias.to(torch.float16).float()                  # the fp16 graph's bias
        self.register_buffer("act_scale", torch.tensor(float(stored_scale(act_scale)),
                                                       dtype=torch.float32))
        self.register_buffer("one", torch.tensor(1.0, dtype=torch.float32))
        # per output channel, padded (scale 1, bias 0): rowwise GEMM operands [1, npad]
        # and bf16 bias; the tensorwise pass uses the first `out` of them in fp32
        scale_row = torch.ones(1, self.npad)
        scale_row[0, :cout] = torch.from_numpy(ws.copy())
        bias_row = torch.zeros(self.npad)
        bias_row[:cout] = bias
        self.register_buffer("weight_scale_row", scale_row)
        # the epilogue's bias has the GEMM output's type (torch._scaled_mm's rule)
        self.register_buffer("bias_row", bias_row.to(self.gemm_out_dtype))
        self.register_buffer("weight_scale_out", scale_row[0, :self.out].clone())
        self.register_buffer("bias_out", bias_row[:self.out].clone())
        # ones (rowwise): scale_a = a slice of the shared column of ones, scale_b = the
        # activation scale times each channel's weight scale (fp32, as the epilogue
        # multiplies them anyway); without it, scale_a = the activation scale per row
        self._ones = ones if gemm in ROWWISE_GEMMS and not emulate else None
        self.ones_col = self._ones.tensor if self._ones is not None else None
        if self._ones is not None:   # a constant of the package only where it is used
            self.register_buffer("gemm_scale_row", scale_row * self.act_scale)
        # small static batches (``small_batch_rows``); none in the emulated form
        self.small_batch_kernel = "gemm" if emulate else small_batch_kernel
        # DequantizeLinear's fp16 weight, fp16(q * scale): the "dequantized" mode's, or
        # the small-batch form's
        if gemm == "dequantized" or self.small_batch_kernel == "dequantized":
            wdq = torch.from_numpy(wq).view(torch.float8_e4m3fn).float() * scale_row.t()
            self.register_buffer("weight_dequantized", wdq.to(dtype))
            self.register_buffer("bias_dequantized", bias_row.to(dtype))

    @property
    def gemm_out_dtype(self) -> torch.dtype:
        """What ``torch._scaled_mm`` writes: fp16 for "rowwise-fp16", else bf16."""
        return torch.float16 if self.gemm == "rowwise-fp16" else torch.bfloat16

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        if self._ones is not None:
            self.ones_col = self._ones.follow(fn)
        return self

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` [..., cin or kpad] -> [M, out] in ``dtype`` (M: the product of the
        leading dimensions)."""
        q = self.quantized_rows(x)
        if self.emulate:
            y = (q.float() @ self.weight_fp8.float().t()) * self.act_scale
        elif self.gemm == "dequantized":
            return self.dequantized_matmul(q)
        elif self.gemm in ROWWISE_GEMMS:
            if self.ones_col is not None:
                # eager only: under Dynamo (torch 2.11) a torch._check with a message
                # broke the model into one graph per GEMM (seen on the H200); compiled,
                # _scaled_mm's own shape check guards the batch
                if not torch.compiler.is_compiling() and q.shape[0] > self._ones.rows:
                    raise UsageError(f"{q.shape[0]} rows are more than the FP8 GEMMs' "
                                     f"{self._ones.rows}: the batch is larger than the "
                                     "one the model was built for")
                a, b = self.ones_col[:q.shape[0]], self.gemm_scale_row
            else:
                a = self.act_scale.reshape(1, 1).expand(q.shape[0], 1).contiguous()
                b = self.weight_scale_row
            y = torch._scaled_mm(q, self.weight_fp8.t(), scale_a=a,
                                 scale_b=b, bias=self.bias_row,
                                 out_dtype=self.gemm_out_dtype, use_fast_accum=self.fast_accum)
            # raw_out: the next layer reads the GEMM's own output type (a DepthwiseE4m3
            # with the ReLU between them on its load): no convert pass
            return y[:, :self.out] if self.raw_out else y[:, :self.out].to(self.dtype)
        else:
            y = torch._scaled_mm(q, self.weight_fp8.t(), scale_a=self.act_scale,
                                 scale_b=self.one, out_dtype=torch.bfloat16,
                                 use_fast_accum=self.fast_accum)
        y = y[:, :self.out].float() * self.weight_scale_out + self.bias_out
        return y.to(self.dtype)

    def quantized_rows(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` [..., cin or kpad] as the GEMM's FP8 rows [M, kpad]. An e4m3 ``x`` was
        quantized with this layer's activation scale by the layer before it
        (``DepthwiseE4m3``), already kpad wide: used as it is."""
        if x.dtype == torch.float8_e4m3fn:
            if x.shape[-1] != self.kpad:
                raise UsageError(f"e4m3 input of {x.shape[-1]} channels to an FP8 GEMM of "
                                 f"{self.kpad}")
            return x.contiguous().reshape(-1, self.kpad)
        if x.shape[-1] != self.kpad:
            x = F.pad(x, (0, self.kpad - self.cin))     # fused into the quantize below
        # contiguous(): at batch 1 the reshape of an NCHW-backed NHWC view is a
        # column-major view, which _scaled_mm refuses (seen compiling on an H200).
        return quantize(x, self.act_scale).contiguous().reshape(-1, self.kpad)

    def small_batch(self, x: torch.Tensor) -> bool:
        """Whether ``x`` takes the layer's small-batch form: one is set, and ``x``'s batch
        is a plain int (eager, or traced for a static batch: ``torch.export`` without a
        dynamic batch, ``torch.compile(dynamic=False)``) of at most ``SMALL_BATCH``."""
        if self.small_batch_kernel == "gemm":
            return False
        n = static_batch(x)
        return n is not None and n <= SMALL_BATCH

    def rows_matmul(self, x: torch.Tensor, small: bool) -> torch.Tensor:
        """``matmul``, or for a small batch in the "dequantized" form the same FP8 operands
        through an fp16 GEMM (``dequantized_matmul``)."""
        if small and self.small_batch_kernel == "dequantized":
            return self.dequantized_matmul(self.quantized_rows(x))
        return self.matmul(x)

    def dequantized_matmul(self, q: torch.Tensor) -> torch.Tensor:
        """The ONNX graph's arithmetic on the same FP8 operands: DequantizeLinear of the
        quantized rows ``q`` [M, kpad] and of the weight, then an fp16 GEMM with the bias."""
        x = (q.float() * self.act_scale).to(self.dtype)        # DequantizeLinear
        y = F.linear(x, self.weight_dequantized, self.bias_dequantized)
        return y[:, :self.out]


#: Static batches up to this run ``Fp8Pointwise(small_batch_kernel="triton")`` on the Triton
#: kernel; larger ones, and a dynamic batch, on ``torch._scaled_mm``.
SMALL_BATCH = 8


class Fp8Pointwise(Fp8Gemm):
    """1x1 convolution as an FP8 GEMM on NHWC activations (module docstring).

    ``small_batch_kernel="triton"``: traced for a static batch of at most ``SMALL_BATCH``
    (a package's static-batch graph, ``torch.compile(dynamic=False)``) on CUDA, the layer
    runs as ``kernels/fp8_conv.py``'s implicit GEMM with a 1x1 window and small tiles
    (``small_batch_config``) on the same FP8 operands, instead of ``torch._scaled_mm``,
    whose kernels are sized for many rows (batch 1 of timm_xception: 100 to 22,500).
    Same arithmetic: fp32 accumulation, activation scale times channel scale and the fp16
    graph's bias in the epilogue, fp16 out.

    ``small_batch_kernel="dequantized"``: at such a static batch the same FP8 operands
    dequantized and an fp16 GEMM (``dequantized_matmul``: the ONNX graph's own arithmetic).
    At batch 1 every GEMM of timm_xception sits near its launch floor, where cuBLAS's fp16
    kernels are quicker than its FP8 ones, while the quantize stays fused into the
    producing kernels: on the H200 the model took 0.449 ms this way against 0.520 with the
    FP8 GEMMs and 0.489 for fp16 (families/timm_xception/README.md). The dequantized
    weights are one more fp16 copy of the FP8 layers in the package."""

    LAYER = "1x1 convolution"
    SMALL_BATCH_KERNELS = SMALL_BATCH_POINTWISE
    #: ``run_on_triton``'s tiles; None: ``torch._scaled_mm``
    triton_tiles: tuple[int, ...] | None = None

    def __init__(self, conv: nn.Conv2d, act_scale: float, weight_scale: Any,
                 dtype: torch.dtype, **options: Any) -> None:
        if conv.kernel_size != (1, 1) or conv.groups != 1 or conv.padding not in ((0, 0), "valid"):
            raise UsageError(f"Fp8Pointwise takes 1x1 dense convolutions without padding, "
                             f"got {conv}")
        super().__init__(conv.weight.reshape(conv.out_channels, conv.in_channels), conv.bias,
                         act_scale, weight_scale, dtype, **options)
        self.stride = tuple(conv.stride)
        if self.small_batch_kernel == "triton":
            self.implicit_gemm_scale()

    def implicit_gemm_scale(self) -> None:
        """The implicit GEMM's epilogue scale (small batches, ``triton_tiles``), a buffer of
        the layers that launch it only: activation scale times each channel's weight scale."""
        if not hasattr(self, "conv_scale"):
            self.register_buffer("conv_scale", self.weight_scale_row[0] * self.act_scale)

    def run_on_triton(self, tiles: tuple[int, ...]) -> None:
        """Run the layer on ``kernels/fp8_conv.py``'s implicit GEMM with ``tiles`` (an
        ``Fp8ConvConfig``'s fields) at every batch that is not small, instead of
        ``torch._scaled_mm`` (``_pointwise_on_triton``: where it measured faster). Stride 1."""
        if self.stride != (1, 1):
            raise UsageError(f"the Triton pointwise form takes stride 1, not {self.stride}")
        self.triton_tiles = tuple(int(t) for t in tiles)
        self.implicit_gemm_scale()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        small = self.small_batch(x)
        if small and self.small_batch_kernel == "triton" and x.is_cuda:
            return self.implicit_gemm(x)
        if self.triton_tiles is not None and not small and x.is_cuda and not self.emulate:
            return self.triton_gemm(x)
        sh, sw = self.stride
        if (sh, sw) != (1, 1):
            x = x[:, ::sh, ::sw, :]
        n, h, w, _ = x.shape
        return self.rows_matmul(x, small).reshape(n, h, w, self.out)

    def with_skip(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        """The layer's output plus ``skip`` (fp16 NHWC of the output's shape: a residual
        block's shortcut), NHWC fp16, as the graph computes it: the Conv's output rounded to
        fp16, then an fp16 Add. On CUDA the add runs in the epilogue of
        ``kernels/fp8_conv.py``'s implicit GEMM (``SkipAddBlock``): the GEMM's output is not
        written, read back and written again by an add pass. Elsewhere (the CPU tests) the
        same arithmetic in torch ops. Needs ``run_on_triton`` (its tiles)."""
        if x.is_cuda and not self.emulate:
            return self.triton_gemm(x, skip)
        n, h, w, _ = skip.shape
        q = self.quantized_rows(x)
        y = (q.float() @ self.weight_fp8.float().t())[:, :self.out]
        y = (y * self.conv_scale[:self.out] + self.bias_out).to(torch.float16)
        y = (y.float() + skip.reshape(-1, self.out).float()).to(torch.float16)
        return y.reshape(n, h, w, self.out)

    def triton_gemm(self, x: torch.Tensor, skip: torch.Tensor | None = None) -> torch.Tensor:
        """``run_on_triton``'s path: the fused op, fp16 out, ``skip`` (``with_skip``) added
        in its epilogue. The fused op, not the plain one: a graph launching the plain op next to the fused
        one (``SkipAddBlock``) failed under torch 2.11's Inductor on the H200 ("launcher()
        missing 2 required positional arguments: '_grid_1' and '_grid_2'",
        docs/measurements/h200-2026-12-04/skip-model-2.log); with the fused op alone, as
        in the ResNet bottlenecks, it compiles and runs."""
        from bundler.targets.torch_aoti.kernels.fp8_conv import Fp8ConvConfig, fp8_conv_fused

        n, h, w, _ = x.shape
        q = self.quantized_rows(x).reshape(n, h, w, self.kpad)
        y, _ = fp8_conv_fused(q, self.weight_fp8, self.conv_scale, self.bias_out, self.out,
                              (1, 1), (1, 1), (0, 0), residual=skip,
                              config=Fp8ConvConfig(*self.triton_tiles))
        return y if self.dtype == torch.float16 else y.to(self.dtype)

    def implicit_gemm(self, x: torch.Tensor) -> torch.Tensor:
        """The small-batch path: quantize (fused by Inductor into the producer's kernel),
        then the Triton kernel; the stride is the kernel's, no strided view is copied."""
        from bundler.targets.torch_aoti.kernels.fp8_conv import fp8_conv, small_batch_config

        if x.dtype != torch.float8_e4m3fn:        # (else quantized by the layer before)
            if x.shape[-1] != self.kpad:
                x = F.pad(x, (0, self.kpad - self.cin))
            x = quantize(x, self.act_scale)
        n, h, w, _ = x.shape
        ho, wo = conv_output_hw(h, w, (1, 1), self.stride, (0, 0), (1, 1))
        y = fp8_conv(x, self.weight_fp8, self.conv_scale,
                     self.bias_out, self.out, (1, 1), self.stride, (0, 0),
                     config=small_batch_config(self.kpad, self.out, n * ho * wo))
        return y if self.dtype == torch.float16 else y.to(self.dtype)


class Fp8Linear(Fp8Gemm):
    """``nn.Linear`` as an FP8 GEMM over its input's last dimension (a transformer's
    tokens: [N, T, in] -> [N, T, out]); what the ONNX graph's Q/DQ on MatMul computes.

    ``small_batch_kernel="dequantized"``: traced for a static batch of at most
    ``SMALL_BATCH``, the same FP8 operands dequantized and an fp16 GEMM, as
    ``Fp8Pointwise`` does (the ONNX graph's arithmetic). Why: at batch 1 timm_vit_base's 48
    GEMMs of 197 rows are latency-bound, and on the H200 the model ran 0.730 ms with the
    FP8 GEMMs, 0.659 ms dequantized and 0.627 ms in fp16 (families/timm_vit_base/README.md).
    "triton" (the implicit-GEMM convolution kernel) is a 1x1 convolution's form only."""

    LAYER = "Linear layer"

    def __init__(self, linear: nn.Linear, act_scale: float, weight_scale: Any,
                 dtype: torch.dtype, **options: Any) -> None:
        super().__init__(linear.weight, linear.bias, act_scale, weight_scale, dtype, **options)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rows_matmul(x, self.small_batch(x)).reshape(*x.shape[:-1], self.out)


class Fp8ConvNHWC(Fp8Gemm):
    """A dense k x k convolution as an FP8 GEMM on NHWC activations: the taps are
    gathered as shifted slices (im2col, in (kh, kw, C) order, zero padded), quantized and
    multiplied with the kernel laid out [Cout, kh*kw*Cin]. Element for element the same
    FP8 operands as the ONNX graph's Q/DQ Conv (quantizing zeros gives zeros).

    ``conv_kernel="triton"`` (``fp8_conv_kernel``): on CUDA inputs the im2col copy (kh*kw
    times the input) is replaced by the implicit-GEMM kernel of ``kernels/fp8_conv.py``
    on the same FP8 operands (``implicit_gemm``; fp32 accumulation, fp16 out)."""

    def __init__(self, conv: nn.Conv2d, act_scale: float, weight_scale: Any,
                 dtype: torch.dtype, conv_kernel: str = "im2col", **options: Any) -> None:
        if conv.groups != 1 or isinstance(conv.padding, str) or conv.padding_mode != "zeros":
            raise UsageError(f"Fp8ConvNHWC takes dense convolutions with explicit zero "
                             f"padding, got {conv}")
        kernel = conv.weight.detach().permute(0, 2, 3, 1).reshape(conv.out_channels, -1)
        options.pop("padded_io", None)        # k x k inputs are read unpadded (rewrite_nhwc)
        super().__init__(kernel, conv.bias, act_scale, weight_scale, dtype, **options)
        self.channels = conv.in_channels
        self.kernel, self.stride = tuple(conv.kernel_size), tuple(conv.stride)
        self.padding, self.dilation = tuple(conv.padding), tuple(conv.dilation)
        self.conv_kernel = fp8_conv_kernel(conv_kernel, emulate=self.emulate)
        if self.conv_kernel == "triton":
            from bundler.targets.torch_aoti.kernels.fp8_conv import default_config

            self.tiles = default_config(self.channels, self.out, self.kernel)
            # the epilogue's scale: activation scale times each channel's weight scale, in
            # fp32; its bias: bias_out (the fp16 graph's bias in fp32, not bf16 as the GEMM's)
            self.register_buffer("conv_scale", self.weight_scale_row[0] * self.act_scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x[..., :self.channels]
        if self.conv_kernel == "triton" and x.is_cuda:
            return self.implicit_gemm(x)
        taps, ho, wo = conv_taps(x, self.kernel, self.stride, self.padding, self.dilation)
        return self.matmul(torch.cat(taps, dim=-1)).reshape(x.shape[0], ho, wo, self.out)

    def implicit_gemm(self, x: torch.Tensor) -> torch.Tensor:
        """The "triton" path: quantize (Inductor fuses it into the producer's kernel), then
        the implicit-GEMM kernel on the same FP8 weight buffer as the im2col path's."""
        from bundler.targets.torch_aoti.kernels.fp8_conv import fp8_conv

        y = fp8_conv(quantize(x, self.act_scale), self.weight_fp8, self.conv_scale,
                     self.bias_out, self.out, self.kernel, self.stride, self.padding,
                     self.dilation, config=self.tiles)
        return y if self.dtype == torch.float16 else y.to(self.dtype)


def fp8_conv_kernel(requested: str, *, emulate: bool = False) -> str:
    """The kernel a dense k x k FP8 convolution runs as (``FP8_CONVS``), for ``requested``.

    "triton" is refused with a message when triton cannot be imported (a build asked for
    it would otherwise run im2col unnoticed), and falls back to "im2col" for emulated
    models (``emulate``: the CPU tests' fp32 product of the same FP8 operands). On CPU
    inputs (an eager run on the host) ``Fp8ConvNHWC`` takes the im2col path too.
    """
    if requested not in FP8_CONVS:
        raise UsageError(f"fp8 convolution kernel {requested!r} is not one of "
                         f"{', '.join(FP8_CONVS)}")
    if requested == "im2col" or emulate:
        return "im2col"
    if requested == "triton-fused":   # whole blocks (fused.py), not one NHWC layer
        requested = "triton"
    from bundler.targets.torch_aoti.kernels import available

    ok, why = available()
    if not ok:
        raise UsageError(f"the Triton FP8 convolution was asked for, but {why}: install the "
                         "triton that matches this torch, or build with "
                         "TRT_BUNDLE_FP8_CONV=im2col (build_engine: fp8_conv=\"im2col\")")
    return "triton"


def _depthwise_geometry(conv: nn.Conv2d, layer: str) -> tuple[tuple[int, int], ...]:
    """(kernel, stride, padding, dilation) of a depthwise ``conv`` with explicit zero
    padding, what the NHWC depthwise layers compute; UsageError naming ``layer`` else."""
    if not (conv.groups == conv.in_channels == conv.out_channels):
        raise UsageError(f"{layer} takes depthwise convolutions, got {conv}")
    if isinstance(conv.padding, str) or conv.padding_mode != "zeros":
        raise UsageError(f"{layer} needs explicit zero padding, got {conv}")
    return (tuple(conv.kernel_size), tuple(conv.stride), tuple(conv.padding),
            tuple(conv.dilation))


class DepthwiseNHWC(nn.Module):
    """k x k depthwise convolution on NHWC as a sum of shifted slices (module docstring).

    ``act_scale``/``weight_scale`` (fp8-depthwise): input and kernel are
    quantized-dequantized with them first, like the graph's Q/DQ pairs.
    """

    def __init__(self, conv: nn.Conv2d, dtype: torch.dtype, act_scale: float | None = None,
                 weight_scale: Any = None, channels: int | None = None) -> None:
        super().__init__()
        c = conv.out_channels
        self.kernel, self.stride, self.padding, self.dilation = _depthwise_geometry(
            conv, "DepthwiseNHWC")
        w = conv.weight.detach()                               # [C, 1, kh, kw]
        if weight_scale is not None:  # quantized from the fp16 kernel, as the graph does
            w = w.to(torch.float16)
            ws = stored_scale(weight_scale).reshape(-1, 1, 1, 1)
            q = quantize_fp8(w.cpu().numpy(), ws).astype(np.float32)
            w = torch.from_numpy((q * ws).astype(np.float16))
        cp = channels or c        # > c: padded channels, zero kernel and bias
        kernel = torch.zeros(cp, *self.kernel, dtype=w.dtype)
        kernel[:c] = w.reshape(c, *self.kernel)
        self.register_buffer("weight", kernel.permute(1, 2, 0).contiguous().to(dtype))  # [kh, kw, C]
        bias = torch.zeros(cp, dtype=w.dtype)
        if conv.bias is not None:
            bias[:c] = conv.bias.detach()
        self.register_buffer("bias", bias.to(dtype))
        self.register_buffer("act_scale", None if act_scale is None else torch.tensor(
            float(stored_scale(act_scale)), dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.act_scale is not None:
            x = fake_quant(x, self.act_scale)
        taps, _, _ = conv_taps(x, self.kernel, self.stride, self.padding, self.dilation)
        kw = self.kernel[1]
        acc = None
        for t, tap in enumerate(taps):
            term = tap.float() * self.weight[t // kw, t % kw].float()
            acc = term if acc is None else acc + term
        return (acc + self.bias.float()).to(x.dtype)


class DepthwiseE4m3(nn.Module):
    """A depthwise convolution on NHWC whose output goes to an FP8 GEMM: the convolution,
    its bias, the fp16 rounding of the graph's Conv (and ``relu``: a ReLU between the two
    layers), then ``QuantizeLinear`` with the GEMM's activation scale, written as e4m3 rows
    ``cpad`` (the GEMM's K) channels wide; the GEMM (``Fp8Gemm.quantized_rows``) takes them
    as they are. On CUDA one Triton kernel
    (``kernels/dw_conv.py``) does it all; elsewhere (CPU tests, export checks) the same
    arithmetic in torch ops.

    ``relu_in``: the ReLU before it (the model's) applied as the input is loaded; the input
    may then be another FP8 GEMM's raw output (bf16, ``Fp8Gemm.raw_out``), the
    convert-and-ReLU pass between the two gone.

    Why: cuDNN's depthwise kernel writes fp16 that a pointwise pass then reads to quantize
    (``rewrite_channels_last(depthwise="triton")`` docstring)."""

    def __init__(self, conv: nn.Conv2d, act_scale: float, cpad: int, relu: bool = False,
                 relu_in: bool = False, row_strips: bool = False) -> None:
        super().__init__()
        self.row_strips = bool(row_strips)   # the kernel's row-strip tile where it applies
        self.relu = bool(relu)       # a ReLU between the convolution and the GEMM
        self.relu_in = bool(relu_in)   # a ReLU before the convolution, applied on load
        self.raw_in = False            # its input is an FP8 GEMM's raw (bf16) output
        c = conv.out_channels
        self.kernel, self.stride, self.padding, self.dilation = _depthwise_geometry(
            conv, "DepthwiseE4m3")
        if cpad < c:
            raise UsageError(f"DepthwiseE4m3: {cpad} output channels for a layer of {c}")
        self.channels, self.cpad = c, int(cpad)
        w = conv.weight.detach().to(torch.float16).float()           # the fp16 kernel
        self.register_buffer("weight_nchw", w)                        # [C, 1, kh, kw]
        self.register_buffer("weight_taps", w.reshape(c, -1).t().contiguous())  # [kh*kw, C]
        bias = conv.bias.detach() if conv.bias is not None else torch.zeros(c)
        self.register_buffer("bias", bias.to(torch.float16).float())
        self.register_buffer("act_scale", torch.tensor(
            [float(stored_scale(act_scale))], dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            from bundler.targets.torch_aoti.kernels.dw_conv import (ROW_STRIP_CONFIG,
                                                                    dw_conv_e4m3)

            return dw_conv_e4m3(x, self.weight_taps, self.bias, self.act_scale, self.cpad,
                                self.kernel, self.stride, self.padding, self.dilation,
                                relu=self.relu, relu_in=self.relu_in,
                                config=ROW_STRIP_CONFIG if self.row_strips else None)
        x = x.permute(0, 3, 1, 2).float()
        if self.relu_in:
            x = F.relu(x)
        y = F.conv2d(x, self.weight_nchw, self.bias, self.stride, self.padding, self.dilation,
                     groups=self.channels)
        if self.relu:
            y = F.relu(y)
        y = y.to(torch.float16).permute(0, 2, 3, 1)
        if self.cpad != self.channels:
            y = F.pad(y, (0, self.cpad - self.channels))
        return quantize(y, self.act_scale)


class SkipAddBlock(nn.Module):
    """A residual block of separable convolutions (timm's ``XceptionModule``: ``stack``,
    an optional 1x1 ``shortcut``, ``stack(x) + shortcut(x)``) whose last layer is an FP8
    1x1 GEMM: that GEMM adds the shortcut in its epilogue (``Fp8Pointwise.with_skip``).

    Why: in the channels_last fp8 form the block's add is a pass of its own after
    ``torch._scaled_mm`` (its output read back with the shortcut and the sum written).
    Where the Triton kernel is the faster GEMM for the layer anyway (the family's
    ``torch_aoti.fp8_triton_pointwise``), the add comes free in its epilogue.
    ``rewrite_channels_last(depthwise="triton-skip")`` puts the blocks that qualify
    (``applies``) in this form."""

    def __init__(self, block: nn.Module, tiles: tuple[int, ...]) -> None:
        super().__init__()
        self.stack, self.shortcut = block.stack, block.shortcut
        self.stack[-1].conv_pw.layer.run_on_triton(tiles)

    @staticmethod
    def applies(block: nn.Module) -> bool:
        """Whether ``block`` (after the rewrite's replacements) takes this form: an
        ``XceptionModule`` with its skip and no drop-path, whose stack ends in a separable
        convolution with nothing after its FP8 1x1 half, at stride 1."""
        stack = getattr(block, "stack", None)
        if not (type(block).__name__ == "XceptionModule" and isinstance(stack, nn.Sequential)
                and len(stack) and getattr(block, "no_skip", True) is False
                and getattr(block, "drop_path", None) is None):
            return False
        last = stack[-1]
        pw = getattr(last, "conv_pw", None)
        return (type(last).__name__ == "SeparableConv2d" and isinstance(pw, ChannelsLastView)
                and isinstance(pw.layer, Fp8Pointwise) and pw.layer.stride == (1, 1)
                and not pw.layer.raw_out and not pw.layer.padded_io
                and pw.layer.dtype == torch.float16
                and all(isinstance(getattr(last, n, None), nn.Identity)
                        for n in ("bn_dw", "act_dw", "bn_pw", "act_pw")))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip = x if self.shortcut is None else self.shortcut(x)
        layers = list(self.stack)
        for layer in layers[:-1]:
            x = layer(x)
        last = layers[-1]
        x = last.conv_dw(x)
        y = last.conv_pw.layer.with_skip(x.permute(0, 2, 3, 1), skip.permute(0, 2, 3, 1))
        return y.permute(0, 3, 1, 2)


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


class PointwiseNHWC(nn.Module):
    """A 1x1 convolution the recipe does not quantize: a matmul on NHWC."""

    def __init__(self, conv: nn.Conv2d, dtype: torch.dtype, cin: int | None = None,
                 cout: int | None = None) -> None:
        super().__init__()
        self.stride = tuple(conv.stride)
        o, i = conv.out_channels, conv.in_channels
        w = torch.zeros(cout or o, cin or i)            # padded: zero rows and columns
        w[:o, :i] = conv.weight.detach().reshape(o, i)
        self.register_buffer("weight", w.to(dtype))
        bias = None
        if conv.bias is not None:
            bias = torch.zeros(cout or o)
            bias[:o] = conv.bias.detach()
            bias = bias.to(dtype)
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sh, sw = self.stride
        if (sh, sw) != (1, 1):
            x = x[:, ::sh, ::sw, :]
        return F.linear(x, self.weight, self.bias)

class ConvNHWC(nn.Module):
    """Any other convolution (the stem): cuDNN on the channels-last view of NHWC data."""

    def __init__(self, conv: nn.Conv2d, dtype: torch.dtype, cout: int | None = None) -> None:
        super().__init__()
        if cout and cout != conv.out_channels:   # padded: zero filters, zero bias
            grown = copy.deepcopy(conv)
            grown.out_channels = cout
            w = torch.zeros(cout, *conv.weight.shape[1:])
            w[:conv.out_channels] = conv.weight.detach()
            grown.weight = nn.Parameter(w, requires_grad=False)
            if conv.bias is not None:
                b = torch.zeros(cout)
                b[:conv.out_channels] = conv.bias.detach()
                grown.bias = nn.Parameter(b, requires_grad=False)
            conv = grown
        self.conv = conv.to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)

class NCHWView(nn.Module):
    """A spatial layer (a max pool) applied to the NCHW view of NHWC data: the permutes are
    views, and Inductor generates the pool for the channels-last strides."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)


class ChannelsLastView(nn.Module):
    """An NHWC layer applied to a channels_last NCHW tensor (``rewrite_channels_last``):
    its NHWC view in, the layer's NHWC output viewed back as NCHW. Both permutes are views
    (no copy) when the input is in channels_last memory, as the engine keeps it."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def is_patchify(conv: nn.Module) -> bool:
    """Whether ``conv`` cuts its input into non-overlapping patches (a ViT's patch
    embedding): a 2-d convolution whose kernel equals its stride, with no padding, dilation
    or groups. Such a convolution is one GEMM over the patches (``PatchGemm``)."""
    return (isinstance(conv, nn.Conv2d) and tuple(conv.kernel_size) == tuple(conv.stride)
            and tuple(conv.dilation) == (1, 1) and conv.groups == 1
            and not isinstance(conv.padding, str) and tuple(conv.padding) == (0, 0))


class PatchGemm(nn.Module):
    """A patchifying convolution (``is_patchify``) as one GEMM: the patches are a reshape
    and one permute of the NCHW input, ``[N*Hp*Wp, C*ph*pw]``, times the kernel flattened
    in the same (C, ph, pw) order. The output is the convolution's NCHW tensor as a view
    of the GEMM's rows, so timm's ``flatten(2).transpose(1, 2)`` after it is free.

    Why: on the H200 (torch 2.11, cuDNN 9.19) cuDNN ran timm_vit_base's 16x16/16 patch
    embedding in 0.233 ms at batch 32 and 0.083 ms at batch 1, plus two layout
    conversions (0.087 / 0.015 ms): about a tenth of the fp8 engine, for 7.4 GFLOP (batch
    32) that a GEMM runs in well under 0.03 ms
    (docs/measurements/h200-2026-12-01-s3/vit-fp8.log). Rows or columns that do not fill
    a patch are dropped, as the convolution drops them."""

    def __init__(self, conv: nn.Conv2d) -> None:
        super().__init__()
        if not is_patchify(conv):
            raise UsageError(f"{conv} does not cut its input into patches (kernel = stride, "
                             "no padding, dilation or groups)")
        self.patch = tuple(int(k) for k in conv.kernel_size)
        self.cout = int(conv.out_channels)
        self.register_buffer("weight", conv.weight.detach().reshape(self.cout, -1).clone())
        self.register_buffer("bias", None if conv.bias is None else conv.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c, h, w = x.shape
        ph, pw = self.patch
        hp, wp = h // ph, w // pw
        if (hp * ph, wp * pw) != (h, w):
            x = x[:, :, :hp * ph, :wp * pw]
        patches = (x.reshape(n, c, hp, ph, wp, pw).permute(0, 2, 4, 1, 3, 5)
                   .reshape(n * hp * wp, c * ph * pw))
        y = F.linear(patches, self.weight, self.bias)
        return y.reshape(n, hp, wp, self.cout).permute(0, 3, 1, 2)


def _patchify_as_gemms(body: nn.Module) -> None:
    """Replace, in ``body``, every patchifying convolution by a ``PatchGemm``."""
    for name in [n for n, m in body.named_modules() if n and is_patchify(m)]:
        body.set_submodule(name, PatchGemm(body.get_submodule(name)))


class GlobalAvgPoolNHWC(nn.Module):
    def __init__(self, flatten: bool) -> None:
        super().__init__()
        self.flatten = flatten

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.float().mean(dim=(1, 2)).to(x.dtype)
        return y if self.flatten else y[:, :, None, None]

class EngineModule(nn.Module):
    """fp32 NCHW in, fp32 out; the body runs in ``dtype`` (NHWC when ``nhwc``; NCHW
    semantics in channels_last memory when ``channels_last``)."""

    def __init__(self, body: nn.Module, dtype: torch.dtype, nhwc: bool,
                 channels_last: bool = False) -> None:
        super().__init__()
        self.body, self.dtype, self.nhwc = body, dtype, nhwc
        self.channels_last = channels_last and not nhwc

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.dtype)
        if self.nhwc:
            x = x.permute(0, 2, 3, 1)
        elif self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return self.body(x).float()




def _global_pool(module) -> Any:
    """The NHWC replacement of a global average pool, or None if ``module`` is not one."""
    kind = type(module).__name__
    if kind == "SelectAdaptivePool2d" and getattr(module, "pool_type", "") == "avg":
        flatten = not isinstance(getattr(module, "flatten", nn.Identity()), nn.Identity)
        return GlobalAvgPoolNHWC(flatten)
    if isinstance(module, nn.AdaptiveAvgPool2d) and module.output_size in (1, (1, 1)):
        return GlobalAvgPoolNHWC(False)
    return None


def _rewrite_start(model: torch.nn.Module, fp8: Mapping, fp8_depthwise: Mapping, *,
                   fp8_conv: str, small_batch_pointwise: str, emulate: bool,
                   fp8_rows: int | None, fp8_gemm: str):
    """(copy of ``model``, its modules by path, the shared ones column or None) for a
    rewrite, after refusing unknown kernels and fp8 paths that are not in the model."""
    fp8_conv_kernel(fp8_conv, emulate=True)          # a known name, before any work
    if small_batch_pointwise == "triton" and fp8 and not emulate:
        fp8_conv_kernel("triton")                    # refuses a missing triton by name
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
    (``Fp8Linear``: "gemm" or "dequantized"). ``fp8_conv="triton-fused"``: every transformer
    MLP whose fc1 and fc2 are FP8 runs fc1 on the Triton FP8 kernel with GELU and fc2's
    input quantize in its epilogue (``fused_mlp.FusedMlp``); the other modes have no
    convolution to act on here."""
    fp8 = dict(fp8 or {})
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


def fake_quant_reference(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,
                         act_scale: float, weight_scale: Any) -> torch.Tensor:
    """Reference of ``Fp8Pointwise`` on NHWC ``x`` [N,H,W,Cin] and kernel ``w`` [Cout,Cin]:
    dequantized FP8 activations times dequantized FP8 weights, in fp32 (for tests)."""
    a = torch.tensor(float(stored_scale(act_scale)))
    ws = torch.from_numpy(stored_scale(weight_scale)).reshape(-1, 1)
    xq = quantize(x.half(), a).float() * a
    wq = torch.clamp(w.half().float() / ws, -E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float() * ws
    y = xq @ wq.t()
    return y if bias is None else y + bias.half().float()
