"""Can this host run that TensorRT plan? The tensorrt target's host check (its
``EngineTarget.check_path``), a pure function of the manifest's ``engine.details`` and a
``runtime_py.compat.HostInfo``.

A plan is a compiled artifact: TensorRT refuses (or worse, mis-runs) a plan built by
another TensorRT version or for another GPU architecture. The runtime checks the
manifest's record of how the plan was built *before* deserializing it, so that the user
gets one sentence naming the mismatch and the remedy instead of a TensorRT log line.
"""

from __future__ import annotations

from runtime_py.compat import (
    TRT_INSTALL_HINT,
    HostInfo,
    major_minor,
    parse_compute_capability,
    parse_version,
    require_gpu,
    sm_name,
)
from runtime_py.errors import CompatibilityError, EngineUnavailableError, UsageError

__all__ = ["check_tensorrt_target", "tensorrt_version_ok", "compute_capability_ok"]

# TensorRT documents exactly one cross-major combination for a version-compatible plan
# built with TensorRT 10 or later: a TensorRT 10 plan runs on a TensorRT 11 runtime
# ("Engine Portability", TensorRT 11.4 support matrix). Every other combination must
# share the major version.
_CROSS_MAJOR_VERSION_COMPATIBLE = {(10, 11)}

AMPERE = (8, 0)


def tensorrt_version_ok(built: str, host: str, version_compatible: bool) -> bool:
    """May a plan built by TensorRT ``built`` be deserialized by TensorRT ``host``?

    Without version compatibility a plan is tied to the TensorRT that built it (we
    require the same major.minor here; TensorRT itself also refuses other patch
    releases, and the runner reports that refusal with both versions). With it, any
    later TensorRT of the same major runs it, plus the documented 10 -> 11 case.
    """
    b, h = parse_version(built), parse_version(host)
    if not version_compatible:
        return b[:2] == h[:2]
    if b[0] == h[0]:
        return h >= b
    return (b[0], h[0]) in _CROSS_MAJOR_VERSION_COMPATIBLE


def compute_capability_ok(built: tuple[int, int], host: tuple[int, int],
                          hardware_compatibility: str) -> bool:
    """May a plan built for ``built`` run on a GPU of compute capability ``host``?

    "none" and "same-compute-capability" need the same compute capability; "ampere+"
    (HardwareCompatibilityLevel.AMPERE_PLUS) runs on any GPU of compute capability 8.0
    or later.
    """
    if hardware_compatibility == "ampere+":
        return host >= AMPERE
    if hardware_compatibility in ("none", "same-compute-capability"):
        return host == built
    raise UsageError(f"unknown hardware_compatibility {hardware_compatibility!r} in the manifest")


def check_tensorrt_target(details: dict, host: HostInfo, device: int = 0) -> None:
    """Raise unless this host can deserialize and run the plan ``details`` describes.

    ``details`` is the manifest's ``engine.details`` of a tensorrt bundle. Raises
    ``EngineUnavailableError`` when TensorRT or a GPU is missing, ``CompatibilityError``
    naming every mismatch (TensorRT version, compute capability) otherwise.
    """
    if host.tensorrt_version is None:
        raise EngineUnavailableError(
            "this bundle's engine is a TensorRT plan, but TensorRT is not installed on this "
            f"host: install it with `{TRT_INSTALL_HINT}` (on a host with an NVIDIA GPU), or "
            "make a bundle for ONNX Runtime with `bundle rebuild BUNDLE --backend onnxruntime`")
    gpu = require_gpu(host, device, "a TensorRT plan")
    built_cc = parse_compute_capability(details["compute_capability"])
    built_trt = details["tensorrt_version"]
    hw = details.get("hardware_compatibility", "none")
    vc = bool(details.get("version_compatible", False))

    problems, remedies = [], []
    if not compute_capability_ok(built_cc, gpu.compute_capability, hw):
        if hw == "ampere+":
            problems.append(f"the plan runs on compute capability 8.0 or later (ampere+) and "
                            f"GPU {device} ({gpu.name}) is {sm_name(gpu.compute_capability)}")
        else:
            problems.append(f"compute capability {sm_name(built_cc)} != "
                            f"{sm_name(gpu.compute_capability)} of GPU {device} ({gpu.name})")
            if gpu.compute_capability >= AMPERE and built_cc >= AMPERE:
                remedies.append("build it with `--hardware-compat ampere+`")
    if not tensorrt_version_ok(built_trt, host.tensorrt_version, vc):
        if vc:
            problems.append(f"the plan is version-compatible from TensorRT {built_trt} on, "
                            f"and this host has TensorRT {host.tensorrt_version}")
        else:
            problems.append(f"TensorRT {major_minor(built_trt)} != {major_minor(host.tensorrt_version)}")
            remedies.append("build it with `--version-compatible`")
    if not problems:
        return
    hw_note = " (hardware-compat ampere+)" if hw == "ampere+" else ""
    vc_note = " (version-compatible)" if vc else ""
    remedy = " or ".join(remedies)
    message = (
        f"plan built for {sm_name(built_cc)}{hw_note} with TensorRT {major_minor(built_trt)}"
        f"{vc_note}; this host has {sm_name(gpu.compute_capability)} and TensorRT "
        f"{major_minor(host.tensorrt_version)}: rebuild with `bundle rebuild BUNDLE --backend "
        f"tensorrt` (or `bundle make ... --backend tensorrt`) here"
        + (f", or {remedy}" if remedy else "") + f" ({'; '.join(problems)})")
    raise CompatibilityError(message, problems=problems)
