"""An independent fuzzer: libFuzzer's coverage-guided mutations on the C++ reader, every input it
keeps then replayed through both readers (docs/fuzzing.md).

Independent of tests/fuzz_bundles.py: the mutations are libFuzzer's own, steered by the C++
reader's coverage, seeded with tests/fuzz_corpus/ and the three seed bundles. The harness
(cpp_stub/fuzz/fuzz_reader.cpp) recomputes the header CRC and the id of its input before reading
it; `fix_up` below is the same step, so the replay hands both readers the bytes the fuzzer judged.

Bounded for CI by BUNDLE_LIBFUZZER_RUNS (default 60,000 executions, libFuzzer -seed 16) and a
time cap; docs/fuzzing.md has the command for a long run by hand. Needs clang with libFuzzer
(Debian: apt-get install clang); skips without it unless BUNDLE_CPP_REQUIRED=1 (CI).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import fuzz_bundles  # noqa: E402
from test_fuzz_readers import SAN_ENV, CppBatch, python_verdict  # noqa: E402

CPP = Path(__file__).resolve().parent.parent / "cpp_stub"
CORPUS = Path(__file__).parent / "fuzz_corpus"
# What a long libFuzzer run kept beyond the named cases (merged to the inputs that add
# coverage; libFuzzer reads CORPUS's subfolders too): the CI run starts from its reach.
LIBFUZZER_KEPT = CORPUS / "libfuzzer"
HEADER_SIZE = 64


def fix_up(data: bytes) -> bytes:
    """The harness's input convention: id = sha256 of [manifest_offset, end) when that offset
    lies in the file, then the header CRC (docs/format.md, Header)."""
    if len(data) < HEADER_SIZE:
        return data
    raw = bytearray(data)
    offset = struct.unpack_from("<Q", raw, 16)[0]
    if HEADER_SIZE <= offset <= len(raw):
        raw[32:64] = hashlib.sha256(raw[offset:]).digest()
    raw[12:16] = bytes(4)
    struct.pack_into("<I", raw, 12, zlib.crc32(raw[:HEADER_SIZE]))
    return bytes(raw)


@pytest.fixture(scope="module")
def fuzz_reader(tmp_path_factory) -> Path:
    """bundle-fuzz-reader, built with clang -fsanitize=fuzzer,address,undefined."""
    clang, cmake = shutil.which("clang++"), shutil.which("cmake")
    if not (clang and cmake):
        reason = "clang++ and cmake are needed for the libFuzzer target (Debian: apt-get install clang cmake)"
        if os.environ.get("BUNDLE_CPP_REQUIRED") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    build = tmp_path_factory.mktemp("fuzz_build")
    conf = subprocess.run([cmake, "-S", str(CPP), "-B", str(build), "-DBUNDLE_FUZZ=ON", "-DBUNDLE_TRT=OFF",
                           f"-DCMAKE_CXX_COMPILER={clang}", "-DCMAKE_BUILD_TYPE=RelWithDebInfo"],
                          capture_output=True, text=True)
    assert conf.returncode == 0, conf.stdout[-3000:] + conf.stderr[-3000:]
    built = subprocess.run([cmake, "--build", str(build), "-j", str(max(2, os.cpu_count() or 2)),
                            "--target", "bundle-fuzz-reader"], capture_output=True, text=True)
    assert built.returncode == 0, built.stdout[-4000:] + built.stderr[-4000:]
    return build / "bundle-fuzz-reader"


def with_own_peak_rss(cmd: list[str], seconds: int) -> list[str]:
    """`cmd` started by a forked `timeout` process, so libFuzzer's -rss_limit_mb judges the
    fuzzer's memory and not pytest's.

    libFuzzer reads its RSS from getrusage's ru_maxrss, and Linux carries that peak across
    execve: a program that pytest starts directly begins with pytest's own peak (torch and the
    models of earlier tests: 5.1 GB in a full CI session), so the limit fired one second into
    the run, blaming the empty input (docs/fuzzing.md). A child forked by a small process
    starts from that process's few MB. `timeout` also ends the fuzzer itself if it hangs past
    `seconds` (killing only the wrapper would leave the fuzzer running)."""
    return ["timeout", "--kill-after=10", str(seconds), *cmd]


def test_libfuzzer_then_differential_replay(fuzz_reader, inspect_cpp, tmp_path):
    seeds = tmp_path / "seeds"
    seeds.mkdir()
    for path in fuzz_bundles.write_seeds(seeds):
        path.rename(seeds / path.name)
    kept = tmp_path / "kept"
    kept.mkdir()
    runs = int(os.environ.get("BUNDLE_LIBFUZZER_RUNS", "60000"))
    # -rss_limit_mb also sets -malloc_limit_mb: one allocation over 2,048 MB stops the run and
    # names its input.
    fuzzer = [str(fuzz_reader), f"-runs={runs}", "-seed=16", "-max_total_time=90", "-timeout=10",
              "-rss_limit_mb=2048", "-max_len=300000", f"-artifact_prefix={tmp_path}/", "-print_final_stats=1",
              str(kept), str(seeds), str(CORPUS)]
    r = subprocess.run(with_own_peak_rss(fuzzer, seconds=280), capture_output=True, text=True,
                       env=dict(os.environ, **SAN_ENV), timeout=300)
    log = r.stdout + r.stderr
    assert r.returncode == 0, f"libFuzzer found a crash, leak or hang:\n{log[-6000:]}"
    assert "Done" in log and "stat::number_of_executed_units" in log, log[-3000:]
    inputs = (sorted(kept.iterdir()) + sorted(seeds.iterdir()) + sorted(CORPUS.glob("*.bundle"))
              + sorted(LIBFUZZER_KEPT.iterdir()))
    cpp = CppBatch(inspect_cpp, tmp_path / "stderr.txt")
    out = tmp_path / "replay.bundle"
    problems, accepted = [], 0
    for path in inputs:
        out.write_bytes(fix_up(path.read_bytes()))
        py, _ = python_verdict(out)
        cc = cpp.verdict(out)
        accepted += py.startswith("OK")
        if py.split(" ", 1)[0] != cc.split(" ", 1)[0] or (py.startswith("OK") and py != cc):
            problems.append(f"{path.name}: Python {py[:200]!r} vs C++ {cc[:200]!r}")
    stderr = cpp.close()
    print(f"libFuzzer: {runs} runs, {len(inputs)} inputs replayed, {accepted} accepted by both")
    assert not problems, f"{len(problems)} disagreements:\n" + "\n".join(problems[:20])
    assert "Sanitizer" not in stderr and "runtime error:" not in stderr, stderr[-4000:]
    assert len(list(kept.iterdir())) > 0


def test_started_fuzzer_has_its_own_peak_rss(tmp_path):
    """The kernel behaviour `with_own_peak_rss` relies on: a child started directly by a process
    that once held 256 MB reports that peak as its own ru_maxrss; started through it, its own."""
    if not shutil.which("timeout"):
        pytest.skip("needs coreutils timeout")
    probe = ("import resource; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)")
    parent = f"""
import subprocess, sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from test_fuzz_libfuzzer import with_own_peak_rss
blob = bytearray(256 << 20)
for i in range(0, len(blob), 4096):
    blob[i] = 1
del blob
probe = [sys.executable, "-c", {probe!r}]
for cmd in (probe, with_own_peak_rss(probe, seconds=60)):
    print(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip())
"""
    r = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    direct_mb, wrapped_mb = (int(line) for line in r.stdout.split())
    assert direct_mb >= 256, f"direct child: {direct_mb} MB (the inherited peak this guards against)"
    assert wrapped_mb < 128, f"child through with_own_peak_rss: {wrapped_mb} MB"
