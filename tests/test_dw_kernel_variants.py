"""benchmarks/dw_kernel_variants.py: the variants the H200 finding of
docs/measurements/h200-2026-12-03-g rests on compute what the shipped depthwise kernel
computes (those that keep its arithmetic: the same e4m3 codes) or, where they are not
meant to (one tap, fp16 sums), visibly differ. No GPU here: Triton's interpreter."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from triton_interpret import needs_triton, run_interpreted  # noqa: E402


@pytest.fixture(scope="module")
def differ():
    return run_interpreted("dw_variants_interpret.py")


@needs_triton
@pytest.mark.parametrize("name", ["const", "relu16", "rowbar", "evict", "b4x16", "rowsU2",
                                  "rowsU4", "tloop3", "blk4s3", "blk2s2t2",
                                  "gath2", "gathL3", "sdot2-fp16", "sdotL3-fp16"])
def test_the_variants_that_keep_the_arithmetic_give_the_shipped_codes(differ, name):
    assert differ["nonzero"] > differ["total"] // 3, differ     # not trivially zeros
    assert differ[name] == 0.0, (name, differ)


@needs_triton
def test_the_variants_that_change_it_differ(differ):
    assert 0.0 < differ["acc16"] < 0.05, differ          # fp16 sums: a few codes a step off
    for name in ("center", "copy", "same9", "row3"):     # not the convolution
        assert differ[name] > 0.3, (name, differ)
