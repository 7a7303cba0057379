"""A ResNet stem's bias, ReLU, 3x3 max pool and e4m3 quantize in one pass (Triton), a torch
custom op.

Why: in the fused FP8 ResNet (``fused.rewrite_fused``) the stem's 7x7 convolution stays an
fp16 cuDNN convolution, and what follows it ran as three Inductor kernels. One added the
bias and applied the ReLU, one max-pooled, one quantized the pooled map for the first
block's FP8 convolutions. Each pass reads or writes the stem's output, 51 MB at batch 32.
On the H200 (``h200-2026-12-07-a``, kernel profile of the fp8 bundle at batch 32) they took
24 + 25 + 13 us. That is more than the ~35 us that stood between the bundle and 1.2x its fp16
one. Here one program reads each window once (neighbouring windows share their rows in L2)
and writes the e4m3 map, and the fp16 one only where a reader wants it.

Numerics, as the unfused model computes them: the convolution's output without its bias
(fp16, cuDNN's rounding), plus the bias in fp32, rounded to fp16, ReLU, then the max over
the window (padding reads as -inf, as ``MaxPool2d``'s). Rounding and ReLU are monotonic, so
the max of the raw values, biased and rounded once, is the same number. The e4m3 value is
``QuantizeLinear`` of that fp16 value (``fp8_conv._quantize_e4m3``, IEEE division).

Used where ``rewrite_fused(fuse_stem=True)`` is asked for: a family that names
``torch_aoti.fp8_fuse_stem`` (timm_resnet50; docs/measurements/h100-2026-12-07-e).

Imports triton at module level: import this module only where triton may be used
(``kernels.available``).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl
from torch.library import triton_op

from bundler.fp8 import E4M3_MAX
from bundler.targets.torch_aoti.kernels.fp8_conv import _quantize_e4m3, _window_origins
from bundler.targets.torch_aoti.kernels.launch import traceable

__all__ = ["OP", "POOL", "pooled_hw", "relu_maxpool_e4m3"]

OP = "trt_bundle::relu_maxpool_e4m3"
#: The pool this op computes: (kernel, stride, padding), timm ResNet's ``maxpool``.
POOL = (3, 2, 1)
#: Output pixels a program takes (each a row of C channels).
BLOCK_P = 32


def pooled_hw(h: int, w: int) -> tuple[int, int]:
    """The pooled map's sides (``MaxPool2d(3, 2, 1)``, floor mode)."""
    k, s, p = POOL
    return (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1


@triton.jit
def _relu_maxpool_e4m3_kernel(x_ptr, bias_ptr, out_ptr, q_ptr, q_scale_ptr, P, H, W, HO, WO,
                              C, stride_xn, stride_xh, stride_xw,
                              OUT_F16: tl.constexpr, QMAX: tl.constexpr,
                              BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """BLOCK_P output pixels (flat NHWC rows) by BLOCK_C channels: the window max of the
    raw values, the bias, fp16 rounding, ReLU, the outputs (module docstring)."""
    offs_p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    p_ok = offs_p < P
    c_ok = offs_c < C
    img, _ho, _wo, top, left = _window_origins(offs_p, HO, WO, 2, 2, 1, 1)   # POOL's
    rows = x_ptr + img.to(tl.int64) * stride_xn
    best = tl.full((BLOCK_P, BLOCK_C), float("-inf"), tl.float32)
    for tap in tl.static_range(9):
        ih = top + tap // 3
        iw = left + tap % 3
        inside = p_ok & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
        v = tl.load(rows[:, None] + (ih * stride_xh + iw * stride_xw)[:, None]
                    + offs_c[None, :], mask=inside[:, None] & c_ok[None, :],
                    other=float("-inf"))
        best = tl.maximum(best, v.to(tl.float32))
    bias = tl.load(bias_ptr + offs_c, mask=c_ok, other=0.0)
    y16 = tl.maximum((best + bias[None, :]).to(tl.float16), 0.0)
    ok = p_ok[:, None] & c_ok[None, :]
    out_offs = offs_p.to(tl.int64)[:, None] * C + offs_c[None, :]
    if OUT_F16:
        tl.store(out_ptr + out_offs, y16, mask=ok)
    q_scale = tl.load(q_scale_ptr)
    q_inv = tl.math.div_rn(tl.full([], 1.0, tl.float32), q_scale)
    tl.store(q_ptr + out_offs, _quantize_e4m3(y16.to(tl.float32), q_scale, q_inv, QMAX),
             mask=ok)


@triton_op(OP, mutates_args={})
def relu_maxpool_e4m3_op(x: torch.Tensor, bias: torch.Tensor, out_scale: torch.Tensor,
                         out_f16: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` fp16 NHWC [N, H, W, C] (any strides, channels contiguous): the stem's output
    without its bias; ``bias`` fp32 [C]; ``out_scale`` fp32, its first element the e4m3
    scale -> (fp16 [N, Ho, Wo, C] or an empty tensor without ``out_f16``, e4m3
    [N, Ho, Wo, C]), dense NHWC."""
    if x.stride(3) != 1:
        x = x.contiguous()
    n, h, w, c = x.shape
    ho, wo = pooled_hw(h, w)
    out = torch.empty((n, ho, wo, c) if out_f16 else (0,), dtype=torch.float16,
                      device=x.device)
    q = torch.empty((n, ho, wo, c), dtype=torch.float8_e4m3fn, device=x.device)
    pixels = n * ho * wo
    block_c = min(64, triton.next_power_of_2(c))
    grid = (triton.cdiv(pixels, BLOCK_P), triton.cdiv(c, block_c))
    traceable(_relu_maxpool_e4m3_kernel)[grid](
        x, bias, out, q, out_scale, pixels, h, w, ho, wo, c, x.stride(0), x.stride(1),
        x.stride(2), OUT_F16=out_f16, QMAX=E4M3_MAX, BLOCK_P=BLOCK_P, BLOCK_C=block_c,
        num_warps=4)
    return out, q


def relu_maxpool_e4m3(x: torch.Tensor, bias: torch.Tensor, out_scale: torch.Tensor,
                      out_f16: bool = False) -> tuple[Optional[torch.Tensor], torch.Tensor]:
    """The op in the callers' form: (fp16 or None, e4m3), NHWC."""
    y16, y8 = torch.ops.trt_bundle.relu_maxpool_e4m3(x, bias, out_scale, bool(out_f16))
    return (y16 if out_f16 else None), y8
