"""Write a bundle file (format v1) atomically and deterministically.

Same manifest body and member bytes => same file bytes: members are laid out in name
order, compressed single-threaded at a fixed zstd level with the content size in each
frame, and the manifest is canonical msgpack. The file is written to a temporary name in
the target folder and renamed into place only when complete and fsynced, so an
interrupted make never leaves something that looks like a bundle.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Iterable

import zstandard

from runtime_py.errors import ManifestError, UsageError
from runtime_py.format.layout import FORMAT_MAJOR, FORMAT_MINOR, HEADER_SIZE, Header
from runtime_py.format.manifest import bundle_id_of, encode_manifest, validate_manifest

ZSTD_LEVEL = 3
_RESERVED = ("format", "members")


def source_date_epoch() -> int | None:
    """SOURCE_DATE_EPOCH as the manifest records it (None: no time recorded at all)."""
    value = os.environ.get("SOURCE_DATE_EPOCH")
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise UsageError(f"SOURCE_DATE_EPOCH must be an integer, got {value!r}") from None


def atomic_write(path: Path, chunks: Iterable[bytes], mode: int = 0o644) -> None:
    """Write `chunks` to a temporary file beside `path`, fsync, rename into place.

    Readers never see a partial file, and an interrupted write leaves nothing behind.
    """
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp_name, mode)
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def prepare_out_dir(out_dir: str | os.PathLike) -> Path:
    """Check an output folder early (a file there is refused); it is created only when a
    bundle is written into it, so a failed build leaves nothing behind."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"output path {out_dir} is a file, not a folder: pass a folder to --out")
    return out_dir


def compress_member(raw: bytes, level: int = ZSTD_LEVEL) -> bytes:
    """One zstd frame with the content size recorded (readers check it before inflating)."""
    cctx = zstandard.ZstdCompressor(level=level, write_content_size=True,
                                    write_checksum=False, threads=0)
    return cctx.compress(raw)


def build_manifest(manifest_body: dict, members: dict[str, bytes],
                   level: int = ZSTD_LEVEL) -> tuple[dict, list[bytes]]:
    """The complete manifest and the stored (compressed) member blobs, in file order."""
    clash = [k for k in _RESERVED if k in manifest_body]
    if clash:
        raise ManifestError(f"manifest body must not set {clash}: the writer fills them")
    entries, blobs = [], []
    offset = HEADER_SIZE
    for name in sorted(members):
        raw = members[name]
        stored = compress_member(raw, level)
        entries.append({
            "name": name,
            "offset": offset,
            "stored_size": len(stored),
            "raw_size": len(raw),
            "sha256": hashlib.sha256(raw).hexdigest(),
            "compression": "zstd",
        })
        blobs.append(stored)
        offset += len(stored)
    manifest = dict(manifest_body)
    manifest["format"] = {"major": FORMAT_MAJOR, "minor": FORMAT_MINOR}
    manifest["members"] = entries
    return manifest, blobs


def write_bundle(out_path: str | os.PathLike, manifest_body: dict, members: dict[str, bytes],
                 *, level: int = ZSTD_LEVEL) -> tuple[Path, str]:
    """Write the bundle to `out_path`; return (path, bundle id).

    Refuses (before writing anything) a manifest that fails the schema.
    """
    out_path = Path(out_path)
    if out_path.is_dir():
        raise UsageError(f"{out_path} is a directory: give a file path for the bundle")
    prepare_out_dir(out_path.parent)
    manifest, blobs = build_manifest(manifest_body, members, level)
    validate_manifest(manifest)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    manifest_bytes = encode_manifest(manifest)
    data_end = HEADER_SIZE + sum(len(b) for b in blobs)
    header = Header(FORMAT_MAJOR, FORMAT_MINOR, data_end, len(manifest_bytes),
                    hashlib.sha256(manifest_bytes).digest())

    atomic_write(out_path, [header.pack(), *blobs, manifest_bytes])
    return out_path, bundle_id_of(manifest_bytes)
