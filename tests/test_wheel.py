"""The wheel setuptools builds from this checkout: what a non-editable install gets, and
what `pip install -e '.[dev]'` prints while it builds.

schemas/ and families/ ship inside the packages that read them (pyproject.toml's
package-dir). With setuptools' default include-package-data, each family folder looked
like a package missing from `packages` and every install printed a 30-line "Package would
be ignored" banner per family (seen on a fresh install, setuptools 84, pip 26).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: What the build reads; the rest of the checkout (tests, docs, cpp_stub) is not shipped.
SOURCES = ("pyproject.toml", "setup.py", "README.md", "bundler", "runtime_py", "schemas",
           "families")


@pytest.fixture(scope="module")
def built_wheel(tmp_path_factory) -> tuple[Path, str]:
    """The wheel built by setuptools' PEP 517 backend from a copy of the sources (no build
    folders left in the checkout), and everything the build printed, warnings included."""
    pytest.importorskip("setuptools.build_meta", reason="setuptools builds the wheel "
                        "('.[dev]' installs it)")
    src = tmp_path_factory.mktemp("wheel-src")
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, src / name)
    out = src / "dist"
    build = subprocess.run(
        [sys.executable, "-W", "always", "-c",
         "import sys, setuptools.build_meta as b; b.build_wheel(sys.argv[1])", str(out)],
        cwd=src, capture_output=True, text=True, timeout=300)
    printed = build.stdout + build.stderr
    assert build.returncode == 0, printed[-3000:]
    (wheel,) = out.glob("trt_bundle-*.whl")
    return wheel, printed


def test_the_build_prints_no_package_warnings(built_wheel):
    _, printed = built_wheel
    assert "absent from the `packages` configuration" not in printed, printed[-3000:]
    assert "Package would be ignored" not in printed


def test_the_wheel_ships_every_family_and_schema(built_wheel):
    wheel, _ = built_wheel
    names = set(zipfile.ZipFile(wheel).namelist())
    families = sorted(p for p in (ROOT / "families").iterdir() if (p / "family.json").is_file())
    assert families, "no family folders found"
    for family in families:
        for member in sorted(family.iterdir()):
            if member.is_file() and member.suffix in {".json", ".md", ".py", ".txt"}:
                assert f"bundler/family_data/{family.name}/{member.name}" in names
    for schema in sorted((ROOT / "schemas").glob("*.json")):
        assert f"runtime_py/schema_files/{schema.name}" in names
    assert "bundler/cli.py" in names and "runtime_py/__init__.py" in names
    assert not any(name.startswith(("tests/", "docs/", "benchmarks/")) for name in names)
