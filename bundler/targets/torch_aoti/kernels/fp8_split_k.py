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

The convolutions' form (``sum_of_splits``, for ``fp8_conv``'s and ``fp8_conv_tma``'s
kernels): the split programs of one output tile end in the same kernel. Each writes its
fp32 tile to a workspace and counts itself in on the tile's counter; the one that arrives
last adds the tiles in split order and runs the layer's fused epilogue (scale, bias,
residual, ReLU, fp16 and e4m3 outputs). Why not the graph's sum, as above: a ResNet
layer's output is read by the next convolution, our own kernel, so Inductor would add the
partials in a pass of its own, a launch and the partials' bytes more per layer. The sum
is taken in split order whichever program arrives last, so the outputs do not depend on
the order the programs run in either. The counters start at zero at each launch (the
launch allocates them).

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

__all__ = ["OP", "SplitKConfig", "fp8_rows_partials", "linear_split_k_config",
           "sum_of_splits", "split_range", "split_workspace", "SPLIT_PLAN_BATCH",
           "MEASURED_CONV_SPLITS", "conv_splits_for"]

OP = "trt_bundle::fp8_rows_partials"

#: Programs below this with the unsplit tiles leave SMs idle enough that a split pays: the
#: H200's 132 SMs less a margin. ViT-B at 197 rows: proj and fc2 make 48 (split), qkv 144
#: and fc1 192 (not).
SPLIT_BELOW_PROGRAMS = 100


#: The batch a dynamic-batch graph's convolution splits are chosen for (its tiles'
#: ``fp8_conv.MEASURED_TILES`` and ``fp8_conv_tma.MEASURED_TMA_TILES`` are batch 32's).
SPLIT_PLAN_BATCH = 32
#: ``conv_splits_for``'s rule: split until about this many programs (four resident on each
#: of the H200's 132 SMs), at most ``MAX_CONV_SPLITS`` ways, each split keeping at least
#: ``MIN_SPLIT_STEPS`` reduction steps for the pipeline to fill.
SPLIT_TARGET_PROGRAMS = 528
MAX_CONV_SPLITS = 4
MIN_SPLIT_STEPS = 4
#: (cin, cout, kh, kw, sh, sw) -> splits for timm_resnet50's fused layers at batch 32, as
#: ``benchmarks/fp8_split_k_probe.py`` measures them on an H200; a layer not in it takes
#: ``conv_splits_for``'s rule. Empty until measured.
MEASURED_CONV_SPLITS: dict[tuple[int, int, int, int, int, int], int] = {}


def conv_splits_for(key: tuple[int, int, int, int, int, int], programs: int, steps: int,
                    table: dict | None = None) -> int:
    """How many ways to split the reduction of a fused convolution ``key`` (``fp8_conv.
    tile_key``) whose launch at ``SPLIT_PLAN_BATCH`` has ``programs`` output tiles of
    ``steps`` reduction steps each: ``table``'s (default ``MEASURED_CONV_SPLITS``), else
    the rule (``SPLIT_TARGET_PROGRAMS``); 1: no split."""
    table = MEASURED_CONV_SPLITS if table is None else table
    if key in table:
        return int(table[key])
    return max(1, min(MAX_CONV_SPLITS, SPLIT_TARGET_PROGRAMS // max(programs, 1),
                      steps // MIN_SPLIT_STEPS))


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


@triton.jit
def split_range(total, split, SPLITS: tl.constexpr):
    """The reduction steps [lo, hi) of ``split`` of SPLITS over ``total`` steps: ceil(total /
    SPLITS) each, the rest to the last (a split past the end has none and adds zeros)."""
    per = tl.cdiv(total, SPLITS)
    lo = split * per
    return lo, tl.minimum(lo + per, total)


@triton.jit
def sum_of_splits(acc, ws_ptr, cnt_ptr, tile, num_tiles, split, SPLITS: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(the tile's sum over its SPLITS splits, whether this program arrived last): this
    program's fp32 tile ``acc`` goes to the workspace ``ws`` [SPLITS, num_tiles, BLOCK_M *
    BLOCK_N], then onto the tile's counter; the last of the tile's programs adds the
    SPLITS tiles in split order (module docstring). The sum is meaningful only where the
    flag is set. Workspace traffic bypasses L1 (``.cg``): another SM wrote it."""
    size: tl.constexpr = BLOCK_M * BLOCK_N
    offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    tl.store(ws_ptr + (split * num_tiles + tile).to(tl.int64) * size + offs, acc,
             cache_modifier=".cg")
    tl.debug_barrier()          # every thread's part written before the count (release)
    arrived = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
    last = arrived == SPLITS - 1
    total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if last:
        for s in tl.static_range(SPLITS):
            total += tl.load(ws_ptr + (s * num_tiles + tile).to(tl.int64) * size + offs,
                             cache_modifier=".cg")
    return total, last


def split_workspace(splits: int, tiles: int, block_m: int, block_n: int,
                    device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp32 workspace, int32 counters at zero) of a launch of ``tiles`` output tiles in
    ``splits`` splits (``sum_of_splits``)."""
    return (torch.empty((splits * tiles * block_m * block_n,), dtype=torch.float32,
                        device=device),
            torch.zeros((tiles,), dtype=torch.int32, device=device))


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
