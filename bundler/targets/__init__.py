"""Engine target builders: backend name -> module that turns a typed ONNX into an engine.

`bundle make` and `bundle rebuild` both end with "build the engine for this target"; the
target decides what the engine member is (`model.onnx` itself for onnxruntime, a plan for
tensorrt, an AOTInductor package for torch-aoti) and what the manifest's
`engine.details` say. The list of targets is the registry `runtime_py.targets` (one
`EngineTarget` per backend); builder modules are imported only when their target is asked
for, so that `bundle rebuild --backend onnxruntime` never needs TensorRT.

Every builder module exposes::

    build_target(onnx_bytes: bytes, *, batch: dict, log=None,
                 context: BuildContext | None = None, **options) -> TargetBuild

`context` (`bundler.build_context.BuildContext`) is what `bundle make` (or `bundle
rebuild`) knows about the bundle: family, precision, variant, the fp8 layer selection and
scales, the torch model (built lazily), the pixel head. A target reads what it needs from
it and re-derives nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from runtime_py.errors import UsageError

from runtime_py.targets import NAMES as TARGETS
from runtime_py.targets import get_target


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
    if backend not in TARGETS:
        raise UsageError(f"cannot build engines for backend {backend!r}; "
                         f"choose one of {', '.join(TARGETS)}")
    return get_target(backend).builder()


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
