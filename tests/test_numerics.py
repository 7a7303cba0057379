"""Numeric verification of a bundle's engine against its stored reference outputs."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from synthetic_bundles import ort_outputs, tensorrt_engine, tiny_onnx, write_source_bundle  # noqa: E402

from runtime_py.errors import EngineUnavailableError  # noqa: E402
from runtime_py.format import open_bundle  # noqa: E402
from runtime_py.numerics import TOLERANCES, Tolerance, check_numerics, compare_output  # noqa: E402


def test_tolerance_table_covers_every_precision_and_fp32_is_strict():
    assert set(TOLERANCES) == {"fp32", "fp16", "fp8"}
    assert TOLERANCES["fp32"] == Tolerance(max_abs=1e-3, near_tie_flips=False)
    assert TOLERANCES["fp32"].max_abs < TOLERANCES["fp16"].max_abs < TOLERANCES["fp8"].max_abs


def test_compare_output_counts_top1_flips_and_excuses_near_ties_only_when_allowed():
    ref = np.array([[1.0, 0.99, 0.0], [3.0, 0.0, 0.0]])
    got = np.array([[0.99, 1.0, 0.0], [3.0, 0.0, 0.0]])
    loose = compare_output("logits", got, ref, Tolerance(0.05, True))
    assert (loose.top1_mismatches, loose.decisive_top1_mismatches) == (1, 0)
    assert loose.top1_agreement == 0.5 and loose.max_abs_diff == pytest.approx(0.01)
    strict = compare_output("logits", got, ref, Tolerance(1e-3, False))
    assert strict.decisive_top1_mismatches == 1


def test_allowance_grows_with_the_output_magnitude_only_above_typical_logits():
    tol = Tolerance(0.25, True)
    small = np.array([[9.0, -3.0, 1.0]])
    assert compare_output("logits", small + 0.2, small, tol).allowed_max_abs == 0.25
    # seeded random ResNet-50 weights: logits ~1,500, two correct fp8 engines ~20 apart
    big = np.array([[1500.0, -700.0, 3.0], [200.0, 900.0, -1.0]])
    cmp = compare_output("logits", big + 20.0, big, tol)
    assert cmp.allowed_max_abs == pytest.approx(0.25 * 150)
    assert cmp.max_abs_diff < cmp.allowed_max_abs
    # still a failure when the difference is large for that magnitude
    assert compare_output("logits", big * 1.1, big, tol).max_abs_diff > cmp.allowed_max_abs


def test_compare_output_reports_vs_fp32():
    ref = np.zeros((2, 3))
    cmp = compare_output("logits", ref + 0.5, ref + 0.5, Tolerance(1e-3, False), fp32=ref)
    assert cmp.max_abs_diff == 0 and cmp.fp32_max_abs_diff == 0.5 and cmp.fp32_top1_agreement == 1


@pytest.fixture
def bundle_path(tmp_path):
    return write_source_bundle(tmp_path)


def test_onnxruntime_bundle_passes(bundle_path):
    pytest.importorskip("onnxruntime")
    with open_bundle(bundle_path) as b:
        report = check_numerics(b)
    assert report.ran and report.passed and report.reasons == []
    assert report.backend == "onnxruntime" and report.inputs == 6
    assert report.outputs[0].max_abs_diff <= 1e-5 and report.outputs[0].top1_agreement == 1.0


def test_reference_that_does_not_match_fails_with_reasons(tmp_path):
    pytest.importorskip("onnxruntime")
    from safetensors.numpy import save

    onnx_bytes = tiny_onnx()
    x = np.random.default_rng(3).standard_normal((5, 3, 8, 8)).astype(np.float32)
    out = ort_outputs(onnx_bytes, x)
    wrong = out.copy()
    wrong[:, 0] += 100.0                      # class 0 now leads clearly in the reference
    ref = save({"input.input": x, "fp32.logits": out, "bundle.logits": wrong})
    path = write_source_bundle(tmp_path, onnx_bytes=onnx_bytes, reference=ref)
    with open_bundle(path) as b:
        report = check_numerics(b)
    assert report.ran and report.passed is False
    assert any("max |diff|" in r for r in report.reasons)
    assert any("top-1 differs" in r for r in report.reasons)
    assert report.outputs[0].fp32_max_abs_diff <= 1e-5


def test_more_reference_rows_than_max_batch_are_split(tmp_path):
    pytest.importorskip("onnxruntime")
    from synthetic_bundles import reference_member

    onnx_bytes = tiny_onnx()
    path = write_source_bundle(tmp_path, onnx_bytes=onnx_bytes,
                               reference=reference_member(onnx_bytes, n=11))
    seen = []

    def factory(bundle):
        from runtime_py.engines import runner_class

        runner = runner_class("onnxruntime")(bundle)
        infer = runner.infer
        runner.infer = lambda feeds: (seen.append(len(feeds["input"])), infer(feeds))[1]
        return runner

    with open_bundle(path) as b:
        report = check_numerics(b, runner_factory=factory)
    assert report.passed and seen == [4, 4, 3]


@pytest.mark.skipif(importlib.util.find_spec("tensorrt") is not None,
                    reason="TensorRT is installed: a tensorrt bundle could run here")
def test_engine_that_cannot_run_here_raises_or_is_skipped(tmp_path):
    path = write_source_bundle(tmp_path, engine=tensorrt_engine(), engine_member=b"opaque",
                               name="tiny-fp32-1-tensorrt")
    with open_bundle(path) as b:
        with pytest.raises(EngineUnavailableError, match=r"trt-bundle\[trt\]"):
            check_numerics(b)
        report = check_numerics(b, skip_unavailable=True)
        assert report.ran is False and report.passed is None and "TensorRT" in report.reasons[0]
        if importlib.util.find_spec("onnxruntime"):
            assert check_numerics(b, backend="onnxruntime").passed
