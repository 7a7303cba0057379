"""The family's torch model -> the fp32 ONNX graph every precision is derived from.

Export is the slow, version-sensitive step of ``bundle make`` (tens of seconds for
xception41 on a CPU), and its result depends only on the weights and the tool versions, so
the serialized graph is cached on disk under that key. The graph is made deterministic
(same weights and versions => identical bytes) so that bundles are reproducible and the
cache can be trusted.

Naming contract (the fp16 and fp8 graphs and calibration rely on it):
- the graph input and output are named as in the family (``input``/``logits``), with the
  dynamic batch axis named ``batch``;
- every node holding a parameter (Conv, Gemm, MatMul) is named by the torch module path
  it comes from (``blocks.0.stack.conv1.conv_pw``), and its weight initializer is
  ``<module path>.weight``; the FP8 recipe's ``module_prefix`` rules and the calibration
  file's ``weight.<node>.scale`` keys use these names. A ``Linear`` applied to a 3-D
  tensor (a transformer's tokens) is exported as ``MatMul`` on its transposed kernel
  ([in, out]) under an anonymous name, then ``Add`` of ``<module path>.bias``: the kernel
  is renamed ``<module path>.weight`` (still [in, out]: MatMul's output channels are its
  axis 1) and the MatMul ``<module path>``;
- other tensor and node names are the exporter's scoped names, which are stable for a given
  torch version (and the torch version is part of the cache key).

torch, timm and onnx are imported inside the functions.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runtime_py.errors import OutputPathError, UsageError

if TYPE_CHECKING:  # pragma: no cover
    import onnx
    import torch

    from bundler.families import Family

__all__ = ["export_fp32_onnx", "weights_digest", "default_cache_dir", "export_cache_key", "BATCH_DIM"]

BATCH_DIM = "batch"
#: Bump when the post-processing of the exported graph changes: old cache entries then miss.
_EXPORT_REVISION = 2
_CACHE_ENV = "TRT_BUNDLE_CACHE"
_PARAM_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")


def default_cache_dir() -> Path:
    """``$TRT_BUNDLE_CACHE/export`` if set, else ``~/.cache/trt-bundle/export``."""
    base = os.environ.get(_CACHE_ENV)
    root = Path(base).expanduser() if base else Path.home() / ".cache" / "trt-bundle"
    return root / "export"


def weights_digest(state_dict: Mapping[str, Any]) -> str:
    """sha256 over the tensors in sorted-name order (name, dtype, shape, raw bytes).

    Accepts torch tensors or numpy arrays. Bytes are the tensor's memory in C order
    (little-endian on every host trt-bundle supports); nothing is pickled.
    """
    import numpy as np

    h = hashlib.sha256()
    for name in sorted(state_dict):
        dtype, shape, data = _tensor_bytes(state_dict[name], np)
        header = json.dumps([name, dtype, list(shape), len(data)], separators=(",", ":"))
        h.update(len(header).to_bytes(8, "little"))
        h.update(header.encode("utf-8"))
        h.update(data)
    return h.hexdigest()


def _tensor_bytes(value: Any, np: Any) -> tuple[str, tuple[int, ...], bytes]:
    if hasattr(value, "detach"):  # a torch tensor: view as bytes so any dtype (bf16) works
        import torch

        t = value.detach().cpu().contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes()
        return str(t.dtype).removeprefix("torch."), tuple(t.shape), raw
    arr = np.asarray(value, order="C")  # (ascontiguousarray would make 0-d arrays 1-d)
    return arr.dtype.name, arr.shape, arr.tobytes()


def export_cache_key(module: torch.nn.Module, family: Family) -> str:
    """The cache key: weights digest, torch/timm/onnx versions, family name/version/IO/opset."""
    import onnx
    import timm
    import torch

    key = {
        "weights": weights_digest(module.state_dict()),
        "torch": torch.__version__,
        "timm": timm.__version__,
        "onnx": onnx.__version__,
        "family": family.name,
        "family_version": family.version,
        "input": family.input.name,
        "output": family.output_name,
        "shape": list(family.input.shape),
        "opset": family.opset,
        "revision": _EXPORT_REVISION,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode("utf-8")).hexdigest()


def export_fp32_onnx(
    module: torch.nn.Module, family: Family, cache_dir: Path | str | None = None
) -> onnx.ModelProto:
    """Export ``module`` (BN-folded, eval: see ``bundler.torch_model``) to the fp32 graph.

    Opset ``family.opset`` (>= 19), dynamic batch axis ``batch``, no BatchNormalization
    nodes, stable node names (module docstring). The serialized graph is cached in
    ``cache_dir`` (default ``default_cache_dir()``), written atomically; a cache entry that
    cannot be parsed is ignored and rewritten.
    """
    import onnx

    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    key = export_cache_key(module, family)
    path = cache / f"{family.name}-fp32-{key[:32]}.onnx"
    if path.is_file():
        try:
            model = onnx.load_from_string(path.read_bytes())
            _check_graph(model, family)
            return model
        except Exception:  # corrupt or stale entry: export again and overwrite it
            pass
    model = _export(module, family)
    try:
        _write_atomic(path, serialize(model))
    except (OSError, OutputPathError):   # atomic_write's refusal names the file
        pass  # an unwritable cache costs time, not correctness
    return model


def serialize(model: onnx.ModelProto) -> bytes:
    """Deterministic serialization of a graph (what the cache and the bundle store)."""
    return model.SerializeToString(deterministic=True)


def _export(module: torch.nn.Module, family: Family) -> onnx.ModelProto:
    import io

    import onnx
    import torch

    if module.training:
        raise UsageError("export needs the model in eval mode (use bundler.torch_model.build_torch_model)")
    c, h, w = family.input.shape
    example = torch.zeros(2, c, h, w)
    inp, out = family.input.name, family.output_name
    buf = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        try:
            torch.onnx.export(
                module, (example,), buf, dynamo=False, opset_version=family.opset,
                input_names=[inp], output_names=[out],
                dynamic_axes={inp: {0: BATCH_DIM}, out: {0: BATCH_DIM}},
                do_constant_folding=True,
            )
            model = onnx.load_from_string(buf.getvalue())
        except (TypeError, RuntimeError, ImportError, NotImplementedError):
            # torch without the TorchScript exporter: the torch.export-based one.
            program = torch.onnx.export(
                module, (example,), None, dynamo=True, opset_version=family.opset,
                input_names=[inp], output_names=[out],
                dynamic_shapes=({0: torch.export.Dim(BATCH_DIM, min=1, max=max(2, family.input.batch.max))},),
                optimize=True,
            )
            model = program.model_proto
    _postprocess(model, family)
    _check_graph(model, family)
    # a serialization round trip, so that a fresh export and a cache hit are the same proto
    return onnx.load_from_string(serialize(model))


def _postprocess(model: onnx.ModelProto, family: Family) -> None:
    """Stable names, no Identity over initializers, batch axis named, metadata fixed."""
    from onnx import numpy_helper

    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    # Identity nodes the exporter adds for deduplicated initializers: give each consumer
    # its own initializer, so every Conv weight is an initializer (the fp8 pass needs it).
    for node in [n for n in graph.node if n.op_type == "Identity" and n.input[0] in inits]:
        copy = numpy_helper.from_array(numpy_helper.to_array(inits[node.input[0]]), node.output[0])
        graph.initializer.append(copy)
        inits[copy.name] = copy
        graph.node.remove(node)
    _name_linear_matmuls(graph, inits)
    used = {n.name for n in graph.node}
    for node in graph.node:
        if node.op_type in _PARAM_OPS and len(node.input) > 1 and node.input[1].endswith(".weight"):
            name = node.input[1].removesuffix(".weight")
            if name not in used:
                used.discard(node.name)
                node.name = name
                used.add(name)
    for i, node in enumerate(graph.node):
        if not node.name:
            node.name = f"{node.op_type}_{i}"
    for vi in list(graph.input) + list(graph.output):
        dims = vi.type.tensor_type.shape.dim
        if dims:
            dims[0].ClearField("dim_value")
            dims[0].dim_param = BATCH_DIM
    graph.name = family.name
    model.producer_name = "trt-bundle"
    model.doc_string = ""
    del model.metadata_props[:]


def _name_linear_matmuls(graph, inits) -> None:
    """``MatMul(x, <anonymous kernel>) -> Add(<path>.bias)``: name the kernel
    ``<path>.weight`` (module docstring), so that the MatMul is named ``<path>`` next."""
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    taken = set(inits)
    for node in graph.node:
        if node.op_type != "MatMul" or len(node.input) != 2 or node.input[1] not in inits:
            continue
        if node.input[1].endswith(".weight"):
            continue
        uses = consumers.get(node.output[0], [])
        adds = [n for n in uses if n.op_type == "Add" and len(uses) == 1]
        bias = next((i for n in adds for i in n.input if i in inits and i.endswith(".bias")), None)
        if bias is None or len(consumers.get(node.input[1], [])) != 1:
            continue
        new = bias.removesuffix(".bias") + ".weight"
        if new in taken:
            continue
        init = inits.pop(node.input[1])
        init.name = new
        inits[new] = init
        taken.add(new)
        node.input[1] = new


def _check_graph(model: onnx.ModelProto, family: Family) -> None:
    import onnx

    onnx.checker.check_model(model)
    graph = model.graph
    problems = []
    if [i.name for i in graph.input] != [family.input.name]:
        problems.append(f"inputs are {[i.name for i in graph.input]}, expected [{family.input.name!r}]")
    if [o.name for o in graph.output] != [family.output_name]:
        problems.append(f"outputs are {[o.name for o in graph.output]}, expected [{family.output_name!r}]")
    bn = [n.name for n in graph.node if n.op_type == "BatchNormalization"]
    if bn:
        problems.append(f"{len(bn)} BatchNormalization node(s) left (first {bn[0]!r}): BN was not folded")
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < family.opset:
        problems.append(f"opset {opset} is below the family's {family.opset}")
    if problems:
        raise UsageError("the exported graph is not what the family needs: " + "; ".join(problems))


def _write_atomic(path: Path, data: bytes) -> None:
    from bundler.writer import atomic_write

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, [data])
