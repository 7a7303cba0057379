"""runtime_py/staging.py: when staged rows may be added, and when a dispatch's claim on
them is believed (the runner and the batcher's toy model share these rules)."""

from __future__ import annotations

from runtime_py.staging import may_stage, rows_to_skip


def test_rows_are_staged_contiguously_within_the_max_batch():
    assert may_stage(0, 8, 0, 32)          # the first rows
    assert may_stage(8, 8, 8, 32)          # the next ones
    assert may_stage(0, 4, 8, 32)          # again from the start (a later copy wins)
    assert not may_stage(9, 1, 8, 32)      # a gap
    assert not may_stage(24, 9, 24, 32)    # past the max batch


def test_a_claim_is_believed_only_from_its_stager_and_up_to_what_is_staged():
    me, other = object(), object()
    assert rows_to_skip(8, me, 8, me, 32) == 8
    assert rows_to_skip(4, me, 8, me, 32) == 4      # a cancelled request ended the match
    assert rows_to_skip(8, me, 4, me, 32) == 0      # more than the batch holds
    assert rows_to_skip(8, me, 8, other, 32) == 0   # another caller's rows
    assert rows_to_skip(8, me, 8, me, 6) == 0       # more than the batch's rows
    assert rows_to_skip(0, me, 8, me, 32) == 0
