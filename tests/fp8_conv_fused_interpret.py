"""Runs the fused epilogues of the Triton FP8 convolution and the fused ResNet bottlenecks
under Triton's CPU interpreter and prints JSON results (tests/test_fp8_conv_fused.py).

A child process with TRITON_INTERPRET=1, as tests/fp8_conv_interpret.py. One correction of
the interpreter: its fp32 -> e4m3 conversion (``triton.runtime.interpreter._convert_float``)
rounds half up and drops the carry into the exponent (127.4 / 1.0 becomes 64, not 128),
where the GPU's ``cvt.rn.satfinite.e4m3x2.f32`` rounds to nearest even. The e4m3 outputs are
checked bit for bit, so that one conversion is replaced here by torch's (round to nearest
even, the ONNX QuantizeLinear rounding). A second: the interpreter's ``fma`` is ``x * y + z``
in fp32 (two roundings) where the GPU's ``fma.rn.f32`` rounds once; the epilogue's quantizer
relies on the single rounding (an exact remainder), so ``fma`` is computed in fp64 here (the
product exact, the remainder exact, one rounding to fp32 but for a double rounding of the
correction step, which no case below meets). Everything else runs as the interpreter has it.

Epilogue cases: the kernel's fp16 and e4m3 outputs against a torch reference (conv2d in fp32
of the dequantized operands x scale + bias, + residual, ReLU; the e4m3 output = quantize of
the fp16 value with the next scale). Block cases: a small ResNet (timm Bottleneck blocks,
BatchNorm folded), and timm_resnet50 itself at 32x32, as ``fused.rewrite_fused`` against
the unfused fp8 model (``rewrite_nhwc``, emulated FP8 GEMMs) with the same scales.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

#: name -> (batch, height, width, in, out, kernel, stride, padding, relu, residual,
#: fp16 out, e4m3 out)
CASES = {
    "3x3-relu-f8": (2, 6, 5, 32, 24, 3, 1, 1, True, False, False, True),
    "3x3-s2-f16-f8": (1, 9, 9, 40, 16, 3, 2, 1, True, False, True, True),
    "1x1-res-relu-f16-f8": (2, 5, 5, 32, 48, 1, 1, 0, True, True, True, True),
    "1x1-res-f16": (2, 4, 6, 16, 32, 1, 1, 0, False, True, True, False),
    "1x1-s2-f16": (1, 8, 8, 64, 16, 1, 2, 0, False, False, True, False),
}
TILES = (16, 16, 32, 4, 2, 2)
#: Every FP8 layer's tiles in the ResNet-50 case (``block_case``).
RESNET50_TILES = (128, 256, 128, 4, 2, 2)


def exact_e4m3_conversion() -> None:
    """Replace the interpreter's fp32/fp16 -> e4m3 downcast by torch's (module docstring)."""
    import triton.language as tl
    from triton.runtime import interpreter

    original = interpreter._convert_float

    def convert(data, src, dst, rounding_mode):
        if dst == tl.float8e4nv and src in (tl.float32, tl.float16):
            values = np.frombuffer(data.tobytes(), np.float32 if src == tl.float32
                                   else np.float16).astype(np.float32).reshape(data.shape)
            return torch.from_numpy(values).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
        return original(data, src, dst, rounding_mode)

    interpreter._convert_float = convert

    def fma(self, x, y, z):      # one rounding, as fma.rn.f32 (module docstring)
        exact = x.data.astype(np.float64) * y.data.astype(np.float64) + z.data.astype(np.float64)
        return interpreter.TensorHandle(exact.astype(z.data.dtype), z.dtype.scalar)

    interpreter.InterpreterBuilder.create_fma = fma


def quantizer_ties() -> dict:
    """The epilogue's quantizer (``_quantize_e4m3``: reciprocal, one fma correction) against
    torch's ``x / scale`` QuantizeLinear, bit for bit, on values made to hit its hard cases:
    fp16 values that are exactly ``scale`` times an e4m3 rounding midpoint (ties to even;
    a bare ``x * (1 / scale)`` misses some of them), their fp16 neighbours, saturation,
    +-inf, zeros, and random values."""
    global _quantize_e4m3      # the interpreter resolves a kernel's callees in its globals
    import triton
    import triton.language as tl

    from bundler.fp8 import E4M3_MAX
    from bundler.targets.torch_aoti.kernels.fp8_conv import _quantize_e4m3
    from bundler.targets.torch_aoti.fp8_layers import quantize

    @triton.jit
    def apply(v_ptr, s_ptr, q_ptr, n, QMAX: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        ok = offs < n
        s = tl.load(s_ptr)
        inv = tl.math.div_rn(tl.full([], 1.0, tl.float32), s)
        v = tl.load(v_ptr + offs, mask=ok, other=0.0).to(tl.float32)
        tl.store(q_ptr + offs, _quantize_e4m3(v, s, inv, QMAX), mask=ok)

    g = torch.Generator().manual_seed(7)
    # e4m3 midpoints: every pair of neighbouring finite e4m3 values, positive and negative
    grid = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    mids = torch.cat([(grid[:-1] + grid[1:]) / 2, grid])
    mids = torch.cat([mids, -mids])
    results = {"cases": 0, "mismatches": 0, "naive_mismatches": 0}
    # scales of few significant bits, so that scale x midpoint is an fp16 value exactly;
    # 0.3203125 (41 / 128), 5.125, 41 and 0.000358... (47 / 2^17): ones whose reciprocal's
    # rounding moves some ties off their midpoint (a bare multiply gets them wrong)
    for scale in (0.75, 0.3203125, 5.125, 41.0, 0.00035858154296875, 0.0390625, 2.0 ** -14):
        s16 = torch.tensor(scale, dtype=torch.float16)
        v = (mids * scale).half()
        v = v[(v.float() == mids * scale)]                           # exact products only
        near = torch.cat([torch.nextafter(v, torch.full_like(v, 1e4)),
                          torch.nextafter(v, torch.full_like(v, -1e4))])
        rnd = (torch.randn(4096, generator=g) * 300 * scale).half()
        special = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), 65504.0, -65504.0],
                               dtype=torch.float16)
        v = torch.cat([v, near, rnd, special])
        q = torch.empty(v.shape, dtype=torch.float8_e4m3fn)
        s32 = s16.float().reshape(1)
        apply[(triton.cdiv(v.numel(), 256),)](v, s32, q, v.numel(), QMAX=E4M3_MAX, BLOCK=256)
        ref = quantize(v, s32)
        naive = torch.clamp(v.float() * (1.0 / s32), -E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
        results["cases"] += v.numel()
        results["mismatches"] += int((q.view(torch.uint8) != ref.view(torch.uint8)).sum())
        results["naive_mismatches"] += int((naive.view(torch.uint8) != ref.view(torch.uint8)).sum())
    return results


def ulps(a: torch.Tensor, b: torch.Tensor) -> int:
    """Largest distance in e4m3 steps between two e4m3 tensors (same sign: code distance)."""
    ia, ib = a.view(torch.uint8).int(), b.view(torch.uint8).int()
    sa, sb = ia >> 7, ib >> 7
    ma, mb = ia & 0x7F, ib & 0x7F
    same = torch.where(sa == sb, (ma - mb).abs(), ma + mb)
    return int(same.max()) if same.numel() else 0


def run_case(case) -> dict:
    from bundler.targets.torch_aoti.kernels.fp8_conv import Fp8ConvConfig, fp8_conv_fused
    from bundler.targets.torch_aoti.fp8_layers import quantize

    n, h, w, c, cout, k, stride, pad, relu, residual, out16, out8 = case
    g = torch.Generator().manual_seed(c * 1000 + cout * 10 + k)
    x = (torch.randn(n, h, w, c, generator=g) * 2).to(torch.float8_e4m3fn)
    kernel = torch.randn(cout, k, k, c, generator=g).to(torch.float8_e4m3fn)
    weight = torch.zeros(cout + 8, k * k * c + 16).to(torch.float8_e4m3fn)
    weight[:cout, :k * k * c] = kernel.reshape(cout, -1)
    scale = (torch.rand(cout, generator=g) + 0.5) * 0.02
    bias = torch.randn(cout, generator=g) * 0.3
    ref = F.conv2d(x.float().permute(0, 3, 1, 2), kernel.float().permute(0, 3, 1, 2),
                   stride=stride, padding=pad).permute(0, 2, 3, 1) * scale + bias
    res = None
    if residual:   # a strided NHWC view: a slice of a wider tensor
        ho, wo = ref.shape[1:3]
        res = (torch.randn(n, ho, wo + 3, cout, generator=g) * 2).half()[:, :, 2:2 + wo]
        ref = ref.half().float() + res.float()     # the graph's fp16 Conv, then its Add
    if relu:
        ref = ref.clamp_min(0)
    next_scale = torch.tensor(float(ref.abs().max()) / 500.0)   # the largest saturate
    y16, y8 = fp8_conv_fused(x, weight, scale, bias, cout, (k, k), (stride, stride),
                             (pad, pad), residual=res, relu=relu, out_f16=out16,
                             out_scale=next_scale if out8 else None,
                             config=Fp8ConvConfig(*TILES))
    result: dict = {"f16_given": y16 is not None, "f8_given": y8 is not None}
    if out16:
        result["f16_err"] = float((y16.float() - ref).abs().max() / ref.abs().max())
    if out8:
        # the e4m3 output is QuantizeLinear of the kernel's own fp16 value, bit for bit...
        mine = y16 if y16 is not None else ref.half()
        result["f8_vs_own_f16_ulps"] = ulps(y8, quantize(mine, next_scale)) \
            if y16 is not None else None
        # ...and within one e4m3 step of quantizing the fp32 reference's fp16 value
        result["f8_vs_ref_ulps"] = ulps(y8, quantize(ref.half(), next_scale))
        result["f8_saturated"] = int((y8.float().abs() == 448).sum())
    return result


def tiny_resnet(seed: int = 0) -> nn.Module:
    """Stem, max pool, three timm bottlenecks (one with a 1x1 downsample, one with a
    stride-2 downsample), global pool, fc; BatchNorm with random statistics, folded."""
    from timm.models.resnet import Bottleneck

    from bundler.torch_model import fold_batchnorm

    torch.manual_seed(seed)

    def down(cin, cout, stride):
        return nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    class Tiny(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(3, 16, 3, 1, 1)
            self.act1 = nn.ReLU()
            self.maxpool = nn.MaxPool2d(2)
            self.layer1 = nn.Sequential(Bottleneck(16, 8, downsample=down(16, 32, 1)),
                                        Bottleneck(32, 8))
            self.layer2 = nn.Sequential(Bottleneck(32, 16, stride=2, downsample=down(32, 64, 2)))
            self.global_pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(64, 10)

        def forward(self, x):
            x = self.maxpool(self.act1(self.conv1(x)))
            x = self.layer2(self.layer1(x))
            return self.fc(torch.flatten(self.global_pool(x), 1))

    model = Tiny().eval()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 1.5)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.2, 0.2)
    fold_batchnorm(model)
    return model


def calibrate(model: nn.Module, x: torch.Tensor, paths: list[str]) -> dict:
    """path -> (activation scale, weight scales): amax/448 of each input, per output
    channel of each kernel (the recipe's max calibrator); convolutions or Linear layers."""
    modules = dict(model.named_modules())
    amax: dict = {}
    hooks = [modules[p].register_forward_hook(
        lambda _m, inp, _o, p=p: amax.__setitem__(p, float(inp[0].abs().max())))
        for p in paths]
    with torch.no_grad():
        model(x)
    for hk in hooks:
        hk.remove()
    def per_channel(w):      # a convolution's [out, in, kh, kw] or a Linear's [out, in]
        return w.detach().abs().amax(dim=tuple(range(1, w.dim())))

    return {p: (amax[p] / 448, (per_channel(modules[p].weight) / 448).numpy()) for p in paths}


def resnet50() -> nn.Module:
    """timm_resnet50 as the family builds it (random weights, BatchNorm folded)."""
    from bundler.families import load_family
    from bundler.torch_model import build_torch_model

    return build_torch_model(load_family("timm_resnet50"), seed=0)


def block_case(select: str, own_downsample_scale: bool = False, model: str = "tiny",
               fuse_stem: bool = False) -> dict:
    """Fused model vs unfused fp8 model (rewrite_nhwc, emulated GEMMs), same scales; the
    stem as the unfused model has it unless ``fuse_stem`` (``stem_case``)."""
    from bundler.targets.torch_aoti.fused import FusedBottleneck, rewrite_fused
    from bundler.targets.torch_aoti.model import rewrite_nhwc
    from bundler.targets.torch_aoti.nhwc_modules import EngineModule

    size = 16 if model == "tiny" else 32            # resnet50: 32x32, for the interpreter
    model = tiny_resnet() if model == "tiny" else resnet50()
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1))
    paths = [n for n, m in model.named_modules() if isinstance(m, nn.Conv2d) and n != "conv1"]
    if select == "pointwise":
        paths = [p for p in paths if dict(model.named_modules())[p].kernel_size == (1, 1)]
    fp8 = calibrate(model, x, paths)
    tiles = _resnet50_tiles(model, paths) if size == 32 else None
    if own_downsample_scale:     # the downsample's scale differs from conv1's: own quantize
        act, ws = fp8["layer2.0.downsample.0"]
        fp8["layer2.0.downsample.0"] = (act * 1.37, ws)
    fused = EngineModule(rewrite_fused(model, fp8, tiles=tiles, fuse_stem=fuse_stem),
                         torch.float16, False, True)
    unfused = EngineModule(rewrite_nhwc(model, torch.float16, fp8=fp8, emulate=True),
                           torch.float16, True)
    with torch.no_grad():
        got, ref, exact = fused(x), unfused(x), model(x)
    blocks = [m for m in fused.modules() if isinstance(m, FusedBottleneck)]
    return {
        "err": float((got - ref).abs().max() / ref.abs().max()),
        "err_vs_fp32": float((ref - exact).abs().max() / exact.abs().max()),
        "fused_vs_fp32": float((got - exact).abs().max() / exact.abs().max()),
        "fp8_layers": sum(int(c.fp8) for b in blocks for c in b.modules()
                          if type(c).__name__ == "FusedConv"),
        "reads_fp8": [[b.conv1_reads_fp8, b.down_reads_fp8] for b in blocks],
        "emits_fp8": [b.emits_fp8 for b in blocks],
        "writes_f16": [b.conv3.out16 for b in blocks],
        "top1_agree": float((got.argmax(1) == ref.argmax(1)).float().mean()),
    }


def stem_case() -> dict:
    """timm_resnet50 (32x32) fused with its stem (``rewrite_fused(fuse_stem=True)``): which
    modules the stem became, what the first block reads, the e4m3 it is handed against
    the unfused stem's computation (the convolution without its bias, then the bias, ReLU,
    pool and quantize), and ``block_case`` with the stem fused (its distance from fp32,
    against the unfused stem's in ``blocks.resnet50``)."""
    from bundler.targets.torch_aoti.fp8_layers import quantize
    from bundler.targets.torch_aoti.fused import rewrite_fused

    model = resnet50()
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    paths = [n for n, m in model.named_modules() if isinstance(m, nn.Conv2d) and n != "conv1"]
    fp8 = calibrate(model, x, paths)
    body = rewrite_fused(model, fp8, tiles=_resnet50_tiles(model, paths), fuse_stem=True)
    xh = x.half().to(memory_format=torch.channels_last)
    with torch.no_grad():
        y16, y8 = body.maxpool(body.act1(body.conv1(xh)))
        raw = F.conv2d(xh, model.conv1.weight.half(), None, 2, 3)
        ref = F.max_pool2d(torch.relu((raw.float() + model.conv1.bias.half().float()[
            None, :, None, None]).half()), 3, 2, 1)
        ref8 = quantize(ref.permute(0, 2, 3, 1), body.layer1[0].conv1.act_scale)
    first = body.layer1[0]
    return {"modules": [type(body.conv1).__name__, type(body.act1).__name__,
                        type(body.maxpool).__name__],
            "first_reads_fp8": [first.conv1_reads_fp8, first.down_reads_fp8],
            "hands_f16": y16 is not None,
            "e4m3_codes_differing": int((y8.view(torch.uint8) != ref8.view(torch.uint8)).sum()),
            "e4m3_nonzero": int((ref8.float() != 0).sum()),
            "fused": block_case("all", model="resnet50", fuse_stem=True)}


def _resnet50_tiles(model: nn.Module, paths: list[str]) -> dict:
    """Large tiles for ResNet-50's FP8 layers: the interpreter's time goes with the
    programs and the k steps it runs (33 s with the family's tiles, 14 s with these on the
    CI host); what is checked is the fusion, not a tile set."""
    from bundler.targets.torch_aoti.kernels.fp8_conv import tile_key
    modules = dict(model.named_modules())
    return {tile_key(modules[p].in_channels, modules[p].out_channels, modules[p].kernel_size,
                     modules[p].stride): RESNET50_TILES for p in paths}


def main() -> None:
    exact_e4m3_conversion()
    results = {"quantizer": quantizer_ties(),
               "cases": {name: run_case(case) for name, case in CASES.items()},
               "blocks": {"all": block_case("all"), "pointwise": block_case("pointwise"),
                          "own-downsample-scale": block_case("all", True),
                          "resnet50": block_case("all", model="resnet50")},
               "stem": stem_case()}
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
