"""benchmarks/role_cpu.py: CPU time by role from /proc, as serve_bench reports it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmark_modules import load_benchmark


pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")


def _role_cpu():
    return load_benchmark("role_cpu")


def _spin(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_cpu_seconds_counts_this_process_work():
    rc = _role_cpu()
    import os
    before = rc.cpu_seconds(os.getpid())
    _spin(0.3)
    after = rc.cpu_seconds(os.getpid())
    assert after - before >= 0.2


def test_thread_cpu_seconds_names_the_busy_thread():
    """The spinning thread stays alive until the second read: a thread that has exited
    has no /proc task entry, and its time would be read as nobody's."""
    rc = _role_cpu()
    import os
    import threading
    spun = threading.Event()
    release = threading.Event()
    tid = []

    def spin():
        tid.append(threading.get_native_id())
        end = time.thread_time() + 0.3     # this thread's own CPU time, not the process's
        while time.thread_time() < end:
            pass
        spun.set()
        release.wait()

    before = rc.thread_cpu_seconds(os.getpid())
    t = threading.Thread(target=spin)
    t.start()
    try:
        assert spun.wait(30)
        after = rc.thread_cpu_seconds(os.getpid())
    finally:
        release.set()
        t.join()
    assert tid[0] in after, "the spinning thread's /proc task entry was not read"
    grew = {k: after[k] - before.get(k, 0.0) for k in after}
    assert max(grew, key=grew.get) == tid[0] and grew[tid[0]] >= 0.2


def test_cpu_seconds_of_a_gone_process_is_none():
    rc = _role_cpu()
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    assert rc.cpu_seconds(p.pid) is None


def test_sampler_tells_a_busy_child_from_an_idle_one():
    rc = _role_cpu()
    import os
    busy = subprocess.Popen([sys.executable, "-c",
                             "import time\nt=time.time()+5\nwhile time.time()<t: pass",
                             "role_cpu_marker_busy"])
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)",
                             "role_cpu_marker_idle"])
    try:
        time.sleep(0.3)   # past their start-up
        assert rc.children_running(os.getpid(), "role_cpu_marker_busy") == [busy.pid]
        sampler = rc.RoleSampler({"busy": [busy.pid], "idle": [idle.pid]})
        sampler.start()
        time.sleep(0.6)
        sampler.stop()
        report = sampler.report(images=100)
        # The busy child had most of a core (2-core CI host: at least a third of one).
        assert report["busy"]["cores"] > 0.3
        # One spinning thread: the busiest thread is the process's CPU (within a tick each).
        busy_each, = report["busy"]["busiest_thread_cores_each"]
        assert 0.3 < busy_each <= report["busy"]["cores"] + 0.05
        assert report["idle"]["cores"] < 0.1
        assert report["busy"]["cpu_s_per_1000_img"] > 10 * report["idle"]["cpu_s_per_1000_img"]
        assert "busy" in rc.format_report(report) and "idle" in rc.format_report(report)
    finally:
        for p in (busy, idle):
            p.kill()
            p.wait()
    sampler = rc.RoleSampler({"gone": [busy.pid]})
    sampler.start()
    sampler.stop()
    assert sampler.report(images=100)["gone"] is None
    assert "gone n/a" in rc.format_report(sampler.report(images=100))


def test_sampler_names_this_process_busy_thread():
    """A role of one process (the engine) lists its busiest threads by their Python names,
    so a serve_bench line says whether the loop, the batcher or its completion thread is
    the saturated one."""
    rc = _role_cpu()
    import os
    import threading
    release = threading.Event()
    spun = threading.Event()

    def spin():
        end = time.thread_time() + 0.4
        while time.thread_time() < end:
            pass
        spun.set()
        release.wait()

    t = threading.Thread(target=spin, name="role-cpu-spinner")
    sampler = rc.RoleSampler({"engine": [os.getpid()]})
    sampler.start()
    t.start()
    try:
        assert spun.wait(30)
        sampler.stop()
    finally:
        release.set()
        t.join()
    report = sampler.report(images=100)
    name, cores = report["engine"]["threads_cores"][0]
    assert name == "role-cpu-spinner" and cores > 0.2
    assert "threads role-cpu-spinner" in rc.format_report(report)
