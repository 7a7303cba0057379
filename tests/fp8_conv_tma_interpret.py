"""Runs the TMA FP8 1x1 convolution (kernels/fp8_conv_tma.py) under Triton's CPU interpreter and
prints JSON results (tests/test_fp8_conv_tma.py).

Layer cases: ``fp8_conv_1x1_tma`` against the shipped fused op (``fp8_conv_fused``) on the
same operands, each epilogue, with tiles that leave edge tiles in both directions; both
kernels run in the interpreter, so their fp16 bits and e4m3 codes must be equal. One case
hands over the input with NCHW strides (what Dynamo's fake max pool gives). Model case: a
small ResNet whose 1x1 layers TMA can tile, fused with and without ``tma``, in a graph of a
dynamic batch (``exporting_batch(None)``) and of a small static batch; which kernel each
launch took is counted.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch
from torch import nn

#: name -> (relu, residual, fp16 out, e4m3 out)
EPILOGUES = {"res+relu>f16+f8": (True, True, True, True), "relu>f8": (True, False, False, True),
             ">f16": (False, False, True, False), "res+relu>f16": (True, True, True, False)}
TILES = (32, 32, 32, 4, 2)   # the narrowest rows AOTInductor encodes (tiles_fit)


def operands(n: int, hw: int, c: int, cout: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, hw, hw, c, generator=g).clamp_min(0) * 40).to(torch.float8_e4m3fn)
    weight = torch.zeros(cout + 16, c + 16).to(torch.float8_e4m3fn)   # padded rows, as built
    weight[:cout, :c] = (torch.randn(cout, c, generator=g) * 100).to(torch.float8_e4m3fn)
    scale = (torch.rand(cout, generator=g) + 0.5) * 2e-4
    bias = torch.randn(cout, generator=g) * 0.3
    res = (torch.randn(n, hw, hw, cout, generator=g) * 2).half()
    return x, weight, scale, bias, res


def e4m3_codes_differing(a: torch.Tensor, b: torch.Tensor) -> int:
    return int((a.view(torch.uint8) != b.view(torch.uint8)).sum())


def layer_case(epilogue: tuple, nchw_strides: bool = False) -> dict:
    from bundler.targets.torch_aoti.kernels.fp8_conv import Fp8ConvConfig, fp8_conv_fused
    from bundler.targets.torch_aoti.kernels.fp8_conv_tma import fp8_conv_1x1_tma

    relu, residual, out16, out8 = epilogue
    x, weight, scale, bias, res = operands(2, 5, 64, 48)
    kw = dict(residual=res if residual else None, relu=relu, out_f16=out16,
              out_scale=torch.full((16,), 0.05) if out8 else None)
    s16, s8 = fp8_conv_fused(x, weight, scale, bias, 48, (1, 1), (1, 1), (0, 0),
                             config=Fp8ConvConfig(16, 16, 32, 4, 2, 2), **kw)
    if nchw_strides:
        x = x.permute(0, 3, 1, 2).contiguous().permute(0, 2, 3, 1)
    t16, t8 = fp8_conv_1x1_tma(x, weight, scale, bias, 48, tiles=TILES, **kw)
    result = {"outputs": [t16 is not None, t8 is not None]}
    if out16:
        result["f16_bits_differing"] = int((s16.view(torch.int16) != t16.view(torch.int16)).sum())
        result["f16_scale"] = float(s16.float().abs().max())
    if out8:
        result["e4m3_codes_differing"] = e4m3_codes_differing(s8, t8)
        result["e4m3_nonzero"] = int((t8.float() != 0).sum())
    return result


#: (in, out channels) of ``small_resnet``'s dense 1x1 layers.
SMALL_MODEL_1X1 = ((32, 16), (16, 64), (32, 64), (64, 16))


def small_resnet(planes: int = 16, stride: int = 1) -> nn.Module:
    """Stem, max pool, two timm bottlenecks whose 1x1 layers have 16-multiple channels (one
    with a downsample), global pool, fc; BatchNorm folded. ``planes`` 32: the 3x3 layers
    are ones the box TMA kernel takes (``box_eligible``); ``stride`` 2: the first block's
    3x3 layer and downsample are strided."""
    from timm.models.resnet import Bottleneck

    from bundler.torch_model import fold_batchnorm

    torch.manual_seed(0)

    class Small(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(3, 32, 3, 1, 1)
            self.act1 = nn.ReLU()
            self.maxpool = nn.MaxPool2d(2)
            self.layer1 = nn.Sequential(
                Bottleneck(32, planes, stride=stride, downsample=nn.Sequential(
                    nn.Conv2d(32, 4 * planes, 1, stride=stride, bias=False),
                    nn.BatchNorm2d(4 * planes))),
                Bottleneck(4 * planes, planes))
            self.global_pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(4 * planes, 10)

        def forward(self, x):
            x = self.layer1(self.maxpool(self.act1(self.conv1(x))))
            return self.fc(torch.flatten(self.global_pool(x), 1))

    model = Small().eval()
    fold_batchnorm(model)
    return model


def model_case() -> dict:
    import bundler.targets.torch_aoti.kernels.fp8_conv_tma as tma_module
    from bundler.targets.torch_aoti.fp8_layers import exporting_batch
    from bundler.targets.torch_aoti.fused import rewrite_fused, uses_tma
    from bundler.targets.torch_aoti.nhwc_modules import EngineModule

    model = small_resnet()
    x = torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(1))
    fp8 = {n: (0.05, np.full(m.out_channels, 2e-3, np.float32))
           for n, m in model.named_modules() if isinstance(m, nn.Conv2d) and n != "conv1"}
    plain = EngineModule(rewrite_fused(model, fp8), torch.float16, False, True)
    with_tma = EngineModule(rewrite_fused(model, fp8, tma=True), torch.float16, False, True)
    # fp8_conv triton-fused-tma-small's form: batch 2 with TMA tiles of its own (16-row
    # tiles: this model's 36 rows a batch-2 image make partial tiles too)
    small_tiles = {2: dict.fromkeys(SMALL_MODEL_1X1, (16, 32, 32, 4, 2))}
    small_tma = EngineModule(rewrite_fused(model, fp8, tma=True, tma_batch_tiles=small_tiles),
                             torch.float16, False, True)
    launches = []
    real = tma_module.fp8_conv_1x1_tma

    def counted(*args, **kwargs):           # this child process only
        launches.append(args[0].shape[-1])
        return real(*args, **kwargs)

    tma_module.fp8_conv_1x1_tma = counted
    out = {}
    with torch.no_grad():
        ref = plain(x)
        with exporting_batch(None):                 # a dynamic-batch graph: TMA layers
            got = with_tma(x)
        out["dynamic_launches"] = len(launches)
        with exporting_batch(2):                    # a small static batch: shipped kernel
            small = with_tma(x)
        out["small_static_launches"] = len(launches) - out["dynamic_launches"]
        before = len(launches)
        with exporting_batch(2):                    # ... unless it has TMA tiles of its own
            small_on_tma = small_tma(x)
        out["small_tma_launches"] = len(launches) - before
    out["tma_layers"] = sum(getattr(m, "tma_tiles", None) is not None
                            for m in with_tma.modules())
    out["uses_tma"] = [uses_tma(plain), uses_tma(with_tma)]
    out["max_diff"] = float((got - ref).abs().max())
    out["small_max_diff"] = float((small - ref).abs().max())
    out["small_tma_max_diff"] = float((small_on_tma - ref).abs().max())
    out["scale"] = float(ref.abs().max())
    return out


def box_model_case(stride: int = 1) -> dict:
    """``small_resnet(32, stride)`` fused with ``box_tma`` (fp8_conv triton-fused-tma-3x3's
    form): its box-eligible layers on ``fp8_conv_box_tma`` in a dynamic-batch graph, none in
    a graph of a small static batch; the outputs equal the model without TMA. At stride 2
    the strided layers have tiles only once measured: this child's table gets them."""
    import bundler.targets.torch_aoti.kernels.fp8_conv_tma as tma_module
    from bundler.targets.torch_aoti.fp8_layers import exporting_batch
    from bundler.targets.torch_aoti.fused import rewrite_fused, uses_tma
    from bundler.targets.torch_aoti.nhwc_modules import EngineModule

    model = small_resnet(32, stride)
    if stride == 2:      # "measured": the strided 3x3 and 1x1 layers on 6x6 input maps
        tma_module.MEASURED_BOX_TILES = {
            **tma_module.MEASURED_BOX_TILES,
            (32, 32, 3, 2, 6, 6): (8, 1, 4, 32, 32, 4, 4),
            (32, 128, 1, 2, 6, 6): (8, 2, 4, 64, 32, 4, 4)}
    x = torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(1))
    fp8 = {n: (0.05, np.full(m.out_channels, 2e-3, np.float32))
           for n, m in model.named_modules() if isinstance(m, nn.Conv2d) and n != "conv1"}
    plain = EngineModule(rewrite_fused(model, fp8), torch.float16, False, True)
    boxed = EngineModule(rewrite_fused(model, fp8, box_tma=True), torch.float16, False, True)
    launches = []
    real = tma_module.fp8_conv_box_tma

    def counted(*args, **kwargs):           # this child process only
        launches.append((tuple(args[0].shape[1:]), kwargs["stride"], kwargs["tiles"]))
        return real(*args, **kwargs)

    tma_module.fp8_conv_box_tma = counted
    out = {}
    with torch.no_grad():
        ref = plain(x)
        with exporting_batch(None):
            got = boxed(x)
        out["dynamic_launches"] = [[list(shape), stride, list(tiles)]
                                   for shape, stride, tiles in launches]
        with exporting_batch(2):
            small = boxed(x)
        out["small_static_launches"] = len(launches) - len(out["dynamic_launches"])
    out["box_layers"] = sum(bool(getattr(m, "box_tma", False)) for m in boxed.modules())
    out["uses_tma"] = [uses_tma(plain), uses_tma(boxed)]
    out["max_diff"] = float((got - ref).abs().max())
    out["small_max_diff"] = float((small - ref).abs().max())
    out["scale"] = float(ref.abs().max())
    return out


def main() -> None:
    results = {"layers": {name: layer_case(e) for name, e in EPILOGUES.items()},
               "nchw_strides": layer_case(EPILOGUES["res+relu>f16+f8"], nchw_strides=True),
               "model": model_case(), "box_model": box_model_case(),
               "strided_box_model": box_model_case(2)}
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
