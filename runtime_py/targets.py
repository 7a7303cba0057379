"""The engine targets: one descriptor per backend, in one registry.

Everything that differs between engine targets and is not the engine itself lives in its
``EngineTarget``: the backend name (manifests, ``--backend``), the engine member, the
serving platform, the packages recorded in a bundle's build, the manifest schema's
``$defs`` key for its ``engine.details``, the pure host check
(``runtime_py/engines/<backend>_compat.py``'s ``check_<backend>_target``), the runner class,
the builder module, the module of its family.json settings, and where its engine runs.
Code and data are named by dotted path and imported only when asked for, so reading the
registry imports no engine package (and ``runtime_py`` never imports ``bundler``).

The CLI's ``--backend`` choices, ``runtime_py.compat``, ``runtime_py.model``,
``bundle make``, ``bundle rebuild``, ``bundle study``, the family loader (each target's
family.json section) and the deployment exports read the list from here.

Adding a target touches its own files and one entry below: its builder
(``bundler/targets/<name>/``, with ``build_target``; a settings module there if families
choose its build settings), its runner (``runtime_py/engines/<name>.py``) and its host
check (``runtime_py/engines/<name>_compat.py``), one ``EngineTarget`` in ``TARGETS``, and, since the format changes, the manifest schema's
``backend`` enum and ``$defs`` entry and ``cpp_stub/src/checks.cpp`` (docs/architecture.md,
"Adding an engine target").
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

from runtime_py.errors import UsageError

__all__ = ["EngineTarget", "TARGETS", "NAMES", "get_target", "engine_members"]


def _load(dotted: str) -> Any:
    """``"pkg.module:attr"`` -> the attribute; ``"pkg.module"`` -> the module."""
    module_name, _, attr = dotted.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attr) if attr else module


#: ``EngineTarget.runs_on``'s values.
RUNS_ON = ("any", "gpu", "details")


@dataclass(frozen=True)
class EngineTarget:
    """What the project knows about one engine target (module docstring).

    ``from_onnx``: the engine is built from the bundle's typed ``model.onnx`` alone, so
    ``bundle rebuild`` needs nothing else; otherwise (torch-aoti) the builder also needs
    the family's torch model, which ``bundle rebuild`` rebuilds from the weights.

    ``named_before_build``: the bundle name's target tag is the backend name, so make and
    rebuild refuse an existing bundle of that name before any work; false where the tag
    records what the build found (tensorrt: the GPU and TensorRT version), checked once
    the engine is built (still before anything is written).

    ``settings_path``: the module that checks and reads the target's section of a
    family's family.json (``settings_module``), where the target has one.

    ``runs_on``: where the engine can run. "any" where the runtime picks the device (ONNX
    Runtime's execution providers), "gpu" where it runs on a GPU only (a TensorRT plan),
    "details" where its build chose and recorded it as ``engine.details.device`` ("cpu"
    or "cuda": an AOTInductor package is compiled for one). Deployment (GPU requests,
    Triton instance kinds) reads it through ``device``.
    """

    name: str
    member: str
    platform: str
    packages: tuple[str, ...]
    details_schema: str
    check_path: str
    runner_path: str
    builder_path: str
    from_onnx: bool = True
    named_before_build: bool = True
    runs_on: str = "any"
    settings_path: str | None = None

    def __post_init__(self) -> None:
        if self.runs_on not in RUNS_ON:
            raise ValueError(f"{self.name}: runs_on must be one of {RUNS_ON}, not {self.runs_on!r}")

    def device(self, details: dict) -> str | None:
        """"cpu" or "gpu" where an engine with these ``details`` runs only there; None
        where the runtime picks (``runs_on``)."""
        if self.runs_on == "details":
            return "cpu" if details.get("device") == "cpu" else "gpu"
        return None if self.runs_on == "any" else self.runs_on

    def host_check(self) -> Callable[..., None]:
        """``check(details, host, device=0)``: raises unless ``host`` can run the engine."""
        return _load(self.check_path)

    def runner_class(self) -> type:
        """The runner class (its module imported now; its engine package is not)."""
        return _load(self.runner_path)

    def settings_module(self) -> Any:
        """The module that checks and reads the target's section of a family.json
        (``SECTION``, ``section_problems(section, batch)``, ``from_section(section)``), or
        None where the target has no family settings. Lives in ``bundler``."""
        return _load(self.settings_path) if self.settings_path else None

    def builder(self) -> Any:
        """The builder module (``build_target(onnx_bytes, *, batch, log, context, **options)``;
        optionally ``check_host(**options)`` and ``reuse_checks(details, family, req)``).

        Lives in ``bundler``: only build hosts have it."""
        return _load(self.builder_path)


TARGETS: tuple[EngineTarget, ...] = (
    EngineTarget("onnxruntime", "model.onnx", "onnxruntime_onnx", ("onnxruntime",),
                 "onnxruntime_details",
                 check_path="runtime_py.engines.onnxruntime_compat:check_onnxruntime_target",
                 runner_path="runtime_py.engines.onnxruntime:OnnxRuntimeRunner",
                 builder_path="bundler.targets.onnxruntime"),
    EngineTarget("tensorrt", "engine.plan", "tensorrt_plan", ("tensorrt",),
                 "tensorrt_details",
                 check_path="runtime_py.engines.tensorrt_compat:check_tensorrt_target",
                 runner_path="runtime_py.engines.tensorrt:TensorRTRunner",
                 builder_path="bundler.targets.tensorrt", named_before_build=False,
                 runs_on="gpu", settings_path="bundler.targets.tensorrt"),
    EngineTarget("torch-aoti", "engine.pt2", "pytorch_aoti", ("torch",),
                 "torch_aoti_details",
                 check_path="runtime_py.engines.torch_aoti_compat:check_torch_aoti_target",
                 runner_path="runtime_py.engines.torch_aoti:TorchAotiRunner",
                 builder_path="bundler.targets.torch_aoti", from_onnx=False,
                 runs_on="details", settings_path="bundler.targets.torch_aoti.settings"),
)

#: Backend names, in registry order: what ``--backend`` offers (plus ``auto`` where it applies).
NAMES: tuple[str, ...] = tuple(t.name for t in TARGETS)
_BY_NAME = {t.name: t for t in TARGETS}


def get_target(name: str) -> EngineTarget:
    """The descriptor of backend ``name``; UsageError naming the known ones otherwise."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise UsageError(f"unknown backend {name!r}; choose one of {', '.join(NAMES)}") from None


def engine_members() -> tuple[str, ...]:
    """The members that are an engine other than ``model.onnx`` (replaced on rebuild)."""
    return tuple(t.member for t in TARGETS if t.member != "model.onnx")
