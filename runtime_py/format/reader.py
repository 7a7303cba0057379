"""Reader of bundle format v1: open, check, and read members one at a time.

`open_bundle` checks everything that is cheap (header, manifest hash against the id,
manifest schema, member layout) and reads no member. `Bundle.read_member` decompresses
one member through a bounded stream and checks its sha256, touching no other member's
bytes. `Bundle.verify` does every check and reports every problem at once.

Nothing read from the file is trusted: offsets are bounds-checked before use, the
decompressed size is enforced while decompressing (a member that inflates past its
declared size is stopped there), and msgpack decoding has size limits.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import threading
from pathlib import Path
from typing import Iterator

import msgpack
import zstandard

from runtime_py.errors import (
    BundleError,
    BundleNotFoundError,
    DecompressionError,
    IntegrityError,
    ManifestError,
    MemberNotFoundError,
    TruncatedBundleError,
    VerificationError,
)
from runtime_py.format.layout import HEADER_SIZE, Header, check_member_layout
from runtime_py.format.manifest import bundle_id_of, decode_manifest, validate_manifest
from runtime_py.format.zstd_frame import FrameError, frame_size, window_log_max

_CHUNK = 1 << 20


class Bundle:
    """An opened bundle. Use `open_bundle()`; close it (or use `with`) to release the map."""

    def __init__(self, path: Path, header: Header, manifest: dict, manifest_bytes: bytes,
                 mapped: mmap.mmap | None, fd: int) -> None:
        self.path = path
        self.header = header
        self.manifest = manifest
        self.manifest_bytes = manifest_bytes
        self.id = bundle_id_of(manifest_bytes)
        self._map = mapped
        self._fd = fd
        self._members = {m["name"]: m for m in manifest["members"]}
        self._lock = threading.Lock()
        self._cache: dict[str, object] = {}

    # -- lifecycle -----------------------------------------------------------------------
    def close(self) -> None:
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:
                # A member read still holds a view (an unfinished iter_member, or a kept
                # exception's frames): the map is unmapped when that view goes away.
                pass
            self._map = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "Bundle":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # best effort; explicit close() is the contract
        try:
            self.close()
        except Exception:
            pass

    # -- metadata ------------------------------------------------------------------------
    @property
    def format_version(self) -> tuple[int, int]:
        return self.header.major, self.header.minor

    @property
    def member_names(self) -> list[str]:
        return [m["name"] for m in self.manifest["members"]]

    def member_entry(self, name: str) -> dict:
        try:
            return self._members[name]
        except KeyError:
            raise MemberNotFoundError(
                f"bundle {self.path.name} has no member {name!r} "
                f"(it has: {', '.join(self.member_names)})") from None

    def has_member(self, name: str) -> bool:
        return name in self._members

    # -- members -------------------------------------------------------------------------
    def _stored(self, entry: dict) -> memoryview:
        if self._map is None:
            raise BundleError(f"bundle {self.path} is closed")
        return memoryview(self._map)[entry["offset"]: entry["offset"] + entry["stored_size"]]

    def iter_member(self, name: str) -> Iterator[bytes]:
        """Decompressed chunks of one member, size-bounded and sha256-checked at the end."""
        entry = self.member_entry(name)
        stored = self._stored(entry)
        try:
            yield from self._decompress(name, entry, stored)
        finally:
            stored.release()  # so close() can unmap even while an exception is kept

    def _check_frame(self, name: str, entry: dict, stored: memoryview) -> int:
        """Check the stored bytes are exactly one frame of content size raw_size (docs/format.md,
        "Member framing") before anything is decompressed; return raw_size."""
        raw_size = entry["raw_size"]
        try:
            size = frame_size(stored)
            params = zstandard.get_frame_parameters(stored[:18].tobytes())
        except FrameError as exc:
            raise DecompressionError(f"member {name!r}: {exc}") from None
        except zstandard.ZstdError as exc:
            raise DecompressionError(f"member {name!r}: not a zstd frame ({exc})") from None
        if size != len(stored):
            raise DecompressionError(
                f"member {name!r}: {len(stored) - size} bytes after its zstd frame (a member "
                "is exactly one frame)")
        if params.content_size == zstandard.CONTENTSIZE_UNKNOWN:
            raise DecompressionError(
                f"member {name!r}: zstd frame does not record its content size")
        if params.content_size != raw_size:
            raise DecompressionError(
                f"member {name!r}: zstd frame declares {params.content_size} bytes but the "
                f"manifest declares {raw_size}: refusing to decompress")
        return raw_size

    def _decompress(self, name: str, entry: dict, stored: memoryview) -> Iterator[bytes]:
        raw_size = self._check_frame(name, entry, stored)
        digest = hashlib.sha256()
        total = 0
        decompressor = zstandard.ZstdDecompressor(max_window_size=1 << window_log_max(raw_size))
        reader = decompressor.stream_reader(stored, read_size=_CHUNK, read_across_frames=False)
        try:
            while True:
                chunk = reader.read(_CHUNK)
                if not chunk:
                    break
                total += len(chunk)
                if total > raw_size:
                    raise DecompressionError(
                        f"member {name!r} decompresses past its declared size of {raw_size} "
                        "bytes: stopped (corrupt file or decompression bomb)")
                digest.update(chunk)
                yield chunk
        except zstandard.ZstdError as exc:
            raise DecompressionError(f"member {name!r}: corrupt zstd data ({exc})") from None
        finally:
            reader.close()
            del reader  # drops its buffer on `stored` even if a traceback keeps this frame
        if total != raw_size:
            raise DecompressionError(
                f"member {name!r} decompresses to {total} bytes, manifest declares {raw_size}")
        if digest.hexdigest() != entry["sha256"]:
            raise IntegrityError(f"member {name!r}: sha256 mismatch (the member is corrupt)")

    def read_member(self, name: str) -> bytes:
        """One member's bytes, checked. Reads no other member.

        The output is allocated once at exactly the declared raw_size (the frame's content
        size, checked first): zstd refuses a frame that would produce more or fewer bytes,
        and nothing is joined or grown, so a member costs its raw_size, once.
        """
        entry = self.member_entry(name)
        stored = self._stored(entry)
        try:
            raw_size = self._check_frame(name, entry, stored)
            decompressor = zstandard.ZstdDecompressor(
                max_window_size=1 << window_log_max(raw_size))
            try:
                data = decompressor.decompress(stored)
            except zstandard.ZstdError as exc:
                raise DecompressionError(
                    f"member {name!r}: corrupt zstd data or output other than its declared "
                    f"{raw_size} bytes ({exc})") from None
        finally:
            stored.release()
        if len(data) != raw_size:   # decompress() enforces it; the format depends on it
            raise DecompressionError(
                f"member {name!r} decompresses to {len(data)} bytes, manifest declares {raw_size}")
        if hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise IntegrityError(f"member {name!r}: sha256 mismatch (the member is corrupt)")
        return data

    def check_member(self, name: str) -> None:
        """Decompress and hash one member without keeping it."""
        for _ in self.iter_member(name):
            pass

    # -- decoded members -----------------------------------------------------------------
    def _msgpack_member(self, name: str) -> object | None:
        with self._lock:
            if name in self._cache:
                return self._cache[name]
        if not self.has_member(name):
            return None
        try:
            value = msgpack.unpackb(self.read_member(name), raw=False, strict_map_key=True,
                                    max_bin_len=0, max_ext_len=0)
        except (ValueError, msgpack.UnpackException, TypeError) as exc:
            raise ManifestError(f"member {name!r} is not valid msgpack: {exc}") from None
        with self._lock:
            self._cache[name] = value
        return value

    @property
    def preprocess(self) -> dict | None:
        """The preprocessing spec (schema-checked by the runtime's Preprocessor)."""
        value = self._msgpack_member("preprocess.msgpack")
        if value is not None and not isinstance(value, dict):
            raise ManifestError("member 'preprocess.msgpack' is not a map")
        return value

    @property
    def labels(self) -> list[str] | None:
        value = self._msgpack_member("labels.msgpack")
        if value is not None and not (isinstance(value, list)
                                      and all(isinstance(v, str) for v in value)):
            raise ManifestError("member 'labels.msgpack' is not a list of strings")
        return value

    # -- verification --------------------------------------------------------------------
    def file_sha256(self) -> str:
        """sha256 (hex) of the whole file, from the same mapping the members are read from
        (what a detached signature covers: the bytes loaded, not a second open of the path)."""
        if self._map is None:
            raise BundleError(f"bundle {self.path} is closed")
        return hashlib.sha256(self._map).hexdigest()

    def verify(self) -> None:
        """Check every member's size and sha256; raise VerificationError listing all problems.

        The header, the manifest against the id, the schema and the layout were checked
        when the bundle was opened.
        """
        problems: list[str] = []
        for name in self.member_names:
            try:
                self.check_member(name)
            except BundleError as exc:
                problems.append(str(exc))
        if problems:
            raise VerificationError(
                f"{len(problems)} problem(s) in {self.path.name}: " + "; ".join(problems),
                problems=problems)


def open_bundle(path: str | os.PathLike) -> Bundle:
    """Open and check a bundle's structure and identity; no member is decompressed."""
    path = Path(path)
    if not path.exists():
        raise BundleNotFoundError(f"{path}: no such file")
    if path.is_dir():
        raise BundleNotFoundError(f"{path}: is a directory, not a bundle file")
    if not path.is_file():
        raise BundleNotFoundError(f"{path}: not a regular file")
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            raise TruncatedBundleError(f"{path}: empty file (0 bytes), not a bundle")
        mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    except BaseException:
        os.close(fd)
        raise
    try:
        header = Header.parse(mapped[:HEADER_SIZE], size)
        manifest_bytes = mapped[header.manifest_offset: header.manifest_offset
                                + header.manifest_length]
        if hashlib.sha256(manifest_bytes).digest() != header.bundle_id:
            raise IntegrityError(
                "manifest sha256 does not match the bundle id in the header "
                "(the manifest or the header is corrupt)")
        manifest = decode_manifest(manifest_bytes)
        validate_manifest(manifest, minor=header.minor)
        fmt = manifest["format"]
        if (fmt["major"], fmt["minor"]) != (header.major, header.minor):
            raise ManifestError(
                f"manifest says format {fmt['major']}.{fmt['minor']}, header says "
                f"{header.major}.{header.minor}")
        names = [m["name"] for m in manifest["members"]]
        if len(set(names)) != len(names):
            raise ManifestError("manifest lists a member name twice")
        if manifest["engine"]["member"] not in names:
            raise ManifestError(f"engine member {manifest['engine']['member']!r} is not "
                                "among the bundle's members")
        check_member_layout(manifest["members"], header.manifest_offset)
        return Bundle(path, header, manifest, manifest_bytes, mapped, fd)
    except BaseException:
        mapped.close()
        os.close(fd)
        raise
