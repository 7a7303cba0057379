"""The garbage collector's settings while a process serves.

Why: each request makes a few dozen short-lived containers (a message's dicts and lists,
a future, its reply), and CPython's cyclic collector runs a young-generation pass every
700 allocations net, and every tenth pass of a generation walks the next one, up to the
whole heap (with torch loaded, hundreds of thousands of objects). On the engine process's
event loop, the one point every request crosses twice (``workers.py``), the settings here
take its CPU per request from 14.9 to 13.9 us (``benchmarks/engine_loop_bench.py``, both
interleaved in one run on the 2-core host, with and without torch and a timm model
loaded: 0.93-0.94x) and remove the slow outliers (a full collection within a batch).
Serving keeps its long-lived objects (models, modules, the batcher) for its whole life, so
they are frozen out of the collector's walks (``gc.freeze``), and the young generation is
collected less often. Reference counting still frees every object that is not in a cycle
at once; cycles made while serving are still collected.

Settings are process-wide: ``serving_gc`` counts its users (two servers in one process, as
in tests) and restores the settings when the last one leaves.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from typing import Iterator

#: Net allocations between young-generation collections while serving (CPython's default
#: is 700): a batch of 32 requests stays well inside one interval.
SERVING_GEN0_THRESHOLD = 10_000

_lock = threading.Lock()
_users = 0
_saved: tuple[int, ...] | None = None


@contextlib.contextmanager
def serving_gc() -> Iterator[None]:
    """Within: objects alive at entry frozen out of collections, the young generation
    collected every ``SERVING_GEN0_THRESHOLD`` allocations (never less often than the
    process already had it). Restored when the last user leaves."""
    global _users, _saved
    with _lock:
        if _users == 0:
            _saved = gc.get_threshold()
            gc.collect()          # what is garbage now is not frozen with the rest
            gc.freeze()
            gc.set_threshold(max(SERVING_GEN0_THRESHOLD, _saved[0]), *_saved[1:])
        _users += 1
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0 and _saved is not None:
                gc.set_threshold(*_saved)
                gc.unfreeze()
                _saved = None
