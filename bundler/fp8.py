"""FP8 E4M3FN: the one home of its constants and rules (calibration, graphs, engines).

* ``E4M3_MAX``, ``FP16_MIN_NORMAL``: the format's largest finite value and the smallest
  scale a graph stores;
* ``scale_of(amax)``: ``amax / 448`` (the scale of every tensor and weight channel);
* ``stored_scale(s)``: the ONE rule for what a scale becomes once it is used. Scales
  are stored in fp16 in the graph (ONNX ``QuantizeLinear`` with fp16 data), so a scale is
  clamped up to fp16's smallest normal number (a smaller one would be subnormal or 0;
  clamping loses nothing: the values then use a lower part of the FP8 range) and rounded
  to fp16. ``bundle make`` applies it once, right after calibration, and hands the same
  numbers to ``calibration.safetensors``, the graph (``bundler.graphs.fp8.to_fp8``) and
  every engine, so the calibration member always equals what the engines use;
* ``quantize(values, scale)``: ``fp8(values / scale)`` as ``QuantizeLinear`` computes it;
* the calibrators' grid helpers (``fp8_e4m3_round``, ``fake_quantize``, ``fp8_e4m3_codes``).

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

FP16_MIN_NORMAL = 2.0**-14
"""fp16's smallest normal number: the smallest scale a graph stores (``stored_scale``)."""


def scale_of(amax: np.ndarray | float) -> np.ndarray:
    """``amax / 448`` in float32; 1 where ``amax`` is 0 (any positive scale gives 0 there)."""
    a = np.asarray(amax, dtype=np.float32)
    return np.where(a > 0, a / np.float32(E4M3_MAX), np.float32(1.0)).astype(np.float32)


def stored_scale(values: np.ndarray | float) -> np.ndarray:
    """The scale as the graph stores and every engine uses it (module docstring): float32
    values of ``fp16(max(s, 2^-14))``. Refuses non-finite and non-positive scales."""
    from runtime_py.errors import CalibrationError

    s = np.asarray(values, dtype=np.float64)
    if not np.all(np.isfinite(s)) or np.any(s <= 0):
        raise CalibrationError("fp8 scales must be finite and positive; recalibrate")
    return np.maximum(s, FP16_MIN_NORMAL).astype(np.float16).astype(np.float32)


def quantize(values: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """``fp8_e4m3fn(values / scale)``, saturated to +-448, round to nearest even.

    ``scale`` broadcasts against ``values`` (per-channel: shape [C, 1, ...]). Division in
    float32, as ONNX ``QuantizeLinear`` does.
    """
    q = np.asarray(values, np.float32) / np.asarray(scale, np.float32)
    return np.clip(q, -E4M3_MAX, E4M3_MAX).astype(E4M3_DTYPE)


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
