"""The CLI on a light install (`pip install 'trt-bundle[ort]'`): no torch, timm, onnx,
ml_dtypes, starlette, uvicorn or prometheus_client.

The light install is simulated for real, in a subprocess: a `sitecustomize.py` placed on
PYTHONPATH puts a meta-path finder in front of every other, and it makes `import torch`
(and the rest of the list) raise ModuleNotFoundError, as on a host where they are not
installed. Nothing is faked: the modules that remain are the real ones.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import synthetic_bundles  # noqa: E402

#: What `.[ort]` does not install (everything of export, serve and study but onnxruntime).
NOT_IN_ORT = ("torch", "timm", "onnx", "onnx_graphsurgeon", "onnxscript", "ml_dtypes",
              "starlette", "uvicorn", "prometheus_client", "matplotlib")

BLOCKER = textwrap.dedent('''
    import sys

    BLOCKED = frozenset({blocked!r})


    class LightInstall:
        """Refuses the modules a light install lacks, as an absent package would."""

        def find_spec(self, name, path=None, target=None):
            if name.split(".", 1)[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {{name!r}} (blocked by the "
                                          "light-install test)", name=name)
            return None


    sys.meta_path.insert(0, LightInstall())
''')


def light_env(tmp_path: Path, blocked=NOT_IN_ORT) -> dict:
    site = tmp_path / "light-site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER.format(blocked=sorted(blocked)))
    env = dict(os.environ, PYTHONPATH=str(site))
    env.pop("PYTHONSTARTUP", None)
    return env


def run_cli(env: dict, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bundler.cli", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def tiny_bundle(tmp_path_factory) -> Path:
    return synthetic_bundles.write_source_bundle(tmp_path_factory.mktemp("light"))


def test_the_blocker_hides_exactly_the_packages_a_light_install_lacks(tmp_path):
    env = light_env(tmp_path)
    for module in ("torch", "onnx", "ml_dtypes", "prometheus_client"):
        res = subprocess.run([sys.executable, "-c", f"import {module}"], env=env,
                             capture_output=True, text=True, cwd=tmp_path)
        assert res.returncode == 1 and "blocked by the light-install test" in res.stderr
    ok = subprocess.run([sys.executable, "-c", "import onnxruntime, numpy, runtime_py"],
                        env=env, capture_output=True, text=True, cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr


@pytest.mark.parametrize("command, extra", [
    (["make", "timm_xception", "--precision", "fp16", "--random-weights", "--out", "OUT"],
     "export"),
    (["rebuild", "BUNDLE", "--backend", "onnxruntime", "--out", "OUT"], "export"),
    (["serve", "BUNDLE", "--port", "0"], "serve"),
    (["eval", "BUNDLE", "--data", "DATA"], "export"),
    (["study", "timm_xception", "--random-weights", "--out", "OUT"], "export"),
])
def test_commands_that_need_an_extra_name_it_and_exit_5(tmp_path, tiny_bundle, command, extra):
    out, data = tmp_path / "out", tmp_path / "data"
    data.mkdir()
    args = [{"OUT": str(out), "BUNDLE": str(tiny_bundle), "DATA": str(data)}.get(a, a)
            for a in command]
    res = run_cli(light_env(tmp_path), *args, cwd=tmp_path)
    assert res.returncode == 5, res.stderr
    assert "Traceback" not in res.stderr
    assert f"needs the '{extra}' extra" in res.stderr
    assert f"pip install 'trt-bundle[{extra}]'" in res.stderr
    assert not out.exists()


def test_bench_runs_on_the_light_install(tmp_path, tiny_bundle):
    res = run_cli(light_env(tmp_path), "bench", str(tiny_bundle), "--batch-sizes", "1",
                  "--min-seconds", "0.01", "--no-end-to-end", "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert report["backend"] == "onnxruntime" and report["figures"]


def test_bench_without_onnxruntime_says_to_install_the_ort_extra(tmp_path, tiny_bundle):
    env = light_env(tmp_path, blocked=NOT_IN_ORT + ("onnxruntime",))
    res = run_cli(env, "bench", str(tiny_bundle), "--batch-sizes", "1", cwd=tmp_path)
    assert res.returncode == 5, res.stderr
    assert "Traceback" not in res.stderr
    assert "pip install 'trt-bundle[ort]'" in res.stderr


def test_families_on_the_light_install_says_it_cannot_build(tmp_path):
    env = light_env(tmp_path)
    res = run_cli(env, "families", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "timm_xception" in res.stdout
    assert "cannot build" in res.stderr and "pip install 'trt-bundle[export]'" in res.stderr
    rows = json.loads(run_cli(env, "families", "--json", cwd=tmp_path).stdout)
    assert rows and all(not r["buildable"] and "torch" in r["missing"] for r in rows)


def test_families_on_the_full_install_can_build(tmp_path):
    res = run_cli(dict(os.environ), "families", "--json", cwd=tmp_path)
    rows = json.loads(res.stdout)
    assert all(r["buildable"] and r["missing"] == [] for r in rows)
    assert "cannot build" not in res.stderr


def test_an_unforeseen_import_of_an_extra_module_is_reported_not_a_traceback():
    """The CLI's last net: a ModuleNotFoundError of an extra's module becomes exit 5."""
    import click
    from click.testing import CliRunner

    from bundler.cli import handle_errors

    @click.command()
    @click.argument("module")
    @handle_errors
    def needs(module: str) -> None:
        raise ModuleNotFoundError(f"No module named {module!r}", name=module)

    res = CliRunner().invoke(needs, ["torch._inductor"])
    assert res.exit_code == 5
    assert "needs the 'export' extra" in res.output and "torch._inductor" in res.output
    bug = CliRunner().invoke(needs, ["no_such_module_of_ours"])
    assert isinstance(bug.exception, ModuleNotFoundError)  # not an extra's: a bug, kept


def test_extra_modules_match_pyproject():
    import tomllib

    from runtime_py.extras import EXTRA_MODULES

    root = Path(__file__).resolve().parents[1]
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    import_names = {"onnx-graphsurgeon": "onnx_graphsurgeon", "prometheus-client": "prometheus_client",
                    "ml_dtypes": "ml_dtypes", "cuda-python": "cuda", "grpcio": "grpc",
                    "protobuf": "google", "pyyaml": "yaml"}
    for extra, modules in EXTRA_MODULES.items():
        dists = [req.split(">")[0].split("=")[0].split("[")[0].strip() for req in extras[extra]]
        assert sorted(modules) == sorted(import_names.get(d, d) for d in dists), extra
