"""`bundle inspect` and `bundle verify` on sound and bad bundles: output shapes, exit
codes, one line per problem, and never a traceback."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zstandard
from click.testing import CliRunner

import corrupt
from bundler.cli import cli
from bundler.inspect import inspect_summary, json_summary, verify_report
from bundler.writer import write_bundle
from runtime_py.format import open_bundle

MEMBERS = {
    "model.onnx": np.random.default_rng(5).standard_normal(32 * 1024).astype(np.float32).tobytes(),
    "labels.msgpack": b"\x92\xa3cat\xa3dog",
    "text.txt": b"compressible " * 5000,
}


@pytest.fixture(scope="module")
def sound(tmp_path_factory) -> Path:
    path, _ = write_bundle(tmp_path_factory.mktemp("cli") / "toy-fp32-1-onnxruntime.bundle",
                           corrupt.sample_body(), MEMBERS)
    return path


def run(*args: str):
    result = CliRunner().invoke(cli, list(args), catch_exceptions=True)
    combined = result.output + (result.stderr or "")
    assert "Traceback" not in combined
    # an unexpected Python exception is a bug, whatever the exit code
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        repr(result.exception)
    return result


# --- sound bundle ---------------------------------------------------------------------------

def test_inspect_human(sound):
    with open_bundle(sound) as b:
        bundle_id = b.id
    r = run("inspect", str(sound))
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert f"id       {bundle_id}" in out
    assert "bundle   toy-fp32-1-onnxruntime" in out
    assert "format   1.0" in out
    assert "family   toy 1" in out
    assert "RANDOM WEIGHTS (seed 0)" in out
    assert "engine   onnxruntime (model.onnx)" in out
    assert "input    input float32 ['batch', 3, 8, 8]" in out
    for name in MEMBERS:
        assert name in out
    assert r.stderr == ""


def test_inspect_names_the_static_batch_graphs(tmp_path):
    details = {"torch_version": "2.11.0", "cuda_version": "13.0", "compute_capability": "9.0",
               "device_name": "NVIDIA H200", "device": "cuda", "compile_options": {},
               "static_batches": [1, 8]}
    body = corrupt.sample_body(name="toy-fp16-1-torch-aoti", precision="fp16",
                               engine={"backend": "torch-aoti", "member": "engine.pt2",
                                       "details": details})
    path, _ = write_bundle(tmp_path / "toy-fp16-1-torch-aoti.bundle", body,
                           {"model.onnx": b"x", "engine.pt2": b"pt2"})
    r = run("inspect", str(path))
    assert r.exit_code == 0, r.output
    assert "batch    1..8 (opt 4); a static graph for 1, 8" in r.stdout
    r = run("inspect", "--json", str(path))
    assert json.loads(r.stdout)["engine"]["details"]["static_batches"] == [1, 8]


def test_inspect_json(sound):
    with open_bundle(sound) as b:
        bundle_id, manifest = b.id, b.manifest
    r = run("inspect", "--json", str(sound))
    assert r.exit_code == 0
    summary = json.loads(r.stdout)
    assert summary["id"] == bundle_id
    assert summary["file_size"] == sound.stat().st_size
    assert summary["random_weights"] is True
    for key in manifest:
        assert key in summary, key
    assert [m["name"] for m in summary["members"]] == sorted(MEMBERS)
    for m in summary["members"]:
        assert set(m) >= {"name", "offset", "stored_size", "raw_size", "sha256", "ratio"}
        assert isinstance(m["ratio"], float)
        assert m["ratio"] == pytest.approx(m["raw_size"] / m["stored_size"], abs=1e-3)
        assert m["sha256"] == hashlib.sha256(MEMBERS[m["name"]]).hexdigest()
    assert summary == json.loads(json.dumps(json_summary(inspect_summary(sound))))


def test_verify_sound(sound):
    with open_bundle(sound) as b:
        bundle_id = b.id
    r = run("verify", str(sound))
    assert r.exit_code == 0
    assert r.stdout.startswith(f"ok {bundle_id} {sound}")
    assert "3 member hashes" in r.stdout
    assert r.stderr == ""
    r = run("verify", "--json", str(sound))
    assert r.exit_code == 0
    report = json.loads(r.stdout)
    assert report["ok"] is True and report["problems"] == [] and report["id"] == bundle_id


@pytest.mark.parametrize("command", ["inspect", "verify", None])
def test_help_documents_exit_codes(command):
    r = run(*([command] if command else []), "--help")
    assert r.exit_code == 0
    text = " ".join(r.output.split())
    for fragment in ("Exit codes: 0 success", "1 verify found problems", "3 malformed or corrupt",
                     "4 path not found"):
        assert fragment in text


def test_installed_command_in_a_subprocess(sound, tmp_path):
    ok = subprocess.run(["bundle", "verify", "--json", str(sound)], capture_output=True,
                        text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["ok"] is True
    off, _ = corrupt.member_span(sound, "model.onnx")
    bad = corrupt.flip_byte(sound, tmp_path / "bad.bundle", off + 50)
    res = subprocess.run(["bundle", "verify", str(bad)], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 1
    assert "Traceback" not in res.stderr + res.stdout
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{bad}: member 'model.onnx': ")
    res = subprocess.run([sys.executable, "-m", "bundler.cli", "inspect", str(tmp_path / "no")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 4 and "Traceback" not in res.stderr
    assert res.stderr.startswith("error: ")


# --- corrupt members: verify lists each problem ------------------------------------------------

def test_verify_one_line_per_corrupt_member(sound, tmp_path):
    out = tmp_path / "two-bad.bundle"
    data = bytearray(sound.read_bytes())
    for name in ("model.onnx", "text.txt"):
        off, size = corrupt.member_span(sound, name)
        data[off + size // 2] ^= 0xFF
    out.write_bytes(bytes(data))
    r = run("verify", str(out))
    assert r.exit_code == 1
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 2
    assert any("'model.onnx'" in line for line in lines)
    assert any("'text.txt'" in line for line in lines)
    assert all(line.startswith(f"{out}: ") for line in lines)
    r = run("verify", "--json", str(out))
    assert r.exit_code == 1
    report = json.loads(r.stdout)
    assert report["ok"] is False and len(report["problems"]) == 2
    # inspect does not decompress members: it still works on this bundle
    assert run("inspect", str(out)).exit_code == 0


# --- bad files: specific message, exit code, no traceback --------------------------------------

def _bad_files(sound: Path, d: Path) -> dict[str, tuple[Path, int, str]]:
    """name -> (path, exit code of `inspect`, fragment of the message)."""
    size = sound.stat().st_size
    h = corrupt.read_header(sound.read_bytes())
    off, stored = corrupt.member_span(sound, "model.onnx")
    fifo = d / "fifo"
    os.mkfifo(fifo)
    (d / "empty.bundle").write_bytes(b"")
    (d / "text.bundle").write_bytes(b"just some text, not a bundle\n" * 5)
    bomb = zstandard.ZstdCompressor(write_content_size=False).compress(bytes(64 << 20))
    cases = {
        "missing": (d / "missing.bundle", 4, "no such file"),
        "directory": (d, 4, "is a directory"),
        "fifo": (fifo, 4, "not a regular file"),
        "empty": (d / "empty.bundle", 3, "empty"),
        "wrong magic": (d / "text.bundle", 3, "magic"),
        "truncated in header": (corrupt.truncate(sound, d / "t1.bundle", 30), 3, "truncated"),
        "truncated in member": (corrupt.truncate(sound, d / "t2.bundle", off + stored // 2), 3,
                                "truncated"),
        "truncated in manifest": (corrupt.truncate(sound, d / "t3.bundle", size - 3), 3,
                                  "truncated"),
        "flipped header": (corrupt.flip_byte(sound, d / "fh.bundle", 20), 3, "CRC32"),
        "flipped magic": (corrupt.flip_byte(sound, d / "fm.bundle", 1), 3, "magic"),
        "flipped manifest": (corrupt.flip_byte(sound, d / "fmf.bundle", size - 10), 3,
                             "bundle id"),
        "unknown major": (corrupt.set_header(sound, d / "v.bundle", major=2), 3,
                          "format 2.0 is not supported"),
        "manifest too long": (corrupt.set_header(sound, d / "ml.bundle",
                                                 manifest_length=h["manifest_length"] + 5), 3,
                              "truncated"),
        "overlap": (corrupt.rewrite_manifest(
            sound, d / "o.bundle",
            lambda m: m["members"][1].update(offset=m["members"][0]["offset"])), 3, "overlap"),
        "out of bounds": (corrupt.rewrite_manifest(
            sound, d / "oob.bundle", lambda m: m["members"][0].update(offset=1 << 40)), 3,
            "outside the data region"),
        "missing field": (corrupt.rewrite_manifest(
            sound, d / "mf.bundle", lambda m: m.__delitem__("precision")), 3,
            "'precision' is a required property"),
        "wrong type": (corrupt.rewrite_manifest(
            sound, d / "wt.bundle", lambda m: m["batch"].update(max="8")), 3, "batch/max"),
        "slash in name": (corrupt.rewrite_manifest(
            sound, d / "sl.bundle", lambda m: m["members"][0].update(name="a/b")), 3,
            "members/0/name"),
        "not canonical": (corrupt.rewrite_manifest(
            sound, d / "nc.bundle", lambda m: None,
            encode=lambda m: __import__("msgpack").packb(dict(reversed(sorted(m.items()))))), 3,
            "canonical"),
        "bomb": (corrupt.replace_member(sound, d / "bomb.bundle", "model.onnx", bomb,
                                        raw_size=1 << 20), 0, "does not record its content size"),
    }
    return cases


@pytest.fixture(scope="module")
def bad_files(sound, tmp_path_factory):
    return _bad_files(sound, tmp_path_factory.mktemp("bad"))


BAD_CASES = ["missing", "directory", "fifo", "empty", "wrong magic", "truncated in header",
             "truncated in member", "truncated in manifest", "flipped header", "flipped magic",
             "flipped manifest", "unknown major", "manifest too long", "overlap",
             "out of bounds", "missing field", "wrong type", "slash in name", "not canonical",
             "bomb"]


@pytest.mark.parametrize("case", BAD_CASES)
def test_inspect_bad_file(bad_files, case):
    path, code, fragment = bad_files[case]
    r = run("inspect", str(path))
    assert r.exit_code == code, (r.exit_code, r.output)
    if code:
        assert r.stdout == ""
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0]
    r = run("inspect", "--json", str(path))
    assert r.exit_code == code


@pytest.mark.parametrize("case", BAD_CASES)
def test_verify_bad_file(bad_files, case):
    path, _code, fragment = bad_files[case]
    r = run("verify", str(path))
    assert r.exit_code != 0
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert lines and all(line.startswith(f"{path}: ") for line in lines)
    assert any(fragment in line for line in lines)
    r = run("verify", "--json", str(path))
    assert r.exit_code != 0
    report = json.loads(r.stdout)
    assert report["ok"] is False and any(fragment in p for p in report["problems"])
    assert verify_report(path)["ok"] is False


@pytest.mark.parametrize("case,code", [("missing", 4), ("directory", 4), ("empty", 3),
                                       ("wrong magic", 3)])
def test_verify_exit_code_of_unopenable_file(bad_files, case, code):
    """A file that is not a bundle at all gets the error's own code, not 1 (problems)."""
    path, _, _ = bad_files[case]
    result = run("verify", str(path))
    assert result.exit_code == code
    assert result.stderr.count(str(path)) == 1
