"""CPU time of the processes of a serving run, by role, over one measured window.

A serving path can be capped by its clients, its front-end worker processes or the engine
process; which one is saturated shows in their CPU time over the same window (a role at
~1 core per process is the limit). Linux only: utime + stime of /proc/<pid>/stat (every
thread of the process); elsewhere every figure is None ("n/a").
"""

from __future__ import annotations

import os
import time
from typing import Iterable

#: Threads named per role of one process (the engine): which of them is the busy one
#: (an event loop, the batcher's worker or its completion thread) says where to look.
TOP_THREADS = 4
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat_cpu(path: str) -> float | None:
    try:
        with open(path, "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = stat[stat.rindex(b")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / _TICK   # fields 14 and 15 of stat(5)


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds ``pid`` has used so far (all its threads); None when it
    cannot be read (not Linux, or the process is gone)."""
    return _stat_cpu(f"/proc/{pid}/stat")


def thread_cpu_seconds(pid: int) -> dict[int, float]:
    """CPU seconds of each thread of ``pid`` so far ({} when unreadable). An event loop
    is one thread: a process at 1.3 cores may still have its loop thread at 1.0."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {}
    out = {}
    for tid in tids:
        t = _stat_cpu(f"/proc/{pid}/task/{tid}/stat")
        if t is not None:
            out[int(tid)] = t
    return out


def thread_names(pid: int) -> dict[int, str]:
    """A name for each thread of ``pid``: the Python thread's name where ``pid`` is this
    process (the batcher's worker, its completion thread, the server's loop), else the
    kernel's (``comm``: CUDA's and the interpreter's own threads keep the program's)."""
    names = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return names
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                names[int(tid)] = f.read().strip()
        except OSError:
            continue
    if pid == os.getpid():
        import threading
        for t in threading.enumerate():
            if t.native_id in names:
                names[t.native_id] = t.name
    return names


def children_running(parent: int, marker: str) -> list[int]:
    """Ids of the child processes of ``parent`` whose command line contains ``marker``
    (e.g. the front-end workers ``runtime_py.server.workers``); [] where /proc is absent."""
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
        if ppid == parent and marker in cmdline:
            found.append(int(entry))
    return sorted(found)


class RoleSampler:
    """CPU seconds per process of each role between ``start()`` and ``stop()``.

    ``roles`` maps a role ("clients", "workers", "engine") to its process ids. A process
    that cannot be read at either end makes its role None (not a partial sum)."""

    def __init__(self, roles: dict[str, Iterable[int]]) -> None:
        self.roles = {role: list(pids) for role, pids in roles.items()}
        self._t0: dict[int, float | None] = {}
        self._threads0: dict[int, dict[int, float]] = {}
        self.wall = 0.0
        self.used: dict[str, list[float] | None] = {}
        self.busiest: dict[str, list[float]] = {}   # per process: its busiest thread's CPU
        #: per role of one process: its busiest threads as (name, CPU seconds), most first
        self.threads: dict[str, list[tuple[str, float]]] = {}

    def start(self) -> None:
        self._wall0 = time.perf_counter()
        self._t0 = {pid: cpu_seconds(pid) for pids in self.roles.values() for pid in pids}
        self._threads0 = {pid: thread_cpu_seconds(pid) for pid in self._t0}

    def stop(self) -> None:
        self.wall = time.perf_counter() - self._wall0
        for role, pids in self.roles.items():
            per, busiest = [], []
            for pid in pids:
                before, after = self._t0.get(pid), cpu_seconds(pid)
                if before is None or after is None:
                    per = None
                    break
                per.append(after - before)
                t0, t1 = self._threads0.get(pid, {}), thread_cpu_seconds(pid)
                grew = {t: t1[t] - t0.get(t, 0.0) for t in t1}
                busiest.append(max(grew.values(), default=0.0))
                if len(pids) == 1:
                    names = thread_names(pid)
                    top = sorted(grew.items(), key=lambda kv: -kv[1])[:TOP_THREADS]
                    self.threads[role] = [(names.get(t, str(t)), s) for t, s in top]
            self.used[role] = per
            self.busiest[role] = busiest

    def report(self, images: float) -> dict[str, dict | None]:
        """Per role: CPU seconds per 1000 images (summed over its processes), and each
        process's share of one core over the window (1.0: one core busy all the time), and
        that of each process's busiest thread (an event loop or a poller at ~1.0 is saturated
        whatever the process's total)."""
        out: dict[str, dict | None] = {}
        for role, per in self.used.items():
            if per is None or not images or not self.wall:
                out[role] = None
                continue
            out[role] = {"procs": len(per),
                         "cpu_s_per_1000_img": round(sum(per) / images * 1000, 3),
                         "cores_each": [round(p / self.wall, 2) for p in per],
                         "busiest_thread_cores_each": [round(p / self.wall, 2)
                                                       for p in self.busiest[role]],
                         "cores": round(sum(per) / self.wall, 2)}
            if role in self.threads:
                out[role]["threads_cores"] = [[name, round(s / self.wall, 2)]
                                              for name, s in self.threads[role]]
        return out


def format_report(report: dict[str, dict | None]) -> str:
    """One line: ``clients 0.52 s/1k img (4 procs, 1.31 cores: 0.33/0.30 0.33/0.29 ...)``,
    each process as its cores / its busiest thread's cores."""
    parts = []
    for role, r in report.items():
        if r is None:
            parts.append(f"{role} n/a")
            continue
        each = " ".join(f"{c:.2f}/{t:.2f}"
                        for c, t in zip(r["cores_each"], r["busiest_thread_cores_each"]))
        threads = ""
        if r.get("threads_cores"):
            threads = "; threads " + " ".join(f"{n} {c:.2f}" for n, c in r["threads_cores"])
        parts.append(f"{role} {r['cpu_s_per_1000_img']:.2f} s/1k img "
                     f"({r['procs']} proc{'s' if r['procs'] != 1 else ''}, {r['cores']:.2f} cores"
                     f"; process/busiest thread: {each}{threads})")
    return "cpu: " + "; ".join(parts)
