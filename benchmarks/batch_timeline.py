"""Where a batch's time goes between engine calls, from the batcher's own timestamps.

Why: with 64 closed-loop clients over batches of 32 the clients form two cohorts, and the
engine stays busy only while the cohort of batch k-2 comes back (answers delivered, the
clients' next requests through the front-ends, the batch filled and enqueued) within the
time the engine spends on batch k-1. Throughput figures and CPU by role cannot say which
hop is long; this listener on ``Batcher.add_listener`` can (``BatchStats`` carries each
batch's dispatch time, enqueue and ready times).

Per batch k (times in ms, medians over the measured window):
  enqueue  dispatch -> engine call started (rows merged into the slot, copies enqueued)
  engine   max(started k, outputs of k-1 on the host) -> outputs of k on the host
  idle     outputs of k-1 on the host -> k started, when k started later (the engine
           waited for the batch; mean over batches, 0 for a batch queued in time)
  deliver  outputs on the host -> every client of k answered
  back     every client of k-2 answered -> the last request of k arrived (the cohort's
           round trip through clients and front-ends)
  wake     last request of k arrived -> k dispatched
  period   outputs of k-1 -> outputs of k (mean: the batches' rate)

An engine that computes in the dispatching call (onnxruntime, a CPU package) shows its
compute under "enqueue" and, since a batch cannot start before the last one is done, as
"idle"; the figures are made for asynchronous (GPU) engines.
"""

from __future__ import annotations

import statistics
import threading
from typing import Any


class BatchTimeline:
    """Collects ``BatchStats`` while started; ``summary()`` gives the figures above."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._on = False
        self._stats: list[Any] = []

    def __call__(self, stats: Any) -> None:          # Batcher listener
        if self._on:
            with self._lock:
                self._stats.append(stats)

    def start(self) -> None:
        with self._lock:
            self._stats = []
            self._on = True

    def stop(self) -> None:
        self._on = False

    def summary(self) -> dict[str, float]:
        with self._lock:
            stats = [s for s in self._stats if s.requests and s.queue_s]
        if len(stats) < 3:
            return {}
        ms = 1000.0
        ready = [s.dispatched_at + s.ready_s for s in stats]
        started = [s.dispatched_at + s.enqueue_s for s in stats]
        answered = [s.dispatched_at + s.compute_s for s in stats]
        last_in = [s.dispatched_at - min(s.queue_s) for s in stats]
        rows = {"enqueue": [s.enqueue_s * ms for s in stats],
                "deliver": [(a - r) * ms for a, r in zip(answered, ready)],
                "wake": [min(s.queue_s) * ms for s in stats],
                "engine": [], "idle": [], "back": [], "period": []}
        for k in range(1, len(stats)):
            rows["engine"].append((ready[k] - max(started[k], ready[k - 1])) * ms)
            rows["idle"].append(max(0.0, started[k] - ready[k - 1]) * ms)
            rows["period"].append((ready[k] - ready[k - 1]) * ms)
            if k >= 2:
                rows["back"].append((last_in[k] - answered[k - 2]) * ms)
        out = {name: round(statistics.median(v), 3) for name, v in rows.items() if v}
        for name in ("idle", "period"):
            out[name] = round(statistics.fmean(rows[name]), 3)
        out["batches"] = len(stats)
        out["mean_size"] = round(statistics.fmean(s.size for s in stats), 1)
        return out


def format_summary(summary: dict[str, float]) -> str:
    """One line for a table: ``timeline ms: enqueue 0.31 engine 4.52 ...``."""
    if not summary:
        return "timeline: too few batches"
    order = ("enqueue", "engine", "idle", "deliver", "back", "wake", "period")
    parts = " ".join(f"{k} {summary[k]:.2f}" for k in order if k in summary)
    return (f"timeline ms: {parts}  ({summary['batches']} batches of "
            f"{summary['mean_size']:.1f} on average)")
