"""Fuzzing the front-ends' own parsers: HPACK, the HTTP/1.1 request head, the
``ModelInferRequest`` split (against protobuf), the built-in HTTP/1.1 and gRPC (HTTP/2)
servers on loopback, and KServe JSON requests edited at random.

The bundle readers have their fuzzers (docs/fuzzing.md); the servers parse bytes from the
network with code of this project too (``runtime_py/server/hpack.py``, ``http1.py``,
``grpc_h2.py``). Seeded mutations of valid inputs (byte flips, inserts, deletions,
truncations, repeats, boundary integers written over lengths and ids) must be refused
with the parser's own error, never another exception; and a server fed mutated streams
must answer or close each connection and keep serving, with no error logged. The first
run found ``parse_head`` raising ``ValueError`` / ``UnicodeDecodeError`` on an
absolute-form target (``http://[h/...``, non-ASCII bytes): uvloop then dropped the
connection with a logged traceback instead of a 400 (tests/test_http1.py keeps both).
Longer runs: ``BUNDLE_PROTOCOL_FUZZ_CASES=20000 python -m pytest tests/test_fuzz_protocols.py``.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import random
import socket
import struct
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from runtime_py.server.hpack import Decoder, HpackError, encode_headers
from runtime_py.server.http1 import BadRequest, parse_head

CASES = int(os.environ.get("BUNDLE_PROTOCOL_FUZZ_CASES", "300"))
BOUNDARY_INTS = (0, 1, 0x7F, 0x80, 0xFF, 0x3FFF, 0x4000, 0x4001, 0xFFFF, 0xFFFFFF,
                 0x7FFFFFFF, 0xFFFFFFFF)


def mutate(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 5)):
        op = rng.randrange(7)
        if op == 0 and b:
            b[rng.randrange(len(b))] = rng.randrange(256)
        elif op == 1:
            b.insert(rng.randrange(len(b) + 1), rng.randrange(256))
        elif op == 2 and b:
            i = rng.randrange(len(b))
            del b[i:i + rng.randint(1, 16)]
        elif op == 3 and b:
            del b[rng.randrange(len(b)):]
        elif op == 4 and b:
            i = rng.randrange(len(b))
            b[i:i] = b[i:i + rng.randint(1, 64)] * rng.randint(1, 3)
        elif op == 5 and b:
            i = rng.randrange(len(b))
            b[i:i + 4] = struct.pack(">I", rng.choice(BOUNDARY_INTS))
        elif op == 6 and b:
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    return bytes(b)


# --- the parsers, in process ---------------------------------------------------------------

HPACK_SEEDS = [
    encode_headers([(b":method", b"POST"), (b":scheme", b"http"),
                    (b":path", b"/inference.GRPCInferenceService/ModelInfer"),
                    (b"content-type", b"application/grpc"), (b"te", b"trailers"),
                    (b"x-custom", b"v" * 50)]),
    bytes.fromhex("400a637573746f6d2d6b65790d637573746f6d2d686561646572"),   # RFC C.2.1
    bytes.fromhex("828684418cf1e3c2e5f23a6ba0ab90f4ff"),                       # RFC C.4.1
    bytes.fromhex("3fe11f"),                                                   # size update
]


def test_hpack_decoder_refuses_or_decodes_every_mutated_block():
    rng = random.Random(1)
    decoded = refused = 0
    for _ in range(CASES * 100):
        decoder = Decoder(rng.choice([0, 64, 4096]))
        for _ in range(rng.randint(1, 4)):              # blocks in a row share the table
            block = mutate(rng, rng.choice(HPACK_SEEDS))
            try:
                fields = decoder.decode(block)
            except HpackError:
                refused += 1
                break
            decoded += 1
            assert all(isinstance(n, bytes) and isinstance(v, bytes) for n, v in fields)
            assert decoder.table_size <= decoder.table_size_limit
    assert decoded > 3000 and refused > 3000        # both sides of the parser were reached


HEAD_SEEDS = [
    b"POST /v2/models/m/infer HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n"
    b"Inference-Header-Content-Length: 5",
    b"GET /v2/health/ready HTTP/1.0\r\nConnection: close",
    b"POST http://x/v2/models/m/infer?q=1 HTTP/1.1\r\nTransfer-Encoding: chunked",
    b"GET /v2/models/m%20x/config HTTP/1.1\r\nExpect: 100-continue",
]


def test_http_head_parser_refuses_or_parses_every_mutated_head():
    rng = random.Random(2)
    parsed = refused = 0
    for _ in range(CASES * 100):
        try:
            head = parse_head(mutate(rng, rng.choice(HEAD_SEEDS)))
        except BadRequest as exc:
            assert 400 <= exc.status < 600
            refused += 1
            continue
        parsed += 1
        assert isinstance(head.path, str) and head.method
    assert parsed > 2000 and refused > 3000


def test_infer_request_split_agrees_with_protobuf_on_mutated_messages():
    """``grpc_wire.split_infer_request`` (the tensors kept as views) against protobuf's own
    parse: where both parse, the same message; it refuses only what protobuf refuses, or a
    group (wire types 3/4, which protobuf keeps as unknown fields and no client sends)."""
    pb = pytest.importorskip("tritonclient.grpc").service_pb2
    from google.protobuf.message import DecodeError

    from runtime_py.server.grpc_wire import raw_contents_offset, split_infer_request

    req = pb.ModelInferRequest(model_name="m", model_version="1", id="x")
    req.inputs.add(name="input", datatype="FP32", shape=[1, 3, 2, 2])
    req.inputs.add(name="b", datatype="UINT8", shape=[1, 4])
    req.outputs.add(name="logits")
    req.parameters["p"].int64_param = 5
    req.raw_input_contents.extend([bytes(range(48)), b"abcd"])
    seed = req.SerializeToString()
    rng = random.Random(4)
    both = 0
    for _ in range(CASES * 30):
        data = mutate(rng, seed)
        raw_contents_offset(data[:rng.randrange(len(data) + 1)])      # never raises
        try:
            expected = pb.ModelInferRequest.FromString(data)
        except DecodeError:
            expected = None
        try:
            got, raw = split_infer_request(data)
        except DecodeError as exc:
            assert expected is None or "wire type 3" in str(exc) or "wire type 4" in str(exc)
            continue
        assert expected is not None, data.hex()
        got.raw_input_contents.extend(bytes(r) for r in raw)
        assert got == expected, data.hex()
        both += 1
    assert both > 500


# --- the servers, on loopback ---------------------------------------------------------------

class _Errors(logging.Handler):
    """Every record at ERROR or above, or carrying a traceback, from any logger."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR or record.exc_info:
            self.records.append(self.format(record)[:2000])


def _exchange(port: int, data: bytes, idle: float = 0.05, until: bytes | None = None) -> bytes:
    """Send ``data``, read until the server closes, is quiet for ``idle`` seconds (a
    client leaving before the answer is one more case the server must take) or has sent
    ``until``."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.settimeout(idle)
        try:
            s.sendall(data)
        except OSError:
            pass            # closed before it read everything: a refusal
        got, t0 = b"", time.monotonic()
        try:
            while time.monotonic() - t0 < 5:
                chunk = s.recv(1 << 16)
                if not chunk:
                    break
                got += chunk
                if until is not None and until in got:
                    break
        except (socket.timeout, ConnectionResetError):
            pass
        return got


@pytest.mark.parametrize("workers", [0, 1], ids=["in-process", "1-worker"])
def test_servers_answer_or_close_mutated_streams_and_keep_serving(tmp_path, workers):
    pytest.importorskip("starlette")
    pb = pytest.importorskip("tritonclient.grpc").service_pb2
    from runtime_py.server.grpc_h2 import (CONTINUATION, DATA, END_HEADERS, END_STREAM,
                                           HEADERS, PING, PREFACE, RST_STREAM, SETTINGS,
                                           WINDOW_UPDATE, frame)
    sys.path.insert(0, str(Path(__file__).parent))
    from synthetic_bundles import served_ports

    def block(method: str) -> bytes:
        return encode_headers([(b":method", b"POST"), (b":scheme", b"http"),
                               (b":path", f"/inference.GRPCInferenceService/{method}".encode()),
                               (b":authority", b"t"), (b"content-type", b"application/grpc"),
                               (b"te", b"trailers")])

    def message(m) -> bytes:
        body = m.SerializeToString()
        return b"\0" + struct.pack(">I", len(body)) + body

    errors = _Errors()
    logging.getLogger().addHandler(errors)
    try:
        with served_ports(tmp_path, workers=workers, grpc_server="builtin",
                          max_body_bytes=1 << 20) as (http_port, grpc_port, model):
            name, spec = model.name, model.inputs[0]
            x = np.random.default_rng(0).random((1, *spec.shape[1:]), dtype=np.float32)
            header = json.dumps({"inputs": [{"name": spec.name, "shape": list(x.shape),
                                             "datatype": "FP32",
                                             "parameters": {"binary_data_size": x.nbytes}}],
                                 "parameters": {"binary_data_output": True}}).encode()
            body = header + x.tobytes()
            as_json = json.dumps({"inputs": [{"name": spec.name, "shape": list(x.shape),
                                              "datatype": "FP32",
                                              "data": x.ravel().tolist()}]}).encode()
            http_seeds = [
                b"POST /v2/models/%s/infer HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n"
                b"Inference-Header-Content-Length: %d\r\n\r\n" % (name.encode(), len(body),
                                                                   len(header)) + body,
                b"GET /v2/health/ready HTTP/1.1\r\n\r\nGET /v2/models/%s HTTP/1.1\r\n\r\n"
                % name.encode(),
                b"POST /v2/models/%s/infer HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"%x\r\n%s\r\n0\r\n\r\n" % (name.encode(), len(as_json), as_json),
                b"GET /v2/models/%s/config HTTP/1.1\r\n\r\nPOST /v2/repository/index "
                b"HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}" % name.encode(),
            ]
            infer = pb.ModelInferRequest(model_name=name)
            infer.inputs.add(name=spec.name, datatype="FP32", shape=list(x.shape))
            infer.raw_input_contents.append(x.tobytes())
            grpc_seeds = [
                [frame(HEADERS, END_HEADERS, 1, block("ModelInfer")),
                 frame(DATA, END_STREAM, 1, message(infer))],
                [frame(HEADERS, 0, 3, block("ModelMetadata")[:5]),
                 frame(CONTINUATION, END_HEADERS, 3, block("ModelMetadata")[5:]),
                 frame(DATA, END_STREAM, 3, message(pb.ModelMetadataRequest(name=name))),
                 frame(PING, 0, 0, b"12345678")],
                [frame(HEADERS, END_HEADERS, 1, block("ModelStreamInfer")),
                 frame(DATA, 0, 1, message(infer)),
                 frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 1000)),
                 frame(DATA, END_STREAM, 1, message(infer))],
                [frame(HEADERS, END_HEADERS, 1, block("ModelInfer")),
                 frame(RST_STREAM, 0, 1, struct.pack(">I", 8)),
                 frame(HEADERS, END_HEADERS, 3, block("ServerLive")),
                 frame(DATA, END_STREAM, 3, message(pb.ServerLiveRequest()))],
            ]
            start = PREFACE + frame(SETTINGS, 0, 0, b"")
            live_grpc = start + b"".join(grpc_seeds[3][2:])

            def serving() -> bool:
                http_ok = _exchange(http_port, b"GET /v2/health/live HTTP/1.1\r\n"
                                    b"Connection: close\r\n\r\n", 5.0).startswith(b"HTTP/1.1 200")
                return http_ok and b"grpc-status" in _exchange(grpc_port, live_grpc, 5.0,
                                                               until=b"grpc-status")

            assert serving()
            rng = random.Random(3 + workers)
            for case in range(CASES):
                if case % 2:
                    _exchange(http_port, mutate(rng, rng.choice(http_seeds)))
                else:
                    frames = list(rng.choice(grpc_seeds))
                    k = rng.randrange(len(frames))
                    frames[k] = mutate(rng, frames[k])
                    stream = start + b"".join(frames)
                    _exchange(grpc_port, stream if rng.random() < 0.5 else mutate(rng, stream))
                if case % 50 == 49:
                    assert serving(), f"not serving after case {case}"
            assert serving()
    finally:
        logging.getLogger().removeHandler(errors)
    assert errors.records == [], "\n----\n".join(errors.records[:3])


def test_values_msgpack_cannot_carry_get_a_400_through_a_worker(tmp_path):
    """Found by fuzzing the shared-memory routes: through a front-end worker, a register
    whose offset is 2**64 (or whose key holds a lone surrogate) failed the worker's whole
    frame to the engine, and that request (and any other of the same turn) never got an
    answer. Each is now a 400 of its own, and the server goes on."""
    pytest.importorskip("starlette")
    sys.path.insert(0, str(Path(__file__).parent))
    from synthetic_bundles import served_ports

    def post(port: int, path: str, body: bytes) -> bytes:
        return _exchange(port, b"POST %s HTTP/1.1\r\nContent-Length: %d\r\nConnection: close"
                         b"\r\n\r\n%s" % (path.encode(), len(body), body), 10.0)

    with served_ports(tmp_path, workers=1, max_body_bytes=1 << 20) as (http_port, _, _model):
        register = "/v2/systemsharedmemory/region/r/register"
        for body in (b'{"key": "/k", "offset": 18446744073709551616, "byte_size": 16}',
                     b'{"key": "/k\\ud800", "offset": 0, "byte_size": 16}'):
            answer = post(http_port, register, body)
            assert answer.startswith(b"HTTP/1.1 400"), answer[:300]
        assert b"cannot pass on" in post(http_port, register, body=(
            b'{"key": "/k", "offset": 0, "byte_size": -18446744073709551617}'))
        assert _exchange(http_port, b"GET /v2/health/live HTTP/1.1\r\nConnection: close\r\n\r\n",
                         5.0).startswith(b"HTTP/1.1 200")


WEIRD_VALUES = (None, True, -1, 0, 1.5, 2**31, 2**63, -2**63, 2**64, -2**64 - 1, 10**30, "",
                "x", "\ud800", "FP32", "BYTES", "UINT8", [], [1], [[1]], {}, {"a": 1}, [-1, 3],
                [0, 3, 2, 2], ["1"], "1" * 300)
KEYS = ("shape", "datatype", "name", "data", "parameters", "binary_data_size", "binary_data",
        "binary_data_output", "shared_memory_region", "shared_memory_byte_size",
        "shared_memory_offset", "classification", "outputs", "inputs", "id")


def _odd_value(rng: random.Random):
    """One of ``WEIRD_VALUES``, as a copy of its own (see ``_mutate_json``)."""
    return copy.deepcopy(rng.choice(WEIRD_VALUES))


def _mutate_json(rng: random.Random, doc):
    """``doc`` with 1-3 edits at random places: a value replaced by an odd one (huge
    integers, a lone surrogate, wrong types), a key removed or added, a list entry
    repeated. Each value put in is a copy: the odd values are shared by every case, and an
    edit into one of them in place would change later cases and could make a list hold
    itself (json.dumps: "Circular reference detected", a long run's find)."""
    doc = json.loads(json.dumps(doc))
    for _ in range(rng.randint(1, 3)):
        node, path = doc, []
        for _ in range(rng.randint(0, 4)):
            if isinstance(node, (dict, list)) and node:
                key = rng.choice(list(node)) if isinstance(node, dict) else rng.randrange(len(node))
                path.append((node, key))
                node = node[key]
        if not path:
            return _odd_value(rng)
        parent, key = path[-1]
        op = rng.randrange(4)
        if op == 0:
            parent[key] = _odd_value(rng)
        elif op == 1 and isinstance(parent, dict):
            del parent[key]
        elif op == 2 and isinstance(parent, dict):
            parent[rng.choice(KEYS)] = _odd_value(rng)
        elif op == 3 and isinstance(parent, list):
            parent.append(copy.deepcopy(parent[key]))
    return doc


@pytest.mark.parametrize("workers", [0, 1], ids=["in-process", "1-worker"])
def test_mutated_kserve_json_requests_get_200_or_4xx(tmp_path, workers):
    """KServe v2 infer requests (JSON tensors, and binary tensors with their JSON header)
    and shared-memory registrations, edited at random: every one is answered, 200 or 4xx
    with an error, never 5xx and never silence, with nothing logged at error level. (The
    registrations are where a 2**64 offset once hung a worker's turn.)"""
    pytest.importorskip("starlette")
    sys.path.insert(0, str(Path(__file__).parent))
    from synthetic_bundles import served_ports

    key = f"/trt-bundle-fuzz-{os.getpid()}-{workers}"      # a segment to register
    Path("/dev/shm" + key).write_bytes(bytes(4096))
    errors = _Errors()
    logging.getLogger().addHandler(errors)
    statuses: dict[int, int] = {}
    try:
        with served_ports(tmp_path, workers=workers, max_body_bytes=1 << 20) as (port, _, model):
            spec, out = model.inputs[0], model.outputs[0].name
            x = np.random.default_rng(0).random((1, *spec.shape[1:]), dtype=np.float32)
            as_json = {"id": "a", "inputs": [{"name": spec.name, "shape": list(x.shape),
                                              "datatype": "FP32", "data": x.ravel().tolist()}],
                       "outputs": [{"name": out, "parameters": {"binary_data": False}}],
                       "parameters": {}}
            binary = {"inputs": [{"name": spec.name, "shape": list(x.shape), "datatype": "FP32",
                                  "parameters": {"binary_data_size": x.nbytes}}],
                      "outputs": [{"name": out, "parameters": {"binary_data": True}}],
                      "parameters": {"binary_data_output": True}}
            register = {"key": key, "offset": 0, "byte_size": 64}
            rng = random.Random(5 + workers)
            path = f"/v2/models/{model.name}/infer".encode()
            for _ in range(CASES):
                if rng.random() < 0.2:
                    body = json.dumps(_mutate_json(rng, register)).encode()
                    answer = _exchange(port, b"POST /v2/systemsharedmemory/region/r/register "
                                       b"HTTP/1.1\r\nContent-Length: %d\r\nConnection: close"
                                       b"\r\n\r\n%s" % (len(body), body), 10.0)
                    _exchange(port, b"POST /v2/systemsharedmemory/unregister HTTP/1.1\r\n"
                              b"Content-Length: 0\r\nConnection: close\r\n\r\n", 10.0)
                    assert answer.startswith(b"HTTP/1.1 "), (body[:300], answer[:300])
                    status = int(answer.split()[1])
                    assert status == 200 or 400 <= status < 500, (body[:300], answer[:300])
                    continue
                if rng.random() < 0.5:
                    body = json.dumps(_mutate_json(rng, as_json)).encode()
                    extra = b"Content-Type: application/json\r\n"
                else:
                    header = json.dumps(_mutate_json(rng, binary)).encode()
                    body = header + x.tobytes()[:rng.choice([x.nbytes, x.nbytes, 0, 7])]
                    extra = b"Inference-Header-Content-Length: %d\r\n" % rng.choice(
                        [len(header), len(header), len(header) + 1, 0, len(body) + 5])
                answer = _exchange(port, b"POST %s HTTP/1.1\r\nContent-Length: %d\r\n%s"
                                   b"Connection: close\r\n\r\n%s" % (path, len(body), extra, body),
                                   10.0)
                assert answer.startswith(b"HTTP/1.1 "), (body[:300], answer[:300])
                status = int(answer.split()[1])
                statuses[status] = statuses.get(status, 0) + 1
                assert status == 200 or 400 <= status < 500, (body[:300], answer[:300])
    finally:
        logging.getLogger().removeHandler(errors)
        Path("/dev/shm" + key).unlink(missing_ok=True)
    assert statuses.get(200, 0) > 10 and statuses.get(400, 0) > 10, statuses
    assert errors.records == [], "\n----\n".join(errors.records[:3])
