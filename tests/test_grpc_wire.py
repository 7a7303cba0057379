"""``grpc_wire``: ``split_infer_request`` parses what protobuf parses, tensors as views;
``raw_contents_offset`` finds the first tensor from a message's head."""

from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

from runtime_py.server.grpc_wire import raw_contents_offset, split_infer_request


def _request() -> pb.ModelInferRequest:
    r = pb.ModelInferRequest(model_name="toy", model_version="1", id="req-7")
    a = r.inputs.add(name="a", datatype="FP32", shape=[1, 3])
    a.parameters["shared_memory_offset"].int64_param = 300
    r.inputs.add(name="b", datatype="UINT8", shape=[2])
    r.raw_input_contents.append(bytes(range(12)))
    r.raw_input_contents.append(b"\x00" * 200)     # a length that needs a 2-byte varint
    r.outputs.add(name="logits")
    r.parameters["priority"].int64_param = 2
    return r


def _without_raw(r: pb.ModelInferRequest) -> pb.ModelInferRequest:
    copy = pb.ModelInferRequest()
    copy.CopyFrom(r)
    del copy.raw_input_contents[:]
    return copy


def test_split_matches_protobuf_and_keeps_the_tensors_as_views():
    r = _request()
    data = r.SerializeToString()
    req, raw = split_infer_request(data)
    assert req == _without_raw(r)
    assert [bytes(v) for v in raw] == list(r.raw_input_contents)
    assert all(isinstance(v, memoryview) and v.obj is data for v in raw)   # no copies


def test_every_truncation_is_refused_or_parsed_as_protobuf_does():
    data = _request().SerializeToString()
    for n in range(len(data)):
        try:
            expected = pb.ModelInferRequest.FromString(data[:n])
        except DecodeError:
            with pytest.raises(DecodeError):
                split_infer_request(data[:n])
        else:
            req, raw = split_infer_request(data[:n])
            assert req == _without_raw(expected)
            assert [bytes(v) for v in raw] == list(expected.raw_input_contents)


@pytest.mark.parametrize("data", [b"\x00\x01", b"\x3f", b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"])
def test_malformed_bytes_raise_decode_error(data):
    with pytest.raises(DecodeError):
        split_infer_request(data)


def test_raw_contents_offset_from_the_head_of_a_message():
    """The built-in gRPC server places a message by where its first tensor starts, known
    from the message's first frame: the offset is that of the first raw_input_contents
    bytes, also when the head ends inside them, and None when it ends before them."""
    data = _request().SerializeToString()
    _, raw = split_infer_request(data)
    first = data.index(bytes(range(12)))
    assert bytes(raw[0]) == data[first:first + 12]
    assert raw_contents_offset(data) == first
    assert raw_contents_offset(data[:first + 3]) == first     # cut inside the tensor
    assert raw_contents_offset(data[:first]) == first
    assert raw_contents_offset(data[:first - 2]) is None      # cut before the field
    assert raw_contents_offset(data[:10]) is None
    assert raw_contents_offset(b"\xff\xff") is None           # not a message
    no_raw = pb.ModelInferRequest(model_name="toy").SerializeToString()
    assert raw_contents_offset(no_raw) is None
