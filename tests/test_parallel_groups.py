"""The README's test command runs the suite on two workers (pytest-xdist, ``--dist
loadgroup``); tests/conftest.py puts each file in a group of its own, and the files that
use /dev/shm in one ("dev-shm"), so that a listing of /dev/shm in one of them never sees a
segment another worker's test made meanwhile. These keep that list and the command honest."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from conftest import DEV_SHM_FILES

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
#: What a test file does to /dev/shm: names it, makes segments (Triton's client, Python's
#: shared_memory), or starts Ray (its object store lives there).
SHM_USE = re.compile(r"/dev/shm|shared_memory|create_shared_memory_region|ray\.init")


def _marked_dev_shm(node: ast.FunctionDef) -> bool:
    """Whether a test function carries ``@pytest.mark.xdist_group("dev-shm")``."""
    return any(isinstance(d, ast.Call) and ast.unparse(d.func).endswith("mark.xdist_group")
               and [ast.literal_eval(a) for a in d.args] == ["dev-shm"]
               for d in node.decorator_list)


def shm_users_left_out(path: Path) -> list[str]:
    """What of a file outside DEV_SHM_FILES uses /dev/shm without the dev-shm mark: its
    test functions that do, unmarked, and "module level" for any use outside a test
    function (a fixture, a helper: those run wherever their tests run)."""
    text = path.read_text()
    if not SHM_USE.search(text):
        return []
    lines = text.splitlines(keepends=True)
    tests = [n for n in ast.parse(text).body
             if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("test_")]
    spans = {n.name: (min([n.lineno] + [d.lineno for d in n.decorator_list]) - 1, n.end_lineno)
             for n in tests}                                 # decorators included
    left = [n.name for n in tests
            if SHM_USE.search("".join(lines[slice(*spans[n.name])])) and not _marked_dev_shm(n)]
    inside = {i for first, last in spans.values() for i in range(first, last)}
    rest = "".join(line for i, line in enumerate(lines) if i not in inside)
    return left + (["module level"] if SHM_USE.search(rest) else [])


def test_every_test_that_uses_dev_shm_is_in_the_dev_shm_group():
    left = {p.name: shm_users_left_out(p) for p in TESTS.glob("test_*.py")
            if p.name != Path(__file__).name and p.name not in DEV_SHM_FILES}
    left = {name: what for name, what in left.items() if what}
    assert left == {}, ("add these files to tests/conftest.py DEV_SHM_FILES, or mark these "
                        'tests @pytest.mark.xdist_group("dev-shm")')
    assert DEV_SHM_FILES <= {p.name for p in TESTS.glob("test_*.py")}, "stale names"


def test_the_dev_shm_check_finds_an_unmarked_test_and_a_fixture(tmp_path):
    marked = ('@pytest.mark.xdist_group("dev-shm")\n'
              'def test_a():\n    open("/dev/shm/x", "wb")\n')
    unmarked = 'def test_b():\n    open("/dev/shm/x", "wb")\n'
    fixture = '@pytest.fixture\ndef region():\n    return "/dev/shm/x"\n'
    for name, text, want in (("a.py", marked, []), ("b.py", marked + unmarked, ["test_b"]),
                             ("c.py", marked + fixture, ["module level"]),
                             ("d.py", "def test_c():\n    pass\n", [])):
        (tmp_path / name).write_text(text)
        assert shm_users_left_out(tmp_path / name) == want, name


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
