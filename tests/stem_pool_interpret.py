"""Runs the stem kernel (kernels/stem_pool.py) under Triton's CPU interpreter and prints JSON
results (tests/test_fp8_conv_fused.py).

A script of its own, apart from fp8_conv_fused_interpret.py: the kernel has no loop with a
runtime bound, so it runs under interpreters that cannot run the GEMM kernels' loops
(Triton 3.6 with NumPy 2.4, the H200's torch 2.11). The interpreter's e4m3 conversion and
fma are corrected as there (``exact_e4m3_conversion``).
"""

from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F

from fp8_conv_fused_interpret import exact_e4m3_conversion


def stem_op_case(c: int, nchw_strides: bool, out16: bool) -> dict:
    """``relu_maxpool_e4m3`` against torch on odd sides: the raw stem output plus the bias
    in fp32, fp16, ReLU, ``MaxPool2d(3, 2, 1)``, QuantizeLinear; fp16 bits and e4m3 codes
    apart. ``nchw_strides``: the input handed over with NCHW strides (the op copies it)."""
    from bundler.targets.torch_aoti.fp8_layers import quantize
    from bundler.targets.torch_aoti.kernels.stem_pool import relu_maxpool_e4m3

    g = torch.Generator().manual_seed(c)
    raw = (torch.randn(2, c, 9, 11, generator=g) * 3).half()
    bias = torch.randn(c, generator=g).half().float()
    scale = torch.full((16,), 0.02)
    ref16 = F.max_pool2d(torch.relu((raw.float() + bias[None, :, None, None]).half()), 3, 2, 1)
    ref8 = quantize(ref16.permute(0, 2, 3, 1), scale[:1])
    x = raw if nchw_strides else raw.to(memory_format=torch.channels_last)
    y16, y8 = relu_maxpool_e4m3(x.permute(0, 2, 3, 1), bias, scale, out_f16=out16)
    out = {"shape": list(y8.shape), "e4m3_codes_differing": int(
        (y8.view(torch.uint8) != ref8.view(torch.uint8)).sum()),
        "e4m3_nonzero": int((ref8.float() != 0).sum()), "f16_out": y16 is not None}
    if y16 is not None:
        out["f16_bits_differing"] = int((y16.view(torch.int16) != ref16.permute(
            0, 2, 3, 1).view(torch.int16)).sum())
    return out


def main() -> None:
    exact_e4m3_conversion()
    json.dump({f"c{c}{'-nchw' if nchw else ''}{'-f16' if out16 else ''}":
               stem_op_case(c, nchw, out16)
               for c, nchw, out16 in ((40, False, True), (80, True, False), (64, False, False))},
              sys.stdout)


if __name__ == "__main__":
    main()
