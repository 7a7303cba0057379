"""benchmarks/batch_timeline.py: where a batch's time goes, from the batcher's BatchStats
(serve_bench prints it under each figure; the H200 analysis of 2026-12-02 rests on it)."""

from __future__ import annotations

import threading

import numpy as np

from runtime_py.batcher import Batcher, BatchStats
from runtime_py.testing import AsyncToyModel
from benchmark_modules import load_benchmark



def _timeline():
    return load_benchmark("batch_timeline")


def _stats(dispatched_at, enqueue_s, ready_s, compute_s, queue_s, size=4):
    return BatchStats(size, len(queue_s), tuple(queue_s), compute_s, 0, dispatched_at,
                      enqueue_s, ready_s)


def test_summary_of_known_batches():
    """Batches every 10 ms; each dispatched 1 ms after its last request (4 ms after its
    first), started 2 ms after dispatch, outputs 6 ms after its start, answered 1 ms later:
    the engine idles 4 ms per batch (a batch starts 4 ms after the previous outputs), and
    the last request of batch k came 10 ms after batch k-2's clients were answered."""
    bt = _timeline()
    line = bt.BatchTimeline()
    line.start()
    for k in range(6):
        d = 10.0 * k / 1000
        line(_stats(d, 0.002, 0.008, 0.009, [0.004, 0.001]))
    line(_stats(1.0, 0.0, 0.0, 0.0, []))        # an empty batch (a failed request's): skipped
    line.stop()
    line(_stats(2.0, 0.002, 0.008, 0.009, [0.001]))   # after stop: not counted
    got = line.summary()
    assert got["batches"] == 6 and got["mean_size"] == 4
    expected = {"enqueue": 2.0, "engine": 6.0, "idle": 4.0, "deliver": 1.0, "wake": 1.0,
                "period": 10.0, "back": 20.0 - 9.0 - 1.0}
    for name, value in expected.items():
        assert abs(got[name] - value) < 1e-6, (name, got[name])
    assert "enqueue 2.00" in bt.format_summary(got)
    assert bt.format_summary({}) == "timeline: too few batches"


def test_a_batcher_feeds_the_timeline():
    """On a real Batcher over an asynchronous engine: timestamps in order, engine time near
    the model's cost."""
    bt = _timeline()
    line = bt.BatchTimeline()
    model = AsyncToyModel("toy", max_batch_size=4, cost_ms=20)
    with Batcher(model, max_delay_ms=1) as b:
        b.add_listener(line)
        line.start()

        def client(i: int) -> None:
            x = np.full((1, 3, 8, 8), float(i), np.float32)
            for _ in range(5):
                b.infer({"input": x}, timeout=10)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        line.stop()
    model.close()
    got = line.summary()
    assert got["batches"] >= 5
    assert 0 <= got["enqueue"] < got["engine"]
    assert 15 <= got["engine"] <= 200            # 20 ms of model cost per batch
    assert got["period"] >= got["engine"] * 0.9
