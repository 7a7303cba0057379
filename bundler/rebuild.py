"""`bundle rebuild`: a new bundle for this host from the portable ONNX of an existing one.

Every bundle carries its precision-typed `model.onnx`, so a bundle made for one engine
target can be turned into a bundle for another (a TensorRT plan for this GPU, or plain
ONNX Runtime) without re-exporting or re-calibrating: same family, precision, recipe,
variant, source and calibration, same preprocessing, reference and labels; a new engine,
name and id, and `rebuilt_from` naming the source bundle's id.

Nothing is written unless the build succeeds: the source is opened and verified, the
engine is built in memory, and only then is the new bundle written (atomically).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from bundler.targets import bundle_name, target_builder
from bundler.writer import prepare_out_dir, source_date_epoch, write_bundle
from runtime_py.errors import OtherCommandError, UsageError
from runtime_py.format import open_bundle
from runtime_py.targets import engine_members

#: Targets compiled from the family's torch model, which a bundle does not hold.
MADE_FROM_TORCH = ("torch-aoti",)


def _engine_package_versions(backend: str, details: dict) -> dict[str, str]:
    if backend == "tensorrt":
        return {"tensorrt": details["tensorrt_version"]}
    if backend == "onnxruntime":
        try:
            import onnxruntime
        except ImportError:
            return {}
        return {"onnxruntime": onnxruntime.__version__}
    return {}


def rebuilt_manifest_body(source_manifest: dict, source_id: str, build) -> dict:
    """The new bundle's manifest body: the source's, with a new engine, name and lineage.

    `build` is a `bundler.targets.TargetBuild`. Pure (tested without any engine package).
    """
    from runtime_py import __version__

    body = {k: v for k, v in source_manifest.items() if k not in ("format", "members")}
    body["engine"] = {"backend": build.backend, "member": build.member,
                      "details": build.details}
    body["name"] = bundle_name(source_manifest["family"]["name"],
                               source_manifest["family"]["version"],
                               source_manifest["precision"], source_manifest["variant"],
                               build.tag)
    body["rebuilt_from"] = source_id
    old = source_manifest["build"]
    packages = dict(old.get("packages") or {})
    packages.update(_engine_package_versions(build.backend, build.details))
    new_build = {"tool": "trt-bundle", "tool_version": __version__, "packages": packages,
                 "source_date_epoch": source_date_epoch()}
    if "opset" in old:
        new_build["opset"] = old["opset"]
    body["build"] = new_build
    return body


def make_command(manifest: dict, backend: str) -> str:
    """The `bundle make` command that builds `manifest`'s bundle for `backend`.

    Family, precision, variant and weights come from the manifest; what it cannot know
    (a checkpoint's folder, the calibration data's path) is left as a placeholder.
    """
    parts = ["bundle", "make", manifest["family"]["name"], "--precision", manifest["precision"]]
    if manifest.get("variant"):
        parts += ["--variant", manifest["variant"]]
    parts += ["--backend", backend]
    source = manifest["source"]
    if source["kind"] == "random-weights":
        parts += ["--random-weights", "--seed", str(source["seed"])]
    elif source.get("file"):
        parts += ["--checkpoint", f"PATH/{source['file']}"]
    calibration = manifest.get("calibration")
    if calibration and not calibration["data_source"].startswith("synthetic:"):
        parts += ["--calib-data", f"PATH({calibration['data_source']})",
                  "--calib-count", str(calibration["images"]),
                  "--calibrator", calibration["method"]]
        if calibration.get("percentile"):
            parts += ["--percentile", calibration["percentile"]]
    return " ".join(parts)


def rebuild_bundle(src_path: str | os.PathLike, backend: str, out_dir: str | os.PathLike, *,
                   log: Callable[[str], None] | None = None,
                   **build_options: object) -> tuple[Path, str]:
    """Rebuild the bundle at `src_path` for `backend` on this host; return (path, id).

    `build_options` go to the target builder (tensorrt: optimization_level, timing_cache,
    hardware_compat, version_compatible, workspace_bytes, device). Raises
    EngineUnavailableError when the target's engine package or GPU is missing (nothing
    written), UsageError for a bad request, VerificationError for a corrupt source.
    """
    out_dir = prepare_out_dir(out_dir)
    builder = target_builder(backend)
    with open_bundle(src_path) as src:
        if backend in MADE_FROM_TORCH:
            raise OtherCommandError(
                f"`bundle rebuild` cannot make a {backend} engine: it is compiled from the "
                "family's torch model, not from the bundle's ONNX graph. Make it instead "
                f"with: {make_command(src.manifest, backend)}")
        src.verify()
        manifest, source_id = src.manifest, src.id
        members = {name: src.read_member(name) for name in src.member_names}
    build = builder.build_target(members["model.onnx"], batch=manifest["batch"], log=log,
                                 **build_options)
    body = rebuilt_manifest_body(manifest, source_id, build)
    new_members = {k: v for k, v in members.items() if k not in engine_members()}
    if build.engine_bytes is not None:
        new_members[build.member] = build.engine_bytes
    out_path = out_dir / f"{body['name']}.bundle"
    if out_path.resolve() == Path(src_path).resolve():
        raise UsageError(f"the rebuilt bundle would replace its source {out_path}: "
                         "choose another output folder")
    return write_bundle(out_path, body, new_members)
