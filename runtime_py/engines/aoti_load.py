"""Loading an AOTInductor package's graphs with torch's own package loader, and no more.

torch's public loaders (``aoti_load_package``, ``load_package``, ``load_pt2``) end every
load by comparing the package's build host with this one for a log line, and to name this
CPU's vector ISA they compile a test library per ISA and load each in a child Python that
imports torch. On an H100 with torch 2.11 that survey was 27.4 s of the 36-s load of
timm_xception's fp16 package, in every process (torch 2.14 remembers its results on disk,
after paying once per machine); the graphs themselves loaded in 0.09 s
(docs/measurements/h100-2026-12-06-b). The runner compares the hosts itself, before any
load (``check_torch_aoti_target``), so it builds each graph with the loader those
functions end in, ``torch._C._aoti.AOTIModelPackageLoader``, and calls it as their wrapper
does, without importing ``torch._inductor`` for that wrapper (``PackageGraph``).

Nothing here imports torch at module level: the load check's child process imports this
module (``torch_aoti.LOAD_CHECK_CODE``).
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

from runtime_py.errors import BundleError

#: The dynamic-batch graph's name in the package (AOTInductor's default model name).
DYNAMIC_MODEL = "model"


def package_graph_names(path: Path) -> set[str]:
    """The graphs the package at ``path`` holds: the folders under ``*/aotinductor/``."""
    graphs = set()
    with zipfile.ZipFile(path) as archive:
        for member in archive.namelist():
            _, under, rest = member.partition("/aotinductor/")
            graph, inside, _ = rest.partition("/")
            if under and inside:
                graphs.add(graph)
    return graphs


def load_graphs(torch, path: Path, names: list[str], *, device_index: int = -1,
                run_single_threaded: bool = False) -> dict[str, Any]:
    """The package's graphs ``names``, each a callable (``PackageGraph``).

    ``device_index`` -1 for a CPU package. BundleError names a graph the package lacks,
    before anything is loaded; a graph that fails to load raises torch's error.
    """
    try:
        held = package_graph_names(path)
    except (OSError, zipfile.BadZipFile) as exc:
        raise BundleError(f"the bundle's AOTInductor package is not a readable zip ({exc}): "
                          "rebuild the engine (`bundle rebuild BUNDLE --backend torch-aoti`)"
                          ) from None
    missing = [name for name in names if name not in held]
    if missing:
        raise BundleError(f"the bundle's AOTInductor package has no graph {', '.join(missing)} "
                          f"(it has {', '.join(sorted(held)) or 'none'}), which its manifest "
                          "lists in engine.details.static_batches: rebuild the engine "
                          "(`bundle rebuild BUNDLE --backend torch-aoti`)")
    return {name: load_graph(torch, path, name, device_index=device_index,
                             run_single_threaded=run_single_threaded) for name in names}


class PackageGraph:
    """One loaded graph, called with tensors as the runner calls it: torch's own wrapper
    (``AOTICompiledModel``) does the same, but importing it imports ``torch._inductor``
    (Triton, sympy: ~1 s on the 2-core CPU, ~5 s on an H100 with torch 2.11, the first
    load's whole cost there) and it parses the call spec and flattens its arguments on every
    call. The output structure is read once, at load."""

    def __init__(self, loader) -> None:
        from torch.utils import _pytree as pytree   # imported by torch itself

        self.loader = loader
        self._unflatten = pytree.tree_unflatten
        self._out_spec = pytree.treespec_loads(loader.get_call_spec()[1])

    def __call__(self, *tensors):
        # boxed_run takes the list over (it may free the inputs it holds)
        return self._unflatten(self.loader.boxed_run(list(tensors)), self._out_spec)


def load_graph(torch, path: Path, name: str, *, device_index: int = -1,
               run_single_threaded: bool = False) -> Any:
    """One graph of the package, loaded as ``load_package`` loads it, without the survey
    and without importing ``torch._inductor`` (``PackageGraph``).

    A torch whose loader moved or takes other arguments gets ``load_package`` itself:
    slower on its first call in a process, never wrong.
    """
    num_runners = 1
    try:
        loader = torch._C._aoti.AOTIModelPackageLoader(
            str(path), name, run_single_threaded, num_runners, device_index)
    except (AttributeError, TypeError):  # pragma: no cover - another torch
        from torch._inductor.package import load_package

        return load_package(str(path), name, run_single_threaded=run_single_threaded,
                            num_runners=num_runners, device_index=device_index)
    return PackageGraph(loader)
