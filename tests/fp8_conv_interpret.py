"""Runs the Triton FP8 convolution under Triton's CPU interpreter and prints JSON results.

Run by tests/test_fp8_conv_kernel.py in a child process with TRITON_INTERPRET=1 (triton reads
it when a kernel is decorated, so it cannot be switched on inside a test process that may
have imported the kernel already). For each case: the largest difference between the kernel
and ``torch.nn.functional.conv2d`` in fp32 on the same (dequantized) operands, relative to
the reference's largest value. ``dtype`` "float8_e4m3fn" is the real operand type; should
this triton's interpreter not run FP8 dots, the same kernel runs on fp16 operands and the
result says so ("fp8_error").
"""

from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F
from torch import nn

#: name -> (batch, height, width, in channels, out channels, kernel, stride, padding, relu)
CASES = {
    "3x3-s1-p1": (2, 7, 6, 32, 24, 3, 1, 1, False),
    "3x3-s2-p1-odd": (1, 9, 9, 48, 40, 3, 2, 1, False),
    "3x3-s1-p0-relu": (2, 6, 6, 32, 16, 3, 1, 0, True),
    "1x1-s1": (2, 5, 5, 32, 32, 1, 1, 0, False),
    "1x1-s2": (1, 8, 8, 64, 16, 1, 2, 0, False),
}
#: Small tiles: the interpreter runs every program in numpy.
TILES = (16, 16, 32, 4, 2, 2)


def run_case(fp8_conv, config, case, dtype) -> float:
    n, h, w, c, cout, k, stride, pad, relu = case
    g = torch.Generator().manual_seed(hash((n, h, w, c, cout, k)) % 2**31)
    x = (torch.randn(n, h, w, c, generator=g) * 2).to(dtype)
    kernel = torch.randn(cout, k, k, c, generator=g).to(dtype)
    width = k * k * c + 16                  # a padded row, as Fp8Gemm's weight buffer has
    weight = torch.zeros(cout + 8, width).to(dtype)
    weight[:cout, :k * k * c] = kernel.reshape(cout, -1)
    scale, bias = torch.rand(cout, generator=g) + 0.5, torch.randn(cout, generator=g)
    got = fp8_conv(x, weight, scale, bias, cout, (k, k), (stride, stride), (pad, pad),
                   relu=relu, config=config).float()
    ref = F.conv2d(x.float().permute(0, 3, 1, 2), kernel.float().permute(0, 3, 1, 2),
                   stride=stride, padding=pad).permute(0, 2, 3, 1) * scale + bias
    if relu:
        ref = ref.clamp_min(0)
    if got.shape != ref.shape:
        raise AssertionError(f"shape {tuple(got.shape)} != {tuple(ref.shape)}")
    return float((got - ref).abs().max() / ref.abs().max())


def module_case() -> float:
    """``Fp8ConvNHWC``'s triton path (its own tiles, buffers and quantize) against its
    emulated im2col path on the same input: the two forms of one layer."""
    from bundler.targets.torch_aoti.fp8_layers import Fp8ConvNHWC

    torch.manual_seed(0)
    conv = nn.Conv2d(32, 48, 3, 2, 1)
    ws = (conv.weight.detach().abs().amax(dim=(1, 2, 3)) / 448).numpy()
    triton_path = Fp8ConvNHWC(conv, 0.02, ws, torch.float16, conv_kernel="triton")
    im2col = Fp8ConvNHWC(conv, 0.02, ws, torch.float16, emulate=True)
    x = torch.randn(2, 9, 9, 32).half()
    got, ref = triton_path.implicit_gemm(x).float(), im2col(x).float()
    if got.shape != ref.shape:
        raise AssertionError(f"shape {tuple(got.shape)} != {tuple(ref.shape)}")
    return float((got - ref).abs().max() / ref.abs().max())


def pointwise_case() -> float:
    """``Fp8Pointwise``'s small-batch Triton path (1x1 window, its stride, channels padded
    to 16 as the NHWC rewrite carries them) against its emulated GEMM on the same input."""
    from bundler.targets.torch_aoti.fp8_layers import Fp8Pointwise

    torch.manual_seed(1)
    conv = nn.Conv2d(40, 24, 1, 2)             # 40 -> 48 and 24 -> 32 padded
    ws = (conv.weight.detach().abs().amax(dim=(1, 2, 3)) / 448).numpy()
    triton_path = Fp8Pointwise(conv, 0.02, ws, torch.float16, padded_io=True,
                               small_batch_kernel="triton")
    gemm = Fp8Pointwise(conv, 0.02, ws, torch.float16, padded_io=True, emulate=True)
    x = torch.zeros(1, 9, 7, 48).half()
    x[..., :40] = torch.randn(1, 9, 7, 40).half()
    got, ref = triton_path.implicit_gemm(x).float(), gemm(x).float()
    if got.shape != ref.shape:
        raise AssertionError(f"shape {tuple(got.shape)} != {tuple(ref.shape)}")
    if got[..., 24:].abs().max() != 0:
        raise AssertionError("the padded output channels are not zero")
    return float((got - ref).abs().max() / ref.abs().max())


def linear_case(form: str = "triton", cin: int = 40, cout: int = 24, seed: int = 2) -> float:
    """``Fp8Linear``'s small-batch Triton path in ``form`` against its emulated GEMM: "triton"
    (the tokens as a 1x1 convolution's pixels, features padded to 16 as ``Fp8Gemm`` pads
    them: 40 -> 48, 24 -> 32) or "triton-split-k" (with 600 features, 608 padded, the
    reduction is split: two fp32 partial sums added, scaled and biased by the graph)."""
    from bundler.targets.torch_aoti.fp8_layers import Fp8Linear

    torch.manual_seed(seed)
    linear = nn.Linear(cin, cout)
    ws = (linear.weight.detach().abs().amax(1) / 448).numpy()
    triton_path = Fp8Linear(linear, 0.02, ws, torch.float16, small_batch_kernel=form)
    gemm = Fp8Linear(linear, 0.02, ws, torch.float16, emulate=True)
    x = torch.randn(2, 5, cin).half()
    got, ref = triton_path.implicit_gemm(x).float(), gemm(x).float()
    if got.shape != ref.shape:
        raise AssertionError(f"shape {tuple(got.shape)} != {tuple(ref.shape)}")
    return float((got - ref).abs().max() / ref.abs().max())


def main() -> None:
    from bundler.targets.torch_aoti.kernels.fp8_conv import Fp8ConvConfig, fp8_conv

    config = Fp8ConvConfig(*TILES)
    results: dict = {"cases": {}}
    dtype, fp8_error = torch.float8_e4m3fn, None
    try:
        run_case(fp8_conv, config, CASES["1x1-s1"], dtype)
    except Exception as e:  # an interpreter without FP8 dots: same kernel, fp16 operands
        dtype, fp8_error = torch.float16, f"{type(e).__name__}: {e}"[:300]
    results["dtype"], results["fp8_error"] = str(dtype).removeprefix("torch."), fp8_error
    for name, case in CASES.items():
        results["cases"][name] = run_case(fp8_conv, config, case, dtype)
    results["module"] = module_case() if fp8_error is None else None
    results["pointwise"] = pointwise_case() if fp8_error is None else None
    results["linear"] = linear_case() if fp8_error is None else None
    results["linear_split_k"] = (linear_case("triton-split-k", 600, 40, seed=3)
                                 if fp8_error is None else None)
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
