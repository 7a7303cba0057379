"""TensorRT runner: deserialize the bundle's plan and run it with preallocated memory.

Design (after polygraphy's TrtRunner, minus its generality):

* `activate` checks the manifest's record of the plan against this host
  (`check_tensorrt_target` in `tensorrt_compat.py`) *before* deserializing, so a mismatch
  is one clear sentence, then deserializes `engine.plan`.
* Device buffers for every IO tensor, sized for the plan's max batch, and pinned host
  buffers of the same sizes are allocated once with cuda-python (`cudaMalloc`,
  `cudaHostAlloc`): `infer` never allocates. One non-blocking stream per runner.
* `infer`: copy inputs into pinned memory, H2D async, `execute_async_v3`, D2H async,
  synchronize, copy outputs out of pinned memory (the pinned buffers are reused). A feed
  that lies in pinned memory from `input_buffers()` is copied to the device in place.
* `infer_async` (the batcher's path): two batches in flight on copy-in, compute and
  copy-out streams with events (`engines/cuda_pipeline.py`, the torch-aoti runner's
  design in cuda-python): the copies of the next and the previous batch overlap the plan's
  run of the current one; feeds from `input_buffers()` are read in place.
* CUDA graphs (option `cuda_graphs=True`, the default): captured lazily the first time a
  batch size is seen. A captured graph bakes in the kernels' shapes and the addresses
  of the IO buffers and the activation memory, so each captured batch size gets its own
  execution context (all sharing one activation buffer where TensorRT allows user-managed
  memory: contexts run one at a time on the one stream). Before capture, one plain
  `execute_async_v3` runs after setting the shape (TensorRT does shape-dependent setup on
  the first enqueue after a shape change, which must not be captured). A batch size whose
  capture fails falls back to plain execution, recorded in `graph_failures`.

TensorRT and cuda-python are imported in `activate`, never at module import.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import numpy as np

from runtime_py.compat import import_cudart, probe_host
from runtime_py.engines.cuda_pipeline import CudaPipeline, IOSpec
from runtime_py.engines.tensorrt_compat import check_tensorrt_target
from runtime_py.engines.base import Runner, require_own_engine
from runtime_py.hostcopy import copy_rows
from runtime_py.pending import Pending
from runtime_py.errors import (
    BundleError,
    CompatibilityError,
    EngineUnavailableError,
    InferenceInputError,
)


def import_tensorrt():
    try:
        import tensorrt
    except ImportError as exc:
        raise EngineUnavailableError(
            f"this bundle's engine is a TensorRT plan, and TensorRT is not importable ({exc}): "
            "install it with `pip install 'trt-bundle[trt]'`, or run the bundle's ONNX with "
            "`--backend onnxruntime`") from None
    return tensorrt


class CudaError(BundleError):
    """A CUDA runtime call failed while running a TensorRT plan."""


class _Cuda:
    """The few cuda-python runtime calls we use, with errors turned into exceptions."""

    def __init__(self) -> None:
        self.rt = import_cudart()

    def check(self, result: Any, what: str) -> Any:
        err, *values = result if isinstance(result, tuple) else (result,)
        if err != self.rt.cudaError_t.cudaSuccess:
            _, text = self.rt.cudaGetErrorString(err)
            raise CudaError(f"{what} failed: {err.name} ({text.decode() if isinstance(text, bytes) else text})")
        if not values:
            return None
        return values[0] if len(values) == 1 else tuple(values)


class _Binding:
    """One IO tensor: its device buffer, its pinned host buffer (as numpy), max shape."""

    def __init__(self, name: str, is_input: bool, dtype: np.dtype, max_shape: tuple[int, ...],
                 device_ptr: int, host_ptr: int, nbytes: int) -> None:
        self.name = name
        self.is_input = is_input
        self.dtype = dtype
        self.max_shape = max_shape
        self.device_ptr = device_ptr
        self.host_ptr = host_ptr
        self.nbytes = nbytes
        raw = (ctypes.c_uint8 * nbytes).from_address(host_ptr)
        self.host = np.ctypeslib.as_array(raw).view(dtype)


class TensorRTRunner(Runner):
    """Options: device (int, default 0), cuda_graphs (bool, default True)."""

    backend = "tensorrt"

    def __init__(self, bundle, device: int = 0, cuda_graphs: bool = True,
                 **options: object) -> None:
        super().__init__(bundle, device=device, cuda_graphs=cuda_graphs, **options)
        self.device = int(device)
        self.use_cuda_graphs = bool(cuda_graphs)
        self.graph_failures: dict[int, str] = {}
        self._lock = threading.Lock()
        self._reset()

    @property
    def on_gpu(self) -> bool:
        return True

    def _reset(self) -> None:
        self._cuda: _Cuda | None = None
        self._engine = None
        self._runtime = None
        self._context = None
        self._bindings: dict[str, _Binding] = {}
        self._stream = None
        self._scratch: int | None = None
        self._graphs: dict[int, tuple[Any, Any, Any]] = {}   # batch -> (context, graph, exec)
        self._current_batch: int | None = None
        self._logger = None
        self._pipeline: CudaPipeline | None = None

    # -- activation -----------------------------------------------------------------
    def activate_impl(self) -> None:
        require_own_engine(self.bundle, "tensorrt", "a TensorRT plan")
        trt = import_tensorrt()
        cuda = _Cuda()
        details = self.bundle.manifest["engine"]["details"]
        host = probe_host(import_tensorrt=True)
        check_tensorrt_target(details, host, self.device)   # before touching the plan
        self._cuda = cuda
        try:
            self._activate(trt, cuda, details)
        except BaseException:
            self.deactivate_impl()
            raise

    def _activate(self, trt, cuda: _Cuda, details: dict) -> None:
        rt = cuda.rt
        cuda.check(rt.cudaSetDevice(self.device), f"cudaSetDevice({self.device})")
        plan = self.bundle.read_member("engine.plan")
        self._logger = _make_logger(trt)
        self._runtime = trt.Runtime(self._logger)
        if details.get("version_compatible"):
            # A version-compatible plan embeds the lean runtime that built it: TensorRT
            # runs that code only when host code is allowed. The bundle's sha256 checks
            # (read_member) are what makes trusting it reasonable.
            self._runtime.engine_host_code_allowed = True
        self._engine = self._runtime.deserialize_cuda_engine(plan)
        del plan
        if self._engine is None:
            raise CompatibilityError(
                f"TensorRT {trt.__version__} refused the plan (built with TensorRT "
                f"{details['tensorrt_version']} for compute capability "
                f"{details['compute_capability']}): "
                + ("; ".join(self._logger.errors) or "see the TensorRT log")
                + ". Rebuild it here with `bundle rebuild BUNDLE --backend tensorrt`.")
        self._stream = cuda.check(rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking),
                                  "cudaStreamCreateWithFlags")
        self._scratch_size = self._device_memory_size()
        if self._scratch_size:
            self._scratch = cuda.check(rt.cudaMalloc(self._scratch_size), "cudaMalloc(activations)")
        self._context = self._new_context(trt)
        self._allocate_bindings(trt, cuda)
        self._pipeline = CudaPipeline(cuda, self._stream, [
            IOSpec(b.name, b.is_input, b.dtype, b.max_shape[1:], b.device_ptr, b.max_shape[0])
            for b in self._bindings.values()])

    def _device_memory_size(self) -> int:
        """Activation memory one context needs (0: let TensorRT allocate per context)."""
        for attr in ("device_memory_size_v2", "device_memory_size"):
            size = getattr(self._engine, attr, None)
            if isinstance(size, int):
                return size
        return 0

    def _new_context(self, trt):
        """An execution context on the shared activation buffer when TensorRT allows
        user-managed memory (10.x/11.x `ExecutionContextAllocationStrategy.USER_MANAGED`),
        else one that allocates its own."""
        strategy = getattr(getattr(trt, "ExecutionContextAllocationStrategy", None),
                           "USER_MANAGED", None)
        context = None
        if strategy is not None and self._scratch is not None:
            try:
                context = self._engine.create_execution_context(strategy)
            except TypeError:
                context = None
            if context is not None:
                if hasattr(context, "set_device_memory"):
                    context.set_device_memory(self._scratch, self._scratch_size)
                else:
                    context.device_memory = self._scratch
        if context is None:
            context = self._engine.create_execution_context()
        if context is None:
            raise CudaError("TensorRT could not create an execution context (out of GPU "
                            "memory?): " + "; ".join(self._logger.errors))
        for b in self._bindings.values():
            context.set_tensor_address(b.name, b.device_ptr)
        return context

    def _allocate_bindings(self, trt, cuda: _Cuda) -> None:
        rt = cuda.rt
        engine, context = self._engine, self._context
        max_batch = self.max_batch_size
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        expected = {s.name for s in self.input_metadata()} | {s.name for s in self.output_metadata()}
        if set(names) != expected:
            raise CompatibilityError(
                f"the plan's IO tensors {sorted(names)} differ from the manifest's "
                f"{sorted(expected)}: the bundle is inconsistent, rebuild it")
        for name in inputs:
            shape = tuple(engine.get_tensor_shape(name))
            profile_max = tuple(engine.get_tensor_profile_shape(name, 0)[2])
            if profile_max[0] < max_batch:
                raise CompatibilityError(
                    f"the plan's profile allows batch {profile_max[0]} for {name!r} but the "
                    f"manifest promises {max_batch}: the bundle is inconsistent, rebuild it")
            context.set_input_shape(name, (max_batch, *shape[1:]))
        for name in names:
            is_input = name in inputs
            shape = tuple(context.get_tensor_shape(name))
            if any(d < 0 for d in shape):
                raise CompatibilityError(f"cannot size output {name!r}: shape {shape} is "
                                         "data-dependent, which this runner does not support")
            dtype = np.dtype(trt.nptype(engine.get_tensor_dtype(name)))
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            dev = cuda.check(rt.cudaMalloc(nbytes), f"cudaMalloc({name})")
            try:
                host = cuda.check(rt.cudaHostAlloc(nbytes, rt.cudaHostAllocDefault),
                                  f"cudaHostAlloc({name})")
            except BaseException:
                rt.cudaFree(dev)
                raise
            self._bindings[name] = _Binding(name, is_input, dtype, shape, int(dev), int(host),
                                            nbytes)
            context.set_tensor_address(name, int(dev))
        self._current_batch = max_batch

    # -- inference --------------------------------------------------------------------
    def infer_impl(self, feeds: dict[str, np.ndarray], n: int) -> dict[str, np.ndarray]:
        with self._lock:
            return self._infer(feeds, n)

    def _infer(self, feeds: dict[str, np.ndarray], n: int) -> dict[str, np.ndarray]:
        self._copy_inputs(n, self._stage_inputs(feeds))
        outputs = self._copy_outputs(self._run(n))
        self._cuda.check(self._cuda.rt.cudaStreamSynchronize(self._stream), "cudaStreamSynchronize")
        return {name: host[:count].reshape(shape).copy()
                for name, (host, count, shape) in outputs.items()}

    def _stage_inputs(self, feeds: dict[str, np.ndarray]) -> dict[str, int]:
        """Each input's host address for the H2D copy: the caller's own array where it lies
        in pinned memory from ``input_buffers`` (read in place), else the binding's pinned
        buffer after one copy into it (split over threads when large)."""
        sources = {}
        for b in self._bindings.values():
            if b.is_input:
                arr = feeds[b.name]
                ptr = self._pipeline.pinned_pointer(arr) if self._pipeline else None
                if ptr is None:
                    copy_rows(b.host[:arr.size].reshape(arr.shape), arr)
                    ptr = b.host_ptr
                sources[b.name] = ptr
        return sources

    def _copy_inputs(self, n: int, sources: dict[str, int] | None = None) -> None:
        """Enqueue the host -> device copies of batch ``n``'s inputs (from ``sources``,
        default the bindings' pinned buffers)."""
        cuda, rt = self._cuda, self._cuda.rt
        for b in self._bindings.values():
            if b.is_input:
                count = n * int(np.prod(b.max_shape[1:], dtype=np.int64))
                src = b.host_ptr if sources is None else sources[b.name]
                cuda.check(rt.cudaMemcpyAsync(b.device_ptr, src, count * b.dtype.itemsize,
                                              rt.cudaMemcpyKind.cudaMemcpyHostToDevice,
                                              self._stream), f"cudaMemcpyAsync(H2D {b.name})")

    def infer_async_impl(self, feeds: dict[str, np.ndarray], n: int) -> Pending:
        """Enqueue batch ``n`` on the pipeline (module docstring) and return at once."""
        with self._lock:
            return self._pipeline.enqueue(feeds, n, self._enqueue_plan)

    def _enqueue_plan(self, n: int) -> dict[str, tuple[int, ...]]:
        """The pipeline's compute step: the plan on batch ``n``, and its output shapes."""
        context = self._run(n)
        return {b.name: tuple(context.get_tensor_shape(b.name))
                for b in self._bindings.values() if not b.is_input}

    def allocate_host(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """Pinned memory (``cudaHostAlloc``) that ``infer`` and ``infer_async`` read in
        place; plain numpy memory before ``activate``."""
        if self._pipeline is None:
            return np.empty(shape, dtype)
        return self._pipeline.allocate_host(shape, dtype)

    def _copy_outputs(self, context) -> dict[str, tuple[np.ndarray, int, tuple[int, ...]]]:
        """Enqueue the device -> host copies of the outputs ``context`` describes."""
        cuda, rt = self._cuda, self._cuda.rt
        outputs = {}
        for b in self._bindings.values():
            if not b.is_input:
                shape = tuple(context.get_tensor_shape(b.name))
                count = int(np.prod(shape, dtype=np.int64))
                cuda.check(rt.cudaMemcpyAsync(b.host_ptr, b.device_ptr, count * b.dtype.itemsize,
                                              rt.cudaMemcpyKind.cudaMemcpyDeviceToHost,
                                              self._stream), f"cudaMemcpyAsync(D2H {b.name})")
                outputs[b.name] = (b.host, count, shape)
        return outputs

    def device_timings(self, batch_size: int, iterations: int = 200, warmup: int = 20
                       ) -> dict[str, list[float]]:
        """Per-iteration seconds under ``runtime_py.bench.DEVICE_TIMING_BOUNDARIES``: the
        plan alone on the batch already in its device buffers (a CUDA graph launch where
        captured), then with the pinned host copies around it; the runner's stream is
        synchronized every iteration. Inputs uniform in [-1, 1], as `bundle study` feeds
        ``infer``."""
        from runtime_py.bench import random_feeds, time_boundaries

        feeds = random_feeds(self.input_metadata(), int(batch_size))
        n = self.checked_batch(feeds)
        cuda, rt = self._cuda, self._cuda.rt

        def sync() -> None:
            cuda.check(rt.cudaStreamSynchronize(self._stream), "cudaStreamSynchronize")

        def engine_only() -> None:
            self._run(n)
            sync()

        def with_copies() -> None:
            self._copy_inputs(n)
            self._copy_outputs(self._run(n))
            sync()

        with self._lock:
            if self._pipeline is not None:
                self._pipeline.drain()     # nothing of infer_async may still be in flight
            self._copy_inputs(n, self._stage_inputs(feeds))   # (fresh feeds: staged)
            sync()
            return time_boundaries({"graph_replay": engine_only, "with_copies": with_copies},
                                   iterations, warmup)

    def _set_batch(self, context, n: int) -> None:
        for b in self._bindings.values():
            if b.is_input and not context.set_input_shape(b.name, (n, *b.max_shape[1:])):
                raise InferenceInputError(f"TensorRT refused batch {n} for input {b.name!r}")

    def _execute(self, context) -> None:
        if not context.execute_async_v3(int(self._stream)):
            raise CudaError("TensorRT execute_async_v3 failed: "
                            + ("; ".join(self._logger.errors[-3:]) or "see the TensorRT log"))

    def _run(self, n: int):
        """Enqueue the engine for batch n; return the context whose shapes describe it."""
        if self.use_cuda_graphs and n not in self.graph_failures:
            entry = self._graphs.get(n)
            if entry is None:
                entry = self._capture(n)
            if entry is not None:
                context, _graph, graph_exec = entry
                self._cuda.check(self._cuda.rt.cudaGraphLaunch(graph_exec, self._stream),
                                 "cudaGraphLaunch")
                return context
        if self._current_batch != n:
            self._set_batch(self._context, n)
            self._current_batch = n
        self._execute(self._context)
        return self._context

    def _capture(self, n: int):
        """Capture batch n's enqueue into a CUDA graph on a dedicated context (or None)."""
        import tensorrt as trt

        cuda, rt, stream = self._cuda, self._cuda.rt, self._stream
        context = None
        capturing = False
        try:
            context = self._new_context(trt)
            self._set_batch(context, n)
            # TensorRT does deferred shape-dependent work on the first enqueue after a
            # shape change; that enqueue must run outside the capture.
            self._execute(context)
            cuda.check(rt.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
            cuda.check(rt.cudaStreamBeginCapture(
                stream, rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal),
                "cudaStreamBeginCapture")
            capturing = True
            self._execute(context)
            capturing = False
            graph = cuda.check(rt.cudaStreamEndCapture(stream), "cudaStreamEndCapture")
            graph_exec = cuda.check(rt.cudaGraphInstantiate(graph, 0), "cudaGraphInstantiate")
        except Exception as exc:  # any failure: this batch size runs without a graph
            if capturing:
                rt.cudaStreamEndCapture(stream)   # leave capture mode; discard the graph
            self.graph_failures[n] = str(exc)
            context = None            # the failed capture's context is released here
            return None
        self._graphs[n] = (context, graph, graph_exec)
        return self._graphs[n]

    # -- deactivation -----------------------------------------------------------------
    def deactivate_impl(self) -> None:
        cuda = self._cuda
        if cuda is not None:
            rt = cuda.rt
            if self._pipeline is not None:
                self._pipeline.close()      # its batches read out, its memory freed
                self._pipeline = None
            if self._stream is not None:
                rt.cudaStreamSynchronize(self._stream)
            for _context, graph, graph_exec in self._graphs.values():
                rt.cudaGraphExecDestroy(graph_exec)
                rt.cudaGraphDestroy(graph)
            self._graphs.clear()
            # Contexts and the engine go before the memory they point into.
            self._context = None
            self._engine = None
            self._runtime = None
            for b in self._bindings.values():
                b.host = None
                rt.cudaFreeHost(b.host_ptr)
                rt.cudaFree(b.device_ptr)
            if self._scratch is not None:
                rt.cudaFree(self._scratch)
            if self._stream is not None:
                rt.cudaStreamDestroy(self._stream)
        self._reset()


def _make_logger(trt):
    """A trt.ILogger that keeps error messages for our exceptions and drops the rest."""

    class _Logger(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.errors: list[str] = []

        def log(self, severity, msg) -> None:  # noqa: A003 (TensorRT's name)
            if severity in (trt.ILogger.Severity.ERROR, trt.ILogger.Severity.INTERNAL_ERROR):
                self.errors.append(str(msg))

    return _Logger()
