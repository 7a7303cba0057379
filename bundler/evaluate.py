"""`bundle eval`: a bundle's quality against the family's fp32 reference, on real data.

The numbers are `bundler.quality`'s (the same ones `bundle make` writes into the manifest):
top-1 against labels when the data has them, top-1 agreement with the reference, mean KL
of the softmax outputs, max |logit difference|, NaN/Inf counts; on the selected data and
on the fixed stress set (`bundler.stress`).

The reference is the family's fp32 graph run by ONNX Runtime on the CPU: either the
`model.onnx` of an fp32 bundle given as `reference` (it must be of the same family version
and weights), or, without one, the graph rebuilt from the bundle's recorded source the way
`bundle make` builds it (seeded random weights, or the checkpoint whose sha256 the manifest
records; export is cached). A rebuilt graph is first checked against the fp32 outputs the
bundle stores in `reference.safetensors`, so that a different torch/timm cannot silently
change the ground truth.

Data selection is calibration's (`open_calibration_data`: count, stride, same order). An
evaluation on images the bundle was calibrated on flatters it, so it is refused unless
asked for: fp8 bundles record the sha256 of every calibration image in
`calibration.safetensors` (`item_digests`), and every selected image is checked against
them before anything runs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bundler.quality import compare_logits, top1_accuracy
from runtime_py.errors import UsageError, WeightsError
from runtime_py.engines.onnxruntime import cpu_session

Progress = Callable[[str, str], None]
Infer = Callable[[np.ndarray], np.ndarray]

#: Largest acceptable max |rebuilt fp32 - stored fp32| relative to max |stored fp32|.
REBUILT_REFERENCE_TOLERANCE = 1e-3
DEFAULT_EVAL_COUNT = 500


def _noop(stage: str, message: str) -> None:
    pass


# --- the reference ----------------------------------------------------------------------------

@dataclass
class Reference:
    """The fp32 ground truth: `infer(NCHW) -> logits`, and what it is (for the report)."""

    record: dict
    infer: Infer
    close: Callable[[], None] = field(default=lambda: None)
    takes_pixels: bool = False     # a uint8-input graph (an fp32 bundle made with --input uint8)


def with_pixel_input(ref: Reference, spec: dict | None) -> Reference:
    """The reference fed a uint8-input bundle's pixels: a float-input reference first gets
    the engine head's arithmetic on the host (``Preprocessor.normalize``, bit for bit what
    the head computes on ONNX Runtime's CPU provider)."""
    if not spec or spec.get("dtype") != "uint8" or ref.takes_pixels:
        return ref
    from runtime_py.preprocess import Preprocessor

    normalize, infer = Preprocessor(spec).normalize, ref.infer
    return Reference(dict(ref.record, input="uint8 pixels, normalized on the host"),
                     lambda x: infer(normalize(x) if x.dtype == np.uint8 else x), ref.close)


def _takes_pixels(session) -> bool:
    return session.get_inputs()[0].type == "tensor(uint8)"


def _session_infer(session) -> Infer:
    name = session.get_inputs()[0].name
    return lambda x: np.asarray(session.run(None, {name: x})[0], dtype=np.float32)


def same_source(a: dict, b: dict) -> bool:
    """Whether two manifest `source` records name the same weights."""
    if a.get("kind") != b.get("kind"):
        return False
    if a.get("kind") == "random-weights":
        return a.get("seed") == b.get("seed")
    return a.get("sha256") == b.get("sha256")


def reference_from_bundle(manifest: dict, reference: str | os.PathLike) -> Reference:
    """The `model.onnx` of an fp32 bundle of the same family version and weights."""
    from runtime_py.format import open_bundle

    with open_bundle(reference) as ref:
        ref.verify()
        m = ref.manifest
        problems = []
        if m["precision"] != "fp32":
            problems.append(f"it is a {m['precision']} bundle, not fp32")
        if m["family"] != manifest["family"]:
            problems.append(f"family {m['family']['name']} {m['family']['version']} differs from "
                            f"{manifest['family']['name']} {manifest['family']['version']}")
        if not same_source(m["source"], manifest["source"]):
            problems.append(f"weights {m['source']} differ from the bundle's {manifest['source']}")
        if problems:
            raise UsageError(f"--reference {Path(reference).name} cannot be this bundle's reference: "
                             + "; ".join(problems) + ". Pass an fp32 bundle made from the same "
                             "family and weights, or leave --reference out to rebuild the fp32 graph")
        session = cpu_session(ref.read_member("model.onnx"))
        record = {"kind": "fp32 bundle", "name": m["name"], "id": ref.id,
                  "engine": "onnxruntime CPUExecutionProvider on its model.onnx"}
    return Reference(record, _session_infer(session), takes_pixels=_takes_pixels(session))


def weights_for_source(family, source: dict, checkpoint: str | os.PathLike | None):
    """The weights a manifest's ``source`` names: its random seed, or the checkpoint found
    (``checkpoint`` or the HF cache) when its sha256 is the recorded one."""
    from bundler.weights import resolve_weights

    if source["kind"] == "random-weights":
        return resolve_weights(family, random_weights=True, seed=source["seed"])
    try:
        weights = resolve_weights(family, checkpoint)
    except WeightsError as exc:
        raise WeightsError(f"cannot rebuild the fp32 reference: {exc}. Or pass --reference "
                           "FP32_BUNDLE made from the same checkpoint") from None
    if weights.source["sha256"] != source["sha256"]:
        raise WeightsError(
            f"the checkpoint found ({weights.source['file']}, {weights.source['sha256'][:19]}...) is "
            f"not the one this bundle was made from ({source['sha256'][:19]}...): pass --checkpoint "
            "with that file, or --reference FP32_BUNDLE")
    return weights


def rebuilt_reference(manifest: dict, checkpoint: str | os.PathLike | None = None,
                      cache_dir: Path | None = None) -> Reference:
    """The family's fp32 graph rebuilt from the bundle's recorded weights, on ORT CPU."""
    import hashlib

    from bundler.export import export_fp32_onnx, serialize
    from bundler.families import load_family
    from bundler.torch_model import build_torch_model

    family = load_family(manifest["family"]["name"])
    if family.version != manifest["family"]["version"]:
        raise UsageError(f"this install builds {family.name} {family.version}, the bundle is "
                         f"{manifest['family']['version']}: the fp32 graph cannot be rebuilt; pass "
                         "--reference FP32_BUNDLE of the bundle's family version")
    weights = weights_for_source(family, manifest["source"], checkpoint)
    torch_model = build_torch_model(family, weights.state_dict, weights.seed)
    model_bytes = serialize(export_fp32_onnx(torch_model, family, cache_dir))
    session = cpu_session(model_bytes)
    record = {"kind": "fp32 graph rebuilt from the bundle's source", "source": manifest["source"],
              "onnx_sha256": "sha256:" + hashlib.sha256(model_bytes).hexdigest(),
              "engine": "onnxruntime CPUExecutionProvider"}
    return Reference(record, _session_infer(session))


def check_rebuilt_reference(reference: Reference, bundle) -> dict:
    """Run the rebuilt graph on the bundle's stored reference inputs; refuse a mismatch."""
    from runtime_py.reference import read_reference

    stored = read_reference(bundle)
    name_in = bundle.manifest["inputs"][0]["name"]
    name_out = bundle.manifest["outputs"][0]["name"]
    if name_out not in stored.fp32:
        return {"checked": False, "reason": "the bundle stores no fp32 reference outputs"}
    expected = stored.fp32[name_out]
    got = logits_over(reference.infer, [stored.inputs[name_in]])
    diff = float(np.abs(got.astype(np.float64) - expected).max())
    scale = max(1.0, float(np.abs(expected).max()))
    if not diff <= REBUILT_REFERENCE_TOLERANCE * scale:
        raise UsageError(
            f"the rebuilt fp32 graph does not reproduce the fp32 outputs stored in the bundle "
            f"(max |diff| {diff:.3g}; torch/timm/onnx versions differ from the build's "
            f"{bundle.manifest['build']['packages']}?): pass --reference FP32_BUNDLE")
    return {"checked": True, "inputs": int(expected.shape[0]), "max_abs_diff": diff}


# --- data, and the calibration-overlap rule --------------------------------------------------

def calibration_item_digests(bundle) -> tuple[dict | None, frozenset[str] | None]:
    """(calibration metadata, per-image sha256 set or None) of a bundle; (None, None) when
    the bundle was not calibrated."""
    if not bundle.manifest.get("calibration") or not bundle.has_member("calibration.safetensors"):
        return None, None
    from bundler.calibration.store import calibration_from_safetensors

    meta = calibration_from_safetensors(bundle.read_member("calibration.safetensors")).metadata
    text = meta.get("item_digests")
    return meta, (frozenset(text.split(",")) if text else None)


def check_calibration_overlap(bundle, eval_set, allow: bool = False) -> dict:
    """Refuse (UsageError) evaluating on images this bundle was calibrated on, unless `allow`.

    Identity is the sha256 of each item's raw bytes (the encoded file; for safetensors data,
    the float32 tensor bytes), so a copy of a calibration image elsewhere is caught too.
    Bundles made before per-image records exist (no `item_digests`) cannot be checked: they
    are refused unless `allow`, except when calibrated on synthetic data.
    """
    meta, digests = calibration_item_digests(bundle)
    if meta is None:
        return {"checked": "not calibrated", "overlap": 0}
    source = meta["data_source"]
    if source.startswith("synthetic:"):
        return {"checked": f"calibrated on synthetic data ({source})", "overlap": 0}
    n = len(eval_set)
    if digests is None:
        if eval_set.digest == meta["data_digest"]:
            overlap = n
        elif allow:
            return {"checked": "impossible: the bundle records no per-image calibration digests",
                    "overlap": None, "allowed": True}
        else:
            raise UsageError(
                f"{bundle.path.name} was calibrated on {source} but records no per-image digests "
                "(made before they were recorded), so overlap with the evaluation images cannot be "
                "ruled out; remake the bundle, or pass --allow-calibration-images if the images are "
                "known to be disjoint")
    else:
        overlap = len(eval_set.item_digests & digests)
    record = {"checked": "per-image sha256 against calibration.safetensors item_digests",
              "calibration_source": source, "overlap": overlap}
    if overlap and not allow:
        raise UsageError(
            f"{overlap} of the {n} selected evaluation images were used to calibrate "
            f"{bundle.path.name} (from {source}); evaluate on held-out images (another folder, or "
            "other --count/--stride), or pass --allow-calibration-images to evaluate anyway")
    if overlap:
        record["allowed"] = True
    return record


def family_class_ids(family_name: str) -> tuple[list[str] | None, int | None]:
    """(class ids, number of classes) of a family this install knows; (None, None) else."""
    from bundler.families import load_family
    from runtime_py.errors import FamilyError

    try:
        family = load_family(family_name)
    except FamilyError:
        return None, None
    return family.class_ids(), family.num_classes


def open_eval_data(data: str | os.PathLike, preprocess_spec: dict | None, *,
                   count: int | None = None, stride: int = 1, labels_from: str = "auto",
                   family: str | None = None, role=None, option: str = "--data"):
    """The evaluation set, selected exactly as calibration selects (count, stride, order).

    Per-class folders get their labels by `labels_from` (`bundler.class_labels`), with the
    class ids of `family` (the bundle's family name); `option` is what messages call the
    data (`--data` for eval, `--eval-data` for study).
    """
    from bundler.calibration.data import EVALUATION, open_calibration_data
    from bundler.class_labels import class_folder_rule
    from runtime_py.preprocess import Preprocessor

    if preprocess_spec is None:
        raise UsageError("the bundle has no preprocessing spec; evaluate it on a .safetensors "
                         "of preprocessed tensors")
    class_ids, num_classes = family_class_ids(family) if family else (None, None)
    return open_calibration_data(data, Preprocessor(preprocess_spec),
                                 count=count or DEFAULT_EVAL_COUNT, stride=stride,
                                 role=role or EVALUATION,
                                 class_folders=class_folder_rule(labels_from, class_ids,
                                                                 num_classes, option))


# --- figures -----------------------------------------------------------------------------------

def logits_over(infer: Infer, batches: Iterable[np.ndarray]) -> np.ndarray:
    """Concatenated float32 logits of `infer` over batches (float32 NCHW, or the uint8 NHWC
    pixels of a uint8-input bundle, passed as they are)."""
    parts = [np.asarray(infer(np.ascontiguousarray(
                 b, dtype=np.uint8 if b.dtype == np.uint8 else np.float32)), dtype=np.float32)
             for b in batches]
    return np.concatenate(parts)


def split_batches(inputs: np.ndarray, batch_size: int) -> Iterator[np.ndarray]:
    for i in range(0, len(inputs), batch_size):
        yield inputs[i:i + batch_size]


def quality_figures(reference: np.ndarray, test: np.ndarray,
                    labels: np.ndarray | None = None) -> dict:
    """`compare_logits`, plus top-1 against labels (bundle and reference) when labelled."""
    figures = compare_logits(reference, test)
    if labels is not None:
        figures["top1_accuracy"] = top1_accuracy(test, labels)
        figures["reference_top1_accuracy"] = top1_accuracy(reference, labels)
    return figures


def stress_figures(names: tuple[str, ...], reference: np.ndarray, test: np.ndarray) -> dict:
    """Totals over the stress set, and per input (which ones break, and how)."""
    per_input = {}
    for i, name in enumerate(names):
        row = compare_logits(reference[i:i + 1], test[i:i + 1])
        per_input[name] = {"top1_agree": row["top1_agreement"] == 1.0, "kl": row["kl_mean"],
                           "max_abs_diff": row["max_abs_diff"], "nan_count": row["nan_count"],
                           "inf_count": row["inf_count"]}
    totals = compare_logits(reference, test)
    totals["reference_nonfinite_inputs"] = [
        n for n, r in zip(names, reference) if not np.isfinite(r).all()]
    totals["nonfinite_inputs"] = [n for n, t in zip(names, test) if not np.isfinite(t).all()]
    return {"totals": totals, "inputs": per_input}


def model_infer(model) -> Infer:
    name = model.outputs[0].name
    return lambda x: model.infer(x)[name]


# --- the whole job -----------------------------------------------------------------------------

def evaluate_bundle(bundle_path: str | os.PathLike, data: str | os.PathLike | None, *,
                    reference: str | os.PathLike | None = None, count: int | None = None,
                    stride: int = 1, backend: str = "auto",
                    allow_calibration_overlap: bool = False, batch_size: int = 8,
                    checkpoint: str | os.PathLike | None = None, stress: bool = True,
                    labels_from: str = "auto", progress: Progress | None = None) -> dict:
    """Quality of one bundle against the fp32 reference; returns the report as data.

    data: images (folder, folder per class, webdataset shards) or a .safetensors of
    preprocessed tensors, selected like calibration data (`count`, default 500, every
    `stride`-th); None evaluates on the bundle's own reference inputs. `labels_from`: how
    per-class folders map to class indices (`bundler.class_labels`). The calibration
    overlap is checked before any engine starts.
    """
    import runtime_py
    from bundler.stress import stress_set
    from runtime_py.format import open_bundle

    progress = progress or _noop
    if batch_size < 1:
        raise UsageError("--batch-size must be >= 1")
    with open_bundle(bundle_path) as bundle:
        bundle.verify()
        manifest, bundle_id = bundle.manifest, bundle.id
        spec = bundle.preprocess
        if data is not None:
            eval_set = open_eval_data(data, spec, count=count, stride=stride,
                                      labels_from=labels_from,
                                      family=manifest["family"]["name"])
            overlap = check_calibration_overlap(bundle, eval_set, allow_calibration_overlap)
            data_record = {"source": eval_set.source, "digest": eval_set.digest,
                           "images": len(eval_set), "requested": eval_set.requested,
                           "stride": stride, "labelled": eval_set.labels is not None}
        else:
            from runtime_py.reference import read_reference

            stored = read_reference(bundle).inputs[manifest["inputs"][0]["name"]]
            eval_set, overlap = None, {"checked": "not applicable (the bundle's reference inputs)"}
            data_record = {"source": "the bundle's reference inputs (reference.safetensors)",
                           "images": int(stored.shape[0]), "labelled": False}
        progress("reference", "preparing the fp32 reference")
        if reference is not None:
            ref = with_pixel_input(reference_from_bundle(manifest, reference), spec)
        else:
            ref = with_pixel_input(rebuilt_reference(manifest, checkpoint), spec)
            ref.record["check"] = check_rebuilt_reference(ref, bundle)
    shape = tuple(int(d) for d in manifest["inputs"][0]["shape"][1:])

    with runtime_py.load(bundle_path, backend=backend) as model:
        infer = model_infer(model)
        if eval_set is not None:
            labels = eval_set.labels
            progress("data", f"{len(eval_set)} images from {eval_set.source}")
            ref_parts, test_parts = [], []
            for batch, _labels, _keys in eval_set.iter_batches(batch_size):
                ref_parts.append(ref.infer(batch))
                test_parts.append(infer(batch))
                progress("data", f"{sum(len(p) for p in test_parts)}/{len(eval_set)} images")
            ref_logits, test_logits = np.concatenate(ref_parts), np.concatenate(test_parts)
        else:
            labels = None
            ref_logits = logits_over(ref.infer, split_batches(stored, batch_size))
            test_logits = logits_over(infer, split_batches(stored, batch_size))
        report = {
            "bundle": manifest["name"], "id": bundle_id, "path": str(bundle_path),
            "precision": manifest["precision"], "variant": manifest["variant"],
            "random_weights": manifest["source"]["kind"] == "random-weights",
            "engine": {"backend": model.backend, "fallback_reason": model.fallback_reason},
            "reference": ref.record, "data": data_record, "calibration_overlap": overlap,
            "quality": quality_figures(ref_logits, test_logits, labels),
        }
        if stress:
            s = stress_set(shape, spec)
            progress("stress", f"{len(s)} stress inputs")
            report["stress"] = stress_figures(
                s.names, logits_over(ref.infer, split_batches(s.inputs, batch_size)),
                logits_over(infer, split_batches(s.inputs, batch_size)))
    ref.close()
    return report
