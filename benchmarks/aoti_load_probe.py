"""AOTInductor load diagnosis on the GPU host (issue 8): torch 2.11 on the H200 crashed or hung
loading any package, even one convolution, so compile tiny packages in several ways and load
each in a fresh process under a native-stack shim (benchmarks/native_backtrace.c; that host
has no gdb).

    python benchmarks/aoti_load_probe.py compile DIR LABEL   # DIR/LABEL.pt2; LABEL in VARIANTS
                                                    # ("fixed": linked as bundle make links)
    python benchmarks/aoti_load_probe.py diagnose DIR/LABEL.pt2 [SECONDS]
    python benchmarks/aoti_load_probe.py load DIR/LABEL.pt2        # torch._inductor.aoti_load_package

`diagnose` prints the package's members and build flags, the model library's links and
constant symbols, then loads the library with the container runner in a child process that
has the shim preloaded, and turns the frames in the model library into source lines.
"""
import contextlib
import glob
import json
import os
import re
import subprocess
import sys
import time
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
SHIM_SOURCE = os.path.join(HERE, "native_backtrace.c")
SHIM = "/tmp/native_backtrace.so"

# label -> (device, inductor configs); all with torch's own C++ toolchain except "*fixed",
# which link as `bundle make` does (bundler/targets/torch_aoti/toolchain.py)
VARIANTS = {
    "default": ("cuda", {}),
    "nobin": ("cuda", {"aot_inductor.package_constants_in_so": False}),
    "debug": ("cuda", {"aot_inductor.debug_compile": True}),
    "cpu": ("cpu", {}),
    "fixed": ("cuda", {}),
    "cpu-fixed": ("cpu", {}),
}


def compile_tiny(directory: str, label: str) -> None:
    import torch

    device, options = VARIANTS[label]

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.register_buffer("s", torch.tensor(0.5))

        def forward(self, x):
            return torch.relu(self.c(x)) * self.s

    model = Tiny().to(device).eval()
    x = torch.randn(2, 3, 16, 16, device=device)
    os.makedirs(directory, exist_ok=True)
    started = time.monotonic()
    program = torch.export.export(model, (x,))
    toolchain = contextlib.nullcontext(None)
    if label.endswith("fixed"):
        from bundler.targets.torch_aoti.toolchain import aoti_toolchain
        toolchain = aoti_toolchain()
    with toolchain as chosen:
        path = torch._inductor.aoti_compile_and_package(
            program, package_path=f"{directory}/{label}.pt2", inductor_configs=options)
    print(f"[{label}] compiled in {time.monotonic() - started:.0f} s -> {path}"
          + (f" ({chosen.description})" if chosen else ""), flush=True)


def shell(command: str) -> str:
    return subprocess.run(command, shell=True, capture_output=True, text=True).stdout


def symbolize(stderr: str, library: str) -> None:
    """Frames inside the model library -> function and line (addr2line), others demangled."""
    for line in stderr.splitlines():
        match = re.match(r"#\d+\s+(\S+)\s+(\S+)\s+\[rel (0x[0-9a-f]+)\]", line)
        if not match:
            continue
        obj, symbol, rel = match.groups()
        if os.path.realpath(obj) == os.path.realpath(library):
            where = shell(f"addr2line -f -C -i -e {obj} {rel}").strip().replace("\n", " @ ")
        else:
            where = shell(f"echo '{symbol.split('+')[0]}' | c++filt").strip()
        print(f"    {os.path.basename(obj)} {rel}: {where}", flush=True)


def diagnose(package: str, seconds: int) -> None:
    target = package + ".x"
    with zipfile.ZipFile(package) as archive:
        for info in archive.infolist():
            print(f"  {info.file_size:>10} {info.filename}")
        archive.extractall(target)
    libraries = glob.glob(f"{target}/**/*.so", recursive=True)
    print("libraries:", libraries, flush=True)
    for flags in glob.glob(f"{target}/**/*_flags.json", recursive=True):
        print(os.path.basename(flags), json.dumps(json.load(open(flags)))[:1500], flush=True)
    if not libraries:
        return
    library = libraries[0]
    print(shell(f"ldd {library}"), flush=True)
    print("constant symbols:", shell(f"nm -D --defined-only {library} | grep -i -E 'constant|binary' | head -20"),
          flush=True)
    device = "cpu" if "cpu" in os.path.basename(package) else "cuda"
    if not os.path.exists(SHIM):
        subprocess.run(["cc", "-shared", "-fPIC", "-O0", "-o", SHIM, SHIM_SOURCE, "-ldl"], check=True)
    started = time.monotonic()
    child = subprocess.run(
        ["timeout", "-s", "USR1", "-k", "10", str(seconds), sys.executable, __file__, "run-library",
         library, device],
        env={**os.environ, "LD_PRELOAD": SHIM}, capture_output=True, text=True)
    print(f"child exit {child.returncode} after {time.monotonic() - started:.0f} s", flush=True)
    print(child.stdout[-3000:], child.stderr[-6000:], sep="\n", flush=True)
    symbolize(child.stderr, library)


def run_library(library: str, device: str) -> None:
    import torch

    runner_class = (torch._C._aoti.AOTIModelContainerRunnerCuda if device == "cuda"
                    else torch._C._aoti.AOTIModelContainerRunnerCpu)
    if device == "cuda":
        torch.cuda.init()
        print("cuda ready:", torch.cuda.get_device_name(), flush=True)
        runner = runner_class(library, 1, "cuda", os.path.dirname(library))
    else:
        runner = runner_class(library, 1)
    print("container made", flush=True)
    names = runner.get_constant_names_to_original_fqns() if hasattr(runner, "get_constant_names_to_original_fqns") else {}
    if names and "nobin" in library:
        runner.update_constant_buffer({name: torch.randn(1, device=device) for name in names}, False, False)
    y = runner.run([torch.randn(2, 3, 16, 16, device=device)])
    print("RUN OK", [tuple(t.shape) for t in y], flush=True)


def load(package: str) -> None:
    import torch

    device = "cpu" if "cpu" in os.path.basename(package) else "cuda"
    model = torch._inductor.aoti_load_package(package)
    print("loaded; running", flush=True)
    y = model(torch.randn(2, 3, 16, 16, device=device))
    print("LOAD OK", tuple((y[0] if isinstance(y, (list, tuple)) else y).shape), flush=True)


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "compile":
        compile_tiny(sys.argv[2], sys.argv[3])
    elif mode == "diagnose":
        diagnose(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 60)
    elif mode == "run-library":
        run_library(sys.argv[2], sys.argv[3])
    elif mode == "load":
        load(sys.argv[2])
    else:
        sys.exit(__doc__)
