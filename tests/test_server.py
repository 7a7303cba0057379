"""The KServe v2 server: valid requests (JSON and binary tensors, classify, metadata,
metrics) and every malformed request answered with a 4xx and the protocol's error JSON,
after which the server still serves. One test runs a real server (uvicorn, and the built-in one) on loopback."""

from __future__ import annotations

import asyncio
import io
import json
import time

import httpx
import numpy as np
import pytest

from runtime_py.batcher import Batcher
from runtime_py.server import ServerThread, create_app
from runtime_py.testing import FAIL_VALUE, ToyModel

pytest.importorskip("starlette")

MAX_BODY = 64 * 1024
TIMEOUT = 10.0
HL = "Inference-Header-Content-Length"


class Served:
    """An app over one toy model, with helpers to run async requests against it."""

    def __init__(self, model: ToyModel, max_queue: int = 64, max_delay_ms: float = 1.0) -> None:
        self.model = model
        self.batcher = Batcher(model, max_delay_ms=max_delay_ms, max_queue=max_queue)
        self.app = create_app({model.name: model}, {model.name: self.batcher},
                              max_body_bytes=MAX_BODY)

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app),
                                 base_url="http://test", timeout=TIMEOUT)

    def run(self, fn):
        """Run ``await fn(client)`` and return its result."""
        async def main():
            async with self.client() as c:
                return await fn(c)
        return asyncio.run(main())

    def request(self, method: str, path: str, **kw) -> httpx.Response:
        return self.run(lambda c: c.request(method, path, **kw))


@pytest.fixture
def served():
    s = Served(ToyModel(name="toy"))
    yield s
    s.model.gate = None
    s.batcher.close(drain=False, timeout=TIMEOUT)


def image(seed: int, n: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).random((n, 3, 8, 8), dtype=np.float32)


def json_request(x: np.ndarray, **extra) -> dict:
    return {"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32",
                        "data": x.ravel().tolist()}], **extra}


def binary_body(x: np.ndarray, header_extra: dict | None = None, input_extra: dict | None = None):
    header = {"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32",
                          "parameters": {"binary_data_size": x.nbytes}, **(input_extra or {})}],
              **(header_extra or {})}
    h = json.dumps(header).encode()
    return h + x.astype("<f4").tobytes(), {HL: str(len(h))}


def split_binary_response(r: httpx.Response) -> tuple[dict, dict[str, np.ndarray]]:
    n = int(r.headers[HL])
    header = json.loads(r.content[:n])
    arrays, offset = {}, n
    for out in header["outputs"]:
        size = out["parameters"]["binary_data_size"]
        assert out["datatype"] == "FP32" and "data" not in out
        arrays[out["name"]] = np.frombuffer(r.content[offset:offset + size], "<f4").reshape(out["shape"])
        offset += size
    assert offset == len(r.content)
    return header, arrays


def png(size=(20, 14), color=(200, 30, 90)) -> bytes:
    from PIL import Image
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


def assert_still_serves(served: Served) -> None:
    x = image(1234)
    r = served.request("POST", "/v2/models/toy/infer", json=json_request(x))
    assert r.status_code == 200, r.text
    got = np.asarray(r.json()["outputs"][0]["data"], np.float32).reshape(1, 10)
    np.testing.assert_array_equal(got, served.model.reference(x))


# --- valid requests ---------------------------------------------------------------------

def test_health_and_metadata(served):
    assert served.request("GET", "/v2/health/live").status_code == 200
    r = served.request("GET", "/v2/health/ready")
    assert r.status_code == 200 and r.json() == {"ready": True}
    meta = served.request("GET", "/v2").json()
    assert meta["name"] == "trt-bundle" and "binary_tensor_data" in meta["extensions"]
    assert isinstance(meta["version"], str)
    expected = {"name": "toy", "versions": ["1"], "platform": "numpy",
                "inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 3, 8, 8]}],
                "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}]}
    assert served.request("GET", "/v2/models/toy").json() == expected
    assert served.request("GET", "/v2/models/toy/versions/1").json() == expected
    r = served.request("GET", "/v2/models/toy/ready")
    assert r.status_code == 200 and r.json() == {"name": "toy", "ready": True}
    assert served.request("GET", "/v2/models/toy/versions/1/ready").status_code == 200


def test_not_ready_after_close(served):
    served.batcher.close()
    assert served.request("GET", "/v2/health/ready").status_code == 400
    assert served.request("GET", "/v2/models/toy/ready").json()["ready"] is False
    r = served.request("POST", "/v2/models/toy/infer", json=json_request(image(0)))
    assert r.status_code == 503 and "closed" in r.json()["error"]


def test_json_infer_flat_and_nested(served):
    x = image(1, 3)
    for data in (x.ravel().tolist(), x.tolist()):
        body = {"id": "req-7", "parameters": {"note": "x"},
                "inputs": [{"name": "input", "shape": [3, 3, 8, 8], "datatype": "FP32", "data": data}],
                "outputs": [{"name": "logits"}]}
        r = served.request("POST", "/v2/models/toy/infer", json=body)
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith("application/json")
        out = r.json()
        assert out["id"] == "req-7" and out["model_name"] == "toy" and out["model_version"] == "1"
        [o] = out["outputs"]
        assert o["name"] == "logits" and o["datatype"] == "FP32" and o["shape"] == [3, 10]
        np.testing.assert_array_equal(np.asarray(o["data"], np.float32).reshape(3, 10),
                                      served.model.reference(x))
    # versioned path
    r = served.request("POST", "/v2/models/toy/versions/1/infer", json=json_request(x))
    assert r.status_code == 200


def test_binary_infer_round_trip_is_bit_exact(served):
    x = image(2, 5)
    direct = served.model.infer({"input": x})["logits"]
    body, headers = binary_body(x, {"id": "b1", "parameters": {"binary_data_output": True}})
    r = served.request("POST", "/v2/models/toy/infer", content=body, headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/octet-stream"
    header, arrays = split_binary_response(r)
    assert header["id"] == "b1"
    assert arrays["logits"].tobytes() == direct.astype("<f4").tobytes()


def test_binary_output_requested_per_output_and_json_output_for_binary_input(served):
    x = image(3, 2)
    # JSON in, binary out via the output's parameter
    r = served.request("POST", "/v2/models/toy/infer", json=json_request(
        x, outputs=[{"name": "logits", "parameters": {"binary_data": True}}]))
    _, arrays = split_binary_response(r)
    np.testing.assert_array_equal(arrays["logits"], served.model.reference(x))
    # binary in, JSON out (no binary_data requested)
    body, headers = binary_body(x)
    r = served.request("POST", "/v2/models/toy/infer", content=body, headers=headers)
    assert r.status_code == 200 and HL not in r.headers
    got = np.asarray(r.json()["outputs"][0]["data"], np.float32).reshape(2, 10)
    np.testing.assert_array_equal(got, served.model.reference(x))
    # binary_data_output overridden by the output's own binary_data=false
    body, headers = binary_body(x, {"parameters": {"binary_data_output": True},
                                    "outputs": [{"name": "logits", "parameters": {"binary_data": False}}]})
    r = served.request("POST", "/v2/models/toy/infer", content=body, headers=headers)
    assert "data" in r.json()["outputs"][0]


def test_concurrent_requests_are_batched(served):
    async def many(c):
        xs = [image(100 + i) for i in range(24)]
        rs = await asyncio.gather(*(c.post("/v2/models/toy/infer", json=json_request(x)) for x in xs))
        for x, r in zip(xs, rs):
            got = np.asarray(r.json()["outputs"][0]["data"], np.float32).reshape(1, 10)
            np.testing.assert_array_equal(got, served.model.reference(x))
    served.run(many)
    assert sum(served.model.calls) == 24


def test_classify(served):
    img = png()
    r = served.request("POST", "/v2/models/toy/classify?top_k=3", content=img,
                       headers={"Content-Type": "image/png"})
    assert r.status_code == 200, r.text
    preds = r.json()["predictions"]
    m = served.model
    expected = m.top_k(m.infer({"input": m.preprocess([img])})["logits"], 3)[0]
    assert [(p["index"], p["label"]) for p in preds] == [(i, lab) for i, lab, _ in expected]
    assert [p["score"] for p in preds] == pytest.approx([s for _, _, s in expected])
    assert preds[0]["score"] >= preds[1]["score"] >= preds[2]["score"]
    # default top_k is 5; no Content-Type is accepted
    r = served.request("POST", "/v2/models/toy/classify", content=img)
    assert len(r.json()["predictions"]) == 5


def test_metrics(served):
    served.request("POST", "/v2/models/toy/infer", json=json_request(image(0)))
    served.request("POST", "/v2/models/toy/infer", content=b"{")
    served.request("POST", "/v2/models/nope/infer", json={})
    r = served.request("GET", "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    assert 'trt_bundle_requests_total{endpoint="infer",model="toy",status="200"} 1.0' in text
    assert 'trt_bundle_requests_total{endpoint="infer",model="toy",status="400"} 1.0' in text
    assert 'trt_bundle_errors_total{endpoint="infer",kind="not_found",model="_unknown"} 1.0' in text
    assert 'trt_bundle_batch_size_count{model="toy"} 1.0' in text
    assert 'trt_bundle_queue_seconds_count{model="toy"} 1.0' in text
    assert 'trt_bundle_compute_seconds_count{model="toy"} 1.0' in text


# --- malformed requests -----------------------------------------------------------------

X = image(5)
GOOD_INPUT = {"name": "input", "shape": [1, 3, 8, 8], "datatype": "FP32", "data": X.ravel().tolist()}


def with_input(**changes) -> dict:
    return {"inputs": [{**GOOD_INPUT, **changes}]}


MALFORMED_JSON = [
    ("bad json", b'{"inputs": [', "not valid JSON"),
    ("not utf-8", b'\xff\xfe{', "not valid JSON"),
    ("deep nesting", b"[" * 20_000 + b"]" * 20_000, "not valid JSON"),
    ("not an object", b"[1, 2]", "JSON object"),
    ("no inputs", b"{}", "'inputs'"),
    ("empty inputs", b'{"inputs": []}', "'inputs'"),
    ("id not a string", json.dumps({**with_input(), "id": 5}).encode(), "'id'"),
    ("data length", json.dumps(with_input(data=[1.0] * 191)).encode(), "191 elements"),
    ("shape not ints", json.dumps(with_input(shape=[1, 3, 8, "8"])).encode(), "'shape'"),
    ("negative dim", json.dumps(with_input(shape=[-1, 3, 8, 8])).encode(), "'shape'"),
    ("unknown datatype", json.dumps(with_input(datatype="FLOAT")).encode(), "unknown datatype"),
    ("BYTES datatype", json.dumps(with_input(datatype="BYTES")).encode(), "BYTES"),
    ("datatype list", json.dumps(with_input(datatype=["FP32"])).encode(), "unknown datatype"),
    ("wrong datatype", json.dumps(with_input(datatype="FP64")).encode(), "model takes FP32"),
    ("wrong input name", json.dumps(with_input(name="pixels")).encode(), "unknown input 'pixels'"),
    ("duplicate input", json.dumps({"inputs": [GOOD_INPUT, GOOD_INPUT]}).encode(), "more than once"),
    ("non-batch dims", json.dumps(with_input(shape=[3, 1, 8, 8])).encode(), "does not match"),
    ("rank", json.dumps(with_input(shape=[192])).encode(), "dimensions"),
    ("zero batch", json.dumps(with_input(shape=[0, 3, 8, 8], data=[])).encode(), "batch size is 0"),
    ("string data", json.dumps(with_input(data=["a"] * 192)).encode(), "string"),
    ("null data", json.dumps(with_input(data=[None] * 192)).encode(), "null"),
    ("ragged data", json.dumps(with_input(data=[[1.0], [1.0, 2.0]])).encode(), "regular"),
    ("no data", json.dumps(with_input(data=None) | {"inputs": [{k: v for k, v in GOOD_INPUT.items() if k != "data"}]}).encode(), "neither"),
    ("unknown output", json.dumps({**with_input(), "outputs": [{"name": "probs"}]}).encode(), "unknown output"),
    ("outputs not a list", json.dumps({**with_input(), "outputs": {"name": "logits"}}).encode(), "'outputs'"),
    ("binary_data not bool", json.dumps({**with_input(), "outputs": [{"name": "logits", "parameters": {"binary_data": "yes"}}]}).encode(), "boolean"),
    ("parameters not object", json.dumps({**with_input(), "parameters": [1]}).encode(), "'parameters'"),
]


@pytest.mark.parametrize("body, message", [c[1:] for c in MALFORMED_JSON],
                         ids=[c[0] for c in MALFORMED_JSON])
def test_malformed_json_requests(served, body, message):
    r = served.request("POST", "/v2/models/toy/infer", content=body,
                       headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    assert message in r.json()["error"]
    assert_still_serves(served)


def _binary_case(name):
    x = image(6)
    body, headers = binary_body(x)
    n = int(headers[HL])
    if name == "size differs from shape":
        body, headers = binary_body(x, input_extra={"parameters": {"binary_data_size": x.nbytes - 4}})
        return body[:-4], headers, "needs 768"
    if name == "extra bytes":
        return body + b"\0" * 4, headers, "add up to 768"
    if name == "missing bytes":
        return body[:-4], headers, "only 764 bytes"
    if name == "header length too big":
        return body, {HL: str(len(body) + 1)}, HL
    if name == "header length not a number":
        return body, {HL: "abc"}, HL
    if name == "header length cuts the JSON":
        return body, {HL: str(n - 3)}, "not valid JSON"
    if name == "data and binary":
        body, headers = binary_body(x, input_extra={"data": [0.0] * 192})
        return body, headers, "not both"
    if name == "negative binary size":
        body, headers = binary_body(x, input_extra={"parameters": {"binary_data_size": -1}})
        return body, headers, "non-negative"
    raise AssertionError(name)


BINARY_CASES = ["size differs from shape", "extra bytes", "missing bytes", "header length too big",
                "header length not a number", "header length cuts the JSON", "data and binary",
                "negative binary size"]


@pytest.mark.parametrize("case", BINARY_CASES)
def test_malformed_binary_requests(served, case):
    body, headers, message = _binary_case(case)
    r = served.request("POST", "/v2/models/toy/infer", content=body, headers=headers)
    assert r.status_code == 400, r.text
    assert message in r.json()["error"]
    assert_still_serves(served)


def test_unknown_model_and_version_are_404(served):
    for method, path in [("GET", "/v2/models/nope"), ("GET", "/v2/models/nope/ready"),
                         ("POST", "/v2/models/nope/infer"), ("GET", "/v2/models/toy/versions/9"),
                         ("POST", "/v2/models/toy/versions/9/infer"), ("GET", "/v2/nothing")]:
        r = served.request(method, path, json=json_request(X) if method == "POST" else None)
        assert r.status_code == 404, (path, r.text)
        assert "error" in r.json()
    r = served.request("GET", "/v2/models/toy/infer")
    assert r.status_code == 405 and "error" in r.json()
    assert_still_serves(served)


def test_oversized_body_refused_by_content_length_before_reading(served):
    """Raw ASGI: the app must answer 413 without ever asking for the body."""
    sent = []

    async def receive():
        raise AssertionError("the body was read")

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": "/v2/models/toy/infer", "raw_path": b"/v2/models/toy/infer",
             "query_string": b"", "root_path": "", "server": ("test", 80), "client": ("c", 1),
             "headers": [(b"host", b"test"), (b"content-length", str(MAX_BODY + 1).encode())]}
    asyncio.run(served.app(scope, receive, send))
    assert sent[0]["status"] == 413
    assert b"exceeds the limit" in sent[1]["body"]
    assert_still_serves(served)


def test_oversized_streamed_body_refused_while_reading(served):
    chunks_sent = []

    async def chunks():   # no Content-Length: a streamed body larger than the limit
        for _ in range(8):
            chunks_sent.append(1)
            yield b"x" * (MAX_BODY // 4)

    r = served.request("POST", "/v2/models/toy/infer", content=chunks())
    assert r.status_code == 413 and "exceeds the limit" in r.json()["error"]
    assert len(chunks_sent) < 8, "the app kept reading past the limit"
    r = served.request("POST", "/v2/models/toy/classify", content=b"x" * (MAX_BODY + 1))
    assert r.status_code == 413
    assert_still_serves(served)


def test_malformed_classify_requests(served):
    cases = [
        ({"content": b"not an image", "headers": {"Content-Type": "image/jpeg"}}, 400, "cannot decode"),
        ({"content": b""}, 400, "empty body"),
        ({"content": png(), "params": {"top_k": "0"}}, 400, "top_k"),
        ({"content": png(), "params": {"top_k": "five"}}, 400, "top_k"),
        ({"content": png(), "headers": {"Content-Type": "application/json"}}, 415, "image/*"),
    ]
    for kw, status, message in cases:
        r = served.request("POST", "/v2/models/toy/classify", **kw)
        assert r.status_code == status, r.text
        assert message in r.json()["error"]
    assert_still_serves(served)


def test_model_failure_is_a_500_for_that_request_only(served):
    bad = image(7)
    bad[0, 0, 0, 0] = FAIL_VALUE

    async def both(c):
        return await asyncio.gather(
            c.post("/v2/models/toy/infer", json=json_request(bad)),
            c.post("/v2/models/toy/infer", json=json_request(image(8))))
    r_bad, r_good = served.run(both)
    assert r_bad.status_code == 500 and "ToyModelError" in r_bad.json()["error"]
    assert r_good.status_code == 200
    assert_still_serves(served)


def test_queue_full_is_503(served):
    s = Served(ToyModel(name="toy"), max_queue=1)
    s.model.gate = __import__("threading").Event()

    async def scenario(c):
        first = asyncio.create_task(c.post("/v2/models/toy/infer", json=json_request(image(1))))
        deadline = time.monotonic() + TIMEOUT
        while not s.model.calls:           # the worker is now blocked inside infer
            assert time.monotonic() < deadline
            await asyncio.sleep(0.001)
        second = asyncio.create_task(c.post("/v2/models/toy/infer", json=json_request(image(2))))
        while s.batcher.queue_length < 1:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.001)
        third = await c.post("/v2/models/toy/infer", json=json_request(image(3)))
        s.model.gate.set()
        return third, await first, await second

    try:
        third, first, second = s.run(scenario)
    finally:
        s.model.gate.set()
        s.batcher.close()
    assert third.status_code == 503 and "queue is full" in third.json()["error"]
    assert first.status_code == 200 and second.status_code == 200


# --- a real server on loopback ----------------------------------------------------------

@pytest.mark.parametrize("http_server", ["uvicorn", "builtin"])
def test_loopback(served, http_server):
    with ServerThread(served.app, host="127.0.0.1", port=0, http_server=http_server) as srv:
        assert srv.port and srv.port > 0
        with httpx.Client(base_url=srv.url, timeout=TIMEOUT) as c:
            assert c.get("/v2/health/live").status_code == 200
            x = image(9, 4)
            body, headers = binary_body(x, {"parameters": {"binary_data_output": True}})
            r = c.post("/v2/models/toy/infer", content=body, headers=headers)
            _, arrays = split_binary_response(r)
            assert arrays["logits"].tobytes() == served.model.infer({"input": x})["logits"].tobytes()
            assert c.post("/v2/models/toy/infer", content=b"{oops").status_code == 400
            r = c.post("/v2/models/toy/infer", content=b"x" * (MAX_BODY + 1))
            assert r.status_code == 413
        with httpx.Client(base_url=srv.url, timeout=TIMEOUT) as c:   # a fresh connection
            r = c.post("/v2/models/toy/classify?top_k=2", content=png(),
                       headers={"Content-Type": "image/png"})
            assert r.status_code == 200 and len(r.json()["predictions"]) == 2
            assert "trt_bundle_requests_total" in c.get("/metrics").text
    assert not srv._thread.is_alive()


def test_deliberate_refusals_are_answered_not_logged_as_failures():
    """A full queue, a closing batcher or a 503 the server raises on purpose (an engine
    process gone at shutdown) are refusals; only unexpected exceptions are faults whose
    tracebacks go to the log."""
    from runtime_py.errors import BatcherClosedError, QueueFullError
    from runtime_py.server.engine import is_server_fault, status_of
    from runtime_py.server.protocol import RequestError

    for exc in (RequestError("the engine process is gone", 503), QueueFullError("full"),
                BatcherClosedError("closed"), RequestError("bad shape", 400)):
        assert not is_server_fault(exc, status_of(exc)), exc
    bug = RuntimeError("boom")
    assert status_of(bug) == 500 and is_server_fault(bug, 500)
