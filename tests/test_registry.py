"""The engine-target registry (runtime_py.targets) is the one list of backends: the CLI's
--backend choices, the manifest schema, the runtime's runners and host checks follow it."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest

from runtime_py.targets import NAMES, TARGETS, engine_members, get_target

ROOT = Path(__file__).resolve().parents[1]


def _backend_choices(command: str) -> list[str]:
    from bundler.cli import cli

    option = next(p for p in cli.commands[command].params if p.name == "backend")
    assert isinstance(option.type, click.Choice), f"bundle {command} --backend is not a choice"
    return list(option.type.choices)


@pytest.mark.parametrize("command", ["make", "study", "serve", "bench", "eval"])
def test_cli_backend_choices_are_auto_and_the_registry(command):
    assert _backend_choices(command) == ["auto", *NAMES]


@pytest.mark.parametrize("command", ["rebuild", "verify"])
def test_cli_backend_choices_without_auto_are_the_registry(command):
    assert _backend_choices(command) == list(NAMES)


def _commands(group, path=()):
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from _commands(command, path + (name,))
        else:
            yield " ".join(path + (name,)), command


def test_every_cli_choice_that_names_a_backend_is_the_registry():
    """Every option of every command (export's subcommands included) whose choices name an
    engine target offers exactly the registry's names, so that a new target needs no CLI
    edit."""
    from bundler.cli import cli

    seen = 0
    for name, command in _commands(cli):
        for option in command.params:
            choices = list(getattr(option.type, "choices", ()))
            if set(choices) & set(NAMES):
                seen += 1
                assert choices in (["auto", *NAMES], list(NAMES)), (name, option.name, choices)
    assert seen >= 9      # make study serve bench eval rebuild verify, export triton/kserve


def test_cli_refuses_a_backend_not_in_the_registry():
    from click.testing import CliRunner

    from bundler.cli import cli

    result = CliRunner().invoke(cli, ["rebuild", "x.bundle", "--backend", "tvm"])
    assert result.exit_code == 2
    assert all(name in result.output for name in NAMES)


def test_manifest_schema_names_the_registry_backends_and_their_details():
    schema = json.loads((ROOT / "schemas" / "manifest.schema.json").read_text())
    engine = schema["properties"]["engine"]
    assert sorted(engine["properties"]["backend"]["enum"]) == sorted(NAMES)
    text = json.dumps(schema)
    for target in TARGETS:
        assert target.details_schema in schema["$defs"], target.name
        assert f'"const": "{target.name}"' in text, target.name


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.name)
def test_every_target_resolves_its_runner_check_and_builder(target):
    from runtime_py.engines import runner_class

    cls = runner_class(target.name)
    assert cls is target.runner_class()
    assert callable(target.host_check())
    assert callable(target.builder().build_target)


def test_runtime_and_compat_read_the_registry():
    from runtime_py.compat import HostInfo, check_target, choose_backend
    from runtime_py.errors import EngineUnavailableError, UsageError
    from runtime_py.model import PLATFORMS

    assert PLATFORMS == {t.name: t.platform for t in TARGETS}
    assert set(engine_members()) == {t.member for t in TARGETS} - {"model.onnx"}
    for name in NAMES:
        assert choose_backend(name, HostInfo()) == name
    with pytest.raises(UsageError, match="choose auto or one of"):
        choose_backend("tvm", HostInfo())
    with pytest.raises(EngineUnavailableError, match="cannot yet check or run 'tvm'"):
        check_target({"backend": "tvm", "details": {}}, HostInfo())
    with pytest.raises(UsageError, match="unknown backend"):
        get_target("tvm")


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.name)
def test_every_host_check_lives_next_to_its_runner(target):
    runner_module = target.runner_path.partition(":")[0]
    check_module = target.check_path.partition(":")[0]
    assert check_module == f"{runner_module}_compat"
    assert target.host_check().__module__ == check_module


def test_compat_holds_no_target_s_check():
    import runtime_py.compat as compat

    checks = [name for name in vars(compat) if name.startswith("check_")]
    assert checks == ["check_target"]


def test_the_host_checks_import_no_engine_package_and_no_bundler():
    code = ("import sys; from runtime_py.targets import TARGETS; "
            "[t.host_check() for t in TARGETS]; "
            "print(sorted(m for m in ('torch', 'onnx', 'onnxruntime', 'tensorrt', 'bundler', "
            "'numpy') if m in sys.modules))")
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=str(ROOT))
    assert out.stdout.strip() == "[]"


def test_check_target_runs_the_backend_s_own_check():
    from runtime_py.compat import GpuInfo, HostInfo, check_target
    from runtime_py.errors import EngineUnavailableError

    with pytest.raises(EngineUnavailableError, match="ONNX Runtime, which is not installed"):
        check_target({"backend": "onnxruntime", "details": {}}, HostInfo())
    with pytest.raises(EngineUnavailableError, match="TensorRT is not installed"):
        check_target({"backend": "tensorrt", "details": {}}, HostInfo(gpus=(GpuInfo("g", (9, 0)),)))
    with pytest.raises(EngineUnavailableError, match="torch is not installed on this host"):
        check_target({"backend": "torch-aoti", "details": {"torch_version": "2.14.1"}}, HostInfo())


@pytest.mark.parametrize("backend, details, device", [
    ("onnxruntime", {"opset": 21}, None),                    # the providers pick
    ("tensorrt", {}, "gpu"),
    ("torch-aoti", {"device": "cuda"}, "gpu"),
    ("torch-aoti", {"device": "cpu"}, "cpu"),
])
def test_where_an_engine_runs_comes_from_its_target(backend, details, device):
    assert get_target(backend).device(details) == device


def test_a_target_s_runs_on_is_checked():
    from runtime_py.targets import EngineTarget

    with pytest.raises(ValueError, match="runs_on"):
        EngineTarget("x", "engine.x", "x", (), "x_details", "m:c", "m:r", "m", runs_on="tpu")
