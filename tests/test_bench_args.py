"""benchmarks/bench_args.py: the "N[,N..]" option type of serve_bench and infer_overhead."""

from __future__ import annotations

import argparse

import pytest

from benchmark_modules import load_benchmark



@pytest.fixture(scope="module")
def bench_args():
    return load_benchmark("bench_args")


def test_lists_of_positive_integers_parse(bench_args):
    assert bench_args.positive_ints("8") == [8]
    assert bench_args.positive_ints("8, 32,") == [8, 32]


@pytest.mark.parametrize("text", ["", ",", "0", "8,-1", "8,x", "1.5"])
def test_anything_else_is_a_usage_error_naming_the_value(bench_args, text):
    ap = argparse.ArgumentParser(prog="bench", exit_on_error=False)
    ap.add_argument("--procs", type=bench_args.positive_ints)
    with pytest.raises(argparse.ArgumentError, match="positive integers"):
        ap.parse_args(["--procs", text])


def test_one_positive_integer(bench_args):
    assert bench_args.positive_int("3") == 3
    for text in ("0", "3,4", "x", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            bench_args.positive_int(text)


def test_the_bundle_timing_profiles_only_sizes_it_times(tmp_path):
    """aoti_static_vs_peer.py --profile-sizes must name timed sizes (the peer is compiled for
    those only): refused at once with the two lists, before any bundle is opened."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "aoti_static_vs_peer.py"
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "none.bundle"),
                           "--batch-sizes", "1,32", "--profile", "--profile-sizes", "4"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "--profile-sizes [4] names sizes that are not timed (--batch-sizes [1, 32])" \
        in done.stderr
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "none.bundle"),
                           "--batch-sizes", "1,0"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "positive integers" in done.stderr


def test_the_bundle_timing_names_bundles_a_failed_build_did_not_write(tmp_path):
    """aoti_static_vs_peer.py leaves out a bundle that does not exist (a failed build of a
    GPU step), saying so, and times the rest; with none at all it stops with that."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "aoti_static_vs_peer.py"
    missing = [tmp_path / "fp16.bundle", tmp_path / "fp8-*.bundle"]
    done = subprocess.run([sys.executable, str(script), *map(str, missing),
                           "--batch-sizes", "1"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "none of the bundles exists" in done.stderr
    for path in missing:
        assert f"{path}: no such bundle (its build failed?), not timed" in done.stdout
