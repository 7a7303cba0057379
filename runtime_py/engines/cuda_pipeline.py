"""Two batches in flight on a cuda-python engine (the TensorRT runner's data path).

Why: a runner that copies a batch in, runs it and copies it out on one stream leaves the
GPU idle while the host stages the next batch, and copies every feed through its one
pinned buffer. This is the torch-aoti runner's design (``engines/torch_aoti.py``) written
against the CUDA runtime of cuda-python, for engines that own their device buffers:

* Three non-blocking streams: copy-in, compute (the engine's own stream), copy-out; and
  ``SLOTS`` batch slots, each with pinned host staging and device staging for the inputs,
  device and pinned host memory for the outputs, and four events (staged, consumed,
  computed, done). ``enqueue`` puts the H2D copy of batch k+1 on the copy-in stream, the
  device copy into the engine's static input, the engine and the device copy of its
  outputs on the compute stream, and the D2H copy on the copy-out stream, ordered by the
  events: the copies of k+1 and k-1 overlap the engine on k. ``Pending.result()`` waits
  for the slot's last event only.
* Feeds that lie in pinned memory from ``allocate_host`` (the runner's ``input_buffers``)
  are copied to the device from where they are (no host copy); any other array is first
  copied into the slot's pinned staging, split over threads (``runtime_py.hostcopy``).
* A slot is reused only after its previous batch was read out (``resolve``), and its
  pinned input staging only after its previous H2D copy finished.

The engine is a callback (``compute``), so that everything here runs, and is tested, with
cuda-python and a GPU alone (tests/test_cuda_buffers.py: a device copy stands in for the
engine) and with a CPU stand-in for the CUDA runtime (tests/test_cuda_pipeline.py).
"""

from __future__ import annotations

import ctypes
import weakref
from typing import Any, Callable, Mapping

import numpy as np

from runtime_py.hostcopy import HostBufferRegistry, copy_rows
from runtime_py.pending import Pending, read_out

#: Batches in flight.
SLOTS = 2


class IOSpec:
    """One engine tensor as the pipeline moves it: name, direction, element type, the row
    shape (without the batch), and the static device buffer the engine reads or writes."""

    __slots__ = ("name", "is_input", "dtype", "row_shape", "device_ptr", "max_rows")

    def __init__(self, name: str, is_input: bool, dtype: np.dtype, row_shape: tuple[int, ...],
                 device_ptr: int, max_rows: int) -> None:
        self.name, self.is_input, self.dtype = name, is_input, np.dtype(dtype)
        self.row_shape, self.device_ptr, self.max_rows = tuple(row_shape), int(device_ptr), int(max_rows)

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.row_shape, dtype=np.int64)) * self.dtype.itemsize

    @property
    def max_bytes(self) -> int:
        return self.max_rows * self.row_bytes


def host_array(ptr: int, nbytes: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """A numpy array over ``nbytes`` of host memory at ``ptr`` (no copy)."""
    raw = (ctypes.c_uint8 * max(nbytes, 1)).from_address(ptr)
    return np.ctypeslib.as_array(raw)[:nbytes].view(dtype).reshape(shape)


class _Slot:
    """The buffers and events of one batch in flight."""

    def __init__(self) -> None:
        self.host: dict[str, tuple[int, np.ndarray]] = {}    # name -> (pinned ptr, array)
        self.device: dict[str, int] = {}                     # name -> device staging ptr
        self.events: dict[str, Any] = {}
        self.pending: Pending | None = None


class CudaPipeline:
    """The streams, slots and copies of ``SLOTS`` batches in flight (module docstring).

    ``cuda``: the runner's ``_Cuda`` (its ``rt`` module and ``check``); ``stream``: the
    compute stream the engine is enqueued on; ``io``: the engine's tensors (``IOSpec``).
    """

    def __init__(self, cuda: Any, stream: Any, io: list[IOSpec], slots: int = SLOTS) -> None:
        self.cuda, self.rt, self.stream, self.io = cuda, cuda.rt, stream, list(io)
        self.pinned = HostBufferRegistry()
        self._owned: list[tuple[str, int]] = []       # (kind, pointer) to free on close
        self._slots: list[_Slot] = []
        self._next = 0
        self.in_stream = self.out_stream = None
        try:
            self.in_stream = self._stream()
            self.out_stream = self._stream()
            self._slots = [self._new_slot() for _ in range(slots)]
        except BaseException:
            self.close()
            raise

    # -- resources -----------------------------------------------------------------------
    def _stream(self):
        rt = self.rt
        return self.cuda.check(rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking),
                               "cudaStreamCreateWithFlags")

    def _host(self, nbytes: int) -> int:
        ptr = int(self.cuda.check(self.rt.cudaHostAlloc(max(nbytes, 1), self.rt.cudaHostAllocDefault),
                                  f"cudaHostAlloc({nbytes})"))
        self._owned.append(("host", ptr))
        return ptr

    def _device(self, nbytes: int) -> int:
        ptr = int(self.cuda.check(self.rt.cudaMalloc(max(nbytes, 1)), f"cudaMalloc({nbytes})"))
        self._owned.append(("device", ptr))
        return ptr

    def _new_slot(self) -> _Slot:
        rt, slot = self.rt, _Slot()
        for spec in self.io:
            ptr = self._host(spec.max_bytes)
            slot.host[spec.name] = (ptr, host_array(ptr, spec.max_bytes, spec.dtype,
                                                    (spec.max_rows, *spec.row_shape)))
            slot.device[spec.name] = self._device(spec.max_bytes)
        for name in ("staged", "consumed", "computed", "done"):
            event = self.cuda.check(rt.cudaEventCreateWithFlags(rt.cudaEventDisableTiming),
                                    "cudaEventCreateWithFlags")
            self._owned.append(("event", event))
            slot.events[name] = event
        return slot

    def allocate_host(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """Pinned host memory as a numpy array that ``enqueue`` reads in place; freed when
        the array and every view of it are gone."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        rt, check = self.rt, self.cuda.check
        ptr = int(check(rt.cudaHostAlloc(max(nbytes, 1), rt.cudaHostAllocDefault),
                        f"cudaHostAlloc({nbytes})"))
        raw = (ctypes.c_uint8 * max(nbytes, 1)).from_address(ptr)
        weakref.finalize(raw, rt.cudaFreeHost, ptr)      # raw is the arrays' base
        arr = np.ctypeslib.as_array(raw)[:nbytes].view(dtype).reshape(shape)
        self.pinned.add(arr)
        return arr

    def close(self) -> None:
        """Read out the batches in flight, wait for the streams, then free what the
        pipeline allocated."""
        rt = self.rt
        self.drain()
        for stream in (self.in_stream, self.stream, self.out_stream):
            if stream is not None:
                rt.cudaStreamSynchronize(stream)
        for slot in self._slots:
            slot.host = {}
        free = {"host": rt.cudaFreeHost, "device": rt.cudaFree, "event": rt.cudaEventDestroy}
        for kind, ptr in reversed(self._owned):
            free[kind](ptr)
        self._owned, self._slots = [], []
        for stream in (self.in_stream, self.out_stream):
            if stream is not None:
                rt.cudaStreamDestroy(stream)
        self.in_stream = self.out_stream = None

    # -- one batch -----------------------------------------------------------------------
    @staticmethod
    def resolve(slot: _Slot) -> None:
        """Read out the slot's previous batch (into its Pending) before the slot is reused."""
        read_out(slot.pending)
        slot.pending = None

    def drain(self) -> None:
        """Read out every batch in flight."""
        for slot in self._slots:
            self.resolve(slot)

    def pinned_pointer(self, arr: np.ndarray) -> int | None:
        """The address of ``arr`` when it is C-contiguous inside pinned memory from
        ``allocate_host`` (the H2D copy may read it in place), else None."""
        if arr.flags.c_contiguous and self.pinned.owner_of(arr) is not None:
            return int(arr.__array_interface__["data"][0])
        return None

    def enqueue(self, feeds: Mapping[str, np.ndarray], n: int,
                compute: Callable[[int], Mapping[str, tuple[int, ...]]]) -> Pending:
        """Start batch ``n`` of ``feeds`` (checked by the caller); ``compute(n)`` enqueues
        the engine on the compute stream (reading the static input buffers, writing the
        static output ones) and returns each output's shape. Call under the runner's lock."""
        rt, check = self.rt, self.cuda.check
        h2d, d2d, d2h = (rt.cudaMemcpyKind.cudaMemcpyHostToDevice,
                         rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice,
                         rt.cudaMemcpyKind.cudaMemcpyDeviceToHost)
        slot = self._slots[self._next]
        self._next = (self._next + 1) % len(self._slots)
        self.resolve(slot)
        ev = slot.events
        inputs = [s for s in self.io if s.is_input]
        # copy-in stream: the caller's pinned array, or the slot's staging, to the device
        check(rt.cudaStreamWaitEvent(self.in_stream, ev["consumed"], 0), "cudaStreamWaitEvent")
        staged_synced = False
        for spec in inputs:
            arr = feeds[spec.name]
            nbytes = n * spec.row_bytes
            src = self.pinned_pointer(arr)
            if src is None:
                if not staged_synced:          # the previous H2D from this staging is done
                    check(rt.cudaEventSynchronize(ev["staged"]), "cudaEventSynchronize")
                    staged_synced = True
                ptr, staging = slot.host[spec.name]
                copy_rows(staging[:n], arr)
                src = ptr
            check(rt.cudaMemcpyAsync(slot.device[spec.name], src, nbytes, h2d, self.in_stream),
                  f"cudaMemcpyAsync(H2D {spec.name})")
        check(rt.cudaEventRecord(ev["staged"], self.in_stream), "cudaEventRecord")
        # compute stream: into the engine's static inputs, the engine, out of its outputs
        check(rt.cudaStreamWaitEvent(self.stream, ev["staged"], 0), "cudaStreamWaitEvent")
        for spec in inputs:
            check(rt.cudaMemcpyAsync(spec.device_ptr, slot.device[spec.name], n * spec.row_bytes,
                                     d2d, self.stream), f"cudaMemcpyAsync(D2D {spec.name})")
        check(rt.cudaEventRecord(ev["consumed"], self.stream), "cudaEventRecord")
        shapes = dict(compute(n))
        outputs = []
        for spec in self.io:
            if spec.is_input:
                continue
            shape = tuple(int(d) for d in shapes[spec.name])
            nbytes = int(np.prod(shape, dtype=np.int64)) * spec.dtype.itemsize
            if nbytes > spec.max_bytes:
                raise ValueError(f"output {spec.name!r} of shape {shape} is larger than its "
                                 f"buffer ({spec.max_bytes} bytes)")
            check(rt.cudaMemcpyAsync(slot.device[spec.name], spec.device_ptr, nbytes, d2d,
                                     self.stream), f"cudaMemcpyAsync(D2D {spec.name})")
            outputs.append((spec, shape, nbytes))
        check(rt.cudaEventRecord(ev["computed"], self.stream), "cudaEventRecord")
        # copy-out stream
        check(rt.cudaStreamWaitEvent(self.out_stream, ev["computed"], 0), "cudaStreamWaitEvent")
        for spec, _shape, nbytes in outputs:
            check(rt.cudaMemcpyAsync(slot.host[spec.name][0], slot.device[spec.name], nbytes, d2h,
                                     self.out_stream), f"cudaMemcpyAsync(D2H {spec.name})")
        check(rt.cudaEventRecord(ev["done"], self.out_stream), "cudaEventRecord")
        done, host = ev["done"], slot.host

        def wait() -> dict[str, np.ndarray]:
            check(rt.cudaEventSynchronize(done), "cudaEventSynchronize")
            result = {}
            for spec, shape, nbytes in outputs:
                flat = host[spec.name][1].reshape(-1).view(np.uint8)[:nbytes]
                result[spec.name] = flat.view(spec.dtype).reshape(shape).copy()
            return result

        slot.pending = Pending(wait)
        return slot.pending
