"""Compatibility decisions and messages, as pure functions of hypothetical hosts."""

from __future__ import annotations

import subprocess
import sys

import pytest

from runtime_py.compat import (
    GpuInfo,
    HostInfo,
    check_target,
    choose_backend,
    parse_compute_capability,
    parse_version,
    probe_host,
)
from runtime_py.engines.onnxruntime_compat import check_onnxruntime_target
from runtime_py.engines.tensorrt_compat import (
    check_tensorrt_target,
    compute_capability_ok,
    tensorrt_version_ok,
)
from runtime_py.errors import CompatibilityError, EngineUnavailableError, UsageError

H200 = GpuInfo("NVIDIA H200", (9, 0))
A100 = GpuInfo("NVIDIA A100", (8, 0))
T4 = GpuInfo("Tesla T4", (7, 5))


def details(cc="9.0", trt="11.4.0.106", hw="none", vc=False) -> dict:
    return {"tensorrt_version": trt, "compute_capability": cc, "device_name": "NVIDIA H200",
            "optimization_level": 3, "profile": {"min": 1, "opt": 8, "max": 32},
            "hardware_compatibility": hw, "version_compatible": vc, "strongly_typed": True,
            "layer_count": 101}


def host(trt="11.4.0.106", *gpus: GpuInfo, **kw) -> HostInfo:
    return HostInfo(tensorrt_version=trt, gpus=tuple(gpus) if gpus else (H200,), **kw)


def test_same_version_and_gpu_runs():
    check_tensorrt_target(details(), host())


def test_patch_release_of_same_minor_passes_the_manifest_check():
    check_tensorrt_target(details(trt="11.4.0.106"), host("11.4.1.2"))


def test_the_issue_example_message():
    with pytest.raises(CompatibilityError) as e:
        check_tensorrt_target(details(cc="9.0", trt="11.4.0"), host("11.1.0", A100))
    msg = str(e.value)
    assert msg.startswith("plan built for sm_90 with TensorRT 11.4; this host has sm_80 and "
                          "TensorRT 11.1: rebuild with `bundle rebuild BUNDLE --backend "
                          "tensorrt` (or `bundle make ... --backend tensorrt`) here")
    assert "--hardware-compat ampere+" in msg and "--version-compatible" in msg
    assert len(e.value.problems) == 2
    assert e.value.exit_code == 5


def test_compute_capability_mismatch_alone():
    with pytest.raises(CompatibilityError) as e:
        check_tensorrt_target(details(cc="9.0"), host("11.4.0", A100))
    assert e.value.problems == ["compute capability sm_90 != sm_80 of GPU 0 (NVIDIA A100)"]
    assert "--version-compatible" not in str(e.value)


def test_pre_ampere_host_is_not_offered_hardware_compat():
    with pytest.raises(CompatibilityError) as e:
        check_tensorrt_target(details(cc="9.0"), host("11.4.0", T4))
    assert "sm_75" in str(e.value) and "--hardware-compat" not in str(e.value)


def test_version_mismatch_alone():
    with pytest.raises(CompatibilityError) as e:
        check_tensorrt_target(details(trt="11.4.0"), host("11.5.0"))
    assert e.value.problems == ["TensorRT 11.4 != 11.5"]
    assert "--version-compatible" in str(e.value)


@pytest.mark.parametrize("gpu,ok", [(A100, True), (H200, True), (GpuInfo("RTX 4090", (8, 9)), True),
                                    (T4, False)])
def test_ampere_plus_runs_on_cc_8_and_later(gpu, ok):
    d = details(cc="8.6", hw="ampere+")
    if ok:
        check_tensorrt_target(d, host("11.4.0", gpu))
    else:
        with pytest.raises(CompatibilityError, match="8.0 or later"):
            check_tensorrt_target(d, host("11.4.0", gpu))


def test_same_compute_capability_level_needs_equal_cc():
    check_tensorrt_target(details(cc="9.0", hw="same-compute-capability"), host())
    with pytest.raises(CompatibilityError):
        check_tensorrt_target(details(cc="9.0", hw="same-compute-capability"), host("11.4", A100))


@pytest.mark.parametrize("built,on,ok", [
    ("11.4.0", "11.4.0", True), ("11.4.0", "11.6.2", True), ("11.4.0", "11.1.0", False),
    ("11.4.0", "12.0.0", False), ("10.8.0", "11.1.0", True), ("10.8.0", "10.9.0", True),
])
def test_version_compatible_plans_run_on_later_versions(built, on, ok):
    assert tensorrt_version_ok(built, on, True) is ok
    if ok:
        check_tensorrt_target(details(trt=built, vc=True), host(on))
    else:
        with pytest.raises(CompatibilityError, match="version-compatible from TensorRT"):
            check_tensorrt_target(details(trt=built, vc=True), host(on))


def test_without_version_compatibility_major_minor_must_match():
    assert tensorrt_version_ok("11.4.0", "11.4.3", False)
    assert not tensorrt_version_ok("11.4.0", "11.3.0", False)
    assert not tensorrt_version_ok("10.8.0", "11.8.0", False)


def test_no_tensorrt_says_how_to_install():
    with pytest.raises(EngineUnavailableError) as e:
        check_tensorrt_target(details(), HostInfo(tensorrt_version=None, gpus=(H200,)))
    assert "pip install 'trt-bundle[trt]'" in str(e.value)
    assert "--backend onnxruntime" in str(e.value)


def test_no_gpu_is_engine_unavailable_with_the_probe_note():
    h = HostInfo(tensorrt_version="11.4.0", gpus=(), notes=("CUDA reports cudaErrorNoDevice",))
    with pytest.raises(EngineUnavailableError, match="no GPU is visible.*cudaErrorNoDevice"):
        check_tensorrt_target(details(), h)


def test_device_index_out_of_range():
    with pytest.raises(EngineUnavailableError, match="GPU 2 was asked for"):
        check_tensorrt_target(details(), host(), device=2)


def test_second_gpu_is_checked_not_the_first():
    h = host("11.4.0", A100, H200)
    check_tensorrt_target(details(cc="9.0"), h, device=1)
    with pytest.raises(CompatibilityError):
        check_tensorrt_target(details(cc="9.0"), h, device=0)


def test_compute_capability_ok_rejects_unknown_level():
    with pytest.raises(UsageError):
        compute_capability_ok((9, 0), (9, 0), "blackwell+")


@pytest.mark.parametrize("trt,gpus,want", [
    ("11.4.0", (H200,), "tensorrt"), ("11.4.0", (), "onnxruntime"),
    (None, (H200,), "onnxruntime"), (None, (), "onnxruntime"),
])
def test_auto_backend(trt, gpus, want):
    assert choose_backend("auto", HostInfo(tensorrt_version=trt, gpus=gpus)) == want


def test_explicit_backend_is_kept_and_unknown_refused():
    bare = HostInfo()
    assert choose_backend("tensorrt", bare) == "tensorrt"
    assert choose_backend("onnxruntime", bare) == "onnxruntime"
    with pytest.raises(UsageError, match="unknown backend"):
        choose_backend("tvm", bare)


def test_onnxruntime_target_checks():
    check_onnxruntime_target({"opset": 19}, HostInfo(onnxruntime_version="1.20.0"))
    with pytest.raises(EngineUnavailableError, match=r"trt-bundle\[ort\]"):
        check_onnxruntime_target({"opset": 19}, HostInfo())
    with pytest.raises(CompatibilityError, match="needs onnxruntime >= 1.22"):
        check_onnxruntime_target({"opset": 21, "min_onnxruntime": "1.22"},
                                 HostInfo(onnxruntime_version="1.20.1"))


def test_check_target_dispatches_per_backend():
    check_target({"backend": "tensorrt", "member": "engine.plan", "details": details()}, host())
    with pytest.raises(EngineUnavailableError):
        check_target({"backend": "onnxruntime", "member": "model.onnx",
                      "details": {"opset": 19}}, HostInfo())
    aoti = {"torch_version": "2.11.0", "cuda_version": "13.0", "compute_capability": "9.0",
            "device_name": "NVIDIA H200", "compile_options": {}}
    with pytest.raises(EngineUnavailableError, match="torch is not installed"):
        check_target({"backend": "torch-aoti", "member": "engine.pt2", "details": aoti},
                     HostInfo())


def test_parsers():
    assert parse_version("11.4.0.106") == (11, 4, 0, 106)
    assert parse_version("10.0.1b2") == (10, 0, 1)
    assert parse_compute_capability("9.0") == (9, 0)
    assert parse_compute_capability("sm_89") == (8, 9)
    assert H200.sm == "sm_90"
    with pytest.raises(ValueError):
        parse_compute_capability("hopper")


def test_probe_host_never_crashes_and_imports_nothing_heavy():
    code = ("import sys, runtime_py.compat as c; h = c.probe_host(); "
            "print(type(h).__name__, 'tensorrt' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=str(__import__('pathlib').Path(__file__).parents[1]))
    assert out.stdout.split() == ["HostInfo", "False", "False"]


def test_probe_host_in_process_is_consistent():
    h = probe_host()
    assert isinstance(h.gpus, tuple)
    for g in h.gpus:
        assert isinstance(g.compute_capability, tuple)
