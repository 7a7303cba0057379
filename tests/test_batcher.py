"""The dynamic batcher under concurrency: results to the right caller, real merging,
per-request failures, back-pressure, shutdown, and requests larger than a batch."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import CancelledError, ThreadPoolExecutor

import numpy as np
import pytest

from runtime_py.batcher import Batcher, BatchStats
from runtime_py.errors import (
    BatcherClosedError,
    BatcherError,
    InferenceInputError,
    QueueFullError,
    UsageError,
)
from runtime_py.testing import FAIL_VALUE, ToyModel, ToyModelError

TIMEOUT = 10.0  # generous upper bound for anything that should take milliseconds


def image(seed: int, n: int = 1, size: int = 8) -> np.ndarray:
    return np.random.default_rng(seed).random((n, 3, size, size), dtype=np.float32)


def wait_until(cond, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.001)


@pytest.fixture
def gated():
    """A model that blocks in ``infer`` until the test opens the gate."""
    model = ToyModel(max_batch_size=32)
    model.gate = threading.Event()
    yield model
    model.gate.set()


def block_worker(batcher: Batcher, model: ToyModel):
    """Submit one request and wait until the worker is stuck inside ``infer`` with it."""
    fut = batcher.submit({"input": image(123456)})
    wait_until(lambda: len(model.calls) == 1)
    return fut


def test_concurrent_clients_each_get_their_own_result():
    model = ToyModel(max_batch_size=8, cost_ms=0.5)
    with Batcher(model, max_delay_ms=2.0) as b:
        def client(cid: int) -> None:
            for j in range(25):
                n = 1 + (cid + j) % 3
                x = image(cid * 1000 + j, n)
                out = b.submit({"input": x}).result(TIMEOUT)
                np.testing.assert_array_equal(out["logits"], model.reference(x))

        with ThreadPoolExecutor(16) as pool:
            for f in [pool.submit(client, c) for c in range(16)]:
                f.result(TIMEOUT)
    assert max(model.calls) > 1, "no request was ever merged"
    assert max(model.calls) <= 8
    assert sum(model.calls) == sum(1 + (c + j) % 3 for c in range(16) for j in range(25))


def test_queued_requests_merge_into_one_batch(gated):
    with Batcher(gated, max_delay_ms=1.0) as b:
        first = block_worker(b, gated)
        xs = [image(i) for i in range(8)]
        futs = [b.submit({"input": x}) for x in xs]
        gated.gate.set()
        for x, f in zip(xs, futs):
            np.testing.assert_array_equal(f.result(TIMEOUT)["logits"], gated.reference(x))
        first.result(TIMEOUT)
    assert gated.calls == [1, 8]


def test_full_batch_is_dispatched_without_waiting_for_the_delay():
    model = ToyModel(max_batch_size=4)
    with Batcher(model, max_delay_ms=60_000) as b:
        futs = [b.submit({"input": image(i)}) for i in range(4)]
        for f in futs:
            f.result(TIMEOUT)   # would take a minute if the batcher waited for the delay
    assert model.calls == [4]


def test_lone_request_runs_after_the_delay():
    model = ToyModel()
    with Batcher(model, max_delay_ms=5) as b:
        x = image(3)
        np.testing.assert_array_equal(b.infer({"input": x}, TIMEOUT)["logits"], model.reference(x))
    assert model.calls == [1]


def test_bare_array_accepted_for_single_input_model():
    model = ToyModel()
    with Batcher(model) as b:
        x = image(4, 2)
        np.testing.assert_array_equal(b.infer(x, TIMEOUT)["logits"], model.reference(x))


@pytest.mark.parametrize("feeds, message", [
    ({"input": image(0).astype(np.float64)}, "dtype float64"),
    ({"pixels": image(0)}, "missing input"),
    ({"input": image(0), "extra": image(0)}, "unexpected input"),
    ({"input": image(0, size=9)}, "does not match"),
    ({"input": image(0)[0]}, "dimensions"),
    ({"input": np.zeros((0, 3, 8, 8), np.float32)}, "batch size is 0"),
    ({"input": [[1.0]]}, "numpy array"),
])
def test_bad_request_is_refused_alone(feeds, message):
    model = ToyModel()
    with Batcher(model) as b:
        good = image(1)
        fut = b.submit({"input": good})
        with pytest.raises(InferenceInputError, match=message):
            b.submit(feeds)
        np.testing.assert_array_equal(fut.result(TIMEOUT)["logits"], model.reference(good))
        assert b.infer({"input": good}, TIMEOUT)["logits"].shape == (1, 10)


def test_request_that_makes_the_model_raise_fails_alone(gated):
    with Batcher(gated, max_delay_ms=1.0) as b:
        block_worker(b, gated)
        xs = [image(i) for i in range(5)]
        xs[2][0, 0, 0, 0] = FAIL_VALUE
        futs = [b.submit({"input": x}) for x in xs]
        gated.gate.set()
        for i, (x, f) in enumerate(zip(xs, futs)):
            if i == 2:
                with pytest.raises(ToyModelError):
                    f.result(TIMEOUT)
            else:
                np.testing.assert_array_equal(f.result(TIMEOUT)["logits"], gated.reference(x))
        # The merged batch failed, then each request ran alone.
        assert gated.calls == [1, 5, 1, 1, 1, 1, 1]
        assert b.failed_requests == 1
        # and the batcher keeps serving
        b.infer({"input": image(9)}, TIMEOUT)


def test_wrong_output_batch_from_model_is_a_clear_error():
    class Broken(ToyModel):
        def infer(self, feeds):
            return {"logits": np.zeros((1, 10), np.float32)}

    with Batcher(Broken()) as b:
        with pytest.raises(BatcherError, match="for a batch of 3"):
            b.infer({"input": image(0, 3)}, TIMEOUT)


def test_full_queue_rejects_at_once(gated):
    with Batcher(gated, max_queue=4, max_delay_ms=1.0) as b:
        first = block_worker(b, gated)
        queued = [b.submit({"input": image(i)}) for i in range(4)]
        t0 = time.perf_counter()
        with pytest.raises(QueueFullError, match="full"):
            b.submit({"input": image(99)})
        assert time.perf_counter() - t0 < 1.0
        assert b.queue_length == 4
        gated.gate.set()
        for f in [first, *queued]:
            f.result(TIMEOUT)
        b.infer({"input": image(5)}, TIMEOUT)   # room again once the queue drains


def test_close_with_drain_runs_queued_work_without_waiting_for_the_delay():
    model = ToyModel()
    b = Batcher(model, max_delay_ms=60_000)
    xs = [image(i) for i in range(3)]
    futs = [b.submit({"input": x}) for x in xs]
    t0 = time.perf_counter()
    b.close(drain=True, timeout=TIMEOUT)
    assert time.perf_counter() - t0 < TIMEOUT / 2
    for x, f in zip(xs, futs):
        np.testing.assert_array_equal(f.result(0)["logits"], model.reference(x))
    assert not b._worker.is_alive()


def test_close_without_drain_cancels_queued_requests(gated):
    b = Batcher(gated, max_delay_ms=1.0)
    first = block_worker(b, gated)
    queued = [b.submit({"input": image(i)}) for i in range(3)]
    b.close(drain=False, timeout=0)
    for f in queued:
        with pytest.raises(BatcherClosedError):
            f.result(TIMEOUT)
    gated.gate.set()
    first.result(TIMEOUT)          # the batch already running completes
    b._worker.join(TIMEOUT)
    assert not b._worker.is_alive()
    assert gated.calls == [1]


def test_submit_after_close_is_refused():
    model = ToyModel()
    b = Batcher(model)
    b.close()
    b.close()   # idempotent
    assert b.closed
    with pytest.raises(BatcherClosedError):
        b.submit({"input": image(0)})


def test_large_request_is_split_and_reassembled_in_order(gated):
    with Batcher(gated, max_batch_size=4, max_delay_ms=1.0) as b:
        block_worker(b, gated)
        big = image(7, 10)
        small = image(8, 1)
        f_big = b.submit({"input": big})
        f_small = b.submit({"input": small})
        gated.gate.set()
        np.testing.assert_array_equal(f_big.result(TIMEOUT)["logits"], gated.reference(big))
        np.testing.assert_array_equal(f_small.result(TIMEOUT)["logits"], gated.reference(small))
    # 10 rows in slices of 4, 4, then 2 that share a batch with the small request.
    assert gated.calls == [1, 4, 4, 3]


def test_cancelled_request_is_skipped(gated):
    with Batcher(gated, max_delay_ms=1.0) as b:
        block_worker(b, gated)
        dropped = b.submit({"input": image(1)})
        kept = b.submit({"input": image(2)})
        assert dropped.cancel()
        gated.gate.set()
        kept.result(TIMEOUT)
        with pytest.raises(CancelledError):
            dropped.result(0)
    assert gated.calls == [1, 1]


def test_submit_async_from_many_tasks():
    model = ToyModel(max_batch_size=16)

    async def main(b: Batcher) -> None:
        xs = [image(i) for i in range(64)]
        outs = await asyncio.gather(*(b.submit_async({"input": x}) for x in xs))
        for x, out in zip(xs, outs):
            np.testing.assert_array_equal(out["logits"], model.reference(x))

    with Batcher(model, max_delay_ms=2.0) as b:
        asyncio.run(main(b))
    assert max(model.calls) > 1


def test_blocking_infer_times_out_and_the_request_still_runs(gated):
    with Batcher(gated, max_delay_ms=1.0) as b:
        x = image(3)
        with pytest.raises(TimeoutError):
            b.infer({"input": x}, timeout=0.05)
        gated.gate.set()
        wait_until(lambda: gated.calls == [1])
        np.testing.assert_array_equal(b.infer({"input": x}, TIMEOUT)["logits"], gated.reference(x))


def test_async_request_that_makes_the_model_raise_fails_alone(gated):
    xs = [image(i) for i in range(32)]
    xs[5][0, 0, 0, 0] = FAIL_VALUE

    async def main(b: Batcher) -> list:
        first = asyncio.ensure_future(b.submit_async({"input": image(100)}))
        await asyncio.to_thread(wait_until, lambda: len(gated.calls) == 1)
        tasks = [asyncio.ensure_future(b.submit_async({"input": x})) for x in xs]
        await asyncio.sleep(0.01)                  # all queued behind the blocked batch
        gated.gate.set()
        outs = await asyncio.gather(*tasks, return_exceptions=True)
        await first
        return outs

    with Batcher(gated, max_delay_ms=1.0) as b:
        outs = asyncio.run(main(b))
    assert isinstance(outs[5], ToyModelError)
    for i, (x, out) in enumerate(zip(xs, outs)):
        if i != 5:
            np.testing.assert_array_equal(out["logits"], gated.reference(x))
    assert gated.calls[:2] == [1, 32]      # the merged batch failed, then each ran alone


def test_async_batch_is_delivered_with_fewer_wake_ups_than_requests(gated):
    xs = [image(i) for i in range(32)]

    async def main(b: Batcher) -> tuple[list, int]:
        loop = asyncio.get_running_loop()
        wakeups = []
        original = loop.call_soon_threadsafe

        def counting(callback, *args, **kwargs):
            wakeups.append(callback)
            return original(callback, *args, **kwargs)

        loop.call_soon_threadsafe = counting
        first = asyncio.ensure_future(b.submit_async({"input": image(100)}))
        await asyncio.to_thread(wait_until, lambda: len(gated.calls) == 1)
        tasks = [asyncio.ensure_future(b.submit_async({"input": x})) for x in xs]
        await asyncio.sleep(0.01)
        before = len(wakeups)
        gated.gate.set()
        outs = await asyncio.gather(*tasks)
        await first
        return outs, len(wakeups) - before

    with Batcher(gated, max_delay_ms=1.0) as b:
        outs, wakeups = asyncio.run(main(b))
    for x, out in zip(xs, outs):
        np.testing.assert_array_equal(out["logits"], gated.reference(x))
    assert gated.calls == [1, 32]
    assert 1 <= wakeups <= 4       # one post per batch (plus the first request's)


def test_cancelled_async_request_is_skipped(gated):
    async def main(b: Batcher):
        first = asyncio.ensure_future(b.submit_async({"input": image(100)}))
        await asyncio.to_thread(wait_until, lambda: len(gated.calls) == 1)
        dropped = asyncio.ensure_future(b.submit_async({"input": image(1)}))
        kept = asyncio.ensure_future(b.submit_async({"input": image(2)}))
        await asyncio.sleep(0.01)
        dropped.cancel()
        await asyncio.sleep(0)
        gated.gate.set()
        out = await kept
        await first
        with pytest.raises(asyncio.CancelledError):
            await dropped
        return out

    with Batcher(gated, max_delay_ms=1.0) as b:
        out = asyncio.run(main(b))
    np.testing.assert_array_equal(out["logits"], gated.reference(image(2)))
    assert gated.calls == [1, 1]


def test_listener_sees_every_batch():
    model = ToyModel(max_batch_size=4)
    seen: list[BatchStats] = []
    with Batcher(model, max_delay_ms=1.0) as b:
        b.add_listener(seen.append)
        b.infer({"input": image(0, 6)}, TIMEOUT)
    assert [s.size for s in seen] == [4, 2]
    assert all(s.compute_s >= 0 and len(s.queue_s) == s.requests for s in seen)
    assert b.batch_size_counts == {4: 1, 2: 1} and b.rows == 6


def test_bad_settings_are_refused():
    model = ToyModel(max_batch_size=8)
    with pytest.raises(UsageError, match="max batch size 9"):
        Batcher(model, max_batch_size=9)
    with pytest.raises(UsageError, match="max queue"):
        Batcher(model, max_queue=0)


def test_outputs_aliasing_the_reused_batch_buffer_are_detached():
    class Identity(ToyModel):
        def infer(self, feeds):
            super().infer(feeds)
            return {"logits": feeds["input"][:, 0, 0, :]}   # a view of the batch input

    model = Identity(max_batch_size=8)
    with Batcher(model, max_delay_ms=60_000) as b:
        batches = []
        for k in range(2):      # two merged batches through the same reused buffer
            xs = [image(10 * k + i) for i in range(8)]
            futs = [b.submit({"input": x}) for x in xs]
            batches.append((xs, [f.result(TIMEOUT)["logits"] for f in futs]))
    assert model.calls == [8, 8]
    for xs, outs in batches:
        for x, out in zip(xs, outs):
            np.testing.assert_array_equal(out, x[:, 0, 0, :])   # batch 1 not overwritten


def _closed_loop(b: Batcher, model: ToyModel, clients: int, rounds: int) -> None:
    """``clients`` threads, each sending its next request when it gets its answer, after a
    think time that grows with its index (0..clients-1 ms): the spread of a network round
    trip, wider than the batcher's max delay."""
    def client(cid: int) -> None:
        for j in range(rounds):
            x = image(cid * 1000 + j)
            out = b.submit({"input": x}).result(TIMEOUT)
            np.testing.assert_array_equal(out["logits"], model.reference(x))
            time.sleep(cid / 1000)

    with ThreadPoolExecutor(clients) as pool:
        for f in [pool.submit(client, c) for c in range(clients)]:
            f.result(TIMEOUT * 3)


def test_closed_loop_clients_returning_after_the_delay_stay_in_one_batch():
    # Without waiting for the last batch's clients, arrivals spread over 7 ms against a
    # 1 ms delay split them into cohorts that alternate in partial batches for good.
    # max_wait well above the 7 ms spread, so a loaded test host cannot time the wait out.
    model = ToyModel(max_batch_size=16, cost_ms=30)
    with Batcher(model, max_delay_ms=1.0, max_wait_ms=500.0) as b:
        _closed_loop(b, model, clients=8, rounds=12)
    full = sum(1 for n in model.calls if n == 8)
    assert full >= len(model.calls) // 2, f"batch sizes {model.calls}"
    assert sum(model.calls) == 8 * 12


def test_max_wait_equal_to_the_delay_keeps_the_plain_delay_rule():
    model = ToyModel(max_batch_size=16, cost_ms=30)
    with Batcher(model, max_delay_ms=1.0, max_wait_ms=1.0) as b:
        _closed_loop(b, model, clients=8, rounds=6)
    assert sum(model.calls) == 8 * 6
    assert min(model.calls) < 8, f"batch sizes {model.calls}: the spread was not split"


def test_expected_clients_that_never_come_back_cost_one_bounded_wait():
    # A batch of 8 finishes; only one of its clients sends again: the next batch waits
    # for the others at most max_wait, then runs, and the following one does not wait.
    model = ToyModel(max_batch_size=16)
    with Batcher(model, max_delay_ms=1.0, max_wait_ms=200.0) as b:
        futs = [b.submit({"input": image(i)}) for i in range(8)]
        for f in futs:
            f.result(TIMEOUT)
        x = image(99)
        np.testing.assert_array_equal(b.infer({"input": x}, TIMEOUT)["logits"],
                                      model.reference(x))
        b.infer({"input": x}, TIMEOUT)
    assert sum(model.calls) == 10 and model.calls[-2:] == [1, 1]


def test_negative_max_wait_is_refused():
    with pytest.raises(UsageError, match="max wait"):
        Batcher(ToyModel(), max_wait_ms=-1)


def test_early_dispatch_starts_a_batch_before_the_engine_runs_dry():
    """Closed-loop clients whose round trip (50-350 ms) is longer than an engine batch
    (150 ms, run on the model's own thread as a GPU's): with ``early_dispatch`` the
    collecting batch goes when the batch in flight is due to finish, with the rows it has,
    so the engine barely idles; without it the batcher waits for the whole cohort and the
    engine idles for the difference. Outputs stay right either way."""
    from runtime_py.testing import AsyncToyModel

    def run(early: bool):
        model = AsyncToyModel("toy", max_batch_size=4, cost_ms=150)
        stats, errors = [], []
        with Batcher(model, max_delay_ms=1, max_wait_ms=1000.0, early_dispatch=early) as b:
            b.add_listener(stats.append)

            def client(i: int) -> None:
                x = np.full((1, 3, 8, 8), float(i), np.float32)
                try:
                    for _ in range(6):
                        out = b.infer({"input": x}, timeout=TIMEOUT)
                        np.testing.assert_allclose(out["logits"], model.reference(x))
                        time.sleep(0.05 + 0.1 * (i % 4))
                except Exception as e:  # noqa: BLE001 (reported below)
                    errors.append(e)

            threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(TIMEOUT)
        model.close()
        assert not errors, errors[0]
        idle = [max(0.0, (s.dispatched_at + s.enqueue_s) - (p.dispatched_at + p.ready_s))
                for p, s in zip(stats, stats[1:])]
        return [s.size for s in stats], sum(idle) / len(idle)

    for _ in range(3):
        waited, idle_waited = run(False)
        # whole cohorts (but at the ends); on a host busy with other work (a second test
        # worker) a client descheduled past its cohort's batch splits the cohorts: again
        if waited.count(4) >= 0.7 * len(waited):
            break
    early, idle_early = run(True)
    assert waited.count(4) >= 0.7 * len(waited), waited
    assert any(size < 4 for size in early), early              # went without some of them
    assert idle_early < 0.5 * idle_waited, (idle_early, idle_waited)


def test_early_dispatch_leaves_an_engine_that_computes_in_the_call_alone():
    """A synchronous engine (no time between the engine call's start and its outputs):
    nothing to run dry, so cohorts are waited for as without the option."""
    model = ToyModel("toy", max_batch_size=4, cost_ms=20)
    sizes = []
    with Batcher(model, max_delay_ms=1, max_wait_ms=1000.0, early_dispatch=True) as b:
        b.add_listener(lambda s: sizes.append(s.size))

        def client(i: int) -> None:
            x = np.full((1, 3, 8, 8), float(i), np.float32)
            for _ in range(5):
                b.infer({"input": x}, timeout=TIMEOUT)
                time.sleep(0.01 + 0.01 * (i % 4))

        threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT)
    assert sizes.count(4) >= 0.7 * len(sizes), sizes


@pytest.mark.parametrize("value", ["sometimes", 1, None])
def test_an_unknown_early_dispatch_rule_is_refused(value):
    with pytest.raises(UsageError, match="early dispatch must be off, on or auto"):
        Batcher(ToyModel(), early_dispatch=value)


def test_auto_dispatch_tries_the_other_rule_while_serving_and_outputs_stay_right(caplog):
    """``early_dispatch="auto"``: the batcher feeds every finished batch to its chooser,
    which after ``HOLD_FIRST`` batches tries the early rule on the live traffic (which rule
    wins depends on this machine's timing; the bookkeeping is tested in
    test_dispatch_choice.py). Requests keep their own outputs throughout, and the rule can
    be switched on a running batcher."""
    from runtime_py import dispatch_choice as dc
    from runtime_py.testing import AsyncToyModel

    model = AsyncToyModel("toy", max_batch_size=4, cost_ms=2)
    errors: list[Exception] = []
    caplog.set_level("DEBUG", logger="runtime_py.batcher")
    with Batcher(model, max_delay_ms=1, early_dispatch="auto") as b:
        assert b.early_dispatch == "auto" and b.dispatch_choice.trials == 0

        def client(i: int) -> None:
            x = np.full((1, 3, 8, 8), float(i), np.float32)
            try:
                while b.dispatch_choice.trials < 1 and time.monotonic() < deadline:
                    out = b.infer({"input": x}, timeout=TIMEOUT)
                    np.testing.assert_allclose(out["logits"], model.reference(x))
                    time.sleep(0.001 * (i % 3))
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append(e)

        deadline = time.monotonic() + TIMEOUT
        threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT)
        assert not errors, errors[0]
        choice = b.dispatch_choice
        assert choice.trials >= 1 and choice.last_rates is not None
        assert all(r > 0 for r in choice.last_rates)
        assert b.batches >= dc.HOLD_FIRST + dc.SETTLE + dc.MEASURE
        assert b.early_batches >= dc.SETTLE      # the trial ran under the early rule
        b.early_dispatch = False                  # switched while running
        assert b.early_dispatch is False and b.dispatch_choice is None
        assert b.dispatch_mode == "off"
        x = np.ones((2, 3, 8, 8), np.float32)
        np.testing.assert_allclose(b.infer({"input": x}, timeout=TIMEOUT)["logits"],
                                   model.reference(x))
    model.close()
    # each trial's outcome is logged (a switch at info level), the last one naming the rule
    # kept (read after close: the completion thread that logs has ended)
    said = [r for r in caplog.records if "early dispatch auto" in r.getMessage()]
    assert len(said) == choice.trials
    assert f"the {choice.chosen} rule" in said[-1].getMessage()
    assert sum(r.levelname == "INFO" for r in said) == choice.switches


def _mixed_clients(b: Batcher, model: ToyModel, clients: int = 24, rounds: int = 4) -> None:
    """``clients`` threads sending 1-3 row requests; each result must be its own rows'."""
    def client(cid: int) -> None:
        for j in range(rounds):
            x = image(cid * 100 + j, n=1 + (cid + j) % 3)
            out = b.infer({"input": x}, timeout=TIMEOUT)
            np.testing.assert_array_equal(out["logits"], model.reference(x))

    with ThreadPoolExecutor(clients) as pool:
        for f in [pool.submit(client, c) for c in range(clients)]:
            f.result(TIMEOUT * 3)


def _mixed_clients_of_rows_model(takes_rows):
    """``_mixed_clients`` through a batcher over an ``AsyncToyModel(takes_rows=...)``."""
    from runtime_py.testing import AsyncToyModel

    model = AsyncToyModel(max_batch_size=16, read_delay_ms=2, takes_rows=takes_rows)
    try:
        with Batcher(model, max_delay_ms=5) as b:
            _mixed_clients(b, model)
    finally:
        model.close()
    return model, b


def test_rows_go_to_an_engine_that_copies_them_where_they_lie():
    """A model with ``infer_rows_async`` gets a merged batch as its requests' rows (one
    piece per slice, read late by its "stream"), not gathered into the slot buffers; every
    client still gets its own rows back."""
    model, b = _mixed_clients_of_rows_model(takes_rows=True)
    assert model.row_batches and max(model.row_batches) > 1
    assert model.in_place == 0            # no batch went through the slot buffers
    assert len(model.row_batches) <= b.batches
    assert b.rows == sum(1 + (c + j) % 3 for c in range(24) for j in range(4))


def test_rows_an_engine_declines_are_gathered_into_the_slot_buffers():
    """``infer_rows_async`` returning None (e.g. a batch size without a captured graph):
    the batcher gathers the rows and starts the batch with ``infer_async`` instead."""
    declined = []

    def takes(parts):
        declined.append(len(declined) % 2 == 1)      # every other batch declined
        return not declined[-1]

    model, _ = _mixed_clients_of_rows_model(takes_rows=takes)
    assert any(declined) and not all(declined)
    assert model.in_place == sum(declined)       # each declined batch: slot buffers
    assert len(model.row_batches) == declined.count(False)


def _staging_model(**kwargs):
    from runtime_py.testing import AsyncToyModel

    return AsyncToyModel(max_batch_size=16, read_delay_ms=2, takes_rows=True,
                         stages_rows=True, **kwargs)


def _clients_until(run, seen, tries: int = 5) -> int:
    """``run()`` (a round of racing clients) until ``seen()``, at most ``tries`` times.

    Whether the batcher sees a batch a quarter at a time (and stages it) depends on thread
    timing: on a loaded machine every batch of a round may fill at once. Returns the runs."""
    runs = 0
    while runs < tries and not (runs and seen()):
        run()
        runs += 1
    return runs


def test_rows_are_staged_ahead_while_their_batch_collects_and_outputs_stay_right():
    """``stage_ahead=True``: rows go to the model (``stage_rows``) each quarter batch
    while the batch collects, and the dispatch copies only the rest; with the toy's
    "device" buffer read late, every client still gets its own rows' outputs."""
    model = _staging_model()
    try:
        with Batcher(model, max_delay_ms=20, stage_ahead=True) as b:
            runs = _clients_until(lambda: _mixed_clients(b, model),
                                  lambda: model.staged_rows_used)
    finally:
        model.close()
    assert model.stage_calls > 0
    assert model.staged_rows_used == sum(model.staged_batches) > 0
    assert b.rows_claimed_staged >= model.staged_rows_used
    assert b.rows == runs * sum(1 + (c + j) % 3 for c in range(24) for j in range(4))


def test_stage_ahead_is_off_by_default_stages_nothing_and_can_be_turned_on_live():
    """Off: a quarter batch waits in the queue and nothing is staged.
    Turned on while running: the next quarter batch is staged before the batch fills.

    The batch collects for up to 5 s, so staging does not depend on the machine's speed
    (with 24 racing clients a loaded CI machine can fill every batch before the worker
    sees a quarter of it, and nothing is staged though staging is on)."""
    model = _staging_model()
    try:
        with Batcher(model, max_batch_size=8, max_delay_ms=5000) as b:
            assert b.stage_ahead is False
            xs = [image(i, n=2) for i in range(8)]
            first = [b.submit({"input": xs[0]})]               # 2 rows: a quarter
            time.sleep(0.2)                                    # time to stage, were it on
            assert model.stage_calls == 0
            first += [b.submit({"input": x}) for x in xs[1:4]]  # 8 rows: full
            b.stage_ahead = True
            second = [b.submit({"input": xs[4]})]
            wait_until(lambda: model.stage_calls >= 1)
            second += [b.submit({"input": x}) for x in xs[5:]]
            outs = [f.result(TIMEOUT)["logits"] for f in first + second]
    finally:
        model.close()
    for out, x in zip(outs, xs):
        np.testing.assert_array_equal(out, model.reference(x))
    assert not any(model.staged_batches[:1]), model.staged_batches   # the first: none
    assert any(model.staged_batches[1:]), model.staged_batches        # the second: some


def test_a_request_cancelled_after_it_was_staged_moves_the_rows_after_it():
    """Rows staged for a batch, then one of their requests cancelled before the dispatch:
    the batch's rows after it moved up, so only the rows before it count as staged, and
    each remaining request gets its own outputs (the toy's buffer holds the cancelled
    request's rows at that place: a claim beyond them would give wrong outputs)."""
    model = _staging_model()
    try:
        with Batcher(model, max_batch_size=8, max_delay_ms=5000, stage_ahead=True) as b:
            xs = [image(i) for i in range(12)]
            first = [b.submit({"input": xs[i]}) for i in range(3)]     # 2 rows: a quarter
            wait_until(lambda: model.stage_calls >= 1)
            assert first[1].cancel()
            rest = [b.submit({"input": xs[i]}) for i in range(3, 10)]  # 9 rows queued: full
            futures = [first[0], first[2]] + rest
            outs = [f.result(TIMEOUT)["logits"] for f in futures]
    finally:
        model.close()
    for f, out, i in zip(futures, outs, [0, 2] + list(range(3, 10))):
        np.testing.assert_array_equal(out, model.reference(xs[i]))
    staged = [k for k in model.staged_batches if k]
    assert staged and staged[0] == 1, model.staged_batches   # only request 0's row held


def test_the_rest_of_a_split_request_is_staged_for_the_next_batch():
    """A request larger than a batch: its first rows go at once (a full batch), and the
    rest, at the head of the next batch, is staged as that slice while the batch collects
    and claimed at its dispatch; the reassembled outputs are the request's own."""
    model = _staging_model()
    try:
        with Batcher(model, max_batch_size=8, max_delay_ms=5000, stage_ahead=True) as b:
            big, a = image(2, n=11), image(1, n=5)
            fb = b.submit({"input": big})             # 8 rows now, 3 in the next batch
            wait_until(lambda: model.stage_calls >= 1)
            fa = b.submit({"input": a})               # 3 + 5: the next batch is full
            out_b, out_a = fb.result(TIMEOUT), fa.result(TIMEOUT)
    finally:
        model.close()
    np.testing.assert_array_equal(out_b["logits"], model.reference(big))
    np.testing.assert_array_equal(out_a["logits"], model.reference(a))
    assert model.staged_batches[-1] == 3, model.staged_batches


def test_a_batch_of_one_staged_request_is_not_copied_again():
    """One request alone in its batch (dispatched by the delay): its rows were staged, so
    the batch goes to ``infer_rows_async`` with the claim rather than to ``infer_async``,
    which would copy them again."""
    model = _staging_model()
    try:
        with Batcher(model, max_batch_size=16, max_delay_ms=50, stage_ahead=True) as b:
            x = image(3, n=6)
            out = b.infer({"input": x}, timeout=TIMEOUT)
    finally:
        model.close()
    np.testing.assert_array_equal(out["logits"], model.reference(x))
    assert model.staged_batches == [6] and model.in_place == 0


def test_rows_of_a_request_cancelled_through_asyncio_are_not_staged():
    """A request whose asyncio future was cancelled while it queued is skipped when rows
    are staged, as ``_take`` skips it (its rows would only be copied for nothing)."""
    model = _staging_model()
    staged: list[np.ndarray] = []
    real = model.stage_rows

    def spy(parts, first_row, staged_by):
        staged.extend(parts["input"])
        return real(parts, first_row, staged_by)

    model.stage_rows = spy
    xs = [image(i) for i in range(8)]

    async def run(b: Batcher):
        gone = b.submit_future({"input": xs[0]})
        gone.cancel()
        kept = [b.submit_future({"input": x}) for x in xs[1:3]]     # a quarter: staged
        while not staged:
            await asyncio.sleep(0.001)
        kept += [b.submit_future({"input": x}) for x in xs[3:]]     # the batch is full
        return await asyncio.wait_for(asyncio.gather(*kept), TIMEOUT)

    try:
        with Batcher(model, max_batch_size=8, max_delay_ms=200, stage_ahead=True) as b:
            outs = asyncio.run(run(b))
    finally:
        model.close()
    for x, out in zip(xs[1:], outs):
        np.testing.assert_array_equal(out["logits"], model.reference(x))
    assert staged and not any(np.shares_memory(p, xs[0]) for p in staged)
    assert model.staged_batches[0] == 2, model.staged_batches


def test_rows_a_model_declines_to_stage_go_at_dispatch():
    """``stage_rows`` returning False (a gap in the rows, pieces it cannot take): the
    batch's rows are all copied at dispatch and nothing is claimed as staged; a model
    whose ``stages_rows`` is False (ONNX Runtime, a GPU runner on its torch path) is not
    asked at all."""
    model = _staging_model()
    asked: list[int] = []
    model.stage_rows = lambda parts, first_row, staged_by: asked.append(first_row) or False
    try:
        with Batcher(model, max_delay_ms=20, stage_ahead=True) as b:
            _clients_until(lambda: _mixed_clients(b, model, rounds=2), lambda: asked)
        assert asked and not any(model.staged_batches) and b.rows_claimed_staged == 0
        asked.clear()
        model.stages_rows = False
        with Batcher(model, max_delay_ms=20, stage_ahead=True) as b:
            _mixed_clients(b, model, rounds=2)
        assert not asked and b.rows_claimed_staged == 0
    finally:
        model.close()


def test_two_batchers_on_one_model_do_not_take_each_other_s_staged_rows():
    """The model trusts staged rows only where the dispatching batcher staged them."""
    model = _staging_model()
    try:
        with Batcher(model, max_delay_ms=20, stage_ahead=True) as b1, \
                Batcher(model, max_delay_ms=20, stage_ahead=True) as b2, \
                ThreadPoolExecutor(2) as pool:
            def both() -> None:
                for f in [pool.submit(_mixed_clients, b, model, 12, 3) for b in (b1, b2)]:
                    f.result(TIMEOUT * 3)
            _clients_until(both, lambda: model.stage_calls)
        assert model.stage_calls > 0
    finally:
        model.close()


def test_a_batcher_has_its_model_prepare_every_batch_size_before_serving():
    """``Model.prepare`` (a GPU engine captures a CUDA graph per size) is asked for every
    size 1..max_batch_size when the batcher is made, before any request, so that no
    client waits for a size's first-batch setup; ``prepare=False`` skips it, and a model
    without ``prepare`` (ToyModel) is served as before."""
    class Preparing(ToyModel):
        def __init__(self, **kw):
            super().__init__(**kw)
            self.prepared: list[list[int]] = []

        def prepare(self, sizes):
            assert self.calls == []               # before any batch
            self.prepared.append(list(sizes))

    model = Preparing(max_batch_size=32)
    with Batcher(model, max_batch_size=12) as batcher:
        assert model.prepared == [list(range(1, 13))]
        x = np.ones((1, 3, 8, 8), np.float32)
        np.testing.assert_allclose(batcher.infer(x)["logits"], model.reference(x), rtol=1e-6)
    assert model.prepared == [list(range(1, 13))]
    unprepared = Preparing(max_batch_size=4)
    with Batcher(unprepared, prepare=False):
        pass
    assert unprepared.prepared == []
