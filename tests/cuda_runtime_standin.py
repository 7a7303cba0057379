"""A CPU stand-in for the few CUDA runtime calls of ``runtime_py.engines.cuda_pipeline``.

Not CUDA: "device" memory is host memory, and there is no GPU. What it keeps is the part
of CUDA's semantics a pipeline can get wrong: work on a stream runs in order, *later* than
it was enqueued, and only as far as something forces it (an event or stream
synchronization, or another stream waiting on an event). Copies are executed at the
latest moment CUDA allows, so a host buffer rewritten before the copy that reads it has
run gives the wrong bytes here too, as it would on a GPU that is busy. The call shapes are
cuda-python's (``cuda.bindings.runtime``): results are tuples whose first item is the
error code.
"""

from __future__ import annotations

import ctypes
import enum
import itertools


class cudaError_t(enum.IntEnum):  # noqa: N801 (cuda-python's name)
    cudaSuccess = 0
    cudaErrorInvalidValue = 1


class cudaMemcpyKind(enum.IntEnum):  # noqa: N801
    cudaMemcpyHostToHost = 0
    cudaMemcpyHostToDevice = 1
    cudaMemcpyDeviceToHost = 2
    cudaMemcpyDeviceToDevice = 3


class _Event:
    def __init__(self) -> None:
        self.latest: int | None = None     # the id of the last record enqueued


class _Stream:
    def __init__(self, number: int) -> None:
        self.number = number
        self.queue: list[tuple] = []

    def __int__(self) -> int:
        return self.number


class CudaRuntimeStandIn:
    """The ``rt`` of ``runtime_py.engines.tensorrt._Cuda`` (``standin_cuda()``)."""

    cudaError_t = cudaError_t
    cudaMemcpyKind = cudaMemcpyKind
    cudaStreamNonBlocking = 1
    cudaHostAllocDefault = 0
    cudaEventDisableTiming = 2

    def __init__(self) -> None:
        self._memory: dict[int, ctypes.Array] = {}
        self._ids = itertools.count(1)
        self._streams: list[_Stream] = []
        self._executed: set[int] = set()
        self.copies: list[tuple[int, int, int, cudaMemcpyKind]] = []   # executed, in order
        self.freed: list[int] = []
        self.live_events = 0

    # -- memory ------------------------------------------------------------------------
    def _alloc(self, nbytes: int):
        buf = (ctypes.c_uint8 * nbytes)()
        ptr = ctypes.addressof(buf)
        self._memory[ptr] = buf
        return cudaError_t.cudaSuccess, ptr

    def cudaMalloc(self, nbytes: int):  # noqa: N802 (cuda-python's names below)
        return self._alloc(nbytes)

    def cudaHostAlloc(self, nbytes: int, flags: int):  # noqa: N802
        return self._alloc(nbytes)

    def cudaFree(self, ptr: int):  # noqa: N802
        self.freed.append(ptr)
        return (cudaError_t.cudaSuccess,)

    cudaFreeHost = cudaFree

    def cudaGetErrorString(self, err):  # noqa: N802
        return cudaError_t.cudaSuccess, err.name.encode()

    # -- streams and events ------------------------------------------------------------
    def cudaStreamCreateWithFlags(self, flags: int):  # noqa: N802
        stream = _Stream(len(self._streams) + 1)
        self._streams.append(stream)
        return cudaError_t.cudaSuccess, stream

    def cudaStreamDestroy(self, stream):  # noqa: N802
        return (cudaError_t.cudaSuccess,)

    def cudaEventCreateWithFlags(self, flags: int):  # noqa: N802
        self.live_events += 1
        return cudaError_t.cudaSuccess, _Event()

    def cudaEventDestroy(self, event):  # noqa: N802
        self.live_events -= 1
        return (cudaError_t.cudaSuccess,)

    def cudaEventRecord(self, event: _Event, stream: _Stream):  # noqa: N802
        rid = next(self._ids)
        event.latest = rid
        stream.queue.append(("record", rid))
        return (cudaError_t.cudaSuccess,)

    def cudaStreamWaitEvent(self, stream: _Stream, event: _Event, flags: int):  # noqa: N802
        if event.latest is not None:          # an event never recorded is complete
            stream.queue.append(("wait", event.latest))
        return (cudaError_t.cudaSuccess,)

    def cudaMemcpyAsync(self, dst: int, src: int, nbytes: int, kind, stream: _Stream):  # noqa: N802
        stream.queue.append(("copy", int(dst), int(src), int(nbytes), kind))
        return (cudaError_t.cudaSuccess,)

    # -- making work run ---------------------------------------------------------------
    def _run_until(self, rid: int) -> None:
        """Run the least work that executes record ``rid``."""
        if rid in self._executed:
            return
        stream = next(s for s in self._streams if any(op[0] == "record" and op[1] == rid
                                                     for op in s.queue))
        while rid not in self._executed:
            self._step(stream)

    def _step(self, stream: _Stream) -> None:
        op = stream.queue[0]
        if op[0] == "wait" and op[1] not in self._executed:
            self._run_until(op[1])
            return
        stream.queue.pop(0)
        if op[0] == "record":
            self._executed.add(op[1])
        elif op[0] == "copy":
            _, dst, src, nbytes, kind = op
            ctypes.memmove(dst, src, nbytes)
            self.copies.append((dst, src, nbytes, kind))

    def cudaEventSynchronize(self, event: _Event):  # noqa: N802
        if event.latest is not None:
            self._run_until(event.latest)
        return (cudaError_t.cudaSuccess,)

    def cudaStreamSynchronize(self, stream: _Stream):  # noqa: N802
        while stream.queue:
            self._step(stream)
        return (cudaError_t.cudaSuccess,)

    def run_everything(self) -> None:
        for stream in self._streams:
            self.cudaStreamSynchronize(stream)


def standin_cuda():
    """The TensorRT runner's own ``_Cuda`` (its ``check``), over the stand-in runtime."""
    from runtime_py.engines.tensorrt import _Cuda

    cuda = _Cuda.__new__(_Cuda)        # (its __init__ imports cuda-python's runtime)
    cuda.rt = CudaRuntimeStandIn()
    return cuda
