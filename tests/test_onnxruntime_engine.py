"""ONNX Runtime as the bundler's reference engine: a graph it cannot load is a
compatibility problem with the upgrade that fixes it, not a traceback; `bundle make`
refuses an ONNX Runtime older than the one it needs before it does any work."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from onnx import TensorProto, helper

from runtime_py.engines.onnxruntime import (MIN_VERSION, UPGRADE_HINT, cpu_session,
                                            require_build_version)
from runtime_py.errors import CompatibilityError, EngineUnavailableError


def _unloadable_graph() -> bytes:
    # a Relu fed a string tensor: valid protobuf, no CPU kernel for the type
    x = helper.make_tensor_value_info("x", TensorProto.STRING, [1])
    y = helper.make_tensor_value_info("y", TensorProto.STRING, [1])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)]).SerializeToString()


def test_a_graph_onnxruntime_cannot_load_is_a_compatibility_error_with_the_upgrade():
    with pytest.raises(CompatibilityError) as info:
        cpu_session(_unloadable_graph(), "fp8")
    message = str(info.value)
    assert "cannot load the fp8 graph" in message and UPGRADE_HINT in message


def test_a_graph_it_can_load_gives_a_session():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    session = cpu_session(model.SerializeToString())
    assert [o.name for o in session.get_outputs()] == ["y"]


@pytest.mark.parametrize("version", ["1.30.0", "1.31.1", "0.99"])
def test_make_refuses_an_onnxruntime_older_than_the_minimum(version):
    with pytest.raises(EngineUnavailableError) as info:
        require_build_version(version)
    assert f"onnxruntime {version} is installed" in str(info.value)
    assert UPGRADE_HINT in str(info.value)


@pytest.mark.parametrize("version", [MIN_VERSION + ".0", "1.33.0.dev20261201", "2.0",
                                     "custom-build"])
def test_make_takes_the_minimum_newer_ones_and_unparsable_builds(version):
    require_build_version(version)          # no error


def test_the_minimum_is_pyprojects_lower_bound():
    """`bundle make`'s minimum and what pip installs are one number: a bound raised in
    pyproject.toml alone would let make accept what the package refuses, or the reverse."""
    import tomllib
    from pathlib import Path

    from packaging.requirements import Requirement

    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml")
                            .read_text())["project"]
    bounds = {str(r.specifier) for extra in project["optional-dependencies"].values()
              for r in map(Requirement, extra) if r.name == "onnxruntime"}
    assert bounds == {f">={MIN_VERSION}"}


def test_the_installed_onnxruntime_passes():
    require_build_version()                 # the tests' own environment meets pyproject's bound


def test_bundle_make_refuses_an_old_onnxruntime_before_any_work(tmp_path):
    # a stand-in package first on the path of a child process: the installed one is not
    # touched and nothing of this process changes
    shim = tmp_path / "shim" / "onnxruntime"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text('__version__ = "1.30.0"\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path / "shim"), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        "TRT_BUNDLE_CACHE": str(tmp_path / "cache")}
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "bundler.cli", "make", "timm_xception",
                           "--precision", "fp32", "--random-weights", "--backend", "onnxruntime",
                           "--out", str(out)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == EngineUnavailableError.exit_code, done.stderr
    assert "onnxruntime 1.30.0 is installed" in done.stderr and UPGRADE_HINT in done.stderr
    assert "Traceback" not in done.stderr
    assert not out.exists() and not (tmp_path / "cache").exists()
