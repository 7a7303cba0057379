"""Runner lookup: backend name -> runner class, from the engine-target registry
(``runtime_py.targets``), imported only when asked for."""

from __future__ import annotations

from runtime_py.targets import NAMES as BACKENDS
from runtime_py.targets import get_target

__all__ = ["BACKENDS", "runner_class"]


def runner_class(backend: str):
    """The runner class for `backend` (importing its module, not its engine package)."""
    return get_target(backend).runner_class()
