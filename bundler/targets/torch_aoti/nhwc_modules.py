"""The layout modules of the torch-aoti engine's model: layers that take and give NHWC
activations (``model.py``'s rewrites put them in; the FP8 GEMM layers are in
``fp8_layers.py``).

* ``DepthwiseNHWC``: a depthwise convolution, its k x k taps written as shifted slices,
  multiplied and summed. Inductor turns that (with the zero padding, the preceding ReLU
  and the *following quantize*) into one Triton kernel, which is the point: cuDNN's
  depthwise kernel is opaque to Inductor, so the quantize after it would be a separate
  pass over the activations. In the ``fp8-depthwise`` variant its input and weights are
  quantized-dequantized as the ONNX graph does (there is no FP8 depthwise kernel).
  ``DepthwiseE4m3`` and ``SkipAddBlock``: the channels_last form's depthwise layers on
  the Triton depthwise-to-e4m3 kernel, and a residual block's last FP8 layer with its
  shortcut added in the kernel's epilogue.
* ``ConvNHWC`` (other convolutions: cuDNN through a permuted view), ``PointwiseNHWC``
  (other 1x1 convolutions: a plain matmul), ``GlobalAvgPoolNHWC``, ``NCHWView`` (a
  spatial layer on the NCHW view of NHWC data), ``ChannelsLastView`` (a layer applied
  to the NHWC view of a channels_last tensor: the permutes are views), ``PatchGemm`` (a
  patch embedding as one GEMM over the patches) and ``EngineModule`` (what the target
  compiles: input layout, pixel head, output).

This module imports torch: it is imported only when a torch-aoti engine is built.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bundler.fp8 import quantize as quantize_fp8, stored_scale
from bundler.targets.torch_aoti.fp8_layers import Fp8Pointwise, conv_taps, fake_quant, quantize
from runtime_py.errors import UsageError


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
