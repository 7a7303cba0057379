"""The server's registry of client shared-memory regions (``runtime_py/server/shm.py``),
below the protocol: what one request checks, and how often."""

import os
from multiprocessing import shared_memory

import numpy as np
import pytest

from runtime_py.server.protocol import RequestError
from runtime_py.server.shm import ShmRef, ShmRegistry


@pytest.fixture()
def region():
    seg = shared_memory.SharedMemory(create=True, size=4096)
    registry = ShmRegistry()
    registry.register("r", "/" + seg.name, 0, 4096)
    try:
        yield registry, seg
    finally:
        registry.close()
        seg.close()
        try:
            seg.unlink()
        except FileNotFoundError:
            pass


def test_a_request_checks_each_region_once_at_its_start_and_again_before_writing(region):
    """One stat of the key per region at a request's start (its input and its output
    windows), and another before the outputs are written after the batch: a key removed
    (or truncated, a SIGBUS otherwise) while the batch ran is refused then."""
    registry, seg = region
    alive: set[str] = set()
    x = np.arange(16, dtype=np.float32)
    seg.buf[:x.nbytes] = x.tobytes()
    got = registry.read(ShmRef("r", 0, x.nbytes), np.dtype(np.float32), [16], "input", alive)
    assert np.array_equal(got, x) and alive == {"r"}
    registry.view(ShmRef("r", 1024, 64), "output", alive)
    registry.write(ShmRef("r", 1024, 64), x, "output")
    assert np.array_equal(np.frombuffer(seg.buf, np.float32, 16, 1024), x)
    seg.unlink()      # the client removes the key while the request runs
    # a window of a region this request found alive is not checked again ...
    registry.view(ShmRef("r", 2048, 64), "output", alive)
    # ... but writing the outputs is, and so is the next request
    with pytest.raises(RequestError, match="removed"):
        registry.write(ShmRef("r", 1024, 64), x, "output")
    with pytest.raises(RequestError, match="removed"):
        registry.read(ShmRef("r", 0, x.nbytes), np.dtype(np.float32), [16], "input", set())
    del got


def test_bounds_are_checked_on_every_view_even_of_a_region_found_alive(region):
    registry, _ = region
    alive = {"r"}
    with pytest.raises(RequestError, match="beyond"):
        registry.view(ShmRef("r", 4000, 200), "output", alive)
    with pytest.raises(RequestError, match="not registered"):
        registry.view(ShmRef("other", 0, 4), "output", alive)


def test_a_truncated_or_replaced_key_is_refused_before_any_view(region):
    """The per-request check (a GIL-keeping stat, ``runtime_py.stat_held``) sees a key
    truncated below the registered window and a key removed and created again (another
    inode under the same name)."""
    registry, seg = region
    path = "/dev/shm/" + seg.name
    registry.view(ShmRef("r", 0, 64), "input", set())
    os.truncate(path, 1024)
    with pytest.raises(RequestError, match="truncated to 1024 bytes"):
        registry.view(ShmRef("r", 0, 64), "input", set())
    os.truncate(path, 4096)
    registry.view(ShmRef("r", 0, 64), "input", set())
    seg.unlink()
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, 4096)
        with pytest.raises(RequestError, match="removed or replaced"):
            registry.view(ShmRef("r", 0, 64), "input", set())
    finally:
        os.close(fd)
        os.unlink(path)
