"""The rules beyond the schema that tie fields together (docs/format.md): a TensorRT plan's
optimization profile is the manifest's batch range, calibration goes with fp8 and only
with fp8, and every bundle carries model.onnx. Each case is a kept regression file of tests/fuzz_corpus/; both readers must refuse
it and say why, in the same words."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_cpp_stub import assert_clean, assert_rejected, run_cpp  # noqa: E402

from runtime_py.errors import ManifestError  # noqa: E402
from runtime_py.format import open_bundle  # noqa: E402
from runtime_py.format.semantics import semantic_problems  # noqa: E402

CORPUS = Path(__file__).parent / "fuzz_corpus"

CASES = {
    "reject-profile-not-batch": "optimization profile must equal the batch range (profile 1/2/8, batch 1/4/8)",
    "reject-profile-max-above-batch": "optimization profile must equal the batch range (profile 1/4/16, batch 1/4/8)",
    "reject-fp8-without-calibration": "an fp8 bundle needs its calibration.safetensors member",
    "reject-fp8-calibration-record-nil": "an fp8 bundle records how it was calibrated",
    "reject-calibration-member-on-fp16": "calibration.safetensors in a fp16 bundle (fp8 only)",
    "reject-fp8-no-calibration-member-at-all": "an fp8 bundle needs its calibration.safetensors member",
    "reject-no-model-onnx": "no model.onnx member",
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_python_reader_names_the_rule(case):
    with pytest.raises(ManifestError) as e:
        open_bundle(CORPUS / f"{case}.bundle")
    assert CASES[case] in str(e.value)


@pytest.mark.parametrize("case", sorted(CASES))
def test_cpp_reader_names_the_rule(inspect_cpp, case):
    assert_rejected(inspect_cpp, CORPUS / f"{case}.bundle", case, CASES[case])


def test_profile_equal_to_batch_is_accepted_by_both(inspect_cpp):
    path = CORPUS / "accept-profile-equals-batch-2-2-2.bundle"
    with open_bundle(path) as b:
        b.verify()
        assert b.manifest["engine"]["details"]["profile"] == b.manifest["batch"]
    r = run_cpp(inspect_cpp, path, "--verify")
    assert_clean(r, path.name)
    assert r.returncode == 0, r.stderr


def _manifest(**changes) -> dict:
    import corrupt

    sha = "sha256:" + "ab" * 32
    body = corrupt.sample_body(
        precision="fp8", recipe={"name": "r", "digest": sha, "quantized_layers": 1},
        calibration={"method": "max", "images": 1, "data_digest": sha, "data_source": "s",
                     "member": "calibration.safetensors"},
        members=[{"name": n} for n in ("model.onnx", "calibration.safetensors")])
    body.update(changes)
    return body


def test_each_broken_rule_is_one_line():
    """A manifest that breaks one rule gets one problem: the messages do not pile up."""
    assert semantic_problems(_manifest()) == []
    assert len(semantic_problems(_manifest(calibration=None))) == 1
    no_member = semantic_problems(_manifest(members=[{"name": "model.onnx"}]))
    assert len(no_member) == 2   # the member is missing, and the record names a missing member
    fp16 = semantic_problems(_manifest(precision="fp16", recipe=None, calibration=None))
    assert fp16 == ["members: calibration.safetensors in a fp16 bundle (fp8 only)"]
