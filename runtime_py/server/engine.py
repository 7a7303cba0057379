"""The engine side of the server: models, their batchers, shared-memory regions, statistics
and metrics, behind one small async interface that every front-end (HTTP, gRPC) calls.

Front-ends parse a request into an ``InferCall`` (inline arrays, shared-memory
references, the outputs wanted) and ``await engine.infer(call)``. The same interface is
served in-process (``Engine``) or from another process (``workers.RemoteEngine``): with
several front-end worker processes there is still one engine, one batcher per model, one
shared-memory registry and one metrics registry, so nothing is counted per worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Any, Callable, Mapping, NamedTuple

import numpy as np

from ..batcher import Batcher, BatchStats
from ..errors import BatcherClosedError, QueueFullError, UsageError
from ..tensors import TensorSpec
from .metrics import ServerMetrics
from .protocol import OutputRequest, RequestError
from .shm import ShmRef, ShmRegistry


class ModelInfo(NamedTuple):
    """What a front-end needs to know of a served model (picklable-free: plain data)."""

    name: str
    version: str
    platform: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    max_batch_size: int        # the engine's
    batcher_max_batch: int     # what the batcher merges up to
    max_delay_ms: float
    random_weights: bool
    labels: list[str] | None

    @classmethod
    def of(cls, model: Any, batcher: Batcher) -> "ModelInfo":
        return cls(model.name, str(model.version), model.platform, list(model.inputs),
                   list(model.outputs), int(model.max_batch_size),
                   int(batcher.max_batch_size), batcher.max_delay_s * 1000.0,
                   is_random_weights(model), getattr(model, "labels", None))


def is_random_weights(model: Any) -> bool:
    """True for a bundle made with ``--random-weights`` (a smoke test, not a model)."""
    bundle = getattr(model, "bundle", None)
    manifest = getattr(bundle, "manifest", None) or {}
    return (manifest.get("source") or {}).get("kind") == "random-weights"


class ShmInput(NamedTuple):
    ref: ShmRef
    dtype: np.dtype
    shape: list[int]


class ShmOutput(NamedTuple):
    """An output the engine wrote into a client's region (instead of returning it)."""

    shape: tuple[int, ...]
    dtype: np.dtype
    ref: ShmRef


class InferCall(NamedTuple):
    """A parsed inference request, independent of HTTP or gRPC."""

    model: str
    version: str | None
    id: str | None
    feeds: dict[str, np.ndarray]
    shm_inputs: dict[str, ShmInput]
    outputs: list[OutputRequest]
    shm_outputs: dict[str, ShmRef]


class _Stats:
    """Triton-style per-model statistics, updated by the batcher listener and by infer."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.success = [0, 0]   # count, ns
        self.fail = [0, 0]
        self.queue = [0, 0]
        self.compute = [0, 0]
        self.inference_count = 0
        self.execution_count = 0
        self.last_inference_ms = 0
        self.batches: dict[int, list[int]] = {}

    def on_batch(self, s: BatchStats) -> None:
        ns = int(s.compute_s * 1e9)
        with self.lock:
            self.execution_count += 1
            self.inference_count += s.size
            self.compute[0] += s.requests
            self.compute[1] += ns
            self.queue[0] += len(s.queue_s)
            self.queue[1] += int(sum(s.queue_s) * 1e9)
            b = self.batches.setdefault(s.size, [0, 0])
            b[0] += 1
            b[1] += ns
            self.last_inference_ms = int(time.time() * 1000)

    def on_request(self, ok: bool, seconds: float) -> None:
        with self.lock:
            acc = self.success if ok else self.fail
            acc[0] += 1
            acc[1] += int(seconds * 1e9)

    def as_dict(self, name: str, version: str) -> dict:
        def d(acc):
            return {"count": acc[0], "ns": acc[1]}
        with self.lock:
            return {
                "name": name, "version": version,
                "last_inference": self.last_inference_ms,
                "inference_count": self.inference_count,
                "execution_count": self.execution_count,
                "inference_stats": {"success": d(self.success), "fail": d(self.fail),
                                    "queue": d(self.queue), "compute_input": d([0, 0]),
                                    "compute_infer": d(self.compute),
                                    "compute_output": d([0, 0])},
                "batch_stats": [{"batch_size": k, "compute_infer": d(v)}
                                for k, v in sorted(self.batches.items())],
            }


def lookup_info(infos: Mapping[str, ModelInfo], name: str, version: str | None) -> ModelInfo:
    """The served model ``name`` (at ``version`` when given), or a 404 naming what is served."""
    info = infos.get(name)
    if info is None:
        raise RequestError(f"unknown model {name!r}; served: {sorted(infos)}", 404)
    if version not in (None, "") and version != info.version:
        raise RequestError(
            f"model {name!r} has no version {version!r}; available: [{info.version!r}]", 404)
    return info


def is_server_fault(exc: BaseException, status: int) -> bool:
    """A 5xx that is a failure (logged with its traceback), not a deliberate refusal: a full
    queue, a closing batcher or a RequestError the server raised on purpose (503 "the engine
    process is gone" at shutdown) are answered and counted, not logged as errors."""
    return status >= 500 and not isinstance(exc, (RequestError, QueueFullError,
                                                  BatcherClosedError))


def status_of(exc: BaseException) -> int:
    """The HTTP status for an exception (gRPC maps from it)."""
    if isinstance(exc, RequestError):
        return exc.status
    if isinstance(exc, (QueueFullError, BatcherClosedError)):
        return 503
    if isinstance(exc, UsageError):   # InferenceInputError, PreprocessError, ...
        return 400
    return 500


class Engine:
    """Models and batchers in this process; the caller owns (and closes) the batchers."""

    def __init__(self, models: Mapping[str, Any], batchers: Mapping[str, Batcher],
                 metrics: ServerMetrics | None = None) -> None:
        missing = [n for n in models if n not in batchers]
        if missing:
            raise UsageError(f"no batcher for model(s) {missing}")
        self.models = dict(models)
        self.batchers = dict(batchers)
        self.metrics = metrics or ServerMetrics()
        self.shm = ShmRegistry(pin=self.pin_host)
        self.infos = {n: ModelInfo.of(m, self.batchers[n]) for n, m in self.models.items()}
        self._stats = {n: _Stats() for n in self.models}
        self._listeners = []
        for name, batcher in self.batchers.items():
            self._listeners.append((batcher, self.metrics.watch(name, batcher)))
            listener = self._stats[name].on_batch
            batcher.add_listener(listener)
            self._listeners.append((batcher, listener))

    # --- what front-ends call ------------------------------------------------------------

    def lookup(self, name: str, version: str | None = None) -> ModelInfo:
        return lookup_info(self.infos, name, version)

    async def ready(self, name: str | None = None) -> bool:
        if name is None:
            return all(not b.closed for b in self.batchers.values())
        return not self.batchers[name].closed

    async def infer(self, call: InferCall) -> dict[str, np.ndarray | ShmOutput]:
        fut, finish = self.start_infer(call)
        try:
            await fut
        except BaseException:
            fut.cancel()          # the awaiting task was cancelled (no-op once done)
            with contextlib.suppress(BaseException):
                finish(fut)       # counts the failure
            raise
        return finish(fut)

    def start_infer(self, call: InferCall) -> tuple[asyncio.Future, Callable[
            [asyncio.Future], dict[str, np.ndarray | ShmOutput]]]:
        """``infer`` in two halves, for callers that finish requests in a done-callback
        instead of a task per request (the worker host on the engine's loop, which every
        request crosses): checks, shared-memory inputs and the batcher's future now;
        ``finish(future)``, once it is done, writes shared-memory outputs, counts the
        request, and returns the outputs or raises the request's error."""
        info = self.lookup(call.model, call.version)
        stats = self._stats[info.name]
        t0 = time.perf_counter()
        try:
            feeds = dict(call.feeds)
            alive: set[str] = set()   # regions found alive at this request's start
            for name, s in call.shm_inputs.items():
                feeds[name] = self.shm.read(s.ref, s.dtype, s.shape, f"input {name!r}", alive)
            for name, ref in call.shm_outputs.items():
                # refuse a bad window before running
                self.shm.view(ref, f"output {name!r}", alive)
            fut = self.batchers[info.name].submit_future(feeds)
        except BaseException:
            stats.on_request(False, time.perf_counter() - t0)
            raise

        def finish(done: asyncio.Future) -> dict[str, np.ndarray | ShmOutput]:
            ok = False
            try:
                results = done.result()
                out: dict[str, np.ndarray | ShmOutput] = {}
                for o in call.outputs:
                    arr = results[o.name]
                    ref = call.shm_outputs.get(o.name)
                    if ref is None:
                        out[o.name] = arr
                    else:
                        # checked again: the key may have been truncated while the batch ran
                        self.shm.write(ref, arr, f"output {o.name!r}")
                        out[o.name] = ShmOutput(arr.shape, arr.dtype, ref)
                ok = True
                return out
            finally:
                stats.on_request(ok, time.perf_counter() - t0)
        return fut, finish

    async def classify(self, name: str, image: bytes, k: int) -> list[tuple[int, str, float]]:
        """Top-k of one encoded image through the model's own preprocessing."""
        info = self.lookup(name)
        model = self.models[name]
        batch = await asyncio.to_thread(model.preprocess, [image])
        results = await self.batchers[name].submit_async({info.inputs[0].name: batch})
        return model.top_k(results[info.outputs[0].name], k)[0]

    async def stats(self, name: str | None = None, version: str | None = None) -> dict:
        names = [self.lookup(name, version).name] if name else sorted(self.infos)
        return {"model_stats": [self._stats[n].as_dict(n, self.infos[n].version) for n in names]}

    def record_request(self, model: str, endpoint: str, status: int, seconds: float) -> None:
        self.metrics.record_request(model, endpoint, status, seconds)

    async def metrics_text(self) -> bytes:
        return self.metrics.exposition()

    async def shm_register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self.shm.register(name, key, offset, byte_size)

    async def shm_unregister(self, name: str | None = None) -> None:
        self.shm.unregister(name)

    async def shm_status(self, name: str | None = None) -> list[dict]:
        return self.shm.status(name)

    def pin_host(self, address: int, nbytes: int) -> Any:
        """Page-lock host memory that requests' tensors arrive in (a worker's arena), so
        that a GPU engine copies them to the device from where they lie; the range (to
        ``unpin()`` before the memory is unmapped), or None when no model here reads
        page-locked memory (CPU engines)."""
        for model in self.models.values():
            pin = getattr(model, "pin_host", None)
            region = pin(address, nbytes) if pin is not None else None
            if region is not None:
                return region
        return None

    def close(self) -> None:
        """Detach from the batchers (which the caller closes) and drop every region."""
        for batcher, fn in self._listeners:
            batcher.remove_listener(fn)
        self._listeners = []
        self.shm.close()
