"""Two bundles served side by side, measured at the client: fp8 against fp16 in one run.

    python benchmarks/serve_pair_bench.py --bundle FP8.bundle --bundle FP16.bundle
    python benchmarks/serve_pair_bench.py --synthetic-costs 3,4     # CPU smoke run

Issue 15's target "at the client, fp8 img/s >= 1.15x fp16 img/s over gRPC and HTTP" is a
ratio of two serving figures. Measured by two `serve_bench.py` runs, one per bundle, the
two figures came minutes apart, and on the H200 the load of the host moves a figure by
+-10% over that time: more than the difference to be shown. Here both bundles are loaded in
one process, each behind its own batcher and its own server (`run.serve`, the code of
`bundle serve`, with --workers front-end processes), both servers up for the whole run.
Each round measures every path with the first bundle and then the second (the order
reversed on every other round), back to back, with the same clients; the figure is the
ratio first / second of each round, and the median round is shown.

Beside it, at each round, the same ratio at the two boundaries below the network: the
engine (`model.infer` on a ready batch) and the in-process batcher (--clients threads), so
that a ratio lost at the client can be placed: in the engine, the batcher, or the network
front-ends.

A script, not a test: numbers depend on the host.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from types import SimpleNamespace

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_args import positive_int, positive_ints, stage_modes  # noqa: E402
from prepare_bench import capture_totals, load_phases_text  # noqa: E402
from serve_bench import (KINDS, _median_round, _Server, bench_batcher,  # noqa: E402
                         bench_path, bench_raw, make_model, one_image)
from runtime_py.batcher import Batcher  # noqa: E402

#: fp8 img/s over fp16 img/s at the client (issue 15).
TARGET = 1.15


def load_one(args, i: int):
    """Model ``i`` of the two (0: the numerator). Synthetic ones are the light toy engine of
    serve_bench (a GPU engine's profile) with the per-batch cost given."""
    if args.synthetic_costs:
        return make_model(SimpleNamespace(
            synthetic=True, light=True, image_size=args.image_size, batch=args.batch,
            cost_ms=args.synthetic_costs[i], per_row_ms=0.0, dtype="uint8"))
    return make_model(SimpleNamespace(synthetic=False, bundle=args.bundle[i],
                                      backend=args.backend, enqueue=None,
                                      cuda_graph_sizes=args.cuda_graph_sizes))


def load_phases_of(model, load_s: float) -> str:
    """Where a model's load went (the runner's ``load_seconds``); "" where not recorded."""
    phases = getattr(getattr(model, "runner", None), "load_seconds", None) or {}
    return load_phases_text(load_s, phases)


def label_of(args, i: int) -> str:
    if args.synthetic_costs:
        return f"synthetic {args.synthetic_costs[i]} ms"
    return os.path.basename(args.bundle[i]).removesuffix(".bundle")


def capture_summary(model) -> str:
    """Where a batcher's start went: the runner's warm-up and capture seconds of each batch
    size's CUDA graph (torch-aoti), summed, and the slowest size; empty for other models."""
    seconds = getattr(getattr(model, "runner", None), "capture_seconds", None)
    if not seconds:
        return ""
    t = capture_totals(seconds)
    return (f" ({t['graphs']} graphs: warm-up {t['warmup_s']:.1f} s, capture "
            f"{t['capture_s']:.1f} s; slowest batch {t['slowest']}: {t['slowest_s']:.2f} s)")


def ratio_summary(rounds: list[tuple[float, float]]) -> dict:
    """Per-round first/second ratios of (first img/s, second img/s) pairs, and the median
    round's figures (the lower of the two middle ones for an even count, so that every
    figure shown is one round's, not an average)."""
    ratios = [a / b for a, b in rounds]
    second, first = _median_round([(b, a) for a, b in rounds])   # (reference, figure)
    return {"rounds": [round(r, 3) for r in ratios], "median": round(first / second, 3),
            "first_img_s": round(first, 1), "second_img_s": round(second, 1),
            "spread": [round(min(ratios), 3), round(max(ratios), 3)]}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--bundle", action="append",
                     help="a .bundle, given twice: the numerator (fp8) first, then fp16")
    src.add_argument("--synthetic-costs", type=lambda s: [float(x) for x in s.split(",")],
                     metavar="A,B", help="two synthetic engines of these ms per batch")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--batch", type=positive_int, default=32)
    ap.add_argument("--clients", type=positive_int, default=64,
                    help="clients of every figure (batcher threads, network clients)")
    ap.add_argument("--http-procs", type=positive_ints, default="8", metavar="N[,N..]",
                    help="client processes of the network paths; several: one figure each")
    ap.add_argument("--paths", default="http,grpc", help=f"comma-separated, of {KINDS}")
    ap.add_argument("--workers", type=int, default=8, help="front-end worker processes per server")
    ap.add_argument("--cuda-graph-sizes", default=None, metavar="N[,N..]",
                    help="both bundles' CUDA graph sizes (bundle serve --cuda-graph-sizes; "
                         "default: every size): a shorter start (the fp16 xception bundle "
                         "spends ~73 s preparing 32 sizes on an H100); at saturation the "
                         "batches are full, and a partial one runs a padded graph on both")
    ap.add_argument("--stage-ahead", type=stage_modes, default="off", metavar="MODE[,MODE]",
                    help="the batchers' stage_ahead (bundle serve --stage-ahead): off, on, "
                         "or off,on: each round measures the batcher and every path in "
                         "both modes (switched live), keys @stage-off / @stage-on")
    ap.add_argument("--rounds", type=positive_int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0, help="measured time per figure")
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--max-delay-ms", type=float, default=2.0)
    ap.add_argument("--image-size", type=int, default=64, help="synthetic: input 3 x N x N")
    ap.add_argument("--json", action="store_true", help="print one JSON object at the end")
    args = ap.parse_args(argv)
    pair = args.bundle or args.synthetic_costs
    if len(pair) != 2:
        ap.error(f"give exactly two bundles (or two costs), got {len(pair)}")
    kinds = [k for k in args.paths.split(",") if k]
    if not kinds or any(k not in KINDS for k in kinds):
        ap.error(f"--paths: each of {KINDS}, got {kinds}")

    t0 = time.time()
    models, load_s = [], []
    for i in range(2):
        t1 = time.time()
        models.append(load_one(args, i))
        load_s.append(time.time() - t1)
    labels = [label_of(args, i) for i in range(2)]
    feeds = [one_image(m, 1) for m in models]
    say = (lambda *a: None) if args.json else (lambda *a: print(*a, flush=True))
    say(f"first: {labels[0]}\nsecond: {labels[1]}\n{args.clients} clients, batch "
        f"{args.batch}, {args.workers} front-end workers per server, {args.rounds} rounds"
        f" of {args.seconds:g} s (+{args.warmup:g} s warm-up), rows staged ahead: "
        f"{','.join(args.stage_ahead)}, CUDA graph sizes: {args.cuda_graph_sizes or 'every'}, "
        f"cpus {os.cpu_count()}; "
        f"both loaded in {time.time() - t0:.0f} s")
    for label, m, s in zip(labels, models, load_s):
        if phases := load_phases_of(m, s):
            say(f"load {label}: {phases}")
    figures: dict[str, list[tuple[float, float]]] = {}
    batchers = []
    for m in models:      # each captures its model's graphs (prepare): timed, per size
        t1 = time.time()
        batchers.append(Batcher(m, max_batch_size=args.batch, max_delay_ms=args.max_delay_ms,
                                stage_ahead=args.stage_ahead[0] == "on"))
        say(f"batcher ready in {time.time() - t1:.1f} s{capture_summary(m)}")
    servers = [_Server(m, b, args.workers) for m, b in zip(models, batchers)]
    try:
        for s in servers:
            s.__enter__()
        time.sleep(2.0)       # workers that said hello still finish starting
        say(f"both servers up (+{time.time() - t0:.0f} s)")
        for r in range(args.rounds):
            order = (0, 1) if r % 2 == 0 else (1, 0)
            steps = [("engine", None, None,
                      lambda i: bench_raw(models[i], args.batch, args.seconds))]
            for stage in args.stage_ahead:
                steps.append(("batcher", None, stage, lambda i: bench_batcher(
                    batchers[i], feeds[i], args.clients, args.seconds, args.warmup)[0]))
                steps += [(kind, procs, stage, (lambda i, kind=kind, procs=procs: bench_path(
                    kind, servers[i], models[i], feeds[i], args.clients, procs, args.seconds,
                    args.warmup)[0])) for kind in kinds for procs in args.http_procs]
            for name, procs, stage, measure in steps:
                key = (name if procs is None else f"{name}@p{procs}") + (
                    f"@stage-{stage}" if stage and len(args.stage_ahead) > 1 else "")
                if stage:
                    for b in batchers:
                        b.stage_ahead = stage == "on"
                got = [0.0, 0.0]
                for i in order:
                    v = measure(i)
                    if isinstance(v, str):
                        raise SystemExit(f"{key} of {labels[i]} failed: {v}")
                    got[i] = v
                figures.setdefault(key, []).append((got[0], got[1]))
                say(f"round {r + 1} {key:<22} {got[0]:9.1f} / {got[1]:9.1f} img/s = "
                    f"{got[0] / got[1]:.3f}   (+{time.time() - t0:.0f} s)")
    finally:
        for s in servers:
            if s.thread.is_alive():
                s.__exit__(None, None, None)
        for b in batchers:
            b.close()
    summary = {k: ratio_summary(v) for k, v in figures.items()}
    result = {"first": labels[0], "second": labels[1], "clients": args.clients,
              "batch": args.batch, "workers": args.workers, "rounds": args.rounds,
              "seconds": args.seconds, "cpus": os.cpu_count(), "target": TARGET,
              "stage_ahead": args.stage_ahead, "cuda_graph_sizes": args.cuda_graph_sizes,
              "first_over_second": summary}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"\n{'boundary':<22} {'first img/s':>11} {'second img/s':>12} {'median':>7}  "
              f"rounds")
        for k, s in summary.items():
            mark = "" if k.split("@")[0] in ("engine", "batcher") else (
                "  (target >= %.2f: %s)" % (TARGET, "met" if s["median"] >= TARGET else "not met"))
            print(f"{k:<22} {s['first_img_s']:11.1f} {s['second_img_s']:12.1f} "
                  f"{s['median']:7.3f}  {', '.join(f'{x:.3f}' for x in s['rounds'])}{mark}")
    return result


if __name__ == "__main__":
    main()
