"""Engine registry: backend name -> runner class, imported only when asked for.

Adding a backend means adding a module here and one line to `_RUNNERS`; nothing else
in the runtime knows about individual backends.
"""

from __future__ import annotations

import importlib

from runtime_py.errors import UsageError

_RUNNERS = {
    "onnxruntime": ("runtime_py.engines.onnxruntime", "OnnxRuntimeRunner"),
    "tensorrt": ("runtime_py.engines.tensorrt", "TensorRTRunner"),
    "torch-aoti": ("runtime_py.engines.torch_aoti", "TorchAotiRunner"),
}

BACKENDS = tuple(_RUNNERS)


def runner_class(backend: str):
    """The runner class for `backend` (importing its module, not its engine package)."""
    try:
        module_name, class_name = _RUNNERS[backend]
    except KeyError:
        raise UsageError(
            f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}") from None
    return getattr(importlib.import_module(module_name), class_name)
