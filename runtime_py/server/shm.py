"""The system shared-memory extension of the Triton protocol: regions clients register by
POSIX shared-memory key, and tensors read from / written to them by region + offset + size.

A client on the same host writes its input into ``/dev/shm/<key>``, registers the region
once, then sends only a reference; the server maps the region and hands the batcher a
numpy view of it (no copy through the socket). Outputs are written straight into the
client's region.

Safety rules, and why:
- Every reference is checked against the *registered* window (offset, byte_size) before
  any view is made, so a request can never read or write outside what was registered.
- Each request checks, at its start and again before writing its outputs, that the key
  still names the mapped file (same inode) and that the file
  is still long enough: a region the client unlinked or truncated is refused with a 400
  instead of reading stale memory or dying of SIGBUS on a shrunk mapping.
- Unregistering only drops the registry's reference: views held by requests in flight
  keep the mapping alive (numpy holds the buffer), and the mapping is unmapped when the
  last of them is gone. Unregistering while in use is therefore safe.
- For a GPU engine a region is page-locked where it lies (``pin``, ``cudaHostRegister``
  through the engine's CUDA runtime), so the device copies a request's rows from it
  directly instead of gathering them on the host. Views are made from one ctypes array
  over the mapping that carries the lock; the lock is released when that array goes, after
  the last view in flight (and so after the last device copy, which the batcher's request
  outlives) and before the mapping is unmapped.
- Keys are single path components under ``/dev/shm`` (a leading ``/`` as in shm_open);
  anything else is refused, so a key can never name another file.
"""

from __future__ import annotations

import ctypes
import math
import mmap
import os
import re
import threading
import weakref
from typing import Any, Callable, NamedTuple

import numpy as np

from ..stat_held import stat_function
from .protocol import RequestError

SHM_DIR = "/dev/shm"
#: Larger regions are not page-locked (locking pins all their pages in RAM at once).
PIN_MAX_BYTES = 256 << 20
_KEY = re.compile(r"^/?[A-Za-z0-9_.\-]{1,255}$")


class ShmRef(NamedTuple):
    """A tensor's place in a registered region, as a request gives it."""

    region: str
    offset: int
    byte_size: int


class _Region:
    __slots__ = ("name", "key", "offset", "byte_size", "path", "inode", "map", "buffer",
                 "path_bytes", "_stat")

    def __init__(self, name: str, key: str, offset: int, byte_size: int,
                 pin: Callable[[int, int], Any] | None = None) -> None:
        self.name, self.key, self.offset, self.byte_size = name, key, offset, byte_size
        self.path = os.path.join(SHM_DIR, key.lstrip("/"))
        self.path_bytes = os.fsencode(self.path)
        self._stat = stat_function()    # keeps the GIL: see check_alive
        try:
            fd = os.open(self.path, os.O_RDWR)
        except FileNotFoundError:
            raise RequestError(f"shared memory key {key!r} does not exist; create it "
                               f"(shm_open) before registering region {name!r}") from None
        except OSError as e:
            raise RequestError(f"cannot open shared memory key {key!r}: {e.strerror}") from None
        try:
            st = os.fstat(fd)
            if offset + byte_size > st.st_size:
                raise RequestError(
                    f"region {name!r}: offset {offset} + byte_size {byte_size} is beyond the "
                    f"{st.st_size} bytes of shared memory key {key!r}")
            self.inode = (st.st_dev, st.st_ino)
            self.map = mmap.mmap(fd, offset + byte_size, mmap.MAP_SHARED,
                                 mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        # what views are made from (see the module docstring: it carries the page lock)
        self.buffer = (ctypes.c_char * len(self.map)).from_buffer(self.map)
        if pin is not None and len(self.map) <= PIN_MAX_BYTES:
            locked = pin(ctypes.addressof(self.buffer), len(self.map))
            if locked is not None:
                weakref.finalize(self.buffer, locked.unpin)

    def status(self) -> dict:
        return {"name": self.name, "key": self.key, "offset": self.offset,
                "byte_size": self.byte_size}

    def check_alive(self) -> None:
        """Refuse a region whose key was unlinked, replaced or truncated since registering.

        Runs on the engine's event loop for every request, so the stat keeps the GIL
        (``runtime_py.stat_held``): ``os.stat`` gave it away and then waited for the
        batcher's threads to give it back."""
        st = self._stat(self.path_bytes)
        if st is None or (st.dev, st.ino) != self.inode:
            raise RequestError(f"shared memory region {self.name!r}: key {self.key!r} was "
                               f"removed or replaced; unregister and register it again")
        if st.size < self.offset + self.byte_size:
            raise RequestError(f"shared memory region {self.name!r}: key {self.key!r} was "
                               f"truncated to {st.size} bytes")


class ShmRegistry:
    """Registered system shared-memory regions by name; thread-safe."""

    def __init__(self, pin: Callable[[int, int], Any] | None = None) -> None:
        """``pin(address, nbytes)``: page-lock a region's mapping for the engine's device
        copies, returning what to ``unpin()`` (``Engine.pin_host``), or None."""
        self._regions: dict[str, _Region] = {}
        self._lock = threading.Lock()
        self._pin = pin

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        if not isinstance(name, str) or not name:
            raise RequestError("a shared memory region needs a non-empty name")
        if not isinstance(key, str) or not _KEY.match(key) or key.lstrip("/") in (".", ".."):
            raise RequestError(f"shared memory key {key!r} is not a valid shm_open name "
                               f"(one path component, letters, digits, '_', '.', '-')")
        for what, v in (("offset", offset), ("byte_size", byte_size)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise RequestError(f"region {name!r}: {what} must be a non-negative integer")
        with self._lock:
            if name in self._regions:
                raise RequestError(f"shared memory region {name!r} is already registered; "
                                   f"unregister it first", 409)
        region = _Region(name, key, offset, byte_size, self._pin)
        with self._lock:
            if name in self._regions:
                raise RequestError(f"shared memory region {name!r} is already registered", 409)
            self._regions[name] = region

    def unregister(self, name: str | None = None) -> None:
        """Forget one region (all when ``name`` is None or empty); unknown names are a no-op,
        as in Triton. Mappings close once the last view in flight is released."""
        with self._lock:
            if name:
                self._regions.pop(name, None)
            else:
                self._regions.clear()

    def status(self, name: str | None = None) -> list[dict]:
        with self._lock:
            if name:
                region = self._regions.get(name)
                if region is None:
                    raise RequestError(f"shared memory region {name!r} is not registered", 404)
                return [region.status()]
            return [r.status() for r in self._regions.values()]

    def names(self) -> list[str]:
        with self._lock:
            return list(self._regions)

    def view(self, ref: ShmRef, what: str, checked: set[str] | None = None) -> memoryview:
        """The bytes of ``ref`` inside its region, after every bounds check.

        ``checked``: names of regions whose key was found alive a moment ago, at the start
        of the same request (its input and its output windows: one stat of ``/dev/shm``
        per region instead of one per tensor); ``view`` adds to it. Writing the outputs
        after the batch checks again (no ``checked``): a key truncated meanwhile would
        otherwise be a SIGBUS."""
        with self._lock:
            region = self._regions.get(ref.region)
        if region is None:
            raise RequestError(f"{what}: shared memory region {ref.region!r} is not registered")
        off, size = ref.offset, ref.byte_size
        if not (isinstance(off, int) and isinstance(size, int)) or off < 0 or size < 0:
            raise RequestError(f"{what}: shared memory offset and byte size must be "
                               f"non-negative integers")
        if off + size > region.byte_size:
            raise RequestError(
                f"{what}: offset {off} + byte_size {size} is beyond the {region.byte_size} "
                f"bytes of shared memory region {ref.region!r}")
        if checked is None or ref.region not in checked:
            region.check_alive()
            if checked is not None:
                checked.add(ref.region)
        start = region.offset + off
        return memoryview(region.buffer)[start:start + size]

    def read(self, ref: ShmRef, dtype: np.dtype, shape: list[int], what: str,
             checked: set[str] | None = None) -> np.ndarray:
        """A zero-copy array over a registered region (the input of a request)."""
        need = math.prod(shape) * dtype.itemsize
        if ref.byte_size != need:
            raise RequestError(f"{what}: shared_memory_byte_size is {ref.byte_size} but shape "
                               f"{shape} of {dtype.name} needs {need} bytes")
        buf = self.view(ref, what, checked)
        arr = np.frombuffer(buf, dtype=dtype.newbyteorder("<")).reshape(shape)
        return arr if arr.dtype == dtype else arr.astype(dtype)

    def write(self, ref: ShmRef, array: np.ndarray, what: str,
              checked: set[str] | None = None) -> int:
        """Copy an output into a registered region; returns the bytes written."""
        data = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
        if data.nbytes > ref.byte_size:
            raise RequestError(f"{what}: the output has {data.nbytes} bytes but the shared "
                               f"memory window given holds {ref.byte_size}")
        buf = self.view(ref, what, checked)
        # a memcpy that keeps the GIL (numpy's copy of a few KB gives it away: the
        # engine's loop then waits for the batcher's threads, as ``check_alive`` explains)
        buf.cast("B")[:data.nbytes] = memoryview(data).cast("B")
        return data.nbytes

    def close(self) -> None:
        self.unregister(None)
