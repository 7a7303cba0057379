"""The cuda-python layer of the TensorRT runner (no TensorRT needed, a GPU is).

Checks the calls `runtime_py.engines.tensorrt` makes for memory, copies, streams and CUDA
graph capture/launch, so that the part of the runner that is not TensorRT's API is run
for real wherever cuda-python and a GPU exist. Skipped elsewhere, with the reason.
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

pytest.importorskip("cuda.bindings", reason="cuda-python is not installed (pip install cuda-python)")

from runtime_py.compat import probe_host  # noqa: E402

if not probe_host().gpus:
    pytest.skip("no NVIDIA GPU visible", allow_module_level=True)

from runtime_py.engines.tensorrt import _Binding, _Cuda, CudaError  # noqa: E402


def test_pinned_roundtrip_and_graph_replay():
    cuda = _Cuda()
    rt = cuda.rt
    cuda.check(rt.cudaSetDevice(0), "cudaSetDevice")
    stream = cuda.check(rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking), "stream")
    n = 4 * 3 * 8 * 8
    nbytes = n * 4
    bufs = []
    for name in ("a", "b"):
        dev = cuda.check(rt.cudaMalloc(nbytes), "cudaMalloc")
        host = cuda.check(rt.cudaHostAlloc(nbytes, rt.cudaHostAllocDefault), "cudaHostAlloc")
        bufs.append(_Binding(name, name == "a", np.dtype(np.float32), (4, 3, 8, 8),
                             int(dev), int(host), nbytes))
    a, b = bufs
    x = np.arange(n, dtype=np.float32).reshape(4, 3, 8, 8)
    np.copyto(a.host[:n].reshape(x.shape), x, casting="no")
    cuda.check(rt.cudaMemcpyAsync(a.device_ptr, a.host_ptr, nbytes,
                                  rt.cudaMemcpyKind.cudaMemcpyHostToDevice, stream), "H2D")
    # capture a device-to-device copy as the "engine", as the runner captures enqueue
    cuda.check(rt.cudaStreamBeginCapture(
        stream, rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal), "begin")
    cuda.check(rt.cudaMemcpyAsync(b.device_ptr, a.device_ptr, nbytes,
                                  rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice, stream), "D2D")
    graph = cuda.check(rt.cudaStreamEndCapture(stream), "end")
    graph_exec = cuda.check(rt.cudaGraphInstantiate(graph, 0), "instantiate")
    for _ in range(2):
        cuda.check(rt.cudaGraphLaunch(graph_exec, stream), "launch")
    cuda.check(rt.cudaMemcpyAsync(b.host_ptr, b.device_ptr, nbytes,
                                  rt.cudaMemcpyKind.cudaMemcpyDeviceToHost, stream), "D2H")
    cuda.check(rt.cudaStreamSynchronize(stream), "sync")
    np.testing.assert_array_equal(b.host[:n].reshape(x.shape), x)
    assert int(stream) != 0
    rt.cudaGraphExecDestroy(graph_exec)
    rt.cudaGraphDestroy(graph)
    for buf in bufs:
        buf.host = None
        cuda.check(rt.cudaFreeHost(buf.host_ptr), "cudaFreeHost")
        cuda.check(rt.cudaFree(buf.device_ptr), "cudaFree")
    cuda.check(rt.cudaStreamDestroy(stream), "destroy")


def test_errors_become_cuda_errors():
    cuda = _Cuda()
    with pytest.raises(CudaError, match="cudaMalloc"):
        cuda.check(cuda.rt.cudaMalloc(1 << 62), "cudaMalloc(huge)")


def test_probe_sees_the_gpu():
    h = probe_host()
    assert h.gpus and h.gpus[0].compute_capability >= (3, 0) and h.cuda_driver_version


def test_the_pipeline_keeps_two_batches_in_flight_on_real_streams():
    """runtime_py/engines/cuda_pipeline.py on a GPU: a device copy on the compute stream
    stands in for the plan; many batches of mixed sizes, plain and pinned feeds, results
    read two behind (the batcher's pattern): each result is its own batch. A plain feed is
    rewritten right after enqueue (it was staged, so that must not matter)."""
    from runtime_py.engines.cuda_pipeline import CudaPipeline, IOSpec

    cuda = _Cuda()
    rt = cuda.rt
    cuda.check(rt.cudaSetDevice(0), "cudaSetDevice")
    stream = cuda.check(rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking), "stream")
    row, max_rows = (3, 64, 64), 16
    nbytes = max_rows * int(np.prod(row)) * 4
    static_in = cuda.check(rt.cudaMalloc(nbytes), "in")
    static_out = cuda.check(rt.cudaMalloc(nbytes), "out")
    pipe = CudaPipeline(cuda, stream, [IOSpec("x", True, np.float32, row, static_in, max_rows),
                                       IOSpec("y", False, np.float32, row, static_out, max_rows)])

    def plan(n: int):
        cuda.check(rt.cudaMemcpyAsync(static_out, static_in, n * int(np.prod(row)) * 4,
                                      rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice, stream), "D2D")
        return {"y": (n, *row)}

    pinned = [pipe.allocate_host((max_rows, *row), np.float32) for _ in range(3)]
    rng = np.random.default_rng(0)
    expected, pending = [], []
    for i, n in enumerate([1, 16, 5, 16, 9, 2, 16, 16, 3, 7, 16, 1] * 3):
        x = rng.standard_normal((n, *row)).astype(np.float32)
        if i % 2:
            feed = pinned[i % 3][:n]
            feed[...] = x
        else:
            feed = x.copy()
        pending.append(pipe.enqueue({"x": feed}, n, plan))
        if not i % 2:
            feed[...] = -1.0            # staged already: the batch keeps its bytes
        expected.append(x)
        if i >= 2:
            np.testing.assert_array_equal(pending[i - 2].result()["y"], expected[i - 2])
    for p, x in zip(pending[-2:], expected[-2:]):
        np.testing.assert_array_equal(p.result()["y"], x)
    pipe.close()
    del pinned
    cuda.check(rt.cudaFree(static_in), "cudaFree")
    cuda.check(rt.cudaFree(static_out), "cudaFree")
    cuda.check(rt.cudaStreamDestroy(stream), "destroy")
