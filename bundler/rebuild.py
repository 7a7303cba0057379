"""`bundle rebuild`: a new bundle for this host from an existing one.

Every bundle carries its precision-typed `model.onnx`, so a bundle made for one engine
target can be turned into a bundle for another (a TensorRT plan for this GPU, or plain
ONNX Runtime) without re-exporting or re-calibrating: same family, precision, recipe,
variant, source and calibration, same preprocessing, reference and labels; a new engine,
name and id, and `rebuilt_from` naming the source bundle's id.

Targets compiled from the family's torch model (torch-aoti: `EngineTarget.from_onnx` is
false) also need the weights the bundle was made from: the manifest names the family,
precision and variant, and its `source` the weights (a seed for `--random-weights`
bundles; otherwise the checkpoint's sha256, found in the Hugging Face cache or passed
with `--checkpoint` and checked against it). The fp8 layers and scales come from the
bundle's graph and calibration member (`bundler.build_context.context_from_bundle`).

Nothing is written unless the build succeeds: the source is opened and verified, the
engine is built in memory, and only then is the new bundle written (atomically).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from bundler.targets import bundle_name, target_builder
from bundler.writer import (prepare_out_dir, refuse_existing_bundle, source_date_epoch,
                            write_bundle)
from runtime_py.errors import FamilyError, UsageError, WeightsError
from runtime_py.format import open_bundle
from runtime_py.targets import engine_members, get_target



def _engine_package_versions(backend: str, details: dict) -> dict[str, str]:
    """The new engine's packages (the registry's list): the version its details record
    (``<package>_version``: what built it), else the installed one."""
    from bundler.make import package_versions

    packages = get_target(backend).packages
    installed = package_versions(packages)
    versions = {p: details.get(f"{p}_version") or installed.get(p) for p in packages}
    return {p: str(v) for p, v in versions.items() if v}


def rebuilt_name(source_manifest: dict, tag: str) -> str:
    """The rebuilt bundle's name: the source's family, precision, variant and input, and
    the new target's tag."""
    return bundle_name(source_manifest["family"]["name"], source_manifest["family"]["version"],
                       source_manifest["precision"], source_manifest["variant"], tag,
                       source_manifest["inputs"][0]["dtype"])


def rebuilt_manifest_body(source_manifest: dict, source_id: str, build) -> dict:
    """The new bundle's manifest body: the source's, with a new engine, name and lineage.

    `build` is a `bundler.targets.TargetBuild`. Pure (tested without any engine package).
    """
    from runtime_py import __version__

    body = {k: v for k, v in source_manifest.items() if k not in ("format", "members")}
    body["engine"] = {"backend": build.backend, "member": build.member,
                      "details": build.details}
    body["name"] = rebuilt_name(source_manifest, build.tag)
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


def rebuild_weights(family, source: dict, checkpoint: str | os.PathLike | None = None):
    """The weights the bundle was made from (`bundler.weights.Weights`), or a WeightsError
    naming what to pass: the recorded seed of a random-weights bundle; else the checkpoint
    (`checkpoint`, or the family's in the Hugging Face cache) whose sha256 the manifest
    records."""
    from bundler.weights import Weights, file_sha256, hf_cache_file, resolve_weights

    if source["kind"] == "random-weights":
        if checkpoint is not None:
            raise UsageError("the bundle was made with --random-weights (seed "
                             f"{source['seed']}): rebuild it without --checkpoint")
        return Weights(source=dict(source), seed=int(source["seed"]))
    wanted = source["sha256"].removeprefix("sha256:")
    path = Path(checkpoint) if checkpoint is not None else hf_cache_file(family)
    if path is None or not path.is_file():
        raise WeightsError(
            f"rebuilding this engine compiles {family.name}'s torch model from the weights the "
            f"bundle was made with ({source.get('id', '?')} {source.get('file', '')}, sha256 "
            f"{wanted[:16]}...), which are not at hand: pass --checkpoint FILE.safetensors "
            "(that file), or put it in the Hugging Face cache")
    if file_sha256(path) != wanted:
        raise WeightsError(f"{path} is not the checkpoint this bundle was made from (its sha256 "
                           f"differs from the manifest's {wanted[:16]}...): pass that file")
    weights = resolve_weights(family, checkpoint=path)
    weights.source = dict(source)
    return weights


def rebuild_context(manifest: dict, members: dict[str, bytes], target,
                    checkpoint: str | os.PathLike | None = None):
    """The build context of the bundle for `target` (`bundler.build_context`); None for a
    target built from the graph alone when the bundle's family is not installed."""
    from bundler.build_context import context_from_bundle
    from bundler.families import load_family

    try:
        family = load_family(manifest["family"]["name"])
    except FamilyError:
        if target.from_onnx:
            return None
        raise
    build_model = None
    if not target.from_onnx:
        from bundler.torch_model import build_torch_model

        weights = rebuild_weights(family, manifest["source"], checkpoint)
        build_model = lambda: build_torch_model(family, weights.state_dict, weights.seed)  # noqa: E731
    elif checkpoint is not None:
        raise UsageError(f"--checkpoint is for targets compiled from the torch model; the "
                         f"{target.name} engine is built from the bundle's graph")
    return context_from_bundle(manifest, members, family, build_model)


def rebuild_bundle(src_path: str | os.PathLike, backend: str, out_dir: str | os.PathLike, *,
                   log: Callable[[str], None] | None = None,
                   checkpoint: str | os.PathLike | None = None,
                   replace_existing: bool = False,
                   **build_options: object) -> tuple[Path, str]:
    """Rebuild the bundle at `src_path` for `backend` on this host; return (path, id).

    `build_options` go to the target builder (tensorrt: optimization_level, timing_cache,
    hardware_compat, version_compatible, workspace_bytes, device; torch-aoti: device,
    compile_options, ...). `checkpoint`: the weights file, for targets compiled from the
    torch model (module docstring). An existing file of the new bundle's name is replaced
    only with `replace_existing` (`--force`); else BundleExistsError (nothing built when
    the target's name is known before the build, nothing written in any case). Raises
    EngineUnavailableError when the target's engine package or GPU is missing,
    WeightsError when the weights are not at hand (nothing written), UsageError for a bad
    request, VerificationError for a corrupt source.
    """
    out_dir = prepare_out_dir(out_dir)
    builder = target_builder(backend)
    target = get_target(backend)
    with open_bundle(src_path) as src:
        src.verify()
        manifest, source_id = src.manifest, src.id
        members = {name: src.read_member(name) for name in src.member_names}
    if target.named_before_build:
        _refuse_existing_output(out_dir / f"{rebuilt_name(manifest, backend)}.bundle", src_path,
                                replace_existing)
    context = rebuild_context(manifest, members, target, checkpoint)
    build = builder.build_target(members["model.onnx"], batch=manifest["batch"], log=log,
                                 context=context, **build_options)
    body = rebuilt_manifest_body(manifest, source_id, build)
    new_members = {k: v for k, v in members.items() if k not in engine_members()}
    if build.engine_bytes is not None:
        new_members[build.member] = build.engine_bytes
    out_path = out_dir / f"{body['name']}.bundle"
    _refuse_existing_output(out_path, src_path, replace_existing)
    return write_bundle(out_path, body, new_members)


def _refuse_existing_output(out_path: Path, src_path: str | os.PathLike,
                            replace_existing: bool) -> None:
    """Never the source itself (not even with --force); another existing bundle only
    with --force."""
    if out_path.resolve() == Path(src_path).resolve():
        raise UsageError(f"the rebuilt bundle would replace its source {out_path}: "
                         "choose another output folder")
    if not replace_existing:
        refuse_existing_bundle(out_path)
