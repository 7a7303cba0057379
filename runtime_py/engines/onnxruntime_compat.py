"""Can this host run an ONNX Runtime bundle? The onnxruntime target's host check (its
``EngineTarget.check_path``): a pure function of ``engine.details`` and a ``HostInfo``."""

from __future__ import annotations

from runtime_py.compat import HostInfo, parse_version
from runtime_py.errors import CompatibilityError, EngineUnavailableError

__all__ = ["check_onnxruntime_target", "ORT_INSTALL_HINT"]

ORT_INSTALL_HINT = "pip install 'trt-bundle[ort]'"


def check_onnxruntime_target(details: dict, host: HostInfo, device: int = 0) -> None:
    """Raise unless onnxruntime is installed (and at least ``min_onnxruntime`` if set)."""
    if host.onnxruntime_version is None:
        raise EngineUnavailableError(
            f"this bundle runs on ONNX Runtime, which is not installed: `{ORT_INSTALL_HINT}`")
    wanted = details.get("min_onnxruntime")
    if wanted and parse_version(host.onnxruntime_version) < parse_version(wanted):
        raise CompatibilityError(
            f"this bundle needs onnxruntime >= {wanted}; this host has "
            f"{host.onnxruntime_version}: pip install -U 'onnxruntime>={wanted}'")
