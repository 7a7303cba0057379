"""The README's test command runs the suite on two workers (pytest-xdist, ``--dist
loadgroup``); tests/conftest.py puts each file in a group of its own, and the files that
use /dev/shm in one ("dev-shm"), so that a listing of /dev/shm in one of them never sees a
segment another worker's test made meanwhile. These keep that list and the command honest."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import DEV_SHM_FILES

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
#: What a test file does to /dev/shm: names it, makes segments (Triton's client, Python's
#: shared_memory), or starts Ray (its object store lives there).
SHM_USE = re.compile(r"/dev/shm|shared_memory|create_shared_memory_region|ray\.init")
#: A benchmark whose processes come from a "forkserver" or "spawn" context: its queues'
#: locks are POSIX semaphores named in /dev/shm ("sem.mp-...") while they live (the "fork"
#: context unlinks them at once). A test that runs one (its main, or serve_bench's
#: bench_path) makes entries there that another worker's listing would see: a fresh-user
#: run saw test_serve_triton's no-leftover check fail so, while test_serve_pair_bench ran.
NAMED_SEMAPHORES = re.compile(r"get_context\(\"(forkserver|spawn)\"\)")
RUNS_A_BENCHMARK = re.compile(r"\.main\(|bench_path\(")


def benchmarks_naming_semaphores() -> set[str]:
    """The benchmarks that make such semaphores, directly or through one they import."""
    sources = {p.stem: p.read_text() for p in (ROOT / "benchmarks").glob("*.py")}
    names = {name for name, text in sources.items() if NAMED_SEMAPHORES.search(text)}
    while True:
        imports = re.compile(rf"^(from|import) ({'|'.join(sorted(names))})\b", re.M)
        more = {name for name, text in sources.items()
                if name not in names and imports.search(text)}
        if not more:
            return names
        names |= more


def uses_dev_shm(text: str, semaphore_benchmarks: set[str]) -> bool:
    """Whether a test file's source makes or lists /dev/shm entries (see above)."""
    if SHM_USE.search(text):
        return True
    loaded = set(re.findall(r'load_benchmark\("(\w+)"\)', text))
    return bool(loaded & semaphore_benchmarks) and bool(RUNS_A_BENCHMARK.search(text))


def test_every_file_that_uses_dev_shm_is_in_the_dev_shm_group():
    semaphores = benchmarks_naming_semaphores()
    assert {"serve_bench", "serve_pair_bench"} <= semaphores      # the rule still sees them
    users = {p.name for p in TESTS.glob("test_*.py")
             if p.name != Path(__file__).name and uses_dev_shm(p.read_text(), semaphores)}
    assert users - DEV_SHM_FILES == set(), "add these to tests/conftest.py DEV_SHM_FILES"
    assert DEV_SHM_FILES <= {p.name for p in TESTS.glob("test_*.py")}, "stale names"


def test_a_file_that_runs_a_forkserver_benchmark_counts_as_a_dev_shm_user():
    sem = {"serve_bench"}
    runs = 'b = load_benchmark("serve_bench")\nb.main(["--synthetic"])\n'
    assert uses_dev_shm(runs, sem)
    assert uses_dev_shm(runs.replace('b.main(["--synthetic"])', "b.bench_path(k, s)"), sem)
    assert not uses_dev_shm('b = load_benchmark("serve_bench")\nb.KINDS\n', sem)  # reads only
    assert not uses_dev_shm('b = load_benchmark("role_cpu")\nb.main([])\n', sem)
    assert uses_dev_shm('open("/dev/shm/x")', set())


def test_this_test_has_its_files_group(request):
    mark = request.node.get_closest_marker("xdist_group")
    assert mark is not None and mark.args == (Path(__file__).name,)


class _Item:
    """What the hook reads and writes of a collected test."""

    def __init__(self, name: str, marks=()):
        self.path = TESTS / name
        self.marks = list(marks)

    def get_closest_marker(self, name):
        return next((m for m in self.marks if m.name == name), None)

    def add_marker(self, mark):
        self.marks.append(mark.mark if hasattr(mark, "mark") else mark)


def test_the_hook_groups_by_file_and_keeps_a_group_given():
    import conftest

    shm = sorted(DEV_SHM_FILES)[0]
    items = [_Item("test_make.py"), _Item(shm),
             _Item("test_make.py", [pytest.mark.xdist_group("own").mark])]
    conftest.pytest_collection_modifyitems(None, items)
    groups = [[m.args for m in item.marks if m.name == "xdist_group"] for item in items]
    assert groups == [[("test_make.py",)], [("dev-shm",)], [("own",)]]


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## Run the tests\s+```bash\n(.+?)\n```", readme, re.S)
    assert block, "README.md has no 'Run the tests' command block"
    command = block.group(1).strip()
    assert "-n 2 --dist loadgroup" in command
    assert command in (ROOT / ".ci" / "run").read_text().splitlines()
