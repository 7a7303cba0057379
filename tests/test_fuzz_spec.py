"""An independent fuzzer with an oracle: bundles drawn from docs/format.md alone (tests/spec_bundles.py,
hypothesis), valid and broken in exactly one stated rule, through both readers (docs/fuzzing.md).

A valid draw must be accepted by both with the id of its manifest bytes and decode to what was
written; a draw with one broken rule must be refused by both: no accepted spec violation.
Derandomized and bounded for CI (BUNDLE_SPEC_FUZZ_EXAMPLES, default 150 of each).
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))
import spec_bundles  # noqa: E402
from test_fuzz_readers import CppBatch, python_verdict  # noqa: E402

from runtime_py.format import open_bundle  # noqa: E402

EXAMPLES = int(os.environ.get("BUNDLE_SPEC_FUZZ_EXAMPLES", "150"))
SETTINGS = settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def cpp(inspect_cpp, tmp_path_factory):
    batch = CppBatch(inspect_cpp, tmp_path_factory.mktemp("spec_fuzz") / "stderr.txt")
    yield batch
    stderr = batch.close()
    assert "Sanitizer" not in stderr and "runtime error:" not in stderr, stderr[-4000:]


def _write(tmp: Path, data: bytes) -> Path:
    path = tmp / "spec.bundle"
    path.write_bytes(data)
    return path


def test_valid_bundles_are_accepted_by_both(cpp, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("spec_valid")

    @SETTINGS
    @given(spec_bundles.manifests(), st.sampled_from([0, 1]))
    def check(drawn, minor):
        body, members = drawn
        data = spec_bundles.bundle_bytes(body, members, minor=minor)
        path = _write(tmp, data)
        py, _ = python_verdict(path)
        expected_id = hashlib.sha256(data[-int.from_bytes(data[24:32], "little"):]).hexdigest()
        assert py == f"OK {expected_id}", py
        assert cpp.verdict(path) == py
        with open_bundle(path) as b:
            got = {k: v for k, v in b.manifest.items() if k not in ("format", "members")}
            assert got == msgpack.unpackb(spec_bundles.canonical(body), raw=False)
            assert {n: b.read_member(n) for n in b.member_names} == members

    check()


@pytest.mark.parametrize("rule", sorted(spec_bundles.VIOLATIONS))
def test_each_broken_rule_is_refused_by_both(cpp, tmp_path_factory, rule):
    tmp = tmp_path_factory.mktemp("spec_broken")

    @settings(SETTINGS, max_examples=max(3, EXAMPLES // 25))
    @given(spec_bundles.manifests())
    def check(drawn):
        body, members = drawn
        spec_bundles.VIOLATIONS[rule](body, members)
        path = _write(tmp, spec_bundles.bundle_bytes(body, members))
        py, _ = python_verdict(path)
        cc = cpp.verdict(path)
        assert py.startswith("ERR") and cc.startswith("ERR"), f"{rule}: Python {py[:300]!r}, C++ {cc[:300]!r}"

    check()
