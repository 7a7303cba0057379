"""A seeded generator of hostile bundles, for the differential test of the two readers.

`CLASSES` makes `Mutant`s in every class of issue 16: byte flips,
truncations, insertions, header edits with the CRC fixed, manifest edits re-encoded
canonically with the id and CRC fixed, raw manifest byte edits with the id fixed, member
edits with the sha256 fixed, zstd framing variants, deep nesting and large manifests. Like
tests/corrupt.py it follows docs/format.md and imports nothing from the readers.

`same_content` says whether a mutant, if a reader accepts it, must decode to its seed's
content (the edits that re-sign nothing, and re-framings of unchanged bytes); the other
mutants are checked only for agreement between the readers.
"""

from __future__ import annotations

import hashlib
import random
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import msgpack
import zstandard

import corrupt

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
SKIPPABLE = struct.pack("<I", 0x184D2A50) + struct.pack("<I", 4) + b"skip"


@dataclass
class Mutant:
    kind: str
    data: bytes
    same_content: bool


# --- seeds ---------------------------------------------------------------------------------

def _tensorrt_fp8_body() -> dict:
    sha = "sha256:" + "ab" * 32
    return corrupt.sample_body(
        name="toy-fp8-1-tensorrt", precision="fp8", variant="fp8-depthwise",
        recipe={"name": "depthwise", "digest": sha, "quantized_layers": 4},
        engine={"backend": "tensorrt", "member": "engine.plan", "details": {
            "tensorrt_version": "10.7.0", "compute_capability": "9.0", "device_name": "H200",
            "optimization_level": 3, "profile": {"min": 1, "opt": 4, "max": 8},
            "hardware_compatibility": "none", "version_compatible": False,
            "strongly_typed": True, "layer_count": 12}},
        calibration={"method": "max", "images": 4, "data_digest": sha,
                     "data_source": "synthetic", "member": "calibration.safetensors"})


def _torch_aoti_body() -> dict:
    return corrupt.sample_body(
        name="toy-fp16-1-torch-aoti", precision="fp16",
        engine={"backend": "torch-aoti", "member": "engine.pt2", "details": {
            "torch_version": "2.14.1", "cuda_version": "12.8", "compute_capability": "9.0",
            "device_name": "H200", "device": "cuda",
            "compile_options": {"max_autotune": False, "nested": {"a": [1, 2]}},
            "batch_sizes": [1, 4, 8]}},
        build={"tool": "trt-bundle", "tool_version": "0.0.0",
               "packages": {"torch": "2.14.1"}, "source_date_epoch": 0, "opset": 19})


def write_seeds(out: Path) -> list[Path]:
    """Three small sound bundles (a few KB each): onnxruntime fp32, tensorrt fp8 with a
    calibration member, torch-aoti fp16 with open maps in its details."""
    from bundler.writer import write_bundle

    rng = random.Random(1)
    common = {"model.onnx": bytes(rng.getrandbits(8) for _ in range(600)) + bytes(3000),
              "labels.msgpack": msgpack.packb([f"class {i} \u00e9" for i in range(8)]),
              "empty": b""}
    specs = [
        ("toy-fp32-1-onnxruntime", corrupt.sample_body(), {}),
        ("toy-fp8-1-tensorrt", _tensorrt_fp8_body(),
         {"engine.plan": b"plan" * 400, "calibration.safetensors": b"{}" + bytes(30)}),
        ("toy-fp16-1-torch-aoti", _torch_aoti_body(), {"engine.pt2": b"pt2" * 300}),
    ]
    paths = []
    for name, body, extra in specs:
        path, _ = write_bundle(out / f"{name}.bundle", body, dict(common, **extra))
        paths.append(path)
    return paths


# --- helpers -------------------------------------------------------------------------------

def _manifest(data: bytes) -> dict:
    return msgpack.unpackb(corrupt.split(data)[2], raw=False)


def _resign(data: bytes, manifest_bytes: bytes, **header: Any) -> bytes:
    """`data` with its manifest replaced, the id, length and CRC fixed."""
    h, region, _ = corrupt.split(data)
    h.update(header)
    return corrupt._assemble(h, region, manifest_bytes)


def _replace_member(data: bytes, name: str, stored: bytes | None, **entry: Any) -> bytes:
    """corrupt.replace_member on bytes: re-lays every member, fixes manifest, id, CRC
    (`stored` None: the member is dropped)."""
    h, region, manifest_bytes = corrupt.split(data)
    manifest = msgpack.unpackb(manifest_bytes, raw=False)
    blobs, offset = [], corrupt.HEADER_SIZE
    if stored is None:
        manifest["members"] = [e for e in manifest["members"] if e["name"] != name]
    for e in sorted(manifest["members"], key=lambda m: m["offset"]):
        start = e["offset"] - corrupt.HEADER_SIZE
        blob = region[start:start + e["stored_size"]]
        if e["name"] == name:
            blob = stored
            e.update(entry)
        e["offset"], e["stored_size"] = offset, len(blob)
        offset += len(blob)
        blobs.append(blob)
    return corrupt._assemble(h, b"".join(blobs), corrupt.canonical_packb(manifest))


def _member_raw(data: bytes, name: str) -> bytes:
    region_start = corrupt.HEADER_SIZE
    h, region, manifest_bytes = corrupt.split(data)
    for e in msgpack.unpackb(manifest_bytes, raw=False)["members"]:
        if e["name"] == name:
            start = e["offset"] - region_start
            return zstandard.ZstdDecompressor().decompress(region[start:start + e["stored_size"]])
    raise KeyError(name)


def nested(depth: int, leaf: Any = 1) -> Any:
    """A value of `depth` containers (alternating maps and arrays) around `leaf`."""
    value = leaf
    for i in range(depth):
        value = {"k": value} if i % 2 else [value]
    return value


# --- the classes ---------------------------------------------------------------------------

def byte_flips(rng: random.Random, data: bytes) -> Mutant:
    raw = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        raw[rng.randrange(len(raw))] ^= rng.randrange(1, 256)
    return Mutant("byte-flip", bytes(raw), True)


def truncation(rng: random.Random, data: bytes) -> Mutant:
    return Mutant("truncate", data[:rng.randrange(len(data))], True)


def insertion(rng: random.Random, data: bytes) -> Mutant:
    at = rng.randrange(len(data) + 1)
    blob = bytes(rng.getrandbits(8) for _ in range(rng.choice([1, 1, 2, 7, 64])))
    return Mutant("insert", data[:at] + blob + data[at:], True)


def header_edit(rng: random.Random, data: bytes) -> Mutant:
    h = corrupt.read_header(data)
    field = rng.choice(["major", "minor", "manifest_offset", "manifest_length", "bundle_id"])
    if field in ("major", "minor"):
        h[field] = rng.choice([0, 1, 2, 3, 0xFFFF, h[field] ^ (1 << rng.randrange(16))])
    elif field == "bundle_id":
        h[field] = bytes(rng.getrandbits(8) for _ in range(32))
    else:
        h[field] = rng.choice([0, 1, 63, 64, h[field] - 1, h[field] + 1, len(data),
                               2 ** 64 - 1, 2 ** 63, (1 << 20) + 1, h[field] ^ (1 << rng.randrange(64))])
        h[field] %= 2 ** 64
    header = corrupt.HEADER.pack(*(h[f] for f in corrupt.HEADER_FIELDS))
    return Mutant("header", corrupt.fix_crc(header + data[corrupt.HEADER_SIZE:]), True)


def _hostile_value(rng: random.Random) -> Any:
    return rng.choice([
        None, True, 0, 1, -1, 2 ** 31 - 1, 2 ** 31, 2 ** 63 - 1, 2 ** 64 - 1, -(2 ** 63), "",
        "batch", "x", "a" * 300, "\u00e9" * 129, "\u00e9" * 257, "labels.msgpack\n",
        "model.onnx", "fp8", "0.5", "nan", "1e3\n", [], {}, [1], {"a": 1}, ["batch", 3],
        "sha256:" + "0" * 64, "0" * 64, "0" * 64 + "\n",
    ])


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, prefix + (i,))
    return out


def _set(root: Any, path: tuple, value: Any) -> None:
    for p in path[:-1]:
        root = root[p]
    root[path[-1]] = value


def _get(root: Any, path: tuple) -> Any:
    for p in path:
        root = root[p]
    return root


def _semantic_edits() -> list[Callable[[random.Random, dict], Any]]:
    """Edits aimed at the rules beyond the schema and the bounds of docs/format.md."""
    def shape(rng, m):
        t = rng.choice(m["inputs"] + m["outputs"])
        t["shape"] = rng.choice([[3, "batch"], ["batch", "batch", 3], ["batch"] + [2] * 7,
                                 ["batch"] + [2] * 8, [5, 3], ["batch", 2 ** 31 - 1],
                                 ["batch", 2 ** 31], ["batch", 2 ** 64 - 1], ["batch", 0]])
    def names(rng, m):
        m["outputs"][0]["name"] = rng.choice([m["inputs"][0]["name"], "\u00e9" * 256,
                                              "\u00e9" * 257, "x" * 257, ""])
    def duplicate_tensor(rng, m):
        m[rng.choice(["inputs", "outputs"])].append(dict(m["inputs"][0]))
    def batch(rng, m):
        m["batch"] = {k: rng.choice([1, 2, 4, 8, 2 ** 31 - 1, 2 ** 31]) for k in ("min", "opt", "max")}
    def precision(rng, m):
        m["precision"] = rng.choice(["fp32", "fp16", "fp8"])
    def dtype(rng, m):
        rng.choice(m["inputs"] + m["outputs"])["dtype"] = rng.choice(["float16", "bfloat16", "int8"])
    def calibration(rng, m):
        m["calibration"] = rng.choice([None, {"method": "max", "images": 1, "data_digest": "sha256:" + "1" * 64,
                                              "data_source": "s", "member": "calibration.safetensors"}])
    def opset(rng, m):
        value = rng.choice([0, 1, 999, 1000, 2 ** 64 - 1])
        if m["engine"]["backend"] == "onnxruntime" and rng.random() < 0.5:
            m["engine"]["details"]["opset"] = value
        else:
            m["build"]["opset"] = value
    def trailing_newline(rng, m):
        path = rng.choice([("name",), ("variant",), ("rebuilt_from",), ("members", 0, "name"),
                           ("family", "name"), ("members", 0, "sha256")])
        value = _get(m, path) if path != ("rebuilt_from",) else "c" * 64
        _set(m, path, (value or "x") + "\n")
    def unknown_key(rng, m):
        target = rng.choice([m, m["family"], m["batch"], m["engine"], m["engine"]["details"],
                             m["members"][0], m["inputs"][0], m["build"]])
        target["zz_unknown"] = rng.choice([1, "x", nested(3)])
    def deep(rng, m):
        depth = rng.choice([60, 61, 62, 63, 64, 65, 66, 200, 300])
        if m["engine"]["backend"] == "torch-aoti" and rng.random() < 0.5:
            m["engine"]["details"]["compile_options"]["deep"] = nested(depth - 4)
        else:
            m["zz_deep"] = nested(depth - 1)
    def large(rng, m):
        kind = rng.choice(["packages", "values", "string", "bytes"])
        if kind == "packages":
            n = rng.choice([1024, 1025])
            m["build"]["packages"] = {f"p{i:05d}": "1" for i in range(n)}
        elif kind == "values":
            n = rng.choice([60000, 65000, 66000])
            m["zz_large"] = list(range(n))
        elif kind == "string":
            m["zz_string"] = "s" * rng.choice([65535, 65536, 65537])
        else:
            m["zz_bytes"] = ["b" * 60000] * rng.choice([17, 18])
    def members(rng, m):
        e = rng.choice(m["members"])
        field = rng.choice(["offset", "stored_size", "raw_size", "name"])
        e[field] = rng.choice([0, 63, 64, e[field] if field != "name" else "x", 2 ** 64 - 1,
                               "engine.plan", "calibration.safetensors"]) \
            if field == "name" or rng.random() < 0.5 else e[field] + rng.choice([-1, 1])
    return [shape, names, duplicate_tensor, batch, precision, dtype, calibration, opset,
            trailing_newline, unknown_key, deep, large, members]


SEMANTIC_EDITS = _semantic_edits()


def manifest_edit(rng: random.Random, data: bytes) -> Mutant:
    m = _manifest(data)
    minor = 0
    if rng.random() < 0.3:   # a newer minor: unknown keys are then ignored in every map
        minor = 1
        m["format"]["minor"] = 1
    if rng.random() < 0.6:
        rng.choice(SEMANTIC_EDITS)(rng, m)
    else:
        path = rng.choice(_paths(m))
        if rng.random() < 0.2 and isinstance(_get(m, path[:-1]), dict):
            del _get(m, path[:-1])[path[-1]]
        else:
            _set(m, path, _hostile_value(rng))
    try:
        encoded = corrupt.canonical_packb(m)
    except (ValueError, OverflowError):   # msgpack refuses to write it: nothing to test
        encoded = corrupt.split(data)[2]
    return Mutant("manifest", _resign(data, encoded, minor=minor), False)


def manifest_bytes_edit(rng: random.Random, data: bytes) -> Mutant:
    raw = bytearray(corrupt.split(data)[2])
    for _ in range(rng.randint(1, 3)):
        raw[rng.randrange(len(raw))] = rng.choice([0x00, 0xc0, 0xc1, 0xc2, 0xca, 0xcb, 0xcc, 0xd0,
                                                   0xd9, 0xdc, 0xde, 0xdf, 0x0a, 0x80, 0x90,
                                                   rng.randrange(256)])
    if rng.random() < 0.2:
        raw = raw[:rng.randrange(1, len(raw))]
    return Mutant("manifest-bytes", _resign(data, bytes(raw)), False)


def _frame(raw: bytes, **kw: Any) -> bytes:
    return zstandard.ZstdCompressor(**kw).compress(raw)


def member_edit(rng: random.Random, data: bytes) -> Mutant:
    m = _manifest(data)
    entry = rng.choice(m["members"])
    name = entry["name"]
    raw = _member_raw(data, name)
    sha = hashlib.sha256(raw).hexdigest()
    variant = rng.choice(["level", "checksum", "two-frames", "empty-frame-after", "skippable-before",
                          "skippable-after", "no-content-size", "trailing-zero", "other-content",
                          "raw-size", "raw-block", "window"])
    same = True
    fields: dict[str, Any] = {"raw_size": len(raw), "sha256": sha}
    if variant == "level":
        stored = _frame(raw, level=rng.choice([1, 19, -5]))
    elif variant == "checksum":
        stored = _frame(raw, write_checksum=True)
    elif variant == "two-frames":
        cut = rng.randrange(len(raw) + 1)
        stored = _frame(raw[:cut]) + _frame(raw[cut:])
    elif variant == "empty-frame-after":
        stored = _frame(raw) + _frame(b"")
    elif variant == "skippable-before":
        stored = SKIPPABLE + _frame(raw)
    elif variant == "skippable-after":
        stored = _frame(raw) + SKIPPABLE
    elif variant == "no-content-size":
        stored = _frame(raw, write_content_size=False)
    elif variant == "trailing-zero":
        stored = _frame(raw) + b"\0"
    elif variant == "other-content":
        raw = bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 200)))
        stored, fields = _frame(raw), {"raw_size": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}
        same = False
    elif variant == "raw-size":
        stored = _frame(raw)
        fields["raw_size"] = max(0, len(raw) + rng.choice([-1, 1, 1 << 20]))
    elif variant == "raw-block":   # hand-made frame: one raw block, content size present
        fhd = 0x20 | (3 << 6)      # single segment, 8-byte content size
        block = (len(raw) << 3) | 1
        stored = ZSTD_MAGIC + bytes([fhd]) + struct.pack("<Q", len(raw)) + block.to_bytes(3, "little") + raw
        if len(raw) > 128 * 1024:
            stored = _frame(raw)
    else:   # window descriptor claiming a huge window (not single segment)
        stored = bytearray(_frame(raw))
        if not stored[4] & 0x20:
            stored[5] = 0xF8   # exponent 31+: beyond any limit
        stored = bytes(stored)
    return Mutant(f"member-{variant}", _replace_member(data, name, stored, **fields), same)


CLASSES: list[tuple[Callable[[random.Random, bytes], Mutant], int]] = [
    (byte_flips, 16), (truncation, 6), (insertion, 6), (header_edit, 10), (manifest_edit, 34),
    (manifest_bytes_edit, 12), (member_edit, 16),
]



# --- the kept corpus (tests/fuzz_corpus/) --------------------------------------------------

def _edit(data: bytes, mutate: Callable[[dict], None], minor: int = 0) -> bytes:
    m = _manifest(data)
    if minor:
        m["format"]["minor"] = minor
    mutate(m)
    return _resign(data, corrupt.canonical_packb(m), minor=minor)


def _member(data: bytes, name: str, stored: Callable[[bytes], bytes]) -> bytes:
    raw = _member_raw(data, name)
    return _replace_member(data, name, stored(raw), raw_size=len(raw),
                           sha256=hashlib.sha256(raw).hexdigest())


def rle_frame(size: int) -> bytes:
    """A hand-made zstd frame of `size` zero bytes in RLE blocks of 128 KiB (4 bytes each): a
    ~32 KB frame can declare a gigabyte. Single segment, the content size in 8 bytes."""
    block = 128 * 1024
    out = [ZSTD_MAGIC, bytes([0xE0]), struct.pack("<Q", size)]
    left = size
    while True:
        n = min(left, block)
        left -= n
        out.append(((n << 3) | (1 << 1) | (left == 0)).to_bytes(3, "little") + b"\0")
        if left == 0:
            return b"".join(out)


def zeros_sha256(size: int) -> str:
    digest, chunk = hashlib.sha256(), bytes(1 << 20)
    for start in range(0, size, len(chunk)):
        digest.update(chunk[:min(len(chunk), size - start)])
    return digest.hexdigest()


def with_zero_member(data: bytes, name: str, size: int) -> bytes:
    """`data` with member `name` (added when missing) holding `size` zero bytes, correctly
    framed and hashed: only a size rule can refuse it."""
    if name not in [e["name"] for e in _manifest(data)["members"]]:
        h, region, manifest_bytes = corrupt.split(data)
        manifest = msgpack.unpackb(manifest_bytes, raw=False)
        manifest["members"].append({"name": name, "offset": h["manifest_offset"], "stored_size": 0,
                                    "raw_size": 0, "sha256": "0" * 64, "compression": "zstd"})
        data = corrupt._assemble(h, region, corrupt.canonical_packb(manifest))
    return _replace_member(data, name, rle_frame(size), raw_size=size, sha256=zeros_sha256(size))


def regression_cases(seeds: list[Path]) -> dict[str, bytes]:
    """name -> bytes of each kept case; the name starts with the verdict both readers give."""
    ort, trt, aoti = (p.read_bytes() for p in seeds)

    def setter(*path: Any, value: Any) -> Callable[[dict], None]:
        return lambda m: _set(m, path, value)

    def deep(depth: int) -> Callable[[dict], None]:
        return lambda m: m.update(zz_deep=nested(depth - 1))   # the top map is depth 1

    def add_key(target: str) -> Callable[[dict], None]:
        return lambda m: m[target].update(zz_unknown={"a": 1})

    cases = {
        "accept-tensor-name-129-e-acute": _edit(ort, setter("inputs", 0, "name", value="\u00e9" * 129)),
        "accept-tensor-name-256-e-acute": _edit(ort, setter("inputs", 0, "name", value="\u00e9" * 256)),
        "reject-tensor-name-257-e-acute": _edit(ort, setter("inputs", 0, "name", value="\u00e9" * 257)),
        "accept-minor1-unknown-key-in-engine": _edit(ort, add_key("engine"), minor=1),
        "accept-minor1-unknown-key-in-batch": _edit(ort, add_key("batch"), minor=1),
        "reject-minor0-unknown-key-in-engine": _edit(ort, add_key("engine")),
        "accept-minor1-depth-64": _edit(ort, deep(64), minor=1),
        "reject-minor1-depth-65": _edit(ort, deep(65), minor=1),
        "reject-minor1-depth-300": _edit(ort, deep(300), minor=1),
        "accept-compile-options-depth-64": _edit(aoti, setter("engine", "details", "compile_options", "d",
                                                              value=nested(60))),
        "reject-compile-options-depth-65": _edit(aoti, setter("engine", "details", "compile_options", "d",
                                                              value=nested(61))),
        "reject-newline-name": _edit(ort, setter("name", value="toy-fp32-1-onnxruntime\n")),
        "reject-newline-variant": _edit(ort, setter("variant", value="fp8\n")),
        "reject-newline-rebuilt-from": _edit(ort, setter("rebuilt_from", value="c" * 64 + "\n")),
        "reject-newline-decimal": _edit(ort, setter("build", "build_seconds", value="1.5\n")),
        "reject-newline-member-name": _edit(ort, lambda m: _set(
            m, ("members", [e["name"] for e in m["members"]].index("labels.msgpack"), "name"),
            "labels.msgpack\n")),
        "accept-member-with-checksum": _member(ort, "model.onnx", lambda r: _frame(r, write_checksum=True)),
        "accept-member-level-19": _member(ort, "model.onnx", lambda r: _frame(r, level=19)),
        "reject-member-two-frames": _member(ort, "model.onnx", lambda r: _frame(r[:100]) + _frame(r[100:])),
        "reject-member-frame-and-empty-frame": _member(ort, "model.onnx", lambda r: _frame(r) + _frame(b"")),
        "reject-member-skippable-before": _member(ort, "model.onnx", lambda r: SKIPPABLE + _frame(r)),
        "reject-member-skippable-after": _member(ort, "model.onnx", lambda r: _frame(r) + SKIPPABLE),
        "reject-member-skippable-only": _member(ort, "empty", lambda r: SKIPPABLE),
        "reject-member-no-content-size": _member(ort, "model.onnx",
                                                 lambda r: _frame(r, write_content_size=False)),
        "reject-dim-2-31": _edit(ort, setter("inputs", 0, "shape", value=["batch", 3, 2 ** 31, 8])),
        "accept-dim-2-31-minus-1": _edit(ort, setter("inputs", 0, "shape", value=["batch", 2 ** 31 - 1])),
        "reject-dim-2-64-minus-1": _edit(ort, setter("inputs", 0, "shape", value=["batch", 2 ** 64 - 1])),
        "reject-rank-9": _edit(ort, setter("inputs", 0, "shape", value=["batch"] + [1] * 8)),
        "reject-batch-twice": _edit(ort, setter("inputs", 0, "shape", value=["batch", "batch", 8])),
        "reject-batch-last": _edit(ort, setter("outputs", 0, "shape", value=[10, "batch"])),
        "reject-batch-missing": _edit(ort, setter("outputs", 0, "shape", value=[10])),
        "reject-batch-min-above-max": _edit(ort, setter("batch", value={"min": 8, "opt": 8, "max": 4})),
        "reject-batch-opt-above-max": _edit(ort, setter("batch", value={"min": 1, "opt": 9, "max": 8})),
        "reject-profile-min-above-max": _edit(trt, setter("engine", "details", "profile",
                                                          value={"min": 9, "opt": 9, "max": 8})),
        "reject-duplicate-tensor-names": _edit(ort, setter("outputs", 0, "name", value="input")),
        "reject-float16-in-fp32-bundle": _edit(ort, setter("inputs", 0, "dtype", value="float16")),
        "accept-float16-in-fp16-bundle": _edit(aoti, setter("inputs", 0, "dtype", value="float16")),
        "reject-calibration-on-fp16": _edit(trt, setter("precision", value="fp16")),
        "reject-calibration-without-member": _edit(trt, lambda m: m.update(members=[
            e for e in m["members"] if e["name"] != "calibration.safetensors"])),
        "reject-fp8-without-calibration": _edit(trt, lambda m: m.update(calibration=None, members=[
            e for e in m["members"] if e["name"] != "calibration.safetensors"])),
        "reject-fp8-calibration-record-nil": _edit(trt, setter("calibration", value=None)),
        "reject-calibration-member-on-fp16": _edit(trt, lambda m: m.update(
            precision="fp16", variant=None, recipe=None, calibration=None)),
        "reject-profile-not-batch": _edit(trt, setter("engine", "details", "profile",
                                                      value={"min": 1, "opt": 2, "max": 8})),
        "reject-profile-max-above-batch": _edit(trt, setter("engine", "details", "profile",
                                                            value={"min": 1, "opt": 4, "max": 16})),
        "reject-no-model-onnx": _replace_member(aoti, "model.onnx", None),
        "reject-fp8-no-calibration-member-at-all": _replace_member(trt, "calibration.safetensors", None),
        "accept-profile-equals-batch-2-2-2": _edit(trt, lambda m: (
            m.update(batch={"min": 2, "opt": 2, "max": 2}),
            m["engine"]["details"].update(profile={"min": 2, "opt": 2, "max": 2}))),
        "reject-opset-2-64-minus-1": _edit(ort, setter("engine", "details", "opset", value=2 ** 64 - 1)),
        "reject-opset-1000": _edit(ort, setter("build", "opset", value=1000)),
        "reject-torch-aoti-cpu-fp16": _edit(aoti, setter("engine", "details", "device", value="cpu")),
        "accept-packages-1024": _edit(ort, setter("build", "packages",
                                                  value={f"p{i:04d}": "1" for i in range(1024)})),
        "reject-packages-1025": _edit(ort, setter("build", "packages",
                                                  value={f"p{i:04d}": "1" for i in range(1025)})),
        "reject-torch-aoti-unknown-detail": _edit(aoti, setter("engine", "details", "zz", value=1)),
        # docs/format.md, "Member size limits": refused from the manifest, nothing decompressed.
        "accept-labels-1-mib": with_zero_member(ort, "labels.msgpack", 1 << 20),
        "reject-labels-1-mib-plus-1": with_zero_member(ort, "labels.msgpack", (1 << 20) + 1),
        "reject-preprocess-1-gib": with_zero_member(ort, "preprocess.msgpack", 1 << 30),
        "reject-other-member-64-mib-plus-1": with_zero_member(ort, "empty", (64 << 20) + 1),
        "reject-calibration-64-mib-plus-1": with_zero_member(trt, "calibration.safetensors",
                                                             (64 << 20) + 1),
        "accept-model-onnx-64-mib-plus-1": with_zero_member(ort, "model.onnx", (64 << 20) + 1),
        "accept-engine-pt2-64-mib-plus-1": with_zero_member(aoti, "engine.pt2", (64 << 20) + 1),
    }
    return cases


if __name__ == "__main__":   # python tests/fuzz_bundles.py tests/fuzz_corpus
    import sys
    import tempfile

    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, data in regression_cases(write_seeds(Path(tmp))).items():
            (out / f"{name}.bundle").write_bytes(data)
