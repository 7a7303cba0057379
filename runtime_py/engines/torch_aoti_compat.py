"""Can this host run that AOTInductor package? The torch-aoti target's host check (its
``EngineTarget.check_path``): a pure function of ``engine.details`` and a ``HostInfo``
(``probe_host(probe_torch=True)``, or the runner's own ``torch_host()``). Imports no torch."""

from __future__ import annotations

from runtime_py.compat import (
    HostInfo,
    major_minor,
    parse_compute_capability,
    parse_version,
    require_gpu,
    sm_name,
)
from runtime_py.errors import CompatibilityError, EngineUnavailableError

__all__ = ["check_torch_aoti_target", "TORCH_INSTALL_HINT"]

TORCH_INSTALL_HINT = "pip install torch (the version the package was built with)"


def check_torch_aoti_target(details: dict, host: HostInfo, device: int = 0) -> None:
    """Raise unless this host can load and run the AOTInductor package ``details`` describes.

    A package is compiled code like a plan: its kernels are built for one compute
    capability and its shared library calls one torch's C++ ABI (AOTInductor promises no
    compatibility across torch releases). So: the same torch major.minor, the same CUDA
    major (the cubins and the runtime they link), the same compute capability. Packages
    compiled for the CPU (``device: "cpu"``) need only the torch version. Raises
    ``EngineUnavailableError`` when torch or a GPU is missing, ``CompatibilityError``
    naming every mismatch otherwise. ``host`` needs ``probe_host(probe_torch=True)``.
    """
    built_torch = details["torch_version"]
    if host.torch_version is None:
        raise EngineUnavailableError(
            f"this bundle's engine is an AOTInductor package built with torch "
            f"{major_minor(built_torch)}, and torch is not installed on this host: "
            f"`{TORCH_INSTALL_HINT}`, or run the bundle's ONNX with `--backend onnxruntime`")
    on_cpu = details.get("device") == "cpu"
    problems = []
    if major_minor(built_torch) != major_minor(host.torch_version):
        problems.append(f"torch {major_minor(built_torch)} != {major_minor(host.torch_version)}")
    gpu = None
    if not on_cpu:
        gpu = require_gpu(host, device, "an AOTInductor package")
        built_cuda = details.get("cuda_version")
        if host.torch_cuda_version is None:
            problems.append(f"the package needs CUDA {built_cuda} and this host's torch is a "
                            "CPU-only build")
        elif built_cuda and parse_version(built_cuda)[0] != parse_version(host.torch_cuda_version)[0]:
            problems.append(f"CUDA {parse_version(built_cuda)[0]} != "
                            f"{parse_version(host.torch_cuda_version)[0]} (torch's CUDA)")
        built_cc = parse_compute_capability(details["compute_capability"])
        if built_cc != gpu.compute_capability:
            problems.append(f"compute capability {sm_name(built_cc)} != "
                            f"{sm_name(gpu.compute_capability)} of GPU {device} ({gpu.name})")
    if not problems:
        return
    built = "the CPU" if on_cpu else (
        f"{sm_name(parse_compute_capability(details['compute_capability']))} with CUDA "
        f"{details.get('cuda_version')}")
    here = "" if gpu is None else (f"{sm_name(gpu.compute_capability)}, CUDA "
                                   f"{host.torch_cuda_version or 'none (CPU-only torch)'}, ")
    raise CompatibilityError(
        f"AOTInductor package built for {built} with torch {major_minor(built_torch)}; this "
        f"host has {here}torch {major_minor(host.torch_version)}: rebuild it here with "
        "`bundle rebuild BUNDLE --backend torch-aoti` (or `bundle make ... --backend "
        "torch-aoti`), or run the bundle's ONNX with `--backend onnxruntime`",
        problems=problems)
