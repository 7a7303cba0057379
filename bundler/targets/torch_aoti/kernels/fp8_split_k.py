"""FP8 GEMM of a few hundred rows with its reduction split (Triton), a torch custom op that
returns fp32 partial sums, one per split, for the graph to add.

Why: at a static batch of 1 or 2, a ViT-B Linear has 197 or 394 rows. With the 64x64 tiles
that suit such rows (``fp8_conv.linear_small_batch_config``), the layers of 768 outputs
(attention's proj, the MLP's fc2) make 48 programs on the H200's 132 SMs, each walking the
whole reduction alone (fc2: 3,072 deep). Split in two, twice the programs walk half of it
each. On the H200 (``benchmarks/vit_gemm_small_probe.py --split-k``,
docs/measurements/h200-2026-12-06-l) at 197 rows: fc2 0.0044 ms for the partial sums
against 0.0068 for the fused kernel's best tiles and fp16's 0.0072; proj 0.0028 against
0.0035 and 0.0040.

The sum of the partials, the per-channel scale and the bias (``Fp8Linear.split_k_gemm``) are
left to the graph: Inductor fuses them into the kernel that reads the output anyway (the
residual add and the next LayerNorm), where a second kernel of ours would cost its own
launch (the probe's two-kernel form: proj 0.0045 ms, slower than unsplit; fc2 0.0061,
faster by less than a third of the gain).

Operands as ``fp8_conv``'s: e4m3 rows [M, C] (the activation quantized with its per-tensor
scale), the layer's e4m3 weight buffer [>= cout, ldw] (rows padded), fp32 accumulation as
Triton does FP8 dots on sm_90. Each split's sum is written, not accumulated with atomics:
the outputs do not depend on the order the programs run in.

Imports triton at module level: import this module only where triton may be used
(``kernels.available``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch.library import triton_op

from bundler.targets.torch_aoti.kernels.launch import traceable

__all__ = ["OP", "SplitKConfig", "fp8_rows_partials", "linear_split_k_config"]

OP = "trt_bundle::fp8_rows_partials"

#: Programs below this with the unsplit tiles leave SMs idle enough that a split pays: the
#: H200's 132 SMs less a margin. ViT-B at 197 rows: proj and fc2 make 48 (split), qkv 144
#: and fc1 192 (not).
SPLIT_BELOW_PROGRAMS = 100


class SplitKConfig(NamedTuple):
    """Splits of the reduction and the tiles of each: BLOCK_M x BLOCK_N output tile,
    BLOCK_K deep steps, warps, pipeline stages."""

    splits: int
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


def linear_split_k_config(rows: int, cin: int, cout: int) -> SplitKConfig | None:
    """The split form of a Linear layer's ``rows`` tokens, or None where it does not pay
    (``SPLIT_BELOW_PROGRAMS``). Two splits of 64x64 tiles, 256 deep for a long reduction:
    the H200's best for ViT-B's proj and fc2 at 197 rows (three splits were slower there;
    at 394 rows fc2 took 0.0062 ms in two, 0.0053 in three, against the fused kernel's
    0.0070)."""
    programs = triton.cdiv(rows, 64) * triton.cdiv(cout, 64)
    if programs >= SPLIT_BELOW_PROGRAMS or cin < 512:
        return None
    return SplitKConfig(2, 64, 64, 256 if cin >= 2048 else 128, 4, 3)


@triton.jit
def _fp8_rows_partials_kernel(x_ptr, w_ptr, ws_ptr, M, C, COUT, ldw, K_SPLIT,
                              EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr,
                              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One output tile of one split: rows [M, C] times the weight rows [COUT, ldw] over the
    reduction elements [split * K_SPLIT, +K_SPLIT), fp32 into ws[split]."""
    num_n = tl.cdiv(COUT, BLOCK_N)
    pid_m = tl.program_id(0) // num_n
    pid_n = tl.program_id(0) % num_n
    split = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    n_ok = offs_n < COUT
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * C
    w_cols = w_ptr + offs_n.to(tl.int64)[None, :] * ldw
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_lo = split * K_SPLIT
    for k in range(k_lo, tl.minimum(k_lo + K_SPLIT, C), BLOCK_K):
        c = k + offs_k
        if EVEN_K:
            a = tl.load(x_rows + c[None, :], mask=m_ok[:, None], other=0.0)
            b = tl.load(w_cols + c[:, None], mask=n_ok[None, :], other=0.0)
        else:
            c_ok = c < C
            a = tl.load(x_rows + c[None, :], mask=m_ok[:, None] & c_ok[None, :], other=0.0)
            b = tl.load(w_cols + c[:, None], mask=n_ok[None, :] & c_ok[:, None], other=0.0)
        acc = tl.dot(a, b, acc)
    ws = ws_ptr + split.to(tl.int64) * M * COUT
    tl.store(ws + offs_m.to(tl.int64)[:, None] * COUT + offs_n[None, :], acc,
             mask=m_ok[:, None] & n_ok[None, :])


@triton_op(OP, mutates_args={})
def fp8_rows_partials_op(x: torch.Tensor, weight: torch.Tensor, cout: int, splits: int,
                         block_m: int, block_n: int, block_k: int, num_warps: int,
                         num_stages: int) -> torch.Tensor:
    """``x`` e4m3 [M, C] (contiguous), ``weight`` e4m3 [>= cout, >= C] (rows contiguous) ->
    fp32 [S, M, cout], S = ``splits`` or fewer where C has fewer ``block_k`` steps (module
    docstring)."""
    x = x.contiguous()
    rows, c = x.shape
    k_split = triton.cdiv(triton.cdiv(c, splits), block_k) * block_k
    made = triton.cdiv(c, k_split)
    ws = torch.empty((made, rows, cout), dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(rows, block_m) * triton.cdiv(cout, block_n), made)
    traceable(_fp8_rows_partials_kernel)[grid](
        x, weight, ws, rows, c, cout, weight.stride(0), k_split,
        EVEN_K=c % block_k == 0, BLOCK_M=block_m,
        BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps, num_stages=num_stages)
    return ws


def fp8_rows_partials(x: torch.Tensor, weight: torch.Tensor, cout: int,
                      config: SplitKConfig) -> torch.Tensor:
    """The op in the callers' form: fp32 partial sums [S, M, cout] of e4m3 rows ``x``."""
    return torch.ops.trt_bundle.fp8_rows_partials(x, weight, int(cout), *map(int, config))
