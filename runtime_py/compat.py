"""Can this host run that engine target? Host probing, the shared helpers of the
per-target checks, and the dispatch to them.

Two halves, kept apart on purpose:

* ``probe_host()`` looks at the machine (which engine packages are installed, which GPUs
  are visible) and returns a ``HostInfo``. It never raises because something is missing,
  and it imports nothing heavy unless asked: package versions come from installed
  distribution metadata, GPUs from cuda-python (or ``nvidia-smi`` when cuda-python is
  absent).
* The decisions are pure functions of a manifest's ``engine.details`` and a ``HostInfo``.
  That is what lets every decision and every message be tested on a machine without
  TensorRT or a GPU, by constructing the ``HostInfo`` of a hypothetical host. Each target
  owns its decision, next to its runner (``runtime_py/engines/<backend>_compat.py``,
  named by the target's ``EngineTarget.check_path``, imported only when a bundle of that
  target is checked); ``check_target`` dispatches through the registry, and
  ``choose_backend`` resolves ``--backend auto``.

Adding a backend: write its ``check_<backend>_target(details, host, device=0)`` in
``runtime_py/engines/<backend>_compat.py`` with the helpers here (``require_gpu``,
``parse_version``, ...) and name it in the backend's ``EngineTarget``
(``runtime_py.targets``). Only a host fact that ``HostInfo`` does not yet hold (a new
package's version, say) needs a field here and its probe in ``probe_host``.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

from runtime_py.errors import EngineUnavailableError, UsageError

TRT_INSTALL_HINT = "pip install 'trt-bundle[trt]'"


class GpuInfo(NamedTuple):
    """One visible GPU: its name and compute capability, e.g. ("NVIDIA H200", (9, 0))."""

    name: str
    compute_capability: tuple[int, int]

    @property
    def sm(self) -> str:
        return sm_name(self.compute_capability)


@dataclass(frozen=True)
class HostInfo:
    """What this host offers to engines. Fields are None (or empty) when unknown/absent.

    ``notes`` says why something could not be probed (for error messages: "no GPU" reads
    differently when the driver is missing than when the machine has none).
    """

    tensorrt_version: str | None = None
    gpus: tuple[GpuInfo, ...] = ()
    cuda_driver_version: str | None = None
    cuda_runtime_version: str | None = None
    cuda_python_version: str | None = None
    onnxruntime_version: str | None = None
    torch_version: str | None = None
    torch_cuda_version: str | None = None
    notes: tuple[str, ...] = field(default=())


# --- small pure helpers --------------------------------------------------------------

def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, which containers and taskset
    narrow; ``os.cpu_count()`` counts the machine's)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def parse_version(text: str) -> tuple[int, ...]:
    """Leading numeric components of a version string: "11.4.0.106" -> (11, 4, 0, 106)."""
    parts = []
    for piece in str(text).split("."):
        m = re.match(r"\d+", piece)
        if not m:
            break
        parts.append(int(m.group()))
        if m.end() != len(piece):
            break
    if not parts:
        raise ValueError(f"not a version: {text!r}")
    return tuple(parts)


def major_minor(text: str) -> str:
    v = parse_version(text)
    return f"{v[0]}.{v[1] if len(v) > 1 else 0}"


def parse_compute_capability(text: str | tuple[int, int]) -> tuple[int, int]:
    """"9.0" (the manifest's form), "sm_90" or (9, 0) -> (9, 0)."""
    if isinstance(text, tuple):
        return (int(text[0]), int(text[1]))
    m = re.fullmatch(r"(\d+)\.(\d+)", str(text)) or re.fullmatch(r"sm_?(\d+)(\d)", str(text))
    if not m:
        raise ValueError(f"not a compute capability: {text!r}")
    return (int(m.group(1)), int(m.group(2)))


def sm_name(cc: tuple[int, int]) -> str:
    return f"sm_{cc[0]}{cc[1]}"


def cc_string(cc: tuple[int, int]) -> str:
    """The manifest's form: (9, 0) -> "9.0"."""
    return f"{cc[0]}.{cc[1]}"


# --- GPUs ----------------------------------------------------------------------------

def require_gpu(host: HostInfo, device: int, engine: str) -> GpuInfo:
    """GPU `device` of this host, or EngineUnavailableError saying what to do instead."""
    if not host.gpus:
        why = f" ({'; '.join(host.notes)})" if host.notes else ""
        raise EngineUnavailableError(
            f"this bundle's engine is {engine}, which needs an NVIDIA GPU, but no GPU is "
            f"visible on this host{why}: run it on a GPU host, or run the bundle's portable "
            "ONNX with `--backend onnxruntime` (`bundle rebuild BUNDLE --backend onnxruntime` "
            "makes such a bundle)")
    if not 0 <= device < len(host.gpus):
        raise EngineUnavailableError(
            f"GPU {device} was asked for, but this host has {len(host.gpus)} GPU(s) "
            f"(0..{len(host.gpus) - 1})")
    return host.gpus[device]


def check_target(engine: dict, host: HostInfo, device: int = 0) -> None:
    """Check a manifest's ``engine`` entry ({backend, member, details}) against ``host``
    with the backend's check from the registry (``runtime_py.targets``)."""
    from runtime_py.targets import NAMES, get_target

    backend = engine["backend"]
    if backend not in NAMES:
        raise EngineUnavailableError(
            f"this runtime cannot yet check or run {backend!r} bundles")
    check: Callable[[dict, HostInfo, int], None] = get_target(backend).host_check()
    check(engine.get("details") or {}, host, device)


def choose_backend(requested: str, host: HostInfo) -> str:
    """The engine target for ``--backend REQUESTED`` on ``host``.

    "auto" means tensorrt where TensorRT is installed and a GPU is visible, else
    onnxruntime (which runs every bundle). Any other name is returned as given (after
    checking it names a backend), so that an explicit request fails later with the
    backend's own message rather than being silently replaced.
    """
    from runtime_py.targets import NAMES as BACKENDS

    if requested == "auto":
        return "tensorrt" if host.tensorrt_version and host.gpus else "onnxruntime"
    if requested not in BACKENDS:
        raise UsageError(f"unknown backend {requested!r}; choose auto or one of "
                         f"{', '.join(BACKENDS)}")
    return requested


# --- probing ---------------------------------------------------------------------------

def _dist_version(*names: str) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _module_present(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def probe_tensorrt(import_module: bool = False) -> str | None:
    """TensorRT's version, or None when the ``tensorrt`` module is not importable.

    Without ``import_module`` the version comes from the installed wheel's metadata
    (``tensorrt``, ``tensorrt-cu13`` or ``tensorrt-cu12``), which costs nothing; with it
    (or when no wheel metadata exists, e.g. a Debian package) the module is imported and
    ``tensorrt.__version__`` is authoritative.
    """
    if not _module_present("tensorrt"):
        return None
    if not import_module:
        version = _dist_version("tensorrt", "tensorrt-cu13", "tensorrt-cu12", "tensorrt-cu11")
        if version:
            return version
    try:
        import tensorrt
    except Exception:  # a broken install (missing libnvinfer) is "not available"
        return None
    return str(tensorrt.__version__)


def import_cudart():
    """cuda-python's runtime module: ``cuda.bindings.runtime``, or ``cuda.cudart`` (older).

    Raises EngineUnavailableError naming the package when neither is importable.
    """
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        try:
            from cuda import cudart  # cuda-python < 12.6 layout
        except ImportError:
            raise EngineUnavailableError(
                "the tensorrt engine manages GPU memory with cuda-python, which is not "
                f"installed: `{TRT_INSTALL_HINT}` (or `pip install cuda-python`)") from None
    return cudart


def _cuda_version_string(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"


def _probe_gpus_cuda_python(notes: list[str]) -> tuple[tuple[GpuInfo, ...], str | None, str | None]:
    cudart = import_cudart()
    driver = runtime = None
    err, v = cudart.cudaDriverGetVersion()
    if err == cudart.cudaError_t.cudaSuccess and v:
        driver = _cuda_version_string(v)
    err, v = cudart.cudaRuntimeGetVersion()
    if err == cudart.cudaError_t.cudaSuccess:
        runtime = _cuda_version_string(v)
    err, count = cudart.cudaGetDeviceCount()
    if err != cudart.cudaError_t.cudaSuccess:
        notes.append(f"CUDA reports {err.name}")
        return (), driver, runtime
    gpus = []
    for i in range(count):
        err, props = cudart.cudaGetDeviceProperties(i)
        if err != cudart.cudaError_t.cudaSuccess:
            notes.append(f"GPU {i}: {err.name}")
            continue
        name = props.name
        name = name.split(b"\0", 1)[0].decode() if isinstance(name, bytes) else str(name)
        gpus.append(GpuInfo(name, (int(props.major), int(props.minor))))
    return tuple(gpus), driver, runtime


def _probe_gpus_nvidia_smi(notes: list[str]) -> tuple[GpuInfo, ...]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        notes.append("no NVIDIA driver found (no nvidia-smi, no cuda-python)")
        return ()
    try:
        out = subprocess.run([exe, "--query-gpu=name,compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        notes.append(f"nvidia-smi failed: {exc}")
        return ()
    gpus = []
    for line in out.splitlines():
        if "," in line:
            name, cc = line.rsplit(",", 1)
            try:
                gpus.append(GpuInfo(name.strip(), parse_compute_capability(cc.strip())))
            except ValueError:
                notes.append(f"nvidia-smi: unreadable line {line!r}")
    return tuple(gpus)


def probe_host(*, import_tensorrt: bool = False, probe_gpus: bool = True,
               probe_torch: bool = False) -> HostInfo:
    """Describe this host. Never raises for a missing package, driver or GPU.

    ``import_tensorrt``: read the version from the imported module (see probe_tensorrt).
    ``probe_torch``: import torch for its version and CUDA build (heavy: off by default).
    """
    notes: list[str] = []
    gpus: tuple[GpuInfo, ...] = ()
    driver = runtime = None
    if probe_gpus:
        try:
            gpus, driver, runtime = _probe_gpus_cuda_python(notes)
        except EngineUnavailableError:
            gpus = _probe_gpus_nvidia_smi(notes)
        except Exception as exc:  # a broken driver must read as "no GPU", not a crash
            notes.append(f"GPU probe failed: {exc}")
    torch_version = torch_cuda = None
    if probe_torch and _module_present("torch"):
        try:
            import torch

            torch_version = str(torch.__version__)
            torch_cuda = torch.version.cuda
        except Exception as exc:
            notes.append(f"torch import failed: {exc}")
    elif _module_present("torch"):
        torch_version = _dist_version("torch")
    return HostInfo(
        tensorrt_version=probe_tensorrt(import_tensorrt),
        gpus=gpus,
        cuda_driver_version=driver,
        cuda_runtime_version=runtime,
        cuda_python_version=_dist_version("cuda-python", "cuda-bindings"),
        onnxruntime_version=_dist_version("onnxruntime", "onnxruntime-gpu")
        if _module_present("onnxruntime") else None,
        torch_version=torch_version,
        torch_cuda_version=torch_cuda,
        notes=tuple(notes),
    )


