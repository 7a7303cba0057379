"""Format evolution rules: a newer minor is read (unknown fields ignored), and the engine
member must be a member."""

import pytest

from bundler.writer import write_bundle
from runtime_py.errors import ManifestError
from runtime_py.format import open_bundle
from corrupt import rewrite_manifest, sample_body


@pytest.fixture
def small_bundle(tmp_path):
    path, _ = write_bundle(tmp_path / "s.bundle", sample_body(),
                           {"model.onnx": b"graph bytes" * 100, "labels.msgpack": b"\x90"})
    return path


def _newer(m):
    m["format"]["minor"] = 7
    m["added_in_1_7"] = {"anything": [1, 2]}
    m["members"][0]["stored_sha256"] = "0" * 64


def test_newer_minor_with_new_fields_is_read(small_bundle, tmp_path):
    out = rewrite_manifest(small_bundle, tmp_path / "newer.bundle", _newer, minor=7)
    with open_bundle(out) as b:
        assert b.format_version == (1, 7)
        assert b.manifest["added_in_1_7"] == {"anything": [1, 2]}
        assert b.read_member("model.onnx") == b"graph bytes" * 100


def test_same_minor_with_unknown_fields_is_refused(small_bundle, tmp_path):
    out = rewrite_manifest(small_bundle, tmp_path / "extra.bundle",
                           lambda m: m.__setitem__("added_in_1_7", 1))
    with pytest.raises(ManifestError, match="added_in_1_7"):
        open_bundle(out)


def test_newer_minor_still_checks_known_fields(small_bundle, tmp_path):
    def broken(m):
        _newer(m)
        m["precision"] = 16
    out = rewrite_manifest(small_bundle, tmp_path / "bad.bundle", broken, minor=7)
    with pytest.raises(ManifestError, match="precision"):
        open_bundle(out)


def test_engine_member_must_be_a_member(small_bundle, tmp_path):
    details = {"tensorrt_version": "11.4.0", "compute_capability": "9.0", "device_name": "H200",
               "optimization_level": 3, "profile": {"min": 1, "opt": 4, "max": 8},
               "hardware_compatibility": "none", "version_compatible": False,
               "strongly_typed": True, "layer_count": 100}

    def plan_target_without_plan(m):
        m["engine"] = {"backend": "tensorrt", "member": "engine.plan", "details": details}
    out = rewrite_manifest(small_bundle, tmp_path / "noplan.bundle", plan_target_without_plan)
    with pytest.raises(ManifestError, match="engine member 'engine.plan' is not among"):
        open_bundle(out)
