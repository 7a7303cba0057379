"""FP8 E4M3FN arithmetic used by the calibrators: the grid, fake-quantization, level codes.

E4M3FN (the "FN" variant TensorRT and ONNX ``FLOAT8E4M3FN`` use) has no infinities, one
NaN pattern per sign and a largest finite value of 448. The cast itself comes from
``ml_dtypes.float8_e4m3fn`` (already a dependency of ``onnx``), which rounds to nearest,
ties to even. Its overflow behaviour is *not* what a QuantizeLinear with saturation does
(values past 448 become NaN there), so every helper here clips to +-448 first: that is
the ONNX ``QuantizeLinear(saturate=1)`` / TensorRT behaviour the scales are made for.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

E4M3_MAX = 448.0
"""Largest finite FP8 E4M3FN value; a tensor's scale is ``amax / E4M3_MAX``."""

E4M3_DTYPE = np.dtype(ml_dtypes.float8_e4m3fn)


def fp8_e4m3_round(x: np.ndarray) -> np.ndarray:
    """Round ``x`` (in FP8 units) to the nearest E4M3FN value, saturating at +-448.

    Returns float32. NaN stays NaN.
    """
    x = np.asarray(x, dtype=np.float32)
    return np.clip(x, -E4M3_MAX, E4M3_MAX).astype(E4M3_DTYPE).astype(np.float32)


def fake_quantize(x: np.ndarray, scale: float) -> np.ndarray:
    """Quantize-dequantize ``x`` with a per-tensor FP8 scale: ``scale * fp8(x / scale)``.

    This is what a QuantizeLinear/DequantizeLinear pair with that scale computes.
    """
    if not scale > 0:
        raise ValueError(f"FP8 scale must be positive, got {scale!r}")
    x = np.asarray(x, dtype=np.float32)
    return fp8_e4m3_round(x / np.float32(scale)) * np.float32(scale)


def fp8_e4m3_codes(x: np.ndarray) -> np.ndarray:
    """Index of the E4M3FN level each non-negative ``x`` (FP8 units) rounds to.

    For non-negative values the 8-bit pattern is monotonic in the value (0 -> 0, 448 ->
    126), so the raw byte is a level index; the entropy calibrator groups histogram bins
    by it.
    """
    x = np.asarray(x, dtype=np.float32)
    return np.clip(x, 0.0, E4M3_MAX).astype(E4M3_DTYPE).view(np.uint8)


E4M3_POSITIVE_LEVELS = 127
"""Number of non-negative finite E4M3FN values (0, 7 subnormals, 119 normals up to 448)."""
