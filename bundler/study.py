"""`bundle study`: build (or reuse) a family's bundles and measure them side by side.

One process builds every bundle asked for plus fp32 (the reference), then, per bundle:
engine time per batch size with the boundary stated, file/engine sizes, layer count
where the engine reports it, and the eval figures against the fp32 bundle (ONNX Runtime
CPU on its `model.onnx`). Measuring all of them in one process, one after the other, is
what makes the ratios fair: same host, same load, same inputs. `bundler.study_report`
turns the result into study.md and the latency plot.

Timing boundaries:
  engine        CPU runners (and GPU runners without `device_timings`): `runner.infer` on
                host arrays, per call wall time (`runtime_py.bench.time_calls`)
  graph_replay  GPU runners: CUDA graph replay on device-resident inputs, synchronized per
                iteration, copies excluded (`runtime_py.bench.device_timings`)
  with_copies   GPU runners: H2D + run + D2H, synchronized per iteration

Reuse (`bundler.reuse`): a bundle at `<out>/<name>.bundle` is reused when it verifies and its
manifest says it was made from the same inputs: family name and version, precision, variant, engine
target, weights (random seed, or checkpoint sha256), FP8 recipe digest, calibration method
and data digest, reference inputs (count and source), trt-bundle version, and the
versions of the packages that make the graph and engine (torch, timm, onnx,
onnx-graphsurgeon, and tensorrt for plans). Anything else is rebuilt (and the reason kept).

Input (``input_dtype``, `bundle study --input`): float32 studies bundles that take the
preprocessed NCHW tensor; uint8 builds every bundle, the fp32 reference included, with uint8
NHWC pixel input (`bundle make --input uint8`: the engine rescales and normalizes on its
device), evaluates them on the same synthetic pictures as pixels, and gives the peer the same
pixels (normalized inside its compiled function). The copies of a uint8 batch are 4x smaller,
which is what a GPU service ships and what ``with_copies`` then measures.
"""

from __future__ import annotations

import datetime
import os
import platform
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bundler.evaluate import (logits_over, model_infer, quality_figures, reference_from_bundle,
                              split_batches, stress_figures)
from bundler.reuse import matching_bundle
from runtime_py.compat import usable_cores
from runtime_py.errors import UsageError

Progress = Callable[[str, str], None]

#: CPU engines: 1 warm-up call, then calls until >= 3 calls and >= 1 s, or 10 s passed
#: (so a slow batch of 32 on 2 cores is timed once, after its warm-up).
CPU_TIMING = {"warmup": 1, "min_calls": 3, "min_seconds": 1.0, "max_seconds": 10.0}
#: GPU engines with `device_timings`: untimed warm-up iterations, then timed iterations.
GPU_TIMING = {"iterations": 200, "device_warmup": 20}
#: Small defaults for --random-weights smoke studies (a few minutes on 2 cores).
RANDOM_WEIGHTS_COUNTS = {"calib_count": 16, "reference_count": 4, "eval_count": 32}
DATA_COUNTS = {"calib_count": 500, "reference_count": 8, "eval_count": 500}
#: Seed of the synthetic pictures a study evaluates on without --eval-data (calibration
#: uses seed 0 by default, the reference inputs ``bundler.make.REFERENCE_SEED``).
EVAL_SEED = 2_000_003


def _noop(stage: str, message: str) -> None:
    pass


@dataclass
class Planned:
    """One bundle of the study: what to make, where, and what happened."""

    precision: str
    variant: str | None
    prefix: str      # `<family>-<precision>[-<variant>]-<version>-`; the target tag follows
    request: object  # bundler.make.MakeRequest
    path: Path | None = None
    reused: bool = False
    rebuild_reason: str | None = None
    manifest: dict = field(default_factory=dict)
    bundle_id: str = ""

    @property
    def label(self) -> str:
        return self.variant or self.precision


# --- what to build, and whether an existing file is the same ------------------------------------

def plan_bundles(family, precisions: Sequence[str], variants: Sequence[str], target: str,
                 out_dir: Path, make_fields: dict) -> list[Planned]:
    """fp32 first (the reference), then the precisions, then the variants (every one with
    ``make_fields``' input dtype, the reference included)."""
    from bundler.make import MakeRequest
    from bundler.targets import bundle_name

    wanted: list[tuple[str, str | None]] = [("fp32", None)]
    for p in precisions:
        if (p, None) not in wanted:
            wanted.append((p, None))
    for v in variants:
        if v not in family.variants:
            known = ", ".join(sorted(family.variants)) or "none"
            raise UsageError(f"family {family.name} has no variant {v!r} (known: {known})")
        wanted.append((family.variants[v].get("precision", "fp8"), v))
    planned = []
    for precision, variant in wanted:
        req = MakeRequest(family=family.name, precision=precision, variant=variant,
                          backend=target, out_dir=out_dir, replace_existing=True,
                          **make_fields)  # the study decides itself what to reuse
        prefix = bundle_name(family.name, family.version, precision, variant, "",
                             make_fields.get("input_dtype", "float32"))
        planned.append(Planned(precision, variant, prefix, req))
    return planned


def build_or_reuse(planned: list[Planned], family, target: str, reuse: bool,
                   progress: Progress) -> None:
    from bundler.make import make_bundle
    from runtime_py.format import open_bundle

    shared: dict = {}   # the study's bundles share weights and calibration data
    for p in planned:
        reason = "--no-reuse"
        if reuse:
            candidates = sorted(Path(p.request.out_dir).glob(p.prefix + "*.bundle"))
            found, reason = matching_bundle(candidates, family, p.request, target, shared)
            if found is not None:
                p.path, reason = found, None
        if reason is None:
            p.reused = True
            progress("reuse", f"{p.path.name}: same inputs, reused")
        else:
            p.rebuild_reason = reason
            label = p.prefix + "*"
            progress("build", f"{label}: building ({reason})")
            p.path = make_bundle(p.request, progress=lambda s, m, n=label: progress(
                "build", f"{n}: [{s}] {m}")).path
        with open_bundle(p.path) as bundle:
            p.manifest, p.bundle_id = bundle.manifest, bundle.id


# --- measurements -------------------------------------------------------------------------------

def cpu_times(fn: Callable[[], object], timing: dict) -> list[float]:
    """Per-call seconds of ``fn`` under the study's CPU timing rule (``CPU_TIMING`` keys)."""
    from runtime_py.bench import time_calls

    return time_calls(fn, warmup=timing["warmup"], min_calls=timing["min_calls"],
                      min_seconds=timing["min_seconds"], max_seconds=timing["max_seconds"])


def time_model(model, batch_sizes: Sequence[int], timing: dict) -> list[dict]:
    """Timing figures per batch size; `device_timings` where the runner offers it."""
    from runtime_py.bench import DEVICE_TIMING_BOUNDARIES, device_timings, figure, random_batch

    figures = []
    for b in batch_sizes:
        feeds = random_batch(model, b)
        dev = device_timings(model.runner, b, timing["iterations"], timing["device_warmup"])
        if dev:
            for key, times in dev.items():
                figures.append(figure(key, b, times, DEVICE_TIMING_BOUNDARIES[key]).as_dict())
            continue
        times = cpu_times(lambda: model.runner.infer(feeds), timing)
        figures.append(figure("engine", b, times, "runner.infer on host arrays "
                              "(uniform [-1, 1] inputs)").as_dict())
    return figures


def sizes(path: Path, manifest: dict) -> dict:
    members = {m["name"]: m for m in manifest["members"]}
    engine = members[manifest["engine"]["member"]]
    return {"bundle_bytes": path.stat().st_size, "engine_member": engine["name"],
            "engine_raw_bytes": engine["raw_size"], "engine_stored_bytes": engine["stored_size"],
            "onnx_raw_bytes": members["model.onnx"]["raw_size"],
            "layer_count": manifest["engine"]["details"].get("layer_count")}


@dataclass
class EvalInputs:
    """What every bundle is evaluated on: the data (or reference inputs) and the stress set."""

    description: dict
    batches: Callable[[], object]  # () -> iterable of NCHW float32 (or NHWC uint8) batches
    labels: np.ndarray | None
    stress_names: tuple[str, ...]
    stress: np.ndarray
    preprocess: dict | None = None  # the bundles' preprocessing spec (the reference's)


def eval_inputs(reference: Planned, eval_data, eval_count: int, eval_stride: int,
                batch_size: int, labels_from: str = "auto") -> tuple[EvalInputs, object]:
    """The study's evaluation inputs: `eval_data` opened as `bundle eval` opens its data
    (`open_eval_data`, per-class folders labelled by `labels_from`), or seeded synthetic
    pictures without it."""
    from bundler.calibration.data import STUDY_EVALUATION, synthetic_calibration_set
    from bundler.evaluate import open_eval_data
    from bundler.stress import stress_set
    from runtime_py.format import open_bundle
    from runtime_py.preprocess import Preprocessor

    with open_bundle(reference.path) as bundle:
        spec = bundle.preprocess
    shape = tuple(int(d) for d in reference.manifest["inputs"][0]["shape"][1:])
    pixels = bool(spec) and spec.get("dtype") == "uint8"
    stress = stress_set(shape, spec)
    if eval_data is None:
        # the same pictures either way: a pixel input's (H, W, C) names them by (C, H, W)
        chw = (shape[2], shape[0], shape[1]) if pixels else shape
        data = synthetic_calibration_set(chw, eval_count, seed=EVAL_SEED,
                                         preprocess=Preprocessor(spec) if spec else None)
        desc = {"source": f"{data.source} (seeded synthetic pictures through the bundle's "
                          "preprocessing; seeds apart from calibration's and the reference "
                          "inputs')", "digest": data.digest, "images": len(data),
                "labelled": False}
        batches = lambda: (b for b, _l, _k in data.iter_batches(batch_size))  # noqa: E731
        return EvalInputs(desc, batches, None, stress.names, stress.inputs, spec), None
    data = open_eval_data(eval_data, spec, count=eval_count, stride=eval_stride,
                          labels_from=labels_from, family=reference.manifest["family"]["name"],
                          role=STUDY_EVALUATION, option="--eval-data")
    desc = {"source": data.source, "digest": data.digest, "images": len(data),
            "stride": eval_stride, "labelled": data.labels is not None}
    batches = lambda: (b for b, _l, _k in data.iter_batches(batch_size))  # noqa: E731
    return EvalInputs(desc, batches, data.labels, stress.names, stress.inputs, spec), data


def environment(command: str | None) -> dict:
    from bundler.make import package_versions
    from runtime_py.compat import probe_host

    host = probe_host()
    cpu = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    usable = usable_cores()
    return {
        "command": command,
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu or platform.processor() or "unknown",
        "cpu_cores": os.cpu_count(), "cpu_cores_usable": usable,
        "load_average": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg")
        else None,
        "platform": platform.platform(), "python": platform.python_version(),
        "gpus": [f"{g.name} (sm_{g.compute_capability[0]}{g.compute_capability[1]})"
                 for g in host.gpus],
        "engines": {"onnxruntime": host.onnxruntime_version, "tensorrt": host.tensorrt_version,
                    "torch": host.torch_version, "cuda_driver": host.cuda_driver_version,
                    "cuda_runtime": host.cuda_runtime_version},
        "packages": package_versions(("tensorrt", "cuda-python", "matplotlib", "trt-bundle")),
    }


def measure_bundle(p: Planned, inputs: EvalInputs, ref_logits: np.ndarray,
                   ref_stress: np.ndarray, batch_sizes: Sequence[int], timing: dict,
                   is_reference: bool, progress: Progress) -> dict:
    import runtime_py

    with runtime_py.load(p.path, backend="auto") as model:
        too_big = [b for b in batch_sizes if b > model.max_batch_size]
        if too_big:
            raise UsageError(f"batch sizes {too_big} exceed {p.path.name}'s max batch "
                             f"{model.max_batch_size}")
        progress("time", f"{p.label}: batch sizes {', '.join(map(str, batch_sizes))}")
        timings = time_model(model, batch_sizes, timing)
        cpu_ort = (model.backend == "onnxruntime"
                   and list(getattr(model.runner, "providers", [])) == ["CPUExecutionProvider"])
        if is_reference and cpu_ort:
            test, test_stress = ref_logits, ref_stress  # the reference itself, same engine
            note = "is the reference (same graph, same engine)"
        else:
            progress("eval", f"{p.label}: {inputs.description['images']} images + "
                             f"{len(inputs.stress_names)} stress inputs")
            infer = model_infer(model)
            test = logits_over(infer, inputs.batches())
            test_stress = logits_over(infer, split_batches(inputs.stress, 8))
            note = None
        engine = {"target": model.bundle.manifest["engine"]["backend"], "ran_on": model.backend,
                  "fallback_reason": model.fallback_reason,
                  "providers": list(getattr(model.runner, "providers", []) or [])}
    return {
        "label": p.label, "name": p.manifest["name"], "id": p.bundle_id, "path": str(p.path),
        "precision": p.precision, "variant": p.variant, "role": "reference" if is_reference
        else "measured", "reused": p.reused, "rebuild_reason": p.rebuild_reason,
        "engine": engine, "engine_details": p.manifest["engine"]["details"],
        "recipe": p.manifest.get("recipe"), "calibration": p.manifest.get("calibration"),
        "sizes": sizes(p.path, p.manifest), "timings": timings,
        "quality": dict(quality_figures(ref_logits, test, inputs.labels), note=note),
        "stress": stress_figures(inputs.stress_names, ref_stress, test_stress),
    }


def speed_ratios(bundles: list[dict], batch_sizes: Sequence[int]) -> list[dict]:
    """fp16 median time / fp8 median time (> 1: fp8 faster), per batch size and boundary,
    for fp8 and every fp8 variant."""
    base = next((b for b in bundles if b["precision"] == "fp16" and not b["variant"]), None)
    if base is None:
        return []
    rows = []
    median = {(b["label"], f["boundary"], f["batch_size"]): f["median_ms"]
              for b in bundles for f in b["timings"]}
    for other in bundles:
        if other["precision"] != "fp8":
            continue
        for bs in batch_sizes:
            for boundary in ("graph_replay", "with_copies", "engine"):
                num = median.get((base["label"], boundary, bs))
                den = median.get((other["label"], boundary, bs))
                if num is not None and den is not None:
                    rows.append({"batch_size": bs, "boundary": boundary, "numerator": base["label"],
                                 "denominator": other["label"], "fp16_ms": num,
                                 "fp8_ms": den, "ratio": num / den})
    return rows


# --- the whole study ------------------------------------------------------------------------------

def run_study(family: str, *, precisions: Sequence[str] = ("fp16", "fp8"),
              variants: Sequence[str] = (), batch_sizes: Sequence[int] = (1, 32),
              out_dir: str | os.PathLike, backend: str = "onnxruntime",
              random_weights: bool = False, seed: int = 0,
              checkpoint: str | os.PathLike | None = None,
              calib_data: str | os.PathLike | None = None, calib_count: int | None = None,
              reference_count: int | None = None,
              eval_data: str | os.PathLike | None = None, eval_count: int | None = None,
              eval_stride: int = 1, labels_from: str = "auto",
              allow_calibration_overlap: bool = False,
              reuse: bool = True, timing: dict | None = None, eval_batch: int = 8,
              command: str | None = None, progress: Progress | None = None,
              peer: str | None = None, input_dtype: str = "float32") -> dict:
    """Build or reuse the bundles, measure them, write study.json, study.md (and study.png).

    ``peer`` (one of `bundler.peer.PEERS`) also measures what a user would run instead, in
    the same process after the bundles (`bundler.peer`), with its ratios in ``peer_ratios``.

    Counts default small for --random-weights (calibration 16, reference 4, eval 32) and
    to make's defaults otherwise (500, 8, 500). `timing` overrides `CPU_TIMING` /
    `GPU_TIMING` keys. `labels_from`: how per-class folders of `eval_data` map to class
    indices (`bundler.class_labels`, as `bundle eval --labels-from`). `input_dtype`: what
    every bundle takes (module docstring: Input). Returns the study as data (what study.json
    holds).
    """
    from bundler.evaluate import check_calibration_overlap
    from bundler.families import load_family
    from bundler.make import INPUT_DTYPES, choose_target
    from bundler.study_report import write_report
    from runtime_py.format import open_bundle

    progress = progress or _noop
    if input_dtype not in INPUT_DTYPES:
        raise UsageError(f"--input {input_dtype!r}: choose one of {', '.join(INPUT_DTYPES)}")
    if eval_data is None and labels_from != "auto":
        raise UsageError(f"--labels-from {labels_from} labels the per-class folders of "
                         "--eval-data; pass --eval-data DIR, or leave --labels-from out")
    fam = load_family(family)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    batch_sizes = sorted(set(int(b) for b in batch_sizes))
    if not batch_sizes or batch_sizes[0] < 1:
        raise UsageError("--batch-sizes must be positive integers")
    counts = RANDOM_WEIGHTS_COUNTS if random_weights else DATA_COUNTS
    calib_count = calib_count or counts["calib_count"]
    reference_count = reference_count or counts["reference_count"]
    eval_count = eval_count or counts["eval_count"]
    timing = {**CPU_TIMING, **GPU_TIMING, **(timing or {})}
    target = choose_target(backend)
    planned = plan_bundles(fam, precisions, variants, target, out, {
        "checkpoint": checkpoint, "random_weights": random_weights, "seed": seed,
        "calib_data": calib_data, "calib_count": calib_count, "reference_count": reference_count,
        "input_dtype": input_dtype})

    build_or_reuse(planned, fam, target, reuse, progress)
    reference = planned[0]
    inputs, data = eval_inputs(reference, eval_data, eval_count, eval_stride, eval_batch,
                               labels_from)
    overlaps = {}
    if data is not None:
        for p in planned:
            with open_bundle(p.path) as bundle:
                overlaps[p.label] = check_calibration_overlap(bundle, data, allow_calibration_overlap)
    progress("reference", f"fp32 logits (ONNX Runtime CPU) on {inputs.description['images']} "
                          f"inputs + {len(inputs.stress_names)} stress inputs")
    ref = reference_from_bundle(reference.manifest, reference.path)
    ref_logits = logits_over(ref.infer, inputs.batches())
    ref_stress = logits_over(ref.infer, split_batches(inputs.stress, eval_batch))

    env = environment(command)  # before timing: its load average is what timing starts under
    bundles = [measure_bundle(p, inputs, ref_logits, ref_stress, batch_sizes, timing,
                              p is reference, progress) for p in planned]
    for b in bundles:
        if b["label"] in overlaps:
            b["calibration_overlap"] = overlaps[b["label"]]
    study = {
        "family": {"name": fam.name, "version": fam.version},
        "settings": {"precisions": list(precisions), "variants": list(variants),
                     "batch_sizes": batch_sizes, "backend": backend, "target": target,
                     "random_weights": random_weights, "seed": seed,
                     "checkpoint": str(checkpoint) if checkpoint else None,
                     "calibration": {"data": str(calib_data) if calib_data else "synthetic",
                                     "count": calib_count},
                     "reference_count": reference_count, "timing": timing, "reuse": reuse,
                     "input_dtype": input_dtype},
        "reference": ref.record,
        "eval": inputs.description,
        "stress_inputs": list(inputs.stress_names),
        "environment": env,
        "bundles": bundles,
        "ratios": speed_ratios(bundles, batch_sizes),
    }
    if peer:
        from bundler.peer import measure_peer, peer_ratios

        progress("peer", f"{peer}: batch sizes {', '.join(map(str, batch_sizes))}, then "
                         f"{inputs.description['images']} images")
        study["peer"] = measure_peer(peer, reference.manifest, checkpoint, batch_sizes, timing,
                                     inputs, ref_logits, ref_stress)
        study["peer_ratios"] = peer_ratios(bundles, study["peer"])
    progress("report", f"writing study.json, study.md and the plot into {out}")
    study["files"] = write_report(study, out)
    return study
