"""Page-locking host memory in place (``runtime_py.pinned_host``), with a stand-in for the
CUDA runtime that records its calls (the real one: the GPU test
``test_gpu_rows_are_copied_to_the_device_where_they_lie``)."""

from __future__ import annotations

import mmap

import numpy as np

from runtime_py import pinned_host
from runtime_py.server.engine import Engine


class RecordingRuntime:
    """The two calls ``pinned_host`` makes of ``cudart_held.CudartHeld``."""

    def __init__(self, refuse: bool = False) -> None:
        self.calls: list[tuple] = []
        self.refuse = refuse

    def host_register(self, address: int, nbytes: int) -> None:
        self.calls.append(("register", address, nbytes))
        if self.refuse:
            raise RuntimeError("cudaHostRegister failed: CUDA error 1 (invalid argument)")

    def host_unregister(self, address: int) -> None:
        self.calls.append(("unregister", address))


def test_a_pinned_range_holds_arrays_inside_it_until_unpinned():
    buf = mmap.mmap(-1, 1 << 16)
    runtime = RecordingRuntime()
    address = pinned_host.buffer_address(buf)
    region = pinned_host.pin(address, 1 << 15, runtime)      # the first half
    try:
        inside = np.frombuffer(buf, np.uint8, 4096, 8192)
        straddling = np.frombuffer(buf, np.uint8, 4096, (1 << 15) - 100)
        assert pinned_host.holds(inside)
        assert pinned_host.holds(inside.reshape(64, 64)[::2])    # a strided view inside
        assert not pinned_host.holds(straddling)                 # runs past the range
        assert not pinned_host.holds(np.zeros(16, np.uint8))     # elsewhere
        assert runtime.calls == [("register", address, 1 << 15)]
    finally:
        region.unpin()
        region.unpin()                                           # idempotent
    assert runtime.calls[1:] == [("unregister", address)]
    assert not pinned_host.holds(inside)
    del inside, straddling
    buf.close()                      # buffer_address kept no export: the mmap closes


def test_holds_finds_the_range_among_many_pinned_in_any_order():
    """As a server with 64 shared-memory clients has them: many ranges, pinned and unpinned
    in any order (``holds`` bisects the sorted starts). Inside each: held; across two
    adjacent ranges, in a gap, before the first or after the last: not held."""
    import random

    page, count = 4096, 40
    buf = mmap.mmap(-1, page * (2 * count + 2))
    base = pinned_host.buffer_address(buf)
    runtime = RecordingRuntime()
    # ranges of one page at pages 1, 3, 5, ... and two adjacent ones at the end
    slots = [1 + 2 * i for i in range(count - 2)] + [2 * count - 3, 2 * count - 2]
    order = list(range(len(slots)))
    random.Random(0).shuffle(order)
    regions = {i: pinned_host.pin(base + slots[i] * page, page, runtime) for i in order}
    try:
        def at(page_no, offset=0, n=256):
            return np.frombuffer(buf, np.uint8, n, page_no * page + offset)

        assert all(pinned_host.holds(at(p, 100)) for p in slots)
        assert all(pinned_host.holds(at(p, 0, page)) for p in slots)      # the whole page
        assert not pinned_host.holds(at(0))                               # before the first
        assert not pinned_host.holds(at(2))                               # a gap
        assert not pinned_host.holds(at(slots[5], page - 100))            # runs into a gap
        assert not pinned_host.holds(at(2 * count - 3, page - 100))       # across adjacent
        assert not pinned_host.holds(at(2 * count - 1))                   # after the last
        for i in order[::2]:                                              # unpin half
            regions.pop(i).unpin()
        assert [pinned_host.holds(at(slots[i], 8)) for i in range(len(slots))] == [
            i in regions for i in range(len(slots))]
    finally:
        for region in regions.values():
            region.unpin()
    assert not pinned_host.holds(at(slots[0]))
    buf.close()


def test_a_refused_or_missing_runtime_pins_nothing():
    buf = bytearray(4096)
    address = pinned_host.buffer_address(buf)
    assert pinned_host.pin(address, 4096, RecordingRuntime(refuse=True)) is None
    assert pinned_host.pin(address, 0, RecordingRuntime()) is None
    assert not pinned_host.holds(np.frombuffer(buf, np.uint8))


def test_the_engine_pins_through_the_first_model_that_takes_it():
    class Cpu:          # an engine without device copies: no pin_host, or None
        def pin_host(self, address, nbytes):
            return None

    class Gpu:
        def __init__(self):
            self.asked = []

        def pin_host(self, address, nbytes):
            self.asked.append((address, nbytes))
            return ("range", address, nbytes)

    gpu = Gpu()
    engine = Engine.__new__(Engine)       # only ``models`` matters to pin_host
    engine.models = {"a": Cpu(), "b": object(), "c": gpu, "d": Gpu()}
    assert engine.pin_host(4096, 8192) == ("range", 4096, 8192)
    assert gpu.asked == [(4096, 8192)] and not engine.models["d"].asked
    engine.models = {"a": Cpu()}
    assert engine.pin_host(4096, 8192) is None


def test_a_shared_memory_region_is_page_locked_until_its_last_view_is_gone(tmp_path):
    """``ShmRegistry(pin=...)``: a registered region's mapping is page-locked (its inputs
    are then read by the device where they lie); unregistering while a request still
    holds a view keeps the lock until that view is gone, then unlocks before unmapping."""
    import gc
    import uuid

    from runtime_py.server.shm import ShmRef, ShmRegistry

    runtime = RecordingRuntime()
    registry = ShmRegistry(pin=lambda address, nbytes: pinned_host.pin(address, nbytes, runtime))
    key = f"trt-bundle-test-{uuid.uuid4().hex[:12]}"
    path = f"/dev/shm/{key}"
    with open(path, "wb") as f:
        f.write(np.arange(64, dtype=np.float32).tobytes())
    try:
        registry.register("r", key, 0, 256)
        assert [c[0] for c in runtime.calls] == ["register"] and runtime.calls[0][2] == 256
        x = registry.read(ShmRef("r", 16, 32), np.dtype(np.float32), [8], "input 'x'")
        assert np.array_equal(x, np.arange(4, 12, dtype=np.float32))
        assert pinned_host.holds(x)
        registry.unregister("r")
        gc.collect()
        assert [c[0] for c in runtime.calls] == ["register"]     # x is still in flight
        del x
        gc.collect()
        assert [c[0] for c in runtime.calls] == ["register", "unregister"]
        assert runtime.calls[1][1] == runtime.calls[0][1]
    finally:
        import os
        os.unlink(path)


def test_a_batchs_copies_come_from_pinned_pieces_in_place_and_the_rest_through_staging():
    """``TorchAotiRunner._row_sources`` (the held enqueue path's copy list): rows in a pinned
    range are copied from where they lie, side-by-side pieces as one copy; a piece outside
    every range, or a strided view inside one, is first written into the slot's staging
    rows at its place in the batch."""
    from types import SimpleNamespace

    from runtime_py.engines.torch_aoti import TorchAotiRunner, _Slot
    from runtime_py.hostcopy import HostBufferRegistry

    row = 64
    buf = mmap.mmap(-1, 1 << 16)
    region = pinned_host.pin(pinned_host.buffer_address(buf), 1 << 15, RecordingRuntime())
    try:
        arena = np.frombuffer(buf, np.uint8, 1 << 15).reshape(-1, row)
        elsewhere = np.arange(2 * row, dtype=np.uint8).reshape(2, row)
        strided = np.frombuffer(buf, np.uint8, 4 * row, 4096).reshape(2, 2 * row)[:, :row]
        slot = _Slot()
        slot.host_in_array = np.zeros((16, row), np.uint8)
        runner = SimpleNamespace(_pinned=HostBufferRegistry())
        parts = [arena[0:2], arena[2:5], elsewhere, strided, arena[10:11]]
        sources = TorchAotiRunner._row_sources(runner, slot, parts)

        def address(a):
            return a.__array_interface__["data"][0]

        staging = address(slot.host_in_array)
        assert sources == [(address(arena), 5 * row),                 # two pieces, one copy
                           (staging + 5 * row, 4 * row),               # rows 5-8, staged
                           (address(arena[10:11]), row)]
        assert (slot.host_in_array[5:7] == elsewhere).all()
        assert (slot.host_in_array[7:9] == strided).all()
        del arena, strided, parts
    finally:
        region.unpin()
    buf.close()
