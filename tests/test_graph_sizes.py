"""runtime_py.graph_sizes: which batch sizes get a CUDA graph, and which graph runs a
batch (``cuda_graph_sizes``; `bundle serve --cuda-graph-sizes`)."""

from __future__ import annotations

import pytest

from runtime_py.errors import UsageError
from runtime_py.graph_sizes import graph_batch, parse_graph_sizes


def test_every_size_by_default():
    assert parse_graph_sizes(None, 32) is None
    assert [graph_batch(None, n) for n in (1, 7, 32)] == [1, 7, 32]


@pytest.mark.parametrize("given", ["8,1,4,4", " 8, 1,4 ,", [4, 1, 8], (8, 4, 1)])
def test_sizes_are_sorted_once_each_with_the_max_among_them(given):
    assert parse_graph_sizes(given, 8) == (1, 4, 8)


def test_the_max_is_always_captured_and_sizes_above_it_are_dropped():
    """One list for several bundles (`bundle serve a.bundle b.bundle --cuda-graph-sizes
    ...`): each keeps the sizes up to its own max, as --max-batch is capped per bundle."""
    assert parse_graph_sizes("2", 8) == (2, 8)
    assert parse_graph_sizes(4, 8) == (4, 8)
    assert parse_graph_sizes("1,2,4,8,16,24", 8) == (1, 2, 4, 8)
    assert parse_graph_sizes("1,2,4,8,16,24", 32) == (1, 2, 4, 8, 16, 24, 32)
    assert parse_graph_sizes("64", 32) == (32,)


def test_a_batch_runs_on_the_next_listed_size():
    sizes = parse_graph_sizes("1,2,4,8,16,24", 32)
    assert sizes == (1, 2, 4, 8, 16, 24, 32)
    got = {n: graph_batch(sizes, n) for n in range(1, 33)}
    assert got[1] == 1 and got[3] == 4 and got[5] == 8 and got[16] == 16
    assert got[17] == 24 and got[25] == 32 and got[32] == 32
    assert all(got[n] >= n and got[n] in sizes for n in got)
    assert graph_batch(sizes, 40) == 40                # beyond the max: itself


@pytest.mark.parametrize("given", ["0,4", "", "a,b", "2.5", "-1", [], [-1], [2.5], ["a"],
                                   [True], 0])
def test_sizes_that_are_not_positive_integers_are_usage_errors(given):
    with pytest.raises(UsageError, match="CUDA graph sizes must be positive integer"):
        parse_graph_sizes(given, 32)
