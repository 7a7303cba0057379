"""cpp_stub: the C++ reader agrees with the Python one and rejects every damaged bundle.

The session fixture `inspect_cpp` (tests/conftest.py) builds cpp_stub with CMake under AddressSanitizer + UBSan; a test run
without cmake, a compiler or the libraries skips with the reason (set BUNDLE_CPP_REQUIRED=1,
as CI does, to make that a failure instead).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import corrupt  # noqa: E402  (tests/corrupt.py: shared damage helpers)

REPO = Path(__file__).resolve().parent.parent
SAN_ENV = {
    "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0",
    "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
}
SANITIZER_MARKS = ("AddressSanitizer", "LeakSanitizer", "runtime error:", "UndefinedBehaviorSanitizer")


def run_cpp(exe: Path, *args) -> subprocess.CompletedProcess:
    env = dict(os.environ, **SAN_ENV)
    return subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=60)


def assert_clean(r: subprocess.CompletedProcess, what: str) -> None:
    for mark in SANITIZER_MARKS:
        assert mark not in r.stderr, f"{what}: sanitizer report\n{r.stderr[-6000:]}"
    assert r.returncode in (0, 1), f"{what}: crashed (exit {r.returncode})\n{r.stderr[-3000:]}"


def assert_rejected(exe: Path, path, what: str, expect: str | None = None) -> str:
    r = run_cpp(exe, path, "--json", "--verify")
    assert_clean(r, what)
    assert r.returncode == 1, f"{what}: accepted by the C++ reader\n{r.stdout[:500]}"
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bundle-inspect-cpp: "), f"{what}: {r.stderr!r}"
    if expect:
        assert expect in lines[0], f"{what}: expected {expect!r} in {lines[0]!r}"
    return lines[0]


# --- bundles from the Python writer ----------------------------------------------------

PREPROCESS = {
    "spec_version": 1, "decode": {"mode": "RGB"},
    "resize": {"size": 331, "edge": "shorter", "interpolation": "bicubic", "antialias": True},
    "center_crop": {"height": 299, "width": 299}, "rescale": {"factor": 1 / 255},
    "normalize": {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]},
    "layout": "NCHW", "dtype": "float32", "input": "input",
}


def _members(seed: int, big: bool = False) -> dict[str, bytes]:
    rng = random.Random(seed)
    onnx = bytes(rng.getrandbits(8) for _ in range(3000)) + b"\0" * 20000
    if big:   # several MiB: the C++ side inflates it in many 1 MiB steps
        onnx += bytes(rng.getrandbits(8) for _ in range(1 << 16)) * 40
    return {
        "model.onnx": onnx,
        "preprocess.msgpack": msgpack.packb(PREPROCESS, use_bin_type=True),
        "labels.msgpack": msgpack.packb([f"class {i} \u00e9\u4e2d" for i in range(10)]),
        "reference.safetensors": b"{}" + bytes(100),
    }


def _tensorrt_fp8_body() -> dict:
    sha = "sha256:" + "ab" * 32
    return corrupt.sample_body(
        name="toy-fp8-fp8-depthwise-1-tensorrt",
        precision="fp8", variant="fp8-depthwise",
        recipe={"name": "depthwise", "digest": sha, "quantized_layers": 43, "quantized_activations": 40},
        batch={"min": 1, "opt": 8, "max": 32},
        source={"kind": "checkpoint", "id": "timm/xception41.tf_in1k", "revision": "0" * 40,
                "file": "model.safetensors", "sha256": sha},
        engine={"backend": "tensorrt", "member": "engine.plan", "details": {
            "tensorrt_version": "10.7.0", "compute_capability": "9.0", "device_name": "NVIDIA H200",
            "optimization_level": 3, "profile": {"min": 1, "opt": 8, "max": 32},
            "hardware_compatibility": "none", "version_compatible": False, "strongly_typed": True,
            "layer_count": 312, "workspace_bytes": 2 ** 40, "timing_cache_sha256": None,
            "build_seconds": "41.5"}},
        build={"tool": "trt-bundle", "tool_version": "0.1.0",
               "packages": {"tensorrt": "10.7.0", "onnx": "1.17.0", "\u00fcnicode": "1"},
               "source_date_epoch": None, "opset": 19, "build_seconds": "1e3"},
        quality={"reference": "fp32", "images": 4, "inputs_source": "synthetic",
                 "top1_agreement": "1.0", "kl_mean": "0.000123", "max_abs_diff": "0.0517",
                 "nan_count": 0, "inf_count": 0},
        calibration={"method": "percentile", "percentile": "99.99", "images": 16,
                     "data_digest": sha, "data_source": "synthetic \"quoted\"\n",
                     "member": "calibration.safetensors"},
        rebuilt_from="cd" * 32,
    )


@pytest.fixture(scope="session")
def synthetic(tmp_path_factory) -> dict[str, Path]:
    from bundler.writer import write_bundle

    out = tmp_path_factory.mktemp("cpp_stub_bundles")
    bundles = {}
    path, _ = write_bundle(out / "toy-fp32-1-onnxruntime.bundle", corrupt.sample_body(), _members(1))
    bundles["onnxruntime"] = path
    members = _members(2, big=True)
    members["engine.plan"] = b"plan" * 5000
    members["calibration.safetensors"] = b"{}" + bytes(64)
    members["empty"] = b""
    path, _ = write_bundle(out / "toy-fp8-fp8-depthwise-1-tensorrt.bundle", _tensorrt_fp8_body(), members)
    bundles["tensorrt-fp8"] = path
    path, _ = write_bundle(out / "toy-fp16-1-onnxruntime.bundle",
                           corrupt.sample_body(name="toy-fp16-1-onnxruntime", precision="fp16",
                                               source={"kind": "random-weights", "seed": -(2 ** 40)}),
                           {"model.onnx": b"x"})
    bundles["minimal"] = path
    return bundles


def python_summary(path: Path) -> dict:
    """What `bundle inspect --json` prints (bundler.inspect.inspect_summary), via JSON."""
    from bundler.inspect import inspect_summary

    return json.loads(json.dumps(inspect_summary(str(path))))


def cpp_summary(exe: Path, path: Path) -> dict:
    r = run_cpp(exe, path, "--json", "--verify")
    assert_clean(r, str(path))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


# --- agreement -------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["onnxruntime", "tensorrt-fp8", "minimal"])
def test_json_matches_python(inspect_cpp, synthetic, kind):
    path = synthetic[kind]
    assert cpp_summary(inspect_cpp, path) == python_summary(path)


def test_json_matches_the_cli(inspect_cpp, synthetic):
    path = synthetic["onnxruntime"]
    r = subprocess.run([sys.executable, "-m", "bundler.cli", "inspect", "--json", str(path)],
                       capture_output=True, text=True, cwd=REPO,
                       env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert r.returncode == 0, r.stderr
    # The CLI prints the measured decimal strings as numbers (bundler.inspect.json_summary).
    from bundler.inspect import json_summary

    assert json_summary(cpp_summary(inspect_cpp, path)) == json.loads(r.stdout)


@pytest.mark.parametrize("precision", ["fp32", "fp16", "fp8"])
def test_json_matches_python_on_family_bundles(inspect_cpp, request, precision):
    try:
        bundles = request.getfixturevalue("xception_bundles")
    except pytest.FixtureLookupError:
        pytest.skip("no xception_bundles fixture")
    path = bundles[precision]
    assert cpp_summary(inspect_cpp, path) == python_summary(path)


def test_human_summary_and_preprocess(inspect_cpp, synthetic):
    r = run_cpp(inspect_cpp, synthetic["tensorrt-fp8"], "--verify")
    assert_clean(r, "summary")
    assert r.returncode == 0 and "tensorrt (engine.plan)" in r.stdout and "verified" in r.stdout
    r = run_cpp(inspect_cpp, synthetic["onnxruntime"], "--preprocess")
    assert r.returncode == 0, r.stderr
    assert "resize 331 (shorter edge, bicubic, antialias on) -> crop 299x299" in r.stdout
    assert "mean [0.5, 0.5, 0.5]" in r.stdout and "input input" in r.stdout


@pytest.mark.parametrize("trt, cc, ok", [
    ("10.7.0", "9.0", True), ("10.7.1", "9.0", True), ("10.8.0", "9.0", False),
    ("11.0.0", "9.0", False), ("10.7.0", "8.9", False), ("10.7.0", "10.0", False),
])
def test_tensorrt_compatibility_rules(inspect_cpp, synthetic, trt, cc, ok):
    r = run_cpp(inspect_cpp, synthetic["tensorrt-fp8"], "--trt-compat", trt, cc)
    assert_clean(r, "compat")
    assert (r.returncode == 0) == ok, r.stderr
    if not ok:
        assert "not compatible" in r.stderr


def test_tensorrt_compatibility_flags(inspect_cpp, synthetic, tmp_path):
    def flags(m):
        m["engine"]["details"].update(hardware_compatibility="ampere+", version_compatible=True)
    path = corrupt.rewrite_manifest(synthetic["tensorrt-fp8"], tmp_path / "compat.bundle", flags)
    for trt, cc, ok in [("10.9.0", "8.0", True), ("11.2", "12.0", True), ("10.6.0", "9.0", False),
                        ("10.9.0", "7.5", False), ("9.2.0", "9.0", False)]:
        r = run_cpp(inspect_cpp, path, "--trt-compat", trt, cc)
        assert_clean(r, "compat")
        assert (r.returncode == 0) == ok, (trt, cc, r.stderr)


# --- rejections ------------------------------------------------------------------------

def test_missing_empty_directory(inspect_cpp, tmp_path):
    assert_rejected(inspect_cpp, tmp_path / "nope.bundle", "missing", "no such file")
    assert_rejected(inspect_cpp, tmp_path, "directory", "directory")
    (tmp_path / "empty.bundle").write_bytes(b"")
    assert_rejected(inspect_cpp, tmp_path / "empty.bundle", "empty", "empty file")


def _spread(start: int, end: int, count: int) -> list[int]:
    if end <= start:
        return []
    step = max(1, (end - start) // count)
    return sorted(set(list(range(start, end, step)) + [end - 1]))


def _regions(path: Path) -> list[tuple[str, int, int]]:
    data = path.read_bytes()
    h, _region, manifest_bytes = corrupt.split(data)
    regions = [("header", 0, corrupt.HEADER_SIZE)]
    for m in msgpack.unpackb(manifest_bytes, raw=False)["members"]:
        regions.append((m["name"], m["offset"], m["offset"] + m["stored_size"]))
    regions.append(("manifest", h["manifest_offset"], len(data)))
    return regions


def test_truncated_everywhere(inspect_cpp, synthetic, tmp_path):
    path = synthetic["tensorrt-fp8"]
    size = path.stat().st_size
    offsets = list(range(0, corrupt.HEADER_SIZE + 1))
    for _name, start, end in _regions(path)[1:]:
        offsets += _spread(start, end, 6)
    offsets = sorted(set(n for n in offsets if n < size))
    for n in offsets:
        out = corrupt.truncate(path, tmp_path / "t.bundle", n)
        assert_rejected(inspect_cpp, out, f"truncated to {n} bytes")
    # a byte too many
    out = tmp_path / "long.bundle"
    out.write_bytes(path.read_bytes() + b"\0")
    assert_rejected(inspect_cpp, out, "trailing byte", "trailing bytes")


def test_flipped_byte_everywhere(inspect_cpp, synthetic, tmp_path):
    path = synthetic["tensorrt-fp8"]
    cases = 0
    for name, start, end in _regions(path):
        offsets = range(start, end) if name == "header" else _spread(start, end, 12)
        for off in offsets:
            out = corrupt.flip_byte(path, tmp_path / "f.bundle", off)
            assert_rejected(inspect_cpp, out, f"byte {off} ({name}) flipped")
            cases += 1
    assert cases > 100


def test_header_fields(inspect_cpp, synthetic, tmp_path):
    path = synthetic["onnxruntime"]
    size = path.stat().st_size
    out = tmp_path / "h.bundle"
    data = bytearray(path.read_bytes())
    data[0:8] = b"\x89PNG\r\n\x1a\n"
    out.write_bytes(bytes(data))
    assert_rejected(inspect_cpp, out, "wrong magic", "magic")
    corrupt.set_header(path, out, major=2)
    assert_rejected(inspect_cpp, out, "unknown major", "major 2")
    corrupt.set_header(path, out, major=0)
    assert_rejected(inspect_cpp, out, "major 0", "major")
    corrupt.set_header(path, out, fix=False, minor=1)
    assert_rejected(inspect_cpp, out, "CRC", "CRC")
    h = corrupt.read_header(path.read_bytes())
    for fields, expect in [
        ({"manifest_offset": 10}, "inside the header"),
        ({"manifest_length": 0}, "manifest length"),
        ({"manifest_length": (16 << 20) + 1}, "manifest length"),
        ({"manifest_offset": 2 ** 64 - 1}, "manifest"),
        ({"manifest_offset": h["manifest_offset"] + 1}, "manifest"),
        ({"manifest_offset": h["manifest_offset"] - 1, "manifest_length": h["manifest_length"] + 1}, None),
        ({"manifest_length": 2 ** 64 - 1}, "manifest length"),
        ({"bundle_id": bytes(32)}, "is not the bundle id"),
    ]:
        corrupt.set_header(path, out, **fields)
        assert_rejected(inspect_cpp, out, f"header {fields}", expect)
    assert size == path.stat().st_size


def _first(m, name):
    return next(e for e in m["members"] if e["name"] == name)


def _layout_mutations(size: int):
    def by_offset(m):
        return sorted(m["members"], key=lambda e: e["offset"])

    def overlap(m):
        by_offset(m)[1]["offset"] -= 1
    def gap(m):
        last = by_offset(m)[-1]
        last["offset"] += 1
        last["stored_size"] -= 1
    def out_of_bounds(m):
        by_offset(m)[-1]["stored_size"] += 10
    def past_file(m):
        by_offset(m)[-1]["offset"] = size * 4
    def huge_offset(m):
        by_offset(m)[0]["offset"] = 2 ** 64 - 1
    def huge_size(m):
        by_offset(m)[0]["stored_size"] = 2 ** 64 - 1
    def wrapping(m):
        e = by_offset(m)[-1]
        e["stored_size"] = 2 ** 64 - e["offset"] + 64
    def duplicate(m):
        m["members"].append(dict(m["members"][0]))
    def same_offset(m):
        a, b = by_offset(m)[:2]
        b["offset"] = a["offset"]
    def path_name(m):
        m["members"][0]["name"] = "../etc/passwd"
    def engine_member_absent(m):
        m["members"] = [e for e in m["members"] if e["name"] != "model.onnx"]
    return [overlap, gap, out_of_bounds, past_file, huge_offset, huge_size, wrapping, duplicate,
            same_offset, path_name, engine_member_absent]


def test_member_layout(inspect_cpp, synthetic, tmp_path):
    path = synthetic["onnxruntime"]
    for mutate in _layout_mutations(path.stat().st_size):
        out = corrupt.rewrite_manifest(path, tmp_path / "l.bundle", mutate)
        assert_rejected(inspect_cpp, out, f"layout: {mutate.__name__}")


def _patch_frame_content_size(frame: bytes, new_size: int) -> bytes:
    """The zstd frame with its Frame_Content_Size field rewritten (same field width)."""
    fhd = frame[4]
    fcs_flag, single, dict_flag = fhd >> 6, (fhd >> 5) & 1, fhd & 3
    pos = 5 + (0 if single else 1) + (0, 1, 2, 4)[dict_flag]
    width = (1 if single else 0, 2, 4, 8)[fcs_flag]
    assert width, "frame without a content size"
    value = new_size - 256 if width == 2 else new_size
    assert 0 <= value < 256 ** width
    return frame[:pos] + value.to_bytes(width, "little") + frame[pos + width:]


def test_raw_size_smaller_than_content(inspect_cpp, synthetic, tmp_path):
    path = synthetic["tensorrt-fp8"]
    # only the manifest lies: the frame's content size no longer matches raw_size
    for name in ("model.onnx", "engine.plan", "labels.msgpack"):
        def smaller(m, name=name):
            _first(m, name)["raw_size"] -= 1
        out = corrupt.rewrite_manifest(path, tmp_path / "r.bundle", smaller)
        assert_rejected(inspect_cpp, out, f"raw_size of {name} - 1", "content size")
    # manifest and frame header agree on a smaller size: decompression must stop there
    data = path.read_bytes()
    for name in ("model.onnx", "engine.plan"):
        off, stored = corrupt.member_span(path, name)
        frame = data[off:off + stored]
        entry = _first(msgpack.unpackb(corrupt.split(data)[2], raw=False), name)
        for new in (entry["raw_size"] // 2, entry["raw_size"] - 1):
            patched = _patch_frame_content_size(frame, new)
            out = corrupt.replace_member(path, tmp_path / "r2.bundle", name, patched, raw_size=new)
            assert_rejected(inspect_cpp, out, f"{name} declared {new} bytes")
    # larger than the content, with the frame agreeing
    off, stored = corrupt.member_span(path, "engine.plan")
    entry = _first(msgpack.unpackb(corrupt.split(data)[2], raw=False), "engine.plan")
    patched = _patch_frame_content_size(data[off:off + stored], entry["raw_size"] + 1000)
    out = corrupt.replace_member(path, tmp_path / "r3.bundle", "engine.plan", patched,
                                 raw_size=entry["raw_size"] + 1000)
    assert_rejected(inspect_cpp, out, "raw_size larger than the content")


def test_member_content(inspect_cpp, synthetic, tmp_path):
    import zstandard

    path = synthetic["onnxruntime"]
    good = zstandard.ZstdCompressor(write_content_size=True).compress(b"other bytes")
    cases = {
        "sha256 mismatch": (good, {"raw_size": 11}, "sha256 mismatch"),
        "no content size": (zstandard.ZstdCompressor(write_content_size=False).compress(b"x" * 11),
                            {"raw_size": 11}, "content size"),
        "not zstd": (b"plain bytes here", {"raw_size": 16}, "not a zstd frame"),
        "two frames": (good + good, {"raw_size": 11}, "one zstd frame"),
        "truncated frame": (good[:-3], {"raw_size": 11}, None),
    }
    for what, (stored, fields, expect) in cases.items():
        out = corrupt.replace_member(path, tmp_path / "m.bundle", "labels.msgpack", stored, **fields)
        assert_rejected(inspect_cpp, out, what, expect)


def _schema_mutations():
    required = ["format", "name", "family", "precision", "variant", "recipe", "source", "inputs",
                "outputs", "batch", "engine", "build", "quality", "calibration", "rebuilt_from",
                "members"]
    muts = [(f"missing {k}", (lambda k: lambda m: m.pop(k))(k)) for k in required]

    def setter(path, value):
        def mutate(m):
            target = m
            for p in path[:-1]:
                target = target[p]
            target[path[-1]] = value
        return mutate

    for path, value in [
        (("name",), 5), (("name",), "a/b"), (("family",), "toy"), (("family", "version"), 1),
        (("precision",), "fp64"), (("variant",), 3), (("recipe",), []), (("source", "kind"), "hub"),
        (("source",), {"kind": "checkpoint"}), (("inputs",), []), (("inputs",), "input"),
        (("inputs", 0, "shape"), ["dynamic", 3]), (("inputs", 0, "dtype"), "float64"),
        (("outputs", 0, "shape", 1), 0), (("batch", "min"), "1"), (("batch", "max"), -1),
        (("engine", "backend"), "tvm"), (("engine", "member"), "engine.plan"),
        (("engine", "details"), None), (("engine", "details", "opset"), "19"),
        (("build", "tool"), "other"), (("build", "source_date_epoch"), "0"),
        (("quality",), {"reference": "fp32"}), (("calibration",), {"method": "max"}),
        (("rebuilt_from",), "xyz"), (("members",), []), (("members",), {}),
        (("members", 0, "offset"), -1), (("members", 0, "offset"), "64"),
        (("members", 0, "sha256"), "ZZ"), (("members", 0, "compression"), "gzip"),
        (("members", 0, "raw_size"), None), (("format", "major"), 2), (("format", "minor"), 1),
        (("format",), [1, 0]), (("unknown_field",), 1), (("members", 0, "extra"), True),
    ]:
        muts.append((f"{'.'.join(map(str, path))} = {value!r}", setter(path, value)))
    return muts


@pytest.mark.parametrize("what, mutate", _schema_mutations(), ids=lambda x: x if isinstance(x, str) else "")
def test_manifest_schema(inspect_cpp, synthetic, tmp_path, what, mutate):
    out = corrupt.rewrite_manifest(synthetic["onnxruntime"], tmp_path / "s.bundle", mutate)
    assert_rejected(inspect_cpp, out, what)


def _raw_manifests(good: bytes) -> dict[str, bytes]:
    m = msgpack.unpackb(good, raw=False)
    unsorted = msgpack.packb(dict(reversed(list(m.items()))), use_bin_type=True)
    return {
        "not msgpack": b"\xc1",
        "empty map": b"\x80",
        "array": msgpack.packb([m], use_bin_type=True),
        "unsorted keys": unsorted,
        "trailing bytes": good + b"\xc0",
        "cut short": good[:-5],
        "float": corrupt.canonical_packb(dict(m, batch={"min": 1.0, "opt": 4, "max": 8})),
        "bin": corrupt.canonical_packb(dict(m, name=b"toy")),
        "ext": good[:-1] + b"",  # replaced below
        "long int form": good.replace(b"\xa3opt\x04", b"\xa3opt\xcc\x04", 1),
        "long str form": good.replace(b"\xa3opt", b"\xd9\x03opt", 1),
        "signed positive": good.replace(b"\xa3opt\x04", b"\xa3opt\xd0\x04", 1),
        "invalid utf-8": good.replace(b"\xa3toy", b"\xa3\xff\xfe\xfd", 1),
        "duplicate key": good.replace(b"\xa3max", b"\xa3min", 1),
        "huge array": b"\x81\xa7members\xdd\xff\xff\xff\xff",
        "huge map": b"\xdf\xff\xff\xff\xff\xa1a",
        "huge string": b"\x81\xa4name\xdb\xff\xff\xff\xff",
        "2 MiB string": corrupt.canonical_packb(dict(m, name="a" * (2 << 20))),
        "deep nesting": b"\x91" * 100000 + b"\xc0",
        "wide array": corrupt.canonical_packb(dict(m, variant=list(range(70000)))),
        "non-string key": b"\x81\x01\x02",
        "nested non-string key": corrupt.canonical_packb(dict(m, recipe={})).replace(b"\xa6recipe\x80", b"\xa6recipe\x81\x01\x02", 1),
    }


def test_hostile_manifests(inspect_cpp, synthetic, tmp_path):
    path = synthetic["onnxruntime"]
    good = corrupt.split(path.read_bytes())[2]
    cases = _raw_manifests(good)
    cases["ext"] = corrupt.canonical_packb(dict(msgpack.unpackb(good, raw=False), name=msgpack.ExtType(1, b"x")))
    for what, raw in cases.items():
        if what not in ("not msgpack", "huge array", "huge map", "huge string", "deep nesting", "non-string key"):
            assert raw != good, f"{what}: the test's byte edit did not apply"
        out = corrupt.rewrite_manifest(path, tmp_path / "x.bundle", lambda m: None, encode=lambda _m, raw=raw: raw)
        assert_rejected(inspect_cpp, out, f"manifest: {what}")


def test_fuzzed_manifests_never_crash(inspect_cpp, synthetic, tmp_path):
    """Random byte edits of the manifest, id and CRC repaired: every outcome is a clean
    accept or a one-line rejection, never a crash or a sanitizer report."""
    path = synthetic["tensorrt-fp8"]
    good = corrupt.split(path.read_bytes())[2]
    rng = random.Random(7)
    for i in range(150):
        raw = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            raw[rng.randrange(len(raw))] = rng.choice([0x00, 0xff, 0xc1, 0xdc, 0xdd, 0xde, 0xdf, 0xdb,
                                                       0xcf, 0xd3, 0xcb, rng.randrange(256)])
        if rng.random() < 0.2:
            raw = raw[:rng.randrange(1, len(raw))]
        out = corrupt.rewrite_manifest(path, tmp_path / "z.bundle", lambda m: None,
                                       encode=lambda _m, raw=bytes(raw): raw)
        r = run_cpp(inspect_cpp, out, "--json", "--verify")
        assert_clean(r, f"fuzz case {i}")
        if r.returncode:
            assert len(r.stderr.strip().splitlines()) == 1


def test_crc_is_zlib_crc32(inspect_cpp, synthetic, tmp_path):
    """A header whose CRC is zlib.crc32 with the field zeroed is accepted (the helper's own
    fix_crc), and one off by one bit is not."""
    path = synthetic["minimal"]
    out = corrupt.set_header(path, tmp_path / "c.bundle")   # rewrite with the helper's CRC
    assert run_cpp(inspect_cpp, out, "--json").returncode == 0
    data = bytearray(out.read_bytes())
    data[12] ^= 1
    (tmp_path / "c2.bundle").write_bytes(bytes(data))
    assert_rejected(inspect_cpp, tmp_path / "c2.bundle", "crc bit", "CRC")
    assert hashlib.sha256(corrupt.split(bytes(data))[2]).digest() == corrupt.read_header(bytes(data))["bundle_id"]


def test_newer_minor_is_read(inspect_cpp, synthetic, tmp_path):
    """docs/format.md: a reader of major 1 reads any minor; minors only add optional fields."""
    def newer(m):
        m["format"]["minor"] = 3
        m["added_in_1_3"] = {"anything": [1, "two", None]}
    out = corrupt.rewrite_manifest(synthetic["onnxruntime"], tmp_path / "n.bundle", newer, minor=3)
    r = run_cpp(inspect_cpp, out, "--json", "--verify")
    assert_clean(r, "newer minor")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["added_in_1_3"] == {"anything": [1, "two", None]}
    # header and manifest must still agree on the version
    out = corrupt.rewrite_manifest(synthetic["onnxruntime"], tmp_path / "n2.bundle", newer)
    assert_rejected(inspect_cpp, out, "manifest minor differs from the header's", "differs from the header")


def test_a_long_range_member_is_stored_about_once_and_both_readers_inflate_it(inspect_cpp,
                                                                              tmp_path):
    """A member over the writer's LONG_RANGE_MIN (a torch-aoti package with a graph per
    static batch, each with its own copy of the weights) is compressed with long-distance
    matching over a window as large as the member: three copies of 4 MiB of random bytes
    are stored about once, and the Python and C++ readers inflate and verify it."""
    from bundler.writer import LONG_RANGE_MIN, write_bundle
    from runtime_py.format import open_bundle
    from runtime_py.format.zstd_frame import window_log_max

    weights = random.Random(3).randbytes(LONG_RANGE_MIN // 2)
    package = weights + b"graph batch1" + weights + b"graph batch2" + weights
    members = {**_members(1), "model.onnx": package}
    path, _ = write_bundle(tmp_path / "toy-fp32-1-onnxruntime.bundle", corrupt.sample_body(),
                           members)
    with open_bundle(path) as bundle:
        entry = bundle.member_entry("model.onnx")
        assert entry["raw_size"] > LONG_RANGE_MIN
        assert entry["stored_size"] < 1.05 * len(weights), entry
        assert bundle.read_member("model.onnx") == package
        bundle.verify()
    start, size = corrupt.member_span(path, "model.onnx")
    frame = path.read_bytes()[start:start + size]
    import zstandard

    assert zstandard.get_frame_parameters(frame).window_size <= 1 << window_log_max(len(package))
    r = run_cpp(inspect_cpp, path, "--verify")
    assert_clean(r, "long-range member")
    assert r.returncode == 0, r.stderr[-3000:]


def test_preprocess_member_is_validated(inspect_cpp, synthetic, tmp_path):
    import zstandard

    bad = dict(PREPROCESS, resize={"size": 331, "edge": "longer", "interpolation": "bicubic",
                                   "antialias": True})
    for what, raw in [("edge", msgpack.packb(bad)), ("not msgpack", b"\xc1"),
                      ("spec_version 2", msgpack.packb(dict(PREPROCESS, spec_version=2)))]:
        stored = zstandard.ZstdCompressor(write_content_size=True).compress(raw)
        out = corrupt.replace_member(synthetic["onnxruntime"], tmp_path / "p.bundle", "preprocess.msgpack",
                                     stored, raw_size=len(raw), sha256=hashlib.sha256(raw).hexdigest())
        assert run_cpp(inspect_cpp, out, "--verify").returncode == 0   # the file itself is sound
        r = run_cpp(inspect_cpp, out, "--preprocess")
        assert_clean(r, what)
        assert r.returncode == 1 and "preprocess" in r.stderr, (what, r.stderr)


PIXEL_PREPROCESS = dict(PREPROCESS, layout="NHWC", dtype="uint8",
                        in_engine=["rescale", "normalize", "layout", "cast"])


def test_uint8_pixel_preprocess_specs_are_judged_as_python_judges_them(inspect_cpp, synthetic, tmp_path):
    """`bundle make --input uint8` writes an NHWC uint8 spec with `in_engine`: both readers
    accept it, and refuse the same broken variants."""
    import zstandard

    from runtime_py.schemas import schema_problems

    cases = {
        "pixels": PIXEL_PREPROCESS,
        "uint8 without in_engine": {k: v for k, v in PIXEL_PREPROCESS.items() if k != "in_engine"},
        "uint8 NCHW": dict(PIXEL_PREPROCESS, layout="NCHW"),
        "float32 with in_engine": dict(PREPROCESS, in_engine=["rescale", "normalize", "layout", "cast"]),
        "float32 NHWC": dict(PREPROCESS, layout="NHWC"),
        "three steps": dict(PIXEL_PREPROCESS, in_engine=["rescale", "normalize", "cast"]),
        "a step twice": dict(PIXEL_PREPROCESS, in_engine=["rescale", "rescale", "layout", "cast"]),
        "unknown step": dict(PIXEL_PREPROCESS, in_engine=["rescale", "normalize", "layout", "blur"]),
    }
    for what, spec in cases.items():
        raw = msgpack.packb(spec, use_bin_type=True)
        stored = zstandard.ZstdCompressor(write_content_size=True).compress(raw)
        out = corrupt.replace_member(synthetic["onnxruntime"], tmp_path / "p.bundle", "preprocess.msgpack",
                                     stored, raw_size=len(raw), sha256=hashlib.sha256(raw).hexdigest())
        r = run_cpp(inspect_cpp, out, "--preprocess")
        assert_clean(r, what)
        python_ok = not schema_problems("preprocess", spec)
        assert (r.returncode == 0) == python_ok, (what, python_ok, r.stderr)
        assert python_ok == (what == "pixels"), what


@pytest.mark.parametrize("static, ok", [([1, 8], True), ([4], True), ([8, 1], False),
                                        ([2, 2], False), ([16], False), ([0], False)])
def test_static_batches_rule_in_both_readers(inspect_cpp, tmp_path, static, ok):
    """docs/format.md: torch-aoti engine.details.static_batches is ascending, each size once,
    within the batch range (1..8 here); both readers give the same verdict."""
    from bundler.writer import write_bundle
    from runtime_py.errors import ManifestError
    from runtime_py.format import open_bundle

    details = {"torch_version": "2.11.0", "cuda_version": "13.0", "compute_capability": "9.0",
               "device_name": "NVIDIA H200", "device": "cuda", "compile_options": {},
               "static_batches": [1]}
    body = corrupt.sample_body(name="toy-fp16-1-torch-aoti", precision="fp16",
                               engine={"backend": "torch-aoti", "member": "engine.pt2",
                                       "details": details})
    good, _ = write_bundle(tmp_path / "good.bundle", body,
                           {"model.onnx": b"x", "engine.pt2": b"pt2"})

    def claim(m):
        m["engine"]["details"]["static_batches"] = static
    out = corrupt.rewrite_manifest(good, tmp_path / "s.bundle", claim)
    if ok:
        assert_clean(r := run_cpp(inspect_cpp, out, "--json", "--verify"), str(static))
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["engine"]["details"]["static_batches"] == static
        with open_bundle(out) as bundle:
            bundle.verify()
    else:
        assert_rejected(inspect_cpp, out, str(static), "static_batches")
        with pytest.raises(ManifestError, match="static_batches"):
            open_bundle(out)
