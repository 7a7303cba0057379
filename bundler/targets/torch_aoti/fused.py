"""ResNet bottlenecks with fused FP8 convolutions (torch-aoti fp8, ``fp8_conv="triton-fused"``).

Why: on the H200 (families/timm_resnet50/README.md) the Triton FP8 convolution beats cuDNN's
fp16 one by 1.62x over ResNet-50's 52 layers, yet the fp8 model ran 0.83x the fp16 one: the
time went around the convolutions (a quantize pass before every FP8 layer, fp16 conversions,
the NHWC rewrite's own modules, the residual add and ReLU as passes of their own). Here each
bottleneck of the channels_last fp16 model (NCHW shape, NHWC strides: the kernel takes
strides, so no NHWC rewrite of the rest of the model) runs its convolutions on
``kernels/fp8_conv.py``'s kernel with the epilogues fused:

* conv1 (1x1, BN folded) + ReLU -> e4m3 written with conv2's activation scale;
* conv2 (3x3) + ReLU -> e4m3 with conv3's scale;
* downsample (1x1, stride 2 in stages 2-4) -> fp16, read as conv3's residual;
* conv3 (1x1) + shortcut + ReLU -> fp16 (the next block's residual) and e4m3 with the next
  block's conv1 scale: one Quantize per tensor, as the recipe's calibration has one scale
  per activation tensor (the next block's downsample reads the same tensor: it takes that
  e4m3 too when its scale is the same, as the graph's shared QuantizeLinear makes it).

The stem, max pool, global pool and classifier stay fp16 (cuDNN / Inductor) as in the fp16
engine. A convolution the recipe does not select (the fp8-pointwise variant's 3x3 ones)
stays an fp16 cuDNN convolution, and its producer writes fp16 only. The numerics are the
ONNX graph's Q/DQ ones: activations quantized with the calibrated per-tensor scale from the
fp16 value, per-channel weights (``Fp8Gemm``'s buffers, so bit-identical FP8 operands),
fp32 accumulation, the convolution's output rounded to fp16 before the residual add.

Blocks pass ``(fp16, e4m3 or None)`` to the next block and a plain fp16 tensor where no FP8
block follows (the last one, before the global pool); ``(None, e4m3)`` where the next block
reads only the e4m3 (a stage's first block, whose conv1 and downsample share it), so that
the fp16 output nobody reads is not written. The blocks are found by structure
(``bottleneck_parts``): timm's ``Bottleneck`` with its BatchNorms folded (Identity),
no SE, drop-block, anti-aliasing or drop-path; anything else is refused by name.

Needs triton (the kernel); this module imports torch, and triton only when a block is built.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bundler.fp8 import stored_scale
from bundler.targets.torch_aoti.fp8_layers import (SMALL_BATCH, Fp8ConvNHWC, quantize,
                                                   static_batch)
from runtime_py.errors import UsageError

__all__ = ["FusedConv", "FusedBottleneck", "StemConv", "StemPool", "bottleneck_parts",
           "rewrite_fused", "scale_tensor", "stem_parts", "uses_tma"]

#: The submodules of a timm Bottleneck that must be no-ops once BatchNorm is folded.
_IDENTITIES = ("bn1", "bn2", "bn3", "drop_block", "aa")
_RELUS = ("act1", "act2", "act3")


#: Elements of an output-scale buffer (all the same value; the kernel reads the first).
#: AOTInductor turns a 0-d constant into a scalar literal and inlines a 1-d one of <= 8
#: elements as a computed tensor (``GraphLowering.get_attr``); the first broke the cpp
#: wrapper's launch of the Triton kernel, which takes a pointer (H200, torch 2.11:
#: "'<=' not supported between instances of 'Constant' and 'int'"). 16 keeps it a buffer.
SCALE_SLOTS = 16


def scale_tensor(scale: float) -> torch.Tensor:
    """An output-scale buffer of ``SCALE_SLOTS`` copies of the stored scale (the kernel
    reads the first)."""
    return torch.full((SCALE_SLOTS,), float(stored_scale(scale)), dtype=torch.float32)


class FusedConv(nn.Module):
    """One convolution of a fused bottleneck on NHWC data: FP8 on the Triton kernel with
    its epilogue (residual, ReLU, fp16 and/or e4m3 out), or, not selected, fp16 cuDNN.

    ``scales``: (activation scale, per-channel weight scales) for FP8, None for fp16.
    ``out16``: write the fp16 result; ``out_scale``: also write it quantized with that
    (the consumer's activation) scale. ``forward(x16, x8, residual)`` takes the input as
    fp16 NHWC and/or e4m3 NHWC (already quantized with this layer's activation scale) and
    returns (fp16 or None, e4m3 or None).

    ``tma``: a dense 1x1 stride-1 FP8 layer runs on ``kernels/fp8_conv_tma.py``'s kernel
    (TMA loads and stores, the same numerics) instead, except in a graph of a small static
    batch (<= ``fp8_layers.SMALL_BATCH`` images; batch 1 ran 0.370 ms with batch 32's TMA
    tiles against 0.356 without on an H100); ``self.tma_tiles`` says whether it may (None:
    the shipped kernel). ``tma_batch_tiles`` (batch -> (in, out channels) -> tiles): such a
    graph takes TMA too where its batch has TMA tiles for the layer (fp8_conv
    "triton-fused-tma-small" passes ``MEASURED_TMA_TILES_BY_BATCH``: per layer 1.22-1.39x
    the shipped kernel at batch 1-4 with its tables of the time).
    ``box_tma``: a k x k FP8 layer of stride 1 or 2 with "same" padding and no residual
    (``fp8_conv_tma.box_eligible``: ResNet's 3x3 ones, its strided 1x1 downsamples) runs on
    ``fp8_conv_box_tma`` (each window tap one TMA box, the same numerics) outside the
    graphs of a small static batch, with ``box_tiles_for``'s tiles for its feature map
    (none: the shipped kernel was faster there, or a strided layer is not measured).
    Such a model is exported with Dynamo (``uses_tma``)."""

    def __init__(self, conv: nn.Conv2d, scales: tuple[float, Any] | None, *, relu: bool,
                 out16: bool, out_scale: float | None,
                 tiles: Mapping[tuple, Any] | None = None,
                 batch_tiles: Mapping[int, Mapping[tuple, Any]] | None = None,
                 tma: bool = False,
                 tma_batch_tiles: Mapping[int, Mapping[tuple[int, int], tuple]] | None = None,
                 box_tma: bool = False) -> None:
        super().__init__()
        self.tma_tiles = None
        self.box_tma = False
        self.tma_tiles_by_batch: dict[int, tuple] = {}
        if not out16 and out_scale is None:
            raise UsageError(f"{conv}: a fused convolution must write fp16 or e4m3")
        self.relu, self.out16 = relu, out16
        self.fp8 = scales is not None
        self.cin, self.cout = conv.in_channels, conv.out_channels
        self.register_buffer("out_scale", None if out_scale is None else scale_tensor(out_scale))
        if not self.fp8:
            self.conv = copy.deepcopy(conv).half().to(memory_format=torch.channels_last)
            return
        from bundler.targets.torch_aoti.kernels.fp8_conv import (MEASURED_TILES_BY_BATCH,
                                                                 config_for)

        # the buffers of the unfused layer (the same quantized weight, scales and bias)
        layer = Fp8ConvNHWC(conv, *scales, dtype=torch.float16, emulate=True)
        self.register_buffer("act_scale", layer.act_scale.clone())
        self.register_buffer("weight_fp8", layer.weight_fp8.clone())
        self.register_buffer("conv_scale", layer.weight_scale_row[0] * layer.act_scale)
        self.register_buffer("bias", layer.bias_out.clone())
        self.kernel, self.stride = layer.kernel, layer.stride
        self.padding, self.dilation = layer.padding, layer.dilation
        self.tiles = config_for(self.cin, self.cout, self.kernel, self.stride, tiles)
        # a graph traced for a static batch with a table of its own launches its tiles
        tables = MEASURED_TILES_BY_BATCH if batch_tiles is None else batch_tiles
        self.tiles_by_batch = {
            n: config_for(self.cin, self.cout, self.kernel, self.stride, tiles, n, tables)
            for n in tables}
        if tma:
            from bundler.targets.torch_aoti.kernels.fp8_conv_tma import (tma_eligible,
                                                                         tma_tiles_for)

            if tma_eligible(self.cin, self.cout, self.kernel, self.stride,
                            self.padding, self.dilation):
                self.tma_tiles = tma_tiles_for(self.cin, self.cout)
                self.tma_tiles_by_batch = {
                    n: tma_tiles_for(self.cin, self.cout, table)
                    for n, table in (tma_batch_tiles or {}).items()
                    if (self.cin, self.cout) in table}
        if box_tma:
            from bundler.targets.torch_aoti.kernels.fp8_conv_tma import box_eligible

            self.box_tma = box_eligible(self.cin, self.cout, self.kernel, self.stride,
                                        self.padding, self.dilation)

    def tiles_for(self, x: torch.Tensor):
        """The tiles of a launch on ``x``: its static batch's, else the dynamic graph's."""
        n = static_batch(x)
        return self.tiles if n is None else self.tiles_by_batch.get(n, self.tiles)

    def tma_tiles_at(self, x: torch.Tensor) -> tuple | None:
        """The TMA tiles of a launch on ``x``, or None for the shipped kernel: a graph of a
        small static batch takes TMA only with tiles of its own batch."""
        if self.tma_tiles is None:
            return None
        if small_static_batch(x):
            return self.tma_tiles_by_batch.get(static_batch(x))
        return self.tma_tiles

    def box_tiles_at(self, x: torch.Tensor) -> tuple | None:
        """The box kernel's tiles for a launch on ``x`` (NHWC), or None for another kernel:
        only with ``box_tma``, outside small static graphs, on even sides at stride 2,
        where the feature map's tiles are not None (``box_tiles_for``)."""
        h, w = int(x.shape[1]), int(x.shape[2])
        if (not self.box_tma or small_static_batch(x)
                or (self.stride[0] == 2 and (h % 2 or w % 2))):
            return None
        from bundler.targets.torch_aoti.kernels.fp8_conv_tma import box_tiles_for

        return box_tiles_for(self.cin, self.cout, self.kernel[0], self.stride[0], h, w)

    @property
    def in_scale(self) -> float | None:
        """The activation scale its FP8 input must have (None: it reads fp16)."""
        return float(self.act_scale) if self.fp8 else None

    def forward(self, x16: torch.Tensor | None, x8: torch.Tensor | None = None,
                residual: torch.Tensor | None = None
                ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if not self.fp8:
            y = F.conv2d(x16.permute(0, 3, 1, 2), self.conv.weight, self.conv.bias,
                         self.conv.stride, self.conv.padding, self.conv.dilation
                         ).permute(0, 2, 3, 1)
            if residual is not None:
                y = y + residual
            if self.relu:
                y = torch.relu(y)
            q = quantize(y, self.out_scale[:1]) if self.out_scale is not None else None
            return (y if self.out16 else None), q
        from bundler.targets.torch_aoti.kernels.fp8_conv import fp8_conv_fused

        if x8 is None:           # no producer wrote it: the one quantize pass
            x8 = quantize(x16, self.act_scale)
        box_tiles = self.box_tiles_at(x8) if residual is None else None
        if box_tiles is not None:
            from bundler.targets.torch_aoti.kernels.fp8_conv_tma import fp8_conv_box_tma

            return fp8_conv_box_tma(x8, self.weight_fp8, self.conv_scale, self.bias,
                                    self.cout, self.kernel, self.padding,
                                    stride=self.stride[0], relu=self.relu,
                                    out_f16=self.out16, out_scale=self.out_scale,
                                    tiles=box_tiles)
        tma_tiles = self.tma_tiles_at(x8)
        if tma_tiles is not None:
            from bundler.targets.torch_aoti.kernels.fp8_conv_tma import fp8_conv_1x1_tma

            return fp8_conv_1x1_tma(x8, self.weight_fp8, self.conv_scale, self.bias, self.cout,
                                    residual=residual, relu=self.relu, out_f16=self.out16,
                                    out_scale=self.out_scale, tiles=tma_tiles)
        return fp8_conv_fused(x8, self.weight_fp8, self.conv_scale, self.bias, self.cout,
                              self.kernel, self.stride, self.padding, self.dilation,
                              residual=residual, relu=self.relu, out_f16=self.out16,
                              out_scale=self.out_scale, config=self.tiles_for(x8))


def bottleneck_parts(block: nn.Module) -> tuple[nn.Conv2d, nn.Conv2d, nn.Conv2d,
                                                 nn.Conv2d | None] | None:
    """(conv1, conv2, conv3, downsample conv or None) of a timm ``Bottleneck`` the fusion
    covers, None for any other module; raises UsageError for a Bottleneck it cannot fuse
    (unfolded BatchNorm, SE, drop-path, ...), naming what is in the way."""
    if type(block).__name__ != "Bottleneck":
        return None
    problems = []
    for name in _IDENTITIES:
        if not isinstance(getattr(block, name, nn.Identity()), nn.Identity):
            problems.append(f"{name} is {type(getattr(block, name)).__name__}, not Identity")
    for name in _RELUS:
        if not isinstance(getattr(block, name, None), nn.ReLU):
            problems.append(f"{name} is not ReLU")
    if getattr(block, "se", None) is not None:
        problems.append("it has squeeze-excitation")
    if not isinstance(getattr(block, "drop_path", None) or nn.Identity(), nn.Identity):
        problems.append("it has drop-path")
    convs = [getattr(block, f"conv{i}", None) for i in (1, 2, 3)]
    if not all(isinstance(c, nn.Conv2d) and c.groups == 1 for c in convs):
        problems.append("conv1..conv3 are not dense Conv2d")
    down = getattr(block, "downsample", None)
    down_conv = None
    if down is not None:
        parts = [m for m in (down if isinstance(down, nn.Sequential) else [down])
                 if not isinstance(m, nn.Identity)]
        if len(parts) != 1 or not isinstance(parts[0], nn.Conv2d) or parts[0].groups != 1:
            problems.append(f"its downsample is not one convolution (folded): {down}")
        else:
            down_conv = parts[0]
    if problems:
        raise UsageError("cannot fuse a ResNet bottleneck: " + "; ".join(problems),
                         problems=problems)
    return convs[0], convs[1], convs[2], down_conv


class FusedBottleneck(nn.Module):
    """A ResNet bottleneck of fused convolutions (module docstring).

    ``in_scale``: the scale of the e4m3 tensor the previous block hands over (None: it
    hands over fp16 only); ``next_scale``: the activation scale of the next block's conv1
    when it is FP8 (this block then writes e4m3 with it), else None; ``tiles``: a tile
    table (``kernels.fp8_conv.config_for``) for its FP8 convolutions."""

    def __init__(self, parts: tuple, fp8: Mapping[str, tuple[float, Any]], names: tuple,
                 in_scale: float | None, next_scale: float | None,
                 tiles: Mapping[tuple, Any] | None = None,
                 batch_tiles: Mapping[int, Mapping[tuple, Any]] | None = None,
                 tma: bool = False,
                 tma_batch_tiles: Mapping[int, Mapping[tuple[int, int], tuple]] | None = None,
                 box_tma: bool = False) -> None:
        super().__init__()
        c1, c2, c3, down = parts
        kinds = dict(tiles=tiles, batch_tiles=batch_tiles, tma=tma,
                     tma_batch_tiles=tma_batch_tiles, box_tma=box_tma)
        s1, s2, s3, sd = (fp8.get(n) for n in names)

        def act(scales):
            return None if scales is None else float(stored_scale(scales[0]))

        self.conv1 = FusedConv(c1, s1, relu=True, out16=s2 is None, out_scale=act(s2), **kinds)
        self.conv2 = FusedConv(c2, s2, relu=True, out16=s3 is None, out_scale=act(s3), **kinds)
        self.conv3 = FusedConv(c3, s3, relu=True, out16=True, out_scale=next_scale, **kinds)
        self.downsample = (FusedConv(down, sd, relu=False, out16=True, out_scale=None, **kinds)
                           if down is not None else None)
        # the handed-over e4m3 is used where its scale is the reader's own (the graph's
        # one shared QuantizeLinear); otherwise the reader quantizes the fp16 itself
        self.conv1_reads_fp8 = in_scale is not None and self.conv1.in_scale == in_scale
        self.down_reads_fp8 = (in_scale is not None and self.downsample is not None
                               and self.downsample.in_scale == in_scale)
        self.emits_fp8 = next_scale is not None
        # no e4m3 handed over (the first block, after the max pool): conv1 and the
        # downsample share one quantize of the input where their scales agree
        self.shares_quantize = (self.downsample is not None and self.conv1.fp8
                                and self.downsample.in_scale == self.conv1.in_scale)

    def forward(self, x):
        x16, x8 = x if isinstance(x, tuple) else (x, None)
        if x16 is not None:
            x16 = x16.permute(0, 2, 3, 1)                  # channels_last NCHW -> NHWC view
        q1 = x8 if self.conv1_reads_fp8 else None
        qd = x8 if self.down_reads_fp8 else None
        if self.shares_quantize and q1 is None:
            q1 = qd = quantize(x16, self.conv1.act_scale)
        h16, h8 = self.conv1(x16, q1)
        h16, h8 = self.conv2(h16, h8)
        if self.downsample is not None:
            shortcut, _ = self.downsample(x16, qd)
        else:
            shortcut = x16
        y16, y8 = self.conv3(h16, h8, residual=shortcut)
        if y16 is not None:                                # (None: the next block reads e4m3 only)
            y16 = y16.permute(0, 3, 1, 2)                  # back to NCHW shape, NHWC strides
        return (y16, y8) if self.emits_fp8 else y16

    @property
    def reads_e4m3_only(self) -> bool:
        """Whether nothing here reads the fp16 input: conv1 and a downsample (the shortcut,
        so the identity shortcut's fp16 is not needed) both take the handed-over e4m3."""
        return (self.downsample is not None and self.conv1_reads_fp8
                and self.down_reads_fp8)


def rewrite_fused(model: nn.Module, fp8: Mapping[str, tuple[float, Any]],
                  tiles: Mapping[tuple, Any] | None = None,
                  batch_tiles: Mapping[int, Mapping[tuple, Any]] | None = None,
                  drop_unread_f16: bool = True, tma: bool = False,
                  tma_batch_tiles: Mapping[int, Mapping[tuple[int, int], tuple]] | None = None,
                  box_tma: bool = False, fuse_stem: bool = False) -> nn.Module:
    """A copy of ``model`` (BN-folded, eval) in fp16 channels_last with its bottlenecks
    fused (module docstring). ``fp8``: module path -> (activation scale, weight scales) of
    the FP8 convolutions, every one of which must sit in a fusable bottleneck. ``tiles``:
    the kernel tiles per layer shape (``kernels.fp8_conv.tile_key`` -> ``Fp8ConvConfig``,
    what ``benchmarks/fp8_conv_bench.py --fused-layers`` measures); a layer not in it gets
    ``config_for``'s (``MEASURED_TILES``, else ``default_config``). ``batch_tiles``: batch ->
    table, for graphs traced with that static batch (default
    ``kernels.fp8_conv.MEASURED_TILES_BY_BATCH``; ``tiles`` wins over it).
    ``drop_unread_f16=False`` keeps the fp16 output of blocks whose successor reads only
    e4m3 (for benchmarks: the form before it was dropped). ``tma``: the dense 1x1
    stride-1 FP8 layers on the TMA kernel (``FusedConv``), and with ``tma_batch_tiles``
    (batch -> (in, out channels) -> tiles) in the graphs of those small static batches too;
    ``box_tma``: the 3x3 ones (and strided 1x1 ones) on the box TMA kernel outside small
    static graphs, where their maps have tiles (``FusedConv``); export the result with
    ``uses_tma`` in mind. ``fuse_stem``: a timm ResNet's plain stem (``stem_parts``) hands
    the first block its input in e4m3 (``StemConv``, ``StemPool``; family.json
    ``torch_aoti.fp8_fuse_stem``). Its convolution is NHWC in a package only where the
    package is compiled without the fake-tensor cache (``build.FAKE_TENSOR_CACHE``; with
    it, cuDNN's layout conversions cost more than the fusion saved, h100-2026-12-07-d/-e).

    The e4m3 hand-over between consecutive blocks (in module order: ResNet's stages are
    sequential) assumes the next block reads this block's output; a module in between
    would receive a tuple and fail when traced, not compute something else."""
    fp8 = dict(fp8)
    body = copy.deepcopy(model).eval()
    blocks = []
    for name, m in body.named_modules():
        parts = bottleneck_parts(m)
        if parts is not None:
            blocks.append((name, m, parts))
    covered = set()
    named = []
    for name, m, parts in blocks:
        paths = tuple(f"{name}.{p}" for p in ("conv1", "conv2", "conv3"))
        down = next((f"{name}.downsample{'.' + n if n else ''}" for n, c in
                     m.downsample.named_modules() if c is parts[3]), None) \
            if parts[3] is not None else None
        named.append(paths + (down,))
        covered.update(p for p in paths + (down,) if p)
    outside = sorted(set(fp8) - covered)
    if outside:
        raise UsageError(f"the fused FP8 model runs FP8 only inside ResNet bottlenecks; "
                         f"{len(outside)} selected convolution(s) are outside one "
                         f"(first: {outside[0]!r}): set the family's torch_aoti.fp8_conv "
                         f"(or TRT_BUNDLE_FP8_CONV) to triton or im2col",
                         problems=outside)
    if not blocks:
        raise UsageError("the fused FP8 model needs ResNet bottlenecks; this model has none")
    replaced = {}
    # the stem's bias, ReLU and max pool write the first block's e4m3 input in one kernel
    # where the model is timm's plain-stem ResNet and that block's FP8 layers share a scale
    stem = stem_parts(body) if fuse_stem and blocks[0][0] == "layer1.0" else None
    first_scale = fp8.get(named[0][0])
    stem_scale = (float(stored_scale(first_scale[0]))
                  if stem is not None and first_scale is not None else None)
    in_scale = stem_scale
    for i, ((name, _m, parts), names) in enumerate(zip(blocks, named)):
        nxt = named[i + 1][0] if i + 1 < len(blocks) else None
        next_scale = float(stored_scale(fp8[nxt][0])) if nxt in fp8 else None
        replaced[name] = FusedBottleneck(parts, fp8, names, in_scale, next_scale, tiles,
                                         batch_tiles, tma=tma, tma_batch_tiles=tma_batch_tiles,
                                         box_tma=box_tma)
        in_scale = next_scale
    # a block whose successor reads only e4m3 (a stage's first block: conv1 and the
    # downsample share the handed-over tensor) writes no fp16 output: ~90 MB less to write
    # per batch of 32 in ResNet-50 (the last blocks of stages 1-3)
    chain = list(replaced.values())
    for block, successor in zip(chain, chain[1:]):
        if drop_unread_f16 and block.emits_fp8 and successor.reads_e4m3_only:
            block.conv3.out16 = False
    first = chain[0]
    if stem_scale is not None and (first.conv1_reads_fp8 or first.down_reads_fp8):
        conv, _act, _pool = stem
        replaced["conv1"] = StemConv(conv)
        replaced["act1"] = nn.Identity()
        replaced["maxpool"] = StemPool(conv, stem_scale, out16=not first.reads_e4m3_only)
    for name, new in replaced.items():
        body.set_submodule(name, new)
    for name, m in body.named_modules():          # the rest: fp16, channels_last
        if not list(m.children()) and not any(name.startswith(r + ".") or name == r
                                                 for r in replaced):
            m.half()
    return body.to(memory_format=torch.channels_last).requires_grad_(False)


def stem_parts(body: nn.Module) -> tuple[nn.Conv2d, nn.ReLU, nn.MaxPool2d] | None:
    """(conv1, act1, maxpool) of a timm ``ResNet`` (whose ``forward_features`` runs them in
    that order) whose stem ``StemConv`` and ``StemPool`` can take: one dense convolution,
    its BatchNorm folded (``bn1`` Identity), ReLU, and ``MaxPool2d(3, 2, 1)``; None for any
    other model or stem (a deep stem, anti-aliasing, ...), which then runs as it is."""
    from bundler.targets.torch_aoti.kernels.stem_pool import POOL

    if type(body).__name__ != "ResNet" or not type(body).__module__.startswith("timm."):
        return None
    conv, bn = getattr(body, "conv1", None), getattr(body, "bn1", None)
    act, pool = getattr(body, "act1", None), getattr(body, "maxpool", None)
    if not (isinstance(conv, nn.Conv2d) and conv.groups == 1 and isinstance(bn, nn.Identity)
            and type(act) is nn.ReLU and type(pool) is nn.MaxPool2d):
        return None

    def pair(v):
        return tuple(v) if isinstance(v, (tuple, list)) else (v, v)

    k, s, p = POOL
    if (pair(pool.kernel_size), pair(pool.stride), pair(pool.padding), pair(pool.dilation),
            pool.ceil_mode) != ((k, k), (s, s), (p, p), (1, 1), False):
        return None
    return conv, act, pool


class StemConv(nn.Module):
    """The stem's convolution without its bias (fp16, cuDNN): ``StemPool`` adds it."""

    def __init__(self, conv: nn.Conv2d) -> None:
        super().__init__()
        self.conv = copy.deepcopy(conv).half()
        self.conv.bias = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class StemPool(nn.Module):
    """The stem's bias, ReLU and 3x3 max pool in one kernel (``kernels/stem_pool.py``),
    writing the first block's input in e4m3 with its activation scale ``scale``, and in
    fp16 only with ``out16`` (a reader of the fp16 map: an identity shortcut). Returns
    (fp16 in NCHW shape with NHWC strides or None, e4m3 NHWC): the hand-over a block
    takes from its predecessor."""

    def __init__(self, conv: nn.Conv2d, scale: float, *, out16: bool) -> None:
        super().__init__()
        bias = (conv.bias.detach() if conv.bias is not None
                else torch.zeros(conv.out_channels))
        # the fp16 parameter's value, as the unfused fp16 stem adds it
        self.register_buffer("bias", bias.half().float())
        self.register_buffer("out_scale", scale_tensor(scale))
        self.out16 = out16

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        from bundler.targets.torch_aoti.kernels.stem_pool import relu_maxpool_e4m3

        y16, y8 = relu_maxpool_e4m3(x.permute(0, 2, 3, 1), self.bias, self.out_scale,
                                    out_f16=self.out16)
        return (y16.permute(0, 3, 1, 2) if y16 is not None else None), y8


def small_static_batch(x: torch.Tensor) -> bool:
    """Whether ``x`` belongs to a graph of a small static batch (``fp8_layers.SMALL_BATCH``)."""
    n = static_batch(x)
    return n is not None and n <= SMALL_BATCH


def uses_tma(module: nn.Module) -> bool:
    """Whether ``module`` has a layer on the TMA kernel: a plain Triton launch with host
    descriptors, which torch records only when Dynamo traces it (``torch.export(...,
    strict=True)``; ``kernels/fp8_conv_tma.py``)."""
    return any(getattr(m, "tma_tiles", None) is not None or getattr(m, "box_tma", False)
               for m in module.modules())
