"""Can this host run an ONNX Runtime bundle? The onnxruntime target's host check (its
``EngineTarget.check_path``): a pure function of ``engine.details`` and a ``HostInfo``."""

from __future__ import annotations

from runtime_py.compat import HostInfo, parse_version
from runtime_py.errors import EngineUnavailableError

__all__ = ["check_onnxruntime_target", "require_onnxruntime", "upgrade_hint",
           "ORT_INSTALL_HINT"]

ORT_INSTALL_HINT = "pip install 'trt-bundle[ort]'"


def upgrade_hint(wanted: str, needed_by: str = "trt-bundle") -> str:
    """What to run where ONNX Runtime is older than ``wanted``."""
    return f"{needed_by} needs onnxruntime >= {wanted}: pip install -U 'onnxruntime>={wanted}'"


def require_onnxruntime(installed: str | None, wanted: str | None, needed_by: str) -> None:
    """The one minimum-version check (a bundle's ``min_onnxruntime``, `bundle make`'s
    own): raise unless onnxruntime ``installed`` is there and at least ``wanted`` (None:
    any). An installed version of its own naming passes: its graphs decide."""
    if installed is None:
        raise EngineUnavailableError(
            f"{needed_by} runs on ONNX Runtime, which is not installed: `{ORT_INSTALL_HINT}`")
    if not wanted:
        return
    try:
        have = parse_version(installed)
    except ValueError:
        return
    if have < parse_version(wanted):
        raise EngineUnavailableError(f"onnxruntime {installed} is installed; "
                                     f"{upgrade_hint(wanted, needed_by)}")


def check_onnxruntime_target(details: dict, host: HostInfo, device: int = 0) -> None:
    """Raise unless onnxruntime is installed (and at least ``min_onnxruntime`` if set)."""
    require_onnxruntime(host.onnxruntime_version, details.get("min_onnxruntime"),
                        "this bundle")
