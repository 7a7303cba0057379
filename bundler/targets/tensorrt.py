"""The tensorrt target: a serialized plan built from the bundle's precision-typed ONNX.

Written against the TensorRT 11 Python API, with the 10.x differences detected at run time
(docs/tensorrt.md lists each call and the page it was checked against). The network is
strongly typed: the precision lives in the ONNX (fp16 casts, fp8 Q/DQ), so no precision
builder flag is set (TensorRT 11 removed them; on 10.x the STRONGLY_TYPED creation flag
gives the same semantics). The build is:

    parse ONNX -> one optimization profile over the batch range -> optimization level,
    workspace limit, timing cache, hardware/version compatibility -> build_serialized_network
    -> deserialize once to count layers with the engine inspector.

Everything that does not need TensorRT (option checks, input shapes and the profile,
parser-error formatting, the manifest details, the target tag) is a pure function here
and is tested on hosts without TensorRT; only `build_tensorrt_plan` imports it.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NamedTuple

from bundler.targets import TargetBuild
from runtime_py.compat import (
    TRT_INSTALL_HINT,
    cc_string,
    major_minor,
    parse_version,
    probe_host,
)
from runtime_py.errors import BundleError, EngineUnavailableError, UsageError

HARDWARE_COMPAT = ("none", "ampere+", "same-compute-capability")
_HW_ENUM = {"none": "NONE", "ampere+": "AMPERE_PLUS",
            "same-compute-capability": "SAME_COMPUTE_CAPABILITY"}

Log = Callable[[str], None]


class TensorRTBuildError(BundleError):
    """TensorRT could not parse the ONNX or build a plan from it."""


class OnnxParseError(TensorRTBuildError):
    """The TensorRT ONNX parser rejected nodes of the graph; `problems` lists each one."""


@dataclass(frozen=True)
class TensorRTBuildResult:
    plan: bytes
    details: dict                   # exactly the manifest's engine.details for tensorrt
    timing_cache_bytes: bytes | None


class InputSpec(NamedTuple):
    name: str
    shape: tuple[int | str, ...]    # batch axis first, as a string or -1 when dynamic


class ParserErrorInfo(NamedTuple):
    """One TensorRT ONNX parser error, as plain data (so its formatting is testable)."""

    node_index: int
    node_name: str
    node_operator: str
    code: str
    description: str


# --- the family's settings (family.json "tensorrt"; bundler.families hands them over) ----

#: family.json's key of this target's section.
SECTION = "tensorrt"


@dataclass(frozen=True)
class TensorRTSettings:
    """A family's ``tensorrt`` section: the builder optimization level its plans are built
    with unless make is told otherwise (0..5, TensorRT's default 3)."""

    optimization_level: int = 3

    @classmethod
    def from_section(cls, section) -> "TensorRTSettings":
        return cls(int((section or {}).get("optimization_level", 3)))


#: the settings of a section ``section_problems`` found nothing wrong with
from_section = TensorRTSettings.from_section


def section_problems(section, batch) -> list[str]:
    """What is wrong with a family's ``tensorrt`` section."""
    if not isinstance(section, dict):
        return ["tensorrt: must be an object"]
    level = section.get("optimization_level", 3)
    if not (type(level) is int and 0 <= level <= 5):
        return [f"tensorrt.optimization_level: {level!r} must be an integer 0..5"]
    return []


# --- pure helpers ---------------------------------------------------------------------

def check_build_options(*, min_batch: int, opt_batch: int, max_batch: int,
                        optimization_level: int, hardware_compat: str,
                        workspace_bytes: int | None) -> None:
    """Refuse impossible options before anything is imported or built."""
    problems = []
    if not (isinstance(min_batch, int) and isinstance(opt_batch, int)
            and isinstance(max_batch, int) and 1 <= min_batch <= opt_batch <= max_batch):
        problems.append(f"batch sizes must satisfy 1 <= min <= opt <= max, got "
                        f"min={min_batch} opt={opt_batch} max={max_batch}")
    if not (isinstance(optimization_level, int) and 0 <= optimization_level <= 5):
        problems.append(f"optimization level must be 0..5, got {optimization_level!r}")
    if hardware_compat not in HARDWARE_COMPAT:
        problems.append(f"hardware compatibility must be one of {', '.join(HARDWARE_COMPAT)}, "
                        f"got {hardware_compat!r}")
    if workspace_bytes is not None and (not isinstance(workspace_bytes, int)
                                        or workspace_bytes <= 0):
        problems.append(f"workspace must be a positive number of bytes, got {workspace_bytes!r}")
    if problems:
        raise UsageError("; ".join(problems), problems=problems)


def onnx_inputs(onnx_bytes: bytes) -> list[InputSpec]:
    """The graph's real inputs (initializers excluded) with their declared shapes."""
    import onnx

    try:
        model = onnx.load_model_from_string(onnx_bytes)
    except Exception as exc:
        raise TensorRTBuildError(f"model.onnx is not a readable ONNX model: {exc}") from None
    initializers = {i.name for i in model.graph.initializer}
    specs = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        dims = []
        for d in value.type.tensor_type.shape.dim:
            if d.HasField("dim_value"):
                dims.append(int(d.dim_value))
            else:
                dims.append(d.dim_param or -1)
        specs.append(InputSpec(value.name, tuple(dims)))
    return specs


def profile_shapes(inputs: list[InputSpec], min_batch: int, opt_batch: int,
                   max_batch: int) -> dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]:
    """(min, opt, max) shapes per input: the batch axis (axis 0) varies, the rest is fixed.

    The plan's profile must cover exactly the batch range the manifest promises; any other
    dynamic axis would need its own range, which bundles do not have: refuse it.
    """
    shapes = {}
    for spec in inputs:
        if not spec.shape:
            raise TensorRTBuildError(f"input {spec.name!r} is a scalar: no batch axis")
        rest = spec.shape[1:]
        dynamic = [i + 1 for i, d in enumerate(rest) if not isinstance(d, int) or d < 1]
        if dynamic:
            raise TensorRTBuildError(
                f"input {spec.name!r} has dynamic axes {dynamic} besides the batch axis "
                f"(shape {list(spec.shape)}): export the ONNX with fixed image sizes")
        shapes[spec.name] = tuple((b, *rest) for b in (min_batch, opt_batch, max_batch))
    return shapes


def format_parser_errors(errors: list[ParserErrorInfo]) -> OnnxParseError:
    """One error listing every node the parser rejected (index, name, operator, why)."""
    problems = []
    for e in errors:
        where = (f"node {e.node_index} {e.node_name!r} ({e.node_operator})"
                 if e.node_index >= 0 else "graph")
        problems.append(f"{where}: {e.description} [{e.code}]")
    if not problems:
        problems = ["the parser failed without reporting an error (see the TensorRT log)"]
    return OnnxParseError(
        f"TensorRT could not parse model.onnx ({len(problems)} error(s)): " + "; ".join(problems),
        problems=problems)


def layer_count_from_inspector(json_text: str) -> int:
    """Number of layers in the engine inspector's JSON (its "Layers" list)."""
    try:
        info = json.loads(json_text)
        layers = info["Layers"]
    except (ValueError, KeyError, TypeError) as exc:
        raise TensorRTBuildError(f"unexpected engine inspector output ({exc})") from None
    return len(layers)


def tensorrt_details(*, tensorrt_version: str, compute_capability: tuple[int, int],
                     device_name: str, optimization_level: int, min_batch: int,
                     opt_batch: int, max_batch: int, hardware_compat: str,
                     version_compatible: bool, layer_count: int,
                     workspace_bytes: int | None = None,
                     timing_cache_sha256: str | None = None,
                     build_seconds: float | None = None) -> dict:
    """The manifest's `engine.details` for a plan (schemas: `$defs/tensorrt_details`)."""
    details = {
        "tensorrt_version": tensorrt_version,
        "compute_capability": cc_string(compute_capability),
        "device_name": device_name,
        "optimization_level": optimization_level,
        "profile": {"min": min_batch, "opt": opt_batch, "max": max_batch},
        "hardware_compatibility": hardware_compat,
        "version_compatible": bool(version_compatible),
        "strongly_typed": True,
        "layer_count": layer_count,
        "timing_cache_sha256": timing_cache_sha256,
    }
    if workspace_bytes is not None:
        details["workspace_bytes"] = workspace_bytes
    if build_seconds is not None:
        details["build_seconds"] = format(build_seconds, ".6g")
    return details


def target_tag(details: dict) -> str:
    """The `<target>` part of the bundle name: what the plan is tied to.

    "tensorrt-sm90-trt11.4"; "ampere+" replaces the sm when hardware-compatible, and a
    trailing "+" marks a version-compatible plan ("tensorrt-ampere+-trt11.4+").
    """
    hw = details["hardware_compatibility"]
    gpu = "ampere+" if hw == "ampere+" else "sm" + details["compute_capability"].replace(".", "")
    trt = "trt" + major_minor(details["tensorrt_version"])
    return f"tensorrt-{gpu}-{trt}{'+' if details['version_compatible'] else ''}"


def _sha256_tag(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _write_atomically(path: Path, data: bytes) -> None:
    from bundler.writer import atomic_write

    atomic_write(path, [data])


# --- TensorRT itself -------------------------------------------------------------------

def import_tensorrt():
    """The `tensorrt` module, or EngineUnavailableError saying how to install it."""
    try:
        import tensorrt
    except ImportError as exc:
        raise EngineUnavailableError(
            "building a TensorRT plan needs TensorRT, which is not importable here "
            f"({exc}): install it with `{TRT_INSTALL_HINT}` on a host with an NVIDIA GPU, "
            "or build for ONNX Runtime with `--backend onnxruntime`") from None
    return tensorrt


def make_logger(trt, log: Log | None, min_severity: str = "WARNING"):
    """A trt.ILogger forwarding messages to `log` and keeping errors for our messages."""

    class _Logger(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.errors: list[str] = []
            self._min = getattr(trt.ILogger.Severity, min_severity)

        def log(self, severity, msg) -> None:  # noqa: A003 (TensorRT's name)
            if severity in (trt.ILogger.Severity.ERROR, trt.ILogger.Severity.INTERNAL_ERROR):
                self.errors.append(str(msg))
            if log is not None and int(severity) <= int(self._min):
                log(f"[TensorRT {severity.name}] {msg}")

    return _Logger()


def _create_network(trt, builder):
    """A strongly typed network: implicit in TensorRT 11 (the flag is deprecated and
    ignored there), the STRONGLY_TYPED creation flag on 10.x."""
    if parse_version(trt.__version__)[0] >= 11:
        return builder.create_network(0)
    flag = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    return builder.create_network(flag)


def _parser_errors(parser) -> list[ParserErrorInfo]:
    errors = []
    for i in range(parser.num_errors):
        e = parser.get_error(i)

        def call(name: str, default):
            fn = getattr(e, name, None)
            try:
                return fn() if fn is not None else default
            except Exception:
                return default

        code = call("code", "")
        errors.append(ParserErrorInfo(
            node_index=int(call("node", -1)),
            node_name=str(call("node_name", "") or ""),
            node_operator=str(call("node_operator", "") or ""),
            code=getattr(code, "name", str(code)),
            description=str(call("desc", "")),
        ))
    return errors


def check_host(device: int = 0, **_options: object) -> None:
    """Refuse early (before `bundle make` exports anything) when this host cannot build
    plans: TensorRT missing, or no NVIDIA GPU `device`."""
    import_tensorrt()
    host = probe_host(import_tensorrt=True)
    if not 0 <= device < len(host.gpus):
        raise EngineUnavailableError(
            f"building a TensorRT plan needs NVIDIA GPU {device}, and this host has "
            f"{len(host.gpus)} GPU(s)" + (f" ({'; '.join(host.notes)})" if host.notes else ""))


def build_tensorrt_plan(onnx_bytes: bytes, *, opt_batch: int, max_batch: int,
                        min_batch: int = 1, optimization_level: int = 3,
                        timing_cache: Path | None = None, hardware_compat: str = "none",
                        version_compatible: bool = False, workspace_bytes: int | None = None,
                        device: int = 0, log: Log | None = None) -> TensorRTBuildResult:
    """Build a plan for GPU `device` of this host from a precision-typed ONNX.

    `timing_cache`: a file read before the build (missing: start empty) and rewritten
    (atomically) with the updated cache after it; `details["timing_cache_sha256"]` is the
    digest of the cache the build started from (None when it started empty), since that
    is what influenced tactic choice. Raises UsageError (bad options), EngineUnavailableError
    (no TensorRT / no GPU), OnnxParseError, TensorRTBuildError.
    """
    check_build_options(min_batch=min_batch, opt_batch=opt_batch, max_batch=max_batch,
                        optimization_level=optimization_level,
                        hardware_compat=hardware_compat, workspace_bytes=workspace_bytes)
    shapes = profile_shapes(onnx_inputs(onnx_bytes), min_batch, opt_batch, max_batch)
    trt = import_tensorrt()
    check_host(device)
    gpu = probe_host(import_tensorrt=True).gpus[device]
    if hardware_compat == "ampere+" and gpu.compute_capability < (8, 0):
        raise UsageError(f"--hardware-compat ampere+ needs an Ampere or newer GPU to build "
                         f"on; GPU {device} ({gpu.name}) is {gpu.sm}")
    hw_enum_name = _HW_ENUM[hardware_compat]
    if not hasattr(trt.HardwareCompatibilityLevel, hw_enum_name):
        raise UsageError(f"TensorRT {trt.__version__} has no hardware compatibility level "
                         f"{hw_enum_name}: use 'none' or 'ampere+'")

    started = time.monotonic()
    logger = make_logger(trt, log)
    builder = trt.Builder(logger)
    network = _create_network(trt, builder)
    parser = trt.OnnxParser(network, logger)
    ok = parser.parse(onnx_bytes)
    if not ok or parser.num_errors:
        raise format_parser_errors(_parser_errors(parser))

    config = builder.create_builder_config()
    config.builder_optimization_level = optimization_level
    # DETAILED so that the engine inspector reports every layer with its parameters.
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    if workspace_bytes is not None:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_bytes)
    if hardware_compat != "none":
        config.hardware_compatibility_level = getattr(trt.HardwareCompatibilityLevel,
                                                      hw_enum_name)
    if hasattr(trt.BuilderFlag, "TF32"):
        # TF32 (on by default) rounds fp32 matmul/conv inputs to 10-bit mantissas: an fp32
        # bundle would then differ from its ONNX Runtime reference by more than the fp32
        # tolerance (runtime_py.numerics). fp16/fp8 graphs are typed and unaffected.
        config.clear_flag(trt.BuilderFlag.TF32)
    if version_compatible:
        # The plan then carries its own lean runtime; a reader must allow host code
        # (runtime.engine_host_code_allowed) to deserialize it (runtime_py does).
        config.set_flag(trt.BuilderFlag.VERSION_COMPATIBLE)

    profile = builder.create_optimization_profile()
    for name, (lo, opt, hi) in shapes.items():
        profile.set_shape(name, lo, opt, hi)
    config.add_optimization_profile(profile)

    cache_in = b""
    if timing_cache is not None:
        timing_cache = Path(timing_cache)
        if timing_cache.is_file():
            cache_in = timing_cache.read_bytes()
    cache = config.create_timing_cache(cache_in)
    if not config.set_timing_cache(cache, ignore_mismatch=False):
        if log:
            log(f"timing cache {timing_cache} does not match this TensorRT/GPU: starting empty")
        cache_in = b""
        cache = config.create_timing_cache(b"")
        config.set_timing_cache(cache, ignore_mismatch=False)

    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise TensorRTBuildError("TensorRT failed to build the plan: "
                                 + ("; ".join(logger.errors) or "see the TensorRT log"),
                                 problems=logger.errors or None)
    plan = bytes(serialized)

    cache_out = None
    if timing_cache is not None:
        cache_out = bytes(config.get_timing_cache().serialize())
        _write_atomically(timing_cache, cache_out)

    layer_count = count_layers(trt, plan, logger, version_compatible)
    return TensorRTBuildResult(
        plan=plan,
        details=tensorrt_details(
            tensorrt_version=str(trt.__version__),
            compute_capability=gpu.compute_capability,
            device_name=gpu.name,
            optimization_level=optimization_level,
            min_batch=min_batch, opt_batch=opt_batch, max_batch=max_batch,
            hardware_compat=hardware_compat,
            version_compatible=version_compatible,
            layer_count=layer_count,
            workspace_bytes=workspace_bytes,
            timing_cache_sha256=_sha256_tag(cache_in) if cache_in else None,
            build_seconds=time.monotonic() - started,
        ),
        timing_cache_bytes=cache_out,
    )


def count_layers(trt, plan: bytes, logger, version_compatible: bool) -> int:
    """Layer count of a plan, from the engine inspector (needs a GPU: it deserializes)."""
    runtime = trt.Runtime(logger)
    if version_compatible:
        runtime.engine_host_code_allowed = True
    engine = runtime.deserialize_cuda_engine(plan)
    if engine is None:
        raise TensorRTBuildError("the plan just built could not be deserialized: "
                                 + ("; ".join(logger.errors) or "see the TensorRT log"))
    inspector = engine.create_engine_inspector()
    text = inspector.get_engine_information(trt.LayerInformationFormat.JSON)
    return layer_count_from_inspector(text)


def build_target(onnx_bytes: bytes, *, batch: dict, log: Log | None = None,
                 context: object = None, **options: object) -> TargetBuild:
    """Registry entry (bundler.targets): build a plan over the bundle's batch range.

    Options: optimization_level (default: the family's ``tensorrt.optimization_level``
    from ``context``, else 3), timing_cache, hardware_compat, version_compatible,
    workspace_bytes, device.
    """
    family = getattr(context, "family", None)
    if family is not None:
        options.setdefault("optimization_level",
                           family.target_settings("tensorrt").optimization_level)
    allowed = {"optimization_level", "timing_cache", "hardware_compat", "version_compatible",
               "workspace_bytes", "device"}
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise UsageError(f"unknown tensorrt build option(s) {unknown}; known: {sorted(allowed)}")
    result = build_tensorrt_plan(onnx_bytes, min_batch=int(batch["min"]),
                                 opt_batch=int(batch["opt"]), max_batch=int(batch["max"]),
                                 log=log, **options)  # type: ignore[arg-type]
    return TargetBuild(backend="tensorrt", member="engine.plan", engine_bytes=result.plan,
                       details=result.details, tag=target_tag(result.details))
