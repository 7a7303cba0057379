"""Host memory copies that a single thread makes slow: a batch of float32 images is tens of
megabytes, and one thread's memcpy of 34 MB (batch 32 at 3x299x299) takes longer than the
GPU needs to run the batch. numpy releases the GIL while it copies plain dtypes, so a
copy split along the batch axis over a few threads runs at the memory system's speed.
"""

from __future__ import annotations

import functools
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np

from runtime_py.compat import usable_cores

#: Below this many bytes one thread is faster than handing chunks to others.
PARALLEL_MIN_BYTES = 4 << 20
#: A default split gives each thread at least this much: on the H200's host (16 cores,
#: ~11.5 GB/s for one thread's memcpy) 8.6 MB took 0.37 ms over 4 threads and 0.48 ms
#: over 8; 34 MB 1.08 ms over 4 and 0.98 over 8 (docs/measurements/h200-2026-12-02-d).
MIN_CHUNK_BYTES = 2 << 20
MAX_THREADS = 8

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


@functools.lru_cache(maxsize=None)
def copy_threads() -> int:
    """Threads a large copy is split over: up to 8, never more than the cores this process
    may use, and 1 on a machine of one or two cores (they are busy with the rest). Read
    once: every batch asks."""
    cores = usable_cores()
    return 1 if cores <= 2 else min(MAX_THREADS, cores // 2)


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(MAX_THREADS, thread_name_prefix="trt-bundle-copy")
        return _pool


def copy_rows(dst: np.ndarray, src: np.ndarray, threads: int | None = None,
              on_chunk: Callable[[int, int], None] | None = None) -> None:
    """``dst[...] = src`` (same shape and dtype, no casting), split over ``threads``
    (default ``copy_threads()``, fewer where a thread would get less than
    ``MIN_CHUNK_BYTES``) along the first axis when the copy is large.

    ``on_chunk(first_row, rows)`` is called on this thread for each chunk as soon as it
    and every chunk before it are copied, in row order (once, for all rows, when the copy
    is not split): a caller can start sending the first rows (e.g. an async H2D copy)
    while the threads still copy the last ones. The copy is finished when this returns,
    also when ``on_chunk`` raised."""
    if dst.shape != src.shape:
        raise ValueError(f"copy_rows: shapes differ ({dst.shape} vs {src.shape})")
    if threads is None:
        threads = min(copy_threads(), max(1, dst.nbytes // MIN_CHUNK_BYTES))
    threads = int(threads)
    rows = dst.shape[0] if dst.ndim else 1
    if threads <= 1 or rows < 2 or dst.nbytes < PARALLEL_MIN_BYTES:
        np.copyto(dst, src, casting="no")
        if on_chunk is not None:
            on_chunk(0, rows)
        return
    parts = min(threads, rows)
    bounds = [rows * i // parts for i in range(parts + 1)]
    chunks = [(a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
    futures = [_executor().submit(np.copyto, dst[a:b], src[a:b], casting="no")
               for a, b in chunks]
    try:
        for (a, b), f in zip(chunks, futures):
            f.result()
            if on_chunk is not None:
                on_chunk(a, b - a)
    finally:
        for f in futures:      # never return while a thread still writes ``dst``
            f.exception()


def byte_range(arr: np.ndarray) -> tuple[int, int]:
    """[start, end) addresses of the memory ``arr`` can touch."""
    start = lo = hi = int(arr.__array_interface__["data"][0])
    if arr.size == 0:
        return start, start
    if arr.flags.c_contiguous:     # (asked on every infer call: the loop costs microseconds)
        return start, start + arr.nbytes
    for dim, stride in zip(arr.shape, arr.strides):
        span = (dim - 1) * stride
        lo, hi = (lo + span, hi) if span < 0 else (lo, hi + span)
    return lo, hi + arr.itemsize


class HostBufferRegistry:
    """Remembers arrays handed out as buffers (e.g. over pinned memory), so that an array
    given back can be recognised as lying inside one and used in place. The arrays are held
    weakly: a buffer the caller dropped (with every view of it) is forgotten. Register the
    array the caller gets, never a temporary that owns the memory (a torch tensor behind
    ``tensor.numpy()`` is collected at once while its array lives on)."""

    def __init__(self) -> None:
        import weakref

        self._weakref = weakref.ref
        self._blocks: list[tuple[int, int, object]] = []
        self._lock = threading.Lock()

    def add(self, arr: np.ndarray) -> None:
        lo, hi = byte_range(arr)
        with self._lock:
            self._blocks = [b for b in self._blocks if b[2]() is not None]
            self._blocks.append((lo, hi, self._weakref(arr)))

    def owner_of(self, arr: np.ndarray) -> np.ndarray | None:
        """The live registered array whose memory holds all of ``arr``, or None."""
        lo, hi = byte_range(arr)
        with self._lock:
            for start, end, ref in self._blocks:
                if start <= lo and hi <= end:
                    owner = ref()
                    if owner is not None:
                        return owner
        return None


def gather_rows(dst: np.ndarray, parts: list[np.ndarray]) -> np.ndarray:
    """Write ``parts`` one after another along the first axis into ``dst`` (e.g. many
    requests' rows into one batch buffer); returns ``dst[:rows written]``. Same dtype and
    row shape required, never a cast.

    The copy holds the GIL throughout (memcpy through memoryviews), because both ways of
    sharing it out cost more than they gain in a serving process:
    - numpy releases the GIL for each copy, and a thread that gives the GIL away waits to
      get it back while another thread runs Python (an event loop, client threads): up
      to the interpreter's switch interval, 5 ms, per copy. On 2 cores with one thread
      spinning in Python, 32 rows of a uint8 299x299x3 batch took 110 ms over threads and
      43 ms in a loop of ``np.copyto``, against 0.3-0.9 ms here.
    - one ``torch.cat`` releases the GIL once, but wakes torch's intra-op threads, which
      spin after each call: on the H200 the serving process went from 1.6 to 14.8 busy
      cores and every path lost 30-60% (docs/measurements/h200-2026-12-02-b, call 4).
    A part that is not C-contiguous (rare: requests are built from bytes) is copied by
    numpy.
    """
    n = 0
    for part in parts:
        if part.dtype != dst.dtype or part.shape[1:] != dst.shape[1:]:
            raise ValueError(f"gather_rows: part {part.dtype}{list(part.shape)} does not fit "
                             f"buffer rows {dst.dtype}{list(dst.shape[1:])}")
        n += part.shape[0]
    if n > dst.shape[0]:
        raise ValueError(f"gather_rows: {n} rows do not fit a buffer of {dst.shape[0]}")
    out = dst[:n]
    flat = memoryview(out).cast("B") if out.flags.c_contiguous and out.size else None
    at = row = 0
    for part in parts:
        rows, size = part.shape[0], part.nbytes
        if size and flat is not None and part.flags.c_contiguous:
            flat[at:at + size] = memoryview(part).cast("B")
        elif size:
            np.copyto(out[row:row + rows], part, casting="no")
        at += size
        row += rows
    return out


def copy_held(arr: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of ``arr`` made as `gather_rows` copies (without giving the GIL
    away): for the small copies on a batch's completion path (its outputs out of a reused
    buffer), where waiting to take the GIL back would cost more than the copy."""
    if arr.ndim == 0:
        return arr.copy()
    out = np.empty(arr.shape, arr.dtype)
    if arr.flags.c_contiguous and arr.size:    # (every infer's outputs: the short way)
        memoryview(out).cast("B")[:] = memoryview(arr).cast("B")
        return out
    return gather_rows(out, [arr])


