"""Target builders' pure parts: option checks, profile shapes, parser errors, details, names."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from synthetic_bundles import manifest_body, tiny_onnx  # noqa: E402

from bundler.targets import TARGETS, bundle_name, target_builder  # noqa: E402
from bundler.targets import tensorrt as trt_target  # noqa: E402
from bundler.targets.onnxruntime import build_target as ort_build, onnx_opset  # noqa: E402
from runtime_py.errors import UsageError  # noqa: E402
from runtime_py.format.manifest import validate_manifest  # noqa: E402


def test_registry_knows_onnxruntime_and_tensorrt_and_refuses_others():
    assert set(TARGETS) >= {"onnxruntime", "tensorrt"}
    assert target_builder("onnxruntime").build_target is ort_build
    with pytest.raises(UsageError, match="cannot build engines for backend 'tvm'"):
        target_builder("tvm")


def test_importing_tensorrt_modules_imports_neither_tensorrt_nor_cuda():
    import subprocess

    code = ("import sys, bundler.targets.tensorrt, runtime_py.engines.tensorrt, "
            "runtime_py.numerics, bundler.rebuild; "
            "print([m for m in ('tensorrt', 'cuda', 'torch') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=str(Path(__file__).parents[1]))
    assert out.stdout.strip() == "[]"


def test_onnxruntime_target_is_the_onnx_itself():
    b = ort_build(tiny_onnx(opset=19), batch={"min": 1, "opt": 2, "max": 4})
    assert (b.backend, b.member, b.engine_bytes, b.details, b.tag) == (
        "onnxruntime", "model.onnx", None, {"opset": 19}, "onnxruntime")
    assert onnx_opset(tiny_onnx(opset=21)) == 21
    with pytest.raises(UsageError):
        ort_build(tiny_onnx(), batch={}, optimization_level=3)


@pytest.mark.parametrize("kw,fragment", [
    (dict(min_batch=1, opt_batch=64, max_batch=32), "1 <= min <= opt <= max"),
    (dict(min_batch=0, opt_batch=1, max_batch=32), "1 <= min <= opt <= max"),
    (dict(optimization_level=6), "optimization level must be 0..5"),
    (dict(hardware_compat="turing+"), "hardware compatibility must be one of"),
    (dict(workspace_bytes=0), "workspace must be a positive"),
])
def test_build_options_are_checked_before_tensorrt_is_needed(kw, fragment):
    args = dict(min_batch=1, opt_batch=8, max_batch=32, optimization_level=3,
                hardware_compat="none", workspace_bytes=None)
    args.update(kw)
    with pytest.raises(UsageError, match=fragment):
        trt_target.check_build_options(**args)
    with pytest.raises(UsageError, match=fragment):   # build_tensorrt_plan checks first too
        trt_target.build_tensorrt_plan(tiny_onnx(), **args)


def test_profile_covers_the_batch_axis_from_the_onnx():
    inputs = trt_target.onnx_inputs(tiny_onnx())
    assert inputs == [trt_target.InputSpec("input", ("batch", 3, 8, 8))]
    shapes = trt_target.profile_shapes(inputs, 1, 8, 32)
    assert shapes == {"input": ((1, 3, 8, 8), (8, 3, 8, 8), (32, 3, 8, 8))}


def test_profile_refuses_other_dynamic_axes():
    spec = trt_target.InputSpec("input", ("batch", 3, "h", "w"))
    with pytest.raises(trt_target.TensorRTBuildError, match=r"dynamic axes \[2, 3\]"):
        trt_target.profile_shapes([spec], 1, 8, 32)


def test_parser_errors_list_every_node():
    err = trt_target.format_parser_errors([
        trt_target.ParserErrorInfo(7, "/blocks.3/conv", "DeformConv", "UNSUPPORTED_NODE",
                                   "No importer registered for op: DeformConv"),
        trt_target.ParserErrorInfo(-1, "", "", "INVALID_GRAPH", "graph has a cycle"),
    ])
    assert isinstance(err, trt_target.OnnxParseError)
    assert err.problems == [
        "node 7 '/blocks.3/conv' (DeformConv): No importer registered for op: DeformConv "
        "[UNSUPPORTED_NODE]",
        "graph: graph has a cycle [INVALID_GRAPH]"]
    assert str(err).startswith("TensorRT could not parse model.onnx (2 error(s)): node 7")


def test_layer_count_from_inspector_json():
    assert trt_target.layer_count_from_inspector('{"Layers": ["a", "b", "c"]}') == 3
    assert trt_target.layer_count_from_inspector(
        '{"Layers": [{"Name": "a"}], "I/O Tensors": []}') == 1
    with pytest.raises(trt_target.TensorRTBuildError):
        trt_target.layer_count_from_inspector("not json")


def _details(**kw):
    args = dict(tensorrt_version="11.4.0.106", compute_capability=(9, 0),
                device_name="NVIDIA H200", optimization_level=3, min_batch=1, opt_batch=8,
                max_batch=32, hardware_compat="none", version_compatible=False, layer_count=101)
    args.update(kw)
    return trt_target.tensorrt_details(**args)


def test_details_are_exactly_the_schema_fields_and_validate():
    d = _details(workspace_bytes=1 << 30, timing_cache_sha256="sha256:" + "a" * 64,
                 build_seconds=12.3456789)
    assert d == {"tensorrt_version": "11.4.0.106", "compute_capability": "9.0",
                 "device_name": "NVIDIA H200", "optimization_level": 3,
                 "profile": {"min": 1, "opt": 8, "max": 32}, "hardware_compatibility": "none",
                 "version_compatible": False, "strongly_typed": True, "layer_count": 101,
                 "workspace_bytes": 1 << 30, "timing_cache_sha256": "sha256:" + "a" * 64,
                 "build_seconds": "12.3457"}
    # the plan's profile equals the manifest's batch range (docs/format.md)
    body = manifest_body(engine={"backend": "tensorrt", "member": "engine.plan", "details": d},
                         batch=(1, 8, 32))
    body["format"] = {"major": 1, "minor": 0}
    body["members"] = [{"name": "engine.plan", "offset": 64, "stored_size": 1, "raw_size": 1,
                        "sha256": "0" * 64, "compression": "zstd"},
                       {"name": "model.onnx", "offset": 65, "stored_size": 1, "raw_size": 1,
                        "sha256": "0" * 64, "compression": "zstd"}]
    validate_manifest(body)
    body["engine"]["details"] = _details()   # optional fields absent also validates
    validate_manifest(body)


@pytest.mark.parametrize("kw,tag", [
    ({}, "tensorrt-sm90-trt11.4"),
    (dict(hardware_compat="ampere+"), "tensorrt-ampere+-trt11.4"),
    (dict(version_compatible=True, compute_capability=(8, 9)), "tensorrt-sm89-trt11.4+"),
])
def test_target_tag_names_what_the_plan_is_tied_to(kw, tag):
    assert trt_target.target_tag(_details(**kw)) == tag


def test_bundle_name():
    assert bundle_name("timm_xception", "1.0", "fp16", None, "tensorrt-sm90-trt11.4") == \
        "timm_xception-fp16-1.0-tensorrt-sm90-trt11.4"
    assert bundle_name("timm_xception", "1.0", "fp8", "fp8-depthwise", "onnxruntime") == \
        "timm_xception-fp8-depthwise-1.0-onnxruntime"
