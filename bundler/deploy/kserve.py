"""`bundle export kserve`: a KServe ServingRuntime + InferenceService for one bundle.

KServe's storage initializer fetches the storage URI into `/mnt/models`; the runtime's
container (docker/Dockerfile: `trt-bundle[serve]` only) starts with
`bundler.deploy.kserve_entrypoint`, which verifies every bundle there (`bundle verify`:
every hash and the id) and checks that the ids are the ones this manifest names
(`TRT_BUNDLE_IDS`), before it execs `bundle serve`. The server speaks the KServe v2
(Open Inference) protocol over HTTP; its health routes are the probes: a startup probe
on `/v2/health/live` gives verification and loading time, then liveness on the same
route and readiness on `/v2/health/ready`.

The manifests are plain dicts written as YAML; `check_with_kserve_sdk` walks them through
the KServe SDK's generated models (and the Kubernetes client's), refusing any field those
models do not know, a value of the wrong type, or a missing required field.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime_py.errors import UsageError
from runtime_py.format import open_bundle
from runtime_py.model import served_name
from runtime_py.targets import get_target

from .staging import StagedFolder

RUNTIME_NAME = "trt-bundle"
MODEL_FORMAT = {"name": "trt-bundle", "version": "1"}   # the bundle file format's major
MODEL_DIR = "/mnt/models"                                # where KServe's initializer puts it
HTTP_PORT = 8080
DEFAULT_IMAGE = "trt-bundle-serve:0.1.0"
GPU_RESOURCE = "nvidia.com/gpu"


@dataclass
class KServeOptions:
    """Every field has the CLI option of the same name."""

    storage_uri: str
    name: str | None = None              # InferenceService name (default: from the bundle)
    namespace: str | None = None
    image: str = DEFAULT_IMAGE
    gpus: int | None = None              # default: 1 for GPU engines, 0 for onnxruntime
    cpu: str = "1"
    memory: str = "2Gi"
    max_batch: int | None = None
    max_delay_ms: float = 2.0
    backend: str = "auto"
    min_replicas: int | None = None
    max_replicas: int | None = None
    overwrite: bool = False
    extra_env: dict[str, str] = field(default_factory=dict)


def dns_name(text: str) -> str:
    """A Kubernetes DNS-1035 label: lower-case letters, digits and '-', a letter first."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    if not name or not name[0].isalpha():
        name = "m-" + name
    return name[:63].rstrip("-")


def _probe(path: str, **timing: int) -> dict:
    return {"httpGet": {"path": path, "port": HTTP_PORT}, **timing}


def serving_runtime(options: KServeOptions) -> dict:
    """The ServingRuntime: one per image, shared by every trt-bundle InferenceService."""
    meta: dict[str, Any] = {"name": RUNTIME_NAME}
    if options.namespace:
        meta["namespace"] = options.namespace
    return {
        "apiVersion": "serving.kserve.io/v1alpha1",
        "kind": "ServingRuntime",
        "metadata": meta,
        "spec": {
            "supportedModelFormats": [{**MODEL_FORMAT, "autoSelect": True}],
            "protocolVersions": ["v2"],
            "containers": [{
                "name": "kserve-container",
                "image": options.image,
                "command": ["python", "-m", "bundler.deploy.kserve_entrypoint"],
                "args": ["--model-dir", MODEL_DIR, "--port", str(HTTP_PORT)],
                "ports": [{"containerPort": HTTP_PORT, "protocol": "TCP"}],
                # Verification (every member's sha256) and engine load happen before the
                # server listens: up to 10 minutes for a large bundle before liveness counts.
                "startupProbe": _probe("/v2/health/live", periodSeconds=5, failureThreshold=120),
                "livenessProbe": _probe("/v2/health/live", periodSeconds=10, failureThreshold=3),
                "readinessProbe": _probe("/v2/health/ready", periodSeconds=5, failureThreshold=2),
            }],
        },
    }


def inference_service(manifest: dict, bundle_id: str, options: KServeOptions) -> dict:
    engine = manifest["engine"]["backend"]
    # a GPU by default where the served engine runs on one only (a plan, a CUDA package);
    # --backend onnxruntime serves the bundle's ONNX graph instead, wherever ONNX Runtime runs
    needs_gpu = (options.backend in ("auto", engine)
                 and get_target(engine).device(manifest["engine"]["details"]) == "gpu")
    gpus = options.gpus if options.gpus is not None else int(needs_gpu)
    if gpus < 0:
        raise UsageError(f"--gpus must be >= 0, got {gpus}")
    if gpus == 0 and needs_gpu:
        raise UsageError(f"a {engine} bundle needs a GPU: pass --gpus 1 (or more), or serve "
                         "its ONNX graph with --backend onnxruntime")
    if not re.match(r"^[a-z][a-z0-9+.-]*://\S+$", options.storage_uri):
        raise UsageError(f"--storage-uri {options.storage_uri!r} is not a URI "
                         "(e.g. s3://bucket/path/model.bundle, gs://..., pvc://claim/path)")
    resources: dict[str, dict[str, str]] = {
        "requests": {"cpu": options.cpu, "memory": options.memory},
        "limits": {"cpu": options.cpu, "memory": options.memory},
    }
    if gpus:
        resources["requests"][GPU_RESOURCE] = str(gpus)
        resources["limits"][GPU_RESOURCE] = str(gpus)
    env = {"TRT_BUNDLE_IDS": bundle_id, "TRT_BUNDLE_BACKEND": options.backend,
           "TRT_BUNDLE_MAX_DELAY_MS": f"{options.max_delay_ms:g}", **options.extra_env}
    if options.max_batch is not None:
        env["TRT_BUNDLE_MAX_BATCH"] = str(options.max_batch)
    name = options.name or dns_name(served_name(manifest))
    if dns_name(name) != name:
        raise UsageError(f"--name {name!r} is not a DNS-1035 label; e.g. {dns_name(name)!r}")
    meta: dict[str, Any] = {"name": name, "labels": {
        "app.kubernetes.io/name": name, "trt-bundle/family": dns_name(manifest["family"]["name"]),
        "trt-bundle/precision": manifest["precision"]},
        "annotations": {"trt-bundle/bundle-id": bundle_id,
                        "trt-bundle/bundle-name": manifest["name"],
                        "trt-bundle/served-model-name": served_name(manifest)}}
    if options.namespace:
        meta["namespace"] = options.namespace
    predictor: dict[str, Any] = {"model": {
        "modelFormat": dict(MODEL_FORMAT),
        "protocolVersion": "v2",
        "runtime": RUNTIME_NAME,
        "storageUri": options.storage_uri,
        "env": [{"name": k, "value": v} for k, v in env.items()],
        "resources": resources,
    }}
    if options.min_replicas is not None:
        predictor["minReplicas"] = options.min_replicas
    if options.max_replicas is not None:
        predictor["maxReplicas"] = options.max_replicas
    return {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
            "metadata": meta, "spec": {"predictor": predictor}}


# --- checking with the KServe SDK's models ---------------------------------------------

_PRIMITIVES = {"str": str, "int": int, "bool": bool, "float": (int, float)}


def _model_class(name: str):
    import kserve.models
    import kubernetes.client

    cls = getattr(kserve.models, name, None) or getattr(kubernetes.client, name, None)
    if cls is None:
        raise LookupError(name)
    return cls


def _build(data: Any, kind: str, where: str, problems: list[str]) -> Any:
    m = re.fullmatch(r"(?:list|List)\[(.+)\]", kind)
    if m:
        if not isinstance(data, list):
            problems.append(f"{where}: expected a list, got {type(data).__name__}")
            return None
        return [_build(v, m.group(1), f"{where}[{i}]", problems) for i, v in enumerate(data)]
    m = re.fullmatch(r"dict\(str, (.+)\)|Dict\[str, (.+)\]", kind)
    if m:
        if not isinstance(data, dict):
            problems.append(f"{where}: expected a map, got {type(data).__name__}")
            return None
        sub = m.group(1) or m.group(2)
        return {k: _build(v, sub, f"{where}.{k}", problems) for k, v in data.items()}
    if kind == "object":
        return data
    if kind in _PRIMITIVES:
        if not isinstance(data, _PRIMITIVES[kind]) or (kind != "bool" and isinstance(data, bool)):
            problems.append(f"{where}: expected {kind}, got {type(data).__name__} {data!r}")
        return data
    cls = _model_class(kind)
    if not isinstance(data, dict):
        problems.append(f"{where}: expected a {kind} object, got {type(data).__name__}")
        return None
    by_json = {json_key: attr for attr, json_key in cls.attribute_map.items()}
    kwargs = {}
    for key, value in data.items():
        attr = by_json.get(key)
        if attr is None:
            problems.append(f"{where}.{key}: not a field of {kind}")
            continue
        kwargs[attr] = _build(value, cls.openapi_types[attr], f"{where}.{key}", problems)
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as exc:   # required fields, enums (pydantic's too)
        problems.append(f"{where}: {kind}: {' '.join(str(exc).split())}")
        return None


def check_with_kserve_sdk(document: dict) -> list[str] | None:
    """Problems of an InferenceService/ServingRuntime document against the KServe SDK's
    models (empty: valid); None when the `kserve` package is not installed."""
    try:
        import kserve.models  # noqa: F401
    except ImportError:
        return None
    kinds = {"InferenceService": "V1beta1InferenceService",
             "ServingRuntime": "V1alpha1ServingRuntime"}
    kind = kinds.get(document.get("kind"))
    if kind is None:
        return [f"kind {document.get('kind')!r} is not one of {sorted(kinds)}"]
    problems: list[str] = []
    _build(document, kind, document["kind"], problems)
    return problems


@dataclass
class KServeExport:
    files: list[Path]
    bundle_id: str
    name: str
    served_model_name: str
    checked_with_sdk: bool


def export_kserve(bundle_path: str | os.PathLike, out_dir: str | os.PathLike,
                  options: KServeOptions) -> KServeExport:
    """Write `<name>-servingruntime.yaml` and `<name>-inferenceservice.yaml` into out_dir.

    The bundle is verified here too: the manifests pin its id, and the container refuses
    to serve any other bundle from the storage URI.
    """
    import yaml

    with open_bundle(bundle_path) as bundle:
        bundle.verify()
        manifest, bundle_id = bundle.manifest, bundle.id
    isvc = inference_service(manifest, bundle_id, options)
    runtime = serving_runtime(options)
    checked = True
    for doc in (runtime, isvc):
        problems = check_with_kserve_sdk(doc)
        if problems is None:
            checked = False
        elif problems:
            raise UsageError(f"the {doc['kind']} manifest does not fit the KServe SDK's "
                             f"models: {'; '.join(problems)}", problems=problems)
    name = isvc["metadata"]["name"]
    with StagedFolder(out_dir, overwrite=options.overwrite) as stage:
        for suffix, doc in (("servingruntime", runtime), ("inferenceservice", isvc)):
            stage.path(f"{name}-{suffix}.yaml").write_text(
                yaml.safe_dump(doc, sort_keys=False, default_flow_style=False))
        files = stage.commit()
    return KServeExport(files, bundle_id, name, served_name(manifest), checked)
