"""The engine process's side of the front-end workers (``workers.EngineHost``): an infer
message answered from the batcher future's done-callback, without a task per request."""

import asyncio
import mmap

import numpy as np

from runtime_py.batcher import Batcher
from runtime_py.server.engine import Engine
from runtime_py.server.workers import EngineHost, _messages, _Worker
from runtime_py.testing import FAIL_VALUE, ToyModel

SIZE = 8
ROW = 3 * SIZE * SIZE * 4


def _infer_msg(i: int, model: str = "toy", offset: int = 0) -> dict:
    return {"op": "infer", "id": i, "model": model, "version": None,
            "feeds": [["input", "float32", [1, 3, SIZE, SIZE], ["arena", offset]]],
            "shm_in": [], "outputs": [["logits", True]], "shm_out": []}


def test_infer_messages_of_one_turn_are_answered_in_one_frame_with_each_requests_outputs():
    model = ToyModel("toy", size=SIZE, max_batch_size=8)
    frames: list[list[dict]] = []

    class Conn:
        def send_bytes(self, data: bytes) -> None:
            frames.append(_messages(data))

    arena = mmap.mmap(-1, 8 * ROW)
    rows = np.random.default_rng(0).random((5, 3, SIZE, SIZE), dtype=np.float32)
    rows[3, 0, 0, 0] = FAIL_VALUE            # the model refuses this row: request 3 fails
    np.frombuffer(arena, np.float32)[:rows.size] = rows.ravel()
    with Batcher(model, max_batch_size=8, max_delay_ms=50) as batcher:
        engine = Engine({"toy": model}, {"toy": batcher})
        host = EngineHost(engine)
        w = _Worker(0, None, Conn(), arena)

        async def main():
            w.outbox.bind(asyncio.get_running_loop())
            futures = [host.start_infer(w, _infer_msg(i, offset=i * ROW)) for i in range(3)]
            refused = host.start_infer(w, _infer_msg(9, model="nope"))
            assert refused is None
            await asyncio.gather(*futures)
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            failing = host.start_infer(w, _infer_msg(3, offset=3 * ROW))
            await asyncio.gather(failing, return_exceptions=True)
            await asyncio.sleep(0)
            await asyncio.sleep(0)
        asyncio.run(main())
        stats = asyncio.run(engine.stats("toy"))["model_stats"][0]["inference_stats"]
        engine.close()
    # the unknown model is refused at once, in the first frame
    replies = {m["id"]: m for f in frames for m in f}
    assert replies[9]["ok"] is False and replies[9]["status"] == 404
    # the three requests of one turn, one batch: their replies share one frame
    ok_frames = [f for f in frames if any(m["id"] in (0, 1, 2) for m in f)]
    assert len(ok_frames) == 1 and sorted(m["id"] for m in ok_frames[0]) == [0, 1, 2]
    for i in range(3):
        (name, dtype, shape, data, ref), = replies[i]["outputs"]
        got = np.frombuffer(data, dtype).reshape(shape)
        assert name == "logits" and ref is None
        assert np.array_equal(got, model.reference(rows[i:i + 1]))
    assert replies[3]["ok"] is False and replies[3]["status"] == 500
    assert "fail" in replies[3]["message"]
    assert stats["success"]["count"] == 3 and stats["fail"]["count"] == 1


def test_a_message_msgpack_cannot_carry_is_refused_alone_and_the_frame_goes_out():
    """An integer beyond 64 bits (a client's JSON may hold one) or a lone surrogate is
    refused when the message is put, in its sender's code; the other messages of the turn
    still go out in one frame. Packed at the flush, the whole frame failed in a loop
    callback and every request of that turn hung (found by tests/test_fuzz_protocols.py's
    kind of input: a shared-memory register with a 2**64 offset, through a worker)."""
    import pytest

    from runtime_py.server.workers import UNPACKABLE, _Outbox

    frames: list[list[dict]] = []

    async def turn() -> None:
        box = _Outbox(lambda data: frames.append(_messages(data)), lambda msgs: None)
        box.bind(asyncio.get_running_loop())
        box.put({"id": 1, "op": "ready"})
        with pytest.raises(UNPACKABLE):
            box.put({"id": 2, "op": "shm_register", "args": ["r", "/k", 2**64, 16]})
        with pytest.raises(UNPACKABLE):
            box.put({"id": 3, "op": "shm_register", "args": ["r", "\ud800", 0, 16]})
        box.put({"id": 4, "op": "ready"})
        await asyncio.sleep(0)                  # the end of the turn: one frame

    asyncio.run(turn())
    assert frames == [[{"id": 1, "op": "ready"}, {"id": 4, "op": "ready"}]]
