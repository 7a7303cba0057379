"""A file's identity and size from stat(2) called without giving the GIL away.

Why: ``os.stat`` releases the GIL for the system call, and a thread that gives the GIL away
must take it back: in a serving process whose batcher threads hold it while they enqueue a
batch (``engines/cudart_held.py`` says why they do), that wait is up to the time of an
enqueue or the interpreter's switch interval, against a system call of a microsecond or
two. The engine's event loop checks a client's shared-memory region this way on every
request (``server/shm.py``), and every request crosses that loop.

The call goes through ``ctypes.PyDLL`` (which keeps the GIL) into the C library's
``stat``. Only the fields at offsets that are the same in glibc's ``struct stat`` on
x86_64 and aarch64 are read (``st_dev`` 0, ``st_ino`` 8, ``st_size`` 48), and the binding
is used only after it agreed with ``os.stat`` on a known file; anywhere else (another
platform or C library, an older glibc without a ``stat`` symbol) ``os.stat`` is used.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
import threading
from typing import Callable, NamedTuple


class FileStat(NamedTuple):
    dev: int
    ino: int
    size: int


_MACHINES = ("x86_64", "aarch64")


class _StatBuffer(ctypes.Structure):
    """The fields read of glibc's struct stat (the same offsets on x86_64 and aarch64:
    dev 0, ino 8, size 48), in a buffer larger than the struct (144 and 128 bytes)."""

    _fields_ = [("dev", ctypes.c_uint64), ("ino", ctypes.c_uint64), ("_gap", ctypes.c_char * 32),
                ("size", ctypes.c_int64), ("_rest", ctypes.c_char * 200)]

_lock = threading.Lock()
_bound: "Callable[[str | bytes], FileStat | None] | None | bool" = False   # False: not tried yet


def os_stat(path: str | bytes) -> FileStat | None:
    """``os.stat``'s answer (None where the path cannot be stat'ed); the fallback."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return FileStat(st.st_dev, st.st_ino, st.st_size)


def _libc_stat() -> Callable[[str | bytes], FileStat | None] | None:
    if sys.platform != "linux" or platform.machine() not in _MACHINES:
        return None
    try:
        fn = ctypes.PyDLL(None).stat        # glibc >= 2.33 exports it
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_char_p, ctypes.POINTER(_StatBuffer)], ctypes.c_int
    local = threading.local()

    def held(path: str | bytes) -> FileStat | None:
        buf = getattr(local, "buf", None)
        if buf is None:
            buf = local.buf = _StatBuffer()
        if fn(path if isinstance(path, bytes) else os.fsencode(path), buf) != 0:
            return None
        return FileStat(buf.dev, buf.ino, buf.size)

    probe = os.path.abspath(__file__)
    expected = os_stat(probe)
    try:
        agrees = expected is not None and held(probe) == expected
    except (OSError, ValueError, ctypes.ArgumentError):
        agrees = False
    return held if agrees else None


def stat_function() -> Callable[[str | bytes], FileStat | None]:
    """The GIL-keeping stat where it is bound and checked, else ``os_stat``."""
    global _bound
    with _lock:
        if _bound is False:
            _bound = _libc_stat()
        return _bound or os_stat  # type: ignore[return-value]


def stat_held(path: str | bytes) -> FileStat | None:
    """(device, inode, size) of ``path``, or None where it cannot be stat'ed (missing,
    no permission)."""
    return stat_function()(path)
