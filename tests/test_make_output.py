"""`bundle make --out`: the output place is checked before any work, an existing bundle of
the same name is replaced only with --force, and --reuse takes one made from the same
inputs instead of building."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
from synthetic_bundles import write_source_bundle  # noqa: E402

from bundler.cli import cli  # noqa: E402
from bundler.writer import prepare_out_dir  # noqa: E402
from runtime_py.errors import OutputPathError  # noqa: E402

FP16_NAME = "timm_xception-fp16-1.0.0-onnxruntime.bundle"


def make(*args: str):
    return CliRunner().invoke(cli, ["make", "timm_xception", "--precision", "fp16",
                                    "--random-weights", "--backend", "onnxruntime",
                                    "--reference-count", "2", *args])


def test_out_under_a_regular_file_is_refused_before_any_work(tmp_path):
    blocker = tmp_path / "bundles-file.txt"
    blocker.write_text("not a folder")
    started = time.monotonic()
    res = make("--out", str(blocker / "sub"))
    assert res.exit_code == 6, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)
    assert f"{blocker} is a file" in res.output
    assert time.monotonic() - started < 10          # refused before the export
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundles-file.txt"]


def unwritable_folder(tmp_path: Path) -> Path:
    """A folder this process cannot write in: a read-only mount for root, else mode 0o555."""
    if os.geteuid() == 0:
        if os.access("/sys", os.F_OK):
            try:
                prepare_out_dir("/sys/trt-bundle-out")
            except OutputPathError:
                return Path("/sys/trt-bundle-out")
        pytest.skip("running as root with no read-only folder to write into")
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    return folder / "bundles"


def test_unwritable_out_is_refused_before_any_work(tmp_path):
    out = unwritable_folder(tmp_path)
    res = make("--out", str(out))
    assert res.exit_code == 6, res.output
    assert "is not writable" in res.output and str(out) in res.output
    assert not out.exists()


def test_prepare_out_dir_leaves_nothing_behind(tmp_path):
    out = prepare_out_dir(tmp_path / "a" / "b")
    assert out == tmp_path / "a" / "b" and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("input_args, name", [
    ((), FP16_NAME),
    # the name carries -uint8: the early check once left it out, so a uint8 torch-aoti build
    # compiled for minutes before it was refused (H200, 2026-12-04)
    (("--input", "uint8"), "timm_xception-fp16-uint8-1.0.0-onnxruntime.bundle"),
])
def test_an_existing_bundle_of_the_same_name_is_refused_without_force(tmp_path, input_args,
                                                                     name):
    old = write_source_bundle(tmp_path / "src")
    out = tmp_path / "out"
    out.mkdir()
    target = out / name
    shutil.copy(old, target)
    before = target.read_bytes()
    started = time.monotonic()
    res = make("--out", str(out), *input_args)
    assert res.exit_code == 6, res.output
    assert "already exists" in res.output and "--force" in res.output
    assert time.monotonic() - started < 10          # refused before the export
    assert target.read_bytes() == before


@pytest.mark.slow
def test_force_replaces_it(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / FP16_NAME).write_bytes(b"an older file of that name")
    res = make("--out", str(out), "--force")
    assert res.exit_code == 0, res.output
    bundle_id = res.output.strip().splitlines()[-1]
    ok = CliRunner().invoke(cli, ["verify", str(out / FP16_NAME)])
    assert ok.exit_code == 0 and bundle_id in ok.output


@pytest.mark.slow
def test_reuse_takes_a_bundle_of_the_same_inputs_and_names_what_differs(tmp_path):
    """GPU scripts re-run after an interrupted device call rebuilt torch-aoti bundles they
    had (minutes each on an H200); --reuse makes that a check of the manifest."""
    out = tmp_path / "out"
    first = make("--out", str(out), "--json")
    assert first.exit_code == 0, first.output
    made = json.loads(first.stdout)
    path = out / FP16_NAME
    assert made["reused"] is False and Path(made["path"]) == path
    before = path.stat()

    again = make("--out", str(out), "--reuse", "--json")
    assert again.exit_code == 0, again.output
    reused = json.loads(again.stdout)
    assert reused["reused"] is True and reused["id"] == made["id"]
    assert (path.stat().st_ino, path.stat().st_mtime_ns) == (before.st_ino, before.st_mtime_ns)

    # another file of the family's bundle names beside it (here not a bundle at all): the
    # refusal names what differs in the bundle of this target's name, not in that one
    decoy = out / FP16_NAME.replace("onnxruntime", "torch-aoti")
    decoy.write_bytes(b"not a bundle")
    other = make("--out", str(out), "--reuse", "--seed", "1")   # other weights: not reused
    assert other.exit_code == 6, other.output
    assert "already exists" in other.output and "not reused: weights differ" in other.output
    decoy.unlink()
    assert path.stat().st_mtime_ns == before.st_mtime_ns

    rebuilt = make("--out", str(out), "--reuse", "--force", "--seed", "1", "--json")
    assert rebuilt.exit_code == 0, rebuilt.output
    replaced = json.loads(rebuilt.stdout)
    assert replaced["reused"] is False and replaced["id"] != made["id"]
    assert sorted(p.name for p in out.iterdir()) == [FP16_NAME]


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="needs RLIMIT_FSIZE and SIGXFSZ (Linux)")
def test_a_write_the_system_refuses_is_exit_6_and_leaves_nothing(tmp_path):
    """A full disk (the CI machine's, 2026-12-04) or a file size limit: the system refuses the
    bundle's write. `bundle make` says which file and why (exit 6, no traceback) and leaves
    no partial file and no folder it created. Here a real EFBIG from an 8 MB file size
    limit on the process (the fp32 bundle is ~90 MB)."""
    import resource
    import signal
    import subprocess

    def limit_file_size():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)      # EFBIG instead of a kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (8 << 20, resource.RLIM_INFINITY))

    out = tmp_path / "new" / "bundles"
    done = subprocess.run(
        [sys.executable, "-m", "bundler.cli", "make", "timm_xception", "--precision", "fp32",
         "--random-weights", "--backend", "onnxruntime", "--reference-count", "2",
         "--out", str(out)],
        preexec_fn=limit_file_size, capture_output=True, text=True,
        cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 6, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert "could not write" in done.stderr and "File too large" in done.stderr
    assert str(out / "timm_xception-fp32-1.0.0-onnxruntime.bundle") in done.stderr
    assert list(tmp_path.iterdir()) == []              # no partial file, no new folder
