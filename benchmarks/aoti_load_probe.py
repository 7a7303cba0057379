"""AOTInductor load diagnosis on the GPU host (issue 8): compile a tiny package, then load
it in fresh processes in several ways (torch 2.11 on the H200 segfaulted loading any package).

    python benchmarks/aoti_load_probe.py compile DIR     # DIR/default.pt2, DIR/nobin.pt2
    python -X faulthandler benchmarks/aoti_load_probe.py load DIR/default.pt2
    python -X faulthandler benchmarks/aoti_load_probe.py so DIR/default.pt2   # the .so alone
"""
import glob
import os
import sys
import time
import zipfile

import torch

mode, path = sys.argv[1], sys.argv[2]
if mode == "compile":
    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.register_buffer("s", torch.tensor(0.5))
        def forward(self, x):
            return torch.relu(self.c(x)) * self.s

    m = Tiny().cuda().eval()
    x = torch.randn(2, 3, 16, 16, device="cuda")
    os.makedirs(path, exist_ok=True)
    for label, opts in (("default", {}), ("nobin", {"aot_inductor.package_constants_in_so": False})):
        t = time.monotonic()
        ep = torch.export.export(m, (x,))
        p = torch._inductor.aoti_compile_and_package(ep, package_path=f"{path}/{label}.pt2",
                                                     inductor_configs=opts)
        print(f"compiled {label} in {time.monotonic()-t:.0f}s -> {p}", flush=True)
    with zipfile.ZipFile(f"{path}/default.pt2") as z:
        for i in z.infolist():
            print(f"  {i.file_size:>10} {i.filename}")

elif mode == "load":
    torch.cuda.init()
    x = torch.randn(2, 3, 16, 16, device="cuda")
    print("loading", path, flush=True)
    m = torch._inductor.aoti_load_package(path)
    print("loaded; running", flush=True)
    if "nobin" in path:
        m.load_constants({"c.weight": torch.randn(8, 3, 3, 3, device="cuda"),
                          "c.bias": torch.zeros(8, device="cuda"), "s": torch.tensor(0.5, device="cuda")},
                         check_full_update=False)
    y = m(x)
    print("LOAD OK", tuple((y[0] if isinstance(y, (list, tuple)) else y).shape), flush=True)
elif mode == "so":
    d = path + ".x"
    zipfile.ZipFile(path).extractall(d)
    sos = glob.glob(f"{d}/**/*.so", recursive=True)
    print("so files:", sos, flush=True)
    os.system(f"ldd {sos[0]} | head -30")
    print(torch._C._aoti.AOTIModelContainerRunnerCuda.__init__.__doc__, flush=True)
    torch.cuda.init()
    r = torch._C._aoti.AOTIModelContainerRunnerCuda(sos[0], 1, "cuda", os.path.dirname(sos[0]))
    print("container made", flush=True)
    y = r.run([torch.randn(2, 3, 16, 16, device="cuda")])
    print("SO OK", [tuple(t.shape) for t in y], flush=True)
