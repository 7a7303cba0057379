"""Runs the fused MLP's fc1 kernel (GELU and e4m3 out in the Triton FP8 kernel's epilogue)
under Triton's CPU interpreter and prints JSON results (tests/test_fused_mlp.py).

A child process with TRITON_INTERPRET=1, with the interpreter's e4m3 rounding and fma
corrected as tests/fp8_conv_fused_interpret.py explains. Cases: ``FusedMlp.kernel_hidden``
(the kernel) against ``emulated_hidden`` (the same arithmetic in torch) on the same e4m3
rows, for both GELU forms, on a small ViT's MLP whose hidden width (200) is not a multiple
of 16 (fc1 writes the 208 columns fc2 reads, zeros beyond 200), and the kernel's fp16 GELU
output (the fused op with fp16 out) against torch's exact GELU of the same fp16 values.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F

from fp8_conv_fused_interpret import calibrate, exact_e4m3_conversion, ulps


def tiny_vit(seed: int = 0):
    """A timm VisionTransformer small enough for the interpreter: 32x32 input, 16x16
    patches (4 tokens and the class token), 64 features, MLP hidden 200, 2 blocks."""
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(seed)
    return VisionTransformer(img_size=32, patch_size=16, embed_dim=64, depth=2, num_heads=2,
                             mlp_ratio=200 / 64, num_classes=10).eval()


def linear_paths(model) -> list[str]:
    return [n for n, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and n.startswith("blocks.")]


def hidden_case(gelu: str) -> dict:
    from bundler.targets.torch_aoti.fused_mlp import FusedMlp
    from bundler.targets.torch_aoti.fp8_layers import quantize

    model = tiny_vit()
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    fp8 = calibrate(model, x, linear_paths(model))
    mlp = model.blocks[0].mlp
    fused = FusedMlp(mlp.fc1, mlp.fc2, fp8["blocks.0.mlp.fc1"], fp8["blocks.0.mlp.fc2"],
                     torch.float16, gelu=gelu, tiles=(16, 16, 32, 4, 2, 2))
    captured = {}
    hook = mlp.register_forward_pre_hook(lambda _m, inp: captured.__setitem__("x", inp[0]))
    with torch.no_grad():
        model(x)
    hook.remove()
    q = quantize(captured["x"].half(), fused.act_scale).reshape(-1, fused.cin)
    got, want = fused.kernel_hidden(q), fused.emulated_hidden(q)
    codes = got.view(torch.uint8)
    return {"shape": list(got.shape), "width": fused.width, "hidden": fused.hidden,
            "differ": int((codes != want.view(torch.uint8)).sum()), "ulps": ulps(got, want),
            "nonzero": int((codes[:, :fused.hidden] & 0x7F != 0).sum()),
            "padding_nonzero": int((codes[:, fused.hidden:] & 0x7F != 0).sum())}


def gelu_f16_case() -> dict:
    """The fused op's fp16 GELU output (exact erf form) against torch's GELU of the same
    fp16 pre-activation (the op's GEMM without GELU)."""
    from bundler.targets.torch_aoti.kernels.fp8_conv import Fp8ConvConfig, fp8_conv_fused

    g = torch.Generator().manual_seed(3)
    m, k, n = 40, 64, 48
    x = (torch.randn(m, 1, 1, k, generator=g) * 2).to(torch.float8_e4m3fn)
    w = torch.randn(n, k, generator=g).to(torch.float8_e4m3fn)
    scale = (torch.rand(n, generator=g) + 0.5) * 0.05
    bias = torch.randn(n, generator=g) * 0.3
    cfg = Fp8ConvConfig(16, 16, 32, 4, 2, 2)
    pre, _ = fp8_conv_fused(x, w, scale, bias, n, (1, 1), (1, 1), (0, 0), config=cfg)
    out = {}
    for form in ("erf", "erfc"):
        y, _ = fp8_conv_fused(x, w, scale, bias, n, (1, 1), (1, 1), (0, 0), gelu=form,
                              config=cfg)
        ref = F.gelu(pre.float()).half()
        out[form] = {"differ": int((y != ref).sum()),
                     "max_abs": float((y.float() - ref.float()).abs().max()),
                     "negative_inputs": int((pre < 0).sum())}
    return out


def main() -> None:
    exact_e4m3_conversion()
    json.dump({"hidden": {form: hidden_case(form) for form in ("erf", "erfc")},
               "gelu_f16": gelu_f16_case()}, sys.stdout)


if __name__ == "__main__":
    main()
