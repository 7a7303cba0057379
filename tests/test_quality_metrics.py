"""The quality metrics against hand-computed cases, and the stress set's promises."""

import math

import numpy as np
import pytest

from bundler.evaluate import quality_figures, stress_figures
from bundler.quality import compare_logits, decimal, kl_divergence, top1_accuracy
from bundler.stress import stress_inputs
from runtime_py.bench import device_timings

LN3 = math.log(3.0)


# --- top-1 agreement / accuracy ------------------------------------------------------------

def test_top1_agreement_counts_matching_argmax_rows():
    ref = np.array([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0], [0.0, 5.0, 1.0], [2.0, 0.0, 0.0]])
    test = np.array([[0.0, 0.0, 9.0], [0.0, 1.0, 0.0], [0.0, 5.0, 1.0], [1.0, 0.5, 0.5]])
    # argmax ref: 2, 0, 1, 0; test: 2, 1, 1, 0 -> 3 of 4 agree
    assert compare_logits(ref, test)["top1_agreement"] == pytest.approx(0.75)


def test_top1_accuracy_against_labels():
    logits = np.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4], [0.0, 1.0]])
    labels = np.array([1, 1, 1, 0, 0])  # predictions 1, 0, 1, 0, 1 -> 3 of 5 right
    assert top1_accuracy(logits, labels) == pytest.approx(0.6)


def test_quality_figures_adds_accuracy_only_with_labels():
    ref = np.array([[0.0, 1.0], [1.0, 0.0]])
    test = np.array([[0.0, 1.0], [0.0, 1.0]])
    assert "top1_accuracy" not in quality_figures(ref, test)
    q = quality_figures(ref, test, np.array([1, 0]))
    assert q["top1_accuracy"] == pytest.approx(0.5)           # test predicts 1, 1
    assert q["reference_top1_accuracy"] == pytest.approx(1.0)  # reference predicts 1, 0
    assert q["top1_agreement"] == pytest.approx(0.5)


# --- KL divergence ----------------------------------------------------------------------------

def test_kl_two_classes_by_hand():
    # p = softmax(0, 0) = (1/2, 1/2); q = softmax(0, ln 3) = (1/4, 3/4)
    # KL(p||q) = 1/2 ln(2) + 1/2 ln(2/3) = 1/2 ln(4/3)
    kl = kl_divergence(np.array([[0.0, 0.0]]), np.array([[0.0, LN3]]))
    assert kl[0] == pytest.approx(0.5 * math.log(4 / 3), rel=1e-12)


def test_kl_three_classes_by_hand_and_direction():
    # p = (1/3, 1/3, 1/3); q = softmax(0, ln 2, 0) = (1/4, 1/2, 1/4)
    # KL(p||q) = 1/3 [ln(4/3) + ln(2/3) + ln(4/3)] = 1/3 ln(32/27)
    p_logits, q_logits = np.zeros((1, 3)), np.array([[0.0, math.log(2.0), 0.0]])
    assert kl_divergence(p_logits, q_logits)[0] == pytest.approx(math.log(32 / 27) / 3, rel=1e-12)
    # KL(q||p) = 1/4 ln(3/4) + 1/2 ln(3/2) + 1/4 ln(3/4): not symmetric
    reverse = 0.5 * math.log(3 / 4) + 0.5 * math.log(3 / 2)
    assert kl_divergence(q_logits, p_logits)[0] == pytest.approx(reverse, rel=1e-12)


def test_kl_is_shift_invariant_and_zero_for_equal_distributions():
    logits = np.array([[1.0, 2.0, 3.0]])
    assert kl_divergence(logits, logits + 100.0)[0] == pytest.approx(0.0, abs=1e-12)
    # large logits must not overflow (stable log-softmax)
    assert np.isfinite(kl_divergence(logits * 1e4, logits * 1e4 + 1.0)).all()


def test_compare_logits_kl_mean_is_the_row_mean():
    ref = np.array([[0.0, 0.0], [0.0, 0.0]])
    test = np.array([[0.0, LN3], [0.0, 0.0]])
    assert compare_logits(ref, test)["kl_mean"] == pytest.approx(0.25 * math.log(4 / 3))


# --- max |diff| --------------------------------------------------------------------------------

def test_max_abs_diff_by_hand():
    ref = np.array([[1.0, -2.0, 3.0], [0.5, 0.5, 0.5]])
    test = np.array([[1.5, -2.0, 2.0], [0.5, -1.25, 0.5]])  # diffs .5, 0, 1 ; 0, 1.75, 0
    assert compare_logits(ref, test)["max_abs_diff"] == pytest.approx(1.75)


# --- NaN / Inf -----------------------------------------------------------------------------------

def test_nan_and_inf_are_counted_and_their_rows_left_out():
    ref = np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    test = np.array([
        [np.nan, 1.0, np.nan],   # 2 NaN: row left out
        [np.inf, 0.0, -np.inf],  # 2 Inf: row left out
        [0.0, 0.0, 1.0],         # agrees, diff 0
        [5.0, 2.0, 0.0],         # disagrees, diff 5
    ])
    c = compare_logits(ref, test)
    assert (c["nan_count"], c["inf_count"], c["images"]) == (2, 2, 4)
    assert c["top1_agreement"] == pytest.approx(0.5)   # over the 2 finite rows
    assert c["max_abs_diff"] == pytest.approx(5.0)


def test_nonfinite_reference_rows_are_left_out_but_not_counted():
    ref = np.array([[np.nan, 0.0], [0.0, 1.0]])
    test = np.array([[0.0, 1.0], [0.0, 1.0]])
    c = compare_logits(ref, test)
    assert (c["nan_count"], c["inf_count"]) == (0, 0)  # the counts are the bundle's
    assert c["top1_agreement"] == 1.0 and c["max_abs_diff"] == 0.0


def test_no_finite_row_gives_nan_figures():
    c = compare_logits(np.zeros((2, 2)), np.full((2, 2), np.nan))
    assert c["nan_count"] == 4
    assert all(math.isnan(c[k]) for k in ("top1_agreement", "kl_mean", "max_abs_diff"))
    assert decimal(c["kl_mean"]) == "nan" and decimal(float("-inf")) == "-inf"


def test_shape_mismatch_is_refused():
    with pytest.raises(ValueError):
        compare_logits(np.zeros((2, 3)), np.zeros((2, 4)))


def test_stress_figures_name_the_inputs_that_break():
    ref = np.array([[0.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    test = np.array([[0.0, 1.0], [np.inf, 0.0], [1.0, 0.0]])
    s = stress_figures(("a", "b", "c"), ref, test)
    assert s["totals"]["nonfinite_inputs"] == ["b"]
    assert s["totals"]["reference_nonfinite_inputs"] == []
    assert s["totals"]["inf_count"] == 1
    assert s["inputs"]["a"]["top1_agree"] and not s["inputs"]["c"]["top1_agree"]
    assert s["inputs"]["b"]["inf_count"] == 1


# --- the stress set --------------------------------------------------------------------------------

INCEPTION = {"rescale": {"factor": 1 / 255}, "normalize": {"mean": [0.5] * 3, "std": [0.5] * 3}}
IMAGENET = {"rescale": {"factor": 1 / 255},
            "normalize": {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}}


@pytest.fixture(scope="module")
def stress():
    return stress_inputs((3, 64, 48), INCEPTION)


def test_stress_shapes_names_and_dtype(stress):
    assert stress.inputs.shape == (len(stress.names), 3, 64, 48)
    assert stress.inputs.dtype == np.float32
    assert len(set(stress.names)) == len(stress.names)
    for name in ("zeros", "ones", "minus_ones", "saturated_c0", "saturated_c1", "saturated_c2",
                 "noise_pm10", "checker_1px", "checker_16px", "mid_gray", "bright_pixel"):
        assert name in stress.names


def test_stress_is_deterministic(stress):
    again = stress_inputs((3, 64, 48), INCEPTION)
    assert again.names == stress.names
    assert again.inputs.tobytes() == stress.inputs.tobytes()


def get(s, name):
    return s.inputs[s.names.index(name)]


def test_constant_inputs(stress):
    assert (get(stress, "zeros") == 0).all()
    assert (get(stress, "ones") == 1).all()
    assert (get(stress, "minus_ones") == -1).all()
    gray = get(stress, "mid_gray")
    assert np.allclose(gray, (128 / 255 - 0.5) / 0.5)


def test_saturated_channels_are_one_at_max_the_others_at_min():
    for spec, lo, hi in ((INCEPTION, [-1.0] * 3, [1.0] * 3),
                         (IMAGENET, [-0.485 / 0.229, -0.456 / 0.224, -0.406 / 0.225],
                          [(1 - 0.485) / 0.229, (1 - 0.456) / 0.224, (1 - 0.406) / 0.225])):
        s = stress_inputs((3, 8, 8), spec)
        for k in range(3):
            img = get(s, f"saturated_c{k}")
            for c in range(3):
                want = hi[c] if c == k else lo[c]
                assert np.allclose(img[c], want, atol=1e-6), (k, c)


def test_checkerboards_alternate_at_their_square_size(stress):
    fine = get(stress, "checker_1px")
    assert np.allclose(fine[:, 0, 0], 1) and np.allclose(fine[:, 0, 1], -1)
    assert np.allclose(fine[:, 1, 0], -1) and np.allclose(fine[:, 1, 1], 1)
    assert np.allclose(fine[:, :-1, :] + fine[:, 1:, :], 0)   # every vertical neighbour flips
    assert np.allclose(fine[:, :, :-1] + fine[:, :, 1:], 0)   # every horizontal neighbour flips
    coarse = get(stress, "checker_16px")
    assert np.allclose(coarse[:, :16, :16], 1) and np.allclose(coarse[:, :16, 16:32], -1)
    assert np.allclose(coarse[:, 16:32, :16], -1) and np.allclose(coarse[:, 16:32, 16:32], 1)
    assert set(np.unique(coarse)) == {-1.0, 1.0}


def test_noise_goes_beyond_the_normalized_range(stress):
    noise = get(stress, "noise_pm10")
    assert np.abs(noise).max() <= 10 and np.abs(noise).max() > 9
    assert (np.abs(noise) > 1).mean() > 0.8


def test_single_bright_pixel(stress):
    img = get(stress, "bright_pixel")
    bright = np.argwhere((img == 1).all(axis=0))
    assert bright.tolist() == [[32, 24]]
    assert (img == -1).sum() == img.size - 3


# --- device_timings protocol -----------------------------------------------------------------------

def test_device_timings_is_none_for_runners_without_it():
    assert device_timings(object(), 1) is None


def test_device_timings_passes_and_checks_the_runner_method():
    class Fake:
        def device_timings(self, batch_size, iterations, warmup):
            self.args = (batch_size, iterations, warmup)
            return {"graph_replay": [0.001] * iterations, "with_copies": [0.002] * iterations}

    runner = Fake()
    result = device_timings(runner, 4, iterations=5, warmup=2)
    assert runner.args == (4, 5, 2)
    assert result == {"graph_replay": [0.001] * 5, "with_copies": [0.002] * 5}

    class Bad:
        def device_timings(self, batch_size, iterations, warmup):
            return {"kernel_only": [0.001]}

    with pytest.raises(ValueError, match="kernel_only"):
        device_timings(Bad(), 1)


def test_time_boundaries_warms_up_then_times_exactly_the_iterations():
    from runtime_py.bench import time_boundaries

    calls = {"a": 0, "b": 0}

    def step(key):
        def run():
            calls[key] += 1
        return run

    times = time_boundaries({"a": step("a"), "b": step("b")}, iterations=7, warmup=3)
    assert calls == {"a": 10, "b": 10}
    assert [len(times["a"]), len(times["b"])] == [7, 7] and min(times["a"]) >= 0


def test_random_feeds_follow_the_specs():
    from runtime_py.bench import random_feeds
    from runtime_py.tensors import TensorSpec

    specs = [TensorSpec("input", "float32", ("batch", 3, 4, 4)),
             TensorSpec("mask", "float16", ("batch", 2))]
    feeds = random_feeds(specs, 5)
    assert feeds["input"].shape == (5, 3, 4, 4) and feeds["input"].dtype == np.float32
    assert feeds["mask"].shape == (5, 2) and feeds["mask"].dtype == np.float16
    assert -1 <= feeds["input"].min() and feeds["input"].max() <= 1
    np.testing.assert_array_equal(feeds["input"], random_feeds(specs, 5)["input"])  # seeded
