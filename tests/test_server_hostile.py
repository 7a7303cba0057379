"""Hostile requests to the KServe v2 server: every shape/size problem is a 4xx before the
allocation it implies, JSON bodies are bounded by what the model can take, and refused
large bodies do not stay resident (issue 16)."""

from __future__ import annotations

import asyncio
import json
import os

import httpx
import pytest

from runtime_py.batcher import Batcher
from runtime_py.server import create_app
from runtime_py.server import protocol
from runtime_py.testing import ToyModel

pytest.importorskip("starlette")

HL = "Inference-Header-Content-Length"
MiB = 1024 * 1024


def serve(model: ToyModel, max_body: int):
    batcher = Batcher(model, max_delay_ms=1.0, max_queue=16)
    return batcher, create_app({model.name: model}, {model.name: batcher}, max_body_bytes=max_body)


async def post_all(app, bodies):
    """POST each (content, headers) in turn; the responses' (status, error or "")."""
    out = []
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t",
                                 timeout=60) as c:
        for content, headers in bodies:
            r = await c.post("/v2/models/toy/infer", content=content, headers=headers)
            out.append((r.status_code, r.json().get("error", "") if r.status_code >= 400 else ""))
            del r
    return out


@pytest.fixture
def toy():
    model = ToyModel(name="toy", max_batch_size=4)
    batcher, app = serve(model, 8 * MiB)
    yield app
    batcher.close(drain=False, timeout=10)


def _json(shape, data=None, **extra):
    item = {"name": "input", "shape": shape, "datatype": "FP32", "data": [] if data is None else data}
    return json.dumps({"inputs": [{**item, **extra}]}).encode(), {"Content-Type": "application/json"}


def _binary(shape, size):
    header = json.dumps({"inputs": [{"name": "input", "shape": shape, "datatype": "FP32",
                                     "parameters": {"binary_data_size": size}}]}).encode()
    return header + bytes(size), {HL: str(len(header))}


HUGE_SHAPES = {
    "huge int dim, empty data": _json([0, 10 ** 30, 8, 8]),
    "huge float dim, empty data": (b'{"inputs": [{"name": "input", "shape": [0, 1e30, 299, 299], '
                                   b'"datatype": "FP32", "data": []}]}', {}),
    "binary 1e20 dims": _binary([0, 10 ** 20, 10 ** 20, 10 ** 20], 0),
    "binary 2^31 dims": _binary([1, 2 ** 31 - 1, 2 ** 31 - 1, 2 ** 31 - 1], 0),
    "5000 dims": _json([1] * 5000),
    "5000 zero dims": _binary([0] * 5000, 0),
    "batch 0": _json([0, 3, 8, 8]),
    "batch over max": _json([5, 3, 8, 8], [0.0] * 5 * 192),
    "binary batch over max": _binary([5, 3, 8, 8], 5 * 192 * 4),
    "wrong fixed dim": _binary([1, 3, 8, 9], 3 * 8 * 9 * 4),
    "rank 3": _json([1, 3, 64]),
    "deep parameters": _json([1, 3, 8, 8], [0.0] * 192, parameters={"a": [[[[[[[[[1]]]]]]]]]}),
    "deep data": _json([1, 3, 8, 8], [[[[[[[[[0.0]]]]]]]]]),
    "too many values": _json([1, 3, 8, 8], [0] * 20_000),
}


@pytest.mark.parametrize("case", list(HUGE_SHAPES))
def test_hostile_shapes_are_400(toy, case):
    content, headers = HUGE_SHAPES[case]
    (status, error), = asyncio.run(post_all(toy, [(content, headers)]))
    assert status == 400, (status, error)
    assert error
    ok, = asyncio.run(post_all(toy, [_json([1, 3, 8, 8], [0.5] * 192)]))
    assert ok == (200, "")


def test_json_larger_than_the_model_needs_is_413(toy):
    limits = protocol.json_limits(ToyModel(max_batch_size=4).inputs, 4)
    assert limits.max_elements == 4 * 3 * 8 * 8 + 1024
    content = json.dumps({"inputs": [{"name": "input", "shape": [1, 3, 8, 8], "datatype": "FP32",
                                      "data": [0.5] * 192, "pad": "x" * limits.max_bytes}]}).encode()
    (status, error), = asyncio.run(post_all(toy, [(content, {})]))
    assert status == 413 and "binary" in error


def test_json_limits_follow_the_model():
    small = protocol.json_limits(ToyModel(size=8, max_batch_size=1).inputs, 1)
    big = protocol.json_limits(ToyModel(size=299, max_batch_size=32).inputs, 32)
    assert big.max_elements - 1024 == 32 * 3 * 299 * 299
    assert small.max_bytes < big.max_bytes
    assert small.max_depth == big.max_depth == 4 + 4


def test_json_depth_limit_is_exact_whatever_the_bracket_count():
    """``load_json`` walks a document only when it has more brackets than the depth limit
    (fewer cannot nest deeper); the limit itself is the same either way."""
    limits = protocol.json_limits(ToyModel(size=8, max_batch_size=1).inputs, 1)
    d = limits.max_depth

    def nested(levels: int, extra: str = "") -> bytes:
        return ("[" * (levels - 1) + "{" + extra + "}" + "]" * (levels - 1)).encode()
    assert protocol.load_json(nested(d), limits)                  # exactly d brackets, d deep
    with pytest.raises(protocol.RequestError, match="deeper"):
        protocol.load_json(nested(d + 1), limits)
    # brackets inside strings add to the count (a walk) but not to the depth
    assert protocol.load_json(nested(d, '"k": "[[[[{{{{"'), limits)
    # many shallow brackets: walked, and accepted
    wide = json.dumps({"outputs": [{"name": f"o{i}", "parameters": {}} for i in range(20)]})
    assert protocol.load_json(wide.encode(), limits)["outputs"][19]["name"] == "o19"


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs Linux /proc")
def test_rss_stays_bounded_under_refused_60mb_bodies():
    """10 refused 60 MB JSON bodies (parsed in the thread pool, then refused for their
    element count) leave RSS within 1.5x of what it was after two of them (~250 MiB here;
    a body kept with its parsed list is ~120 MB: two kept would cross the bound)."""
    model = ToyModel(name="toy", size=299, max_batch_size=32)
    batcher, app = serve(model, 64 * MiB)
    # 60 MB of JSON numbers, a shape of one image: parsed (it is within the model's
    # limits), then refused because it holds 7.5 M values, not 268,203.
    numbers = b"0,      " * (60 * MiB // 8)
    content = (b'{"inputs": [{"name": "input", "shape": [1, 3, 299, 299], "datatype": "FP32", '
               b'"data": [' + numbers + b'0]}]}')
    assert len(content) > 60 * MiB
    headers = {"Content-Type": "application/json"}
    try:
        async def storm():
            warm = await post_all(app, [(content, headers)] * 2)
            before = _rss()
            rest = await post_all(app, [(content, headers)] * 10)
            return warm + rest, before, _rss()
        answers, before, after = asyncio.run(storm())
    finally:
        batcher.close(drain=False, timeout=10)
    assert all(status == 400 and "elements" in error for status, error in answers), answers[:2]
    print(f"RSS {before / MiB:.0f} -> {after / MiB:.0f} MiB")
    assert after <= 1.5 * before, (f"RSS {before / MiB:.0f} MiB after warm-up, "
                                   f"{after / MiB:.0f} MiB after 10 more refused bodies")
