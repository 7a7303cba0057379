"""The dynamic batcher: many small requests in, few large engine calls out.

An engine's throughput grows with the batch size (one kernel launch sequence amortised
over many images), while clients of a service send one image at a time. The batcher sits
between them: one worker thread takes queued requests, hands their rows to the engine
where it copies them to the device itself (``model.infer_rows_async``: torch-aoti on a
GPU, from pinned or page-locked memory such as the front-end workers' arenas), else
writes them straight into a batch slot's input buffers (pinned memory from
``model.input_buffers()`` on GPU engines, so the device copy reads them in place) and
starts the batch with ``model.infer_async``, and goes on to the next one; a completion thread waits for each batch in order and hands each
request back its own rows, waking each client once.

Rules it keeps, and why:
- A batch waits at most ``max_delay_ms`` for company, counted from when it starts
  collecting (the first request's arrival, or the engine becoming free when requests
  queued up meanwhile); a full batch is dispatched at once.
- Except for the clients of the last batch: when a batch finishes, the rows it delivered
  plus the rows then queued are what the service held; closed-loop clients (a client
  sends its next request when it gets its answer) come back within a round trip, which
  over a network is often longer than ``max_delay_ms``. Dispatching without them splits
  the clients into cohorts that alternate in partial batches, each paying a full engine
  call, for good (measured: batch sizes 4/12 alternating, half the throughput). So the
  next batch waits until it holds that many rows (then goes at once), but at most
  ``max_wait_ms`` (default: the engine's recent time per batch, beyond which waiting
  cannot beat running another batch). A wait that times out (open-loop traffic, a
  client gone) turns the rule off for the next few batches.
- ``early_dispatch=True`` (off by default) caps that wait at the moment the engine runs
  dry: while a batch is in flight on an asynchronous engine, the collecting batch goes
  when that one is due to finish, less the time a dispatch takes to start (both from
  recent batches), with the rows it has; with none in flight, after ``max_delay_ms``.
  Behind network front-ends the clients' round trip can outlast an engine batch (H200,
  HTTP: 5.3-6.6 ms against 3.9), and the engine idles for the difference on every batch.
  Whether a smaller batch in time beats a full one late depends on the engine and the
  clients. In a toy (8 clients, batches of 4, an ``AsyncToyModel`` batch of 150 ms fixed
  or growing with its rows, round trips of 50-350 ms): -1% to +41% img/s against waiting
  for whole cohorts, within 4% of the default wait (whose timeouts already cut cohorts
  there). On the H200 (64 network clients, docs/measurements/h200-2026-12-02-c) it gave
  +7-18% where the engine batch (3.9-4.4 ms) was shorter than the clients' round trip
  and -2% to -16% where it was longer (6.0 ms: it cut batches the engine had time to
  wait for), hence off by default (``benchmarks/serve_bench.py --early-dispatch``
  measures it). ``early_dispatch="auto"`` uses whichever of the two rules served more
  rows per second, each tried in turn on the live traffic (``runtime_py.dispatch_choice``).
  The rule can be changed on a running batcher (``batcher.early_dispatch = ...``).
- ``stage_ahead=True`` (off by default: measured worse, below) copies a batch's rows toward the
  engine while the batch is still collecting, where the model can (``model.stage_rows``:
  the torch-aoti runner enqueues their host-to-device copies): each time another quarter
  of a batch has queued, the worker hands those rows over, and the dispatch copies only
  the rows that came last. Copied at dispatch, a batch's input (8.6 MB for uint8
  xception at batch 32) reaches the device only after its last request came, and the
  engine may wait for it: on the H200 the served fp8 engine took 3.66-3.72 ms a batch
  against 3.37 ms replaying its graph alone, while its batches started only ~0.14 ms
  before the last one ended (docs/measurements/h200-2026-12-05-c). Measured side by side
  on two H100 hosts it made the served fp8 figure worse (fp8/fp16 over gRPC 1.229 on
  against 1.358 off; its batches came out smaller; docs/measurements/h100-2026-12-05-d),
  hence off; the GPU tests show it correct. The rows staged are the ones
  ``_take`` would take at that moment; whatever changes before the dispatch (a request
  cancelled meanwhile) is caught there by comparing the staged slices with the batch's,
  request by request, and only the rows that still match are not copied again.
- Requests are validated in ``submit`` (names, dtypes, fixed dimensions) so a bad request
  is refused alone, with a clear ``InferenceInputError``, before it can poison a batch.
- If a merged batch still fails in ``model.infer`` (a data-dependent failure), each of its
  requests is rerun alone, so only the request that fails gets the exception.
- A request larger than the max batch is cut into slices that travel in consecutive
  batches (sharing them with other requests) and is reassembled in order.
- The queue is bounded in requests: ``submit`` raises ``QueueFullError`` at once rather
  than letting memory grow without bound (back-pressure the client can act on).
- ``pipeline_depth`` batches (default 2) are in flight: while the engine computes batch k,
  the worker fills batch k+1's slot and the completion thread delivers batch k-1. A slot
  is reused only after its batch's outputs were read out, and the outputs handed to
  clients are never in a buffer that is reused.
- Only numpy and the standard library: importable by any service.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import queue
import threading
import time
import weakref
from concurrent.futures import Future, InvalidStateError
from typing import Callable, Mapping, NamedTuple, Protocol, Sequence

import numpy as np

from .dispatch_choice import DispatchChooser
from .errors import BatcherClosedError, BatcherError, QueueFullError, UsageError
from .hostcopy import gather_rows
from .pending import Pending
from .tensors import FeedChecker, TensorSpec
from .waiters import AsyncWaiter, LoopPost, ThreadWaiter, one_wake_up_per_loop

log = logging.getLogger(__name__)

Feeds = dict[str, np.ndarray]

#: ``Batcher(early_dispatch=...)`` as a word (``bundle serve --early-dispatch``).
EARLY_DISPATCH_RULES = ("off", "on", "auto")
_MAX_AUTO_WAIT_S = 0.05       # the default max wait follows the engine, up to this
_SKIP_AFTER_TIMEOUT = 8       # batches run without waiting for returning clients


class BatchableModel(Protocol):
    """What the batcher needs of a model (``runtime_py.model.Model`` provides it).

    Optional, used when present: ``infer_async(feeds) -> Pending`` (start a batch and
    return at once), ``infer_rows_async(parts) -> Pending | None`` (start a batch given
    as each input's list of request rows; None: not taken, gather them),
    ``stage_rows(parts, first_row, key) -> bool`` with ``infer_rows_async(parts,
    staged_rows=k, staged_by=key)`` (copy rows of the next batch ahead of its dispatch,
    as rows ``first_row..``; the dispatch then says how many leading rows were staged
    and still hold, and ``key`` says by whom: the model trusts them only where its next
    batch's staged rows are that caller's) and
    ``input_buffers() -> dict[str, ndarray]`` (max-batch host buffers the engine reads in
    place), ``prepare(batch_sizes, progress=None)`` (set up each size before serving;
    ``progress(done, total)`` after each, for ``run.prepare_models``)."""

    inputs: Sequence[TensorSpec]
    max_batch_size: int

    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...


class BatchStats(NamedTuple):
    """What one engine call did, handed to listeners (e.g. Prometheus metrics).

    ``queue_s`` holds, per request slice in the batch, the time from ``submit`` to
    dispatch; ``compute_s`` is the ``model.infer`` wall time of the merged call (plus the
    per-request reruns if it failed); ``failed`` counts requests that got an exception.

    The batch's timeline, for finding where a closed loop of clients loses time (the
    engine idle between batches while the last batch's clients come back;
    ``benchmarks/batch_timeline.py``): ``dispatched_at`` is the ``time.perf_counter()``
    at which the batch left the queue, ``enqueue_s`` the time from then until the engine
    call was started (rows merged into the slot, copies and engine enqueued), ``ready_s``
    until its outputs were on the host (before they were handed out; ``compute_s`` ends
    when every client had its answer).
    """

    size: int
    requests: int
    queue_s: tuple[float, ...]
    compute_s: float
    failed: int
    dispatched_at: float = 0.0
    enqueue_s: float = 0.0
    ready_s: float = 0.0


class _Request:
    """One submitted request and the progress of its rows through batches."""

    __slots__ = ("feeds", "rows", "taken", "done", "parts", "future", "t_submit", "signature",
                 "started")

    def __init__(self, feeds: Feeds, rows: int, signature: tuple,
                 waiter: "ThreadWaiter | AsyncWaiter | None" = None) -> None:
        self.feeds = feeds
        self.rows = rows
        self.taken = 0          # rows handed to batches so far
        self.done = 0           # rows whose outputs came back
        self.parts: list[dict[str, np.ndarray]] = []   # output slices, in row order
        self.future: Future | ThreadWaiter | AsyncWaiter = waiter if waiter is not None else Future()
        self.t_submit = time.perf_counter()
        self.signature = signature   # non-batch shapes: requests merge only when equal
        self.started = False


class _Slice(NamedTuple):
    req: _Request
    start: int
    stop: int


class Batcher:
    """Merge concurrent requests into engine batches on one worker thread.

    ``max_batch_size`` defaults to (and may not exceed) ``model.max_batch_size``;
    ``max_delay_ms`` bounds how long the oldest request waits for others; ``max_queue``
    bounds the number of queued requests; ``pipeline_depth`` is the number of batches in
    flight (1 runs one batch at a time). ``prepare`` (default): ask the model to prepare
    every batch size up to the max before serving (``Model.prepare``: a GPU engine
    captures its CUDA graphs). Use as a context manager or call ``close``.
    """

    def __init__(
        self,
        model: BatchableModel,
        max_batch_size: int | None = None,
        max_delay_ms: float = 2.0,
        max_queue: int = 1024,
        pipeline_depth: int = 2,
        max_wait_ms: float | None = None,
        early_dispatch: bool | str = False,
        prepare: bool = True,
        stage_ahead: bool = False,
    ) -> None:
        model_max = int(model.max_batch_size)
        if max_batch_size is None:
            max_batch_size = model_max
        if not 1 <= max_batch_size <= model_max:
            raise UsageError(
                f"max batch size {max_batch_size} is outside 1..{model_max} "
                f"(the model's max batch size)"
            )
        if max_delay_ms < 0:
            raise UsageError(f"max delay must be >= 0 ms, got {max_delay_ms}")
        if max_queue < 1:
            raise UsageError(f"max queue must be >= 1 request, got {max_queue}")
        if not 1 <= pipeline_depth <= 8:
            raise UsageError(f"pipeline depth must be 1..8 batches, got {pipeline_depth}")
        if max_wait_ms is not None and max_wait_ms < 0:
            raise UsageError(f"max wait must be >= 0 ms, got {max_wait_ms}")
        self.model = model
        self.max_batch_size = int(max_batch_size)
        if prepare and hasattr(model, "prepare"):
            # every size 1..max may come; their per-size setup (CUDA graph captures) now,
            # not on the first batch of each while clients wait (tens of ms each, seconds
            # for a cuDNN-heavy package: said in the log when it took that long)
            t0 = time.perf_counter()
            model.prepare(range(1, self.max_batch_size + 1))
            took = time.perf_counter() - t0
            if took >= 1.0:
                log.info("batcher: prepared %s for batch sizes 1..%d in %.1f s",
                         getattr(model, "name", type(model).__name__), self.max_batch_size,
                         took)
        self.max_delay_s = max_delay_ms / 1000.0
        # None: follow the engine's time per batch (``_batch_s``), within these bounds.
        self.max_wait_s = None if max_wait_ms is None else max_wait_ms / 1000.0
        self._batch_s = 0.0        # moving average of dispatch-to-delivery time
        self._expected = 0         # rows in the service when the last batch finished
        self._target = 0           # rows the collecting batch waits for (0: none)
        self._skip_expect = 0      # batches left without the wait, after a timeout
        # early_dispatch: batches in flight, the engine's time per batch (from a batch's
        # start, or the previous batch's outputs, to its outputs), the time a dispatch
        # takes to start the engine call, the last batch's start and outputs.
        self._dispatch_mode = _dispatch_mode(early_dispatch)
        self._chooser = DispatchChooser() if self._dispatch_mode == "auto" else None
        self.early_batches = 0     # batches collected under the early rule
        self._running = 0
        self._engine_s = 0.0
        self._lead_s = 0.0
        self._last_started = 0.0
        self._last_ready = 0.0
        # stage_ahead: the slices of the collecting batch whose rows the model is copying
        # already (in batch order), their rows, the queued-row count at which a submit
        # wakes the worker to stage more (0: none wanted), and whether staging stopped
        # for this batch (the model declined, or the queue no longer starts with them).
        self._stage_rows = (getattr(model, "stage_rows", None)
                            if getattr(model, "stages_rows", True) else None)
        self._stage_on = bool(stage_ahead)
        self._stage_chunk = max(1, self.max_batch_size // 4)
        self._staged: list[_Slice] = []
        self._staged_count = 0
        self._stage_next = 0
        self._stage_stopped = False
        self._stage_key = object()   # whose staged rows they are, for the model
        # rows dispatches claimed as staged for them (the model may still copy them again:
        # e.g. another caller took its next slot meanwhile; its own count says what it used)
        self.rows_claimed_staged = 0
        self.max_queue = int(max_queue)
        self._specs = list(model.inputs)
        self._check = FeedChecker(self._specs)
        self._queue: collections.deque[_Request] = collections.deque()
        self._queued_rows = 0
        self._cond = threading.Condition(threading.Lock())
        self._closed = False
        self._listeners: list[Callable[[BatchStats], None]] = []
        # one result post per event loop that awaits this batcher (submit_async)
        self._posts: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        # Batch input buffers per slot, reused across batches (per non-batch shape): a
        # fresh multi-megabyte array per batch costs page faults on every call, and on a
        # GPU engine pinned buffers spare the engine its staging copy.
        self._slot_buffers: list[dict[tuple, dict[str, np.ndarray]]] = [
            {} for _ in range(pipeline_depth)]
        self._free_slots: queue.SimpleQueue[int] = queue.SimpleQueue()
        for i in range(pipeline_depth):
            self._free_slots.put(i)
        self._in_flight: queue.SimpleQueue = queue.SimpleQueue()
        # Counters readable without a listener (cheap: updated once per batch).
        self.batches = 0
        self.rows = 0
        self.failed_requests = 0
        self.batch_size_counts: collections.Counter[int] = collections.Counter()
        self._worker = threading.Thread(target=self._run, name="trt-bundle-batcher", daemon=True)
        self._completer = threading.Thread(target=self._complete, name="trt-bundle-batcher-done",
                                           daemon=True)
        self._worker.start()
        self._completer.start()

    # --- client side ------------------------------------------------------------------

    def submit(self, feeds: Mapping[str, np.ndarray] | np.ndarray) -> Future:
        """Queue one request (any batch size >= 1); return a future of its outputs.

        ``feeds`` maps input names to arrays; a bare array is accepted for a model with
        exactly one input.

        Raises at once: ``InferenceInputError`` for arrays that do not fit the model,
        ``QueueFullError`` when ``max_queue`` requests are waiting, ``BatcherClosedError``
        after ``close``. The arrays are not copied: do not modify them until the future
        is done.
        """
        return self._enqueue(feeds, None)  # type: ignore[return-value]

    def _enqueue(self, feeds: Mapping[str, np.ndarray] | np.ndarray,
                 waiter: "ThreadWaiter | AsyncWaiter | None") -> Future | ThreadWaiter | AsyncWaiter:
        if isinstance(feeds, np.ndarray) and len(self._specs) == 1:
            feeds = {self._specs[0].name: feeds}   # the one input of a single-input model
        rows = self._check(feeds)
        feeds = {s.name: feeds[s.name] for s in self._specs}
        signature = tuple(a.shape[1:] for a in feeds.values())
        req = _Request(feeds, rows, signature, waiter)
        with self._cond:
            if self._closed:
                raise BatcherClosedError("the batcher is closed; no new requests are accepted")
            if len(self._queue) >= self.max_queue:
                raise QueueFullError(
                    f"the batcher queue is full ({self.max_queue} requests waiting); "
                    f"retry later or lower the request rate"
                )
            was_empty = not self._queue
            self._queue.append(req)
            self._queued_rows += rows
            # Wake the worker only when it has something new to decide: the first
            # request (it starts the clock), the rows it waits for, a full batch, or
            # another quarter batch to stage.
            if (was_empty or self._queued_rows >= self.max_batch_size
                    or self._queued_rows == self._target
                    or 0 < self._stage_next <= self._queued_rows):
                self._cond.notify()
        return req.future

    async def submit_async(self, feeds: Mapping[str, np.ndarray] | np.ndarray) -> Feeds:
        """``submit`` for asyncio code: await the outputs without blocking the loop.

        Cancelling the awaiting task cancels the request if it has not started yet.
        Results reach the loop in one wake-up per batch where they can (`LoopPost`).
        """
        return await self.submit_future(feeds)

    def submit_future(self, feeds: Mapping[str, np.ndarray] | np.ndarray) -> asyncio.Future:
        """``submit_async`` without the coroutine: an asyncio future of the running loop,
        for callers that complete requests in a done-callback rather than a task per
        request. Cancelling the future cancels the request if it has not started yet."""
        loop = asyncio.get_running_loop()
        post = self._posts.get(loop)
        if post is None:
            post = self._posts.setdefault(loop, LoopPost(loop))
        fut = loop.create_future()
        self._enqueue(feeds, AsyncWaiter(fut, post))
        return fut

    def infer(self, feeds: Mapping[str, np.ndarray] | np.ndarray, timeout: float | None = None) -> Feeds:
        """Blocking: queue one request and wait for its outputs (``submit(feeds).result(
        timeout)``, on a lighter waiter than a Future: `ThreadWaiter`). Raises ``TimeoutError``
        after ``timeout`` seconds; the request itself still runs."""
        return self._enqueue(feeds, ThreadWaiter()).result(timeout)  # type: ignore[union-attr]

    def add_listener(self, fn: Callable[[BatchStats], None]) -> None:
        """Call ``fn(BatchStats)`` on the worker thread after each batch (keep it cheap)."""
        self._listeners.append(fn)

    def remove_listener(self, fn: Callable[[BatchStats], None]) -> None:
        """Stop calling ``fn``; no error if it was not registered."""
        try:
            self._listeners.remove(fn)
        except ValueError:
            pass

    @property
    def closed(self) -> bool:
        """True once ``close`` was called (the batcher accepts no new requests)."""
        return self._closed

    @property
    def early_dispatch(self) -> bool | str:
        """The dispatch rule: False (wait for the last batch's clients), True (go when the
        engine is about to run dry) or ``"auto"`` (the faster of the two, measured in turn:
        ``runtime_py.dispatch_choice``)."""
        return {"off": False, "on": True}.get(self._dispatch_mode, self._dispatch_mode)

    @early_dispatch.setter
    def early_dispatch(self, value: bool | str) -> None:
        mode = _dispatch_mode(value)
        with self._cond:
            self._dispatch_mode = mode
            self._chooser = DispatchChooser() if mode == "auto" else None
            self._cond.notify()

    @property
    def stage_ahead(self) -> bool:
        """Whether rows are handed to the model while their batch collects (and the model
        takes them: ``stage_rows``); may be changed on a running batcher."""
        return self._stage_on

    @stage_ahead.setter
    def stage_ahead(self, value: bool) -> None:
        with self._cond:
            self._stage_on = bool(value)

    @property
    def dispatch_mode(self) -> str:
        """``early_dispatch`` as "off", "on" or "auto"."""
        return self._dispatch_mode

    @property
    def dispatch_choice(self) -> DispatchChooser | None:
        """With ``early_dispatch="auto"``, what was measured and chosen so far."""
        return self._chooser

    def _early_applies(self) -> bool:
        """Whether the early rule governs the batch being collected (lock held): chosen
        (on, or auto's choice now), and an engine that computes after the dispatching call
        returns (its time per batch above the dispatch's lead: something to run dry)."""
        mode = self._dispatch_mode
        early = self._chooser.early if mode == "auto" else mode == "on"  # type: ignore[union-attr]
        return early and self._engine_s > self._lead_s

    @property
    def queue_length(self) -> int:
        """Requests waiting (not yet fully dispatched)."""
        return len(self._queue)

    def close(self, drain: bool = True, timeout: float | None = None) -> None:
        """Stop accepting requests and stop the worker.

        ``drain=True`` runs every queued request first (without waiting for the delay);
        ``drain=False`` fails queued requests with ``BatcherClosedError`` (the batch
        already running completes). Waits up to ``timeout`` seconds for the worker.
        Calling it again is harmless.
        """
        cancelled: list[_Request] = []
        with self._cond:
            self._closed = True
            if not drain:
                cancelled = list(self._queue)
                self._queue.clear()
                self._queued_rows = 0
            self._cond.notify_all()
        for req in cancelled:
            _fail(req, BatcherClosedError("the batcher was closed before this request ran"))
        current = threading.current_thread()
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in (self._worker, self._completer):
            if thread is not current:
                thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> "Batcher":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- worker side ------------------------------------------------------------------

    def _run(self) -> None:
        """Worker: wait for a free slot, take a batch, fill the slot, start the batch."""
        try:
            while True:
                slot = self._free_slots.get()
                batch = self._next_batch()
                if batch is None:
                    return
                try:
                    self._dispatch(batch, slot)
                except BaseException as e:  # never let the worker die with requests pending
                    log.exception("batcher worker error")
                    for s in batch:
                        _fail(s.req, e if isinstance(e, Exception) else BatcherError(repr(e)))
                    self._free_slots.put(slot)
        finally:
            self._in_flight.put(None)

    def _dispatch(self, batch: list[_Slice], slot: int) -> None:
        t0 = time.perf_counter()
        queue_s = tuple(t0 - s.req.t_submit for s in batch)
        live = [s for s in batch if not s.req.future.done()]   # a slice of a failed request
        staged = self._staged_prefix(live)
        feeds: Feeds = {}
        if live:
            try:
                pending = self._start_rows(live, staged)
                if pending is None:
                    feeds = self._merge(live, slot)
                    pending = self._start(feeds)
            except Exception as e:
                pending = Pending.failed(e)
        else:
            pending = Pending.done({})
        started = time.perf_counter()
        item = (live, feeds, pending, slot, t0, started - t0, queue_s)
        with self._cond:
            inline = pending.finished and not self._running
            self._running += 1
            self._last_started = started
        if inline:
            # An engine that computed the batch in this call (onnxruntime, a CPU package):
            # deliver it here, so that the rows it hands back count in the next batch's
            # wait (``_expected``) before this thread collects that batch; handed to the
            # completion thread, a loaded host could let the worker collect first, with
            # the last batch's count, and split closed-loop clients for good.
            self._complete_one(item)
        else:
            self._in_flight.put(item)

    def _start_rows(self, slices: list[_Slice], staged: int = 0) -> Pending | None:
        """The batch started from its requests' rows where they lie, by an engine that
        takes them so (``infer_rows_async``; its first ``staged`` rows were handed over
        by ``stage_rows`` already); None: gather them (``_merge``)."""
        start = getattr(self.model, "infer_rows_async", None)
        if start is None or (len(slices) < 2 and not staged):
            return None     # (one request's rows: its own arrays go to infer_async)
        parts = _rows_of(slices)
        if not staged:
            return start(parts)
        pending = start(parts, staged_rows=staged, staged_by=self._stage_key)
        if pending is not None:
            self.rows_claimed_staged += staged
        return pending

    def _staged_prefix(self, live: list[_Slice]) -> int:
        """The rows at the head of the batch that were staged for it and are still its
        first rows, request by request (a request cancelled after it was staged ends the
        match: the rows after it moved up); resets the staging for the next batch."""
        rows = 0
        for mine, theirs in zip(self._staged, live):
            if mine != theirs:          # (requests compare by identity)
                break
            rows += mine.stop - mine.start
        self._staged, self._staged_count, self._stage_stopped = [], 0, False
        return rows

    def _staging(self) -> bool:
        """Whether rows of the collecting batch are to be staged (lock held): on, a model
        that stages, and not stopped for this batch."""
        return self._stage_on and self._stage_rows is not None and not self._stage_stopped

    def _stage_due(self) -> bool:
        """Whether another quarter batch queued beyond the rows staged (lock held)."""
        return (self._staging()
                and self._queued_rows - self._staged_count >= self._stage_chunk)

    def _stage_more(self) -> None:
        """Hand the model the rows queued for the collecting batch beyond those staged
        (lock held on entry and exit, released while the model copies)."""
        ahead = self._peek()
        n = len(self._staged)
        if ahead[:n] != self._staged or len(ahead) == n:
            self._stage_stopped = True     # the queue changed under them, or nothing new
            return
        more = ahead[n:]
        first = self._staged_count
        parts = _rows_of(more)
        self._cond.release()
        try:
            taken = bool(self._stage_rows(parts, first, self._stage_key))
        except Exception:
            log.exception("staging rows ahead of their batch failed; they go at dispatch")
            taken = False
        finally:
            self._cond.acquire()
        if taken:
            self._staged.extend(more)
            self._staged_count += sum(s.stop - s.start for s in more)
        else:
            self._stage_stopped = True

    def _peek(self) -> list[_Slice]:
        """The slices ``_take`` would take now (lock held), without taking them."""
        batch: list[_Slice] = []
        room = self.max_batch_size
        signature = None
        for req in self._queue:
            if room <= 0:
                break
            if not req.started and req.future.cancelled():
                continue     # cancelled while it waited (``_take`` drops it)
            if signature is None:
                signature = req.signature
            elif req.signature != signature:
                break
            n = min(room, req.rows - req.taken)
            batch.append(_Slice(req, req.taken, req.taken + n))
            room -= n
        return batch

    def _start(self, feeds: Feeds) -> Pending:
        start = getattr(self.model, "infer_async", None)
        if start is not None:
            return start(feeds)
        try:
            return Pending.done(self.model.infer(feeds))
        except Exception as e:
            return Pending.failed(e)

    def _complete(self) -> None:
        """Completion thread: batches in the order they started; each client woken once."""
        while True:
            item = self._in_flight.get()
            if item is None:
                return
            self._complete_one(item)

    def _complete_one(self, item: tuple) -> None:
        """Wait for one batch, hand each request its rows, free its slot; never raises."""
        live, feeds, pending, slot, t0, enqueue_s, queue_s = item
        try:
            with one_wake_up_per_loop():
                try:
                    self._finish(live, feeds, pending, t0, enqueue_s, queue_s)
                except BaseException as e:  # never let the thread die with requests pending
                    log.exception("batcher completion error")
                    for s in live:
                        _fail(s.req, e if isinstance(e, Exception) else BatcherError(repr(e)))
        finally:
            with self._cond:
                self._running -= 1
            self._free_slots.put(slot)

    def _finish(self, live: list[_Slice], feeds: Feeds, pending: Pending, t0: float,
                enqueue_s: float, queue_s: tuple[float, ...]) -> None:
        failed = 0
        ready_s = 0.0
        if live:
            try:
                result = pending.result()
                ready_s = time.perf_counter() - t0
                outputs = self._detach(result, feeds)
                parts = _split(outputs, live)
            except Exception as e:
                if len(live) == 1:
                    _fail(live[0].req, e)
                    failed = 1
                else:
                    # One request may be what makes the batch fail: rerun each alone so
                    # the others still get their results.
                    log.debug("merged batch of %d requests failed (%s); rerunning each alone",
                              len(live), e)
                    for s in live:
                        try:
                            own = {k: v[s.start:s.stop] for k, v in s.req.feeds.items()}
                            part = _split(self._detach(self.model.infer(own), own), [s])[0]
                        except Exception as e1:
                            _fail(s.req, e1)
                            failed += 1
                        else:
                            _deliver(s, part)
            else:
                for s, part in zip(live, parts):
                    _deliver(s, part)
        compute_s = time.perf_counter() - t0
        size = sum(s.stop - s.start for s in live)
        switched = None    # a trial of early_dispatch="auto" ended: whether it switched
        with self._cond:
            # Who may come back: what this batch delivered, and who is already waiting.
            self._expected = size + self._queued_rows
            self._batch_s = _average(self._batch_s, compute_s)
            if live and ready_s:
                ready, started = t0 + ready_s, t0 + enqueue_s
                self._engine_s = _average(self._engine_s,
                                          ready - max(started, self._last_ready))
                self._lead_s = _average(self._lead_s, enqueue_s)
                self._last_ready = ready
                chooser = self._chooser
                if chooser is not None:
                    switched = chooser.on_batch(ready, size)
            self._cond.notify()
        if switched is not None:
            _log_choice(chooser, switched)     # outside the lock the worker waits on
        self.batches += 1
        self.rows += size
        self.failed_requests += failed
        self.batch_size_counts[size] += 1
        if self._listeners:
            stats = BatchStats(size, len(live), queue_s, compute_s, failed, t0, enqueue_s,
                               ready_s or compute_s)
            for fn in list(self._listeners):
                try:
                    fn(stats)
                except Exception:
                    log.exception("batcher listener failed")

    def _next_batch(self) -> list[_Slice] | None:
        """Wait for work, then take up to a max batch of rows off the queue.

        The delay clock starts when this batch starts collecting: at the first request's
        arrival if the worker was idle, or now if requests queued up while the previous
        batch ran. Counting from their arrival instead would dispatch them at once as a
        partial batch, and closed-loop clients would then stay split into cohorts that
        alternate in half-empty batches (half the throughput, for good).
        """
        t_free = time.perf_counter()
        with self._cond:
            while True:
                while not self._queue:
                    if self._closed:
                        return None
                    self._cond.wait()
                start = max(self._queue[0].t_submit, t_free)
                deadline = start + self.max_delay_s
                latest = start + self._wait_limit()
                waited_for_target = False
                while self._queue and self._queued_rows < self.max_batch_size and not self._closed:
                    # The target follows ``_expected``, which the completion thread sets
                    # when the previous batch's clients get their answers.
                    target = 0 if self._skip_expect else min(self._expected, self.max_batch_size)
                    self._target = target
                    if target and self._queued_rows >= target:
                        break   # everyone expected is here
                    now = time.perf_counter()
                    limit = latest if target else deadline
                    dry = self._dry_at(deadline) if target else None
                    if dry is not None and dry < limit:
                        if now >= dry:
                            break   # the engine is about to run out of work: go now
                        limit = dry
                    if now >= limit:
                        waited_for_target = bool(target) and latest > deadline
                        break
                    if self._stage_due():
                        self._stage_more()      # (the lock is let go meanwhile)
                        continue
                    self._stage_next = (self._staged_count + self._stage_chunk
                                        if self._staging() else 0)
                    self._cond.wait(limit - now)
                self._target = 0
                self._stage_next = 0
                if self._early_applies():
                    self.early_batches += 1
                if self._skip_expect:
                    self._skip_expect -= 1
                elif waited_for_target:
                    self._skip_expect = _SKIP_AFTER_TIMEOUT
                batch = self._take()
                if batch:
                    return batch
                self._staged_prefix([])     # all cancelled: staging starts again

    def _dry_at(self, deadline: float) -> float | None:
        """``early_dispatch``: when the collecting batch must start for the engine not to
        idle (lock held): the batches in flight due to finish, less a dispatch's lead; with
        none in flight, the engine is idle already: ``deadline`` (``max_delay_ms``). None
        when off, before anything is known, or for an engine that computes in the
        dispatching call (its time per batch is then not above the lead)."""
        if not self._early_applies():
            return None
        if not self._running:
            return deadline
        due = max(self._last_ready + self._running * self._engine_s,
                  self._last_started + self._engine_s)
        return due - self._lead_s

    def _wait_limit(self) -> float:
        """How long a batch may wait for the clients of the last one (``max_wait_ms``)."""
        if self.max_wait_s is not None:
            return max(self.max_wait_s, self.max_delay_s)
        return min(max(self._batch_s, self.max_delay_s), _MAX_AUTO_WAIT_S)

    def _take(self) -> list[_Slice]:
        """Pop rows from the head of the queue (lock held), FIFO, same signature only."""
        batch: list[_Slice] = []
        room = self.max_batch_size
        signature = None
        while self._queue and room > 0:
            req = self._queue[0]
            if not req.started:
                # A client may have cancelled the future while it waited.
                if not req.future.set_running_or_notify_cancel():
                    self._queue.popleft()
                    self._queued_rows -= req.rows
                    continue
                req.started = True
            if signature is None:
                signature = req.signature
            elif req.signature != signature:
                break   # different non-batch shape: it leads the next batch
            n = min(room, req.rows - req.taken)
            batch.append(_Slice(req, req.taken, req.taken + n))
            req.taken += n
            room -= n
            self._queued_rows -= n
            if req.taken == req.rows:
                self._queue.popleft()
        return batch

    def _merge(self, slices: list[_Slice], slot: int) -> Feeds:
        """One array per input for the batch: the request's own arrays when one request
        fills it (the engine copies them once), else each slice written straight into the
        slot's batch buffers (no intermediate concatenation; `gather_rows`: without giving
        the GIL away per row)."""
        if len(slices) == 1:
            s = slices[0]
            if s.start == 0 and s.stop == s.req.rows:
                return s.req.feeds
            return {k: v[s.start:s.stop] for k, v in s.req.feeds.items()}
        buffers = self._buffers(slices[0].req, slot)
        return {k: gather_rows(buf, [s.req.feeds[k][s.start:s.stop] for s in slices])
                for k, buf in buffers.items()}

    def _buffers(self, first: _Request, slot: int) -> dict[str, np.ndarray]:
        """The slot's buffers for requests shaped like ``first``: the model's own
        (``input_buffers``, pinned on GPU engines) for its fixed shapes, else numpy."""
        cache = self._slot_buffers[slot]
        buffers = cache.get(first.signature)
        if buffers is None:
            if len(cache) >= 4:   # many shapes (dynamic dims): keep memory bounded
                cache.clear()
            buffers = None
            make = getattr(self.model, "input_buffers", None)
            if make is not None:
                try:
                    own = make()
                except UsageError:   # dynamic dimensions: no preallocated buffers
                    own = None
                if own is not None and all(
                        k in own and own[k].shape[1:] == v.shape[1:] and own[k].dtype == v.dtype
                        and own[k].shape[0] >= self.max_batch_size
                        for k, v in first.feeds.items()):
                    buffers = {k: own[k] for k in first.feeds}
            if buffers is None:
                buffers = {k: np.empty((self.max_batch_size, *v.shape[1:]), v.dtype)
                           for k, v in first.feeds.items()}
            cache[first.signature] = buffers
        return buffers

    @staticmethod
    def _detach(outputs: Mapping[str, np.ndarray], feeds: Feeds) -> Mapping[str, np.ndarray]:
        """Copy any output that aliases the (reused) input buffers, so results handed to
        clients can never be overwritten by the next batch (an identity-like model)."""
        if not isinstance(outputs, Mapping):
            return outputs
        aliased = [k for k, v in outputs.items() if isinstance(v, np.ndarray)
                   and any(np.may_share_memory(v, f) for f in feeds.values())]
        if not aliased:
            return outputs
        return {k: (v.copy() if k in aliased else v) for k, v in outputs.items()}


def _rows_of(slices: list[_Slice]) -> dict[str, list[np.ndarray]]:
    """Each input's rows of ``slices``, one piece per slice, where they lie."""
    return {k: [s.req.feeds[k][s.start:s.stop] for s in slices] for k in slices[0].req.feeds}


def _log_choice(chooser: DispatchChooser, switched: bool) -> None:
    """What a trial of ``early_dispatch="auto"`` measured: a switch of rule at info level
    (an operator sees when and why the rule changed), a kept rule at debug."""
    wait, early = chooser.last_rates or (0.0, 0.0)
    log.log(logging.INFO if switched else logging.DEBUG,
            "early dispatch auto: the %s rule %s (last trial: waiting %.0f rows/s, early "
            "%.0f rows/s)", chooser.chosen, "takes over" if switched else "stays", wait, early)


def _dispatch_mode(value: bool | str) -> str:
    """``early_dispatch`` as one of ``EARLY_DISPATCH_RULES`` (also accepted as given)."""
    if value is True or value is False:
        return "on" if value else "off"
    if isinstance(value, str) and value in EARLY_DISPATCH_RULES:
        return value
    raise UsageError(f"early dispatch must be off, on or auto, got {value!r}")


def _average(mean: float, value: float) -> float:
    """Moving average of per-batch times (the first value starts it)."""
    return value if not mean else 0.8 * mean + 0.2 * value


def _split(outputs: Mapping[str, np.ndarray], slices: list[_Slice]) -> list[dict[str, np.ndarray]]:
    """Cut each output back into per-slice views (no copies), checking the batch axis."""
    total = sum(s.stop - s.start for s in slices)
    for name, arr in outputs.items():
        if not isinstance(arr, np.ndarray) or arr.ndim == 0 or arr.shape[0] != total:
            got = getattr(arr, "shape", type(arr).__name__)
            raise BatcherError(
                f"the model returned output {name!r} with shape {got} for a batch of {total}"
            )
    if len(slices) == 1:
        return [dict(outputs)]
    parts = []
    offset = 0
    for s in slices:
        n = s.stop - s.start
        parts.append({k: v[offset:offset + n] for k, v in outputs.items()})
        offset += n
    return parts


def _deliver(s: _Slice, part: dict[str, np.ndarray]) -> None:
    req = s.req
    if req.future.done():
        return
    if s.start == 0 and s.stop == req.rows:
        _set(req.future, part)
        return
    req.parts.append(part)   # slices of one request run in order, on one worker
    req.done += s.stop - s.start
    if req.done == req.rows:
        result = {k: np.concatenate([p[k] for p in req.parts], axis=0) for k in req.parts[0]}
        req.parts = []
        _set(req.future, result)


def _fail(req: _Request, exc: BaseException) -> None:
    req.parts = []
    if req.future.done():
        return
    if not req.future.running():
        # Queued, never started: a cancelled future stays cancelled.
        if not req.future.set_running_or_notify_cancel():
            return
    try:
        req.future.set_exception(exc)
    except InvalidStateError:   # close(drain=False) raced the worker: first one wins
        pass


def _set(future: Future | ThreadWaiter | AsyncWaiter, result: Feeds) -> None:
    try:
        future.set_result(result)
    except InvalidStateError:   # already failed by close(drain=False)
        pass
