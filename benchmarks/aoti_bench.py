"""torch-aoti engines of timm_xception on one GPU: fp16 vs fp8 (issue 8's measurement).

Two steps, because calibration runs the fp32 ONNX graph in ONNX Runtime on the CPU, which
the GPU host should not spend its lease on:

    # here (CPU): bundles made by `bundle make --random-weights` give their calibration
    python benchmarks/aoti_bench.py prepare --bundle-dir DIR --out .bench
    # on the GPU host, in one process: build every engine, check, time, profile
    python benchmarks/aoti_bench.py run --data .bench [--variants fp16,fp8,...]
    # (or per engine: `run --stage build` then `run --stage measure` in a new process)

`prepare` writes, per fp8 variant, the bundle's calibration.safetensors and the selected
ONNX node -> activation tensor map (from the bundle's own graph), plus the weights digest
of the random-weights torch model, so that `run` can refuse a host whose torch/timm give
other random weights. Every variant uses the same calibration images (make's synthetic
set, seed 0).

`run` builds each engine with `bundler.targets.torch_aoti.build_engine` from one torch model
and measures it through the runtime's `TorchAotiRunner` (the code services run):

* engine time: CUDA graph replay of the package on device-resident input, one
  synchronization per iteration, median of `--iters` (copies excluded);
* with copies: `runner.infer(numpy)` (pinned staging, H2D, replay, D2H, sync), median;
* quality: top-1 agreement and max |diff| against the fp32 torch model (TF32 off) on
  `--eval-count` held-out synthetic inputs (make's reference-input generator);
* CUDA graphs on/off equality, and a torch.profiler per-kernel table (no graphs) at
  batch 32 of fp16 and fp8.
Prints one table at the end; `--json PATH` writes the numbers too.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

FAMILY = "timm_xception"
FP8_VARIANTS = {"fp8": None, "fp8-depthwise": "fp8-depthwise"}


def log(msg: str) -> None:
    print(msg, flush=True)


# --- prepare (CPU) -----------------------------------------------------------------------

def prepare(bundle_dir: Path, out: Path, seed: int) -> None:
    import onnx

    from bundler.calibration.store import calibration_from_safetensors
    from bundler.export import weights_digest
    from bundler.families import load_family
    from bundler.build_context import fp8_layers
    from bundler.torch_model import build_torch_model
    from runtime_py.format import open_bundle

    family = load_family(FAMILY)
    out.mkdir(parents=True, exist_ok=True)
    model = build_torch_model(family, seed=seed)
    meta = {"weights_digest": weights_digest(model.state_dict()), "seed": seed, "variants": {}}
    for name, variant in FP8_VARIANTS.items():
        path = next(bundle_dir.glob(f"{FAMILY}-{name}-*.bundle"))
        bundle = open_bundle(path)
        calib_bytes = bundle.read_member("calibration.safetensors")
        graph_bytes = bundle.read_member("model.onnx")
        calib = calibration_from_safetensors(calib_bytes)
        graph = onnx.load_model_from_string(graph_bytes)
        layers = fp8_layers(graph, list(calib.weight_scales), calib.result.scale,
                            calib.weight_scales)
        (out / f"{name}.calibration.safetensors").write_bytes(calib_bytes)
        meta["variants"][name] = {"bundle": path.name, "variant": variant,
                                  "tensors": {n: layer.tensor for n, layer in layers.items()}}
        log(f"{name}: {len(layers)} layers from {path.name}")
    (out / "bench.json").write_text(json.dumps(meta, indent=1, sort_keys=True))


# --- run (GPU) -----------------------------------------------------------------------------

class MemoryBundle:
    """What a runner reads of a bundle, in memory (the engine has no bundle file here)."""

    def __init__(self, family, precision: str, details: dict, package: bytes) -> None:
        c, h, w = family.input.shape
        b = family.input.batch
        self.manifest = {
            "precision": precision, "batch": {"min": b.min, "opt": b.opt, "max": b.max},
            "engine": {"backend": "torch-aoti", "member": "engine.pt2", "details": details},
            "inputs": [{"name": family.input.name, "dtype": "float32", "shape": ["batch", c, h, w]}],
            "outputs": [{"name": family.output_name, "dtype": "float32",
                         "shape": ["batch", family.num_classes]}]}
        self._package = package
        self.path = Path("memory.bundle")

    def read_member(self, name: str) -> bytes:
        assert name == "engine.pt2"
        return self._package


def fp8_modules(model, data: Path, name: str) -> dict:
    from bundler.calibration.store import calibration_from_safetensors
    from bundler.targets.torch_aoti.model import map_nodes_to_modules

    meta = json.loads((data / "bench.json").read_text())["variants"][name]
    calib = calibration_from_safetensors((data / f"{name}.calibration.safetensors").read_bytes())
    tensors = meta["tensors"]
    paths = map_nodes_to_modules(model, list(tensors))
    return {paths[n]: (calib.result.scale[t], calib.weight_scales[n]) for n, t in tensors.items()}


def time_engine(runner, n: int, iters: int, warmup: int = 10) -> float:
    """Median ms of one graph replay on device-resident input, synchronized each time."""
    import torch

    for _ in range(warmup):
        runner.run_device(n)
    runner.stream.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(iters):
        start.record(runner.stream)
        runner.run_device(n)
        end.record(runner.stream)
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def time_with_copies(runner, x: np.ndarray, name: str, iters: int, warmup: int = 5) -> float:
    for _ in range(warmup):
        runner.infer({name: x})
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        runner.infer({name: x})
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def kernel_table(step, label: str, rows: int, repeats: int = 5) -> dict:
    """Per-kernel CUDA time of ``step()`` (plain runs, no CUDA graph), by kind and the top
    rows (``kernel_profile.kernel_table``)."""
    from kernel_profile import kernel_table as table

    return table(step, label, rows, repeats, log=log)


def _option(text: str):
    """An Inductor option's value from the command line: JSON (true, 3, "x") or a string."""
    try:
        return json.loads({"True": "true", "False": "false"}.get(text, text))
    except json.JSONDecodeError:
        return text


def run(args) -> int:
    import torch

    from bundler.export import weights_digest
    from bundler.families import load_family
    from bundler.make import MakeRequest, preprocess_spec, reference_inputs
    from bundler.targets.torch_aoti import build_engine
    from bundler.torch_model import build_torch_model
    from runtime_py.engines.torch_aoti import TorchAotiRunner
    from runtime_py.preprocess import Preprocessor

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    t0 = time.monotonic()
    data = Path(args.data)
    meta = json.loads((data / "bench.json").read_text())
    family = load_family(FAMILY)
    model = build_torch_model(family, seed=meta["seed"])
    digest = weights_digest(model.state_dict())
    if digest != meta["weights_digest"]:
        log(f"random weights differ from the prepared ones ({digest[:12]} != "
            f"{meta['weights_digest'][:12]}): the calibration does not fit; stopping")
        return 2
    log(f"host: {torch.cuda.get_device_name()} cc {torch.cuda.get_device_capability()}, torch "
        f"{torch.__version__}, CUDA {torch.version.cuda}; weights {digest[:12]}")
    cache = Path(args.ref_cache) if args.ref_cache else None
    if cache is not None and cache.is_file():
        with np.load(cache) as z:
            inputs, ref, source = z["inputs"], z["ref"], str(z["source"])
    else:
        spec = preprocess_spec(family, model)
        req = MakeRequest(family=FAMILY, precision="fp32", reference_count=args.eval_count)
        inputs, source = reference_inputs(family, req, Preprocessor(spec))
        with torch.no_grad():
            gpu_model = model.cuda().eval()
            ref = torch.cat([gpu_model(torch.from_numpy(inputs[i:i + 16]).cuda()).float().cpu()
                             for i in range(0, len(inputs), 16)]).numpy()
            model = model.cpu()
        if cache is not None:
            np.savez(cache, inputs=inputs, ref=ref, source=np.array(source))
    log(f"fp32 reference on {len(inputs)} inputs from {source} ({time.monotonic() - t0:.0f} s)")
    name_in = family.input.name
    batch = {"min": family.input.batch.min, "opt": family.input.batch.opt,
             "max": family.input.batch.max}
    results = {}
    for variant in args.variants.split(","):
        t = time.monotonic()
        precision = "fp8" if variant.startswith("fp8") else "fp16"
        fp8 = None
        if precision == "fp8":
            base = variant.removesuffix("-padded").removesuffix("-tensorwise").removesuffix("-fastacc")
            fp8 = fp8_modules(model, data, base)
        pkg_dir = Path(args.packages)
        if args.stage in ("build", "both"):
            package, details = build_engine(
                model, precision, tuple(family.input.shape), batch, fp8=fp8,
                nhwc=False if variant == "fp16-nchw" else None,
                fast_accum="-fastacc" in variant, pad_channels="-padded" in variant,
                fp8_gemm="tensorwise" if "-tensorwise" in variant else "rowwise", smoke=args.smoke,
                compile_options={k: _option(v) for k, v in
                                 (kv.split("=", 1) for kv in args.inductor)} or None,
                log=lambda m: log(f"  [{variant}] {m}"))
            build_s = time.monotonic() - t
            if args.stage == "build":   # measured by another process (see --stage)
                pkg_dir.mkdir(parents=True, exist_ok=True)
                (pkg_dir / f"{variant}.pt2").write_bytes(package)
                (pkg_dir / f"{variant}.json").write_text(json.dumps(
                    {"details": details, "build_s": build_s}))
                log(f"  [{variant}] package written to {pkg_dir}")
                continue
        else:
            package = (pkg_dir / f"{variant}.pt2").read_bytes()
            saved = json.loads((pkg_dir / f"{variant}.json").read_text())
            details, build_s = saved["details"], saved["build_s"]
        runner = TorchAotiRunner(MemoryBundle(family, precision, details, package))
        runner.activate()
        r = {"size_mb": len(package) / 1e6, "build_s": build_s}
        outs = np.concatenate([runner.infer({name_in: np.ascontiguousarray(inputs[i:i + 32])})[
            family.output_name] for i in range(0, len(inputs), 32)])
        r["top1"] = float(np.mean(outs.argmax(1) == ref.argmax(1)))
        r["max_abs"] = float(np.abs(outs - ref).max())
        plain = TorchAotiRunner(MemoryBundle(family, precision, details, package), cuda_graphs=False)
        plain.activate()
        x8 = np.ascontiguousarray(inputs[:8])
        r["graphs_vs_plain"] = float(np.abs(runner.infer({name_in: x8})[family.output_name]
                                            - plain.infer({name_in: x8})[family.output_name]).max())
        plain.deactivate()
        for n in (1, 32):
            # copies first: it leaves real images (not zeros) in the device input buffer
            x = np.ascontiguousarray(np.resize(inputs, (n, *inputs.shape[1:])))
            r[f"copies_ms_b{n}"] = time_with_copies(runner, x, name_in, max(20, args.iters // 4))
            r[f"engine_ms_b{n}"] = time_engine(runner, n, args.iters)
        r["graph_failures"] = dict(runner.graph_failures)
        log(f"== {variant}: " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                                           for k, v in r.items()))
        if variant in args.profile.split(","):
            r["kernels_b32"] = kernel_table(lambda: runner._run_model(runner._static_buffers(32)[0]),
                                            f"{variant}, batch 32", args.rows)
            if variant.startswith("fp8"):
                r["kernels_b1"] = kernel_table(lambda: runner._run_model(runner._static_buffers(1)[0]),
                                               f"{variant}, batch 1", args.rows)
        runner.deactivate()
        results[variant] = r
        log(f"   ({time.monotonic() - t0:.0f} s elapsed)")
    if args.json:
        with open(args.json, "a") as f:
            for v, r in results.items():
                f.write(json.dumps({"variant": v, **r}, sort_keys=True) + "\n")
    print_table(results)
    log(f"total {time.monotonic() - t0:.0f} s")
    return 0


def print_table(results: dict) -> None:
    base = results.get("fp16")
    log("\n| engine | size MB | b1 engine ms | b32 engine ms | b1 +copies ms | b32 +copies ms "
        "| fp16/x b1 | fp16/x b32 | top-1 vs fp32 | max abs vs fp32 |")
    log("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for v, r in results.items():
        s1 = f"{base['engine_ms_b1'] / r['engine_ms_b1']:.3f}" if base else "-"
        s32 = f"{base['engine_ms_b32'] / r['engine_ms_b32']:.3f}" if base else "-"
        log(f"| {v} | {r['size_mb']:.1f} | {r['engine_ms_b1']:.3f} | {r['engine_ms_b32']:.3f} | "
            f"{r['copies_ms_b1']:.3f} | {r['copies_ms_b32']:.3f} | {s1} | {s32} | "
            f"{r['top1'] * 100:.1f}% | {r['max_abs']:.3g} |")


PROBE_LOAD = """
import sys, torch
m = torch._inductor.aoti_load_package(sys.argv[1])
x = torch.randn(3, 3, 32, 32, device="cuda")
y = m(x)
print("loaded and ran:", tuple((y[0] if isinstance(y, (list, tuple)) else y).shape))
"""


def probe(out: Path) -> int:
    """Can this host compile and load an AOTInductor package (tiny conv model, with and
    without the constants inside the .so)? Loads in a fresh process, then in this one."""
    import subprocess

    import torch

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(16, 16, 1)).cuda().half().eval()

    class Wrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model
            self.register_buffer("s", torch.tensor(0.5, device="cuda"))

        def forward(self, x):
            return self.m(x.half()).float() * self.s

    out.mkdir(parents=True, exist_ok=True)
    x = torch.randn(2, 3, 32, 32, device="cuda")
    paths = {}
    for label, opts in (("default", {}),
                        ("constants-outside-so", {"aot_inductor.package_constants_in_so": False})):
        t = time.monotonic()
        ep = torch.export.export(Wrap(), (x,), dynamic_shapes=({0: torch.export.Dim("b", min=1, max=8)},))
        paths[label] = torch._inductor.aoti_compile_and_package(
            ep, package_path=str(out / f"probe-{label}.pt2"), inductor_configs=opts)
        proc = subprocess.run([sys.executable, "-X", "faulthandler", "-c", PROBE_LOAD, paths[label]],
                              capture_output=True, text=True)
        log(f"probe {label}: compiled in {time.monotonic() - t:.0f} s; fresh-process load rc "
            f"{proc.returncode}: {(proc.stdout + proc.stderr).strip()[-400:]}")
    for label, path in paths.items():
        log(f"probe {label}: loading in the compiling process ...")
        m = torch._inductor.aoti_load_package(path)
        log(f"probe {label}: in-process load ok, output {tuple(m(x)[0].shape)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    pp = sub.add_parser("prepare")
    pp.add_argument("--bundle-dir", type=Path, required=True)
    pp.add_argument("--out", type=Path, default=Path(".bench"))
    pp.add_argument("--seed", type=int, default=0)
    pr = sub.add_parser("run")
    pr.add_argument("--data", default=".bench")
    pr.add_argument("--variants", default="fp16,fp8,fp8-depthwise,fp16-nchw")
    pr.add_argument("--profile", default="fp16,fp8")
    pr.add_argument("--iters", type=int, default=200)
    pr.add_argument("--eval-count", type=int, default=128)
    pr.add_argument("--rows", type=int, default=15)
    pr.add_argument("--stage", choices=("both", "build", "measure"), default="both",
                    help="build: compile and write packages to --packages; measure: load "
                         "them in a fresh process (builds of several variants can then run "
                         "in parallel processes)")
    pr.add_argument("--packages", default="/tmp/aoti-packages")
    pr.add_argument("--smoke", action=argparse.BooleanOptionalAction, default=False,
                    help="compare the package with the eager module right after compiling")
    pr.add_argument("--inductor", action="append", default=[], metavar="KEY=VALUE",
                    help="an Inductor option for the compile (string values)")
    pr.add_argument("--json", help="append one JSON line per engine to this file")
    pr.add_argument("--ref-cache", help="npz of the fp32 reference, shared by runs")
    pt = sub.add_parser("table", help="the table of the JSON lines that runs appended")
    pt.add_argument("json")
    pb = sub.add_parser("probe", help="can this host compile and load AOTI packages")
    pb.add_argument("--out", type=Path, default=Path("/tmp/aoti-probe"))
    args = p.parse_args(argv)
    if args.cmd == "probe":
        return probe(args.out)
    if args.cmd == "table":
        rows = [json.loads(line) for line in Path(args.json).read_text().splitlines() if line]
        print_table({r.pop("variant"): r for r in rows})
        return 0
    if args.cmd == "prepare":
        prepare(args.bundle_dir, args.out, args.seed)
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
