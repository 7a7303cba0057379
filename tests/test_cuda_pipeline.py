"""The TensorRT runner's data path (runtime_py/engines/cuda_pipeline.py) on a CPU stand-in
for the CUDA runtime (tests/cuda_runtime_standin.py: stream work runs in order and as late
as CUDA allows, so reusing a host buffer too early gives wrong bytes). The same pipeline on
a real GPU: tests/test_cuda_buffers.py (cuda-python and a GPU); inside the TensorRT runner:
tests/test_tensorrt.py (TensorRT).
"""

from __future__ import annotations

import gc

import numpy as np
import pytest

from cuda_runtime_standin import standin_cuda
from runtime_py.engines.cuda_pipeline import CudaPipeline, IOSpec

ROW = (3, 4)
MAX = 8


def identity_pipeline(max_rows: int = MAX):
    """A pipeline whose "engine" copies its static input to its static output (a device
    copy on the compute stream), plus 1 per element where ``bump`` says."""
    cuda = standin_cuda()
    rt = cuda.rt
    stream = cuda.check(rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking), "stream")
    nbytes = max_rows * int(np.prod(ROW)) * 4
    static_in = cuda.check(rt.cudaMalloc(nbytes), "in")
    static_out = cuda.check(rt.cudaMalloc(nbytes), "out")
    io = [IOSpec("x", True, np.float32, ROW, static_in, max_rows),
          IOSpec("y", False, np.float32, ROW, static_out, max_rows)]
    pipe = CudaPipeline(cuda, stream, io)

    def compute(n: int):
        cuda.check(rt.cudaMemcpyAsync(static_out, static_in, n * int(np.prod(ROW)) * 4,
                                      rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice, stream), "engine")
        return {"y": (n, *ROW)}

    return pipe, compute, rt


def batch(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, *ROW)).astype(np.float32)


def test_batches_in_flight_come_back_in_order_with_their_own_outputs():
    """Many batches of mixed sizes enqueued two ahead of their results: each result is its
    own batch (the identity engine), although the stand-in runs every copy as late as it
    may."""
    pipe, compute, _rt = identity_pipeline()
    sizes = [1, 8, 3, 8, 5, 2, 7, 8, 1, 4]
    feeds = [batch(i, n) for i, n in enumerate(sizes)]
    pending = []
    for i, x in enumerate(feeds):
        pending.append(pipe.enqueue({"x": x}, len(x), compute))
        if i >= 2:       # read results two behind, as the batcher does
            np.testing.assert_array_equal(pending[i - 2].result()["y"], feeds[i - 2])
    for i in (len(feeds) - 2, len(feeds) - 1):
        np.testing.assert_array_equal(pending[i].result()["y"], feeds[i])
    pipe.close()


def test_a_slot_is_read_out_before_it_is_reused():
    """Results never asked for are read out when their slot comes round again, and stay
    right: the third batch reuses the first batch's slot."""
    pipe, compute, _rt = identity_pipeline()
    xs = [batch(10 + i, 4) for i in range(5)]
    pending = [pipe.enqueue({"x": x}, 4, compute) for x in xs]
    for p, x in zip(pending, xs):
        np.testing.assert_array_equal(p.result()["y"], x)
    pipe.close()


def test_pinned_feeds_are_copied_in_place_and_others_through_the_staging():
    """A feed in memory from allocate_host is the H2D copy's source itself (no host copy);
    a plain array is copied into the slot's pinned staging first. The stand-in runs the H2D
    late, so a pinned feed rewritten before result() shows the new bytes: the documented
    contract (keep feeds unchanged until result()) is real."""
    pipe, compute, rt = identity_pipeline()
    h2d = rt.cudaMemcpyKind.cudaMemcpyHostToDevice
    buf = pipe.allocate_host((MAX, *ROW), np.float32)
    buf[:3] = batch(1, 3)
    first = buf[:3].copy()
    p = pipe.enqueue({"x": buf[:3]}, 3, compute)
    np.testing.assert_array_equal(p.result()["y"], first)
    src = [c[1] for c in rt.copies if c[3] == h2d][-1]
    assert src == buf.__array_interface__["data"][0]

    plain = batch(2, 3)
    p = pipe.enqueue({"x": plain}, 3, compute)
    np.testing.assert_array_equal(p.result()["y"], plain)
    src = [c[1] for c in rt.copies if c[3] == h2d][-1]
    assert src != plain.__array_interface__["data"][0]

    buf[:2] = 1.0
    p = pipe.enqueue({"x": buf[:2]}, 2, compute)
    buf[:2] = 2.0                        # before result(): the late H2D reads this
    assert (p.result()["y"] == 2.0).all()
    pipe.close()


def test_a_strided_view_of_pinned_memory_goes_through_the_staging():
    pipe, compute, rt = identity_pipeline()
    buf = pipe.allocate_host((MAX, *ROW), np.float32)
    buf[...] = batch(3, MAX)
    view = buf[::2]                      # not contiguous: cannot be one copy
    assert pipe.pinned_pointer(view) is None
    np.testing.assert_array_equal(pipe.enqueue({"x": view}, 4, compute).result()["y"], view)
    pipe.close()


def test_an_output_larger_than_its_buffer_is_refused():
    pipe, _compute, _rt = identity_pipeline()
    with pytest.raises(ValueError, match="larger than its buffer"):
        pipe.enqueue({"x": batch(4, 2)}, 2, lambda n: {"y": (MAX + 1, *ROW)})
    pipe.close()


def test_close_frees_the_slots_and_pinned_buffers_go_with_their_arrays():
    pipe, compute, rt = identity_pipeline()
    buf = pipe.allocate_host((2, *ROW), np.float32)
    ptr = buf.__array_interface__["data"][0]
    pending = pipe.enqueue({"x": batch(5, 2)}, 2, compute)
    owned = [p for _kind, p in pipe._owned if isinstance(p, int)]
    pipe.close()                         # reads out the batch in flight first
    np.testing.assert_array_equal(pending.result()["y"], batch(5, 2))
    assert set(owned) <= set(rt.freed) and rt.live_events == 0
    assert ptr not in rt.freed
    view = buf[1:]
    del buf
    gc.collect()
    assert ptr not in rt.freed           # a view still holds it
    del view
    gc.collect()
    assert ptr in rt.freed
