"""Where a torch-aoti bundle's "graphs" load phase goes on the GPU (35 s on an H100 for the
fp16 timm_xception package of three graphs, 0.4 s on the CPU): the package's members by kind
and size, then each graph loaded alone in order, timed, first by the runner's loader
(runtime_py/engines/aoti_load.py), then by torch's ``load_package``, whose first call in a
process surveys the CPU's vector ISAs (27 s with torch 2.11; h100-2026-12-06-b).

    python benchmarks/aoti_graphs_probe.py BUNDLE [GRAPH ...]
"""
import collections
import os
import shutil
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from runtime_py.engines.aoti_load import DYNAMIC_MODEL, load_graph
from runtime_py.engines.torch_aoti import MEMBER
from runtime_py.format.reader import open_bundle


def main() -> None:
    bundle = open_bundle(sys.argv[1])
    names = sys.argv[2:] or [DYNAMIC_MODEL]
    folder = Path(tempfile.mkdtemp(prefix="graphs-probe-"))
    try:
        probe(folder / MEMBER, bundle.read_member(MEMBER), names)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def probe(path: Path, package: bytes, names: list[str]) -> None:
    path.write_bytes(package)
    kinds = collections.Counter()
    sizes = collections.Counter()
    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            ext = os.path.splitext(info.filename)[1] or info.filename.rsplit("/", 1)[-1]
            kinds[ext] += 1
            sizes[ext] += info.file_size
        for info in sorted(z.infolist(), key=lambda i: -i.file_size)[:8]:
            print(f"  {info.file_size / 1e6:9.2f} MB  {info.filename}")
    for ext, n in kinds.most_common():
        print(f"members {ext:12s} {n:5d}  {sizes[ext] / 1e6:9.2f} MB")
    print("CUDA_MODULE_LOADING", os.environ.get("CUDA_MODULE_LOADING", "(unset)"), flush=True)
    t = time.perf_counter()
    import torch
    import torch._inductor
    from torch._inductor.package import load_package
    if torch.cuda.is_available():
        torch.cuda.init()
    print(f"imports and CUDA init {time.perf_counter() - t:.2f} s", flush=True)
    device = 0 if torch.cuda.is_available() else -1
    for label, load in (("runtime_py", load_graph), ("torch load_package", None)):
        for name in names:
            t = time.perf_counter()
            if load is None:
                graph = load_package(str(path), name, device_index=device,
                                     run_single_threaded=True)
            else:
                graph = load(torch, path, name, device_index=device, run_single_threaded=True)
            if device >= 0:
                torch.cuda.synchronize()
            print(f"{label} load {name}: {time.perf_counter() - t:.2f} s", flush=True)
            del graph


if __name__ == "__main__":
    main()
