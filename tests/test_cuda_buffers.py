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
