"""runtime_py/server/gc_tuning.py: the collector's settings while serving, restored after."""

from __future__ import annotations

import gc
import threading

from runtime_py.server.gc_tuning import SERVING_GEN0_THRESHOLD, serving_gc


def test_serving_freezes_and_raises_the_young_threshold_then_restores_both():
    before = gc.get_threshold()
    frozen_before = gc.get_freeze_count()
    kept = [object() for _ in range(10)]      # alive at entry: frozen with the rest
    with serving_gc():
        inside = gc.get_threshold()
        assert inside[0] == max(SERVING_GEN0_THRESHOLD, before[0])
        assert inside[1:] == before[1:]
        assert gc.get_freeze_count() > frozen_before
        # a cycle made while serving is still collected
        a: list = []
        a.append(a)
        del a
        assert gc.collect() >= 1
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == frozen_before == 0
    del kept


def test_the_last_of_two_servers_restores_the_settings():
    """Two servers in one process (tests, a benchmark): the first to stop leaves the
    serving settings to the other; the last restores the process's own."""
    before = gc.get_threshold()
    first_in, second_done, first_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def first():
        with serving_gc():
            first_in.set()
            second_done.wait(10)
            seen["after second left"] = gc.get_threshold()
        first_out.set()

    t = threading.Thread(target=first)
    t.start()
    assert first_in.wait(10)
    with serving_gc():
        assert gc.get_threshold()[0] == max(SERVING_GEN0_THRESHOLD, before[0])
    second_done.set()
    t.join(10)
    assert first_out.is_set()
    assert seen["after second left"][0] == max(SERVING_GEN0_THRESHOLD, before[0])
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
