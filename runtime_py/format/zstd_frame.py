"""What a member's stored bytes may be: exactly one zstd frame, its content size present.

docs/format.md, "Member framing": no skippable frames, no second frame, nothing after the
frame, content size equal to `raw_size`, window size at most 2^max(27, min(31,
ceil(log2(raw_size)))). python-zstandard can decompress a frame but cannot say where it
ends, so `frame_size` walks the block headers (RFC 8878, section 3.1.1), as libzstd's
ZSTD_findFrameCompressedSize does for the C++ reader: 3 bytes of header per block, no
decompression.
"""

from __future__ import annotations

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_BLOCK_MAX = 128 * 1024


class FrameError(ValueError):
    """The stored bytes are not exactly one well-framed zstd frame."""


def window_log_max(raw_size: int) -> int:
    """The largest window (log2) a reader accepts for a member of `raw_size` bytes."""
    return max(27, min(31, max(raw_size - 1, 0).bit_length()))


def frame_size(data: memoryview | bytes) -> int:
    """Bytes taken by the zstd frame at the start of `data` (header, blocks, checksum)."""
    n = len(data)
    if n < 5 or bytes(data[:4]) != ZSTD_MAGIC:
        raise FrameError("not a zstd frame (a skippable frame or other bytes)")
    fhd = data[4]
    if fhd & 0x08:
        raise FrameError("zstd frame header sets its reserved bit")
    single = (fhd >> 5) & 1
    pos = 5 + (0 if single else 1) + (0, 1, 2, 4)[fhd & 3]
    pos += ((1 if single else 0), 2, 4, 8)[fhd >> 6]
    while True:
        if pos + 3 > n:
            raise FrameError("zstd frame is truncated")
        header = data[pos] | data[pos + 1] << 8 | data[pos + 2] << 16
        pos += 3
        last, kind, size = header & 1, (header >> 1) & 3, header >> 3
        if kind == 3:
            raise FrameError("zstd block of the reserved type")
        if size > _BLOCK_MAX:
            raise FrameError("zstd block larger than 128 KiB")
        pos += 1 if kind == 1 else size
        if last:
            break
    if fhd & 0x04:
        pos += 4
    if pos > n:
        raise FrameError("zstd frame is truncated")
    return pos
