"""Per-kernel time of one forward pass, grouped into what an fp8 engine spends it on.

Why categories: "fp8 is no faster than fp16" has a handful of usual causes (the FP8 GEMMs
themselves, the quantize and convert passes around them, a norm or activation kernel that
no longer fuses), and one table that sums the kernels by kind says which one it is. The
kind is read from the kernel's name:

* Triton kernels (Inductor's, ``triton_*``) are named by the ops they fuse: a name with
  ``layer_norm`` is a LayerNorm, ``gelu`` an activation; either one counts as "quantize
  fused" when the name also has ``clamp`` (the quantize's saturation, ``fp8_layers.quantize``);
  a kernel whose name has ``clamp`` or ``_to_copy`` and neither of those is a separate
  quantize or dtype conversion pass ("quantize/convert");
* library GEMMs (cuBLASLt ``nvjet_*``, ``sm90_xmma_gemm_*``, CUTLASS) are FP8 when the name
  says e4m3/e5m2/fp8 (or cuBLASLt's type letters have ``q``), else fp16 GEMMs; convolution
  kernels (``fprop``, ``implicit``, ``conv``) are a kind of their own; flash/fused attention
  kernels are "attention";
* on the CPU (the dry run), the profiler's events are the aten ops the model calls (their
  time with what they call: the CPU ``_scaled_mm`` calls ``mm``), sorted the same way.

The table prints each kind's time per run, its share and its kernel count per run (so a
misread name shows as a count that does not add up: 48 FP8 GEMMs for ViT-B), then the top
kernels by time. Only the standard library at module level.
"""

from __future__ import annotations

import re
from collections.abc import Callable

CATEGORIES = ("FP8 GEMM", "fp16 GEMM", "convolution", "attention", "layernorm", "activation",
              "quantize/convert", "other")


def kernel_category(name: str) -> tuple[str, bool]:
    """(category, whether a quantize is fused into it) of a kernel or CPU op named ``name``."""
    n = name.lower()
    if n.startswith(("triton", "cpp_fused")):
        quantize = "clamp" in n
        if "layer_norm" in n:
            return "layernorm", quantize
        if "gelu" in n or "relu" in n or "silu" in n:
            return "activation", quantize
        if quantize or "_to_copy" in n:
            return "quantize/convert", quantize
        return "other", False
    if n.startswith("aten::"):                      # CPU profile of an eager run
        op = n.removeprefix("aten::")
        if op in ("_scaled_mm",):
            return "FP8 GEMM", False
        if op in ("mm", "addmm", "bmm", "matmul", "linear"):
            return "fp16 GEMM", False
        if "conv" in op:
            return "convolution", False
        if "attention" in op or "softmax" in op:
            return "attention", False
        if "layer_norm" in op:
            return "layernorm", False
        if op in ("gelu", "relu", "silu"):
            return "activation", False
        if op in ("clamp", "div", "to", "_to_copy", "copy_"):
            return "quantize/convert", False
        return "other", False
    if any(s in n for s in ("flash", "fmha", "attention", "attn")):
        return "attention", False
    if any(s in n for s in ("fprop", "implicit_gemm", "implicit_convolve", "conv")):
        return "convolution", False
    if any(s in n for s in ("gemm", "xmma", "cutlass", "nvjet", "cublas", "matmul")):
        letters = re.match(r"nvjet_(?:sm\d+_)?([a-z]+)_", n)
        fp8 = (any(s in n for s in ("e4m3", "e5m2", "fp8", "f8f8", "float8"))
               or (letters is not None and "q" in letters.group(1)))
        return ("FP8 GEMM" if fp8 else "fp16 GEMM"), False
    if "layer_norm" in n or "layernorm" in n:
        return "layernorm", False
    return "other", False


def summarize(kernels: list[tuple[str, float, int]], runs: int) -> dict:
    """``kernels``: (name, total ms, calls) over ``runs`` runs -> per-category ms and
    counts per run, how many layernorm/activation kernels carry a fused quantize, total."""
    groups = {c: {"ms": 0.0, "count": 0.0} for c in CATEGORIES}
    fused = {"layernorm": [0, 0], "activation": [0, 0]}
    for name, ms, calls in kernels:
        cat, quantize = kernel_category(name)
        groups[cat]["ms"] += ms / runs
        groups[cat]["count"] += calls / runs
        if cat in fused:
            fused[cat][0] += round(calls / runs) if quantize else 0
            fused[cat][1] += round(calls / runs)
    total = sum(g["ms"] for g in groups.values())
    return {"total_ms": total, "groups": groups,
            "quantize_fused": {c: {"with_quantize": a, "kernels": b} for c, (a, b) in fused.items()}}


def format_summary(summary: dict, label: str) -> list[str]:
    total = summary["total_ms"] or 1e-12
    lines = [f"-- kernels by kind, {label}: {summary['total_ms']:.3f} ms of kernel time per run",
             f"   {'kind':<18}{'ms/run':>9}{'share':>8}{'kernels/run':>13}"]
    for cat in CATEGORIES:
        g = summary["groups"][cat]
        if g["count"]:
            lines.append(f"   {cat:<18}{g['ms']:9.4f}{100 * g['ms'] / total:7.1f}%{g['count']:13.1f}")
    for cat, f in summary["quantize_fused"].items():
        if f["kernels"]:
            lines.append(f"   {cat}: {f['with_quantize']} of its {f['kernels']} kernels/run "
                         "carry a fused quantize")
    return lines


def kernel_table(step: Callable[[], object], label: str, rows: int = 25, repeats: int = 5,
                 log: Callable[[str], None] = print, device: str = "cuda") -> dict:
    """Profile ``repeats`` plain runs of ``step()`` (no CUDA graph: the profiler sees each
    kernel), print the kinds table and the top ``rows`` kernels; returns ``summarize``'s
    dict with the top kernels. ``device="cpu"`` (the dry run): the top-level aten ops'
    CPU time, what they call included."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = device != "cpu"
    for _ in range(2):
        step()
    if cuda:
        torch.cuda.synchronize()
    activity = ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU
    with profile(activities=[activity]) as prof:
        for _ in range(repeats):
            step()
        if cuda:
            torch.cuda.synchronize()
    if cuda:
        kernels = [(e.key, e.self_device_time_total / 1e3, e.count) for e in prof.key_averages()
                   if e.device_type == torch.autograd.DeviceType.CUDA]
    else:   # the outermost aten ops, with what they call (the CPU _scaled_mm calls mm)
        def outermost(e) -> bool:
            parent = e.cpu_parent
            while parent is not None:
                if parent.name.startswith("aten::"):
                    return False
                parent = parent.cpu_parent
            return True

        totals: dict[str, list] = {}
        for e in prof.events():
            if e.name.startswith(("aten::", "cpp_fused", "triton")) and outermost(e):
                entry = totals.setdefault(e.name, [0.0, 0])
                entry[0] += e.cpu_time_total / 1e3
                entry[1] += 1
        kernels = [(name, ms, calls) for name, (ms, calls) in totals.items()]
    summary = summarize(kernels, repeats)
    for line in format_summary(summary, label):
        log(line)
    ranked = sorted(kernels, key=lambda k: -k[1])[:rows]
    for name, ms, calls in ranked:
        cat, quantize = kernel_category(name)
        log(f"  {ms / repeats:8.4f} ms  x{calls // repeats:<4d} {cat + ('+q' if quantize else ''):<20} "
            f"{name[:100]}")
    summary["top"] = [{"name": n, "ms": ms / repeats, "calls": c // repeats} for n, ms, c in ranked]
    return summary
