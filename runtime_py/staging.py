"""The two rules of rows staged ahead of their batch (``Batcher(stage_ahead=True)``), kept
in one place for every model that stages: the torch-aoti runner, and the toy model the
batcher's tests run against (``runtime_py.testing.AsyncToyModel``).

Why rules at all: staging fills the *next* batch's device input while that batch is
still collecting, and the batch is only known at its dispatch. The model therefore keeps,
for its next batch, how many leading rows were staged and by whom, and believes a
dispatch's claim only where those rows are the claimant's: another caller may have taken
the batch slot meanwhile, or a second batcher staged into it.
"""

from __future__ import annotations


def may_stage(first_row: int, rows: int, held_rows: int, max_rows: int) -> bool:
    """Whether ``rows`` rows may be staged from row ``first_row`` of a batch whose first
    ``held_rows`` rows are staged by the same caller: anywhere up to those (a later copy
    overwrites an earlier one: the copies run in order), never past them (a gap) nor past
    the max batch."""
    return 0 <= first_row <= held_rows and first_row + rows <= max_rows


def rows_to_skip(claimed: int, claimed_by: object, held_rows: int, held_by: object,
                 batch_rows: int) -> int:
    """The leading rows a dispatch need not copy again: all it claims, where the batch
    holds at least that many rows staged by the claimant; else none."""
    if 0 < claimed <= min(held_rows, batch_rows) and held_by is claimed_by:
        return claimed
    return 0
