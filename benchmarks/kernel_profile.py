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


def replay_timeline(kernels: list[tuple[str, float, float]], runs: int) -> dict:
    """Where a CUDA graph replay's time goes between its kernels.

    Why: a plain run's kernel times (``kernel_table``) against the timed replay leave a
    remainder that mixes the graph's launch and the host's wait with the idle time between
    kernels; an fp8 graph of many short Triton kernels can lose to fp16 there alone. This
    reads the device timestamps of the replays themselves. ``kernels``: (name, start us,
    end us) of ``runs`` replays of one graph, each replay's kernels together (the caller
    synchronizes between replays). Per replay (medians over the replays): its span from
    the first kernel's start to the last one's end, the time some kernel was running
    (busy), the idle time between kernels and the time kernels overlapped (a kernel
    starting before the previous ones finished, as programmatic dependent launch allows);
    idle and overlap are summed by transition (kind of the kernel before -> kind of the
    kernel after) and by the kernel that waited."""
    import statistics

    ordered = sorted(kernels, key=lambda k: k[1])
    if runs < 1 or not ordered or len(ordered) % runs:
        raise ValueError(f"{len(ordered)} kernels do not split into {runs} replays")
    n = len(ordered) // runs
    spans, busies, idles, overlaps = [], [], [], []
    transitions: dict[tuple[str, str], list[float]] = {}
    waited: dict[str, list[float]] = {}
    for r in range(runs):
        replay = ordered[r * n:(r + 1) * n]
        start, last_end = replay[0][1], replay[0][2]
        busy, idle, overlap = replay[0][2] - replay[0][1], 0.0, 0.0
        for (prev, _, _), (name, s, e) in zip(replay, replay[1:]):
            gap = s - last_end
            entry = transitions.setdefault(
                (kernel_category(prev)[0], kernel_category(name)[0]), [0, 0.0, 0.0])
            wait = waited.setdefault(name, [0, 0.0])
            entry[0] += 1
            wait[0] += 1
            if gap >= 0:
                idle += gap
                entry[1] += gap
                wait[1] += gap
                busy += e - s
            else:
                overlap += min(-gap, e - s)
                entry[2] += min(-gap, e - s)
                busy += max(0.0, e - last_end)
            last_end = max(last_end, e)
        spans.append(last_end - start)
        busies.append(busy)
        idles.append(idle)
        overlaps.append(overlap)
    return {
        "kernels": n, "span_us": statistics.median(spans), "busy_us": statistics.median(busies),
        "idle_us": statistics.median(idles), "overlap_us": statistics.median(overlaps),
        "transitions": sorted(({"from": a, "to": b, "count": c / runs, "idle_us": i / runs,
                                "overlap_us": o / runs}
                               for (a, b), (c, i, o) in transitions.items()),
                              key=lambda t: -t["idle_us"]),
        "waited": sorted(({"name": k, "count": c / runs, "idle_us": i / runs}
                          for k, (c, i) in waited.items()), key=lambda w: -w["idle_us"]),
    }


def format_timeline(timeline: dict, label: str, rows: int = 10) -> list[str]:
    t = timeline
    lines = [f"-- replay timeline, {label}: {t['kernels']} kernels, span {t['span_us']:.1f} us, "
             f"busy {t['busy_us']:.1f} us, idle between kernels {t['idle_us']:.1f} us "
             f"({t['idle_us'] / max(t['kernels'] - 1, 1):.2f} us a launch), overlapped "
             f"{t['overlap_us']:.1f} us",
             f"   {'transition':<40}{'count':>7}{'idle us':>9}{'overlap us':>12}"]
    for tr in t["transitions"][:rows]:
        lines.append(f"   {tr['from'] + ' -> ' + tr['to']:<40}{tr['count']:7.1f}"
                     f"{tr['idle_us']:9.1f}{tr['overlap_us']:12.1f}")
    lines.append("   kernels by idle time before them:")
    for w in t["waited"][:rows]:
        lines.append(f"   {w['idle_us']:8.1f} us  x{w['count']:<5.1f} {w['name'][:100]}")
    return lines


def timeline_table(step: Callable[[], object], label: str, rows: int = 10, repeats: int = 20,
                   log: Callable[[str], None] = print) -> dict:
    """Profile ``repeats`` calls of ``step()``, each one CUDA graph replay that synchronizes
    before returning, and print ``replay_timeline``'s table. Memsets and copies inside the
    graph count as kernels (they occupy the device in the same order); so do kernels that
    ``replay()`` launches before the graph (torch fills the RNG offsets of the generators a
    capture registered), whose wait for the graph's launch then shows as the transition
    into the graph's first kernel."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            step()
        torch.cuda.synchronize()
    kernels = [(e.name, float(e.time_range.start), float(e.time_range.end)) for e in prof.events()
               if e.device_type == torch.autograd.DeviceType.CUDA]
    try:
        timeline = replay_timeline(kernels, repeats)
    except ValueError as exc:
        log(f"-- replay timeline, {label}: {exc} (the profiler missed some of the graph's kernels)")
        return {}
    for line in format_timeline(timeline, label, rows):
        log(line)
    return timeline
