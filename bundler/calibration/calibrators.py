"""Calibrators: from one tensor's statistics (|x| histogram + exact max) to an FP8 amax.

Every calibrator returns ``amax``; the FP8 scale is ``amax / 448`` (E4M3FN's largest
value), see :func:`scale_from_amax`. All work on the histogram of ``|x|`` because the
quantization is symmetric (no zero point). Candidate thresholds of ``percentile``,
``entropy`` and ``mse`` are bin edges ``T_i = i * bin_width``; none is above the exact
max, and the result is clamped to the exact max (a threshold past every observed value
only wastes FP8 range).

``max``
    The exact absolute max over all calibration data (not a bin edge). The recipe's
    default: nothing is clipped, and FP8's floating-point grid keeps small values
    precise anyway.
``percentile`` (``p``, e.g. 99.99)
    The upper edge of the first bin at which the cumulative count reaches ``p`` % of all
    values: at least ``p`` % of the values are <= amax. Clamped to the exact max.
``entropy``
    TensorRT's classic (INT8) entropy calibrator, with its quantization step replaced by
    FP8's. For each candidate ``i`` from ``start_bin`` (128, as TensorRT) to the last
    non-empty bin + 1:

    * ``P`` = ``hist[:i]`` with the count of all bins ``>= i`` (the values the threshold
      clips) added to bin ``i-1``; normalised.
    * ``Q`` = ``hist[:i]`` quantized: INT8's rule merges the ``i`` bins into 128 equal
      groups. Here each bin's centre is mapped to FP8 with scale ``T_i / 448``
      (round-to-nearest-even) and bins that land on the same E4M3 level form a group
      (E4M3 has 127 non-negative levels, close to INT8's 128, but spaced geometrically).
      Each group's count is spread evenly over its non-empty bins; empty bins stay 0
      (TensorRT's "expand" step). Normalised.
    * ``KL(P || Q) = sum P log(P / Q)`` over bins with ``P > 0``; infinite when some
      ``P > 0`` has ``Q = 0`` (only possible in the clipped last bin).

    The candidate with the smallest divergence wins; ties (within 1e-9 relative) go to
    the largest threshold (as pytorch-quantization's ``last_argmin``). amax = ``T_i``. Why this adaptation:
    the INT8 algorithm's only INT8-specific part is "which bins become one quantized
    value"; answering that with the FP8 grid keeps its meaning (information lost by the
    mapping to the quantized grid plus clipping). Near zero the FP8 grid is finer than
    the histogram, so those bins are their own groups and cost nothing: the divergence
    is driven by the coarse top of the range and by clipping, as it should be for FP8.
``mse``
    For the same candidates, the mean squared error of FP8 fake-quantization with scale
    ``T_i / 448`` (saturating, so clipping is counted) over the whole histogram, each bin
    represented by its centre: ``sum_j hist_j (c_j - fq(c_j))^2 / sum hist``. Smallest
    error wins, ties (within 1e-9 relative) to the largest threshold (modelopt's
    ``_compute_amax_mse`` with the FP8 quantizer in place of INT8).

A tensor that was zero on every image has amax 0; its scale is then 1/448 (any positive
scale is exact for zeros, and a zero scale would make QuantizeLinear divide by zero).
"""

from __future__ import annotations

import numpy as np

from runtime_py.errors import UsageError

from bundler.fp8 import E4M3_MAX, E4M3_POSITIVE_LEVELS, fp8_e4m3_codes, fp8_e4m3_round
from .histogram import TensorStats

METHODS = ("max", "percentile", "entropy", "mse")
DEFAULT_PERCENTILE = 99.99
START_BIN = 128


def scale_from_amax(amax: float) -> float:
    """FP8 E4M3 per-tensor scale for ``amax``, computed in float32 (deterministic)."""
    if amax <= 0.0:
        return float(np.float32(1.0) / np.float32(E4M3_MAX))
    return float(np.float32(amax) / np.float32(E4M3_MAX))


def check_method(method: str, percentile: float | None = None) -> None:
    """Refuse an unknown method or a percentile outside (0, 100]."""
    if method not in METHODS:
        raise UsageError(
            f"unknown calibration method {method!r}: choose one of {', '.join(METHODS)}"
        )
    if method == "percentile":
        if percentile is None or not 0.0 < float(percentile) <= 100.0:
            raise UsageError(
                f"percentile must be in (0, 100], got {percentile!r} (e.g. 99.99)"
            )


def compute_amax(stats: TensorStats, method: str, percentile: float = DEFAULT_PERCENTILE) -> float:
    """Dispatch to one calibrator; returns amax as a float32-representable float."""
    check_method(method, percentile)
    if method != "max" and stats.bins == 0:
        raise ValueError(f"method {method!r} needs a histogram; {stats.name!r} was collected without")
    if method == "max":
        amax = amax_max(stats)
    elif method == "percentile":
        amax = amax_percentile(stats, percentile)
    elif method == "entropy":
        amax = amax_entropy(stats)
    else:
        amax = amax_mse(stats)
    return float(np.float32(amax))


def amax_max(stats: TensorStats) -> float:
    """The exact absolute max seen."""
    return float(stats.amax)


def _last_candidate(stats: TensorStats) -> int:
    """One past the last non-empty bin: no candidate threshold is above the data."""
    nonzero = np.flatnonzero(stats.hist)
    return int(nonzero[-1]) + 1 if nonzero.size else 0


def amax_percentile(stats: TensorStats, percentile: float) -> float:
    """Upper edge of the first bin where the cumulative count reaches ``percentile`` %."""
    if stats.range is None:
        return 0.0
    cdf = np.cumsum(stats.hist)
    target = float(percentile) / 100.0 * float(cdf[-1])
    idx = int(np.searchsorted(cdf, target, side="left"))
    idx = min(idx, stats.bins - 1)
    return min((idx + 1) * stats.bin_width, stats.amax)


def _candidates(stats: TensorStats, start_bin: int) -> np.ndarray:
    last = _last_candidate(stats)
    first = min(start_bin, last)
    return np.arange(max(first, 1), last + 1)


def _pick_last_min(values: np.ndarray, candidates: np.ndarray) -> int:
    """Candidate with the smallest value; ties (within 1e-9 relative) go to the largest.

    The tolerance keeps the choice independent of summation order, so a vectorised and a
    literal implementation agree.
    """
    best = float(np.min(values))
    tied = values <= best + 1e-9 * abs(best) + 1e-300
    return int(candidates[np.flatnonzero(tied)[-1]])


def kl_divergences_fp8(hist: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """KL(P || Q) for each candidate ``i`` (threshold at the upper edge of bin ``i-1``).

    Vectorised over all (candidate, bin) pairs at once; see the module docstring for P and
    Q. Uses ``KL = (1/Sp) sum_j p_j log(p_j / q_j) + log(Sq / Sp)`` with unnormalised
    ``p``, ``q``, ``Sp = sum(hist)`` (outliers are folded in, so P keeps all the mass) and
    ``Sq = sum(hist[:i])`` (the expand step preserves each group's mass).
    """
    hist = np.asarray(hist, dtype=np.float64)
    candidates = np.asarray(candidates, dtype=np.int64)
    cumulative = np.cumsum(hist)
    total = cumulative[-1]
    lengths = candidates
    owner = np.repeat(np.arange(len(candidates)), lengths)  # candidate of each pair
    starts = np.cumsum(lengths) - lengths
    j = np.arange(owner.size) - np.repeat(starts, lengths)  # bin of each pair
    i = candidates[owner]
    # Bin centres in FP8 units for scale T_i / 448: (j + 0.5) * w * 448 / (i * w).
    codes = fp8_e4m3_codes(((j + 0.5) * (E4M3_MAX / i)).astype(np.float32)).astype(np.int64)
    group = owner * E4M3_POSITIVE_LEVELS + codes
    kept = hist[j]
    nonempty = kept > 0
    n_groups = len(candidates) * E4M3_POSITIVE_LEVELS
    group_sum = np.bincount(group, weights=kept, minlength=n_groups)
    group_nonempty = np.bincount(group, weights=nonempty, minlength=n_groups)
    p = kept.copy()
    last = j == i - 1
    p[last] += total - cumulative[i[last] - 1]  # clipped values land in the last bin
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(nonempty, group_sum[group] / group_nonempty[group], 0.0)
        terms = np.where(p > 0, p * np.log(p / q), 0.0)
    kl = np.bincount(owner, weights=terms, minlength=len(candidates)) / total
    sq = cumulative[candidates - 1]
    with np.errstate(divide="ignore", invalid="ignore"):
        kl = kl + np.log(sq / total)
    impossible = np.bincount(owner, weights=(p > 0) & (q == 0), minlength=len(candidates)) > 0
    kl[impossible | (sq == 0)] = np.inf
    return kl


def amax_entropy(stats: TensorStats, start_bin: int = START_BIN) -> float:
    """TensorRT's entropy (KL) calibrator with FP8 E4M3 levels; see the module docstring."""
    if stats.range is None:
        return 0.0
    candidates = _candidates(stats, start_bin)
    best = _pick_last_min(kl_divergences_fp8(stats.hist, candidates), candidates)
    return min(best * stats.bin_width, stats.amax)


def mse_fp8(stats: TensorStats, thresholds: np.ndarray, block: int = 256) -> np.ndarray:
    """Mean squared FP8 fake-quantization error of the histogram for each threshold.

    Vectorised over blocks of ``block`` thresholds x all bins.
    """
    centers = stats.bin_centers().astype(np.float32)
    weights = stats.hist.astype(np.float64)
    total = weights.sum()
    thresholds = np.asarray(thresholds, dtype=np.float64)
    errors = np.empty(len(thresholds), dtype=np.float64)
    for start in range(0, len(thresholds), block):
        scales = (thresholds[start : start + block] / E4M3_MAX).astype(np.float32)[:, None]
        quantized = fp8_e4m3_round(centers[None, :] / scales) * scales
        diff = (quantized - centers[None, :]).astype(np.float64)
        errors[start : start + block] = (diff * diff) @ weights / total
    return errors


def amax_mse(stats: TensorStats, start_bin: int = START_BIN) -> float:
    """Threshold minimising the FP8 fake-quantization MSE; see the module docstring."""
    if stats.range is None:
        return 0.0
    candidates = _candidates(stats, start_bin)
    thresholds = candidates * stats.bin_width
    best = _pick_last_min(mse_fp8(stats, thresholds), candidates)
    return min(best * stats.bin_width, stats.amax)
