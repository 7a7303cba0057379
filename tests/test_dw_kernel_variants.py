"""benchmarks/dw_kernel_variants.py: the variants the H200 finding of
docs/measurements/h200-2026-12-03-g rests on compute what the shipped depthwise kernel
computes (those that keep its arithmetic: the same e4m3 codes) or, where they are not
meant to (one tap, fp16 sums), visibly differ. No GPU here: Triton's interpreter."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from triton_interpret import (interpreter_bf16_broken, needs_triton,  # noqa: E402
                             run_interpreted)

#: the variants that compute in bf16 (the ReLU before the fp32 conversion)
BF16_VARIANTS = ("relu16", "acc16")


def skip_if_bf16_broken(name: str) -> None:
    """A bf16 variant's codes say nothing where the interpreter's bf16 arithmetic is
    wrong (tests/triton_interpret.py, interpreter_bf16_broken)."""
    if name in BF16_VARIANTS and (why := interpreter_bf16_broken()):
        pytest.skip(why)


@pytest.fixture(scope="module")
def differ():
    return run_interpreted("dw_variants_interpret.py")


@needs_triton
@pytest.mark.parametrize("name", ["const", "relu16", "rowbar", "evict", "b4x16", "rowsU2",
                                  "rowsU4", "tloop3", "blk4s3", "blk2s2t2",
                                  "gath2", "gathL3", "sdot2-fp16", "sdotL3-fp16"])
def test_the_variants_that_keep_the_arithmetic_give_the_shipped_codes(differ, name):
    skip_if_bf16_broken(name)
    assert differ["nonzero"] > differ["total"] // 3, differ     # not trivially zeros
    assert differ[name] == 0.0, (name, differ)


@needs_triton
def test_fp16_sums_put_a_few_codes_a_step_off(differ):
    skip_if_bf16_broken("acc16")
    assert 0.0 < differ["acc16"] < 0.05, differ


@needs_triton
def test_the_variants_that_change_it_differ(differ):
    for name in ("center", "copy", "same9", "row3"):     # not the convolution
        assert differ[name] > 0.3, (name, differ)
