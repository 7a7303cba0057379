"""The worker's ``SlotArena``: runs never overlap, and the lowest free run is handed out
(so a few slots stay in use and their pages stay resident)."""

from __future__ import annotations

import random

from runtime_py.server.workers import SlotArena


def _lowest_run(free: list[bool], k: int) -> int | None:
    for start in range(len(free) - k + 1):
        if all(free[start:start + k]):
            return start
    return None


def test_allocations_are_the_lowest_free_runs_and_never_overlap():
    arena = SlotArena(None, 10, 40)
    held: list[tuple[int, int]] = []
    rng = random.Random(0)
    for _ in range(5000):
        if held and rng.random() < 0.5:
            arena.release(*held.pop(rng.randrange(len(held))))
            continue
        nbytes = rng.randint(1, 45)
        expected = _lowest_run(arena.free, max(1, -(-nbytes // 10)))
        offset = arena.alloc(nbytes)
        assert offset == (None if expected is None else expected * 10)
        if offset is not None:
            held.append((offset, nbytes))
    used = [False] * 40
    for offset, nbytes in held:
        for j in range(offset // 10, offset // 10 + max(1, -(-nbytes // 10))):
            assert not used[j]
            used[j] = True
    assert used == [not f for f in arena.free]


def test_a_released_slot_is_reused_before_untouched_ones():
    arena = SlotArena(None, 10, 8)
    a, b = arena.alloc(10), arena.alloc(10)
    arena.release(a, 10)
    assert arena.alloc(10) == a
    assert b == 10
