"""Bundles of one family side by side with the peer, in one process: the comparison of a
torch-aoti bundle with static-batch graphs (family.json ``torch_aoti.static_batches``) and
the same bundle without them, against the torch.compile peer of `bundle study`.

    python benchmarks/aoti_static_vs_peer.py A.bundle B.bundle [...] [--batch-sizes 1,32]
        [--peer torch-compile] [--json OUT.json]

Every bundle and the peer (`bundler.peer`: the family's timm model in fp16, channels_last,
torch.compile default mode, CUDA graph replay, with the weights of the first bundle) are
timed one after the other at each batch size, at the boundaries of `bundle study`
(``graph_replay``: engine alone on device-resident input; ``with_copies``: pinned H2D, run,
D2H), median of ``--iterations``. The bundles must hold the same weights (checked: same
``source``). Their outputs on the same inputs are compared with the first bundle's (max
|diff|), so a static graph that computes something else shows. Prints one table: median
ms, peer ms / bundle ms (> 1: the bundle is faster) and first bundle ms / bundle ms.
`benchmarks/gpu_static_batches.sh` builds the bundles and runs this on the H200.

``--profile``: after the timings, a kernel profile (``benchmarks/kernel_profile.py``: time by
kind and the top kernels, plain runs without CUDA graphs) of each bundle's engine and of the
peer at each batch size. Why: timm_xception's fp16 bundle and the peer are the same model
in the same form, yet the bundle ran 0.95-0.97x the peer at batch 32 on some H200s
(docs/measurements/h200-2026-12-04) while under torch.compile the bundle's module was as
fast as the peer; the profiles say which kernels differ.

``--timeline``: the device timeline of each engine's and the peer's CUDA graph replays
(``kernel_profile.timeline_table``): how long a replay's kernels run, how long the device
sits idle between them and after which kinds of kernel. Why: the fp8 graphs replay 50-85 us
longer than their plain runs' kernel time, the fp16 bundles 11-35 us
(docs/measurements/h200-2026-12-06-k), and a plain run cannot say where that goes.

``--cudnn-benchmark``: ``torch.backends.cudnn.benchmark`` on for the whole process (the
bundles' engines and the peer): cuDNN times its algorithms at each convolution's first call
(before the graphs are captured) instead of taking its heuristic's first pick. Why:
timm_xception's fp16 bundle and the peer run the 3-channel stem as an NCHW sgemm after a
layout conversion (0.25 ms at batch 32, H100) where the same convolution alone picks an
NHWC implicit GEMM (0.05 ms; `first_conv_probe.py`), and weights in OIHW memory did not
change the pick (docs/measurements/h100-2026-12-07-g). A setting is global to a process,
so the comparison is two runs, each against its own peer.

Without a GPU the bundles run on their CPU engine and the peer is the fp32 eager model,
timed per ``infer`` call (boundary ``engine``): the script runs, its ratios say little.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from bench_args import positive_ints


def bundle_times(model, batch: int, timing: dict) -> dict[str, list[float]]:
    import numpy as np

    from bundler.study import cpu_times
    from runtime_py.bench import device_timings

    raw = device_timings(model.runner, batch, timing["iterations"], timing["device_warmup"])
    if raw:
        return raw
    spec = model.runner.input_metadata()[0]
    x = np.random.default_rng(0).uniform(-1, 1, (batch, *spec.shape[1:])).astype(np.float32)
    return {"engine": cpu_times(lambda: model.infer({spec.name: x}), timing)}


def peer_times(peer, batch: int, shape: tuple[int, ...], timing: dict) -> dict[str, list[float]]:
    import numpy as np

    from bundler.study import cpu_times

    if hasattr(peer, "timings"):
        return peer.timings(batch, shape, timing["iterations"], timing["device_warmup"])
    x = np.random.default_rng(0).uniform(-1, 1, (batch, *shape)).astype(np.float32)
    return {"engine": cpu_times(lambda: peer.infer(x), timing)}


def profile_engine(runner, label: str, sizes: list[int], rows: int) -> None:
    """Kernel profile of a GPU runner's engine on its own device input, each batch size,
    without its CUDA graphs (the profiler then sees each kernel)."""
    from kernel_profile import kernel_table

    graphs, runner.use_cuda_graphs = runner.use_cuda_graphs, False
    try:
        for b in sizes:
            kernel_table(lambda: runner.run_device(b), f"{label}, batch {b}", rows)
    finally:
        runner.use_cuda_graphs = graphs


def timelines(replay, label: str, sizes: list[int], rows: int) -> None:
    """Device timeline of ``replay(b)``'s CUDA graph replay at each batch size
    (``kernel_profile.timeline_table``): idle time between the graph's kernels, by
    transition. ``replay``: a bundle runner's or the peer's, synchronized."""
    from kernel_profile import timeline_table

    for b in sizes:
        timeline_table(lambda: replay(b), f"{label}, batch {b}", rows)


def runner_replay(runner):
    """``runner.run_device`` as one synchronized replay, for ``timelines``."""
    def replay(b: int) -> None:
        runner.run_device(b)
        runner.stream.synchronize()
    return replay


def profile_peer(peer, shape: tuple[int, ...], sizes: list[int], rows: int) -> None:
    """The same for the torch.compile peer: its compiled function, plain runs."""
    import numpy as np
    import torch

    from kernel_profile import kernel_table

    for b in sizes:
        peer.infer(np.zeros((b, *shape), np.float32))   # compiled and warmed up for b
        x = torch.zeros((b, *shape), device="cuda")
        with torch.no_grad():
            kernel_table(lambda: peer.fn(x), f"peer, batch {b}", rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundles", nargs="+", type=Path)
    parser.add_argument("--batch-sizes", type=positive_ints, default=[1, 32])
    parser.add_argument("--peer", default="torch-compile")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--profile", action="store_true",
                        help="also profile each engine and the peer by kernel (GPU)")
    parser.add_argument("--profile-sizes", type=positive_ints, default=None, metavar="SIZES",
                        help="the batch sizes --profile and --timeline look at (default: "
                             "every timed one; "
                             "each must be one of --batch-sizes)")
    parser.add_argument("--timeline", action="store_true",
                        help="also the device timeline of each engine's and the peer's CUDA "
                             "graph replays: idle time between kernels, by transition (GPU)")
    parser.add_argument("--rows", type=int, default=15, help="top kernels per profile")
    parser.add_argument("--cudnn-benchmark", action="store_true",
                        help="torch.backends.cudnn.benchmark on for the bundles and the peer")
    args = parser.parse_args()

    import numpy as np

    from bundler.peer import make_peer, peer_model
    from bundler.study import CPU_TIMING
    from runtime_py.bench import random_feeds
    from runtime_py.model import load

    sizes = args.batch_sizes
    profiled = sizes if args.profile_sizes is None else args.profile_sizes
    if not set(profiled) <= set(sizes):
        parser.error(f"--profile-sizes {profiled} names sizes that are not timed "
                     f"(--batch-sizes {sizes})")
    timing = {**CPU_TIMING, "iterations": args.iterations, "device_warmup": args.warmup}
    if args.cudnn_benchmark:
        import torch

        torch.backends.cudnn.benchmark = True
        print("cudnn.benchmark: on (bundles and peer)", flush=True)
    rows, outputs, labels, manifest = [], {}, [], None
    # a bundle a failed build did not write is left out, the rest timed (forty-fifth
    # session: one failed build of three left the two others untimed)
    missing = [p for p in args.bundles if not p.is_file()]
    for path in missing:
        print(f"{path}: no such bundle (its build failed?), not timed", flush=True)
    if len(missing) == len(args.bundles):
        raise SystemExit("none of the bundles exists")
    present = [p for p in args.bundles if p not in missing]
    for path in present:
        model = load(path, backend=args.backend)
        details = model.bundle.manifest["engine"]["details"]
        label = f"{path.parent.name}/{path.name}"
        static = details.get("static_batches") or []
        print(f"{label}: {model.backend}, static-batch graphs: {static or 'none'}", flush=True)
        if manifest is None:
            manifest, preprocess = model.bundle.manifest, model.bundle.preprocess
        elif model.bundle.manifest["source"] != manifest["source"]:
            raise SystemExit(f"{path} holds other weights than {present[0]}")
        spec = model.runner.input_metadata()[0]
        for b in sizes:
            # the bundle's own input dtype (uint8 pixels for --input uint8 bundles)
            out = next(iter(model.infer(random_feeds([spec], b, seed=b)).values()))
            first = outputs.setdefault(b, out)
            diff = float(np.abs(out.astype(np.float64) - first).max())
            for boundary, times in bundle_times(model, b, timing).items():
                rows.append({"bundle": label, "batch": b, "boundary": boundary,
                             "static_graph": b in static,
                             "median_ms": statistics.median(times) * 1e3,
                             "max_abs_diff_vs_first": diff})
        labels.append(label)
        if args.profile and getattr(model.runner, "run_device", None) is not None:
            profile_engine(model.runner, label, profiled, args.rows)
        if args.timeline and getattr(model.runner, "run_device", None) is not None:
            timelines(runner_replay(model.runner), label, profiled, args.rows)
        model.close()
    print(f"peer {args.peer}: compiling", flush=True)
    peer = make_peer(args.peer, peer_model(manifest), preprocess)   # pixels as the bundles
    shape = tuple(int(d) for d in manifest["inputs"][0]["shape"][1:])
    peer_ms = {(boundary, b): statistics.median(times) * 1e3 for b in sizes
               for boundary, times in peer_times(peer, b, shape, timing).items()}
    if args.profile and hasattr(peer, "fn"):
        profile_peer(peer, shape, profiled, args.rows)
    if args.timeline and hasattr(peer, "replay"):
        timelines(lambda b: peer.replay(b, shape), "peer", profiled, args.rows)
    first_ms = {(r["boundary"], r["batch"]): r["median_ms"] for r in rows
                if r["bundle"] == labels[0]}
    print(f"\n{'bundle':<58} {'batch':>5} {'boundary':<13} {'static':>6} {'ms':>8} "
          f"{'peer ms':>8} {'peer/b':>7} {'first/b':>7} {'|diff|':>8}")
    for r in rows:
        key = (r["boundary"], r["batch"])
        r["peer_ms"] = peer_ms.get(key)
        r["peer_ratio"] = r["peer_ms"] / r["median_ms"] if r["peer_ms"] else None
        r["first_ratio"] = first_ms[key] / r["median_ms"]
        print(f"{r['bundle']:<58} {r['batch']:>5} {r['boundary']:<13} "
              f"{'yes' if r['static_graph'] else 'no':>6} {r['median_ms']:>8.3f} "
              f"{r['peer_ms'] or float('nan'):>8.3f} {r['peer_ratio'] or float('nan'):>6.3f}x "
              f"{r['first_ratio']:>6.3f}x {r['max_abs_diff_vs_first']:>8.2g}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "peer": args.peer,
                                         "timing": timing}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
