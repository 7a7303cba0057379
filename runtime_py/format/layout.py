"""The fixed 64-byte header of format v1 and the rules for where members may lie.

Layout (all integers little-endian; docs/format.md is the normative page):

    offset size field
    0      8    magic  b"\\x89TRTBDL\\n"
    8      2    format major (u16)
    10     2    format minor (u16)
    12     4    CRC32 of the 64 header bytes with this field zeroed (u32)
    16     8    manifest offset (u64)
    24     8    manifest length (u64)
    32     32   bundle id: sha256 of the manifest bytes

The header carries the id so that a reader can check the manifest against it without
trusting anything else in the file; the CRC catches a flipped bit in fields that no hash
covers (the version numbers, the offsets).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

from runtime_py.errors import (
    BadMagicError,
    HeaderCorruptError,
    MemberLayoutError,
    TruncatedBundleError,
    UnsupportedVersionError,
)

MAGIC = b"\x89TRTBDL\n"
FORMAT_MAJOR = 1
FORMAT_MINOR = 0
HEADER_SIZE = 64
MAX_MANIFEST_BYTES = 1 << 20  # docs/format.md, "Limits"

_STRUCT = struct.Struct("<8sHHIQQ32s")
assert _STRUCT.size == HEADER_SIZE


@dataclass(frozen=True)
class Header:
    major: int
    minor: int
    manifest_offset: int
    manifest_length: int
    bundle_id: bytes  # 32 raw bytes

    def pack(self) -> bytes:
        """Serialize with the CRC computed over the header with the CRC field zeroed."""
        unsigned = _STRUCT.pack(MAGIC, self.major, self.minor, 0, self.manifest_offset,
                                self.manifest_length, self.bundle_id)
        crc = zlib.crc32(unsigned) & 0xFFFFFFFF
        return _STRUCT.pack(MAGIC, self.major, self.minor, crc, self.manifest_offset,
                            self.manifest_length, self.bundle_id)

    @classmethod
    def parse(cls, data: bytes, file_size: int) -> "Header":
        """Check magic, version, CRC and manifest bounds; raise the specific error."""
        if len(data) < HEADER_SIZE:
            if len(data) >= len(MAGIC) and data[: len(MAGIC)] != MAGIC:
                raise BadMagicError("not a trt-bundle file (wrong magic bytes)")
            raise TruncatedBundleError(
                f"file is {file_size} bytes, shorter than the {HEADER_SIZE}-byte header: "
                "the bundle is truncated (re-copy or rebuild it)")
        magic, major, minor, crc, m_off, m_len, bundle_id = _STRUCT.unpack_from(data)
        if magic != MAGIC:
            raise BadMagicError("not a trt-bundle file (wrong magic bytes)")
        zeroed = data[:12] + b"\0\0\0\0" + data[16:HEADER_SIZE]
        if zlib.crc32(zeroed) & 0xFFFFFFFF != crc:
            raise HeaderCorruptError("header CRC32 mismatch: the header is corrupt")
        if major != FORMAT_MAJOR:
            raise UnsupportedVersionError(
                f"bundle format {major}.{minor} is not supported by this reader "
                f"(reads format {FORMAT_MAJOR}.x): upgrade trt-bundle")
        if m_off < HEADER_SIZE or m_len == 0:
            raise HeaderCorruptError(
                f"header gives manifest offset {m_off} and length {m_len}, which is impossible")
        if m_len > MAX_MANIFEST_BYTES:
            raise HeaderCorruptError(
                f"manifest length {m_len} exceeds the {MAX_MANIFEST_BYTES}-byte limit")
        if m_off + m_len > file_size:
            raise TruncatedBundleError(
                f"manifest ends at byte {m_off + m_len} but the file has {file_size} bytes: "
                "the bundle is truncated")
        if m_off + m_len != file_size:
            raise MemberLayoutError(
                f"{file_size - m_off - m_len} unexpected bytes after the manifest")
        return cls(major, minor, m_off, m_len, bundle_id)


def check_member_layout(members: list[dict], data_end: int) -> None:
    """Members must tile [HEADER_SIZE, data_end) exactly: in bounds, no overlap, no gap.

    Sizes come from the file, so they are checked before anything is read or allocated.
    No gaps means every byte of the file is covered by the header CRC, a member's sha256
    or the manifest's sha256: a flipped bit anywhere is found.
    """
    problems: list[str] = []
    spans: list[tuple[int, int, str]] = []
    for m in members:
        name, off, size = m["name"], m["offset"], m["stored_size"]
        if off < HEADER_SIZE or off + size > data_end:
            problems.append(
                f"member {name!r} at offset {off} with {size} stored bytes lies outside "
                f"the data region [{HEADER_SIZE}, {data_end})")
            continue
        spans.append((off, off + size, name))
    spans.sort()
    for (a_start, a_end, a_name), (b_start, _b_end, b_name) in zip(spans, spans[1:]):
        if b_start < a_end:
            problems.append(f"members {a_name!r} and {b_name!r} overlap "
                            f"(bytes {b_start}..{a_end})")
        elif b_start > a_end:
            problems.append(f"{b_start - a_end} bytes between members {a_name!r} and "
                            f"{b_name!r} belong to no member")
    if not problems and spans:
        if spans[0][0] != HEADER_SIZE:
            problems.append(f"{spans[0][0] - HEADER_SIZE} bytes after the header belong "
                            "to no member")
        if spans[-1][1] != data_end:
            problems.append(f"{data_end - spans[-1][1]} bytes before the manifest belong "
                            "to no member")
    if problems:
        raise MemberLayoutError("; ".join(problems), problems=problems)
