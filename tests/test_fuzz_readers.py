"""Differential fuzz: the Python and C++ readers give the same verdict on hostile bundles.

Each mutant (tests/fuzz_bundles.py, seeded: BUNDLE_FUZZ_SEED, BUNDLE_FUZZ_COUNT) goes through
`open_bundle` + `verify` in this process and through one long-lived `bundle-inspect-cpp
--batch` built under ASan + UBSan. Required: no crash (a Python exception other than a
BundleError, a sanitizer report, a dead C++ process), no hang, the same verdict and, when
both accept, the same bundle id; a mutant that re-signs nothing must decode to its seed's
content. tests/fuzz_corpus/ keeps the interesting cases as files named by their verdict.
"""

from __future__ import annotations

import os
import random
import selectors
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import fuzz_bundles  # noqa: E402

from runtime_py.errors import BundleError  # noqa: E402
from runtime_py.format import open_bundle  # noqa: E402

CORPUS = Path(__file__).parent / "fuzz_corpus"
SAN_ENV = {"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0",
           "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"}
HANG_SECONDS = 30.0


class CppBatch:
    """One `bundle-inspect-cpp --batch` process: a path in, one verdict line out."""

    def __init__(self, exe: Path, stderr_path: Path) -> None:
        self._stderr = open(stderr_path, "wb")
        self._stderr_path = stderr_path
        self.proc = subprocess.Popen([str(exe), "--batch"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._stderr,
                                     env=dict(os.environ, **SAN_ENV))
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.proc.stdout, selectors.EVENT_READ)
        self._buf = b""

    def verdict(self, path: Path) -> str:
        self.proc.stdin.write(str(path).encode() + b"\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + HANG_SECONDS
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not self._sel.select(left):
                self.proc.kill()
                raise AssertionError(f"C++ reader hangs on {path}")
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            if not chunk:
                self.proc.wait()
                raise AssertionError(f"C++ reader died (exit {self.proc.returncode}) on {path}:\n"
                                     + self._stderr_path.read_text(errors="replace")[-4000:])
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode("utf-8", "replace")

    def close(self) -> str:
        """Ends the process; returns its stderr (sanitizer reports land there)."""
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
        self._stderr.close()
        self._sel.close()
        self.proc.stdout.close()
        return self._stderr_path.read_text(errors="replace")


def python_verdict(path: Path) -> tuple[str, object]:
    """("OK <id>", content) or ("ERR ...", None); any other exception is a crash."""
    try:
        with open_bundle(path) as b:
            b.verify()
            return f"OK {b.id}", content_of(b.manifest)
    except BundleError as exc:
        return f"ERR {exc}", None


def content_of(manifest: dict) -> object:
    """What a bundle holds, without where its members lie: a re-framed member or a re-laid
    file holds the same content."""
    members = sorted((m["name"], m["raw_size"], m["sha256"]) for m in manifest["members"])
    rest = {k: v for k, v in manifest.items() if k != "members"}
    return rest, members


@pytest.fixture(scope="module")
def seeds(tmp_path_factory) -> list[Path]:
    return fuzz_bundles.write_seeds(tmp_path_factory.mktemp("fuzz_seeds"))


def _check(path: Path, kind: str, cpp: CppBatch, expected_content, problems: list[str]) -> str:
    started = time.monotonic()
    py, content = python_verdict(path)
    assert time.monotonic() - started < HANG_SECONDS, f"Python reader hangs on {kind}"
    cc = cpp.verdict(path)
    if py.split(" ", 1)[0] != cc.split(" ", 1)[0] or (py.startswith("OK") and py != cc):
        problems.append(f"{kind}: Python {py[:200]!r} vs C++ {cc[:200]!r}")
    elif py.startswith("OK") and expected_content is not None and content != expected_content:
        problems.append(f"{kind}: accepted with content other than its seed's")
    return py


def test_seeds_are_accepted_by_both(inspect_cpp, seeds, tmp_path):
    cpp = CppBatch(inspect_cpp, tmp_path / "stderr.txt")
    for path in seeds:
        assert python_verdict(path)[0].startswith("OK")
        assert cpp.verdict(path) == python_verdict(path)[0]
    assert cpp.close().strip() == ""


def test_differential_fuzz(inspect_cpp, seeds, tmp_path):
    seed = int(os.environ.get("BUNDLE_FUZZ_SEED", "16"))
    count = int(os.environ.get("BUNDLE_FUZZ_COUNT", "2000"))
    rng = random.Random(seed)
    seed_bytes = [p.read_bytes() for p in seeds]
    seed_content = {}
    for data, path in zip(seed_bytes, seeds):
        seed_content[data] = python_verdict(path)[1]
    cpp = CppBatch(inspect_cpp, tmp_path / "stderr.txt")
    problems: list[str] = []
    tally: dict[str, list[int]] = {}
    out = tmp_path / "mutant.bundle"
    for i in range(count):
        data = rng.choice(seed_bytes)
        mutant = rng.choices([f for f, _ in fuzz_bundles.CLASSES],
                             [w for _, w in fuzz_bundles.CLASSES])[0](rng, data)
        out.write_bytes(mutant.data)
        expected = seed_content[data] if mutant.same_content else None
        verdict = _check(out, f"mutant {i} ({mutant.kind}, seed {seed})", cpp, expected, problems)
        counts = tally.setdefault(mutant.kind.split("-")[0], [0, 0])
        counts[verdict.startswith("OK")] += 1
    stderr = cpp.close()
    print(f"fuzz seed {seed}: {count} mutants, kind -> [rejected, accepted]: {tally}")
    assert not problems, f"{len(problems)} disagreements:\n" + "\n".join(problems[:20])
    for mark in ("AddressSanitizer", "LeakSanitizer", "runtime error:"):
        assert mark not in stderr, stderr[-4000:]
    assert set(tally) >= {"byte", "truncate", "insert", "header", "manifest", "member"}


def test_corpus(inspect_cpp, tmp_path):
    """The kept mutants: each file's name says the verdict both readers must give."""
    files = sorted(CORPUS.glob("*.bundle"))
    assert len(files) >= 20
    cpp = CppBatch(inspect_cpp, tmp_path / "stderr.txt")
    problems: list[str] = []
    for path in files:
        verdict = _check(path, path.name, cpp, None, problems)
        want = path.name.split("-", 1)[0]
        if ("accept" if verdict.startswith("OK") else "reject") != want:
            problems.append(f"{path.name}: {verdict[:200]}")
    stderr = cpp.close()
    assert not problems, "\n".join(problems)
    assert "Sanitizer" not in stderr and "runtime error:" not in stderr, stderr[-4000:]
