"""Host memory page-locked where it lies (``cudaHostRegister``), so that a GPU engine copies
a request's rows to the device straight from it.

Why: behind front-end workers, a request's tensor arrives in a block of the worker's
arena, shared with the engine process. Gathering a batch's rows from there into a pinned
staging buffer is a host copy of the whole batch (8.6 MB for 32 uint8 299x299x3 images:
1.2-2.0 ms on the H200, with the GIL held, while the engine's event loop waits). With the
arena page-locked, the device's copy engine reads each row where it is: one
``cudaMemcpyAsync`` per request instead (microseconds to enqueue).

The registry is process-wide (page-locking is the process's, not a runner's): ``pin``
records a range, ``holds`` tells a runner whether an array lies inside one. A range must be
unpinned before its memory is unmapped.

``holds`` runs for every piece of every batch on the batcher's dispatch path, and a server
with shared-memory clients pins one range per client region (64 clients: 64 ranges, plus the
workers' arenas). The ranges are kept sorted by start (page-locked ranges never overlap: the
CUDA runtime refuses to register memory twice), so ``holds`` bisects instead of scanning:
with 72 ranges a scan cost ~10 us per piece on the 2-core CI host, 0.33 ms per batch of 32
shared-memory requests.
"""

from __future__ import annotations

import bisect
import logging
import threading
from typing import Any

import numpy as np

from runtime_py.hostcopy import byte_range

log = logging.getLogger("runtime_py.pinned_host")

_lock = threading.Lock()
#: (start, end) of every pinned range, sorted by start; replaced whole on change (with
#: ``_starts``, in one assignment of ``_index``), read without the lock
_ranges: tuple[tuple[int, int], ...] = ()
#: (the ranges' starts, the ranges): what ``holds`` reads, one consistent pair
_index: tuple[tuple[int, ...], tuple[tuple[int, int], ...]] = ((), ())


def _set_ranges(ranges) -> None:
    """Replace the registry (call with ``_lock`` held)."""
    global _ranges, _index
    _ranges = tuple(sorted(ranges))
    _index = (tuple(start for start, _ in _ranges), _ranges)


class PinnedRange:
    """One page-locked range; ``unpin()`` (idempotent) unlocks it."""

    def __init__(self, address: int, nbytes: int, runtime: Any) -> None:
        self.address, self.nbytes = address, nbytes
        self._runtime = runtime

    def unpin(self) -> None:
        with _lock:
            if self._runtime is None:
                return
            runtime, self._runtime = self._runtime, None
            _set_ranges(r for r in _ranges if r != (self.address, self.address + self.nbytes))
        try:
            runtime.host_unregister(self.address)
        except RuntimeError as e:   # the context is gone (process exit): nothing to unlock
            log.debug("unpinning %d bytes at %#x: %s", self.nbytes, self.address, e)


def buffer_address(buf: Any) -> int:
    """Where a writable buffer (an mmap, a bytearray) lies, without keeping an export of
    it (the buffer stays closable)."""
    view = np.frombuffer(buf, np.uint8, 1)
    try:
        return int(view.__array_interface__["data"][0])
    finally:
        del view


def pin(address: int, nbytes: int, runtime: Any = None) -> PinnedRange | None:
    """Page-lock ``nbytes`` at ``address`` through the CUDA runtime this process loaded
    (``runtime``: a ``cudart_held.CudartHeld``, found when None); None, with the reason
    logged, where there is none or the runtime refuses (the engine then copies such rows
    through its staging buffer, as before)."""
    if runtime is None:
        from runtime_py.engines import cudart_held
        runtime = cudart_held.find()
    if runtime is None or nbytes <= 0:
        return None
    try:
        runtime.host_register(address, nbytes)
    except RuntimeError as e:
        log.info("host memory not page-locked (%d bytes): %s", nbytes, e)
        return None
    with _lock:
        _set_ranges((*_ranges, (address, address + nbytes)))
    return PinnedRange(address, nbytes, runtime)


def holds(arr: np.ndarray) -> bool:
    """True when all of ``arr``'s memory lies in one pinned range."""
    if not _ranges:
        return False
    return holds_span(*byte_range(arr))


def holds_span(lo: int, hi: int) -> bool:
    """True when the addresses [lo, hi) lie in one pinned range (``holds`` for a caller
    that has an array's address already: reading it costs ~2 us)."""
    starts, ranges = _index
    i = bisect.bisect_right(starts, lo) - 1        # the last range starting at or before lo
    return i >= 0 and hi <= ranges[i][1]
