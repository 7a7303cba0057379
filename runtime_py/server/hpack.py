"""HPACK (RFC 7541) header compression for the project's own HTTP/2 gRPC server.

The server speaks gRPC over HTTP/2 itself because grpcio's per-call cost was the serving
bottleneck; that means it must decode request header blocks, and HPACK is the one part of
HTTP/2 that is stateful enough to get wrong. This module does it without a dependency.

Decoding is on the event loop once per request. After a connection's first request, grpc's
C-core client sends blocks made almost entirely of one-byte indexed fields (the dynamic
table holds ``:path``, ``:authority``, ``content-type``, ``user-agent``...), so that path is
a table lookup per byte; strings are sliced, not copied twice, and Huffman strings go
through a byte-at-a-time state machine rather than bit by bit.

Encoding is stateless on purpose: a server's response headers are few and mostly in the
static table, and never touching the dynamic table means the peer's decoder state never
depends on ours, so there is nothing to keep in sync or to get wrong across streams.
"""

from __future__ import annotations

__all__ = ["HpackError", "Decoder", "encode_headers"]


class HpackError(Exception):
    """A header block that cannot be decoded (the connection must be closed with
    COMPRESSION_ERROR: the shared dynamic table may no longer match the peer's)."""


# RFC 7541 Appendix A: the static table, entries 1..61.
_STATIC_TABLE: tuple[tuple[bytes, bytes], ...] = (
    (b':authority', b''),
    (b':method', b'GET'),
    (b':method', b'POST'),
    (b':path', b'/'),
    (b':path', b'/index.html'),
    (b':scheme', b'http'),
    (b':scheme', b'https'),
    (b':status', b'200'),
    (b':status', b'204'),
    (b':status', b'206'),
    (b':status', b'304'),
    (b':status', b'400'),
    (b':status', b'404'),
    (b':status', b'500'),
    (b'accept-charset', b''),
    (b'accept-encoding', b'gzip, deflate'),
    (b'accept-language', b''),
    (b'accept-ranges', b''),
    (b'accept', b''),
    (b'access-control-allow-origin', b''),
    (b'age', b''),
    (b'allow', b''),
    (b'authorization', b''),
    (b'cache-control', b''),
    (b'content-disposition', b''),
    (b'content-encoding', b''),
    (b'content-language', b''),
    (b'content-length', b''),
    (b'content-location', b''),
    (b'content-range', b''),
    (b'content-type', b''),
    (b'cookie', b''),
    (b'date', b''),
    (b'etag', b''),
    (b'expect', b''),
    (b'expires', b''),
    (b'from', b''),
    (b'host', b''),
    (b'if-match', b''),
    (b'if-modified-since', b''),
    (b'if-none-match', b''),
    (b'if-range', b''),
    (b'if-unmodified-since', b''),
    (b'last-modified', b''),
    (b'link', b''),
    (b'location', b''),
    (b'max-forwards', b''),
    (b'proxy-authenticate', b''),
    (b'proxy-authorization', b''),
    (b'range', b''),
    (b'referer', b''),
    (b'refresh', b''),
    (b'retry-after', b''),
    (b'server', b''),
    (b'set-cookie', b''),
    (b'strict-transport-security', b''),
    (b'transfer-encoding', b''),
    (b'user-agent', b''),
    (b'vary', b''),
    (b'via', b''),
    (b'www-authenticate', b''),
)
_STATIC_LEN = len(_STATIC_TABLE)  # 61; dynamic entries are numbered from 62

# RFC 7541 Appendix B: the Huffman code, (code, bit length) for symbols 0..255 and EOS (256).
_HUFFMAN_CODE: tuple[tuple[int, int], ...] = (
    (0x1ff8, 13), (0x7fffd8, 23), (0xfffffe2, 28), (0xfffffe3, 28), (0xfffffe4, 28), (0xfffffe5, 28),
    (0xfffffe6, 28), (0xfffffe7, 28), (0xfffffe8, 28), (0xffffea, 24), (0x3ffffffc, 30), (0xfffffe9, 28),
    (0xfffffea, 28), (0x3ffffffd, 30), (0xfffffeb, 28), (0xfffffec, 28), (0xfffffed, 28), (0xfffffee, 28),
    (0xfffffef, 28), (0xffffff0, 28), (0xffffff1, 28), (0xffffff2, 28), (0x3ffffffe, 30), (0xffffff3, 28),
    (0xffffff4, 28), (0xffffff5, 28), (0xffffff6, 28), (0xffffff7, 28), (0xffffff8, 28), (0xffffff9, 28),
    (0xffffffa, 28), (0xffffffb, 28), (0x14, 6), (0x3f8, 10), (0x3f9, 10), (0xffa, 12),
    (0x1ff9, 13), (0x15, 6), (0xf8, 8), (0x7fa, 11), (0x3fa, 10), (0x3fb, 10),
    (0xf9, 8), (0x7fb, 11), (0xfa, 8), (0x16, 6), (0x17, 6), (0x18, 6),
    (0x0, 5), (0x1, 5), (0x2, 5), (0x19, 6), (0x1a, 6), (0x1b, 6),
    (0x1c, 6), (0x1d, 6), (0x1e, 6), (0x1f, 6), (0x5c, 7), (0xfb, 8),
    (0x7ffc, 15), (0x20, 6), (0xffb, 12), (0x3fc, 10), (0x1ffa, 13), (0x21, 6),
    (0x5d, 7), (0x5e, 7), (0x5f, 7), (0x60, 7), (0x61, 7), (0x62, 7),
    (0x63, 7), (0x64, 7), (0x65, 7), (0x66, 7), (0x67, 7), (0x68, 7),
    (0x69, 7), (0x6a, 7), (0x6b, 7), (0x6c, 7), (0x6d, 7), (0x6e, 7),
    (0x6f, 7), (0x70, 7), (0x71, 7), (0x72, 7), (0xfc, 8), (0x73, 7),
    (0xfd, 8), (0x1ffb, 13), (0x7fff0, 19), (0x1ffc, 13), (0x3ffc, 14), (0x22, 6),
    (0x7ffd, 15), (0x3, 5), (0x23, 6), (0x4, 5), (0x24, 6), (0x5, 5),
    (0x25, 6), (0x26, 6), (0x27, 6), (0x6, 5), (0x74, 7), (0x75, 7),
    (0x28, 6), (0x29, 6), (0x2a, 6), (0x7, 5), (0x2b, 6), (0x76, 7),
    (0x2c, 6), (0x8, 5), (0x9, 5), (0x2d, 6), (0x77, 7), (0x78, 7),
    (0x79, 7), (0x7a, 7), (0x7b, 7), (0x7ffe, 15), (0x7fc, 11), (0x3ffd, 14),
    (0x1ffd, 13), (0xffffffc, 28), (0xfffe6, 20), (0x3fffd2, 22), (0xfffe7, 20), (0xfffe8, 20),
    (0x3fffd3, 22), (0x3fffd4, 22), (0x3fffd5, 22), (0x7fffd9, 23), (0x3fffd6, 22), (0x7fffda, 23),
    (0x7fffdb, 23), (0x7fffdc, 23), (0x7fffdd, 23), (0x7fffde, 23), (0xffffeb, 24), (0x7fffdf, 23),
    (0xffffec, 24), (0xffffed, 24), (0x3fffd7, 22), (0x7fffe0, 23), (0xffffee, 24), (0x7fffe1, 23),
    (0x7fffe2, 23), (0x7fffe3, 23), (0x7fffe4, 23), (0x1fffdc, 21), (0x3fffd8, 22), (0x7fffe5, 23),
    (0x3fffd9, 22), (0x7fffe6, 23), (0x7fffe7, 23), (0xffffef, 24), (0x3fffda, 22), (0x1fffdd, 21),
    (0xfffe9, 20), (0x3fffdb, 22), (0x3fffdc, 22), (0x7fffe8, 23), (0x7fffe9, 23), (0x1fffde, 21),
    (0x7fffea, 23), (0x3fffdd, 22), (0x3fffde, 22), (0xfffff0, 24), (0x1fffdf, 21), (0x3fffdf, 22),
    (0x7fffeb, 23), (0x7fffec, 23), (0x1fffe0, 21), (0x1fffe1, 21), (0x3fffe0, 22), (0x1fffe2, 21),
    (0x7fffed, 23), (0x3fffe1, 22), (0x7fffee, 23), (0x7fffef, 23), (0xfffea, 20), (0x3fffe2, 22),
    (0x3fffe3, 22), (0x3fffe4, 22), (0x7ffff0, 23), (0x3fffe5, 22), (0x3fffe6, 22), (0x7ffff1, 23),
    (0x3ffffe0, 26), (0x3ffffe1, 26), (0xfffeb, 20), (0x7fff1, 19), (0x3fffe7, 22), (0x7ffff2, 23),
    (0x3fffe8, 22), (0x1ffffec, 25), (0x3ffffe2, 26), (0x3ffffe3, 26), (0x3ffffe4, 26), (0x7ffffde, 27),
    (0x7ffffdf, 27), (0x3ffffe5, 26), (0xfffff1, 24), (0x1ffffed, 25), (0x7fff2, 19), (0x1fffe3, 21),
    (0x3ffffe6, 26), (0x7ffffe0, 27), (0x7ffffe1, 27), (0x3ffffe7, 26), (0x7ffffe2, 27), (0xfffff2, 24),
    (0x1fffe4, 21), (0x1fffe5, 21), (0x3ffffe8, 26), (0x3ffffe9, 26), (0xffffffd, 28), (0x7ffffe3, 27),
    (0x7ffffe4, 27), (0x7ffffe5, 27), (0xfffec, 20), (0xfffff3, 24), (0xfffed, 20), (0x1fffe6, 21),
    (0x3fffe9, 22), (0x1fffe7, 21), (0x1fffe8, 21), (0x7ffff3, 23), (0x3fffea, 22), (0x3fffeb, 22),
    (0x1ffffee, 25), (0x1ffffef, 25), (0xfffff4, 24), (0xfffff5, 24), (0x3ffffea, 26), (0x7ffff4, 23),
    (0x3ffffeb, 26), (0x7ffffe6, 27), (0x3ffffec, 26), (0x3ffffed, 26), (0x7ffffe7, 27), (0x7ffffe8, 27),
    (0x7ffffe9, 27), (0x7ffffea, 27), (0x7ffffeb, 27), (0xffffffe, 28), (0x7ffffec, 27), (0x7ffffed, 27),
    (0x7ffffee, 27), (0x7ffffef, 27), (0x7fffff0, 27), (0x3ffffee, 26), (0x3fffffff, 30),
)

_ENTRY_OVERHEAD = 32        # RFC 7541 4.1: an entry's size is len(name) + len(value) + 32
_MAX_INT = (1 << 32) - 1    # larger integers are refused: no index, length or size is this big


# --- Huffman decoding ------------------------------------------------------------------
# A state machine over the code tree that consumes a whole byte per step. A state is an
# internal node of the tree (the bits read since the last complete symbol); for each
# (state, byte) there is the next state and the 0-2 symbols completed on the way. EOS
# leads to a sink state, and a string is complete only in a state whose pending bits are
# at most 7 ones (RFC 7541 5.2: padding is a prefix of EOS, no longer than 7 bits), so the
# per-byte loop has no branch and every error is found by one check at the end.
# States are stored multiplied by 256 so that ``state | byte`` is the index.

def _build_huffman_machine() -> tuple[list[int], list[bytes], frozenset[int]]:
    children: list[list[int]] = [[0, 0]]  # node -> [child for bit 0, for bit 1]; ~symbol at leaves
    for symbol, (code, length) in enumerate(_HUFFMAN_CODE):
        node = 0
        for shift in range(length - 1, 0, -1):
            bit = (code >> shift) & 1
            child = children[node][bit]
            if child == 0:
                child = len(children)
                children.append([0, 0])
                children[node][bit] = child
            node = child
        children[node][code & 1] = ~symbol
    fail = len(children)  # 256 internal nodes, then the sink

    # A nibble at a time first (cheap to build by walking bits), then bytes by composing
    # two nibble steps (one symbol at most per nibble: the shortest code has 5 bits).
    nib_next: list[int] = []
    nib_emit: list[bytes] = []
    for state in range(fail + 1):
        for nibble in range(16):
            node, out = state, b""
            if state != fail:
                for shift in (3, 2, 1, 0):
                    child = children[node][(nibble >> shift) & 1]
                    if child >= 0:
                        node = child
                    elif child == ~256:
                        node, out = fail, b""
                        break
                    else:
                        node, out = 0, bytes((~child,))
            nib_next.append(node)
            nib_emit.append(out)
    next_states: list[int] = []
    emits: list[bytes] = []
    scaled = [s << 8 for s in nib_next]
    for state in range(fail + 1):
        for high in range(16):
            mid = nib_next[(state << 4) | high] << 4
            first = nib_emit[(state << 4) | high]
            next_states.extend(scaled[mid:mid + 16])
            if first:
                emits.extend([first + second for second in nib_emit[mid:mid + 16]])
            else:
                emits.extend(nib_emit[mid:mid + 16])
    accepting = []
    node = 0
    for _ in range(8):  # the root and the nodes reached by 1..7 one bits
        accepting.append(node << 8)
        node = children[node][1]
    return next_states, emits, frozenset(accepting)


_HUFF_NEXT, _HUFF_EMIT, _HUFF_ACCEPT = _build_huffman_machine()


def _huffman_decode(data: bytes) -> bytes:
    """Kept separate from the decoder so the common, Huffman-free path stays short."""
    nxt, emit = _HUFF_NEXT, _HUFF_EMIT
    out = bytearray()
    state = 0
    for byte in data:
        i = state | byte
        state = nxt[i]
        out += emit[i]
    if state not in _HUFF_ACCEPT:
        raise HpackError("invalid Huffman code (EOS in the data, or bad padding)")
    return bytes(out)


# --- primitive decoding -----------------------------------------------------------------

def _int_tail(data: bytes, pos: int, value: int) -> tuple[int, int]:
    """The continuation bytes of an integer whose prefix was all ones (RFC 7541 5.1).

    Capped at five continuation bytes and 2**32 - 1 so a hostile block cannot make the
    decoder build huge integers or spin on zero-valued continuation bytes."""
    shift = 0
    n = len(data)
    while True:
        if pos >= n:
            raise HpackError("truncated integer")
        byte = data[pos]
        pos += 1
        value += (byte & 0x7F) << shift
        if byte < 0x80:
            break
        shift += 7
        if shift > 28:
            raise HpackError("integer too long")
    if value > _MAX_INT:
        raise HpackError("integer too large")
    return value, pos


def _string(data: bytes, pos: int) -> tuple[bytes, int]:
    """A string literal (RFC 7541 5.2) starting at ``pos``, and the position after it."""
    if pos >= len(data):
        raise HpackError("truncated string")
    first = data[pos]
    length = first & 0x7F
    pos += 1
    if length == 0x7F:
        length, pos = _int_tail(data, pos, 0x7F)
    end = pos + length
    if end > len(data):
        raise HpackError("truncated string")
    if first & 0x80:
        return _huffman_decode(data[pos:end]), end
    return data[pos:end], end


# For the first byte of an indexed field that names a static entry (0x81..0xBD): the entry.
# One list lookup then decides the commonest field of all.
_INDEXED_STATIC: list[tuple[bytes, bytes] | None] = [None] * 256
for _i, _entry in enumerate(_STATIC_TABLE, 1):
    _INDEXED_STATIC[0x80 | _i] = _entry
del _i, _entry


class Decoder:
    """The decoding half of one HTTP/2 connection's HPACK context.

    One per connection, fed every header block in the order received (the dynamic table
    is shared by all of the connection's streams). After an ``HpackError`` its state is
    undefined: the connection must be closed, as RFC 7540 requires anyway."""

    __slots__ = ("max_table_size", "_limit", "_size", "_dynamic")

    def __init__(self, max_table_size: int = 4096) -> None:
        # The SETTINGS_HEADER_TABLE_SIZE we advertise: the peer may shrink its table below
        # this with size updates, never grow it above.
        self.max_table_size = max_table_size
        self._limit = max_table_size
        self._size = 0
        # Oldest first, newest last: HPACK index 62 is ``_dynamic[-1]``, and index ``i`` is
        # ``_dynamic[61 - i]`` (always negative, so an index past the end is an IndexError,
        # never a silent wrap-around).
        self._dynamic: list[tuple[bytes, bytes]] = []

    @property
    def dynamic_table(self) -> list[tuple[bytes, bytes]]:
        """The dynamic table newest first (index 62 first), as RFC 7541's examples list it."""
        return self._dynamic[::-1]

    @property
    def table_size(self) -> int:
        """The dynamic table's size in the RFC's sense (each entry's bytes plus 32)."""
        return self._size

    @property
    def table_size_limit(self) -> int:
        """The table's current maximum size: ``max_table_size`` until the peer lowers it."""
        return self._limit

    def decode(self, block: bytes | bytearray | memoryview) -> list[tuple[bytes, bytes]]:
        """The (name, value) pairs of one complete header block (HEADERS plus any
        CONTINUATION fragments, joined), in order, updating the dynamic table.

        Raises ``HpackError`` for any malformed block, never another exception."""
        data = block if type(block) is bytes else bytes(block)
        n = len(data)
        pos = 0
        headers: list[tuple[bytes, bytes]] = []
        append = headers.append
        indexed_static = _INDEXED_STATIC
        dynamic = self._dynamic
        while pos < n:
            byte = data[pos]
            pos += 1
            if byte & 0x80:  # 6.1 indexed header field
                entry = indexed_static[byte]
                if entry is None:
                    index = byte & 0x7F
                    if index == 0x7F:
                        index, pos = _int_tail(data, pos, 0x7F)
                    elif index == 0:
                        raise HpackError("indexed header field with index 0")
                    try:
                        entry = dynamic[61 - index]
                    except IndexError:
                        raise HpackError(f"header index {index} is past the tables") from None
                append(entry)
            elif byte & 0x40:  # 6.2.1 literal with incremental indexing
                entry, pos = self._literal(data, pos, byte & 0x3F, 0x3F)
                self._insert(entry)
                append(entry)
            elif byte & 0x20:  # 6.3 dynamic table size update
                if headers:
                    raise HpackError("dynamic table size update after a header field")
                size = byte & 0x1F
                if size == 0x1F:
                    size, pos = _int_tail(data, pos, 0x1F)
                if size > self.max_table_size:
                    raise HpackError(
                        f"dynamic table size update to {size} above the advertised "
                        f"{self.max_table_size}")
                self._limit = size
                self._evict(0)
            else:  # 6.2.2 without indexing (0000) / 6.2.3 never indexed (0001)
                entry, pos = self._literal(data, pos, byte & 0x0F, 0x0F)
                append(entry)
        return headers

    def _literal(self, data: bytes, pos: int, index: int, mask: int
                 ) -> tuple[tuple[bytes, bytes], int]:
        """A literal field after its first byte: the name (indexed by the prefix's
        ``index``, or a string when it is 0), then the value string."""
        if index == mask:
            index, pos = _int_tail(data, pos, mask)
        if index:
            name = self._name(index)
        else:
            name, pos = _string(data, pos)
        value, pos = _string(data, pos)
        return (name, value), pos

    def _name(self, index: int) -> bytes:
        if index <= _STATIC_LEN:
            return _STATIC_TABLE[index - 1][0]
        try:
            return self._dynamic[61 - index][0]
        except IndexError:
            raise HpackError(f"header name index {index} is past the tables") from None

    def _evict(self, room: int) -> None:
        """Drop the oldest entries until ``room`` more bytes fit under the limit (4.3, 4.4)."""
        dynamic = self._dynamic
        limit = self._limit - room
        size = self._size
        while size > limit and dynamic:
            name, value = dynamic.pop(0)
            size -= len(name) + len(value) + _ENTRY_OVERHEAD
        self._size = size

    def _insert(self, entry: tuple[bytes, bytes]) -> None:
        size = len(entry[0]) + len(entry[1]) + _ENTRY_OVERHEAD
        if size > self._limit:
            # RFC 7541 4.4: not an error; the table ends up empty and the entry is not added.
            self._dynamic.clear()
            self._size = 0
            return
        self._evict(size)
        self._dynamic.append(entry)
        self._size += size


# --- encoding ---------------------------------------------------------------------------

def _encode_int(value: int, prefix_bits: int, flags: int) -> bytes:
    """RFC 7541 5.1, with ``flags`` in the first byte's bits above the prefix."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((flags | value,))
    out = bytearray((flags | limit,))
    value -= limit
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_STATIC_FIELD_CODE: dict[tuple[bytes, bytes], bytes] = {}
_STATIC_NAME_CODE: dict[bytes, bytes] = {}  # "literal without indexing, indexed name" prefix
for _i, _entry in enumerate(_STATIC_TABLE, 1):
    _STATIC_FIELD_CODE.setdefault(_entry, bytes((0x80 | _i,)))
    _STATIC_NAME_CODE.setdefault(_entry[0], _encode_int(_i, 4, 0x00))
del _i, _entry
_SHORT_LENGTH = [bytes((n,)) for n in range(0x7F)]  # plain (non-Huffman) string lengths < 127


def encode_headers(headers: list[tuple[bytes, bytes]]) -> bytes:
    """A header block for ``headers`` that leaves the peer's dynamic table untouched.

    Exact static-table fields become one byte (``(b":status", b"200")`` is ``b"\\x88"``);
    everything else is a literal without indexing, naming the static entry when it can.
    No Huffman coding: response headers are short, and the bytes saved are not worth the
    per-call work."""
    out = bytearray()
    for name, value in headers:
        code = _STATIC_FIELD_CODE.get((name, value))
        if code is not None:
            out += code
            continue
        code = _STATIC_NAME_CODE.get(name)
        if code is not None:
            out += code
        else:
            out.append(0x00)
            length = len(name)
            out += _SHORT_LENGTH[length] if length < 0x7F else _encode_int(length, 7, 0x00)
            out += name
        length = len(value)
        out += _SHORT_LENGTH[length] if length < 0x7F else _encode_int(length, 7, 0x00)
        out += value
    return bytes(out)
