"""The suite writes its caches into pytest's run folder (tests/conftest.py ``run_caches``),
never into the home cache or /tmp/torchinductor_root: those outlived each run, filled the
CI machine's disk (ENOSPC in the middle of a run) and gave reused machines warm caches a
clean CI machine does not have."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def _inside(path: str | Path, folder: Path) -> bool:
    return Path(path).resolve().is_relative_to(folder.resolve())


def test_the_export_cache_is_the_runs(run_caches):
    from bundler.export import default_cache_dir

    assert _inside(default_cache_dir(), run_caches)
    assert not _inside(default_cache_dir(), Path.home())


def test_inductors_cache_is_the_runs(run_caches):
    cache_dir_utils = pytest.importorskip(
        "torch._inductor.runtime.cache_dir_utils",
        reason="this torch has no torch._inductor.runtime.cache_dir_utils")
    assert _inside(cache_dir_utils.cache_dir(), run_caches)


def test_each_worker_has_an_inductor_cache_of_its_own(run_caches):
    """Inductor writes compiled objects in place, named by their code: workers that share a
    cache can load each other's half-written libraries. The folder is named by the worker
    (gw0, gw1; "main" without xdist), so no two processes of a run share one."""
    folder = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    assert folder.parent.resolve() == run_caches.resolve()
    assert folder.name == f"torchinductor-cache-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"


def test_a_subprocess_gets_the_runs_caches(run_caches):
    """The CLI tests run `bundle make` in subprocesses: they inherit the variables."""
    code = ("import os; print(os.environ['TRT_BUNDLE_CACHE']); "
            "print(os.environ['TORCHINDUCTOR_CACHE_DIR'])")
    lines = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True).stdout.split()
    assert len(lines) == 2 and all(_inside(line, run_caches) for line in lines)


def test_green_runs_leave_no_folder_behind(pytestconfig):
    assert pytestconfig.getini("tmp_path_retention_policy") == "failed"


def test_ci_refuses_to_start_on_a_full_disk(tmp_path):
    """.ci/run reads the free space with df before installing anything: a df that reports
    100 MB free makes it stop with a message that says what to free, not run the suite."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "df").write_text(
        "#!/bin/sh\necho 'Filesystem 1048576-blocks Used Available Capacity Mounted on'\n"
        "echo '/dev/vda 252000 251900 100 100% /'\n")
    (fake / "df").chmod(0o755)
    for tool in ("apt-get", "pip", "python3"):   # anything past the check would call these
        (fake / tool).write_text(f"#!/bin/sh\necho 'CI went past the disk check: {tool}'\n"
                                 "exit 99\n")
        (fake / tool).chmod(0o755)
    ci = Path(__file__).resolve().parent.parent / ".ci" / "run"
    done = subprocess.run(["bash", str(ci)], capture_output=True, text=True,
                          env={**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "100 MB free" in done.stderr and "needs about" in done.stderr
    assert "went past" not in done.stdout + done.stderr


def test_each_worker_runs_its_share_of_the_cores_in_torch_and_onnxruntime():
    """Two workers on 2 cores: one thread each in torch and in every ONNX Runtime session,
    not a spinning thread per core in each (conftest sets both before torch is imported)."""
    torch = pytest.importorskip("torch")
    import onnxruntime as ort

    from conftest import threads_per_worker
    from runtime_py.engines.onnxruntime import session_options

    share = threads_per_worker()
    assert torch.get_num_threads() == share
    assert session_options(ort, "fp16").intra_op_num_threads == share
