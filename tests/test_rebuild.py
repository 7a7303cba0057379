"""`bundle rebuild`: a new bundle from a bundle's portable ONNX, for another engine target."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from synthetic_bundles import write_source_bundle  # noqa: E402

from bundler.rebuild import rebuild_bundle, rebuilt_manifest_body  # noqa: E402
from bundler.targets import TargetBuild  # noqa: E402
from runtime_py.errors import EngineUnavailableError, UsageError, VerificationError  # noqa: E402
from runtime_py.format import open_bundle  # noqa: E402

HAS_TENSORRT = importlib.util.find_spec("tensorrt") is not None

TRT_DETAILS = {"tensorrt_version": "11.4.0.106", "compute_capability": "9.0",
               "device_name": "NVIDIA H200", "optimization_level": 3,
               "profile": {"min": 1, "opt": 2, "max": 4}, "hardware_compatibility": "none",
               "version_compatible": False, "strongly_typed": True, "layer_count": 3,
               "timing_cache_sha256": None}


@pytest.fixture
def ort_source(tmp_path):
    (tmp_path / "src").mkdir()
    return write_source_bundle(tmp_path / "src")


@pytest.fixture
def trt_source(tmp_path):
    (tmp_path / "gpu").mkdir()
    # A bundle made on a GPU host: its plan's bytes are opaque data here.
    return write_source_bundle(tmp_path / "gpu", engine={"backend": "tensorrt",
                                                         "member": "engine.plan",
                                                         "details": TRT_DETAILS},
                               engine_member=b"plan bytes from another host",
                               name="tiny-fp32-1-tensorrt-sm90-trt11.4")


def _out(tmp_path) -> Path:
    out = tmp_path / "out"
    out.mkdir()
    return out


def test_rebuild_to_onnxruntime_keeps_everything_but_the_engine(ort_source, tmp_path):
    path, new_id = rebuild_bundle(ort_source, "onnxruntime", _out(tmp_path))
    with open_bundle(ort_source) as src, open_bundle(path) as new:
        new.verify()
        assert new.id == new_id != src.id
        m, s = new.manifest, src.manifest
        assert m["rebuilt_from"] == src.id
        assert m["name"] == "tiny-fp32-1-onnxruntime" and path.name == m["name"] + ".bundle"
        for key in ("family", "precision", "variant", "recipe", "source", "calibration",
                    "inputs", "outputs", "batch", "quality"):
            assert m[key] == s[key], key
        assert m["engine"] == {"backend": "onnxruntime", "member": "model.onnx",
                               "details": {"opset": 19}}
        assert new.member_names == src.member_names
        for name in src.member_names:
            assert new.read_member(name) == src.read_member(name)


def test_rebuild_from_a_gpu_bundle_to_onnxruntime_drops_the_plan(trt_source, tmp_path):
    path, _ = rebuild_bundle(trt_source, "onnxruntime", _out(tmp_path))
    with open_bundle(path) as new, open_bundle(trt_source) as src:
        assert "engine.plan" not in new.member_names
        assert sorted(new.member_names) == sorted(n for n in src.member_names if n != "engine.plan")
        assert new.manifest["engine"]["backend"] == "onnxruntime"
        assert new.manifest["rebuilt_from"] == src.id


def test_rebuilt_bundle_runs_on_onnxruntime(trt_source, tmp_path):
    pytest.importorskip("onnxruntime")
    from runtime_py.numerics import check_numerics

    path, _ = rebuild_bundle(trt_source, "onnxruntime", _out(tmp_path))
    with open_bundle(path) as new:
        report = check_numerics(new)
    assert report.ran and report.passed, report.reasons


@pytest.mark.skipif(HAS_TENSORRT, reason="TensorRT is installed here: the real build runs in "
                                         "tests/test_tensorrt.py")
def test_rebuild_to_tensorrt_without_tensorrt_names_the_install_and_writes_nothing(
        ort_source, tmp_path):
    out = _out(tmp_path)
    with pytest.raises(EngineUnavailableError, match=r"pip install 'trt-bundle\[trt\]'"):
        rebuild_bundle(ort_source, "tensorrt", out, optimization_level=3)
    assert list(out.iterdir()) == []


def test_bad_tensorrt_options_are_refused_before_any_build(ort_source, tmp_path):
    out = _out(tmp_path)
    with pytest.raises(UsageError, match="optimization level must be 0..5"):
        rebuild_bundle(ort_source, "tensorrt", out, optimization_level=9)
    with pytest.raises(UsageError, match="unknown tensorrt build option"):
        rebuild_bundle(ort_source, "tensorrt", out, fp16=True)
    assert list(out.iterdir()) == []


def test_unknown_backend_and_output_folder(ort_source, tmp_path):
    with pytest.raises(UsageError, match="cannot build engines for backend"):
        rebuild_bundle(ort_source, "tvm", _out(tmp_path))
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    with pytest.raises(UsageError, match="is a file, not a folder"):
        rebuild_bundle(ort_source, "onnxruntime", a_file)
    path, _ = rebuild_bundle(ort_source, "onnxruntime", tmp_path / "new" / "folder")
    assert path.parent == tmp_path / "new" / "folder" and path.is_file()


def test_corrupt_source_is_refused(ort_source, tmp_path):
    data = bytearray(ort_source.read_bytes())
    data[80] ^= 0xFF                      # inside the first member's stored bytes
    bad = tmp_path / "bad.bundle"
    bad.write_bytes(bytes(data))
    out = _out(tmp_path)
    with pytest.raises(VerificationError):
        rebuild_bundle(bad, "onnxruntime", out)
    assert list(out.iterdir()) == []


def test_manifest_body_for_a_tensorrt_build(trt_source):
    with open_bundle(trt_source) as src:
        build = TargetBuild("tensorrt", "engine.plan", b"x",
                            dict(TRT_DETAILS, compute_capability="8.9"), "tensorrt-sm89-trt11.4")
        body = rebuilt_manifest_body(src.manifest, src.id, build)
    assert body["name"] == "tiny-fp32-1-tensorrt-sm89-trt11.4"
    assert body["engine"]["details"]["compute_capability"] == "8.9"
    assert body["build"]["packages"]["tensorrt"] == "11.4.0.106"
    assert body["rebuilt_from"] == src.id
    assert "format" not in body and "members" not in body


# --- an existing output: refused without --force, nothing written ---------------------------

def _rebuild_cli(*args: str):
    from click.testing import CliRunner

    from bundler.cli import cli

    return CliRunner().invoke(cli, ["rebuild", *args])


def test_an_existing_output_is_refused_without_force_and_replaced_with_it(trt_source, tmp_path):
    out = _out(tmp_path)
    first = _rebuild_cli(str(trt_source), "--backend", "onnxruntime", "--out", str(out))
    assert first.exit_code == 0, first.output
    existing = out / "tiny-fp32-1-onnxruntime.bundle"
    existing.write_bytes(b"the user's own file")

    refused = _rebuild_cli(str(trt_source), "--backend", "onnxruntime", "--out", str(out))
    assert refused.exit_code == 6 and "Traceback" not in refused.output
    assert f"{existing} already exists" in refused.stderr and "pass --force" in refused.stderr
    assert existing.read_bytes() == b"the user's own file"
    assert sorted(p.name for p in out.iterdir()) == [existing.name]      # no temporary left

    forced = _rebuild_cli(str(trt_source), "--backend", "onnxruntime", "--out", str(out),
                          "--force")
    assert forced.exit_code == 0, forced.output
    with open_bundle(existing) as new:
        new.verify()
        assert new.id == forced.stdout.strip()


def test_an_existing_output_is_refused_before_the_engine_is_built(trt_source, tmp_path):
    """torch-aoti's name is known before its (minutes long) compile: refused at once, before
    the family or the weights are even looked at (tiny's family is not installed)."""
    out = _out(tmp_path)
    existing = out / "tiny-fp32-1-torch-aoti.bundle"
    existing.write_bytes(b"x")
    refused = _rebuild_cli(str(trt_source), "--backend", "torch-aoti", "--out", str(out))
    assert refused.exit_code == 6, refused.output
    assert "already exists" in refused.stderr and "unknown family" not in refused.stderr
    assert existing.read_bytes() == b"x"


def test_force_never_replaces_the_source(ort_source):
    with pytest.raises(UsageError, match="would replace its source"):
        rebuild_bundle(ort_source, "onnxruntime", ort_source.parent, replace_existing=True)
