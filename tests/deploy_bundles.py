"""Small bundles for the deployment tests: the tiny synthetic graph, with or without a
preprocessing spec, for each engine target (a plan's or a package's bytes are opaque data
here, as on a host without TensorRT or a GPU)."""

from __future__ import annotations

import io
from pathlib import Path

import msgpack
import numpy as np

from synthetic_bundles import (calibration_member, manifest_body, reference_member, tiny_onnx,
                               write_source_bundle)

TRT_DETAILS = {"tensorrt_version": "10.13.0.35", "compute_capability": "9.0",
               "device_name": "NVIDIA H200", "optimization_level": 3,
               "profile": {"min": 1, "opt": 2, "max": 4}, "hardware_compatibility": "none",
               "version_compatible": False, "strongly_typed": True, "layer_count": 3}
AOTI_DETAILS = {"torch_version": "2.11.0+cu130", "cuda_version": "13.0",
                "compute_capability": "9.0", "device_name": "NVIDIA H200", "device": "cuda",
                "compile_options": {}}
PREPROCESS = {"spec_version": 1, "decode": {"mode": "RGB"},
              "resize": {"size": 10, "edge": "shorter", "interpolation": "bilinear",
                         "antialias": True},
              "center_crop": {"height": 8, "width": 8}, "rescale": {"factor": 1 / 255},
              "normalize": {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]},
              "layout": "NCHW", "dtype": "float32", "input": "input"}


def ort_bundle(folder: Path, precision: str = "fp32", preprocess: bool = False,
               name: str | None = None) -> Path:
    if not preprocess:
        return write_source_bundle(folder, precision=precision, name=name)
    from bundler.writer import write_bundle

    onnx_bytes = tiny_onnx(precision)
    body = manifest_body(precision=precision, name=name)
    members = {"model.onnx": onnx_bytes, "reference.safetensors": reference_member(onnx_bytes),
               "preprocess.msgpack": msgpack.packb(PREPROCESS)}
    if precision == "fp8":
        members["calibration.safetensors"] = calibration_member()
    path, _ = write_bundle(Path(folder) / f"{body['name']}.bundle", body, members)
    return path


def trt_bundle(folder: Path) -> Path:
    return write_source_bundle(folder, engine={"backend": "tensorrt", "member": "engine.plan",
                                               "details": TRT_DETAILS},
                               engine_member=b"plan bytes built on a GPU host",
                               name="tiny-fp32-1-tensorrt-sm90-trt10.13")


AOTI_CPU_DETAILS = {**AOTI_DETAILS, "device": "cpu", "cuda_version": None,
                    "compute_capability": None, "device_name": "x86_64"}


def aoti_bundle(folder: Path, device: str = "cuda") -> Path:
    """A torch-aoti bundle whose package was compiled for ``device`` ("cuda" or "cpu")."""
    details = AOTI_DETAILS if device == "cuda" else AOTI_CPU_DETAILS
    return write_source_bundle(folder, engine={"backend": "torch-aoti", "member": "engine.pt2",
                                               "details": details},
                               engine_member=b"PK\x03\x04 an AOTInductor package",
                               name="tiny-fp32-1-torch-aoti-" + ("sm90" if device == "cuda"
                                                                  else "cpu"))


def png(seed: int, size=(13, 11)) -> bytes:
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (*size[::-1], 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()
