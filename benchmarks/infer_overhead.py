"""Where `Model.infer`'s time goes beyond the engine at small batches, on a GPU bundle.

    python benchmarks/infer_overhead.py --bundle B.bundle [--batch 1[,32]] [--iterations 2000]

Times, interleaved in rounds (medians, microseconds), on a batch written into the model's
pinned `input_buffers()`:
  with_copies   the runner's own boundary (pinned H2D + graph replay + D2H, synchronized)
  runner        `runner.infer_checked(feeds, n)`: the runner's call without the model's
  model         `Model.infer(feeds)`
and then a cProfile of `Model.infer` calls (the Python functions the call spends its
time in, C calls included) to say what the difference is made of.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_args import positive_ints  # noqa: E402
from data_path_bench import samples_s  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--batch", type=positive_ints, default="1", metavar="N[,N..]",
                    help="batch sizes, each measured in turn on the one loaded model")
    ap.add_argument("--iterations", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rows", type=int, default=25, help="cProfile rows (0: no profile)")
    args = ap.parse_args()
    import runtime_py

    model = runtime_py.load(args.bundle)
    try:
        for n in args.batch:
            measure(model, n, args)
    finally:
        model.close()


def measure(model, n: int, args) -> None:
    """One batch size: the three boundaries interleaved in rounds, then the profile."""
    from runtime_py.bench import device_timings, random_feeds

    name = model.inputs[0].name
    buffers = model.input_buffers()
    buffers[name][:n] = random_feeds(model.inputs, n, seed=3)[name]
    feeds = {name: buffers[name][:n]}
    runner = model.runner

    per = max(1, args.iterations // args.rounds)
    t = {"with_copies": [], "runner": [], "model": []}
    for fn in (lambda: runner.infer_checked(feeds, n), lambda: model.infer(feeds)):
        samples_s(fn, 0, warmup=50)
    for _ in range(args.rounds):
        t["with_copies"] += (device_timings(runner, n, iterations=per, warmup=5) or {}).get(
            "with_copies", [])
        t["runner"] += samples_s(lambda: runner.infer_checked(feeds, n), per, warmup=0)
        t["model"] += samples_s(lambda: model.infer(feeds), per, warmup=0)
    med = {k: statistics.median(v) * 1e6 for k, v in t.items() if v}
    print(f"{model.bundle.path.name} ({model.backend}), batch {n}: " +
          ", ".join(f"{k} {v:.1f} us" for k, v in med.items()), flush=True)
    if "with_copies" in med:
        print(f"  runner - with_copies {med['runner'] - med['with_copies']:+.1f} us, "
              f"model - runner {med['model'] - med['runner']:+.1f} us, "
              f"model / with_copies {med['model'] / med['with_copies']:.3f}", flush=True)
    if args.rows <= 0:
        return
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(per):
        model.infer(feeds)
    profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(args.rows)
    print(f"cProfile of {per} Model.infer calls (tottime order):", flush=True)
    print(text.getvalue(), flush=True)

if __name__ == "__main__":
    main()
