"""The "auto" dispatch rule's bookkeeping (``runtime_py.dispatch_choice``), driven with
made-up batch times: each rule serves batches of its own size at its own rate."""

from __future__ import annotations

import pytest

from runtime_py import dispatch_choice as dc
from runtime_py.dispatch_choice import DispatchChooser

# (rows per batch, seconds per batch) under each rule: H200-like shapes, fp8 engine whose
# clients' round trip outlasts a batch (early wins) and fp16 engine (waiting wins).
FP8 = {False: (32, 0.00533), True: (24, 0.00370)}     # 6,004 vs 6,486 rows/s
FP16 = {False: (32, 0.00600), True: (22, 0.00558)}    # 5,333 vs 3,943 rows/s


def serve(chooser: DispatchChooser, batches: int, rules: dict, t: float = 0.0,
          log: list | None = None) -> float:
    """Feed ``batches`` batches, each shaped by the rule in use when it was collected."""
    for _ in range(batches):
        rows, seconds = rules[chooser.early]
        t += seconds
        if log is not None:
            log.append(chooser.early)
        chooser.on_batch(t, rows)
    return t


def test_early_takes_over_where_it_serves_more_rows_per_second():
    c = DispatchChooser()
    assert c.early is False                       # today's rule until measured
    log: list[bool] = []
    serve(c, 2000, FP8, log=log)
    assert c.trials >= 1 and c.switches == 1
    assert c.chosen == "early"
    wait_rate, early_rate = c.last_rates
    assert early_rate > wait_rate
    # the first trial comes after HOLD_FIRST batches, then early serves nearly always
    assert log.index(True) == dc.HOLD_FIRST
    assert log[-1000:].count(False) < 0.1 * 1000


def test_waiting_stays_where_it_serves_more_and_trials_grow_rarer():
    c = DispatchChooser()
    log: list[bool] = []
    serve(c, 6000, FP16, log=log)
    assert c.switches == 0 and c.chosen == "wait"
    assert c.trials >= 3
    # trial starts: the first after HOLD_FIRST, then each hold twice the last
    starts = [i for i in range(1, len(log)) if log[i] and not log[i - 1]]
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert all(g2 > g1 for g1, g2 in zip(gaps, gaps[1:])), gaps
    assert log.count(True) < 0.05 * len(log)      # little time spent on the losing rule


def test_a_rule_change_of_the_traffic_is_followed():
    c = DispatchChooser()
    t = serve(c, 1500, FP8)
    assert c.chosen == "early"
    serve(c, 3000, FP16, t)                        # the engine slowed: waiting wins again
    assert c.chosen == "wait"
    assert c.switches == 2


def test_a_margin_keeps_the_incumbent_on_a_near_tie():
    c = DispatchChooser()
    # early 2% faster: within MARGIN, not worth a switch
    serve(c, 3000, {False: (32, 0.00500), True: (32, 0.00490)})
    assert c.trials >= 2 and c.switches == 0 and c.chosen == "wait"


def test_a_pause_voids_the_trial_in_progress():
    c = DispatchChooser()
    t = serve(c, dc.HOLD_FIRST + 2, FP8)           # the trial (early) has begun
    assert c.early is True and c.trials == 0
    t += 1.0                                       # the clients went away for a second
    c.on_batch(t, 32)
    assert c.early is False and c.trials == 0      # back to the incumbent, nothing decided
    assert c.chosen == "wait"


@pytest.mark.parametrize("rows", [0, 1])
def test_batches_at_one_instant_do_not_divide_by_zero(rows):
    c = DispatchChooser()
    for _ in range(dc.HOLD_FIRST + dc.SETTLE + dc.MEASURE + 5):
        c.on_batch(1.0, rows)
    assert c.switches == 0
