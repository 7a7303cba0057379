"""The bare ASGI inference route (``infer_route``): bodies in any number of chunks, the
pooled body buffers reused without mixing requests up, errors and metrics as before, and
every other route still Starlette's."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

pytest.importorskip("starlette")

from starlette.requests import ClientDisconnect  # noqa: E402

from runtime_py.server.infer_route import BufferPool, read_body  # noqa: E402
from runtime_py.server.protocol import RequestError  # noqa: E402
from test_server import Served, binary_body, image, split_binary_response  # noqa: E402
from runtime_py.testing import ToyModel  # noqa: E402


def _receiver(chunks: list[bytes], disconnect: bool = False):
    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
                for i, c in enumerate(chunks)]
    if disconnect:
        messages[-1]["more_body"] = True
        messages.append({"type": "http.disconnect"})
    it = iter(messages)

    async def receive():
        return next(it)
    return receive


@pytest.mark.parametrize("declared", [True, False])
@pytest.mark.parametrize("sizes", [[10], [3, 0, 7], [1] * 10, [0, 10]])
def test_body_is_reassembled_from_any_chunks(sizes, declared):
    data = bytes(range(sum(sizes)))
    chunks, pos = [], 0
    for n in sizes:
        chunks.append(data[pos:pos + n])
        pos += n
    pool = BufferPool()
    got = asyncio.run(read_body(_receiver(chunks), str(len(data)).encode() if declared else None,
                                limit=100, pool=pool))
    assert bytes(got) == data


def test_body_limits_and_disconnect():
    with pytest.raises(RequestError) as e:
        asyncio.run(read_body(_receiver([b"x" * 5]), b"500", limit=100))
    assert e.value.status == 413
    with pytest.raises(RequestError) as e:
        asyncio.run(read_body(_receiver([b"x" * 60, b"x" * 60]), None, limit=100))
    assert e.value.status == 413
    with pytest.raises(RequestError, match="Content-Length"):
        asyncio.run(read_body(_receiver([b"x"]), b"abc", limit=100))
    with pytest.raises(ClientDisconnect):
        asyncio.run(read_body(_receiver([b"x" * 3], disconnect=True), b"10", limit=100))


def test_pool_reuses_buffers_of_a_size_within_its_bound():
    pool = BufferPool(max_bytes=25)
    a = pool.get(10)
    pool.put(a)
    assert pool.get(10) is a
    pool.put(a)
    pool.put(bytearray(10))
    pool.put(bytearray(10))   # over the bound: dropped
    assert pool.held == 20


def test_concurrent_binary_requests_through_pooled_buffers_get_their_own_results():
    s = Served(ToyModel(name="toy"))
    try:
        xs = [image(500 + i, 1 + i % 3) for i in range(40)]

        async def many(c):
            async def one(x):
                body, headers = binary_body(x, {"parameters": {"binary_data_output": True}})
                return await c.post("/v2/models/toy/infer", content=body, headers=headers)
            out = []
            for k in range(0, len(xs), 10):   # rounds: buffers go back to the pool between
                out += await asyncio.gather(*(one(x) for x in xs[k:k + 10]))
            return out

        for x, r in zip(xs, s.run(many)):
            assert r.status_code == 200, r.text
            _, arrays = split_binary_response(r)
            np.testing.assert_array_equal(arrays["logits"], s.model.reference(x))
        assert max(s.model.calls) > 1
    finally:
        s.batcher.close(drain=False, timeout=10)


def test_other_methods_and_routes_are_still_starlettes():
    s = Served(ToyModel(name="toy"))
    try:
        r = s.request("GET", "/v2/models/toy/infer")
        assert r.status_code == 405 and "error" in r.json()
        r = s.request("POST", "/v2/models/nope/infer", content=b"{}")
        assert r.status_code == 404 and "nope" in r.json()["error"]
        r = s.request("POST", "/v2/models/toy/versions/9/infer", content=b"{}")
        assert r.status_code == 404 and "version" in r.json()["error"]
        metrics = s.request("GET", "/metrics").text
        assert 'model="_unknown"' in metrics and 'endpoint="infer"' in metrics
    finally:
        s.batcher.close(drain=False, timeout=10)
