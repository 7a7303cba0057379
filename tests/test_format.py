"""Bundle format v1 (docs/format.md): round trip, determinism, random access, atomic
writes, and every kind of bad input the reader must refuse with a specific BundleError."""

from __future__ import annotations

import hashlib
import io
import os
import struct
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import zstandard

import corrupt
from bundler.writer import write_bundle
from runtime_py.errors import (
    BadMagicError,
    BundleError,
    BundleNotFoundError,
    DecompressionError,
    HeaderCorruptError,
    IntegrityError,
    ManifestError,
    MemberLayoutError,
    MemberNotFoundError,
    OutputPathError,
    TruncatedBundleError,
    UnsupportedVersionError,
    VerificationError,
)
from runtime_py.format import HEADER_SIZE, MAGIC, open_bundle

MiB = 1 << 20


def make_members() -> dict[str, bytes]:
    rng = np.random.default_rng(1234)
    return {
        "empty.bin": b"",
        "one.bin": b"\x07",
        "random.bin": rng.bytes(MiB),
        "text.txt": b"".join(b"line %d of a compressible member\n" % (i % 97)
                             for i in range(20000)),
        "model.onnx": rng.standard_normal(64 * 1024).astype(np.float32).tobytes(),
    }


MEMBERS = make_members()


@pytest.fixture(scope="module")
def sound(tmp_path_factory) -> Path:
    """A sound bundle, written once; tests copy it before damaging it."""
    path, _ = write_bundle(tmp_path_factory.mktemp("sound") / "toy.bundle",
                           corrupt.sample_body(), MEMBERS)
    return path


def spans(path: Path) -> dict[str, tuple[int, int]]:
    return {name: corrupt.member_span(path, name) for name in MEMBERS}


def spread(start: int, size: int, count: int = 24) -> list[int]:
    """`count` offsets spread over [start, start+size), always with the first 18 bytes
    (the zstd frame header) and the last byte."""
    picks = set(range(start, start + min(size, 18)))
    picks.update(int(x) for x in np.linspace(start, start + size - 1, count))
    return sorted(picks)


def files_in(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# --- round trip ---------------------------------------------------------------------------

def test_round_trip_is_bit_identical(sound):
    with open_bundle(sound) as b:
        assert b.member_names == sorted(MEMBERS)
        for name, raw in MEMBERS.items():
            assert b.read_member(name) == raw
            assert b"".join(b.iter_member(name)) == raw
            entry = b.member_entry(name)
            assert entry["raw_size"] == len(raw)
            assert entry["sha256"] == hashlib.sha256(raw).hexdigest()
        b.verify()
        assert b.format_version == (1, 0)
        assert b.manifest["name"] == corrupt.sample_body()["name"]


def test_compression_actually_applies(sound):
    with open_bundle(sound) as b:
        text = b.member_entry("text.txt")
        assert text["stored_size"] * 20 < text["raw_size"]


def test_same_inputs_give_same_bytes_and_id(tmp_path, sound):
    p1, id1 = write_bundle(tmp_path / "a.bundle", corrupt.sample_body(), make_members())
    # insertion order of members and body keys must not matter either
    body = dict(reversed(list(corrupt.sample_body().items())))
    members = dict(reversed(list(make_members().items())))
    p2, id2 = write_bundle(tmp_path / "b.bundle", body, members)
    assert p1.read_bytes() == p2.read_bytes() == sound.read_bytes()
    assert id1 == id2
    data = p1.read_bytes()
    h, _region, manifest_bytes = corrupt.split(data)
    assert id1 == hashlib.sha256(manifest_bytes).hexdigest() == h["bundle_id"].hex()
    with open_bundle(p1) as b:
        assert b.id == id1


def test_different_content_gives_different_id(tmp_path):
    _, id1 = write_bundle(tmp_path / "a.bundle", corrupt.sample_body(), {"model.onnx": b"a"})
    _, id2 = write_bundle(tmp_path / "b.bundle", corrupt.sample_body(), {"model.onnx": b"b"})
    assert id1 != id2


def test_read_member_touches_only_that_member(tmp_path, sound):
    """Every stored byte of every other member is destroyed (the layout is kept): the
    target still reads back exactly, while each destroyed member fails."""
    data = bytearray(sound.read_bytes())
    where = spans(sound)
    target = "text.txt"
    for name, (off, size) in where.items():
        if name != target:
            data[off:off + size] = b"\xa5" * size
    out = tmp_path / "others-destroyed.bundle"
    out.write_bytes(bytes(data))
    with open_bundle(out) as b:
        assert b.read_member(target) == MEMBERS[target]
        for name in where:
            if name != target:
                with pytest.raises((DecompressionError, IntegrityError), match=name):
                    b.read_member(name)
        with pytest.raises(VerificationError) as exc:
            b.verify()
        assert len(exc.value.problems) == len(MEMBERS) - 1
        assert not any(target in p for p in exc.value.problems)


def test_missing_member_is_named(sound):
    with open_bundle(sound) as b, pytest.raises(MemberNotFoundError, match="engine.plan"):
        b.read_member("engine.plan")


def test_closed_bundle_refuses_reads(sound):
    b = open_bundle(sound)
    b.close()
    with pytest.raises(BundleError, match="closed"):
        b.read_member("one.bin")


def test_failed_read_inside_with_surfaces_the_real_error(tmp_path, sound):
    """Leaving `with` while a read error propagates must close the bundle quietly, not
    replace the error with a BufferError from the memory map."""
    off, _ = corrupt.member_span(sound, "random.bin")
    out = corrupt.flip_byte(sound, tmp_path / "f.bundle", off + 100)
    with pytest.raises(IntegrityError, match="random.bin"):
        with open_bundle(out) as b:
            b.read_member("random.bin")


def test_close_after_kept_error_and_unfinished_iteration(tmp_path, sound):
    off, _ = corrupt.member_span(sound, "random.bin")
    out = corrupt.flip_byte(sound, tmp_path / "f.bundle", off + 100)
    b = open_bundle(out)
    try:
        b.read_member("random.bin")
    except IntegrityError as exc:
        kept = exc                       # keeps the failed read's frames alive
    unfinished = b.iter_member("text.txt")
    next(unfinished)                     # a reader left half-way
    b.close()                            # must not raise
    b.close()                            # idempotent
    assert kept is not None
    with pytest.raises(BundleError, match="closed"):
        b.read_member("one.bin")


# --- the writer ---------------------------------------------------------------------------

def test_writer_refuses_schema_invalid_manifest(tmp_path):
    body = corrupt.sample_body(precision="fp64")
    with pytest.raises(ManifestError, match="precision"):
        write_bundle(tmp_path / "x.bundle", body, {"model.onnx": b"x"})
    assert files_in(tmp_path) == []


def test_writer_refuses_float_in_manifest(tmp_path):
    """A float where the schema allows any value (torch-aoti compile options): the
    canonical encoder is what refuses it, naming where it is."""
    details = {"torch_version": "2.5", "cuda_version": None, "compute_capability": None,
               "device_name": "cpu", "compile_options": {"max_autotune": 0.5}}
    body = corrupt.sample_body(engine={"backend": "torch-aoti", "member": "engine.pt2",
                                       "details": details})
    with pytest.raises(ManifestError, match="compile_options/max_autotune is a float"):
        write_bundle(tmp_path / "x.bundle", body, {"engine.pt2": b"x", "model.onnx": b"x"})
    assert files_in(tmp_path) == []


def test_writer_refuses_reserved_fields(tmp_path):
    with pytest.raises(ManifestError, match="members"):
        write_bundle(tmp_path / "x.bundle", corrupt.sample_body(members=[]), {"model.onnx": b""})
    assert files_in(tmp_path) == []


@pytest.mark.parametrize("name", ["../evil", "sub/model.onnx", "/abs", "Model.onnx", ".hidden",
                                  "a" * 80])
def test_writer_refuses_path_like_member_names(tmp_path, name):
    with pytest.raises(ManifestError, match="members/0/name"):
        write_bundle(tmp_path / "x.bundle", corrupt.sample_body(), {name: b"x"})
    assert files_in(tmp_path) == []


def test_interrupted_rename_leaves_nothing(tmp_path, monkeypatch):
    def boom(*_a, **_k):
        raise OSError("disk went away")

    monkeypatch.setattr(os, "replace", boom)
    # the system's refusal is an OutputPathError (exit 6) naming the file, not a traceback
    with pytest.raises(OutputPathError, match=r"could not write .*x\.bundle: disk went away"):
        write_bundle(tmp_path / "x.bundle", corrupt.sample_body(), make_members())
    assert files_in(tmp_path) == []


def test_interrupt_mid_write_leaves_nothing_and_keeps_old_file(tmp_path, monkeypatch):
    """A KeyboardInterrupt during fsync (after the data went to the temporary file): the
    temporary file is removed and a previous bundle at the target stays as it was."""
    target = tmp_path / "x.bundle"
    write_bundle(target, corrupt.sample_body(), {"model.onnx": b"old"})
    old = target.read_bytes()

    def interrupted(_fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_bundle(target, corrupt.sample_body(), make_members())
    assert files_in(tmp_path) == ["x.bundle"]
    assert target.read_bytes() == old


def test_member_that_is_not_bytes_writes_nothing(tmp_path):
    class Exploding:
        def __bytes__(self):
            raise RuntimeError("member source failed")

    with pytest.raises(TypeError):
        write_bundle(tmp_path / "x.bundle", corrupt.sample_body(),
                     {"model.onnx": b"x", "z.bin": Exploding()})
    assert files_in(tmp_path) == []


# --- paths that are not bundles -------------------------------------------------------------

def test_missing_path(tmp_path):
    with pytest.raises(BundleNotFoundError, match="no such file"):
        open_bundle(tmp_path / "nope.bundle")


def test_directory(tmp_path):
    with pytest.raises(BundleNotFoundError, match="is a directory"):
        open_bundle(tmp_path)


def test_not_a_regular_file(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(BundleNotFoundError, match="not a regular file"):
        open_bundle(fifo)


def test_empty_file(tmp_path):
    (tmp_path / "e.bundle").write_bytes(b"")
    with pytest.raises(TruncatedBundleError, match="empty"):
        open_bundle(tmp_path / "e.bundle")


@pytest.mark.parametrize("content", [
    b"PK\x03\x04" + bytes(200),                      # a zip
    b"\x89PNG\r\n\x1a\n" + bytes(200),               # a PNG
    b"hello, this is text",                          # short, still wrong magic
    b"\x89TRTBDX\n" + bytes(100),                    # one byte off
])
def test_wrong_magic(tmp_path, content):
    (tmp_path / "x.bundle").write_bytes(content)
    with pytest.raises(BadMagicError, match="magic"):
        open_bundle(tmp_path / "x.bundle")


# --- truncation -----------------------------------------------------------------------------

def test_truncated_inside_header(tmp_path, sound):
    out = tmp_path / "t.bundle"
    for n in range(HEADER_SIZE):
        corrupt.truncate(sound, out, n)
        with pytest.raises(TruncatedBundleError) as exc:
            open_bundle(out)
        assert ("empty" if n == 0 else "truncated") in str(exc.value), n


def test_truncated_anywhere_after_header(tmp_path, sound):
    out = tmp_path / "t.bundle"
    size = sound.stat().st_size
    offsets = {HEADER_SIZE, size - 1}
    for off, stored in spans(sound).values():
        offsets.update({off, off + 1, off + stored - 1})
    offsets.update(int(x) for x in np.linspace(HEADER_SIZE, size - 1, 60))
    for n in sorted(offsets):
        corrupt.truncate(sound, out, n)
        with pytest.raises(TruncatedBundleError, match="truncated"):
            open_bundle(out)


# --- flipped bytes --------------------------------------------------------------------------

@pytest.mark.parametrize("mask", [0xFF, 0x01, 0x80])
def test_flipped_header_byte(tmp_path, sound, mask):
    out = tmp_path / "h.bundle"
    for offset in range(HEADER_SIZE):
        corrupt.flip_byte(sound, out, offset, mask)
        if offset < len(MAGIC):
            with pytest.raises(BadMagicError, match="magic"):
                open_bundle(out)
        else:
            with pytest.raises(HeaderCorruptError, match="CRC32"):
                open_bundle(out)


def test_flipped_manifest_byte(tmp_path, sound):
    """Every byte of the manifest, flipped in place in one copy (then restored)."""
    out = tmp_path / "m.bundle"
    data = sound.read_bytes()
    out.write_bytes(data)
    h = corrupt.read_header(data)
    start, length = h["manifest_offset"], h["manifest_length"]
    fd = os.open(out, os.O_RDWR)
    try:
        for offset in range(start, start + length):
            os.pwrite(fd, bytes([data[offset] ^ 0xFF]), offset)
            with pytest.raises(IntegrityError, match="bundle id"):
                open_bundle(out)
            os.pwrite(fd, data[offset:offset + 1], offset)
    finally:
        os.close(fd)
    with open_bundle(out) as b:           # restored: the loop really changed this file
        b.verify()


@pytest.mark.parametrize("name", sorted(MEMBERS))
def test_flipped_member_byte(tmp_path, sound, name):
    """Open succeeds (the layout is intact); reading or verifying the member fails, naming
    it; the other members still read back exactly."""
    out = tmp_path / "f.bundle"
    off, size = corrupt.member_span(sound, name)
    for offset in spread(off, size):
        corrupt.flip_byte(sound, out, offset)
        with open_bundle(out) as b:
            with pytest.raises((IntegrityError, DecompressionError), match=name):
                b.read_member(name)
            with pytest.raises(VerificationError) as exc:
                b.verify()
            assert len(exc.value.problems) == 1 and name in exc.value.problems[0], offset
            other = "one.bin" if name != "one.bin" else "empty.bin"
            assert b.read_member(other) == MEMBERS[other]


def test_single_bit_flips_never_give_wrong_content(tmp_path, sound):
    """A single flipped bit in a member's compressed data either fails the read or leaves
    the decompressed bytes exactly as written (zstd has bits that do not change the
    output: see the xfail below); it never yields different content."""
    out = tmp_path / "f.bundle"
    tried = detected = 0
    for name in ("random.bin", "text.txt", "model.onnx"):
        off, size = corrupt.member_span(sound, name)
        for offset in spread(off, size, 16):
            for mask in (0x01, 0x10, 0x80):
                corrupt.flip_byte(sound, out, offset, mask)
                tried += 1
                with open_bundle(out) as b:
                    try:
                        data = b.read_member(name)
                    except (IntegrityError, DecompressionError):
                        detected += 1
                    else:
                        assert data == MEMBERS[name], (name, offset, mask)
    assert detected >= 0.9 * tried, (detected, tried)


def test_flip_that_keeps_the_content_is_not_a_content_change(tmp_path):
    """docs/format.md: members are hashed on their decompressed bytes, not their zstd
    encoding. A flip in the frame's window descriptor that still decodes to the same bytes
    is therefore accepted, and what is read is exactly what was written."""
    rng = np.random.default_rng(7)
    # 6 MiB: over level 3's window (no single segment), under the writer's LONG_RANGE_MIN
    raw = rng.standard_normal(3 * MiB // 2).astype(np.float32).tobytes()
    path, _ = write_bundle(tmp_path / "w.bundle", corrupt.sample_body(), {"model.onnx": raw})
    off, _size = corrupt.member_span(path, "model.onnx")
    fhd = path.read_bytes()[off + 4]
    assert not fhd & 0x20, "frame has a window descriptor"
    out = corrupt.flip_byte(path, tmp_path / "f.bundle", off + 5, 0x01)   # window mantissa
    with open_bundle(out) as b:
        b.verify()
        assert b.read_member("model.onnx") == raw


# --- versions -------------------------------------------------------------------------------

@pytest.mark.parametrize("major", [0, 2, 0xFFFF])
def test_unknown_major_refused(tmp_path, sound, major):
    out = corrupt.set_header(sound, tmp_path / "v.bundle", major=major)
    with pytest.raises(UnsupportedVersionError, match=rf"format {major}\.0 is not supported"):
        open_bundle(out)


def test_newer_minor_is_read(tmp_path, sound):
    def bump(m):
        m["format"]["minor"] = 7

    out = corrupt.rewrite_manifest(sound, tmp_path / "minor.bundle", bump, minor=7)
    with open_bundle(out) as b:
        assert b.format_version == (1, 7)
        b.verify()
        for name, raw in MEMBERS.items():
            assert b.read_member(name) == raw


def test_newer_minor_with_new_optional_field_is_read(tmp_path, sound):
    """Minors only add optional fields: a 1.1 manifest with a field this reader does not
    know opens; the same field in a 1.0 manifest is refused by the schema."""
    def bump(m):
        m["format"]["minor"] = 1
        m["signature"] = "added in 1.1"

    out = corrupt.rewrite_manifest(sound, tmp_path / "minor.bundle", bump, minor=1)
    with open_bundle(out) as b:
        b.verify()
        assert b.format_version == (1, 1)
    out = corrupt.rewrite_manifest(sound, tmp_path / "same.bundle",
                                   lambda m: m.update(signature="not in 1.0"))
    with pytest.raises(ManifestError, match="signature"):
        open_bundle(out)


def test_header_and_manifest_versions_must_agree(tmp_path, sound):
    out = corrupt.set_header(sound, tmp_path / "v.bundle", minor=1)
    with pytest.raises(ManifestError, match="header says 1.1"):
        open_bundle(out)


# --- header bounds --------------------------------------------------------------------------

@pytest.mark.parametrize("fields,error,fragment", [
    ({"manifest_length": 0}, HeaderCorruptError, "impossible"),
    ({"manifest_offset": 10}, HeaderCorruptError, "impossible"),
    ({"manifest_length": 16 * MiB + 1}, HeaderCorruptError, "limit"),
    ({"manifest_offset": 1 << 62}, TruncatedBundleError, "truncated"),
    ({"manifest_offset": (1 << 64) - 1}, TruncatedBundleError, "truncated"),
])
def test_impossible_header_bounds(tmp_path, sound, fields, error, fragment):
    out = corrupt.set_header(sound, tmp_path / "b.bundle", **fields)
    with pytest.raises(error, match=fragment):
        open_bundle(out)


def test_trailing_bytes_after_manifest(tmp_path, sound):
    out = tmp_path / "trail.bundle"
    out.write_bytes(sound.read_bytes() + b"\0")
    with pytest.raises(MemberLayoutError, match="1 unexpected bytes after the manifest"):
        open_bundle(out)


def test_manifest_shifted_inside_file(tmp_path, sound):
    """Header points the manifest one byte early and one longer: sizes still add up, but
    the id no longer matches."""
    h = corrupt.read_header(sound.read_bytes())
    out = corrupt.set_header(sound, tmp_path / "s.bundle",
                             manifest_offset=h["manifest_offset"] - 1,
                             manifest_length=h["manifest_length"] + 1)
    with pytest.raises(IntegrityError, match="bundle id"):
        open_bundle(out)


# --- member layout --------------------------------------------------------------------------

def _by_name(m: dict, name: str) -> dict:
    return next(e for e in m["members"] if e["name"] == name)


def _last(m: dict) -> dict:
    return max(m["members"], key=lambda e: e["offset"])


LAYOUT_CASES = {
    "past the manifest": (lambda m: _last(m).update(stored_size=_last(m)["stored_size"] + 5),
                          "outside the data region"),
    "huge offset": (lambda m: _by_name(m, "one.bin").update(offset=(1 << 64) - 1),
                    "outside the data region"),
    "huge size": (lambda m: _by_name(m, "one.bin").update(stored_size=1 << 63),
                  "outside the data region"),
    "overlap": (lambda m: _by_name(m, "one.bin").update(offset=_by_name(m, "empty.bin")["offset"]),
                "overlap"),
    "gap": (lambda m: _by_name(m, "text.txt").update(
        offset=_by_name(m, "text.txt")["offset"] + 1,
        stored_size=_by_name(m, "text.txt")["stored_size"] - 1), "belong to no member"),
    "gap after header": (lambda m: _by_name(m, "empty.bin").update(
        offset=HEADER_SIZE + 1, stored_size=_by_name(m, "empty.bin")["stored_size"] - 1),
        "after the header belong to no member"),
    "gap before manifest": (lambda m: _last(m).update(stored_size=_last(m)["stored_size"] - 1),
                            "before the manifest belong to no member"),
}


@pytest.mark.parametrize("case", sorted(LAYOUT_CASES))
def test_member_layout_refused(tmp_path, sound, case):
    mutate, fragment = LAYOUT_CASES[case]
    out = corrupt.rewrite_manifest(sound, tmp_path / "l.bundle", mutate)
    with pytest.raises(MemberLayoutError, match=fragment):
        open_bundle(out)


def test_duplicate_member_names(tmp_path, sound):
    def dup(m):
        _by_name(m, "one.bin")["name"] = "empty.bin"

    out = corrupt.rewrite_manifest(sound, tmp_path / "d.bundle", dup)
    with pytest.raises(ManifestError, match="twice"):
        open_bundle(out)


# --- the manifest ---------------------------------------------------------------------------

def _delete(path: str):
    def mutate(m):
        *parents, last = path.split("/")
        node = m
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        del node[last]
    return mutate


def _set(path: str, value):
    def mutate(m):
        *parents, last = path.split("/")
        node = m
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        node[int(last) if isinstance(node, list) else last] = value
    return mutate


MANIFEST_CASES = {
    "missing name": (_delete("name"), "'name' is a required property"),
    "missing members": (_delete("members"), "'members' is a required property"),
    "missing engine": (_delete("engine"), "'engine' is a required property"),
    "missing batch.max": (_delete("batch/max"), "batch: 'max' is a required property"),
    "missing member sha256": (_delete("members/0/sha256"), "members/0: 'sha256' is a required"),
    "missing format": (_delete("format"), "'format' is a required property"),
    "precision wrong value": (_set("precision", "fp64"), "precision: 'fp64' is not one of"),
    "batch.min a string": (_set("batch/min", "1"), "batch/min: '1' is not of type 'integer'"),
    "raw_size negative": (_set("members/1/raw_size", -1), "members/1/raw_size"),
    "offset a string": (_set("members/2/offset", "64"), "members/2/offset"),
    "sha256 upper case": (_set("members/0/sha256", "A" * 64), "members/0/sha256"),
    "compression gzip": (_set("members/0/compression", "gzip"), "members/0/compression"),
    "member name with slash": (_set("members/0/name", "../../etc/passwd"), "members/0/name"),
    "member name with dir": (_set("members/0/name", "dir/empty.bin"), "members/0/name"),
    "inputs not a list": (_set("inputs", {"name": "x"}), "inputs"),
    "unknown field": (_set("surprise", 1), "surprise"),
    "format major 2 in manifest": (_set("format/major", 2), "format/major"),
}


@pytest.mark.parametrize("case", sorted(MANIFEST_CASES))
def test_manifest_schema_violations_are_named(tmp_path, sound, case):
    mutate, fragment = MANIFEST_CASES[case]
    out = corrupt.rewrite_manifest(sound, tmp_path / "m.bundle", mutate)
    with pytest.raises(ManifestError) as exc:
        open_bundle(out)
    assert "schema" in str(exc.value)
    assert fragment in str(exc.value)


def test_manifest_with_float(tmp_path, sound):
    out = corrupt.rewrite_manifest(sound, tmp_path / "f.bundle", _set("batch/opt", 4.0))
    with pytest.raises(ManifestError, match=r"/batch/opt is a float"):
        open_bundle(out)


def test_non_canonical_manifest_unsorted_keys(tmp_path, sound):
    import msgpack

    def unsorted(value):
        def rev(v):
            if isinstance(v, dict):
                return {k: rev(v[k]) for k in sorted(v, reverse=True)}
            if isinstance(v, list):
                return [rev(x) for x in v]
            return v
        return msgpack.packb(rev(value), use_bin_type=True)

    out = corrupt.rewrite_manifest(sound, tmp_path / "u.bundle", lambda m: None, encode=unsorted)
    with pytest.raises(ManifestError, match="canonical"):
        open_bundle(out)


def test_non_canonical_manifest_long_integer(tmp_path, sound):
    """Same content, but an integer in a wider encoding than needed (uint32 for 0)."""
    def wide(value):
        data = corrupt.canonical_packb(value)
        key = b"\xa5minor\x00"            # "minor": 0 (fixint)
        assert data.count(key) == 1
        return data.replace(key, b"\xa5minor\xce\x00\x00\x00\x00")

    out = corrupt.rewrite_manifest(sound, tmp_path / "w.bundle", lambda m: None, encode=wide)
    with pytest.raises(ManifestError, match="canonical"):
        open_bundle(out)


@pytest.mark.parametrize("encoded,fragment", [
    (b"\xc1", "not valid msgpack"),                          # never-used byte
    (b"\x93\x01\x02\x03", "not a msgpack map"),              # an array
    (b"\x81\xa1a", "not valid msgpack"),                     # map cut short
    (b"\xdd\xff\xff\xff\xff", "not valid msgpack"),          # array claiming 4G entries
    (b"\xdf\xff\xff\xff\xff", "not valid msgpack"),          # map claiming 4G entries
    (b"\x81\xa1a\xc4\x01x", "not valid msgpack"),            # bin value (v1 forbids)
    (b"\x81\xa1a\xd4\x05x", "not valid msgpack"),            # ext value (v1 forbids)
    (b"\x81\x01\xa1a", "not valid msgpack"),                 # integer key
    (b"\x81\xa1a\x01\x00", "not valid msgpack"),             # trailing byte
])
def test_undecodable_manifest(tmp_path, sound, encoded, fragment):
    out = corrupt.rewrite_manifest(sound, tmp_path / "x.bundle", lambda m: None,
                                   encode=lambda _m: encoded)
    with pytest.raises(ManifestError, match=fragment):
        open_bundle(out)


# --- decompression bombs and size lies --------------------------------------------------------

BOMB_RAW = 512 * MiB
DECLARED = 1 * MiB


@pytest.fixture(scope="module")
def bombs() -> dict[str, bytes]:
    """Zstd frames of 512 MiB of zeros (a few KB each): with and without the content size."""
    out = {}
    for with_size in (True, False):
        buf = io.BytesIO()
        cctx = zstandard.ZstdCompressor(level=3, write_content_size=with_size)
        with cctx.stream_writer(buf, size=BOMB_RAW if with_size else -1, closefd=False) as w:
            zeros = bytes(MiB)
            for _ in range(BOMB_RAW // MiB):
                w.write(zeros)
        out["sized" if with_size else "unsized"] = buf.getvalue()
    assert all(len(v) < 64 * 1024 for v in out.values())
    return out


def _lying_content_size(frame: bytes, size: int) -> bytes:
    """`frame` with its Frame_Content_Size field (4-byte form) rewritten to `size`."""
    fhd = frame[4]
    assert fhd >> 6 == 2 and not fhd & 0x20 and not fhd & 0x03   # 4-byte FCS, window byte
    return frame[:6] + struct.pack("<I", size) + frame[10:]


def _read_bounded(path: Path, name: str) -> tuple[int, int, float, BaseException]:
    """(bytes yielded, peak traced memory, seconds, the exception) for reading `name`."""
    yielded = 0
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with open_bundle(path) as b:
            try:
                for chunk in b.iter_member(name):
                    yielded += len(chunk)
            except BundleError as exc:
                caught = exc
            else:
                caught = None
    finally:
        seconds = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return yielded, peak, seconds, caught


@pytest.mark.parametrize("kind", ["sized", "unsized", "lying"])
def test_decompression_bomb_is_stopped_at_declared_size(tmp_path, sound, bombs, kind):
    frame = {"sized": bombs["sized"], "unsized": bombs["unsized"],
             "lying": _lying_content_size(bombs["sized"], DECLARED)}[kind]
    out = corrupt.replace_member(sound, tmp_path / "bomb.bundle", "model.onnx", frame,
                                 raw_size=DECLARED,
                                 sha256=hashlib.sha256(bytes(DECLARED)).hexdigest())
    yielded, peak, seconds, exc = _read_bounded(out, "model.onnx")
    assert isinstance(exc, DecompressionError), exc
    assert "model.onnx" in str(exc)
    if kind == "sized":
        assert "refusing to decompress" in str(exc) and yielded == 0
    if kind == "unsized":   # docs/format.md: a frame must record its content size
        assert "does not record its content size" in str(exc) and yielded == 0
    assert yielded <= DECLARED
    assert peak < 8 * MiB, peak              # never near the 512 MiB the frame inflates to
    assert seconds < 1.0, seconds
    with open_bundle(out) as b, pytest.raises(VerificationError, match="model.onnx"):
        b.verify()


def test_member_shorter_than_declared(tmp_path, sound):
    raw = b"abc" * 1000
    frame = zstandard.ZstdCompressor(write_content_size=False).compress(raw)
    out = corrupt.replace_member(sound, tmp_path / "short.bundle", "model.onnx", frame,
                                 raw_size=len(raw) + 1,
                                 sha256=hashlib.sha256(raw).hexdigest())
    with open_bundle(out) as b, pytest.raises(DecompressionError,
                                              match="does not record its content size"):
        b.read_member("model.onnx")


def test_frame_content_size_differs_from_manifest(tmp_path, sound):
    raw = b"abc" * 1000
    frame = zstandard.ZstdCompressor(write_content_size=True).compress(raw)
    out = corrupt.replace_member(sound, tmp_path / "fcs.bundle", "model.onnx", frame,
                                 raw_size=len(raw) - 1,
                                 sha256=hashlib.sha256(raw[:-1]).hexdigest())
    with open_bundle(out) as b, pytest.raises(DecompressionError, match="declares 3000"):
        b.read_member("model.onnx")


@pytest.mark.parametrize("stored", [b"\x00" * 32, b"not zstd at all", b"\x28\xb5\x2f\xfd"])
def test_member_not_a_zstd_frame(tmp_path, sound, stored):
    out = corrupt.replace_member(sound, tmp_path / "nz.bundle", "model.onnx", stored)
    with open_bundle(out) as b, pytest.raises(DecompressionError, match="model.onnx"):
        b.read_member("model.onnx")


def test_every_rejection_is_a_bundle_error_subclass():
    """The classes asserted above are all specific: none is the bare base."""
    for cls in (BadMagicError, BundleNotFoundError, DecompressionError, HeaderCorruptError,
                IntegrityError, ManifestError, MemberLayoutError, TruncatedBundleError,
                UnsupportedVersionError, VerificationError, MemberNotFoundError):
        assert issubclass(cls, BundleError) and cls is not BundleError
