"""Every import of a project module anywhere in the repository resolves on this host.

Why: much of the code runs only on a GPU (the GPU tests, the device benchmarks, the
torch-aoti target's CUDA paths) and imports project names inside functions, so a rename
or a move made on a CPU host would surface only in the next (scarce) device session. This
reads every ``from bundler... import name`` / ``from runtime_py... import name`` and
``import bundler...`` statement with ``ast`` (function bodies included), imports the
module and checks that each name is there; and every ``alias.name`` read off a project
module imported under an alias (``from bundler.targets.torch_aoti import model as
rewrite``; ``rewrite.EngineModule``). Nothing of the importing files runs.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("bundler", "runtime_py")
SOURCES = ("bundler/**/*.py", "runtime_py/**/*.py", "tests/*.py", "benchmarks/*.py",
           "families/*/*.py")


def _from_project(node: ast.AST) -> bool:
    """``from bundler... import`` / ``from runtime_py... import`` (absolute)."""
    return (isinstance(node, ast.ImportFrom) and node.level == 0 and bool(node.module)
            and node.module.split(".")[0] in PACKAGES)


def _project_imports(path: Path):
    """(line, module, name or None) of each project import in ``path``."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if _from_project(node):
            for alias in node.names:
                yield node.lineno, node.module, None if alias.name == "*" else alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PACKAGES:
                    yield node.lineno, alias.name, None


def _unresolved(module: str, name: str | None) -> str | None:
    try:
        imported = importlib.import_module(module)
    except ImportError as exc:
        return f"module {module}: {exc}"
    if name is None or hasattr(imported, name):
        return None
    try:                                  # a submodule: from package import module
        importlib.import_module(f"{module}.{name}")
    except ImportError:
        return f"{module} has no {name}"
    return None


def _check_tree(read) -> tuple[int, list[str]]:
    """Every (line, module, name) that ``read(path)`` yields over the tree, resolved: how
    many were read, and "file:line: why" for each that does not resolve."""
    files = sorted({p for pattern in SOURCES for p in ROOT.glob(pattern)})
    assert len(files) > 200                 # the whole tree was read, not an empty glob
    problems, seen = [], 0
    for path in files:
        for line, module, name in read(path):
            seen += 1
            why = _unresolved(module, name)
            if why:
                problems.append(f"{path.relative_to(ROOT)}:{line}: {why}")
    return seen, problems


def test_every_project_import_names_something_that_exists():
    seen, problems = _check_tree(_project_imports)
    assert seen > 500
    assert not problems, "\n".join(problems)


def _aliases_in(body) -> dict[str, str]:
    """Alias -> project module, for the imports among ``body``'s statements (nested
    blocks included, nested functions not)."""
    aliases: dict[str, str] = {}
    stack = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if _from_project(node):
            for alias in node.names:
                dotted = f"{node.module}.{alias.name}"
                try:
                    importlib.import_module(dotted)
                except ImportError:
                    continue                      # a name, not a module
                aliases[alias.asname or alias.name] = dotted
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and alias.name.split(".")[0] in PACKAGES:
                    aliases[alias.asname] = alias.name
        stack.extend(ast.iter_child_nodes(node))
    return aliases


def _module_attributes(path: Path):
    """(line, module, attribute) of each ``alias.attribute`` read in ``path`` where
    ``alias`` names a project module (``from pkg import module [as alias]``,
    ``import pkg.module as alias``) in that scope: a function sees its own imports and
    those of the scopes around it."""
    def visit(node, aliases):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef)):
            aliases = {**aliases, **_aliases_in(node.body)}
        if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)
                and isinstance(node.value, ast.Name) and node.value.id in aliases):
            yield node.lineno, aliases[node.value.id], node.attr
        for child in ast.iter_child_nodes(node):
            yield from visit(child, aliases)

    yield from visit(ast.parse(path.read_text(), str(path)), {})


def test_every_attribute_read_off_a_project_module_exists():
    seen, problems = _check_tree(_module_attributes)
    assert seen > 100
    assert not problems, "\n".join(problems)


def test_a_stale_import_is_found(tmp_path):
    """The check itself: a moved name is reported, with its file and line."""
    stale = tmp_path / "stale.py"
    stale.write_text("def f():\n    from bundler.families import TORCH_AOTI_LAYOUTS\n")
    (found,) = list(_project_imports(stale))
    assert found == (2, "bundler.families", "TORCH_AOTI_LAYOUTS")
    assert _unresolved("bundler.families", "TORCH_AOTI_LAYOUTS") == (
        "bundler.families has no TORCH_AOTI_LAYOUTS")
    assert _unresolved("bundler.targets", "torch_aoti") is None      # a submodule
    assert "module bundler.nowhere" in _unresolved("bundler.nowhere", "x")
    moved = tmp_path / "moved.py"
    moved.write_text("def f():\n    from bundler import families as fam\n"
                     "    return fam.TORCH_AOTI_LAYOUTS, fam.load_family\n")
    assert list(_module_attributes(moved)) == [(3, "bundler.families", "TORCH_AOTI_LAYOUTS"),
                                               (3, "bundler.families", "load_family")]
    scoped = tmp_path / "scoped.py"            # one alias, two modules, in two functions
    scoped.write_text("def f():\n    from bundler import families as m\n    return m.load_family\n"
                      "def g():\n    from bundler import reuse as m\n    return m.reuse_mismatch\n")
    assert list(_module_attributes(scoped)) == [(3, "bundler.families", "load_family"),
                                                (6, "bundler.reuse", "reuse_mismatch")]
