"""Engine target builders: backend name -> module that turns a typed ONNX into an engine.

`bundle make` and `bundle rebuild` both end with "build the engine for this target"; the
target decides what the engine member is (`model.onnx` itself for onnxruntime, a plan for
tensorrt, an AOTInductor package for torch-aoti) and what the manifest's
`engine.details` say. Modules are imported only when their target is asked for, so that
`bundle rebuild --backend onnxruntime` never needs TensorRT.

Every target module exposes::

    build_target(onnx_bytes: bytes, *, batch: dict, log=None, **options) -> TargetBuild

Adding a target (torch-aoti): write `bundler/targets/torch_aoti.py` with `build_target`
and add one line to `_TARGETS`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

from runtime_py.errors import UsageError

_TARGETS = {
    "onnxruntime": "bundler.targets.onnxruntime",
    "tensorrt": "bundler.targets.tensorrt",
    "torch-aoti": "bundler.targets.torch_aoti",
}

TARGETS = tuple(_TARGETS)


@dataclass(frozen=True)
class TargetBuild:
    """An engine built for one target, ready to be written into a bundle.

    `engine_bytes` is None when the engine is `model.onnx` itself (onnxruntime).
    `tag` is the `<target>` part of the bundle name (see `bundle_name`).
    """

    backend: str
    member: str
    engine_bytes: bytes | None
    details: dict
    tag: str


def target_builder(backend: str) -> ModuleType:
    """The builder module of `backend` (imported now; its engine package is not)."""
    try:
        module_name = _TARGETS[backend]
    except KeyError:
        raise UsageError(f"cannot build engines for backend {backend!r}; "
                         f"choose one of {', '.join(TARGETS)}") from None
    return importlib.import_module(module_name)


def bundle_name(family: str, family_version: str, precision: str, variant: str | None,
                tag: str, input_dtype: str = "float32") -> str:
    """`<family>-<precision>[-<variant>][-uint8]-<family version>-<target tag>`
    (docs/format.md); `-uint8` marks a bundle whose input is uint8 pixels.

    A variant named after its precision is not repeated: fp8 + fp8-depthwise gives
    `...-fp8-depthwise-...`.
    """
    if variant and variant.startswith(precision + "-"):
        variant = variant[len(precision) + 1:]
    parts = ([family, precision] + ([variant] if variant else [])
             + (["uint8"] if input_dtype == "uint8" else []) + [family_version, tag])
    return "-".join(parts)
