"""``calibration.safetensors``: the FP8 scales of a bundle, with how they were made.

Tensors (all float32, little-endian):

* ``act.<tensor>.amax`` and ``act.<tensor>.scale``: shape ``[]`` (a 0-d scalar; the
  safetensors format allows it and it is what a per-tensor scale is): the measured amax,
  and the scale the graph and every engine use, ``bundler.fp8.stored_scale(amax / 448)``
  (1/448 for an all-zero tensor).
* ``weight.<node>.scale``: shape ``[Cout]``, the per-output-channel weight scales, by the
  same rule (``stored_scale`` of the folded kernel's ``amax / 448``).

Metadata (strings only), validated against ``schemas/calibration.schema.json`` on write
and on read: ``format`` (``trt-bundle-calibration/1``), ``method``, ``images``,
``histogram_bins`` (not for ``max``, which uses no histogram), ``percentile`` (only for
the percentile method), ``data_digest``,
``data_source``, ``recipe_digest``, and ``item_digests`` (optional: the sorted,
comma-separated sha256 of each calibration item, so that evaluation can refuse images
used for calibration).

Why the bytes are written here and not by ``safetensors.numpy.save``: that writer emits
the metadata map in a per-process random order, so the same scales would give different
bytes (and a different bundle id) on every run. The format fits in a few lines: an
8-byte little-endian header length, a JSON header (here with sorted keys, no spaces,
padded with spaces to a multiple of 8), then the tensors' bytes in key order. Reading
goes through the ``safetensors`` library, which checks offsets and sizes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from runtime_py.errors import BundleFormatError, CalibrationError, UsageError
from runtime_py.schemas import schema_problems

from .collect import CalibrationResult

FORMAT = "trt-bundle-calibration/1"
CALLER_KEYS = ("data_digest", "data_source", "recipe_digest", "item_digests")


@dataclass(frozen=True)
class CalibrationFile:
    """The decoded member: activation result, weight scales and the metadata strings."""

    result: CalibrationResult
    weight_scales: dict[str, np.ndarray]
    metadata: dict[str, str]


def _schema_problems(metadata: Mapping[str, str]) -> list[str]:
    return schema_problems("calibration", dict(metadata))


def _metadata(result: CalibrationResult, given: Mapping[str, str]) -> dict[str, str]:
    derived = {
        "format": FORMAT,
        "method": result.method,
        "images": str(result.images),
    }
    if result.histogram_bins is not None:
        derived["histogram_bins"] = str(result.histogram_bins)
    if result.percentile is not None:
        derived["percentile"] = format(result.percentile, "g")
    clash = sorted(k for k in given if k in derived and given[k] != derived[k])
    if clash:
        raise UsageError(f"metadata {clash} contradict the calibration result; leave them out")
    unknown = sorted(set(given) - set(derived) - set(CALLER_KEYS))
    if unknown:
        raise UsageError(f"unknown calibration metadata keys {unknown}; allowed: {list(CALLER_KEYS)}")
    return {**{k: str(v) for k, v in given.items()}, **derived}


def _scalar(value: float, what: str) -> np.ndarray:
    array = np.asarray(value, dtype=np.float32)
    if not math.isfinite(float(array)) or float(array) < 0:
        raise CalibrationError(f"{what} is {value!r}; it must be a finite number >= 0")
    return array.reshape(())


def _tensors(result: CalibrationResult, weight_scales: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    if set(result.amax) != set(result.scale):
        raise CalibrationError("calibration result has amax and scale for different tensors")
    tensors: dict[str, np.ndarray] = {}
    for name in result.amax:
        tensors[f"act.{name}.amax"] = _scalar(result.amax[name], f"amax of {name!r}")
        tensors[f"act.{name}.scale"] = _scalar(result.scale[name], f"scale of {name!r}")
        if float(tensors[f"act.{name}.scale"]) == 0.0:
            raise CalibrationError(f"scale of {name!r} is 0; scales must be positive")
    for node, scales in weight_scales.items():
        array = np.ascontiguousarray(scales, dtype=np.float32)
        if array.ndim != 1 or array.size == 0 or not np.all(np.isfinite(array)) or np.any(array <= 0):
            raise CalibrationError(
                f"weight scales of {node!r} must be a non-empty [Cout] vector of positive finite numbers"
            )
        tensors[f"weight.{node}.scale"] = array
    return tensors


def _encode(tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str]) -> bytes:
    header: dict[str, object] = {"__metadata__": dict(metadata)}
    chunks, offset = [], 0
    for name in sorted(tensors):
        data = tensors[name].astype("<f4").tobytes()
        header[name] = {
            "dtype": "F32",
            "shape": list(tensors[name].shape),
            "data_offsets": [offset, offset + len(data)],
        }
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + b"".join(chunks)


def calibration_to_safetensors(
    result: CalibrationResult,
    weight_scales: Mapping[str, np.ndarray],
    metadata: Mapping[str, str],
) -> bytes:
    """Serialise scales deterministically (same inputs, same bytes).

    ``metadata`` gives ``data_digest``, ``data_source``, ``recipe_digest`` and optionally
    ``item_digests``; method, images, histogram bins and percentile come from ``result``.
    """
    full = _metadata(result, metadata)
    problems = _schema_problems(full)
    if problems:
        raise CalibrationError(
            "calibration metadata does not match schemas/calibration.schema.json: " + "; ".join(problems),
            problems=problems,
        )
    return _encode(_tensors(result, weight_scales), full)


def _read_metadata(data: bytes) -> dict[str, str]:
    if len(data) < 8:
        raise BundleFormatError("calibration.safetensors is shorter than its 8-byte header length")
    size = int.from_bytes(data[:8], "little")
    if size > len(data) - 8:
        raise BundleFormatError("calibration.safetensors header runs past the end of the member")
    try:
        header = json.loads(data[8 : 8 + size])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BundleFormatError(f"calibration.safetensors header is not JSON: {exc}") from None
    metadata = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(metadata, dict):
        raise BundleFormatError("calibration.safetensors has no metadata object")
    return metadata


def calibration_from_safetensors(data: bytes) -> CalibrationFile:
    """Decode and check a ``calibration.safetensors`` member; BundleFormatError if malformed."""
    from safetensors import SafetensorError
    from safetensors.numpy import load

    metadata = _read_metadata(data)
    problems = _schema_problems(metadata)
    if problems:
        raise BundleFormatError(
            "calibration.safetensors metadata is invalid: " + "; ".join(problems), problems=problems
        )
    try:
        tensors = load(bytes(data))
    except SafetensorError as exc:
        raise BundleFormatError(f"calibration.safetensors is malformed: {exc}") from None
    amax, scale, weights, bad = {}, {}, {}, []
    for key, array in tensors.items():
        if array.dtype != np.float32:
            bad.append(f"{key}: dtype {array.dtype}, expected float32")
        elif key.startswith("act.") and key.endswith((".amax", ".scale")) and array.shape == ():
            name, _, kind = key[4:].rpartition(".")
            (amax if kind == "amax" else scale)[name] = float(array)
        elif key.startswith("weight.") and key.endswith(".scale") and array.ndim == 1:
            weights[key[7:-6]] = array
        else:
            bad.append(f"{key}: unexpected tensor name or shape {list(array.shape)}")
    if set(amax) != set(scale):
        bad.append(f"act tensors without both amax and scale: {sorted(set(amax) ^ set(scale))}")
    if bad:
        raise BundleFormatError("calibration.safetensors: " + "; ".join(bad), problems=bad)
    result = CalibrationResult(
        method=metadata["method"],
        amax=dict(sorted(amax.items())),
        scale=dict(sorted(scale.items())),
        images=int(metadata["images"]),
        histogram_bins=int(metadata["histogram_bins"]) if "histogram_bins" in metadata else None,
        percentile=float(metadata["percentile"]) if "percentile" in metadata else None,
    )
    return CalibrationFile(result, dict(sorted(weights.items())), dict(metadata))
