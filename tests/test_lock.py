"""constraints/lock.txt: the tested versions CI and the README's set-up command install."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][^\s;]*)$")


def lock_pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints" / "lock.txt").read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        match = PIN.match(line)
        assert match, f"not a name==version pin: {line!r}"
        pins[canonicalize_name(match.group(1))] = match.group(2)
    return pins


def dev_requirements() -> list[Requirement]:
    """The direct requirements of '.[dev]' (the core and every extra dev pulls in)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    todo = ["dev"]
    while todo:
        for text in extras[todo.pop()]:
            req = Requirement(text)
            if canonicalize_name(req.name) == canonicalize_name(project["name"]):
                todo += sorted(req.extras)
            else:
                reqs.append(req)
    return reqs


def test_the_lock_pins_every_direct_requirement_within_its_range():
    pins = lock_pins()
    for req in dev_requirements():
        name = canonicalize_name(req.name)
        assert name in pins, f"{name} is not in constraints/lock.txt: run bash .ci/lock.sh"
        assert req.specifier.contains(pins[name], prereleases=True), \
            f"{name}=={pins[name]} is outside pyproject's range {req.specifier}"


def test_the_lock_pins_torch_as_tested():
    assert lock_pins()["torch"] == "2.14.1"


def test_ci_and_the_readme_install_with_the_lock():
    setup = "pip install -c constraints/lock.txt -e '.[dev]'"
    assert setup in (ROOT / "README.md").read_text()
    assert "-c constraints/lock.txt -e '.[dev]'" in (ROOT / ".ci" / "run").read_text()


def test_ci_the_readme_and_the_cpp_skip_reason_name_the_same_system_packages():
    """A newcomer reads the packages in the README (or in the C++ tests' skip reason); CI
    installs them: one list, or the tests skip on a fresh machine with advice that fails."""
    from conftest import CPP_SYSTEM_PACKAGES

    ci = re.search(r"for pkg in ([^;]+); do", (ROOT / ".ci" / "run").read_text()).group(1)
    readme = re.search(r"`apt-get install ([^`]+)`", (ROOT / "README.md").read_text()).group(1)
    assert ci.split() == readme.split()
    # clang: the fuzzer only; qemu-user: test_portable_graphs only
    assert set(CPP_SYSTEM_PACKAGES) == set(ci.split()) - {"clang", "qemu-user"}


def test_the_versions_the_readme_quotes_are_the_locks():
    """The README names the locked versions a bundle id is reproducible with; they drifted
    once (ml_dtypes 0.6.0 quoted while the lock had 0.5.4), and an id made with the quoted
    set would not have matched one made with the README's own set-up command."""
    section = (ROOT / "README.md").read_text().split("### Versions", 1)[1].split("\n#", 1)[0]
    quoted = re.search(r"\(([^()]*?), \.\.\.;", section)
    assert quoted, "README's Versions section lost its list of locked versions"
    pins = lock_pins()
    for item in quoted.group(1).split(","):
        name, version = item.split()
        assert pins.get(canonicalize_name(name)) == version, \
            f"README quotes {name} {version}; constraints/lock.txt has {pins.get(canonicalize_name(name))}"
