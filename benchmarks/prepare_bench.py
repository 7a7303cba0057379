"""How long a bundle's preparation for serving takes, under settings side by side, and what
each setting does to the engine's speed.

    python benchmarks/prepare_bench.py --bundle FP16.bundle \
        --variant default --variant v7:TORCH_CUDNN_V8_API_DISABLED=1 \
        --variant heurB:TORCH_CUDNN_USE_HEURISTIC_MODE_B=1 \
        --variant buckets:graph_sizes=1+2+4+8+16+24 \
        --variant untimed:cudnn_benchmark=off,graph_sizes=1+2+4+8+16+24

`Model.prepare` (what `bundle serve`'s batcher calls before it serves) runs the engine once
at every batch size 1..max and captures its CUDA graph. For the torch-aoti fp16 bundle of
timm_xception that took 73 s on an H100, nearly all of it the first runs (the fp8 bundle:
0.6 s; docs/measurements/h100-2026-12-05-d). The fp16 package runs its convolutions on
cuDNN, which plans each new shape on first use; torch reads its cuDNN settings from the
environment. So each variant (NAME, or NAME:KEY=VALUE[,KEY=VALUE..]; "default" sets
nothing; the key graph_sizes, lowercase, is not an environment variable but the runner's
``cuda_graph_sizes``, its sizes joined by "+": fewer graphs, batches padded up to the next,
``runtime_py.graph_sizes``; nor is cudnn_benchmark=bundle|on|off, the runner's
``cudnn_benchmark`` as `bundle serve --cudnn-benchmark` takes it: whether each graph's
warm-up times cuDNN's algorithms) runs in a process of its own, one after the other: load
the bundle, prepare sizes 1..--max-batch (the bundle's max by default), then time the graph
replay at batch 1 and at the max (`runner.device_timings`, medians). A setting that starts
faster but runs slower is no gain: the table shows both, each replay against the first
variant's. Under a variant's line, where the runner records them (torch-aoti's
``load_seconds``), the load's phases: the thirty-first session's H100 spent 36 s loading
the fp16 bundle and 54 s preparing it, 10.7 s with the graph sizes above
(h100-2026-12-05-e). 27 s of that load were torch's CPU ISA survey after loading, which the
runner no longer runs (thirty-third session, h100-2026-12-06-b;
runtime_py/engines/aoti_load.py); the load now takes 5 s there (thirty-fourth session,
h100-2026-12-06-c), so the start is the preparation.

A script, not a test: numbers depend on the host. On a host without a GPU engine the
preparation is empty and there are no replay figures (the plumbing still runs).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_args import positive_int, positive_ints  # noqa: E402


#: The variant key that is the runner's ``cuda_graph_sizes``, not an environment variable.
GRAPH_SIZES = "graph_sizes"
#: The variant key that is the runner's ``cudnn_benchmark`` (its values: `bundle serve
#: --cudnn-benchmark`'s), not an environment variable.
CUDNN_BENCHMARK = "cudnn_benchmark"
#: The variant keys that are runner options; every other key is an environment variable.
RUNNER_KEYS = (GRAPH_SIZES, CUDNN_BENCHMARK)


def cudnn_benchmark_choices() -> dict:
    """`bundle serve --cudnn-benchmark`'s choices (bundle / on / off -> the runner's
    ``cudnn_benchmark``), from the CLI that serves with them."""
    from bundler.cli import CUDNN_BENCHMARK_CHOICES

    return CUDNN_BENCHMARK_CHOICES


def variant(text: str) -> tuple[str, dict[str, str]]:
    """``--variant``: NAME or NAME:KEY=VALUE[,KEY=VALUE..] -> (name, settings): the
    environment, and ``graph_sizes`` (sizes joined by "+") where given."""
    name, _, settings = text.partition(":")
    env: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in settings.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise argparse.ArgumentTypeError(f"expected KEY=VALUE in {text!r}, got {item!r}")
        env[key] = value
    if CUDNN_BENCHMARK in env and env[CUDNN_BENCHMARK] not in cudnn_benchmark_choices():
        raise argparse.ArgumentTypeError(
            f"{CUDNN_BENCHMARK} takes {' / '.join(cudnn_benchmark_choices())}, "
            f"got {env[CUDNN_BENCHMARK]!r} in {text!r}")
    if not name.strip():
        raise argparse.ArgumentTypeError(f"a variant needs a name: {text!r}")
    return name.strip(), env


def capture_totals(seconds: dict[int, tuple[float, float]]) -> dict:
    """A runner's ``capture_seconds`` (batch -> (first run s, capture s)) summed: how many
    graphs, the first runs' and the captures' seconds, and the slowest size (None: none)."""
    slowest = max(seconds, key=lambda n: sum(seconds[n])) if seconds else None
    return {"graphs": len(seconds), "warmup_s": sum(w for w, _ in seconds.values()),
            "capture_s": sum(c for _, c in seconds.values()), "slowest": slowest,
            "slowest_s": sum(seconds[slowest]) if seconds else 0.0}


def measure_here(bundle: str, backend: str, max_batch: int | None, iterations: int,
                 graph_sizes: str | None = None, replay_batches: list[int] | None = None,
                 cudnn_benchmark: str = "bundle") -> dict:
    """One variant, in this process: load, prepare, time the replays (at 1 and the max
    unless ``replay_batches`` says which; sizes above the max are dropped)."""
    import runtime_py
    from runtime_py.bench import device_timings

    t0 = time.perf_counter()
    options = {} if not graph_sizes else {"cuda_graph_sizes": graph_sizes.replace("+", ",")}
    if cudnn_benchmark_choices()[cudnn_benchmark] is not None:
        options["cudnn_benchmark"] = cudnn_benchmark_choices()[cudnn_benchmark]
    model = runtime_py.load(bundle, backend=backend, **options)
    try:
        load_s = time.perf_counter() - t0
        phases = dict(getattr(model.runner, "load_seconds", {}) or {})
        top = min(max_batch or model.max_batch_size, model.max_batch_size)
        t1 = time.perf_counter()
        model.prepare(range(1, top + 1))
        prepare_s = time.perf_counter() - t1
        # (a copy now: the replays below may capture more, e.g. a size timed that serving
        # would pad)
        seconds = dict(getattr(model.runner, "capture_seconds", {}) or {})
        replay_ms = {}
        for n in sorted({n for n in (replay_batches or [1, top]) if n <= top}):
            timed = device_timings(model.runner, n, iterations, max(5, iterations // 10))
            if timed and timed.get("graph_replay"):
                replay_ms[str(n)] = statistics.median(timed["graph_replay"]) * 1e3
        return {"backend": model.backend, "load_s": load_s, "load_phases": phases,
                "cudnn_timed": cudnn_timed(model.runner),
                "prepare_s": prepare_s, "sizes": top, **capture_totals(seconds), "replay_ms": replay_ms}
    finally:
        model.close()


def cudnn_timed(runner) -> bool | list[int] | None:
    """Which graphs' warm-ups timed cuDNN's algorithms (the bundle's record unless the
    variant said; the torch-aoti runner's ``cudnn_timing``), or None (a runner without
    the option)."""
    timing = getattr(runner, "cudnn_timing", None)
    return None if timing is None else timing()


def run_variant(args, name: str, settings: dict[str, str]) -> dict:
    """One variant in a child process with its environment; its JSON line back."""
    env = {k: v for k, v in settings.items() if k not in RUNNER_KEYS}
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--bundle", args.bundle,
           "--backend", args.backend, "--iterations", str(args.iterations)]
    if args.max_batch:
        cmd += ["--max-batch", str(args.max_batch)]
    if settings.get(GRAPH_SIZES):
        cmd += ["--graph-sizes", settings[GRAPH_SIZES]]
    if settings.get(CUDNN_BENCHMARK):
        cmd += ["--cudnn-benchmark", settings[CUDNN_BENCHMARK]]
    if args.replay_batches:
        cmd += ["--replay-batches", ",".join(map(str, args.replay_batches))]
    try:
        proc = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True,
                              timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.timeout} s (--timeout)"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"error": f"exit {proc.returncode}: {' | '.join(tail)}"}
    return json.loads(lines[-1])


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--variant", type=variant, action="append",
                    help="NAME[:KEY=VALUE,..], repeatable (default: one, 'default')")
    ap.add_argument("--max-batch", type=positive_int, default=None,
                    help="prepare sizes 1..N (default: the bundle's max batch)")
    ap.add_argument("--iterations", type=positive_int, default=200,
                    help="graph replays timed at each batch size")
    ap.add_argument("--replay-batches", type=positive_ints, default=None, metavar="N[,N..]",
                    help="the batch sizes whose replay is timed (default: 1 and the max). "
                         "With graph sizes a batch runs the next size's graph: 17 next to "
                         "a variant of graph_sizes=1+2+4+8+16+24 times what its padding "
                         "to 24 costs")
    ap.add_argument("--timeout", type=positive_int, default=300, help="seconds per variant")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--graph-sizes", help=argparse.SUPPRESS)     # (the child's)
    ap.add_argument("--cudnn-benchmark", default="bundle", help=argparse.SUPPRESS)  # (the child's)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(measure_here(args.bundle, args.backend, args.max_batch,
                                      args.iterations, args.graph_sizes,
                                      args.replay_batches, args.cudnn_benchmark)), flush=True)
        return []
    variants = args.variant or [("default", {})]
    if len({name for name, _ in variants}) != len(variants):
        ap.error("each --variant needs a name of its own")
    results = []
    for name, env in variants:
        got = {"variant": name, "env": env, **run_variant(args, name, env)}
        results.append(got)
        if not args.json:
            print(line_of(got, results[0]), flush=True)
    if args.json:
        print(json.dumps(results))
    return results


def line_of(got: dict, first: dict) -> str:
    """A variant's figures; its replays also as a ratio to the first variant's."""
    if "error" in got:
        return f"{got['variant']:<12} failed: {got['error']}"
    replays = []
    for n, ms in got["replay_ms"].items():
        base = first.get("replay_ms", {}).get(n)
        ratio = f" ({ms / base:.3f}x)" if base and got is not first else ""
        replays.append(f"b{n} {ms:.3f} ms{ratio}")
    slowest = (f"; slowest batch {got['slowest']}: {got['slowest_s']:.2f} s"
               if got["slowest"] else "")
    timed = got.get("cudnn_timed")     # (None: a runner without the option)
    cudnn = ("" if timed is None else ", cuDNN untimed" if timed is False
             else ", cuDNN timed" if timed is True
             else f", cuDNN timed at {'+'.join(map(str, timed))}")
    return (f"{got['variant']:<12} load {got['load_s']:5.1f} s  prepare {got['prepare_s']:6.1f} s"
            f" ({got['graphs']} graphs: first runs {got['warmup_s']:.1f} s, captures "
            f"{got['capture_s']:.1f} s{slowest}{cudnn})  replay {', '.join(replays) or 'n/a'}"
            f"{load_phases_line(got)}")


def load_phases_text(load_s: float, phases: dict[str, float]) -> str:
    """A runner's load phases (a torch-aoti runner's ``load_seconds``) of a load that took
    ``load_s`` in all, the rest of it (opening and checking the bundle) last; "" without
    them (serve_pair_bench.py prints it too)."""
    if not phases:
        return ""
    rest = max(0.0, load_s - sum(phases.values()))
    return ", ".join(f"{name} {s:.1f} s"
                     for name, s in {**phases, "bundle and the rest": rest}.items())


def load_phases_line(got: dict) -> str:
    """A variant's load phases on a line of their own under it; "" without them."""
    text = load_phases_text(got["load_s"], got.get("load_phases") or {})
    return "\n" + " " * 13 + "load: " + text if text else ""

if __name__ == "__main__":
    main()
