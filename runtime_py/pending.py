"""``Pending``: an inference started by ``infer_async``, waited for by ``result()``.

Its own module (standard library only) so that the batcher, which only needs this type,
imports nothing of the engines or the bundle reader.
"""

from __future__ import annotations

import threading
from typing import Callable

import numpy as np


class Pending:
    """An inference started by ``infer_async``: ``result()`` waits for it (once) and
    returns the outputs by name, or raises what the engine raised."""

    __slots__ = ("_wait", "_outputs", "_error", "_lock")

    def __init__(self, wait: Callable[[], dict[str, np.ndarray]] | None) -> None:
        self._wait = wait
        self._lock = threading.Lock()
        self._outputs: dict[str, np.ndarray] | None = None
        self._error: BaseException | None = None

    @classmethod
    def done(cls, outputs: dict[str, np.ndarray]) -> "Pending":
        p = cls(None)
        p._outputs = outputs
        return p

    @classmethod
    def failed(cls, error: BaseException) -> "Pending":
        p = cls(None)
        p._error = error
        return p

    @property
    def finished(self) -> bool:
        """True when ``result()`` has nothing left to wait for (an engine that computed in
        the call that started it, or a result already read)."""
        return self._wait is None

    def result(self) -> dict[str, np.ndarray]:
        """The outputs (the caller's own arrays); safe to call again and from any thread."""
        if self._wait is not None:
            with self._lock:
                if self._wait is not None:
                    try:
                        self._outputs = self._wait()
                    except BaseException as exc:
                        self._error = exc
                    self._wait = None
        if self._error is not None:
            raise self._error
        return self._outputs  # type: ignore[return-value]


def read_out(pending: "Pending | None") -> None:
    """Wait for ``pending`` (None: nothing to wait for) so that the buffers it reads may be
    reused; its outputs stay in it for its own caller, and so does its error (not raised
    here: it belongs to that caller). GPU runners call it before reusing a batch slot."""
    if pending is not None:
        try:
            pending.result()
        except Exception:
            pass
