"""The files of a `bundle study`: study.json (the data), study.md (tables), study.png (plot).

Separate from `bundler.study` so that the measuring code does not format, and a study.json
can be re-rendered without measuring again (`write_report(json.load(...), folder)`).
matplotlib is optional (`pip install 'trt-bundle[study]'`): without it the plot is
skipped and the reason recorded in the returned `files`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from bundler.quality import decimal
from runtime_py.bench import DEVICE_TIMING_BOUNDARIES

BOUNDARY_TEXT = {
    "engine": "runner.infer on host arrays; per-call wall time (perf_counter). On CPU engines "
              "there are no device copies; on a GPU runner without device_timings the host "
              "copies are included",
    **DEVICE_TIMING_BOUNDARIES,
}


def _jsonable(value):
    """NaN/Inf as strings (strict JSON has neither)."""
    if isinstance(value, float) and not math.isfinite(value):
        return decimal(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def _num(x, digits: int = 4) -> str:
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    if isinstance(x, float):
        return decimal(x) if not math.isfinite(x) else f"{x:.{digits}g}"
    return str(x)


def _pct(x) -> str:
    return "-" if x is None else (decimal(x) if not math.isfinite(x) else f"{100 * x:.2f}%")


def _static_graphs(bundle: dict) -> str:
    """The batch sizes a torch-aoti engine has graphs of their own for (engine.details
    static_batches): a speed row at such a size timed that graph, not the dynamic one."""
    sizes = (bundle.get("engine_details") or {}).get("static_batches")
    return ", ".join(map(str, sizes)) if sizes else "-"


def _model_form(bundle: dict) -> str:
    """How a torch-aoti engine holds the model (engine.details compile_options layout, and
    the small static graphs' form where it differs): the rows of one study can compare
    forms, e.g. the NHWC rewrite against channels_last."""
    options = (bundle.get("engine_details") or {}).get("compile_options") or {}
    form = options.get("layout")
    if not form:
        return "-"
    small = options.get("small_batch_layout")
    return f"{form}; {small}" if small else form


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(r) + " |" for r in rows]


def render_markdown(study: dict) -> str:
    s, env, bundles = study["settings"], study["environment"], study["bundles"]
    fam = study["family"]
    out = [f"# Study: {fam['name']} {fam['version']} on {s['target']}", ""]
    if s["random_weights"]:
        out += ["**RANDOM WEIGHTS (seed "
                f"{s['seed']})**: a smoke study of the real graphs with seeded random weights. "
                "Speed figures are meaningful (same graphs and engines); quality figures only "
                "say that the precisions track fp32 on these inputs, not ImageNet accuracy.", ""]
    out += [f"Command: `{env['command'] or '(library call)'}`  ", f"Date: {env['date_utc']}", ""]
    if s.get("input_dtype", "float32") == "uint8":
        out += ["Input: uint8 NHWC pixels for every bundle and the peer (rescale and normalize "
                "on the device): with_copies copies a quarter of the float32 bytes.", ""]

    out += ["## Speed ratio: fp16 time / fp8 time (> 1 means fp8 is faster)", ""]
    if study["ratios"]:
        out += _table(["batch", "boundary", "fp16", "fp8 bundle", "fp16 ms", "fp8 ms", "fp16/fp8"],
                      [[str(r["batch_size"]), r["boundary"], r["numerator"], r["denominator"],
                        f"{r['fp16_ms']:.2f}", f"{r['fp8_ms']:.2f}", f"{r['ratio']:.3f}x"]
                       for r in study["ratios"]])
    else:
        out.append("(no fp16 and fp8 pair in this study)")
    peer = study.get("peer")
    if peer:
        out += ["", "## Against the peer: peer time / bundle time (> 1 means the bundle is "
                    "faster)", "", f"Peer: {peer['note']}; ran on {peer['ran_on']}.", ""]
        out += _table(["batch", "boundary", "bundle", "peer ms", "bundle ms", "peer/bundle"],
                      [[str(r["batch_size"]), r["boundary"], r["bundle"], f"{r['peer_ms']:.3f}",
                        f"{r['bundle_ms']:.3f}", f"{r['ratio']:.3f}x"]
                       for r in study["peer_ratios"]])
    out += ["", "## Latency per bundle (median of per-call times)", ""]
    rows = [[b["label"], f["boundary"], str(f["batch_size"]), f"{f['median_ms']:.2f}",
             f"{f['p90_ms']:.2f}", f"{f['items_per_s']:.2f}", str(f["calls"])]
            for b in bundles + ([peer] if peer else []) for f in b["timings"]]
    out += _table(["bundle", "boundary", "batch", "median ms", "p90 ms", "images/s", "calls"], rows)

    out += ["", "## Sizes", ""]
    out += _table(["bundle", "bundle file", "engine member", "engine raw", "engine stored",
                   "layers", "FP8 layers", "static-batch graphs", "model form"],
                  [[b["label"], _mib(b["sizes"]["bundle_bytes"]), b["sizes"]["engine_member"],
                    _mib(b["sizes"]["engine_raw_bytes"]), _mib(b["sizes"]["engine_stored_bytes"]),
                    _num(b["sizes"]["layer_count"]),
                    _num((b.get("recipe") or {}).get("quantized_layers")),
                    _static_graphs(b), _model_form(b)] for b in bundles])

    ev, ref = study["eval"], study["reference"]
    out += ["", f"## Quality vs fp32 on {ev['images']} inputs", "",
            f"Inputs: {ev['source']}" + (f" ({ev['digest']})" if ev.get("digest") else "") + ".  ",
            f"Reference: {ref['kind']} {ref.get('name', '')} ({ref['engine']}).", ""]
    labelled = ev.get("labelled")
    header = ["bundle", "ran on", "top-1 agreement", "KL mean (nats)", "max abs diff", "NaN", "Inf"]
    if labelled:
        header += ["top-1 accuracy", "fp32 top-1"]
    rows = []
    for b in bundles:
        q = b["quality"]
        row = [b["label"], b["engine"]["ran_on"], _pct(q["top1_agreement"]), _num(q["kl_mean"]),
               _num(q["max_abs_diff"]), str(q["nan_count"]), str(q["inf_count"])]
        if labelled:
            row += [_pct(q.get("top1_accuracy")), _pct(q.get("reference_top1_accuracy"))]
        rows.append(row)
    if peer:
        q = peer["quality"]
        rows.append([peer["label"], peer["ran_on"], _pct(q["top1_agreement"]),
                     _num(q["kl_mean"]), _num(q["max_abs_diff"]), str(q["nan_count"]),
                     str(q["inf_count"])] + (["", ""] if labelled else []))
    out += _table(header, rows)
    out += ["", f"## Stress inputs ({len(study['stress_inputs'])}: "
                f"{', '.join(study['stress_inputs'])})", ""]
    out += _table(["bundle", "top-1 agreement", "KL mean", "max abs diff", "NaN", "Inf",
                   "non-finite outputs on"],
                  [[b["label"], _pct(t["top1_agreement"]), _num(t["kl_mean"]),
                    _num(t["max_abs_diff"]), str(t["nan_count"]), str(t["inf_count"]),
                    ", ".join(t["nonfinite_inputs"]) or "none"]
                   for b in bundles + ([peer] if peer else [])
                   for t in [b["stress"]["totals"]]])

    t = s["timing"]
    out += ["", "## Measurement boundaries and repeats", ""]
    used = sorted({f["boundary"] for b in bundles for f in b["timings"]})
    out += [f"- `{name}`: {BOUNDARY_TEXT.get(name, '')}" for name in used]
    if any(b["engine"]["ran_on"] == "onnxruntime" for b in bundles):
        out.append("- ONNX Runtime runs the fp16 and FP8 (Q/DQ) graphs with its CPU kernels "
                   "(no FP8 arithmetic; the Q/DQ pairs and casts are extra work), so its "
                   "fp16/fp8 ratios describe this CPU engine, not a TensorRT plan.")
    out += [f"- CPU engines: {t['warmup']} warm-up call per batch size, then calls until at least "
            f"{t['min_calls']} calls and {t['min_seconds']:g} s, or {t['max_seconds']:g} s have "
            "passed (the `calls` column says how many were timed); inputs uniform in [-1, 1].",
            f"- GPU engines (device_timings): {t['device_warmup']} warm-up iterations, then "
            f"{t['iterations']} timed iterations.",
            "- All bundles measured one after the other in one process; the fp32 logits are "
            "computed once (ONNX Runtime CPU on the fp32 bundle's model.onnx).",
            f"- Calibration: {s['calibration']['data']}, {s['calibration']['count']} images; "
            f"reference inputs per bundle: {s['reference_count']}.", ""]

    out += ["## Environment", ""]
    out += [f"- CPU: {env['cpu']} ({env['cpu_cores']} cores, {env['cpu_cores_usable']} usable)",
            f"- Load average (1, 5, 15 min) when timing started: "
            f"{', '.join(map(str, env.get('load_average') or [])) or 'unknown'} "
            "(other processes on the host slow every bundle, not the ratios alone)",
            f"- GPU: {', '.join(env['gpus']) or 'none visible'}",
            f"- Platform: {env['platform']}, Python {env['python']}",
            "- Engines: " + ", ".join(f"{k} {v}" for k, v in sorted(env["engines"].items()) if v),
            "- Packages: " + ", ".join(f"{k} {v}" for k, v in sorted(env["packages"].items())), ""]
    out += ["## Bundles", ""]
    out += _table(["bundle", "file", "id", "built"],
                  [[b["label"], Path(b["path"]).name, f"`{b['id']}`",
                    "reused" if b["reused"] else f"built ({b['rebuild_reason']})"]
                   for b in bundles])
    plot = study.get("files", {}).get("png")
    out += ["", "![latency per batch size](study.png)" if plot else "", ""]
    return "\n".join(out)


def plot_latency(study: dict, path: Path) -> str | None:
    """Median latency per batch size per bundle (and boundary); None, or why it was skipped."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install 'trt-bundle[study]')"
    styles = {"engine": "-", "graph_replay": "-", "with_copies": "--"}
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for b in study["bundles"]:
        for boundary in sorted({f["boundary"] for f in b["timings"]}):
            pts = sorted((f["batch_size"], f["median_ms"]) for f in b["timings"]
                         if f["boundary"] == boundary)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], styles.get(boundary, ":"),
                    marker="o", label=f"{b['label']} ({boundary})")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    sizes = study["settings"]["batch_sizes"]
    ax.set_xticks(sizes, [str(x) for x in sizes])
    ax.set_xlabel("batch size")
    ax.set_ylabel("median latency per batch (ms)")
    env = study["environment"]
    device = ", ".join(env["gpus"]) or env["cpu"]
    ax.set_title(f"{study['family']['name']} on {study['settings']['target']}\n{device}",
                 fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return None


def write_report(study: dict, out_dir: Path) -> dict:
    """Write study.png (if possible), study.md and study.json; return the files written."""
    out_dir = Path(out_dir)
    files: dict = {"json": str(out_dir / "study.json"), "md": str(out_dir / "study.md")}
    skipped = plot_latency(study, out_dir / "study.png")
    if skipped is None:
        files["png"] = str(out_dir / "study.png")
    else:
        files["plot_skipped"] = skipped
    study = dict(study, files=files)
    (out_dir / "study.md").write_text(render_markdown(study))
    (out_dir / "study.json").write_text(json.dumps(_jsonable(study), indent=2, sort_keys=True) + "\n")
    return files
