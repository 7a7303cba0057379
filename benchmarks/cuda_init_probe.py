"""Where the first seconds of a torch-aoti activation go on a GPU host, step by step in one
fresh process: torch's import, each CUDA call the runner makes before its graphs load, then
each graph load (runtime_py's loader) and a first run. The runner's "graphs" phase took ~6 s
of an 11.6-s load on an H100 (thirty-fourth session) where a lone graph load had taken 0.37 s.

    python benchmarks/cuda_init_probe.py BUNDLE
"""
import shutil
import sys
import tempfile
import time
from pathlib import Path

t0 = time.perf_counter()
mark = t0


def done(what: str) -> None:
    global mark
    now = time.perf_counter()
    print(f"{now - mark:7.2f} s  {what}", flush=True)
    mark = now


import torch  # noqa: E402
done(f"import torch {torch.__version__}")
from runtime_py.format.reader import open_bundle  # noqa: E402
from runtime_py.engines.aoti_load import DYNAMIC_MODEL, load_graphs  # noqa: E402
done("import runtime_py")
avail = torch.cuda.is_available()
done(f"torch.cuda.is_available() -> {avail}")
name = torch.cuda.get_device_name(0)
done(f"get_device_name -> {name}")
torch.cuda.set_device(0)
done("set_device")
stream = torch.cuda.Stream(0)
done("Stream")
x = torch.empty(1, device="cuda")
torch.cuda.synchronize()
done("first tensor + synchronize")
bundle = open_bundle(sys.argv[1])
details = bundle.manifest["engine"]["details"]
folder = Path(tempfile.mkdtemp(prefix="cuda-init-probe-"))
path = folder / "engine.pt2"
path.write_bytes(bundle.read_member("engine.pt2"))
done("package member written")
names = [DYNAMIC_MODEL, *(f"batch{n}" for n in details.get("static_batches", []))]
for n in names:
    load_graphs(torch, path, [n], device_index=0, run_single_threaded=True)
    done(f"load {n}")
print(f"{time.perf_counter() - t0:7.2f} s  in all", flush=True)
shutil.rmtree(folder, ignore_errors=True)
