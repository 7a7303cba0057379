"""Whether a bundle already on disk was made from the inputs a build is asked for.

`bundle study` reuses such a bundle instead of rebuilding it, and `bundle make --reuse`
prints its id instead of compiling again (a torch-aoti build is minutes on an H200; GPU
scripts re-run after an interrupted call used to rebuild what they had). "The same inputs":
family name and version, precision, variant, engine target, input dtype, weights (random
seed, or checkpoint sha256), FP8 recipe digest, calibration method and data digest,
reference inputs (count and source), the torch-aoti engine form the family's settings
build now and the code of its model rewrite and kernels, trt-bundle version, and the
versions of the packages that make the graph and engine (torch, timm, onnx,
onnx-graphsurgeon, and tensorrt for plans). The bundle must also verify and be able to run
on this host.
"""

from __future__ import annotations

from pathlib import Path

from runtime_py.errors import BundleError

GRAPH_PACKAGES = ("torch", "timm", "onnx", "onnx-graphsurgeon", "tensorrt")


def expected_source(family, req) -> dict:
    """The manifest `source` record a build of `req` would write (without loading weights)."""
    from bundler.weights import file_sha256, hf_cache_file

    if req.random_weights:
        return {"kind": "random-weights", "seed": int(req.seed)}
    path = Path(req.checkpoint) if req.checkpoint is not None else hf_cache_file(family)
    if path is None or not path.is_file():
        return {"kind": "checkpoint", "sha256": None}  # make_bundle will say what is missing
    return {"kind": "checkpoint", "sha256": "sha256:" + file_sha256(path)}


def expected_calibration_digest(family, req) -> str:
    """Digest of the images `bundle make` would calibrate on for `req` (no decoding)."""
    from bundler.make import calibration_set

    return calibration_set(family, req).digest


def target_host(target: str):
    """This host as the reuse check needs it for ``target``: torch-aoti packages are checked
    against the CUDA build of torch, which only importing torch tells (without it every
    torch-aoti bundle read as "cannot run here, CPU-only torch" and was rebuilt)."""
    from runtime_py.compat import probe_host
    from runtime_py.targets import get_target

    return probe_host(probe_torch="torch" in get_target(target).packages)


def reuse_mismatch(path: Path, family, req, target: str, source: dict,
                   calibration_digest: str | None, host=None) -> str | None:
    """None when the bundle at `path` was made from the same inputs; else why not."""
    from bundler import __version__
    from bundler.evaluate import same_source
    from bundler.make import package_versions, reference_set
    from bundler.targets import target_builder
    from runtime_py.compat import check_target
    from runtime_py.format import open_bundle

    try:
        with open_bundle(path) as bundle:
            bundle.verify()
            m = bundle.manifest
        check_target(m["engine"], host or target_host(target))
    except BundleError as exc:
        return f"{path.name} does not verify or cannot run here ({exc})"
    checks = {
        "family": (m["family"], {"name": family.name, "version": family.version}),
        "precision": (m["precision"], req.precision),
        "variant": (m["variant"], req.variant),
        "engine target": (m["engine"]["backend"], target),
        "input dtype": (m["inputs"][0]["dtype"], req.input_dtype),
        "trt-bundle version": (m["build"]["tool_version"], __version__),
    }
    if not same_source(m["source"], source):
        return f"weights differ ({m['source']} vs {source})"
    if req.precision == "fp8":
        checks["recipe digest"] = ((m.get("recipe") or {}).get("digest"),
                                   "sha256:" + family.recipe_digest(req.variant))
        cal = m.get("calibration") or {}
        checks["calibration"] = ((cal.get("method"), cal.get("data_digest")),
                                 (req.calib_method, calibration_digest))
    # what the target's own build settings would change (torch-aoti: the model form, the
    # Inductor options, the FP8 GEMM and convolution forms, static graphs, the device)
    target_checks = getattr(target_builder(target), "reuse_checks", None)
    if target_checks is not None:
        checks.update(target_checks(m["engine"]["details"], family, req))
    inputs_source = reference_set(family, req).source
    checks["reference inputs"] = ((m["quality"]["images"], m["quality"]["inputs_source"]),
                                  (req.reference_count, inputs_source))
    installed = package_versions(("tensorrt",))
    built = m["build"].get("packages") or {}
    for name in GRAPH_PACKAGES:
        if name in built or (name in installed and name != "tensorrt"):
            checks[f"{name} version"] = (built.get(name), installed.get(name))
    for what, (have, want) in checks.items():
        if have != want:
            return f"{what} differs ({have!r} vs {want!r})"
    return None


def matching_bundle(candidates, family, req, target: str,
                    shared: dict | None = None) -> tuple[Path | None, str]:
    """The first of ``candidates`` made from ``req``'s inputs, or None and why none is
    (the last candidate's difference, or that there was none).

    What is expected is worked out only when there is a candidate: the weights' sha256
    (reads the checkpoint), the calibration data's digest, the host (imports torch).
    ``shared``: a dict kept across the requests of one study, which share weights and
    calibration data, so that each is worked out once."""
    if not candidates:
        return None, "no earlier bundle in the folder"
    known = {} if shared is None else shared
    if "source" not in known:
        known["source"] = expected_source(family, req)
    if req.precision == "fp8" and "calibration" not in known:
        known["calibration"] = expected_calibration_digest(family, req)
    if ("host", target) not in known:
        known[("host", target)] = target_host(target)
    digest = known["calibration"] if req.precision == "fp8" else None
    reason = "no earlier bundle in the folder"
    for candidate in candidates:
        reason = reuse_mismatch(candidate, family, req, target, known["source"], digest,
                                known[("host", target)])
        if reason is None:
            return candidate, "same inputs"
    return None, reason
