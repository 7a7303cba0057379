"""Runs the Triton depthwise-to-e4m3 kernel under Triton's CPU interpreter and prints JSON.

Run by tests/test_dw_conv_kernel.py in a child process with TRITON_INTERPRET=1 (as
tests/fp8_conv_interpret.py). For each case: the kernel's e4m3 output against
``DepthwiseE4m3``'s torch path (conv2d in fp32, bias, ReLU, fp16 rounding, QuantizeLinear)
on the same layer and input: how many codes differ, by how many e4m3 steps at most, and
whether the padding channels are zeros. With the interpreter's two corrections of
tests/fp8_conv_fused_interpret.py (its e4m3 conversion drops the rounding carry into the
exponent; its fma rounds twice), which the GPU's instructions do not need.
"""

from __future__ import annotations

import json

import torch
from torch import nn

#: name -> (batch, height, width, channels, padded channels, kernel, stride, padding, relu,
#: relu_in, input: "fp16" or "bf16-view" (a bf16 GEMM output's first C of 8 more columns))
CASES = {
    "3x3-s1": (2, 7, 6, 32, 32, 3, 1, 1, False, False, "fp16"),
    "3x3-s2-odd": (1, 9, 9, 40, 48, 3, 2, 1, False, False, "fp16"),
    "3x3-s1-relu-padded": (2, 5, 5, 24, 32, 3, 1, 1, True, False, "fp16"),
    "5x5-s1-p2": (1, 8, 7, 16, 16, 5, 1, 2, False, False, "fp16"),
    "3x3-relu-in-bf16-view": (2, 6, 5, 40, 48, 3, 1, 1, False, True, "bf16-view"),
}

#: The row-strip kernel (``DwConvConfig.rows``): name -> (case, block_p, rows). Strips that
#: end inside the image and past it, columns of two images in one program, a partial last
#: program, and a layer it does not apply to (stride 2: the pixel kernel runs).
ROW_CASES = {
    "rows-3x3-s1": ("3x3-s1", 8, 3),
    "rows-3x3-s1-relu-padded": ("3x3-s1-relu-padded", 4, 2),
    "rows-3x3-relu-in-bf16-view": ("3x3-relu-in-bf16-view", 8, 4),
    "rows-3x3-s1-one-strip": ("3x3-s1", 16, 8),
    "rows-3x3-s2-falls-back": ("3x3-s2-odd", 8, 3),
}


def run_case(case, config=None) -> dict:
    from bundler.targets.torch_aoti.kernels.dw_conv import DwConvConfig, dw_conv_e4m3
    from bundler.targets.torch_aoti.nhwc_modules import DepthwiseE4m3

    n, h, w, c, cpad, k, stride, pad, relu, relu_in, source = case
    g = torch.Generator().manual_seed(n * 1000 + h * 100 + c)
    conv = nn.Conv2d(c, c, k, stride, pad, groups=c)
    with torch.no_grad():
        conv.weight.copy_(torch.randn(conv.weight.shape, generator=g) * 0.3)
        conv.bias.copy_(torch.randn(c, generator=g) * 0.1)
    if source == "bf16-view":
        x = torch.randn(n, h, w, c + 8, generator=g).bfloat16()[..., :c]
    else:
        x = torch.randn(n, h, w, c, generator=g).half()
    layer = DepthwiseE4m3(conv, 0.01, cpad, relu=relu, relu_in=relu_in)
    ref = layer(x)                                   # the torch path (a CPU tensor)
    got = dw_conv_e4m3(x, layer.weight_taps, layer.bias, layer.act_scale, cpad, (k, k),
                       (stride, stride), (pad, pad), relu=relu, relu_in=relu_in,
                       config=config or DwConvConfig(8, 16, 4))  # small tiles: partial ones too
    if got.shape != ref.shape or got.dtype != torch.float8_e4m3fn:
        raise AssertionError(f"{got.dtype}{tuple(got.shape)} != {ref.dtype}{tuple(ref.shape)}")
    a, b = got.view(torch.uint8)[..., :c], ref.view(torch.uint8)[..., :c]
    differ = a != b
    # neighbouring e4m3 codes of one sign differ by one in their byte
    steps = (a.int() - b.int()).abs()[differ]
    return {"differ": int(differ.sum()), "total": int(a.numel()),
            "max_steps": int(steps.max()) if steps.numel() else 0,
            "padding_zero": bool((got.view(torch.uint8)[..., c:] == 0).all()),
            "nonzero": int((b != 0).sum())}


def main() -> None:
    from fp8_conv_fused_interpret import exact_e4m3_conversion

    exact_e4m3_conversion()
    from bundler.targets.torch_aoti.kernels.dw_conv import DwConvConfig

    results = {name: run_case(case) for name, case in CASES.items()}
    for name, (base, block_p, rows) in ROW_CASES.items():
        results[name] = run_case(CASES[base], DwConvConfig(block_p, 16, 4, rows))
    print(json.dumps(results))


if __name__ == "__main__":
    main()
