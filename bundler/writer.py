"""Write a bundle file (format v1) atomically and deterministically.

Same manifest body and member bytes => same file bytes: members are laid out in name
order, compressed single-threaded at a fixed zstd level with the content size in each
frame (large ones with long-distance matching: ``LONG_RANGE_MIN``), and the manifest is
canonical msgpack. The file is written to a temporary name in
the target folder and renamed into place only when complete and fsynced, so an
interrupted make never leaves something that looks like a bundle.
"""

from __future__ import annotations

import errno
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Iterable

import zstandard

from runtime_py.errors import (BundleError, BundleExistsError, ManifestError,
                               OutputPathError, UsageError)
from runtime_py.format.layout import FORMAT_MAJOR, FORMAT_MINOR, HEADER_SIZE, Header
from runtime_py.format.manifest import bundle_id_of, encode_manifest, validate_manifest
from runtime_py.format.zstd_frame import window_log_max

ZSTD_LEVEL = 3
#: Members larger than this are compressed with long-distance matching and a window that
#: spans the whole member (no larger than what every reader accepts for that size:
#: ``zstd_frame.window_log_max``). Why: a torch-aoti package with static-batch graphs holds
#: one copy of the weights per graph (``package_graphs``), tens of MB apart, where level
#: 3's own window (2 MiB) cannot see the copy before; with long matches the bundle stores
#: the weights about once (a CPU package of three graphs: 36.1 MB -> 12.3 MB stored).
LONG_RANGE_MIN = 8 << 20
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

    Readers never see a partial file, and an interrupted write leaves nothing behind. A
    write the system refuses (a full disk, a quota, a file size limit, a read-only mount)
    is an OutputPathError naming the file, not a traceback at the end of a long build.
    """
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial",
                                        dir=path.parent)
    except OSError as exc:
        raise write_refused(path, exc) from exc
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp_name, mode)
        os.replace(tmp_name, path)
    except BaseException as exc:
        Path(tmp_name).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise write_refused(path, exc) from exc
        raise


#: errno values that mean "the system refused to store this": no space, quota, size limit
NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def write_refused(path: Path, exc: OSError,
                  elsewhere: str = "--out; $TRT_BUNDLE_CACHE for the export cache"
                  ) -> OutputPathError:
    """The OutputPathError (exit 6) for a write of ``path`` the system refused."""
    hint = ("free space there or write elsewhere" if exc.errno in NO_ROOM
            else "check the folder's permissions or write elsewhere")
    return OutputPathError(f"could not write {path}: {exc.strerror or exc}; {hint} "
                           f"({elsewhere}); nothing was left behind")


def prepare_out_dir(out_dir: str | os.PathLike) -> Path:
    """Check an output folder before any work: it must be a folder, or creatable, and
    writable. It is created only when a bundle is written into it, so a failed build
    leaves nothing behind; writability is probed with a temporary folder that is removed
    at once (permission bits do not tell for root, a read-only mount or a full disk).

    Raises OutputPathError (exit 6) naming what is in the way.
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise OutputPathError(f"output path {out_dir} is a file, not a folder: pass a folder "
                              "to --out")
    existing = out_dir
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        raise OutputPathError(f"output folder {out_dir} cannot be created: {existing} is a "
                              "file, not a folder; pass another --out")
    try:
        tempfile.TemporaryDirectory(prefix=".trt-bundle-probe-", dir=existing).cleanup()
    except OSError as exc:
        where = "" if existing == out_dir else f" (its nearest existing folder is {existing})"
        raise OutputPathError(f"output folder {out_dir} is not writable{where}: "
                              f"{exc.strerror or exc}; pass another --out") from None
    return out_dir


def refuse_existing_bundle(path: Path, difference: str | None = None) -> None:
    """Refuse to replace a bundle file silently (`bundle make --force` replaces it).

    The same name does not mean the same bundle: other weights, calibration data or
    versions give another id under the same name. ``difference``: why `--reuse` did not
    take it, said in the message.
    """
    if not path.exists():
        return
    from runtime_py.format import open_bundle

    try:
        with open_bundle(path) as old:
            what = f"a bundle (id {old.id[:16]})"
    except BundleError:
        what = "a file that is not a readable bundle"
    why = f", not reused: {difference}" if difference else ""
    raise BundleExistsError(f"{path} already exists and holds {what}{why}: pass --force to "
                            "replace it, or choose another --out")


def compress_member(raw: bytes, level: int = ZSTD_LEVEL) -> bytes:
    """One zstd frame with the content size recorded (readers check it before inflating);
    over ``LONG_RANGE_MIN`` bytes, with long-distance matching across the whole member."""
    if len(raw) <= LONG_RANGE_MIN:
        cctx = zstandard.ZstdCompressor(level=level, write_content_size=True,
                                        write_checksum=False, threads=0)
        return cctx.compress(raw)
    # the largest window readers accept for this size; zstd narrows it to the member's own
    params = zstandard.ZstdCompressionParameters.from_level(
        level, source_size=len(raw), window_log=window_log_max(len(raw)), enable_ldm=True,
        write_content_size=True, write_checksum=False, threads=0)
    return zstandard.ZstdCompressor(compression_params=params).compress(raw)


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
    created = [f for f in (out_path.parent, *out_path.parent.parents) if not f.exists()]
    out_path.parent.mkdir(parents=True, exist_ok=True)
    manifest_bytes = encode_manifest(manifest)
    data_end = HEADER_SIZE + sum(len(b) for b in blobs)
    header = Header(FORMAT_MAJOR, FORMAT_MINOR, data_end, len(manifest_bytes),
                    hashlib.sha256(manifest_bytes).digest())

    try:
        atomic_write(out_path, [header.pack(), *blobs, manifest_bytes])
    except BaseException:
        for folder in created:          # deepest first: a failed write leaves no new folder
            try:
                folder.rmdir()
            except OSError:
                break
        raise
    return out_path, bundle_id_of(manifest_bytes)
