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
