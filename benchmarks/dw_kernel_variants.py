"""Where the depthwise e4m3 kernel's time goes: variants of ``kernels/dw_conv.py``'s pixel
kernel on timm_xception's two heaviest layer shapes, against the shipped kernel and a copy
kernel (the memory floor of the same tile).

Why: at batch 32 the shipped kernel moves its layers' bytes (fp16/bf16 in, e4m3 out) at
about 1 TB/s on the H200 (128x150x150: 276 MB in 0.26 ms; 728x19x19: 25 MB in 0.03 ms),
a quarter of the memory's speed, and its 39 layers are 1.7 of the fp8 engine's 3.6 ms
(docs/measurements/h200-2026-12-02-g). Each variant removes one candidate cost: the index
arithmetic (integer divisions by runtime sizes), the fp32 math, the taps, their order in
time, the tile's shape. Measured (docs/measurements/h200-2026-12-03-g): neither the math
nor DRAM bounds it, the number of tap loads does (even 9 loads of one address cost 8 us
each on the 150x150 map):

  shipped   the kernel as the bundles run it (sizes as runtime arguments)
  const     the map sizes as compile-time constants (divisions by constants)
  relu16    const + the input's ReLU on the 16-bit values, before the convert
  acc16     relu16 + products and sums in fp16 (not the graph's arithmetic: how much the
            fp32 math costs; its codes differ more)
  center    const, one tap instead of 9 (not a convolution: what the taps cost)
  rowbar, tapbar  const + a barrier after each row of taps / each tap
  evict     const, the taps loaded with eviction_policy "evict_last"
  same9     const, all 9 taps loading the centre pixel (are repeated loads L1 hits?)
  row3, col3, rows2  const, only the centre row's 3 taps / the centre column's / 2 rows
  rowsU<R>  the shipped row-strip kernel with its row walk unrolled (``UNROLL``), R output
            rows a program
  bHxW      const, a program's pixels an H x W block of one image (b8x8bar: + rowbar)
  copy      load, quantize and store the same tile (the memory floor)
  tloop<S>  the 9 taps as a runtime loop of S stages, which Triton software-pipelines
            (its loads staged through shared memory by asynchronous copies)
  blk<K>s<S>[t<S>]  K pixel blocks a program in a loop of S stages (+ the tap loop)
  gath<R>, gathL<R>  R output rows a program (unrolled / a loop), each input row loaded
            once and its three horizontal taps taken by ``tl.gather`` (through shuffles
            or shared memory): one load per input element per program (``--ptxas``
            prints their registers and spills without a GPU)
  sdot<R>, sdotL<R>  the same with the taps as products with 0/1 shift matrices on the
            tensor cores (``tl.dot``, exact)

Measured (docs/measurements/h200-2026-12-04/dw-gather.log, batch 32, tiles 16x128x4,
32x32x4, 32x64x4): the gather and shift-matrix variants take 331-1024 us on 128x150x150
and 39-104 us on 728x19x19; the shipped kernel 265-350 and 33-40 on the same tiles. Only
on 32x64x4, the shipped kernel's slowest tile, do sdot2 / sdot4 match it (332 against 350
us, 39.4 against 39.6); none comes near its best tile (265 / 33 us). Loading each input
once does not pay for the shuffles or the dots that redistribute it.

Each variant's e4m3 codes are compared with the shipped kernel's (share that differ).

  PYTHONPATH=. python3 benchmarks/dw_kernel_variants.py [--batch 32] [--iters 100]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from bundler.fp8 import E4M3_MAX  # noqa: E402
from bundler.targets.torch_aoti.kernels.dw_conv import (  # noqa: E402
    _add_tap_column, _dw_rows_kernel, _e4m3_out, element_alignment)
from bundler.targets.torch_aoti.kernels.fp8_conv import _quantize_e4m3  # noqa: E402

#: (channels, size, stride): the 128x150x150 layer (0.26 ms) and the 26 728x19x19 ones.
SHAPES = ((128, 150, 1), (728, 19, 1))
#: The compiled loop variants (``--asm``: did Triton stage their loads asynchronously?).
LOOP_KERNELS: dict = {}
VARIANTS = ("shipped", "const", "relu16", "acc16", "center", "copy", "rowbar", "tapbar",
            "evict", "b4x16", "b8x8", "b2x32", "b8x8bar", "same9", "row3", "col3", "rows2")


@triton.jit
def _dw_variant_kernel(
        x_ptr, w_ptr, bias_ptr, q_ptr, q_scale_ptr, P, C, CPAD,
        stride_xn, stride_xh, stride_xw,
        H: tl.constexpr, W: tl.constexpr, HO: tl.constexpr, WO: tl.constexpr,
        RELU_IN: tl.constexpr, RELU16: tl.constexpr, ACC16: tl.constexpr,
        CENTER: tl.constexpr, QMAX: tl.constexpr, ALIGN: tl.constexpr,
        BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, BH: tl.constexpr = 0,
        BW: tl.constexpr = 0, PHASES: tl.constexpr = 0, EVICT: tl.constexpr = "",
        TAPS: tl.constexpr = 511, SAME: tl.constexpr = 0):
    """3x3, stride 1, padding 1; the shipped kernel's arithmetic unless a knob says.
    BH > 0: a program's pixels are a BH x BW block of one image (BLOCK_P = BH * BW) instead
    of BLOCK_P consecutive ones; PHASES 1: a barrier after each row of taps, 2: after each
    tap (a tap's loads then find the lines the one before brought into L1); EVICT: the
    taps' loads' eviction policy; TAPS: which of the 9 taps (bit kh * 3 + kw) it sums;
    SAME: every tap loads the centre pixel (9 loads of one address)."""
    pid_p = tl.program_id(0)
    pid_c = tl.program_id(1)
    offs_c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = (offs_c // ALIGN) < (C // ALIGN)
    if BH > 0:
        TH: tl.constexpr = (HO + BH - 1) // BH
        TW: tl.constexpr = (WO + BW - 1) // BW
        i = tl.arange(0, BLOCK_P)
        # a block, as in the other branch: Triton 3.9 refuses x_rows[:, None] on a scalar
        img = tl.broadcast_to(pid_p // (TH * TW), (BLOCK_P,))
        ho = ((pid_p // TW) % TH) * BH + i // BW
        wo = (pid_p % TW) * BW + i % BW
        p_ok = (img < P // (HO * WO)) & (ho < HO) & (wo < WO)
        offs_p = (img * HO + ho) * WO + wo
    else:
        offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
        p_ok = offs_p < P
        wo = offs_p % WO
        ho = (offs_p // WO) % HO
        img = offs_p // (WO * HO)
    x_rows = x_ptr + tl.multiple_of(img.to(tl.int64) * stride_xn, ALIGN)
    if ACC16:
        acc = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float16)
    else:
        acc = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
    for kh in tl.static_range(3):
        for kw in tl.static_range(3):
            if ((not CENTER) or (kh == 1 and kw == 1)) and ((TAPS >> (kh * 3 + kw)) & 1):
                ih = ho - 1 + kh * (1 - SAME) + SAME
                iw = wo - 1 + kw * (1 - SAME) + SAME
                inside = p_ok & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
                pix = tl.multiple_of(ih * stride_xh + iw * stride_xw, ALIGN)
                a = tl.load(x_rows[:, None] + pix[:, None] + offs_c[None, :],
                            mask=inside[:, None] & c_ok[None, :], other=0.0,
                            eviction_policy=EVICT)
                if RELU_IN and RELU16:
                    a = tl.maximum(a, 0.0)
                w_offs = tl.multiple_of((kh * 3 + kw) * C + offs_c, ALIGN)
                wv = tl.load(w_ptr + w_offs, mask=c_ok, other=0.0)
                if ACC16:
                    acc += a.to(tl.float16) * wv.to(tl.float16)[None, :]
                else:
                    a = a.to(tl.float32)
                    if RELU_IN and not RELU16:
                        a = tl.maximum(a, 0.0)
                    acc += a * wv[None, :]
                if PHASES == 2:
                    tl.debug_barrier()
        if PHASES == 1:
            tl.debug_barrier()
    bias = tl.load(bias_ptr + offs_c, mask=c_ok, other=0.0)
    q_scale = tl.load(q_scale_ptr)
    q_inv = tl.math.div_rn(tl.full([], 1.0, tl.float32), q_scale)
    q = _e4m3_out(acc.to(tl.float32), bias, q_scale, q_inv, False, QMAX)
    out = q_ptr + offs_p.to(tl.int64)[:, None] * CPAD + offs_c[None, :]
    tl.store(out, q, mask=p_ok[:, None] & (offs_c < CPAD)[None, :])


@triton.jit
def _tap_products(x_rows, w_ptr, ho, wo, p_ok, offs_c, c_ok, kh, kw, C, stride_xh, stride_xw,
                  H: tl.constexpr, W: tl.constexpr, ALIGN: tl.constexpr):
    """Tap (kh, kw) of a 3x3, stride 1, padding 1 window: ReLU(input) x weight, in fp32
    (the shipped kernel's arithmetic), for a block of output pixels x channels."""
    ih = ho - 1 + kh
    iw = wo - 1 + kw
    inside = p_ok & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
    pix = tl.multiple_of(ih * stride_xh + iw * stride_xw, ALIGN)
    a = tl.load(x_rows[:, None] + pix[:, None] + offs_c[None, :],
                mask=inside[:, None] & c_ok[None, :], other=0.0)
    wv = tl.load(w_ptr + tl.multiple_of((kh * 3 + kw) * C + offs_c, ALIGN), mask=c_ok,
                 other=0.0)
    return tl.maximum(a.to(tl.float32), 0.0) * wv[None, :]


@triton.jit
def _dw_loop_kernel(
        x_ptr, w_ptr, bias_ptr, q_ptr, q_scale_ptr, P, C, CPAD,
        stride_xn, stride_xh, stride_xw,
        H: tl.constexpr, W: tl.constexpr, HO: tl.constexpr, WO: tl.constexpr,
        QMAX: tl.constexpr, ALIGN: tl.constexpr, BLOCK_P: tl.constexpr,
        BLOCK_C: tl.constexpr, TAP_STAGES: tl.constexpr, BLOCKS: tl.constexpr,
        BLOCK_STAGES: tl.constexpr):
    """``const`` with loops Triton may software-pipeline (its pipeliner stages a loop's
    loads through shared memory with asynchronous copies, ``num_stages`` deep): the 9 taps
    as a runtime loop (TAP_STAGES > 0), and/or BLOCKS consecutive pixel blocks per program
    in a loop of BLOCK_STAGES stages (the next block's taps in flight while this one's
    are summed)."""
    pid_p = tl.program_id(0)
    pid_c = tl.program_id(1)
    offs_c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = (offs_c // ALIGN) < (C // ALIGN)
    bias = tl.load(bias_ptr + offs_c, mask=c_ok, other=0.0)
    q_scale = tl.load(q_scale_ptr)
    q_inv = tl.math.div_rn(tl.full([], 1.0, tl.float32), q_scale)
    for blk in tl.range(0, BLOCKS, num_stages=BLOCK_STAGES):
        offs_p = (pid_p * BLOCKS + blk) * BLOCK_P + tl.arange(0, BLOCK_P)
        p_ok = offs_p < P
        wo = offs_p % WO
        ho = (offs_p // WO) % HO
        img = offs_p // (WO * HO)
        x_rows = x_ptr + tl.multiple_of(img.to(tl.int64) * stride_xn, ALIGN)
        acc = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
        if TAP_STAGES > 0:
            for t in tl.range(0, 9, num_stages=TAP_STAGES):
                acc += _tap_products(x_rows, w_ptr, ho, wo, p_ok, offs_c, c_ok, t // 3, t % 3,
                                     C, stride_xh, stride_xw, H, W, ALIGN)
        else:
            for kh in tl.static_range(3):
                for kw in tl.static_range(3):
                    acc += _tap_products(x_rows, w_ptr, ho, wo, p_ok, offs_c, c_ok, kh, kw,
                                         C, stride_xh, stride_xw, H, W, ALIGN)
        q = _e4m3_out(acc, bias, q_scale, q_inv, False, QMAX)
        out = q_ptr + offs_p.to(tl.int64)[:, None] * CPAD + offs_c[None, :]
        tl.store(out, q, mask=p_ok[:, None] & (offs_c < CPAD)[None, :])


@triton.jit
def _dw_gather_kernel(
        x_ptr, w_ptr, bias_ptr, q_ptr, q_scale_ptr, NW, C, CPAD,
        stride_xn, stride_xh, stride_xw,
        H: tl.constexpr, W: tl.constexpr, QMAX: tl.constexpr, ALIGN: tl.constexpr,
        BLOCK_W: tl.constexpr, BLOCK_C: tl.constexpr, ROWS: tl.constexpr,
        UNROLL: tl.constexpr, DOT: tl.constexpr = False):
    """3x3, stride 1, padding 1, the shipped kernel's arithmetic; each input element loaded
    once per program. A program: BLOCK_W - 2 output columns (flat over images, as the
    row-strip kernel's) x ROWS output rows x BLOCK_C channels. It walks down the strip's
    ROWS + 2 input rows; each row is one load of BLOCK_W columns (its outputs' columns and
    one on each side), and its three horizontal taps are ``tl.gather``s of that tile. Triton
    moves the tile (through shared memory) to a layout with the pixels across a warp's
    lanes and gathers with warp shuffles (sm_90 PTX of a 32x64 tile: 192 ``shfl.sync``):
    the input read from L2 once per program, where the shipped kernel loads each of its 9
    taps through L1.
    DOT: the taps are products with 0/1 shift matrices on the tensor cores instead
    (``tl.dot``: exact, one nonzero term per output; the tile goes through shared memory
    as the MMA's operand)."""
    pid_w = tl.program_id(0)
    pid_h = tl.program_id(1)
    pid_c = tl.program_id(2)
    TW: tl.constexpr = BLOCK_W - 2
    i = tl.arange(0, BLOCK_W)
    offs_c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = (offs_c // ALIGN) < (C // ALIGN)
    f_in = pid_w * TW - 1 + i                   # the loaded flat columns
    in_ok = (f_in >= 0) & (f_in < NW)
    f_in = tl.where(in_ok, f_in, 0)
    x_cols = (x_ptr + tl.multiple_of((f_in // W).to(tl.int64) * stride_xn, ALIGN)
              + tl.multiple_of((f_in % W) * stride_xw, ALIGN))
    f_out = pid_w * TW + i                      # output i reads loaded columns i .. i + 2
    out_ok = (i < TW) & (f_out < NW)
    wo = f_out % W
    img = f_out // W
    bias = tl.load(bias_ptr + offs_c, mask=c_ok, other=0.0)
    q_scale = tl.load(q_scale_ptr)
    q_inv = tl.math.div_rn(tl.full([], 1.0, tl.float32), q_scale)
    oh0 = pid_h * ROWS
    acc_b = tl.zeros((BLOCK_W, BLOCK_C), dtype=tl.float32)
    acc_c = tl.zeros((BLOCK_W, BLOCK_C), dtype=tl.float32)
    if UNROLL:
        for r in tl.static_range(ROWS + 2):
            acc_b, acc_c = _dw_gather_step(
                r, acc_b, acc_c, x_cols, in_ok, w_ptr, q_ptr, bias, q_scale, q_inv, i, wo,
                img, out_ok, offs_c, c_ok, oh0, C, CPAD, stride_xh, H, W, QMAX, ALIGN,
                BLOCK_W, BLOCK_C, DOT)
    else:
        for r in range(ROWS + 2):
            acc_b, acc_c = _dw_gather_step(
                r, acc_b, acc_c, x_cols, in_ok, w_ptr, q_ptr, bias, q_scale, q_inv, i, wo,
                img, out_ok, offs_c, c_ok, oh0, C, CPAD, stride_xh, H, W, QMAX, ALIGN,
                BLOCK_W, BLOCK_C, DOT)


@triton.jit
def _dw_gather_step(r, acc_b, acc_c, x_cols, in_ok, w_ptr, q_ptr, bias, q_scale, q_inv, i, wo,
                    img, out_ok, offs_c, c_ok, oh0, C, CPAD, stride_xh, H: tl.constexpr,
                    W: tl.constexpr, QMAX: tl.constexpr, ALIGN: tl.constexpr,
                    BLOCK_W: tl.constexpr, BLOCK_C: tl.constexpr, DOT: tl.constexpr):
    """``_dw_rows_step`` with the input row loaded once and its taps gathered from it."""
    ih = oh0 - 1 + r
    ih_w = tl.broadcast_to(ih, (BLOCK_W,))      # compared as a block: see _dw_rows_step
    row_ok = in_ok & (ih_w >= 0) & (ih_w < H)
    x = tl.load(x_cols[:, None] + tl.multiple_of(ih * stride_xh, ALIGN) + offs_c[None, :],
                mask=row_ok[:, None] & c_ok[None, :], other=0.0)
    part_c = tl.zeros((BLOCK_W, BLOCK_C), dtype=tl.float32)
    for kw in tl.static_range(3):
        if DOT:     # row i of the product is row i + kw of x (none past the tile)
            shift = (tl.arange(0, BLOCK_W)[None, :] == (i + kw)[:, None]).to(x.dtype)
            a = tl.dot(shift, x)
        else:
            idx = tl.minimum(i + kw, BLOCK_W - 1)[:, None] + tl.zeros((1, BLOCK_C), tl.int32)
            a = tl.gather(x, idx, 0).to(tl.float32)
        tap_ok = (wo + kw - 1 >= 0) & (wo + kw - 1 < W)        # the same image's column
        a = tl.where(tap_ok[:, None], tl.maximum(a, 0.0), 0.0)
        acc_b, acc_c, part_c = _add_tap_column(a, acc_b, acc_c, part_c, w_ptr, kw, C, offs_c,
                                               c_ok, 3, ALIGN)
    oh = tl.broadcast_to(oh0 + r - 2, (BLOCK_W,))
    q = _e4m3_out(acc_b, bias, q_scale, q_inv, False, QMAX)
    p = (img.to(tl.int64) * H + oh) * W + wo
    tl.store(q_ptr + p[:, None] * CPAD + offs_c[None, :], q,
             mask=(out_ok & (r >= 2) & (oh < H))[:, None] & (offs_c < CPAD)[None, :])
    return acc_c, part_c


@triton.jit
def _copy_kernel(x_ptr, q_ptr, q_scale_ptr, P, C, CPAD, stride_xp, ALIGN: tl.constexpr,
                 QMAX: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    pid_p = tl.program_id(0)
    pid_c = tl.program_id(1)
    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    p_ok = offs_p < P
    c_ok = (offs_c // ALIGN) < (C // ALIGN)
    a = tl.load(x_ptr + tl.multiple_of(offs_p.to(tl.int64) * stride_xp, ALIGN)[:, None]
                + offs_c[None, :], mask=p_ok[:, None] & c_ok[None, :], other=0.0)
    q_scale = tl.load(q_scale_ptr)
    q_inv = tl.math.div_rn(tl.full([], 1.0, tl.float32), q_scale)
    q = _quantize_e4m3(a.to(tl.float32), q_scale, q_inv, QMAX)
    tl.store(q_ptr + offs_p.to(tl.int64)[:, None] * CPAD + offs_c[None, :], q,
             mask=p_ok[:, None] & (offs_c < CPAD)[None, :])


def run_variant(name: str, x, taps, bias, scale, cpad: int, block=(64, 64, 4)):
    """One launch of ``name`` on ``x`` (bf16 [N, H, W, C] view of GEMM rows): e4m3 out."""
    from bundler.targets.torch_aoti.kernels.dw_conv import DwConvConfig, dw_conv_e4m3

    n, h, w, c = x.shape
    bp, bc, warps = block
    if name == "shipped":
        return dw_conv_e4m3(x, taps, bias, scale, cpad, (3, 3), (1, 1), (1, 1), relu_in=True,
                            config=DwConvConfig(bp, bc, warps))
    out = torch.empty((n, h, w, cpad), dtype=torch.float8_e4m3fn, device=x.device)
    align = element_alignment(c, *x.stride()[:3], x.storage_offset(), taps.storage_offset())
    p = n * h * w
    grid = (triton.cdiv(p, bp), triton.cdiv(cpad, bc))
    if name.startswith("rowsU"):      # rowsU<R>: the shipped row strip unrolled, R rows
        rows = int(name[5:])
        grid = (triton.cdiv(n * w, bp), triton.cdiv(h, rows), triton.cdiv(cpad, bc))
        _dw_rows_kernel[grid](
            x, taps, bias, out, scale, n * w, h, w, c, h, w, cpad,
            x.stride(0), x.stride(1), x.stride(2), KW=3, PH=1, PW=1, DW=1, RELU=False,
            RELU_IN=True, QMAX=E4M3_MAX, ALIGN=align, BLOCK_W=bp, BLOCK_C=bc, ROWS=rows,
            UNROLL=True, num_warps=warps)
        return out
    if name.startswith(("gath", "sdot")):   # gath<R> / gathL<R> (a loop), sdot<R> / sdotL<R>
        rows = int(name[5:] if name[4] == "L" else name[4:])
        grid = (triton.cdiv(n * w, bp - 2), triton.cdiv(h, rows), triton.cdiv(cpad, bc))
        _dw_gather_kernel[grid](
            x, taps, bias, out, scale, n * w, c, cpad, x.stride(0), x.stride(1), x.stride(2),
            H=h, W=w, QMAX=E4M3_MAX, ALIGN=align, BLOCK_W=bp, BLOCK_C=bc, ROWS=rows,
            UNROLL=name[4] != "L", DOT=name.startswith("sdot"), num_warps=warps,
            num_stages=1)
        return out
    if name.startswith(("tloop", "blk")):   # tloop<S>, blk<K>s<S>[t<S>]
        m = re.fullmatch(r"tloop(\d)|blk(\d+)s(\d)(?:t(\d))?", name)
        tap_stages, blocks, block_stages = ((int(m[1]), 1, 1) if m[1] else
                                            (int(m[4] or 0), int(m[2]), int(m[3])))
        grid = (triton.cdiv(p, bp * blocks), triton.cdiv(cpad, bc))
        LOOP_KERNELS[name] = _dw_loop_kernel[grid](
            x, taps, bias, out, scale, p, c, cpad, x.stride(0), x.stride(1), x.stride(2),
            H=h, W=w, HO=h, WO=w, QMAX=E4M3_MAX, ALIGN=align, BLOCK_P=bp, BLOCK_C=bc,
            TAP_STAGES=tap_stages, BLOCKS=blocks, BLOCK_STAGES=block_stages,
            num_warps=warps)
        return out
    if name == "copy":
        _copy_kernel[grid](x, out, scale, p, c, cpad, x.stride(2), ALIGN=align, QMAX=E4M3_MAX,
                           BLOCK_P=bp, BLOCK_C=bc, num_warps=warps)
        return out
    knobs = {"const": (0, 0, 0), "relu16": (1, 0, 0), "acc16": (1, 1, 0),
             "center": (0, 0, 1)}.get(name, (0, 0, 0))
    extra = {"rowbar": dict(PHASES=1), "tapbar": dict(PHASES=2),
             "evict": dict(EVICT="evict_last"), "b4x16": dict(BH=4, BW=16),
             "b8x8": dict(BH=8, BW=8), "b2x32": dict(BH=2, BW=32),
             "b8x8bar": dict(BH=8, BW=8, PHASES=1), "same9": dict(SAME=1),
             "row3": dict(TAPS=0b000111000), "col3": dict(TAPS=0b010010010),
             "rows2": dict(TAPS=0b000111111)}.get(name, {})
    if "BH" in extra:
        bp = extra["BH"] * extra["BW"]
        grid = (n * triton.cdiv(h, extra["BH"]) * triton.cdiv(w, extra["BW"]),
                triton.cdiv(cpad, bc))
    _dw_variant_kernel[grid](
        x, taps, bias, out, scale, p, c, cpad, x.stride(0), x.stride(1), x.stride(2),
        H=h, W=w, HO=h, WO=w, RELU_IN=True, RELU16=knobs[0], ACC16=knobs[1], CENTER=knobs[2],
        QMAX=E4M3_MAX, ALIGN=align, BLOCK_P=bp, BLOCK_C=bc, num_warps=warps, **extra)
    return out


def inputs(c: int, size: int, batch: int, device: str):
    from bundler.targets.torch_aoti.fp8_layers import padded

    g = torch.Generator().manual_seed(0)
    cpad = padded(c)
    rows = torch.randn(batch * size * size, cpad, generator=g).bfloat16().to(device)
    x = rows[:, :c].reshape(batch, size, size, c)
    taps = (torch.randn(9, c, generator=g) * 0.3).half().float().to(device)
    bias = (torch.randn(c, generator=g) * 0.1).half().float().to(device)
    scale = torch.tensor([0.02], device=device)
    return x, taps, bias, scale, cpad


def gather_ptxas(names: list[str], blocks: list[tuple[int, int, int]]) -> int:
    """``--ptxas``: the gather variants' resources for sm_90 on both shapes (bf16 rows), as
    ``dw_conv_bench.py --ptxas`` reports the shipped tiles': a spilling tile shows before
    any device time is spent on it."""
    import tempfile

    from fp8_conv_bench import ptxas_resources

    kernel = _dw_gather_kernel
    pointers = {"x_ptr": "*bf16", "w_ptr": "*fp32", "bias_ptr": "*fp32", "q_ptr": "*fp8e4nv",
                "q_scale_ptr": "*fp32"}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(kernel.arg_names)
             if n in pointers or n == "CPAD"}
    with tempfile.TemporaryDirectory() as tmp:
        for c, size, _stride in SHAPES:
            align = element_alignment(c)
            for bw, bc, warps in blocks:
                for name in names:
                    loop = name[4] == "L"
                    consts = dict(H=size, W=size, QMAX=E4M3_MAX, ALIGN=align, BLOCK_W=bw,
                                  BLOCK_C=bc, ROWS=int(name[5:] if loop else name[4:]),
                                  UNROLL=not loop, DOT=name.startswith("sdot"))
                    sig = {n: "constexpr" if n in consts else pointers.get(n, "i32")
                           for n in kernel.arg_names}
                    res = ptxas_resources(kernel, sig, consts, attrs,
                                          {"num_warps": warps, "num_stages": 1}, 90, Path(tmp))
                    print(f"  {c}x{size}x{size} {bw}x{bc}x{warps} {name:7s} regs "
                          f"{res.registers:>3s}  spill {res.spill_bytes:>4s} B  smem "
                          f"{res.shared_bytes:6d} B", flush=True)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--blocks", default="64x64x4",
                    help="tiles (pixels x channels x warps), comma-separated")
    ap.add_argument("--asm", action="store_true",
                    help="print each loop variant's asynchronous copies (Triton's TTGIR)")
    ap.add_argument("--ptxas", action="store_true",
                    help="no GPU needed: compile the gather variants (gath<R>, sdot<R>, ...) of "
                         "--variants for sm_90 with each of --blocks and print ptxas' "
                         "registers, spills and shared memory")
    args = ap.parse_args(argv)
    if args.ptxas:
        return gather_ptxas([n for n in args.variants.split(",")
                             if n.startswith(("gath", "sdot"))],
                            [tuple(int(v) for v in b.split("x")) for b in args.blocks.split(",")])
    if not torch.cuda.is_available():
        print("no CUDA GPU here", file=sys.stderr)
        return 2
    from fp8_conv_bench import graph_time

    blocks = [tuple(int(v) for v in b.split("x")) for b in args.blocks.split(",")]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, batch {args.batch}",
          flush=True)
    for c, size, _stride in SHAPES:
        x, taps, bias, scale, cpad = inputs(c, size, args.batch, "cuda")
        moved = x.numel() * 2 + x.shape[0] * size * size * cpad     # bytes in + e4m3 out
        ref = run_variant("shipped", x, taps, bias, scale, cpad)
        for block in blocks:
            for name in args.variants.split(","):
                try:
                    with torch.no_grad():
                        ms, got = graph_time(lambda name=name: run_variant(
                            name, x, taps, bias, scale, cpad, block), args.iters)
                except Exception as e:  # noqa: BLE001 - reported; the other variants go on
                    print(f"  {c}x{size}x{size} {'x'.join(map(str, block)):9s} {name:8s} "
                          f"FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
                    continue
                differ = float((got.view(torch.uint8) != ref.view(torch.uint8)).float().mean())
                print(f"  {c}x{size}x{size} {'x'.join(map(str, block)):9s} {name:8s} "
                      f"{ms * 1000:8.1f} us  {moved / ms / 1e9:6.2f} TB/s  differ "
                      f"{differ:.1e}", flush=True)
    for name, kernel in sorted(LOOP_KERNELS.items()) if args.asm else ():
        ttgir = kernel.asm.get("ttgir", "")
        print(f"  {name}: {ttgir.count('async_copy_global_to_local')} async copies, "
              f"{ttgir.count('async_wait')} waits in its TTGIR", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
