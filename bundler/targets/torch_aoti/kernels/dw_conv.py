"""Depthwise convolution on NHWC fp16 activations, its output quantized to e4m3 (Triton), a
torch custom op: the depthwise half of a separable convolution whose 1x1 half is an FP8
GEMM (timm_xception's channels_last fp8 form, ``model.rewrite_channels_last(depthwise=
"triton")``).

Why: in that form each FP8 GEMM reads e4m3 rows that a pointwise kernel quantizes from the
fp16 output of cuDNN's depthwise convolution before it: the activation is written in fp16,
read back and written again in e4m3 (40 quantize kernels of the 80 pointwise ones, 1.30 ms
in all at batch 32 on the H200, docs/measurements/h200-2026-12-02-f). This kernel computes
the convolution, adds the bias (the folded BatchNorm), rounds to fp16 as the graph's fp16
Conv does, and writes ``QuantizeLinear`` of that with the GEMM's activation scale: one
read of the input (the taps of neighbouring pixels come from L1/L2) and one byte per
output element, in the GEMM's row layout (channels padded with zeros to its K).

On the H200 it runs timm_xception's 39 layers in 1.83 ms at batch 32 against 2.42 ms for
cuDNN's kernel plus the quantize pass (``benchmarks/dw_conv_bench.py``), and the fp8
engine at 1.19x fp16 instead of 1.11x (docs/measurements/h200-2026-12-02-g); the family
selects it with ``torch_aoti.fp8_depthwise: triton``. Imports triton at module level:
import it only where triton may be used (``kernels.available``).

That kernel loads each output's 9 taps (L1/L2 hits, but 9 loads and their masks per output;
no tile choice closed the 0.2 ms that issue 18's 1.25x needs, docs/measurements/
h200-2026-12-02-h). Those loads are what bounds it: not its arithmetic, nor DRAM (one
tap: 3.2 TB/s); 2-D tiles, barriers and eviction hints do not help
(``benchmarks/dw_kernel_variants.py``, docs/measurements/h200-2026-12-03-g); loops that
Triton software-pipelines, staging each tap's loads through shared memory, are 1.4-2.4x
slower (docs/measurements/h200-2026-12-03-h); so are row strips that load each input row
once and take its three horizontal taps by ``tl.gather`` (warp shuffles) or by 0/1
shift-matrix products on the tensor cores (331-1024 us on 128x150x150 against the pixel
kernel's 265; docs/measurements/h200-2026-12-04, ``dw-gather.log``).

``_dw_rows_kernel`` (a config with ``rows`` > 0; family.json ``fp8_depthwise:
triton-rows``) walks a strip of output rows down the image and loads each input row once,
adding it to the three output rows it feeds: 3 (rows + 2) / rows loads per output. Its
columns run flat over images, so the 26 layers of 19x19 maps waste no lanes. On the H200
it is slower than the pixel kernel on every layer shape (docs/measurements/h200-2026-12-03-g,
``dw-rows-all.log``); with its walk unrolled (``UNROLL``) 10% faster on the largest map
only.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch.library import triton_op

from bundler.fp8 import E4M3_MAX
from bundler.targets.torch_aoti.kernels.fp8_conv import _quantize_e4m3, _window_origins
from bundler.targets.torch_aoti.kernels.launch import traceable
from bundler.targets.torch_aoti.fp8_layers import conv_output_hw

__all__ = ["DwConvConfig", "DW_CONFIGS", "default_dw_config", "dw_conv_e4m3",
           "element_alignment"]

OP = "trt_bundle::dw_conv_nhwc_e4m3"


class DwConvConfig(NamedTuple):
    """Tile of one program: output pixels x channels, and its warps; ``rows`` > 0 picks the
    row-strip kernel where a layer allows it (``rows_kernel_applies``): ``block_p`` output
    columns (of any images) x ``rows`` output rows x ``block_c`` channels per program."""

    block_p: int
    block_c: int
    num_warps: int
    rows: int = 0


#: Tiles the benchmark compares; the first is the default (the fastest of the first four over
#: timm_xception's forward pass on the H200, docs/measurements/h200-2026-12-02-g; the three
#: of 8 warps are not measured yet).
DW_CONFIGS = (DwConvConfig(64, 64, 4), DwConvConfig(32, 64, 4), DwConvConfig(16, 128, 4),
              DwConvConfig(32, 128, 8), DwConvConfig(64, 64, 8), DwConvConfig(128, 64, 8),
              DwConvConfig(64, 128, 8))

#: Row-strip tiles (``_dw_rows_kernel``), fastest first over the 26 stride-1 728x19x19
#: layers on the H200 at batch 32 (docs/measurements/h200-2026-12-03-b/dw-rows.log: 0.837,
#: 0.910, 1.009, 1.037, 1.110, 1.159, 1.190 ms against the pixel kernel's 64x64x4 at 0.810
#: and cuDNN + quantize at 1.005). None beats the pixel kernel: loading each input row once
#: does not pay on 19-wide maps, where the strip's rolling accumulators cost registers and
#: the three-row reuse is short. The family keeps ``triton``.
DW_ROW_CONFIGS = (DwConvConfig(32, 32, 4, 10), DwConvConfig(16, 64, 4, 19),
                  DwConvConfig(64, 32, 4, 10), DwConvConfig(32, 64, 4, 19),
                  DwConvConfig(32, 64, 8, 10), DwConvConfig(32, 64, 4, 10),
                  DwConvConfig(64, 64, 8, 10))


#: The row-strip tile that family.json ``torch_aoti.fp8_depthwise: triton-rows`` runs
#: (a layer it does not apply to runs the pixel kernel with it): the fastest row tile
#: measured, still 3% slower than ``triton``'s default pixel tile over those layers.
ROW_STRIP_CONFIG = DW_ROW_CONFIGS[0]


def launch_options(cfg: DwConvConfig) -> dict:
    """Triton's launch options for a tile: the row-strip kernel's loop over input rows is
    not software-pipelined (``num_stages=1``): each stage would hold another row of loads
    in registers, and with the five accumulators that spilled (255 registers, ptxas)."""
    return {"num_warps": cfg.num_warps, **({"num_stages": 1} if cfg.rows else {})}


def rows_kernel_applies(kernel: tuple[int, int], stride: tuple[int, int],
                        dilation: tuple[int, int]) -> bool:
    """Whether the row-strip kernel computes this layer: 3 rows of taps, stride 1, no row
    dilation (each input row then feeds three consecutive output rows)."""
    return kernel[0] == 3 and tuple(stride) == (1, 1) and dilation[0] == 1


def default_dw_config(channels: int) -> DwConvConfig:
    """The default tile; 32 channels wide below 64 channels (no lanes spent on masks)."""
    cfg = DW_CONFIGS[0]
    return cfg if channels >= cfg.block_c else DwConvConfig(64, 32, 4)


def element_alignment(*offsets: object) -> int:
    """The largest power of two up to 16 that divides every offset (in elements) the kernel
    adds to its input and weight pointers: its ``ALIGN``.

    Why: Triton vectorizes a load only where it can prove the addresses and the mask of
    neighbouring lanes move together; it learns that of integer arguments only when they
    are divisible by 16. timm_xception's 728-channel layers (26 of the 39) have a channel
    count and pixel strides divisible by 8 only, so without the hint every input load was a
    2-byte load (ptxas: 288 scalar loads per program, against 16-byte ones at 256 channels),
    and those layers ran at 0.4x cuDNN on the H200. A symbolic offset gives 1 (no hint)."""
    align = 16
    for offset in offsets:
        if not isinstance(offset, int):
            return 1
        align = math.gcd(align, offset)
    return align


@triton.jit
def _load_tap(ptrs, mask, RELU_IN: tl.constexpr):
    """One tap's inputs as fp32 (zeros where masked: the padding), the block's ReLU applied."""
    a = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    if RELU_IN:
        a = tl.maximum(a, 0.0)
    return a


@triton.jit
def _e4m3_out(acc, bias, q_scale, q_inv, RELU: tl.constexpr, QMAX: tl.constexpr):
    """The sums plus bias (and ReLU), rounded to fp16 as the graph's fp16 Conv (and Relu)
    output is, then QuantizeLinear: the e4m3 codes (padding channels: 0)."""
    y = acc + bias[None, :]
    if RELU:
        y = tl.maximum(y, 0.0)
    y16 = y.to(tl.float16)
    return _quantize_e4m3(y16.to(tl.float32), q_scale, q_inv, QMAX)


@triton.jit
def _dw_conv_nhwc_e4m3_kernel(
        x_ptr, w_ptr, bias_ptr, q_ptr, q_scale_ptr,
        P, H, W, C, HO, WO, CPAD,
        stride_xn, stride_xh, stride_xw,
        KH: tl.constexpr, KW: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr,
        PH: tl.constexpr, PW: tl.constexpr, DH: tl.constexpr, DW: tl.constexpr,
        RELU: tl.constexpr, RELU_IN: tl.constexpr, QMAX: tl.constexpr, ALIGN: tl.constexpr,
        BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    pid_p = tl.program_id(0)
    pid_c = tl.program_id(1)
    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    p_ok = offs_p < P
    c_ok = (offs_c // ALIGN) < (C // ALIGN)         # offs_c < C, constant over ALIGN lanes
    img, _ho, _wo, ih0, iw0 = _window_origins(offs_p, HO, WO, SH, SW, PH, PW)
    x_rows = x_ptr + tl.multiple_of(img.to(tl.int64) * stride_xn, ALIGN)
    acc = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
    for kh in tl.static_range(KH):
        for kw in tl.static_range(KW):
            ih = ih0 + kh * DH
            iw = iw0 + kw * DW
            inside = p_ok & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)     # zero padding
            pix = tl.multiple_of(ih * stride_xh + iw * stride_xw, ALIGN)
            a = _load_tap(x_rows[:, None] + pix[:, None] + offs_c[None, :],
                          inside[:, None] & c_ok[None, :], RELU_IN)
            # the hint on the offsets, not on the row alone: Triton checks the row's
            # type, and torch's mutation analysis passes C as a constant
            w_offs = tl.multiple_of((kh * KW + kw) * C + offs_c, ALIGN)
            wv = tl.load(w_ptr + w_offs, mask=c_ok, other=0.0)
            acc += a * wv[None, :]
    bias = tl.load(bias_ptr + offs_c, mask=c_ok, other=0.0)
    q_scale = tl.load(q_scale_ptr)
    q_inv = tl.math.div_rn(tl.full([], 1.0, tl.float32), q_scale)
    q = _e4m3_out(acc, bias, q_scale, q_inv, RELU, QMAX)
    out = q_ptr + offs_p.to(tl.int64)[:, None] * CPAD + offs_c[None, :]
    tl.store(out, q, mask=p_ok[:, None] & (offs_c < CPAD)[None, :])


@triton.jit
def _dw_rows_kernel(
        x_ptr, w_ptr, bias_ptr, q_ptr, q_scale_ptr,
        NW, H, W, C, HO, WO, CPAD,
        stride_xn, stride_xh, stride_xw,
        KW: tl.constexpr, PH: tl.constexpr, PW: tl.constexpr, DW: tl.constexpr,
        RELU: tl.constexpr, RELU_IN: tl.constexpr, QMAX: tl.constexpr, ALIGN: tl.constexpr,
        BLOCK_W: tl.constexpr, BLOCK_C: tl.constexpr, ROWS: tl.constexpr,
        UNROLL: tl.constexpr = False):
    """Stride 1, three rows of taps. A program: BLOCK_W output columns (flat over images
    and columns, NW = N * WO of them, so a narrow image wastes no lanes) x ROWS output
    rows x BLOCK_C channels. It walks down the strip's ROWS + 2 input rows, loading each
    input row once (KW shifted loads) and adding it to the three output rows it feeds,
    kept as rolling accumulators: ~3 (ROWS + 2) / ROWS loads per output instead of 9.
    UNROLL: the walk unrolled (2 rows: -10% on a 150x150 map on the H200, slower on 19x19
    ones; more rows spill: docs/measurements/h200-2026-12-03-g), not used by the bundles."""
    pid_w = tl.program_id(0)
    pid_h = tl.program_id(1)
    pid_c = tl.program_id(2)
    offs_w = pid_w * BLOCK_W + tl.arange(0, BLOCK_W)
    offs_c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    w_ok = offs_w < NW
    c_ok = (offs_c // ALIGN) < (C // ALIGN)         # offs_c < C, constant over ALIGN lanes
    img = offs_w // WO
    wo = offs_w % WO
    x_cols = x_ptr + tl.multiple_of(img.to(tl.int64) * stride_xn, ALIGN)
    oh0 = pid_h * ROWS
    bias = tl.load(bias_ptr + offs_c, mask=c_ok, other=0.0)
    q_scale = tl.load(q_scale_ptr)
    q_inv = tl.math.div_rn(tl.full([], 1.0, tl.float32), q_scale)
    out_rows = (img * HO).to(tl.int64)
    # at the top of step r: output row oh0 + r - 2's sum of its first two tap rows, and
    # output row oh0 + r - 1's first
    acc_b = tl.zeros((BLOCK_W, BLOCK_C), dtype=tl.float32)
    acc_c = tl.zeros((BLOCK_W, BLOCK_C), dtype=tl.float32)
    if UNROLL:     # every row's loads may be in flight at once (benchmarks/dw_kernel_variants.py)
        for r in tl.static_range(ROWS + 2):
            acc_b, acc_c = _dw_rows_step(
                r, acc_b, acc_c, x_cols, w_ptr, q_ptr, bias, q_scale, q_inv, wo, w_ok, offs_c,
                c_ok, oh0, out_rows, H, W, C, HO, WO, CPAD, stride_xh, stride_xw,
                KW, PH, PW, DW, RELU, RELU_IN, QMAX, ALIGN, BLOCK_W, BLOCK_C)
    else:
        for r in range(ROWS + 2):
            acc_b, acc_c = _dw_rows_step(
                r, acc_b, acc_c, x_cols, w_ptr, q_ptr, bias, q_scale, q_inv, wo, w_ok, offs_c,
                c_ok, oh0, out_rows, H, W, C, HO, WO, CPAD, stride_xh, stride_xw,
                KW, PH, PW, DW, RELU, RELU_IN, QMAX, ALIGN, BLOCK_W, BLOCK_C)


@triton.jit
def _dw_rows_step(r, acc_b, acc_c, x_cols, w_ptr, q_ptr, bias, q_scale, q_inv, wo, w_ok, offs_c,
                  c_ok, oh0, out_rows, H, W, C, HO, WO, CPAD, stride_xh, stride_xw,
                  KW: tl.constexpr, PH: tl.constexpr, PW: tl.constexpr, DW: tl.constexpr,
                  RELU: tl.constexpr, RELU_IN: tl.constexpr, QMAX: tl.constexpr,
                  ALIGN: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_C: tl.constexpr):
    """Step ``r`` of the row strip: input row oh0 - PH + r loaded once (KW shifted loads)
    and added to the three output rows it feeds; output row oh0 + r - 2, then whole,
    written. ``acc_b``, ``acc_c``: rows oh0 + r - 2 and oh0 + r - 1 so far; returns them
    for the next step."""
    # the row indices as blocks before any comparison: Triton 3.9's interpreter gives a
    # scalar comparison broadcast into a block its operands' int32 data, which tl.load
    # refuses as a mask. Compiled, nothing changes: the PTX of every DW_ROW_CONFIGS tile,
    # fp16 and bf16, looped and unrolled, was the same before and after (Triton 3.8, sm_90)
    ih = tl.broadcast_to(oh0 - PH + r, (BLOCK_W,))
    row_ok = w_ok & (ih >= 0) & (ih < H)
    part_c = tl.zeros((BLOCK_W, BLOCK_C), dtype=tl.float32)   # row oh0 + r's tap row 0
    for kw in tl.static_range(KW):
        iw = wo - PW + kw * DW
        inside = row_ok & (iw >= 0) & (iw < W)                 # zero padding
        pix = tl.multiple_of(ih * stride_xh + iw * stride_xw, ALIGN)
        a = _load_tap(x_cols[:, None] + pix[:, None] + offs_c[None, :],
                      inside[:, None] & c_ok[None, :], RELU_IN)
        acc_b, acc_c, part_c = _add_tap_column(a, acc_b, acc_c, part_c, w_ptr, kw, C, offs_c,
                                               c_ok, KW, ALIGN)
    # output row oh0 + r - 2 has its three tap rows: written
    oh = tl.broadcast_to(oh0 + r - 2, (BLOCK_W,))
    q = _e4m3_out(acc_b, bias, q_scale, q_inv, RELU, QMAX)
    row_out = (r >= 2) & (oh < HO)
    p = (out_rows + oh) * WO + wo
    tl.store(q_ptr + p[:, None] * CPAD + offs_c[None, :], q,
             mask=(w_ok & row_out)[:, None] & (offs_c < CPAD)[None, :])
    return acc_c, part_c


@triton.jit
def _add_tap_column(a, acc_b, acc_c, part_c, w_ptr, kw, C, offs_c, c_ok, KW: tl.constexpr,
                    ALIGN: tl.constexpr):
    """An input row's values at tap column ``kw`` (``a``) added to the three output rows
    that row feeds, as the row strip keeps them: the row two above it (tap row 2, ``acc_b``),
    one above (tap row 1, ``acc_c``) and its own (tap row 0, ``part_c``)."""
    w0 = tl.load(w_ptr + tl.multiple_of(kw * C + offs_c, ALIGN), mask=c_ok, other=0.0)
    w1 = tl.load(w_ptr + tl.multiple_of((KW + kw) * C + offs_c, ALIGN), mask=c_ok, other=0.0)
    w2 = tl.load(w_ptr + tl.multiple_of((2 * KW + kw) * C + offs_c, ALIGN), mask=c_ok,
                 other=0.0)
    return acc_b + a * w2[None, :], acc_c + a * w1[None, :], part_c + a * w0[None, :]


@triton_op(OP, mutates_args={})
def dw_conv_nhwc_e4m3(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                      q_scale: torch.Tensor, cpad: int, kh: int, kw: int, sh: int, sw: int,
                      ph: int, pw: int, dh: int, dw: int, relu: bool, relu_in: bool,
                      block_p: int, block_c: int, num_warps: int, rows: int = 0
                      ) -> torch.Tensor:
    """``x`` fp16 or bf16 [N, H, W, C] (channels contiguous, any pixel strides: e.g. an
    FP8 GEMM's output columns), ``weight`` fp32 [kh*kw, C] (the fp16
    kernel's values, (kh, kw) order), ``bias`` fp32 [C], ``q_scale`` fp32 (its first
    element read) -> e4m3 [N, Ho, Wo, cpad] (cpad >= C; channels C.. are zeros);
    ``relu``: a ReLU before the fp16 rounding; ``relu_in``: a ReLU on the input; ``rows``
    > 0: the row-strip kernel (``block_p`` columns x ``rows`` rows) where it applies."""
    if x.stride(3) != 1:
        x = x.contiguous()
    n, h, w, c = x.shape
    ho, wo = conv_output_hw(h, w, (kh, kw), (sh, sw), (ph, pw), (dh, dw))
    out = torch.empty((n, ho, wo, cpad), dtype=torch.float8_e4m3fn, device=x.device)
    align = element_alignment(c, *x.stride()[:3], x.storage_offset(), weight.storage_offset())
    if rows > 0 and rows_kernel_applies((kh, kw), (sh, sw), (dh, dw)):
        grid = (triton.cdiv(n * wo, block_p), triton.cdiv(ho, rows), triton.cdiv(cpad, block_c))
        traceable(_dw_rows_kernel)[grid](
            x, weight, bias, out, q_scale, n * wo, h, w, c, ho, wo, cpad,
            x.stride(0), x.stride(1), x.stride(2),
            KW=kw, PH=ph, PW=pw, DW=dw, RELU=relu, RELU_IN=relu_in, QMAX=E4M3_MAX,
            ALIGN=align, BLOCK_W=block_p, BLOCK_C=block_c, ROWS=rows, num_warps=num_warps,
            num_stages=1)
        return out
    p = n * ho * wo
    grid = (triton.cdiv(p, block_p), triton.cdiv(cpad, block_c))
    traceable(_dw_conv_nhwc_e4m3_kernel)[grid](
        x, weight, bias, out, q_scale, p, h, w, c, ho, wo, cpad,
        x.stride(0), x.stride(1), x.stride(2),
        KH=kh, KW=kw, SH=sh, SW=sw, PH=ph, PW=pw, DH=dh, DW=dw, RELU=relu, RELU_IN=relu_in,
        QMAX=E4M3_MAX, ALIGN=align, BLOCK_P=block_p, BLOCK_C=block_c, num_warps=num_warps)
    return out


def dw_conv_e4m3(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                 q_scale: torch.Tensor, cpad: int, kernel: tuple[int, int],
                 stride: tuple[int, int], padding: tuple[int, int],
                 dilation: tuple[int, int] = (1, 1), *, relu: bool = False,
                 relu_in: bool = False, config: DwConvConfig | None = None) -> torch.Tensor:
    """The op with the geometry as tuples and the tile as one config (the callers' form)."""
    cfg = config or default_dw_config(x.shape[-1])
    return torch.ops.trt_bundle.dw_conv_nhwc_e4m3(
        x, weight, bias, q_scale, int(cpad), *map(int, kernel), *map(int, stride),
        *map(int, padding), *map(int, dilation), bool(relu), bool(relu_in), *map(int, cfg))
