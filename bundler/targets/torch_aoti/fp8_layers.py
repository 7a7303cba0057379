"""The FP8 GEMM layers of the torch-aoti engine's model (``model.py`` puts them in).

* ``Fp8Gemm``: ``x[M, K] @ W[N, K]^T + b`` as an FP8 GEMM: quantize (fp32 division by
  the calibrated per-tensor scale, saturate to +-448, round to nearest even, as ONNX
  ``QuantizeLinear`` does), ``torch._scaled_mm`` against the per-output-channel quantized
  weight with the activation scale, the per-channel weight scales and the bias applied in
  the GEMM's own epilogue (rowwise scaling; bf16 out, or fp16 out with ``rowwise-fp16``;
  ``FP8_GEMMS``). The activation scale is folded into the per-channel row, so the
  row-scale operand is a slice of one column of ones shared by all GEMMs
  (``OnesColumn``): no kernel builds it. Channel counts are padded to multiples of
  ``FP8_ALIGN`` inside the layer (728 -> 736): the pad is fused into the quantize (zeros),
  the weight's padded rows are zero, and the output's padded columns are dropped by a
  free slice (or carried from layer to layer, ``rewrite_nhwc``'s ``pad_channels``).
* ``Fp8Pointwise``: a 1x1 convolution on NHWC data, which *is* such a product with no
  data movement; ``Fp8Linear``: the same over the last axis (tokens);
  ``Fp8ConvNHWC``: a dense k x k convolution, im2col by shifted slices then the same
  GEMM, or (``FP8_CONVS`` "triton") the quantize and the implicit-GEMM Triton kernel
  that reads the taps in place (``kernels/fp8_conv.py``).

Scales: exactly those of the bundle's ``calibration.safetensors``, which are the ones the
ONNX graph stores (the one rule ``bundler.fp8.stored_scale``), and the weights are
quantized with ``bundler.fp8.quantize`` from the fp16 kernels: the FP8 operands are
bit-identical to the graph's. ``fake_quant_reference`` is the graph's arithmetic, for
the tests.

This module imports torch: it is imported only when a torch-aoti engine is built.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bundler.fp8 import E4M3_MAX, quantize as quantize_fp8, stored_scale
from bundler.targets.torch_aoti.settings import (TORCH_AOTI_FP8_CONVS, TORCH_AOTI_FP8_GEMMS,
                                                 TORCH_AOTI_FUSED_FP8_CONVS,
                                                 TORCH_AOTI_LINEAR_ONLY_SMALL_BATCH,
                                                 TORCH_AOTI_SMALL_BATCH_POINTWISE,
                                                 TORCH_AOTI_TRITON_SMALL_BATCH)
from runtime_py.errors import UsageError


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
#: The fused-bottleneck forms of ``FP8_CONVS``; "triton-fused-tma" runs the dense 1x1 stride-1
#: layers on ``kernels/fp8_conv_tma.py``'s TMA kernel (exported with Dynamo) outside small
#: static graphs, "triton-fused-tma-small" in those too (``fused.FusedConv``).
FUSED_FP8_CONVS = TORCH_AOTI_FUSED_FP8_CONVS
#: How ``Fp8Pointwise`` (and ``Fp8Linear``) runs in a graph traced for a small static
#: batch: "gemm" (``torch._scaled_mm``, as at every batch), "triton" (the implicit-GEMM
#: kernel with small tiles), "dequantized" (the FP8 operands dequantized, an fp16 GEMM) or
#: "triton-split-k" (``Fp8Linear`` only: "triton", with the reduction split where the rows
#: leave SMs idle); family.json ``torch_aoti.fp8_pointwise_small_batch``.
SMALL_BATCH_POINTWISE = TORCH_AOTI_SMALL_BATCH_POINTWISE
#: The forms on the Triton kernels.
TRITON_SMALL_BATCH = TORCH_AOTI_TRITON_SMALL_BATCH
#: The forms of ``Fp8Linear`` only.
LINEAR_ONLY_SMALL_BATCH = TORCH_AOTI_LINEAR_ONLY_SMALL_BATCH


def padded(n: int, align: int = FP8_ALIGN) -> int:
    """``n`` rounded up to a multiple of ``align`` (728 -> 736)."""
    return -(-int(n) // align) * align


#: The batch of the graph ``exporting_batch`` says is being traced (a one-element list: empty
#: outside the block).
_EXPORTING: list[int | None] = []


@contextmanager
def exporting_batch(batch: int | None) -> Iterator[None]:
    """Within the block, ``static_batch`` answers ``batch`` (None: a dynamic-batch graph)
    without looking at the tensor. Why: Dynamo (a strict export, which the TMA layers need:
    ``fused.uses_tma``) shows a symbolic batch to Python as an int, and a table lookup on it
    specializes the graph to the example's batch."""
    _EXPORTING.append(batch)
    try:
        yield
    finally:
        _EXPORTING.pop()


def static_batch(x: torch.Tensor) -> int | None:
    """The batch of ``x`` when it is a plain int (eager, or traced for a static batch:
    ``torch.export`` without a dynamic batch, ``torch.compile(dynamic=False)``), None when
    symbolic (a graph exported with a dynamic batch); inside ``exporting_batch``, its
    batch."""
    if _EXPORTING:
        return _EXPORTING[-1]
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
    and ``Fp8Linear`` also have "triton" (the implicit-GEMM kernel with small tiles).

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

    def implicit_gemm_scale(self) -> None:
        """The Triton kernel's epilogue scale (small batches, ``Fp8Pointwise.triton_tiles``),
        a buffer of the layers that launch it only: activation scale times each channel's
        weight scale."""
        if not hasattr(self, "conv_scale"):
            self.register_buffer("conv_scale", self.weight_scale_row[0] * self.act_scale)

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
    SMALL_BATCH_KERNELS = tuple(k for k in SMALL_BATCH_POINTWISE
                                if k not in LINEAR_ONLY_SMALL_BATCH)
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

    ``small_batch_kernel="triton"``: at such a static batch, on CUDA, the rows run through
    ``kernels/fp8_conv.py``'s kernel as a 1x1 convolution over the tokens, with tiles for
    such rows (``linear_small_batch_config``), as ``Fp8Pointwise`` does: the same FP8
    operands, fp32 accumulation, the scales and the fp16 graph's bias in the epilogue,
    fp16 out. Why: cuBLASLt's FP8 kernels are sized for many rows; on ViT-B's shapes at 197
    rows they ran 0.86x cuBLAS's fp16 GEMMs and this kernel 1.25x, and the model's batch-1
    graph 0.950x fp16 against 0.845x (H100, docs/measurements/h100-2026-12-06-j).

    ``small_batch_kernel="triton-split-k"``: "triton", except that a layer whose rows make
    too few programs to fill the GPU (``linear_split_k_config``: ViT-B's proj and fc2 at
    batch 1) runs ``kernels/fp8_split_k.py``'s kernel, the reduction split in two, and the
    graph adds the two fp32 partial sums, scales them and adds the bias, which Inductor
    fuses into the kernel that reads the output (the residual add and LayerNorm)."""

    LAYER = "Linear layer"
    SMALL_BATCH_KERNELS = SMALL_BATCH_POINTWISE

    def __init__(self, linear: nn.Linear, act_scale: float, weight_scale: Any,
                 dtype: torch.dtype, **options: Any) -> None:
        super().__init__(linear.weight, linear.bias, act_scale, weight_scale, dtype, **options)
        if self.small_batch_kernel in TRITON_SMALL_BATCH:
            self.implicit_gemm_scale()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        small = self.small_batch(x)
        if small and self.small_batch_kernel in TRITON_SMALL_BATCH and x.is_cuda:
            return self.implicit_gemm(x)
        return self.rows_matmul(x, small).reshape(*x.shape[:-1], self.out)

    def implicit_gemm(self, x: torch.Tensor) -> torch.Tensor:
        """The small-batch path: the rows quantized (fused by Inductor into the producer's
        kernel), then the Triton kernel over them as [rows, 1, 1, kpad], or their reduction
        split (``split_k_gemm``)."""
        from bundler.targets.torch_aoti.kernels.fp8_conv import (fp8_conv_fused,
                                                                 linear_small_batch_config)

        q = self.quantized_rows(x)
        rows = q.shape[0]
        y = self.split_k_gemm(q) if self.small_batch_kernel == "triton-split-k" else None
        if y is None:
            # the fused op, not the plain one: AOTInductor's compile-time autotuning of a
            # package launching the plain op failed on an H100 ("launcher() missing 2
            # required positional arguments: '_grid_1' and '_grid_2'", h100-2026-12-06-j),
            # as a graph with both did on the H200 (``Fp8Pointwise.triton_gemm``)
            y, _ = fp8_conv_fused(q.reshape(rows, 1, 1, self.kpad), self.weight_fp8,
                                  self.conv_scale, self.bias_out, self.out, (1, 1), (1, 1),
                                  (0, 0), config=linear_small_batch_config(self.kpad))
        y = y.reshape(*x.shape[:-1], self.out)
        return y if self.dtype == torch.float16 else y.to(self.dtype)

    def split_k_gemm(self, q: torch.Tensor) -> torch.Tensor | None:
        """fp16 [rows, out] of the quantized rows ``q`` through the split kernel, or None
        where the layer's rows fill the GPU without a split (``linear_split_k_config``).
        The sum, scale and bias are plain ops for Inductor to fuse into the next kernel, in
        the fused kernel's order: fp32 product times the scale plus the bias, then fp16."""
        from bundler.targets.torch_aoti.kernels.fp8_split_k import (fp8_rows_partials,
                                                                    linear_split_k_config)

        config = linear_split_k_config(q.shape[0], self.kpad, self.out)
        if config is None:
            return None
        partials = fp8_rows_partials(q, self.weight_fp8, self.out, config)
        return (partials.sum(0) * self.conv_scale[:self.out] + self.bias_out).to(torch.float16)


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
    if requested in FUSED_FP8_CONVS:   # whole blocks (fused.py), not one NHWC layer
        requested = "triton"
    from bundler.targets.torch_aoti.kernels import available

    ok, why = available()
    if not ok:
        raise UsageError(f"the Triton FP8 convolution was asked for, but {why}: install the "
                         "triton that matches this torch, or build with "
                         "TRT_BUNDLE_FP8_CONV=im2col (build_engine: fp8_conv=\"im2col\")")
    return "triton"


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
