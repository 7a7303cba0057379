"""Transformer MLPs with fc1, its GELU and fc2's input quantize in one FP8 kernel
(torch-aoti fp8, a layout "as_is" family with ``fp8_conv="triton-fused"``).

Why: on the H200, timm_vit_base's fp8 engine ran its 48 FP8 GEMMs in 43% of the time, and
the GELU pass between fc1 and fc2 (read fc1's fp16 output, write it quantized to e4m3 for
fc2) took 0.44 ms of 2.78 at batch 32, twice its memory-bound time
(families/timm_vit_base/README.md). Here fc1 runs on ``kernels/fp8_conv.py``'s kernel as a
1x1 convolution over the tokens (rows = tokens, columns = fc1's outputs), with bias, GELU
and the quantize to fc2's activation scale in its epilogue, writing e4m3 only; fc2 reads
those e4m3 rows as they are (``Fp8Linear`` with an e4m3 input: no quantize of its own) on
``torch._scaled_mm`` as before. The GELU pass is gone and fc1 writes one byte per value,
not two.

Numerics are the ONNX graph's: fc1's input quantized with its calibrated per-tensor scale
(Inductor fuses that into the LayerNorm before it, as for ``Fp8Linear``), the same FP8
operands (``Fp8Gemm``'s buffers), fc1's output rounded to fp16 with the fp16 bias, GELU
(erf) of that fp16 value computed in fp32 and rounded to fp16, then QuantizeLinear with
fc2's scale. Accumulation: Triton's default on sm_90 (the tensor cores' FP8 accumulator
over the whole reduction) unless ``imprecise_acc`` > 0 promotes the partial sums to fp32
every that many elements.

The MLPs are found by structure (``mlp_parts``): timm's ``Mlp`` with both Linear layers
selected for FP8, an erf GELU, no norm between them and no dropout; an MLP that is not
fully selected stays as ``rewrite_as_is`` made it, one that cannot be fused is refused by
name. ``emulate``: the same arithmetic in torch (for hosts without the kernel, the CPU tests).

This module imports torch, and triton only when a GPU forward runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bundler.targets.torch_aoti.fused import scale_tensor
from bundler.targets.torch_aoti.fp8_layers import Fp8Linear, padded, quantize
from runtime_py.errors import UsageError

__all__ = ["FusedMlp", "mlp_parts", "fuse_mlps", "gelu_erfc", "MLP_TILES"]

#: fc1's kernel tiles per (in, out) features: tile_key-like, measured on the H200 with
#: ``benchmarks/fp8_mlp_bench.py`` (ViT-B's fc1 at batch 32: 6,304 rows). A shape not
#: here gets ``kernels.fp8_conv.config_for``'s rule.
MLP_TILES: dict[tuple[int, int], tuple[int, ...]] = {
    # fc1 GEMM alone (fp16 out): 0.0472 ms, cuBLASLt's _scaled_mm 0.0443; the rule's 0.0589
    # (docs/measurements/h200-2026-12-03-e/mlp.log)
    (768, 3072): (128, 128, 64, 4, 4, 8),
}


#: The epilogue's GELU forms (``kernels.fp8_conv.GELU_FORMS``' names; that module imports
#: triton, which the emulated form does not need): "erf" exact, "erfc" ``gelu_erfc``.
GELU_NAMES = ("erf", "erfc")


def gelu_erfc(g: torch.Tensor) -> torch.Tensor:
    """The kernel's "erfc" GELU (``kernels/fp8_conv._gelu_erfc``) in fp32 torch: the same
    formula; the GPU's reciprocal and exponential are approximate to an ulp or two, so the
    two agree to fp32 rounding, not bit for bit."""
    z = g.abs() * 0.7071067811865476
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741
                                                       + t * (-1.453152027 + t * 1.061405429))))
    half_erfc = 0.5 * poly * torch.exp(-z * z)
    return g * torch.where(g >= 0, 1.0 - half_erfc, half_erfc)


def mlp_parts(module: nn.Module, fp8: Mapping[str, Any], name: str
              ) -> tuple[nn.Linear, nn.Linear] | None:
    """(fc1, fc2) of a timm ``Mlp`` at ``name`` whose fc1 and fc2 are both in ``fp8``
    (module paths), None for any other module or an MLP not fully selected; raises
    UsageError for a selected MLP the fusion cannot take, naming what is in the way."""
    if type(module).__name__ != "Mlp":
        return None
    fc1, fc2 = getattr(module, "fc1", None), getattr(module, "fc2", None)
    if f"{name}.fc1" not in fp8 or f"{name}.fc2" not in fp8:
        return None
    problems = []
    if not (isinstance(fc1, nn.Linear) and isinstance(fc2, nn.Linear)):
        problems.append("fc1 and fc2 are not Linear layers")
    act = getattr(module, "act", None)
    if not (isinstance(act, nn.GELU) and act.approximate == "none"):
        problems.append(f"its activation is {act!r}, not the erf GELU")
    if not isinstance(getattr(module, "norm", nn.Identity()), nn.Identity):
        problems.append("it has a norm between fc1 and fc2")
    for drop in ("drop1", "drop2"):
        d = getattr(module, drop, None)
        if not (d is None or isinstance(d, nn.Identity)
                or (isinstance(d, nn.Dropout) and d.p == 0)):
            problems.append(f"{drop} is not a no-op")
    if problems:
        raise UsageError(f"cannot fuse the MLP {name!r}: " + "; ".join(problems),
                         problems=problems)
    return fc1, fc2


class FusedMlp(nn.Module):
    """fc1 + GELU + fc2's quantize in one kernel, then fc2 (module docstring).

    ``fc1``, ``fc2``: the fp32 Linear layers (the graph's kernels); ``scales1``,
    ``scales2``: their (activation scale, per-channel weight scales); ``options``:
    ``Fp8Gemm``'s (gemm mode, fast accumulation, the shared ones column, emulate) for fc2.
    """

    def __init__(self, fc1: nn.Linear, fc2: nn.Linear, scales1: tuple[float, Any],
                 scales2: tuple[float, Any], dtype: torch.dtype, *, emulate: bool = False,
                 imprecise_acc: int = 0, tiles: tuple[int, ...] | None = None,
                 gelu: str = "erfc", **options: Any) -> None:
        super().__init__()
        if dtype != torch.float16:
            raise UsageError("the fused MLP is an fp16 engine's form (fp8 builds are fp16 "
                             "elsewhere)")
        if gelu not in GELU_NAMES:
            raise UsageError(f"GELU form {gelu!r} of a fused MLP: choose "
                             f"{' or '.join(GELU_NAMES)}")
        # fc1's buffers, as Fp8Linear quantizes them (bit-identical FP8 operands)
        layer1 = Fp8Linear(fc1, *scales1, dtype, emulate=True)
        self.cin, self.hidden = layer1.cin, layer1.cout
        self.emulate, self.imprecise_acc, self.gelu = emulate, int(imprecise_acc), gelu
        # fc2 reads e4m3 rows of its padded width: fc1 writes that many columns (zeros
        # beyond ``hidden``: padded weight rows, bias 0, GELU(0) = 0)
        self.width = padded(fc2.in_features)
        if fc2.in_features != self.hidden:
            raise UsageError(f"fc1 writes {self.hidden} features, fc2 reads {fc2.in_features}")
        self.register_buffer("act_scale", layer1.act_scale.clone())
        self.register_buffer("weight_fp8", layer1.weight_fp8[:self.width].clone())
        self.register_buffer("conv_scale", layer1.weight_scale_row[0, :self.width]
                             * layer1.act_scale)
        bias = torch.zeros(self.width)
        bias[:self.hidden] = layer1.bias_out[:self.hidden]
        self.register_buffer("bias", bias)              # the fp16 graph's bias, in fp32
        self.register_buffer("out_scale", scale_tensor(scales2[0]))
        self.fc2 = Fp8Linear(fc2, *scales2, dtype, emulate=emulate, **options)
        # fc1's kernel tiles: given, measured (MLP_TILES), else config_for's rule (resolved
        # where the kernel is imported: triton is not needed to build the emulated form)
        self.tiles = tuple(tiles or MLP_TILES.get((self.cin, self.width)) or ())

    def hidden_e4m3(self, x: torch.Tensor) -> torch.Tensor:
        """fc1 + GELU of tokens ``x`` [..., in] as fc2's e4m3 rows [M, width]."""
        q = quantize(x, self.act_scale).reshape(-1, self.cin)
        return self.emulated_hidden(q) if self.emulate else self.kernel_hidden(q)

    def emulated_hidden(self, q: torch.Tensor) -> torch.Tensor:
        """The kernel's arithmetic in torch, on fc1's e4m3 rows ``q`` [M, in]."""
        w = self.weight_fp8[:, :self.cin].float()
        y = ((q.float() @ w.t()) * self.conv_scale + self.bias).half().float()
        y = (F.gelu(y) if self.gelu == "erf" else gelu_erfc(y)).half()
        return quantize(y, self.out_scale[:1])

    def kernel_hidden(self, q: torch.Tensor) -> torch.Tensor:
        """fc1's e4m3 rows ``q`` [M, in] through the Triton kernel: e4m3 [M, width]."""
        from bundler.targets.torch_aoti.kernels.fp8_conv import (Fp8ConvConfig, config_for,
                                                                 fp8_conv_fused)

        tiles = (Fp8ConvConfig(*self.tiles) if self.tiles
                 else config_for(self.cin, self.width, (1, 1), (1, 1)))
        _, y8 = fp8_conv_fused(q.reshape(-1, 1, 1, self.cin), self.weight_fp8,
                               self.conv_scale, self.bias, self.width, (1, 1), (1, 1), (0, 0),
                               gelu=self.gelu, out_f16=False, out_scale=self.out_scale,
                               config=tiles, imprecise_acc=self.imprecise_acc)
        return y8.reshape(-1, self.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc2.matmul(self.hidden_e4m3(x))
        return y.reshape(*x.shape[:-1], self.fc2.out)


def fuse_mlps(body: nn.Module, model: nn.Module, fp8: Mapping[str, tuple[float, Any]],
              dtype: torch.dtype, **options: Any) -> int:
    """Replace, in ``body`` (``rewrite_as_is``'s copy), every timm MLP of ``model`` whose
    fc1 and fc2 are both FP8 by a ``FusedMlp`` (fp32 kernels from ``model``, as the graph's);
    returns how many. ``options``: ``FusedMlp``'s."""
    found = [(name, parts) for name, m in model.named_modules()
             if (parts := mlp_parts(m, fp8, name)) is not None]
    for name, (fc1, fc2) in found:
        body.set_submodule(name, FusedMlp(fc1, fc2, fp8[f"{name}.fc1"], fp8[f"{name}.fc2"],
                                          dtype, **options))
    return len(found)
