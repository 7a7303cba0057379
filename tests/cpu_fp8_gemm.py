"""What torch's CPU kernel of ``torch._scaled_mm`` takes, for tests that run FP8 GEMMs here.

torch 2.14's CPU kernel takes rowwise scales (a column of row scales, a row of column
scales); torch 2.11's (the H200's) takes per-tensor scales only and refuses rowwise ones
with an internal assert. The GPU path (cuBLASLt) takes both on either version, so a test
that checks which GEMM a layer takes, not the rowwise arithmetic itself, runs its FP8 GEMM
in the mode this torch can run on the CPU.
"""

from __future__ import annotations

import functools

import torch


@functools.cache
def rowwise_runs() -> bool:
    """Whether this torch's CPU ``torch._scaled_mm`` takes rowwise scales."""
    a = torch.zeros(16, 16).to(torch.float8_e4m3fn)
    try:
        torch._scaled_mm(a, a.t(), scale_a=torch.ones(16, 1), scale_b=torch.ones(1, 16),
                         out_dtype=torch.bfloat16)
    except (RuntimeError, NotImplementedError):
        return False
    return True


ROWWISE_REASON = ("this torch's CPU torch._scaled_mm takes per-tensor scales only (2.11's does; "
                  "2.14's takes rowwise ones)")


def gemm_mode_that_runs_here() -> str:
    """The FP8 GEMM mode (``fp8_layers.GEMM_MODES``) a layer can run on this CPU:
    "rowwise-fp16", the families' mode, where the CPU kernel takes it, else "tensorwise"."""
    return "rowwise-fp16" if rowwise_runs() else "tensorwise"
