"""The rules beyond the schema that tie fields together (docs/format.md): a TensorRT plan's
optimization profile is the manifest's batch range, calibration goes with fp8 and only
with fp8, every bundle carries model.onnx, and a metadata member's declared size is bounded
(docs/format.md, "Member size limits"). Each case is a kept regression file of tests/fuzz_corpus/; both readers must refuse
it and say why, in the same words."""

from __future__ import annotations

import subprocess
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
    "reject-labels-1-mib-plus-1": "labels.msgpack declares raw_size 1048577, over its limit of 1048576",
    "reject-preprocess-1-gib": "preprocess.msgpack declares raw_size 1073741824, over its limit of 1048576",
    "reject-other-member-64-mib-plus-1": "empty declares raw_size 67108865, over its limit of 67108864",
    "reject-calibration-64-mib-plus-1": "calibration.safetensors declares raw_size 67108865, over its limit",
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
        members=[{"name": n, "raw_size": 1} for n in ("model.onnx", "calibration.safetensors")])
    body.update(changes)
    return body


def test_each_broken_rule_is_one_line():
    """A manifest that breaks one rule gets one problem: the messages do not pile up."""
    assert semantic_problems(_manifest()) == []
    assert len(semantic_problems(_manifest(calibration=None))) == 1
    no_member = semantic_problems(_manifest(members=[{"name": "model.onnx", "raw_size": 1}]))
    assert len(no_member) == 2   # the member is missing, and the record names a missing member
    fp16 = semantic_problems(_manifest(precision="fp16", recipe=None, calibration=None))
    assert fp16 == ["members: calibration.safetensors in a fp16 bundle (fp8 only)"]


@pytest.mark.parametrize("name, limit", [
    ("preprocess.msgpack", 1 << 20), ("labels.msgpack", 1 << 20),
    ("calibration.safetensors", 64 << 20), ("reference.safetensors", 64 << 20),
    ("notes.json", 64 << 20), ("engine.plan", 64 << 20)])
def test_member_size_limit_at_and_over(name, limit):
    """At its limit a member passes; one byte over it is refused, whatever its name, except the
    graph and the engine member (engine.plan is only a metadata member of a bundle whose engine
    is another)."""
    def problems(raw_size: int) -> list[str]:
        members = [{"name": "model.onnx", "raw_size": 1 << 40},
                   {"name": "calibration.safetensors", "raw_size": 1}]
        members = [m for m in members if m["name"] != name] + [{"name": name, "raw_size": raw_size}]
        return semantic_problems(_manifest(members=members))

    assert problems(limit) == []
    assert problems(limit + 1) == [
        f"members: {name} declares raw_size {limit + 1}, over its limit of {limit} bytes "
        '(docs/format.md, "Member size limits"): a hostile or corrupt bundle']


@pytest.mark.parametrize("case", ["accept-labels-1-mib", "accept-model-onnx-64-mib-plus-1",
                                  "accept-engine-pt2-64-mib-plus-1"])
def test_member_at_limit_or_unbounded_opens_in_both(inspect_cpp, case):
    """The other side of the limit: a member at it, and the graph and engine member past the
    metadata limit, are read by both readers."""
    path = CORPUS / f"{case}.bundle"
    with open_bundle(path) as b:
        b.verify()
    r = run_cpp(inspect_cpp, path, "--verify")
    assert_clean(r, case)
    assert r.returncode == 0, r.stderr


_PEAK_PROBE = """
import resource, sys
from runtime_py.errors import ManifestError
from runtime_py.format import open_bundle
try:
    with open_bundle(sys.argv[1]) as b:
        b.preprocess
    print("opened")
except ManifestError:
    print("refused")
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
"""


def _own_peak(cmd: list[str]) -> list[str]:
    """`cmd` forked by `timeout`, so its ru_maxrss is its own and not pytest's (Linux carries the
    peak across execve: tests/test_fuzz_libfuzzer.py::test_started_fuzzer_has_its_own_peak_rss)."""
    return ["timeout", "--kill-after=10", "60", *cmd]


def test_crafted_gigabyte_preprocess_keeps_python_memory_small():
    """A 34 KB bundle whose preprocess.msgpack declares (and would really inflate to) 1 GiB is
    refused from its manifest: the process that opens it and asks for the preprocess spec peaks
    far below the gigabyte it declares."""
    path = CORPUS / "reject-preprocess-1-gib.bundle"
    assert path.stat().st_size < 64 * 1024
    r = subprocess.run(_own_peak([sys.executable, "-c", _PEAK_PROBE, str(path)]),
                       capture_output=True, text=True, timeout=90, cwd=Path(__file__).parent.parent)
    assert r.returncode == 0, r.stderr[-3000:]
    verdict, peak_mb = r.stdout.split()
    assert verdict == "refused"
    assert int(peak_mb) < 100, f"peak RSS {peak_mb} MB opening a bundle that declares 1 GiB"


def test_crafted_gigabyte_preprocess_keeps_cpp_memory_small(inspect_cpp):
    path = CORPUS / "reject-preprocess-1-gib.bundle"
    wrapper = ("import resource, subprocess, sys; "
               "r = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
               "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)")
    r = subprocess.run(_own_peak([sys.executable, "-c", wrapper, str(inspect_cpp), str(path),
                                  "--preprocess"]), capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stderr[-3000:]
    rc, peak_mb = (int(v) for v in r.stdout.split())
    assert rc == 1   # refused
    assert peak_mb < 100, f"C++ reader peak RSS {peak_mb} MB on a bundle that declares 1 GiB"


def test_read_member_holds_the_member_once():
    """A member is decompressed into one buffer of its declared size: reading a 64 MiB graph
    costs about 64 MiB, not the chunks and their join (2x) or a doubling buffer."""
    import tracemalloc

    path = CORPUS / "accept-model-onnx-64-mib-plus-1.bundle"
    with open_bundle(path) as b:
        raw_size = b.member_entry("model.onnx")["raw_size"]
        tracemalloc.start()
        try:
            data = b.read_member("model.onnx")
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert len(data) == raw_size
    assert peak < raw_size * 1.1, f"peak {peak / raw_size:.2f}x the member's size"


def test_writer_refuses_a_member_over_its_limit(tmp_path):
    """The writer checks the same rule: nothing is written that no reader would open."""
    import corrupt
    from bundler.writer import write_bundle

    out = tmp_path / "toy-fp32-1-onnxruntime.bundle"
    with pytest.raises(ManifestError, match="labels.msgpack declares raw_size 1048577"):
        write_bundle(out, corrupt.sample_body(),
                     {"model.onnx": b"graph", "labels.msgpack": bytes((1 << 20) + 1)})
    assert list(tmp_path.iterdir()) == []
