"""``ModelInferRequest`` bytes parsed without copying the tensors.

Parsing the whole message with protobuf copies each ``raw_input_contents`` entry twice (into
the message, then out as a new ``bytes`` on access): two megabyte copies per 1 MB image,
on the event loop. Here the top-level fields are walked once (a handful of them), the
``raw_input_contents`` entries (field 7) are kept as views of the received bytes, and only
the small rest of the message goes through protobuf.
"""

from __future__ import annotations

from typing import Iterator

from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

RAW_INPUT_CONTENTS = 7   # ModelInferRequest.raw_input_contents (Triton's grpc_service.proto)


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise DecodeError("truncated or overlong varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _fields(data: bytes | memoryview) -> Iterator[tuple[int, int, int, int, int]]:
    """Each top-level field of a message as (field number, wire type, start, payload
    start, end):
    the payload of a length-delimited field is ``data[payload start:end]``. A field is
    yielded before its end is checked against the data (a message's head may end inside
    it); ``DecodeError`` for what cannot be a message."""
    pos, n = 0, len(data)
    while pos < n:
        start = pos
        key, pos = _varint(data, pos)
        field, wire = key >> 3, key & 7
        if field == 0:
            raise DecodeError("field number 0")
        payload = pos
        if wire == 2:
            length, payload = _varint(data, pos)
            pos = payload + length
        elif wire == 0:
            _, pos = _varint(data, pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise DecodeError(f"unsupported wire type {wire}")
        yield field, wire, start, payload, pos
        if pos > n:
            raise DecodeError("a field runs past the end of the message")


def split_infer_request(data: bytes) -> tuple[pb.ModelInferRequest, list[memoryview]]:
    """The request without its raw contents, and those contents as views of ``data``
    (in order). Raises ``DecodeError`` for bytes that are not a valid message."""
    view = memoryview(data)
    rest: list[memoryview] = []
    raw: list[memoryview] = []
    for field, wire, start, payload, end in _fields(data):
        if end > len(data):
            continue          # _fields raises next
        if field == RAW_INPUT_CONTENTS and wire == 2:
            raw.append(view[payload:end])
        else:
            rest.append(view[start:end])
    req = pb.ModelInferRequest.FromString(b"".join(rest))
    return req, raw


def raw_contents_offset(head: bytes | memoryview) -> int | None:
    """Where the first ``raw_input_contents`` entry's bytes start in a message that begins
    with ``head``, or None when ``head`` ends (or is malformed) before them: the front-end
    places the message so that the tensor lands aligned."""
    try:
        for field, wire, _, payload, _ in _fields(head):
            if field == RAW_INPUT_CONTENTS and wire == 2:
                return payload if payload <= len(head) else None
    except DecodeError:
        return None
    return None
