"""CUDA runtime calls that keep the GIL: enqueueing a batch without giving it away.

Why: every torch call that touches a stream (a copy, an event's record or wait, a graph
replay) releases the GIL and must take it back, and in a serving process whose event loop
runs Python each take waits until the loop gives the GIL up: up to the interpreter's switch
interval (5 ms) per call. Enqueueing one batch on three streams is a dozen such calls; on
the H200 the batcher's dispatch-to-started time was 3.2-6.7 ms against an engine that
needs 3.8 ms per batch (``benchmarks/serve_bench.py``'s timeline, docs/measurements/
h200-2026-12-02-b). The calls only enqueue work (microseconds each), so they are made
here through ``ctypes.PyDLL`` (which keeps the GIL) into the CUDA runtime library that
torch already loaded in this process: the same library, so the same context, streams,
events and graphs.

``find()`` returns None where that library cannot be found (a static runtime, not Linux),
and callers keep their torch calls.
"""

from __future__ import annotations

import ctypes
import os
import threading

#: cudaMemcpyKind values (the CUDA runtime API's, stable across versions).
HOST_TO_DEVICE = 1
DEVICE_TO_HOST = 2
DEVICE_TO_DEVICE = 3
#: cudaHostRegisterPortable
HOST_REGISTER_PORTABLE = 1

_lock = threading.Lock()
_found: "CudartHeld | None | bool" = False     # False: not looked for yet


def loaded_cudart_path(maps_text: str) -> str | None:
    """The path of the CUDA runtime library mapped into a process, from the text of its
    ``/proc/<pid>/maps`` (None when none is)."""
    for line in maps_text.splitlines():
        fields = line.split(None, 5)       # address perms offset dev inode [path]
        if len(fields) == 6 and os.path.basename(fields[5].strip()).startswith("libcudart.so"):
            return fields[5].strip()
    return None


class CudartHeld:
    """The few runtime calls that enqueue a batch, bound with ``ctypes.PyDLL``; each
    raises RuntimeError with the runtime's message on an error code."""

    def __init__(self, path: str) -> None:
        lib = ctypes.PyDLL(path)
        vp, sz, ui, i = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int
        self.path = path
        self._memcpy = self._bind(lib.cudaMemcpyAsync, [vp, vp, sz, i, vp])
        self._record = self._bind(lib.cudaEventRecord, [vp, vp])
        self._wait = self._bind(lib.cudaStreamWaitEvent, [vp, vp, ui])
        self._launch = self._bind(lib.cudaGraphLaunch, [vp, vp])
        self._host_register = self._bind(lib.cudaHostRegister, [vp, sz, ui])
        self._host_unregister = self._bind(lib.cudaHostUnregister, [vp])
        self._get_device = self._bind(lib.cudaGetDevice, [ctypes.POINTER(i)])
        self._set_device = self._bind(lib.cudaSetDevice, [i])
        self._error_string = lib.cudaGetErrorString
        self._error_string.argtypes, self._error_string.restype = [i], ctypes.c_char_p

    @staticmethod
    def _bind(fn, argtypes):
        fn.argtypes, fn.restype = argtypes, ctypes.c_int
        return fn

    def _check(self, code: int, what: str) -> None:
        if code:
            message = (self._error_string(code) or b"").decode(errors="replace")
            raise RuntimeError(f"{what} failed: CUDA error {code} ({message})")

    def memcpy(self, dst: int, src: int, nbytes: int, kind: int, stream: int) -> None:
        self._check(self._memcpy(dst, src, nbytes, kind, stream), "cudaMemcpyAsync")

    def record(self, event: int, stream: int) -> None:
        self._check(self._record(event, stream), "cudaEventRecord")

    def wait(self, stream: int, event: int) -> None:
        self._check(self._wait(stream, event, 0), "cudaStreamWaitEvent")

    def launch(self, graph_exec: int, stream: int) -> None:
        self._check(self._launch(graph_exec, stream), "cudaGraphLaunch")

    def host_register(self, address: int, nbytes: int) -> None:
        """Page-lock ``nbytes`` of this process's memory at ``address`` in place
        (cudaHostRegister, portable: every device's copies may read it)."""
        self._check(self._host_register(address, nbytes, HOST_REGISTER_PORTABLE),
                    "cudaHostRegister")

    def host_unregister(self, address: int) -> None:
        self._check(self._host_unregister(address), "cudaHostUnregister")

    def on_device(self, index: int) -> int:
        """Make ``index`` this thread's current device; return the one it replaced."""
        current = ctypes.c_int(0)
        self._check(self._get_device(ctypes.byref(current)), "cudaGetDevice")
        if current.value != index:
            self._check(self._set_device(index), "cudaSetDevice")
        return current.value


def find() -> CudartHeld | None:
    """The process's CUDA runtime, bound once (call after torch initialised CUDA)."""
    global _found
    with _lock:
        if _found is False:
            _found = None
            try:
                with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
                    path = loaded_cudart_path(f.read())
                if path is not None:
                    _found = CudartHeld(path)
            except (OSError, AttributeError):     # no /proc, a symbol missing
                _found = None
        return _found  # type: ignore[return-value]
