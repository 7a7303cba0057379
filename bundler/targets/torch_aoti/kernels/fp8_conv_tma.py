"""The fused FP8 convolution for dense 1x1 stride-1 layers with TMA loads and stores (Triton).

Why: ``kernels/fp8_conv.py``'s implicit GEMM loads its tiles with each thread's 16-byte
``cp.async``; ResNet-50's 1x1 layers moved their bytes there at about half the memory
bandwidth and its compute-bound ones ran at 12-19% of the FP8 peak. A 1x1 stride-1
convolution over dense NHWC rows is a plain GEMM, whose tiles Hopper's tensor memory
accelerator copies whole into shared memory in one request. On an H100 (torch 2.11, Triton
3.6, ``benchmarks/fp8_tma_probe.py``, docs/measurements/h100-2026-12-06-e) this kernel ran
timm_resnet50's dense 1x1 layers at batch 32 in 0.770 ms against the shipped kernel's
0.877 (1.14x, count-weighted over the fused model's layers and epilogues), with the same
fp16 bits and e4m3 codes.

The descriptors are made on the host (``TensorDescriptor`` arguments). Made in the kernel
(``tl.make_tensor_descriptor``) they cost more than they saved (0.83x the shipped kernel).
A host descriptor is a by-value kernel argument that torch records only when Dynamo traces
the call: ``torch.library.wrap_triton`` inside a ``triton_op`` is traced without Dynamo and
drops them (torch 2.11 and 2.14: "TMA descriptor capturing not yet supported in non-dynamo
tracing"). So ``fp8_conv_1x1_tma`` is a plain Python function that launches the kernel
itself, and a model that uses it is exported with ``strict=True``
(``build.export_strict``); AOTInductor then encodes the descriptors in its C++ wrapper at
each launch (CUDA-graph replay reuses them).

The computation is ``fp8_conv_nhwc_fused``'s for a 1x1 layer: the same operands, the
reduction over C in fp32, and its epilogue (scale and bias, the fp16 rounding, residual,
ReLU, fp16 and/or e4m3 out). Tiles past the edges read zeros and are not written (the
descriptors clip).

The k x k layers with "same" padding take ``fp8_conv_box_tma``: a window tap of a flat row
tile is no rectangle of memory, but it is one for a tile of output pixels that is itself a
box, ``BI`` images x ``BH`` rows x ``BW`` columns. At stride 1, for tap (r, s) its inputs
are the box that starts at (image, row + r - PH, column + s - PW) of the NHWC input seen
as a 4-D tensor; TMA fills what lies outside it with zeros (negative coordinates too),
which is the convolution's zero padding, and clips the output box's stores at the edges.
At stride 2 (even sides) the input is seen as a 5-D tensor [N, H/2, 2, W/2, 2C]: the
row's parity is a dimension of its own, and the column's parity joins the channels, so
the taps of one parity are again one box (row 2i + d is parity d mod 2, row
i + floor(d / 2)). Triton's blocks are powers of two, so a side that is
not a multiple of the box side computes pixels that are thrown away (``pixel_boxes`` picks
boxes that waste least, of at most ``MAX_BOX_IMAGES`` images: none at 56 and 28, one row
or column in eight at 14 and 7).

Imports triton at module level: import this module only where triton may be used
(``kernels.available``).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import triton
import triton.language as tl

from bundler.fp8 import E4M3_MAX
from bundler.targets.torch_aoti.kernels.fp8_conv import _grouped_tile, _quantize_e4m3

__all__ = ["TmaTiles", "MEASURED_TMA_TILES", "MEASURED_TMA_TILES_BY_BATCH",
           "DEFAULT_TMA_TILES", "GROUP_M",
           "MAX_BOX_ROW_BYTES", "MIN_BOX_ROW_BYTES", "rows_fit", "tiles_fit", "tma_eligible",
           "tma_tiles_for", "fp8_conv_1x1_tma", "BoxTiles", "MEASURED_BOX_TILES",
           "box_eligible", "pixel_boxes", "useful_share", "box_tiles_for", "fp8_conv_box_tma"]

#: (block_m, block_n, block_k, num_warps, num_stages)
TmaTiles = tuple[int, int, int, int, int]
#: The tiles rows are grouped by (``_grouped_tile``), as the shipped kernel's.
GROUP_M = 8
#: Tiles when a layer is not in ``MEASURED_TMA_TILES``.
DEFAULT_TMA_TILES: TmaTiles = (128, 64, 64, 4, 3)
#: The widest tile row a descriptor may have, in bytes: AOTInductor's C++ wrapper encodes a
#: host descriptor with the whole block as its box and a 128-byte swizzle, which the driver
#: refuses for wider rows ("CUDA driver error: invalid argument", torch 2.11 on an H100;
#: Triton's own launcher splits them). So BLOCK_N <= 64 (fp16 outputs and residual) and
#: BLOCK_K <= 128 (e4m3 operands).
MAX_BOX_ROW_BYTES = 128
#: The narrowest: the same encoding refuses rows under 32 bytes ("block size too small",
#: torch 2.11 and 2.14's ``initTMADescriptor``), so BLOCK_N and BLOCK_K >= 32 (e4m3 rows).
MIN_BOX_ROW_BYTES = 32
#: (in channels, out channels) -> tiles for timm_resnet50's dense 1x1 layers at batch 32 on
#: an H100: the fastest of ``fp8_tma_probe.FIT_TILES`` for the layer's costliest epilogue
#: (docs/measurements/h100-2026-12-06-e/tma-fit.log: 0.716 ms over those layers against the
#: shipped kernel's 0.871).
MEASURED_TMA_TILES: Mapping[tuple[int, int], TmaTiles] = {
    (64, 64): (256, 64, 64, 8, 3),
    (64, 256): (128, 64, 64, 4, 3),
    (256, 64): (128, 64, 128, 4, 3),
    (256, 128): (128, 64, 128, 4, 3),
    (128, 512): (128, 64, 64, 4, 4),
    (512, 128): (256, 64, 64, 8, 3),
    (512, 256): (128, 64, 128, 4, 3),
    (256, 1024): (128, 64, 128, 4, 3),
    (1024, 256): (64, 64, 128, 4, 4),
    (1024, 512): (128, 64, 128, 4, 3),
    (512, 2048): (128, 64, 128, 4, 3),
    (2048, 512): (128, 64, 128, 4, 3),
}

#: The same for the graphs of a small static batch (fp8_conv "triton-fused-tma-small"):
#: batch -> (in channels, out channels) -> tiles; a batch without a table runs the shipped
#: kernel there. The fastest of ``fp8_tma_probe.SMALL_FIT_TILES`` for the layer's costliest
#: epilogue, each timed as 20 calls in one CUDA graph, on an H100 (torch 2.11 / triton 3.6,
#: docs/measurements/h100-2026-12-06-i/call2-tma-b*.log): the dense 1x1 layers 0.123 /
#: 0.137 / 0.160 ms at batch 1 / 2 / 4 against the shipped kernel's 0.157 / 0.167 / 0.223
#: with the tables of the time (batch 4's since re-measured: about 0.175).
MEASURED_TMA_TILES_BY_BATCH: Mapping[int, Mapping[tuple[int, int], TmaTiles]] = {
    1: dict.fromkeys(MEASURED_TMA_TILES, (64, 32, 128, 4, 3)),
    2: {**dict.fromkeys(MEASURED_TMA_TILES, (64, 32, 128, 4, 3)),
        (64, 64): (128, 64, 64, 4, 3), (64, 256): (128, 64, 64, 4, 3)},
    4: {**dict.fromkeys(MEASURED_TMA_TILES, (64, 32, 128, 4, 3)),
        (64, 64): (128, 64, 64, 4, 3), (64, 256): (128, 64, 64, 4, 3),
        (256, 128): (128, 64, 64, 4, 3), (128, 512): (64, 64, 128, 4, 4),
        (1024, 512): (64, 64, 128, 4, 4), (512, 2048): (64, 64, 128, 4, 4)},
}


def rows_fit(block_n: int, block_k: int, *, fp16_rows: bool = True,
             e4m3_rows: bool = True) -> bool:
    """Whether a launch's descriptors have rows AOTInductor can encode
    (``MIN_BOX_ROW_BYTES`` to ``MAX_BOX_ROW_BYTES``): its e4m3 operand rows of BLOCK_K,
    and of BLOCK_N its fp16 rows (an fp16 output or residual) and e4m3 output rows where
    it has them. The one rule of both TMA kernels' launches (the 1x1 one asks it for
    every row kind, ``tiles_fit``: its tables serve every epilogue)."""
    rows = ([block_k] + ([2 * block_n] if fp16_rows else [])
            + ([block_n] if e4m3_rows else []))
    return all(MIN_BOX_ROW_BYTES <= r <= MAX_BOX_ROW_BYTES for r in rows)


def tiles_fit(tiles: TmaTiles) -> bool:
    """Whether ``tiles`` suit every launch of the 1x1 kernel (fp16 and e4m3 rows of
    BLOCK_N both: ``rows_fit``)."""
    _bm, bn, bk, _w, _s = tiles
    return rows_fit(bn, bk)


def tma_eligible(cin: int, cout: int, kernel: tuple, stride: tuple, padding: tuple,
                 dilation: tuple) -> bool:
    """Whether a layer is a dense GEMM TMA can tile: 1x1, stride 1, no padding, and rows of
    16-byte multiples (TMA's stride rule: C e4m3 bytes and ``cout`` fp16/e4m3 elements)."""
    return (tuple(kernel) == (1, 1) and tuple(stride) == (1, 1) and tuple(padding) == (0, 0)
            and tuple(dilation) == (1, 1) and cin % 16 == 0 and cout % 16 == 0)


def tma_tiles_for(cin: int, cout: int,
                  table: Mapping[tuple[int, int], TmaTiles] | None = None) -> TmaTiles:
    """The tiles of a layer: ``table``'s (default ``MEASURED_TMA_TILES``), else the default."""
    return tuple((MEASURED_TMA_TILES if table is None else table).get((cin, cout),
                                                                      DEFAULT_TMA_TILES))


@triton.jit
def _scaled_columns(acc, scale_ptr, bias_ptr, off_n, COUT, BLOCK_N: tl.constexpr):
    """The epilogue's start, shared by both TMA kernels: ``acc * scale[n] + bias[n]`` over
    the tile's columns (columns past COUT read 0)."""
    offs_n = off_n + tl.arange(0, BLOCK_N)
    n_ok = offs_n < COUT
    scale = tl.load(scale_ptr + offs_n, mask=n_ok, other=0.0)
    bias = tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0)
    return acc * scale[None, :] + bias[None, :]


@triton.jit
def _e4m3_out(y16, q_scale_ptr, QMAX: tl.constexpr):
    """The e4m3 output: the fp16 result quantized with the scale at ``q_scale_ptr``."""
    q_scale = tl.load(q_scale_ptr)
    q_inv = tl.math.div_rn(tl.full([], 1.0, tl.float32), q_scale)
    return _quantize_e4m3(y16.to(tl.float32), q_scale, q_inv, QMAX)


@triton.jit
def _tma_1x1_tile(a_desc, b_desc, r_desc, o_desc, q_desc, scale_ptr, bias_ptr, q_scale_ptr,
                  M, C, COUT,
                  RELU: tl.constexpr, RESIDUAL: tl.constexpr, OUT_F16: tl.constexpr,
                  OUT_F8: tl.constexpr, QMAX: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """One output tile: rows = output pixels, the reduction over C, the epilogue as
    ``_fp8_conv_nhwc_kernel``'s. A descriptor whose switch is off is not touched."""
    pid_m, pid_n = _grouped_tile(tl.program_id(0), M, COUT, BLOCK_M, BLOCK_N, GROUP_M)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(C, BLOCK_K)):
        a = a_desc.load([off_m, k * BLOCK_K])
        b = b_desc.load([off_n, k * BLOCK_K])
        acc = tl.dot(a, b.T, acc)

    y = _scaled_columns(acc, scale_ptr, bias_ptr, off_n, COUT, BLOCK_N)
    if RESIDUAL:
        y = y.to(tl.float16).to(tl.float32) + r_desc.load([off_m, off_n]).to(tl.float32)
    if RELU:
        y = tl.maximum(y, 0.0)
    y16 = y.to(tl.float16)
    if OUT_F16:
        o_desc.store([off_m, off_n], y16)
    if OUT_F8:
        q_desc.store([off_m, off_n], _e4m3_out(y16, q_scale_ptr, QMAX))


@triton.jit
def _tma_1x1_host_kernel(a_desc, b_desc, r_desc, o_desc, q_desc, scale_ptr, bias_ptr,
                         q_scale_ptr, M, C, COUT,
                         RELU: tl.constexpr, RESIDUAL: tl.constexpr, OUT_F16: tl.constexpr,
                         OUT_F8: tl.constexpr, QMAX: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """``_tma_1x1_tile`` with host-side descriptors (``TensorDescriptor`` arguments)."""
    _tma_1x1_tile(a_desc, b_desc, r_desc, o_desc, q_desc, scale_ptr, bias_ptr, q_scale_ptr,
                  M, C, COUT, RELU, RESIDUAL, OUT_F16, OUT_F8, QMAX, BLOCK_M, BLOCK_N,
                  BLOCK_K, GROUP_M)


def fp8_conv_1x1_tma(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                     bias: torch.Tensor, cout: int, *, residual: torch.Tensor | None = None,
                     relu: bool = False, out_f16: bool = True,
                     out_scale: torch.Tensor | None = None,
                     tiles: TmaTiles = DEFAULT_TMA_TILES
                     ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``fp8_conv_fused`` for a 1x1 stride-1 layer on dense NHWC e4m3 ``x`` (``weight``:
    the layer's e4m3 ``[>= cout, >= C]`` buffer, rows of 16-byte multiples; ``scale``,
    ``bias``: fp32 per output channel; ``out_scale``: its first element quantizes the e4m3
    output). Returns (fp16 or None, e4m3 or None), NHWC ``[N, H, W, cout]``.

    A plain launch, not a torch op: export it with Dynamo (module docstring)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    n, h, w, c = x.shape
    m = n * h * w
    if c % 16 or weight.stride(0) % 16 or cout % 16:
        raise ValueError("fp8_conv_1x1_tma: needs NHWC rows of 16-byte multiples")
    if not tiles_fit(tiles):
        raise ValueError(f"fp8_conv_1x1_tma: tiles {tiles} have rows outside "
                         f"{MIN_BOX_ROW_BYTES}..{MAX_BOX_ROW_BYTES} bytes, which AOTInductor "
                         "cannot encode")
    # the rows as one dense [m, C] matrix; an input traced with other strides (Dynamo's
    # fake CUDA max pool gives NCHW strides where eager keeps channels_last) is copied
    x = x.contiguous()
    if not out_f16 and out_scale is None:
        raise ValueError("fp8_conv_1x1_tma: asked for neither output")
    out = torch.empty((n, h, w, cout) if out_f16 else (0,), dtype=torch.float16,
                      device=x.device)
    q = torch.empty((n, h, w, cout) if out_scale is not None else (0,),
                    dtype=torch.float8_e4m3fn, device=x.device)
    res = residual.contiguous() if residual is not None else None
    bm, bn, bk, warps, stages = tiles
    a = TensorDescriptor.from_tensor(x.view(m, c), [bm, bk])

    def rows(t: torch.Tensor | None) -> TensorDescriptor:
        """An output or the residual as [m, cout] tiles; absent: the input's, never used."""
        return TensorDescriptor.from_tensor(t.view(m, cout), [bm, bn]) if t is not None else a

    grid = (triton.cdiv(m, bm) * triton.cdiv(cout, bn),)
    _tma_1x1_host_kernel[grid](
        a, TensorDescriptor.from_tensor(weight[:cout, :c], [bn, bk]), rows(res),
        rows(out if out_f16 else None), rows(q if out_scale is not None else None),
        scale, bias, out_scale if out_scale is not None else scale, m, c, cout,
        RELU=relu, RESIDUAL=res is not None, OUT_F16=out_f16, OUT_F8=out_scale is not None,
        QMAX=E4M3_MAX, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=GROUP_M,
        num_warps=warps, num_stages=stages)
    return (out if out_f16 else None), (q if out_scale is not None else None)


#: The box kernel's tiles: (images, rows, columns) of a box of output pixels, then
#: (block_n, block_k, num_warps, num_stages).
BoxTiles = tuple[int, int, int, int, int, int, int]
#: (in channels, out channels, kernel side, stride, input height, input width) -> tiles
#: for timm_resnet50's stride-1 3x3 layers at batch 32, the fastest of
#: ``benchmarks/fp8_tma3x3_probe.py``'s candidates on an H100 (torch 2.11, Triton 3.6,
#: docs/measurements/h100-2026-12-07-a/tma3x3.log: 0.256 ms over those layers against the
#: shipped kernel's 0.308, the same e4m3 codes), or None where the shipped kernel was the
#: faster (64 channels on 56x56: 0.0305 against 0.0273 ms). A stride-1 layer without an
#: entry takes ``box_tiles_for``'s rule; a stride-2 one stays on the shipped kernel until
#: the probe has timed it.
MEASURED_BOX_TILES: Mapping[tuple[int, int, int, int, int, int], BoxTiles | None] = {
    (64, 64, 3, 1, 56, 56): None,
    (128, 128, 3, 1, 28, 28): (8, 4, 4, 64, 128, 4, 3),       # 0.0164 ms, shipped 0.0192
    (256, 256, 3, 1, 14, 14): (8, 1, 16, 128, 128, 8, 3),     # 0.0150 ms, shipped 0.0242
    (512, 512, 3, 1, 7, 7): (8, 8, 1, 128, 128, 4, 3),        # 0.0199 ms, shipped 0.0236
}


def box_eligible(cin: int, cout: int, kernel: tuple, stride: tuple, padding: tuple,
                 dilation: tuple) -> bool:
    """Whether a layer is one ``fp8_conv_box_tma`` runs: undilated, "same" padding (a
    square odd kernel, padding kernel // 2); stride 1 with more than one tap (a dense 1x1
    layer is ``fp8_conv_1x1_tma``'s) or stride 2 (its input sides must be even, which the
    launch checks); C a multiple of 32 (a channel block of 32 bytes or more never
    straddles two taps) and ``cout`` of 16 (TMA's 16-byte rows)."""
    kh, kw = tuple(kernel)
    unstrided, strided = tuple(stride) == (1, 1), tuple(stride) == (2, 2)
    return ((unstrided and kh * kw > 1 or strided)
            and tuple(dilation) == (1, 1) and kh == kw and kh % 2 == 1
            and tuple(padding) == (kh // 2, kw // 2) and cin % 32 == 0 and cout % 16 == 0)


def useful_share(n: int, h: int, w: int, bi: int, bh: int, bw: int) -> float:
    """Output pixels over the pixels the boxes compute (the rest lies past an edge)."""
    return (n * h * w) / (triton.cdiv(n, bi) * bi * triton.cdiv(h, bh) * bh
                          * triton.cdiv(w, bw) * bw)


#: The most images one box spans: a box of BI images computes BI images' pixels whatever
#: the batch, so in a dynamic-batch graph a batch below BI wastes the rest (batch 3 on
#: 32-image boxes: 90%).
MAX_BOX_IMAGES = 8


def pixel_boxes(n: int | None, h: int, w: int, rows: int, count: int = 3,
                max_images: int = MAX_BOX_IMAGES) -> list[tuple[int, int, int]]:
    """The ``count`` (images, rows, columns) boxes of ``rows`` pixels that waste least on
    ``n`` images of h x w (None: a dynamic batch, taken as a multiple of every box), ties
    broken towards wider rows."""
    found = []
    for bw in (1, 2, 4, 8, 16, 32, 64):
        for bh in (1, 2, 4, 8, 16, 32, 64):
            bi = rows // (bw * bh)
            if (bi < 1 or bi * bh * bw != rows or bi > max_images
                    or (n is not None and bi > n) or bh > 2 * h or bw > 2 * w):
                continue
            found.append((-useful_share(n or 256, h, w, bi, bh, bw), -bw, (bi, bh, bw)))
    return [box for *_key, box in sorted(found)[:count]]


def box_tiles_for(cin: int, cout: int, k: int, stride: int, h: int, w: int,
                  table: Mapping[tuple[int, int, int, int, int, int], BoxTiles | None]
                  | None = None) -> BoxTiles | None:
    """The tiles of a k x k layer of ``stride`` on h x w input maps, None for the shipped
    kernel: ``table``'s (default ``MEASURED_BOX_TILES``; None there: the shipped kernel
    was faster), else at stride 1 the least wasteful box of 128 output pixels (of 64 where
    that wastes less) by 64 channels, the widest channel block C allows (128 bytes: 3
    stages, 64 or 32: 4), and at stride 2 None (not measured)."""
    table = MEASURED_BOX_TILES if table is None else table
    key = (cin, cout, k, stride, h, w)
    if key in table:
        return None if table[key] is None else tuple(table[key])
    if stride != 1:
        return None
    # (plain loops: Dynamo traces this at export, and refuses max() with a key)
    box, share = None, -1.0
    for rows in (128, 64):                               # the first of equals: 128
        candidate = pixel_boxes(None, h, w, rows, 1)[0]
        candidate_share = useful_share(256, h, w, *candidate)
        if candidate_share > share:
            box, share = candidate, candidate_share
    bk = 128 if cin % 128 == 0 else 64 if cin % 64 == 0 else 32
    return (*box, 64 if cout >= 64 else 32, bk, 4, 3 if bk == 128 else 4)


@triton.jit
def _tma_conv_box_kernel(x_desc, w_desc, o_desc, q_desc, scale_ptr, bias_ptr, q_scale_ptr,
                         N, H, W, C, COUT,
                         KH: tl.constexpr, KW: tl.constexpr, PH: tl.constexpr,
                         PW: tl.constexpr, STRIDE: tl.constexpr,
                         RELU: tl.constexpr, OUT_F16: tl.constexpr, OUT_F8: tl.constexpr,
                         QMAX: tl.constexpr, BI: tl.constexpr, BH: tl.constexpr,
                         BW: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         GROUP_M: tl.constexpr):
    """One box of BI x BH x BW output pixels by BLOCK_N channels (H, W: the output's
    sides): the reduction over (tap, C) with one TMA box per tap and channel block (at
    STRIDE 2 of the 5-D parity view, module docstring), the epilogue as
    ``_tma_1x1_tile``'s without a residual."""
    BLOCK_M: tl.constexpr = BI * BH * BW
    tiles_h = tl.cdiv(H, BH)
    tiles_w = tl.cdiv(W, BW)
    num_m = tl.cdiv(N, BI) * tiles_h * tiles_w
    pid_m, pid_n = _grouped_tile(tl.program_id(0), num_m * BLOCK_M, COUT, BLOCK_M, BLOCK_N,
                                 GROUP_M)
    n0 = (pid_m // (tiles_h * tiles_w)) * BI
    h0 = ((pid_m // tiles_w) % tiles_h) * BH
    w0 = (pid_m % tiles_w) * BW
    off_n = pid_n * BLOCK_N

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    c_tiles = tl.cdiv(C, BLOCK_K)
    for it in range(0, KH * KW * c_tiles):
        tap = it // c_tiles
        k0 = (it % c_tiles) * BLOCK_K
        if STRIDE == 1:
            a = x_desc.load([n0, h0 + tap // KW - PH, w0 + tap % KW - PW, k0])
        else:   # input row 2 * (h0 + i) + dr: parity dr mod 2, row h0 + i + floor(dr / 2)
            dr = tap // KW - PH + 2 * KH           # + 2 KH: >= 0, the same parity
            dc = tap % KW - PW + 2 * KW
            a = x_desc.load([n0, h0 + dr // 2 - KH, dr % 2, w0 + dc // 2 - KW,
                             (dc % 2) * C + k0])
        b = w_desc.load([off_n, tap * C + k0])
        acc = tl.dot(a.reshape(BLOCK_M, BLOCK_K), b.T, acc)

    y = _scaled_columns(acc, scale_ptr, bias_ptr, off_n, COUT, BLOCK_N)
    if RELU:
        y = tl.maximum(y, 0.0)
    y16 = y.to(tl.float16)
    if OUT_F16:
        o_desc.store([n0, h0, w0, off_n], y16.reshape(BI, BH, BW, BLOCK_N))
    if OUT_F8:
        q_desc.store([n0, h0, w0, off_n], _e4m3_out(y16, q_scale_ptr, QMAX).reshape(
            BI, BH, BW, BLOCK_N))


def fp8_conv_box_tma(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                     bias: torch.Tensor, cout: int, kernel: tuple[int, int],
                     padding: tuple[int, int], *, stride: int = 1, relu: bool = False,
                     out_f16: bool = True, out_scale: torch.Tensor | None = None,
                     tiles: BoxTiles = (2, 8, 8, 64, 64, 4, 4)
                     ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``fp8_conv_fused`` without a residual for an undilated layer of ``stride`` 1 or 2
    with "same" padding on NHWC e4m3 ``x`` (``weight``: the shared e4m3
    ``[>= cout, >= KH*KW*C]`` buffer, (kh, kw, C) order). C must be a multiple of BLOCK_K
    (a channel block never straddles two taps); at stride 2 the input's sides must be even.
    Returns (fp16 or None, e4m3 or None), NHWC ``[N, H / stride, W / stride, cout]``.

    A plain launch, not a torch op: export it with Dynamo (module docstring)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    n, h, w, c = x.shape
    kh, kw = kernel
    bi, bh, bw, bn, bk, warps, stages = tiles
    if kh % 2 == 0 or kw % 2 == 0 or tuple(padding) != (kh // 2, kw // 2):
        raise ValueError("fp8_conv_box_tma: needs an odd kernel with 'same' padding "
                         "(kernel // 2)")
    if stride not in (1, 2) or (stride == 2 and (h % 2 or w % 2)):
        raise ValueError(f"fp8_conv_box_tma: stride {stride} on {h}x{w}: stride 1, or 2 "
                         "on even sides")
    if c % bk or c % 16 or weight.stride(0) % 16 or cout % 16:
        raise ValueError(f"fp8_conv_box_tma: C {c} must be a multiple of BLOCK_K {bk} and "
                         f"of 16, cout {cout} of 16, weight rows of 16 bytes")
    if not rows_fit(bn, bk, fp16_rows=out_f16, e4m3_rows=out_scale is not None):
        raise ValueError(f"fp8_conv_box_tma: tiles {tiles} have rows outside "
                         f"{MIN_BOX_ROW_BYTES}..{MAX_BOX_ROW_BYTES} bytes, which AOTInductor "
                         "cannot encode")
    if not out_f16 and out_scale is None:
        raise ValueError("fp8_conv_box_tma: asked for neither output")
    x = x.contiguous()
    ho, wo = h // stride, w // stride
    out = torch.empty((n, ho, wo, cout) if out_f16 else (0,), dtype=torch.float16,
                      device=x.device)
    q = torch.empty((n, ho, wo, cout) if out_scale is not None else (0,),
                    dtype=torch.float8_e4m3fn, device=x.device)
    if stride == 1:
        a = TensorDescriptor.from_tensor(x, [bi, bh, bw, bk])
    else:       # the parity view (module docstring)
        a = TensorDescriptor.from_tensor(x.view(n, ho, 2, wo, 2 * c), [bi, bh, 1, bw, bk])
    o = TensorDescriptor.from_tensor(out, [bi, bh, bw, bn]) if out_f16 else a
    qd = TensorDescriptor.from_tensor(q, [bi, bh, bw, bn]) if out_scale is not None else a
    num_m = triton.cdiv(n, bi) * triton.cdiv(ho, bh) * triton.cdiv(wo, bw)
    _tma_conv_box_kernel[(num_m * triton.cdiv(cout, bn),)](
        a, TensorDescriptor.from_tensor(weight[:cout, :kh * kw * c], [bn, bk]), o, qd,
        scale, bias, out_scale if out_scale is not None else scale, n, ho, wo, c, cout,
        KH=kh, KW=kw, PH=padding[0], PW=padding[1], STRIDE=stride, RELU=relu, OUT_F16=out_f16,
        OUT_F8=out_scale is not None, QMAX=E4M3_MAX, BI=bi, BH=bh, BW=bw, BLOCK_N=bn,
        BLOCK_K=bk, GROUP_M=GROUP_M, num_warps=warps, num_stages=stages)
    return (out if out_f16 else None), (q if out_scale is not None else None)
