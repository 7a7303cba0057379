"""The onnxruntime target: the engine *is* the bundle's typed `model.onnx`.

Nothing is compiled, so the only details are the graph's opset (ONNX Runtime releases
support opsets up to a known version; recording it lets a reader see what it needs).
"""

from __future__ import annotations

from typing import Callable

from bundler.targets import TargetBuild
from runtime_py.errors import BundleError


def onnx_opset(onnx_bytes: bytes) -> int:
    """The default-domain ("" / "ai.onnx") opset the graph imports."""
    import onnx

    try:
        model = onnx.load_model_from_string(onnx_bytes)
    except Exception as exc:  # protobuf DecodeError and friends
        raise BundleError(f"model.onnx is not a readable ONNX model: {exc}") from None
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return int(entry.version)
    raise BundleError("model.onnx imports no default-domain opset")


def build_target(onnx_bytes: bytes, *, batch: dict | None = None,
                 log: Callable[[str], None] | None = None, context: object = None,
                 **options: object) -> TargetBuild:
    """No build: record the opset (the graph is all it needs of ``context``). Options other
    than none are refused (say so early)."""
    if options:
        from runtime_py.errors import UsageError

        raise UsageError(f"the onnxruntime target takes no build options (got "
                         f"{', '.join(sorted(options))})")
    return TargetBuild(backend="onnxruntime", member="model.onnx", engine_bytes=None,
                       details={"opset": onnx_opset(onnx_bytes)}, tag="onnxruntime")
