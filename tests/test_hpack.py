"""HPACK decoding and encoding (runtime_py/server/hpack.py).

The decoder is checked against RFC 7541 Appendix C byte for byte (decoded fields and the
dynamic table after each block), against the reference ``hpack`` package's encoder when
that is installed, and on the malformed blocks a hostile client could send.
"""

from __future__ import annotations

import random

import pytest

from runtime_py.server.hpack import Decoder, HpackError, encode_headers


def _hex(text: str) -> bytes:
    return bytes.fromhex("".join(text.split()))


# --- RFC 7541 Appendix C ------------------------------------------------------------------

@pytest.mark.parametrize("block, headers, table", [
    pytest.param(  # C.2.1 literal with indexing
        "400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572",
        [(b"custom-key", b"custom-header")],
        [(b"custom-key", b"custom-header")], id="C.2.1"),
    pytest.param(  # C.2.2 literal without indexing
        "040c 2f73 616d 706c 652f 7061 7468",
        [(b":path", b"/sample/path")], [], id="C.2.2"),
    pytest.param(  # C.2.3 literal never indexed
        "1008 7061 7373 776f 7264 0673 6563 7265 74",
        [(b"password", b"secret")], [], id="C.2.3"),
    pytest.param(  # C.2.4 indexed
        "82", [(b":method", b"GET")], [], id="C.2.4"),
])
def test_rfc_c2_single_fields(block, headers, table):
    decoder = Decoder()
    assert decoder.decode(_hex(block)) == headers
    assert decoder.dynamic_table == table
    assert decoder.table_size == sum(len(n) + len(v) + 32 for n, v in table)


_REQUEST_1 = [(b":method", b"GET"), (b":scheme", b"http"), (b":path", b"/"),
              (b":authority", b"www.example.com")]
_REQUEST_2 = _REQUEST_1 + [(b"cache-control", b"no-cache")]
_REQUEST_3 = [(b":method", b"GET"), (b":scheme", b"https"), (b":path", b"/index.html"),
              (b":authority", b"www.example.com"), (b"custom-key", b"custom-value")]
_REQUEST_TABLES = [
    ([(b":authority", b"www.example.com")], 57),
    ([(b"cache-control", b"no-cache"), (b":authority", b"www.example.com")], 110),
    ([(b"custom-key", b"custom-value"), (b"cache-control", b"no-cache"),
      (b":authority", b"www.example.com")], 164),
]

_DATE_1 = b"Mon, 21 Oct 2013 20:13:21 GMT"
_DATE_2 = b"Mon, 21 Oct 2013 20:13:22 GMT"
_LOCATION = (b"location", b"https://www.example.com")
_COOKIE = (b"set-cookie", b"foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1")
_RESPONSES = [
    [(b":status", b"302"), (b"cache-control", b"private"), (b"date", _DATE_1), _LOCATION],
    [(b":status", b"307"), (b"cache-control", b"private"), (b"date", _DATE_1), _LOCATION],
    [(b":status", b"200"), (b"cache-control", b"private"), (b"date", _DATE_2), _LOCATION,
     (b"content-encoding", b"gzip"), _COOKIE],
]
_RESPONSE_TABLES = [
    ([_LOCATION, (b"date", _DATE_1), (b"cache-control", b"private"),
      (b":status", b"302")], 222),
    ([(b":status", b"307"), _LOCATION, (b"date", _DATE_1),
      (b"cache-control", b"private")], 222),
    ([_COOKIE, (b"content-encoding", b"gzip"), (b"date", _DATE_2)], 215),
]

_SEQUENCES = {
    "C.3": (4096, [_REQUEST_1, _REQUEST_2, _REQUEST_3], _REQUEST_TABLES, [
        "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
        "8286 84be 5808 6e6f 2d63 6163 6865",
        "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
    ]),
    "C.4": (4096, [_REQUEST_1, _REQUEST_2, _REQUEST_3], _REQUEST_TABLES, [
        "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
        "8286 84be 5886 a8eb 1064 9cbf",
        "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
    ]),
    "C.5": (256, _RESPONSES, _RESPONSE_TABLES, [
        """4803 3330 3258 0770 7269 7661 7465 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133
           2032 303a 3133 3a32 3120 474d 546e 1768 7474 7073 3a2f 2f77 7777 2e65 7861 6d70
           6c65 2e63 6f6d""",
        "4803 3330 37c1 c0bf",
        """88c1 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 2032 303a 3133 3a32 3220 474d
           54c0 5a04 677a 6970 7738 666f 6f3d 4153 444a 4b48 514b 425a 584f 5157 454f 5049
           5541 5851 5745 4f49 553b 206d 6178 2d61 6765 3d33 3630 303b 2076 6572 7369 6f6e
           3d31""",
    ]),
    "C.6": (256, _RESPONSES, _RESPONSE_TABLES, [
        """4882 6402 5885 aec3 771a 4b61 96d0 7abe 9410 54d4 44a8 2005 9504 0b81 66e0 82a6
           2d1b ff6e 919d 29ad 1718 63c7 8f0b 97c8 e9ae 82ae 43d3""",
        "4883 640e ffc1 c0bf",
        """88c1 6196 d07a be94 1054 d444 a820 0595 040b 8166 e084 a62d 1bff c05a 839b d9ab
           77ad 94e7 821d d7f2 e6c7 b335 dfdf cd5b 3960 d5af 2708 7f36 72c1 ab27 0fb5 291f
           9587 3160 65c0 03ed 4ee5 b106 3d50 07""",
    ]),
}


@pytest.mark.parametrize("name", sorted(_SEQUENCES))
def test_rfc_sequences_share_one_decoder(name):
    """C.3/C.4: requests (plain, then Huffman); C.5/C.6: responses with a 256-byte table,
    where later blocks evict earlier entries."""
    max_size, expected, tables, blocks = _SEQUENCES[name]
    decoder = Decoder(max_table_size=max_size)
    assert decoder.table_size_limit == max_size
    for block, headers, (table, size) in zip(blocks, expected, tables):
        assert decoder.decode(_hex(block)) == headers
        assert decoder.dynamic_table == table
        assert decoder.table_size == size


def test_decode_accepts_bytearray_and_memoryview():
    block = _hex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff")
    assert Decoder().decode(bytearray(block)) == _REQUEST_1
    assert Decoder().decode(memoryview(b"xx" + block)[2:]) == _REQUEST_1
    assert Decoder().decode(b"") == []


# --- dynamic table rules ----------------------------------------------------------------

def test_entry_larger_than_table_empties_it():
    """RFC 7541 4.4: not an error; the table is emptied and the entry not added."""
    decoder = Decoder(max_table_size=100)
    small = b"\x40\x01k\x01v"                        # (k, v): 34 bytes
    big = b"\x40\x03big\x46" + b"x" * 70              # (big, x*70): 105 bytes > 100
    assert decoder.decode(small + small) == [(b"k", b"v")] * 2
    assert decoder.table_size == 68
    assert decoder.decode(big + b"\x82") == [(b"big", b"x" * 70), (b":method", b"GET")]
    assert decoder.dynamic_table == []
    assert decoder.table_size == 0
    with pytest.raises(HpackError):
        decoder.decode(b"\xbe")


def test_eviction_keeps_newest_and_indices_follow():
    decoder = Decoder(max_table_size=100)
    decoder.decode(b"\x40\x01a\x011\x40\x01b\x012")   # 34 + 34
    decoder.decode(b"\x40\x01c\x013")                # 3 x 34 > 100: (a, 1) evicted
    assert decoder.dynamic_table == [(b"c", b"3"), (b"b", b"2")]
    assert decoder.decode(b"\xbe\xbf") == [(b"c", b"3"), (b"b", b"2")]
    # Literal whose name is a dynamic entry that its own insertion evicts (4.4).
    assert decoder.decode(b"\x7f\x00\x02zz") == [(b"b", b"zz")]   # index 63 = (b, 2)
    assert decoder.dynamic_table == [(b"b", b"zz"), (b"c", b"3")]


def test_size_updates_at_block_start_evict_and_may_repeat():
    decoder = Decoder()
    decoder.decode(b"\x40\x01a\x011\x40\x01b\x012")
    assert decoder.decode(b"\x20\x3f\x11\x82") == [(b":method", b"GET")]  # to 0, then 48
    assert decoder.dynamic_table == []
    assert decoder.table_size_limit == 48
    decoder.decode(b"\x40\x01a\x011")
    assert decoder.table_size == 34
    decoder.decode(b"\x3f\xe1\x1f")                                 # back to 4096
    assert decoder.table_size_limit == 4096


# --- malformed blocks -------------------------------------------------------------------

@pytest.mark.parametrize("block", [
    pytest.param(b"\xff", id="truncated-index-integer"),
    pytest.param(b"\x40", id="truncated-name-length"),
    pytest.param(b"\x40\x0acustom", id="truncated-name"),
    pytest.param(b"\x04", id="truncated-value-length"),
    pytest.param(b"\x04\x05/ab", id="truncated-value"),
    pytest.param(b"\x04\x7f\x80", id="truncated-length-integer"),
    pytest.param(b"\x80", id="index-0"),
    pytest.param(b"\x82\x80", id="index-0-after-field"),
    pytest.param(b"\xbe", id="index-62-empty-table"),
    pytest.param(b"\xff\x00", id="index-127"),
    pytest.param(b"\xff\xff\xff\xff\x0f", id="index-huge"),
    pytest.param(b"\x7e\x00", id="name-index-past-tables-incremental"),
    pytest.param(b"\x0f\x2f\x00", id="name-index-past-tables-without-indexing"),
    pytest.param(b"\x3f\xe2\x1f", id="size-update-above-max"),
    pytest.param(b"\x82\x20", id="size-update-after-field"),
    pytest.param(b"\x00\x01a\x81\x18", id="huffman-padding-zeros"),
    pytest.param(b"\x00\x01a\x82\x1f\xff", id="huffman-padding-over-7-bits"),
    pytest.param(b"\x00\x01a\x81\xff", id="huffman-padding-only"),
    pytest.param(b"\x00\x01a\x84\xff\xff\xff\xff", id="huffman-eos"),
    pytest.param(b"\x00\x01a\x85\xff\xff\xff\xfc\x18", id="huffman-eos-then-data"),
    pytest.param(b"\xff\xff\xff\xff\xff\xff\x7f", id="integer-overflow"),
    pytest.param(b"\xff" + b"\x80" * 10 + b"\x01", id="integer-too-many-bytes"),
    pytest.param(b"\x3f" + b"\x80" * 10 + b"\x00", id="integer-zero-continuations"),
    pytest.param(b"\x00\x7f\xff\xff\xff\xff\x7f", id="string-length-overflow"),
])
def test_malformed_block_raises_hpack_error(block):
    with pytest.raises(HpackError):
        Decoder().decode(block)


def test_huffman_edge_cases_that_are_valid():
    decoder = Decoder()
    assert decoder.decode(b"\x00\x01a\x80") == [(b"a", b"")]           # empty Huffman string
    assert decoder.decode(b"\x00\x01a\x81\x1f") == [(b"a", b"a")]      # 'a' + 3 ones
    assert decoder.decode(b"\x00\x01a\x81\x07") == [(b"a", b"0")]      # '0' + 3 ones
    # A string ending on a byte boundary, no padding: '0' x 8 (5 bits each) is 40 bits.
    assert decoder.decode(b"\x00\x01a\x85" + bytes(5)) == [(b"a", b"00000000")]


# --- encoding -----------------------------------------------------------------------------

def test_encode_static_fields_and_literals():
    assert encode_headers([(b":status", b"200")]) == b"\x88"
    assert encode_headers([(b":status", b"418")]) == b"\x08\x03418"
    assert encode_headers([(b"content-type", b"application/grpc")]) == \
        b"\x0f\x10\x10application/grpc"                           # static name 31
    assert encode_headers([(b"grpc-status", b"0")]) == b"\x00\x0bgrpc-status\x010"
    assert encode_headers([]) == b""


def _random_bytes(rng: random.Random, longest: int) -> bytes:
    return bytes(rng.randrange(256) for _ in range(rng.randrange(longest + 1)))


def test_encode_round_trip_leaves_table_untouched():
    from runtime_py.server.hpack import _STATIC_TABLE
    rng = random.Random(7541)
    decoder = Decoder()
    for _ in range(300):
        headers = []
        for _ in range(rng.randrange(12)):
            kind = rng.randrange(4)
            if kind == 0:
                headers.append(rng.choice(_STATIC_TABLE))
            elif kind == 1:
                headers.append((rng.choice(_STATIC_TABLE)[0], _random_bytes(rng, 300)))
            else:
                headers.append((_random_bytes(rng, 200), _random_bytes(rng, 200)))
        assert decoder.decode(encode_headers(headers)) == headers
        assert decoder.dynamic_table == []


# --- reference implementation -------------------------------------------------------------

def test_decodes_what_the_reference_encoder_writes():
    """Many blocks on one connection from the ``hpack`` package's encoder: dynamic table
    indexing, Huffman or not, never-indexed fields, and table size changes mid-stream."""
    hpack = pytest.importorskip(
        "hpack", reason="the reference HPACK implementation (optional, for the cross-check)")
    rng = random.Random(1)
    encoder = hpack.Encoder()
    decoder = Decoder()
    seen: list[tuple[bytes, bytes]] = [(b":method", b"POST"), (b"te", b"trailers")]
    for block_number in range(400):
        if block_number % 50 == 49:
            encoder.header_table_size = rng.choice([0, 64, 256, 1024, 4096])
        headers = []
        for _ in range(rng.randrange(1, 15)):
            kind = rng.randrange(5)
            if kind <= 1:
                pair = rng.choice(seen)                 # likely in the dynamic table
            elif kind == 2:
                pair = (rng.choice(seen)[0], _random_bytes(rng, 40))
            else:
                pair = (_random_bytes(rng, 30) or b"x", _random_bytes(rng, 150))
                seen.append(pair)
            headers.append(pair)
        sent = [hpack.NeverIndexedHeaderTuple(*pair) if rng.random() < 0.1 else pair
                for pair in headers]
        block = encoder.encode(sent, huffman=rng.random() < 0.7)
        assert decoder.decode(block) == headers, block_number
        assert decoder.table_size_limit == encoder.header_table_size
