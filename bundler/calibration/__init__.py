"""FP8 calibration: data selection, one-pass statistics, calibrators, the stored scales.

``data`` chooses and digests the images, ``collect`` runs ONNX Runtime once and builds
per-tensor histograms, ``calibrators`` turns a histogram into amax, ``store`` writes
``calibration.safetensors``.
"""

from .calibrators import METHODS
from .collect import CalibrationResult, calibrate, collect_statistics, result_from_statistics
from .data import CalibrationSet, open_calibration_data, synthetic_calibration_set
from .store import CalibrationFile, calibration_from_safetensors, calibration_to_safetensors

__all__ = [
    "METHODS",
    "CalibrationFile",
    "CalibrationResult",
    "CalibrationSet",
    "calibrate",
    "calibration_from_safetensors",
    "calibration_to_safetensors",
    "collect_statistics",
    "open_calibration_data",
    "result_from_statistics",
    "synthetic_calibration_set",
]
