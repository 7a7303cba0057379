"""`bundle export triton`: bundles as a Triton Inference Server model repository.

One model folder per bundle, named like `bundle serve` names it (the bundle name without
its engine-target part):

- onnxruntime bundle: `<name>/1/model.onnx` (the bundle's typed graph) on Triton's
  onnxruntime backend; an fp8 graph gets `optimization { graph { level: 2 } }` (all graph
  optimizations off), as `runtime_py` runs it, because ONNX Runtime's optimizer changes
  the arithmetic of FP8 Q/DQ graphs (see runtime_py/engines/onnxruntime.py).
- tensorrt bundle: `<name>/1/model.plan` on the tensorrt backend, written only after the
  plan's compatibility record (TensorRT version, compute capability) is checked against the
  Triton server's, which the caller states: a plan is tied to both, and Triton would only
  say so at load time, in a TensorRT log line.
- any other bundle (torch-aoti: an engine Triton has no backend for): `<name>/1/model.py`
  on the python backend, with the bundle file beside it; `runtime_py.triton_python` loads
  and verifies it there.

`config.pbtxt` carries max_batch_size (the bundle's max batch), the inputs and outputs
without the batch axis, dynamic batching (preferred sizes: the bundle's opt and max batch;
queue delay: `max_delay_ms`, `bundle serve`'s 2 ms by default: the manifest records no delay),
the instance group and the bundle's id, name and family version as parameters.

A bundle with a preprocessing spec also gets `<name>-preprocess` (python backend: encoded
images, TYPE_STRING, to the bundle's input tensor) and `<name>-ensemble` (images in, the
bundle's outputs out), since the bundle's own input is a preprocessed tensor, not pixels.

Everything is written through `StagedFolder`: a failure leaves the repository as it was.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from runtime_py.compat import GpuInfo, HostInfo, parse_compute_capability
from runtime_py.engines.tensorrt_compat import check_tensorrt_target
from runtime_py.errors import UsageError
from runtime_py.format import Bundle, open_bundle
from runtime_py.model import served_name
from runtime_py.targets import get_target
from runtime_py.tensors import is_dynamic

from .pbtxt import Enum, map_entries, to_pbtxt
from .staging import StagedFolder

TRITON_DTYPES = {
    "bool": "TYPE_BOOL", "uint8": "TYPE_UINT8", "uint16": "TYPE_UINT16",
    "uint32": "TYPE_UINT32", "uint64": "TYPE_UINT64", "int8": "TYPE_INT8",
    "int16": "TYPE_INT16", "int32": "TYPE_INT32", "int64": "TYPE_INT64",
    "float16": "TYPE_FP16", "float32": "TYPE_FP32", "float64": "TYPE_FP64",
}
DEFAULT_MAX_DELAY_MS = 2.0
VERSION = "1"
IMAGE_INPUT = "IMAGE"
ONNX_GRAPH_LEVEL_DISABLE_ALL = 2   # Triton onnxruntime backend: -1 basic, 1 extended, 2 off
#: Engine targets Triton has a backend of its own for: (backend, model file). Every other
#: target (torch-aoti, and any added later) runs on the python backend through runtime_py.
NATIVE_BACKENDS = {"onnxruntime": ("onnxruntime", "model.onnx"),
                   "tensorrt": ("tensorrt", "model.plan")}

MODEL_PY = '''\
# Written by `bundle export triton`: Triton's python backend runs {what}
# through trt-bundle's runtime (pip install trt-bundle in Triton's Python environment).
import triton_python_backend_utils as pb_utils

from runtime_py.triton_python import {factory}

TritonPythonModel = {factory}(pb_utils)
'''


@dataclass
class TritonOptions:
    """How the repository is laid out; every field has the CLI option of the same name."""

    max_delay_ms: float = DEFAULT_MAX_DELAY_MS
    instances: int = 1
    device: str = "auto"                     # auto | cpu | gpu (instance group kind)
    tensorrt_version: str | None = None      # the Triton server's TensorRT
    compute_capability: str | None = None    # the Triton server's GPU, e.g. "9.0"
    runtime_backend: str | None = None       # python-backend bundles: runtime_py backend
    ensemble: bool = True
    overwrite: bool = False


@dataclass
class ExportedModel:
    name: str
    backend: str          # onnxruntime | tensorrt | python | ensemble
    bundle_id: str
    path: Path
    files: list[str] = field(default_factory=list)


def triton_dtype(dtype: str) -> str:
    try:
        return TRITON_DTYPES[dtype]
    except KeyError:
        raise UsageError(f"dtype {dtype} has no Triton data type") from None


def tensor_config(entry: dict) -> dict:
    """A manifest tensor as a Triton input/output: dims without the batch axis."""
    shape = entry["shape"]
    if not shape or shape[0] != "batch":
        raise UsageError(f"tensor {entry['name']!r} has no leading batch axis ({shape}); "
                         "Triton's batching needs one")
    return {"name": entry["name"], "data_type": Enum(triton_dtype(entry["dtype"])),
            "dims": [-1 if is_dynamic(d) else int(d) for d in shape[1:]]}


def max_batch_size(manifest: dict) -> int:
    """The bundle's max batch; for a plan, never above its optimization profile's max."""
    n = int(manifest["batch"]["max"])
    profile = manifest["engine"]["details"].get("profile")
    return min(n, int(profile["max"])) if profile else n


def dynamic_batching(manifest: dict, max_delay_ms: float) -> dict:
    if max_delay_ms < 0:
        raise UsageError(f"max delay must be >= 0 ms, got {max_delay_ms}")
    top = max_batch_size(manifest)
    preferred = sorted({b for b in (int(manifest["batch"]["opt"]), top) if 1 < b <= top})
    return {"preferred_batch_size": preferred or None,
            "max_queue_delay_microseconds": int(round(max_delay_ms * 1000))}


def bundle_parameters(bundle: Bundle, extra: dict[str, str] | None = None) -> list[dict]:
    m = bundle.manifest
    values = {"bundle_id": bundle.id, "bundle_name": m["name"],
              "bundle_version": bundle.id[:12],   # what `bundle serve` reports as version
              "family": m["family"]["name"], "family_version": m["family"]["version"],
              "precision": m["precision"], "engine_backend": m["engine"]["backend"],
              **(extra or {})}
    return map_entries({k: {"string_value": str(v)} for k, v in values.items()})


def instance_group(kind: str, count: int) -> list[dict]:
    if count < 1:
        raise UsageError(f"--instances must be at least 1, got {count}")
    return [{"count": count, "kind": Enum(f"KIND_{kind.upper()}")}]


def check_plan_target(manifest: dict, options: TritonOptions) -> None:
    """The plan's record against the Triton server's TensorRT and GPU (stated by the user:
    the server is not this host), with `bundle serve`'s own rules and messages."""
    if not options.tensorrt_version or not options.compute_capability:
        raise UsageError(
            f"{manifest['name']} holds a TensorRT plan, which only runs on the TensorRT "
            f"version and GPU it was built for ({manifest['engine']['details']['tensorrt_version']}, "
            f"compute capability {manifest['engine']['details']['compute_capability']}): give "
            "the Triton server's with --tensorrt-version and --compute-capability (Triton's "
            "release notes list the TensorRT of each container)")
    host = HostInfo(tensorrt_version=options.tensorrt_version,
                    gpus=(GpuInfo("the Triton server's GPU", _cc(options.compute_capability)),))
    check_tensorrt_target(manifest["engine"]["details"], host)


def _cc(text: str) -> tuple[int, int]:
    try:
        return parse_compute_capability(text)
    except ValueError as exc:
        raise UsageError(f"--compute-capability: {exc} (expected e.g. 9.0)") from None


def model_config(bundle: Bundle, name: str, options: TritonOptions) -> tuple[dict, str]:
    """The config of the bundle's own model and the Triton backend it runs on."""
    m = bundle.manifest
    engine = m["engine"]["backend"]
    device = get_target(engine).device(m["engine"]["details"])
    if device and options.device not in ("auto", device):
        raise UsageError(f"{bundle.path.name}: a {engine} engine runs on the {device.upper()} "
                         f"only; --device {options.device} cannot be honoured")
    kind = device or options.device
    params: dict[str, str] = {}
    extra: dict = {}
    if engine in NATIVE_BACKENDS:
        backend, filename = NATIVE_BACKENDS[engine]
        if engine == "onnxruntime" and m["precision"] == "fp8":
            extra["optimization"] = {"graph": {"level": ONNX_GRAPH_LEVEL_DISABLE_ALL}}
    else:
        backend, filename = "python", "model.py"
        params = {"bundle_file": bundle.path.name,
                  "runtime_backend": options.runtime_backend or engine}
    config = {
        "name": name,
        "backend": backend,
        "max_batch_size": max_batch_size(m),
        "input": [tensor_config(t) for t in m["inputs"]],
        "output": [tensor_config(t) for t in m["outputs"]],
        "dynamic_batching": dynamic_batching(m, options.max_delay_ms),
        "instance_group": instance_group(kind, options.instances),
        "default_model_filename": None if backend == "python" else filename,
        "parameters": bundle_parameters(bundle, params),
        **extra,
    }
    return config, filename


def preprocess_config(bundle: Bundle, name: str, options: TritonOptions) -> dict:
    m = bundle.manifest
    spec = bundle.preprocess
    target = next((t for t in m["inputs"] if t["name"] == spec["input"]), None)
    if target is None or len(m["inputs"]) != 1:
        raise UsageError(f"{bundle.path.name}: the preprocessing spec feeds {spec['input']!r}, "
                         f"which is not the bundle's single input")
    return {
        "name": name,
        "backend": "python",
        "max_batch_size": max_batch_size(m),
        "input": [{"name": IMAGE_INPUT, "data_type": Enum("TYPE_STRING"), "dims": [1]}],
        "output": [tensor_config(target)],
        "dynamic_batching": dynamic_batching(m, options.max_delay_ms),
        "instance_group": instance_group("cpu", options.instances),
        "parameters": bundle_parameters(bundle, {"image_input": IMAGE_INPUT}),
    }


def ensemble_config(bundle: Bundle, name: str, model_name: str, preprocess_name: str) -> dict:
    m = bundle.manifest
    tensor = "preprocessed_" + m["inputs"][0]["name"]
    return {
        "name": name,
        "platform": "ensemble",
        "max_batch_size": max_batch_size(m),
        "input": [{"name": IMAGE_INPUT, "data_type": Enum("TYPE_STRING"), "dims": [1]}],
        "output": [tensor_config(t) for t in m["outputs"]],
        "ensemble_scheduling": {"step": [
            {"model_name": preprocess_name, "model_version": -1,
             "input_map": map_entries({IMAGE_INPUT: IMAGE_INPUT}),
             "output_map": map_entries({m["inputs"][0]["name"]: tensor})},
            {"model_name": model_name, "model_version": -1,
             "input_map": map_entries({m["inputs"][0]["name"]: tensor}),
             "output_map": map_entries({t["name"]: t["name"] for t in m["outputs"]})},
        ]},
        "parameters": bundle_parameters(bundle),
    }


def model_config_module():
    """tritonclient's generated `model_config_pb2` (Triton's model_config.proto), or None.

    Loaded on its own, not through `tritonclient.grpc`: that package also registers the
    KServe v2 gRPC messages (`inference.ServerLiveRequest`...) in protobuf's default pool,
    and so does the kserve SDK, so importing both in one process fails.
    """
    import importlib.util
    import sys

    name = "tritonclient.grpc.model_config_pb2"
    if name in sys.modules:
        return sys.modules[name]
    try:
        spec = importlib.util.find_spec("tritonclient")
    except ImportError:
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / "grpc" / "model_config_pb2.py"
    if not path.is_file():
        return None
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception:
        del sys.modules[name]
        raise
    return module


def check_model_config(text: str, where: str = "config.pbtxt"):
    """Parse a config with Triton's own `model_config.proto` (tritonclient's generated
    module); returns the ModelConfig message, or None when tritonclient is not installed."""
    pb2 = model_config_module()
    if pb2 is None:
        return None
    from google.protobuf import text_format

    try:
        return text_format.Parse(text, pb2.ModelConfig())
    except text_format.ParseError as exc:
        raise UsageError(f"{where} is not a valid Triton model config: {exc}") from None


def _write_config(folder: Path, config: dict, checked: list[str]) -> None:
    text = to_pbtxt(config)
    if check_model_config(text, f"{config['name']}/config.pbtxt") is not None:
        checked.append(config["name"])
    (folder / "config.pbtxt").write_text(text)


def _write_member(bundle: Bundle, member: str, path: Path) -> None:
    with open(path, "wb") as f:
        for chunk in bundle.iter_member(member):   # sha256-checked as it streams
            f.write(chunk)


def export_triton(bundle_paths: Iterable[str | os.PathLike], repo: str | os.PathLike,
                  options: TritonOptions | None = None) -> tuple[list[ExportedModel], list[str]]:
    """Write the bundles into the model repository ``repo``.

    Returns the models written and the names of those whose config.pbtxt was parsed with
    Triton's schema (all of them where tritonclient is installed). Each bundle is verified
    first; a TensorRT plan is checked against the server's TensorRT and GPU first.
    """
    options = options or TritonOptions()
    paths = list(bundle_paths)
    if not paths:
        raise UsageError("no bundle to export")
    exported: list[ExportedModel] = []
    checked: list[str] = []
    names: dict[str, str] = {}
    with StagedFolder(repo, overwrite=options.overwrite) as stage:
        for path in paths:
            with open_bundle(path) as bundle:
                bundle.verify()
                m = bundle.manifest
                name = served_name(m)
                if name in names:
                    raise UsageError(f"{path} and {names[name]} are both model {name!r}: "
                                     "export each model once per repository")
                names[name] = str(path)
                if m["engine"]["backend"] == "tensorrt":
                    check_plan_target(m, options)
                config, filename = model_config(bundle, name, options)
                folder = stage.path(name)
                (folder / VERSION).mkdir(parents=True)
                files = [f"{VERSION}/{filename}"]
                if config["backend"] == "python":
                    shutil.copyfile(bundle.path, folder / VERSION / bundle.path.name)
                    (folder / VERSION / filename).write_text(MODEL_PY.format(
                        what=f"the bundle {bundle.path.name}", factory="bundle_model_class"))
                    files.append(f"{VERSION}/{bundle.path.name}")
                else:
                    _write_member(bundle, m["engine"]["member"], folder / VERSION / filename)
                _write_config(folder, config, checked)
                exported.append(ExportedModel(name, config["backend"], bundle.id,
                                              Path(repo) / name, ["config.pbtxt", *files]))
                if options.ensemble and bundle.preprocess is not None:
                    exported += _write_ensemble(stage, bundle, name, options, checked)
        stage.commit()
    return exported, checked


def _write_ensemble(stage: StagedFolder, bundle: Bundle, name: str, options: TritonOptions,
                    checked: list[str]) -> list[ExportedModel]:
    pre_name, ens_name = f"{name}-preprocess", f"{name}-ensemble"
    pre = stage.path(pre_name)
    (pre / VERSION).mkdir(parents=True)
    (pre / VERSION / "preprocess.json").write_text(
        json.dumps(bundle.preprocess, indent=2, sort_keys=True))
    (pre / VERSION / "model.py").write_text(MODEL_PY.format(
        what=f"the preprocessing of {bundle.manifest['name']}", factory="preprocess_model_class"))
    _write_config(pre, preprocess_config(bundle, pre_name, options), checked)
    ens = stage.path(ens_name)
    (ens / VERSION).mkdir(parents=True)   # Triton wants a version folder, even an empty one
    _write_config(ens, ensemble_config(bundle, ens_name, name, pre_name), checked)
    repo = stage.target
    return [ExportedModel(pre_name, "python", bundle.id, repo / pre_name,
                          ["config.pbtxt", f"{VERSION}/model.py", f"{VERSION}/preprocess.json"]),
            ExportedModel(ens_name, "ensemble", bundle.id, repo / ens_name, ["config.pbtxt"])]
