"""Helpers that write damaged copies of a bundle, for the reader tests (Python and C++).

Each helper reads a sound bundle, changes exactly one thing and, where asked, repairs the
checks that would otherwise fire first (header CRC, bundle id), so that a test reaches the
check it means to exercise. They follow docs/format.md directly and import nothing from
the reader under test: the layout is re-declared here on purpose.

    flip_byte(path, out, offset)           XOR one byte (mask 0xFF by default)
    truncate(path, out, n)                 keep the first n bytes
    fix_crc(data)                          recompute the header CRC of whole-file bytes
    set_header(path, out, **fields)        change header fields (major, minor, ...), fix CRC
    rewrite_manifest(path, out, mutate)    decode, mutate, re-encode canonically, fix id+CRC
    replace_member(path, out, name, stored, **entry)
                                           swap one member's stored bytes, re-lay the file
    sample_body()                          a minimal schema-valid manifest body for write_bundle
"""

from __future__ import annotations

import hashlib
import os
import struct
import zlib
from pathlib import Path
from typing import Any, Callable

import msgpack

MAGIC = b"\x89TRTBDL\n"
HEADER_SIZE = 64
HEADER = struct.Struct("<8sHHIQQ32s")
HEADER_FIELDS = ("magic", "major", "minor", "crc", "manifest_offset", "manifest_length",
                 "bundle_id")
CRC_SLICE = slice(12, 16)


def _read(path: str | os.PathLike) -> bytes:
    return Path(path).read_bytes()


def _write(out: str | os.PathLike, data: bytes) -> Path:
    out = Path(out)
    out.write_bytes(data)
    return out


def read_header(data: bytes) -> dict:
    """The header fields of whole-file (or header) bytes, as a dict."""
    return dict(zip(HEADER_FIELDS, HEADER.unpack_from(data)))


def fix_crc(data: bytes) -> bytes:
    """`data` (whole file or just the header) with the header CRC32 recomputed."""
    zeroed = data[:12] + b"\0\0\0\0" + data[16:HEADER_SIZE]
    crc = zlib.crc32(zeroed) & 0xFFFFFFFF
    return data[:12] + struct.pack("<I", crc) + data[16:]


def flip_byte(path: str | os.PathLike, out: str | os.PathLike, offset: int,
              mask: int = 0xFF) -> Path:
    """Copy of `path` with the byte at `offset` XORed with `mask` (nothing repaired)."""
    data = bytearray(_read(path))
    data[offset] ^= mask
    return _write(out, bytes(data))


def truncate(path: str | os.PathLike, out: str | os.PathLike, n: int) -> Path:
    """Copy of the first `n` bytes of `path`."""
    return _write(out, _read(path)[:n])


def set_header(path: str | os.PathLike, out: str | os.PathLike, *, fix: bool = True,
               **fields: Any) -> Path:
    """Copy of `path` with header `fields` replaced; the CRC is recomputed unless `fix=False`."""
    data = _read(path)
    values = read_header(data)
    unknown = set(fields) - set(HEADER_FIELDS)
    if unknown:
        raise KeyError(f"no header fields {sorted(unknown)}")
    values.update(fields)
    header = HEADER.pack(*(values[f] for f in HEADER_FIELDS))
    data = header + data[HEADER_SIZE:]
    return _write(out, fix_crc(data) if fix else data)


def canonical_packb(value: Any) -> bytes:
    """msgpack with map keys sorted at every level (the canonical form, floats allowed here
    so that a test can write a manifest holding one)."""
    def sort(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: sort(v[k]) for k in sorted(v)}
        if isinstance(v, (list, tuple)):
            return [sort(x) for x in v]
        return v
    return msgpack.packb(sort(value), use_bin_type=True)


def _assemble(header_values: dict, data_region: bytes, manifest_bytes: bytes) -> bytes:
    values = dict(header_values)
    values["manifest_offset"] = HEADER_SIZE + len(data_region)
    values["manifest_length"] = len(manifest_bytes)
    values["bundle_id"] = hashlib.sha256(manifest_bytes).digest()
    header = HEADER.pack(*(values[f] for f in HEADER_FIELDS))
    return fix_crc(header + data_region + manifest_bytes)


def split(data: bytes) -> tuple[dict, bytes, bytes]:
    """(header fields, member region bytes, manifest bytes) of whole-file bytes."""
    h = read_header(data)
    start, length = h["manifest_offset"], h["manifest_length"]
    return h, data[HEADER_SIZE:start], data[start:start + length]


def rewrite_manifest(path: str | os.PathLike, out: str | os.PathLike,
                     mutate: Callable[[dict], dict | None], *,
                     encode: Callable[[Any], bytes] = canonical_packb,
                     **header_fields: Any) -> Path:
    """Copy of `path` whose manifest is `mutate(manifest)` (in place, or its return value),
    re-encoded with `encode` (canonical by default); the header's manifest length, bundle
    id and CRC are fixed so that only the manifest's content is wrong. `header_fields`
    (e.g. minor=3) are set in the header too."""
    h, region, manifest_bytes = split(_read(path))
    manifest = msgpack.unpackb(manifest_bytes, raw=False)
    result = mutate(manifest)
    if result is not None:
        manifest = result
    h.update(header_fields)
    return _write(out, _assemble(h, region, encode(manifest)))


def replace_member(path: str | os.PathLike, out: str | os.PathLike, name: str,
                   stored: bytes, **entry_fields: Any) -> Path:
    """Copy of `path` where member `name`'s stored bytes are `stored`; every member's offset
    is re-laid contiguously, `stored_size` set, other `entry_fields` (e.g. raw_size,
    sha256) applied; manifest, id and CRC fixed. The layout stays sound: only what the
    member's bytes and entry say is inconsistent."""
    h, region, manifest_bytes = split(_read(path))
    manifest = msgpack.unpackb(manifest_bytes, raw=False)
    blobs = []
    offset = HEADER_SIZE
    found = False
    for entry in sorted(manifest["members"], key=lambda m: m["offset"]):
        start = entry["offset"] - HEADER_SIZE
        blob = region[start:start + entry["stored_size"]]
        if entry["name"] == name:
            found = True
            blob = stored
            entry.update(entry_fields)
        entry["offset"] = offset
        entry["stored_size"] = len(blob)
        offset += len(blob)
        blobs.append(blob)
    if not found:
        raise KeyError(f"no member {name!r}")
    return _write(out, _assemble(h, b"".join(blobs), canonical_packb(manifest)))


def member_span(path: str | os.PathLike, name: str) -> tuple[int, int]:
    """(offset, stored_size) of member `name`, read from the manifest."""
    _h, _region, manifest_bytes = split(_read(path))
    for entry in msgpack.unpackb(manifest_bytes, raw=False)["members"]:
        if entry["name"] == name:
            return entry["offset"], entry["stored_size"]
    raise KeyError(f"no member {name!r}")


def sample_body(**overrides: Any) -> dict:
    """A minimal manifest body (everything but `format` and `members`) that the schema
    accepts: an fp32 onnxruntime bundle with random weights."""
    body = {
        "name": "toy-fp32-1-onnxruntime",
        "family": {"name": "toy", "version": "1"},
        "precision": "fp32",
        "variant": None,
        "recipe": None,
        "source": {"kind": "random-weights", "seed": 0},
        "inputs": [{"name": "input", "dtype": "float32", "shape": ["batch", 3, 8, 8]}],
        "outputs": [{"name": "logits", "dtype": "float32", "shape": ["batch", 10]}],
        "batch": {"min": 1, "opt": 4, "max": 8},
        "engine": {"backend": "onnxruntime", "member": "model.onnx", "details": {"opset": 19}},
        "build": {"tool": "trt-bundle", "tool_version": "0.0.0", "packages": {},
                  "source_date_epoch": 0},
        "quality": None,
        "calibration": None,
        "rebuilt_from": None,
    }
    body.update(overrides)
    return body
