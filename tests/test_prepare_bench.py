"""benchmarks/prepare_bench.py: a bundle's preparation for serving timed under settings,
each in a process of its own with its environment (the H100's fp16 torch-aoti bundle
spent 73 s there). On the CPU the preparation is empty; the plumbing is what is checked."""

from __future__ import annotations

import argparse

import pytest

from benchmark_modules import load_benchmark


@pytest.fixture(scope="module")
def prepare_bench():
    return load_benchmark("prepare_bench")


def test_variants_parse_into_a_name_and_an_environment(prepare_bench):
    assert prepare_bench.variant("default") == ("default", {})
    assert prepare_bench.variant("v7:TORCH_CUDNN_V8_API_DISABLED=1,X=") == (
        "v7", {"TORCH_CUDNN_V8_API_DISABLED": "1", "X": ""})
    assert prepare_bench.variant("b:graph_sizes=1+2+4") == ("b", {"graph_sizes": "1+2+4"})
    assert prepare_bench.variant("u:cudnn_benchmark=off") == ("u", {"cudnn_benchmark": "off"})
    for bad in ("v7:NOVALUE", ":A=1", "x:=1", "u:cudnn_benchmark=yes"):
        with pytest.raises(argparse.ArgumentTypeError):
            prepare_bench.variant(bad)


def test_each_variant_runs_in_its_own_process_with_its_environment(prepare_bench,
                                                                   xception_bundles, capsys):
    """The environment reaches the child (a setting that breaks its interpreter fails that
    variant alone, said as such), and an onnxruntime bundle prepares nothing."""
    results = prepare_bench.main([
        "--bundle", str(xception_bundles["fp32"]), "--max-batch", "2", "--iterations", "3",
        "--replay-batches", "1,2,99",      # (reaches each child: it would refuse the flag)
        "--variant", "plain", "--variant", "broken:PYTHONHOME=/nonexistent",
        "--variant", "threads:OMP_NUM_THREADS=1,graph_sizes=1,cudnn_benchmark=off"])
    plain, broken, threads = results
    assert plain["backend"] == "onnxruntime" and plain["graphs"] == 0
    assert plain["sizes"] == 2 and plain["replay_ms"] == {} and plain["load_s"] > 0
    # (the runner's cuda_graph_sizes and cudnn_benchmark reach the load, as the child's
    # flags; onnxruntime ignores both and has no cuDNN timing to report)
    assert threads["env"] == {"OMP_NUM_THREADS": "1", "graph_sizes": "1", "cudnn_benchmark": "off"}
    assert "error" not in threads and threads["cudnn_timed"] is None
    out = capsys.readouterr().out
    assert out.count("\n") == 3 and "plain " in out and "replay n/a" in out
    assert broken["error"].startswith("exit ") and "broken       failed: exit" in out


def test_replay_batches_must_be_positive_integers(prepare_bench, capsys):
    for bad in ("0", "1,x", ""):
        with pytest.raises(SystemExit):
            prepare_bench.main(["--bundle", "x.bundle", "--replay-batches", bad])
        assert "--replay-batches" in capsys.readouterr().err


def test_variant_names_must_differ(prepare_bench, capsys):
    with pytest.raises(SystemExit):
        prepare_bench.main(["--bundle", "x.bundle", "--variant", "a", "--variant", "a:X=1"])
    assert "a name of its own" in capsys.readouterr().err


def test_a_variant_past_its_timeout_fails_alone(prepare_bench, xception_bundles, tmp_path,
                                                capsys):
    """A variant that outlasts --timeout is reported as such, and the script goes on to
    the next (here the slow one's interpreter sleeps at start: a sitecustomize on its
    PYTHONPATH). The timeout leaves the plain variant room: it takes ~1.1 s alone here,
    and a fresh-user run with both xdist workers busy timed it out at 2 s."""
    (tmp_path / "sitecustomize.py").write_text("import time\ntime.sleep(120)\n")
    results = prepare_bench.main([
        "--bundle", str(xception_bundles["fp32"]), "--timeout", "10", "--iterations", "2",
        "--max-batch", "1", "--variant", f"slow:PYTHONPATH={tmp_path}", "--variant", "plain"])
    assert results[0]["error"] == "timed out after 10 s (--timeout)"
    assert "error" not in results[1] and results[1]["backend"] == "onnxruntime"
    assert "slow         failed: timed out after 10 s" in capsys.readouterr().out


def test_capture_totals_sum_a_runners_capture_seconds(prepare_bench):
    totals = prepare_bench.capture_totals({1: (0.5, 0.01), 2: (2.0, 0.02), 4: (1.0, 0.5)})
    assert totals == {"graphs": 3, "warmup_s": 3.5, "capture_s": pytest.approx(0.53),
                      "slowest": 2, "slowest_s": 2.02}
    assert prepare_bench.capture_totals({}) == {"graphs": 0, "warmup_s": 0, "capture_s": 0,
                                                "slowest": None, "slowest_s": 0.0}


def test_a_runners_load_phases_get_a_line_and_the_rest_of_the_load_is_named(prepare_bench):
    """The torch-aoti runner's load_seconds (36 s of an H100 start, unexplained before) are
    printed under the variant, the bundle's own opening last; a runner without them (ONNX
    Runtime) prints nothing more."""
    got = {"variant": "default", "load_s": 10.0, "prepare_s": 1.0, "graphs": 0,
           "warmup_s": 0.0, "capture_s": 0.0, "slowest": None, "slowest_s": 0.0,
           "replay_ms": {}, "load_phases": {"torch import": 2.0, "graphs": 6.5}}
    first, second = prepare_bench.line_of(got, got).split("\n")
    assert first.startswith("default      load  10.0 s")
    assert second == ("             load: torch import 2.0 s, graphs 6.5 s, "
                      "bundle and the rest 1.5 s")
    assert "\n" not in prepare_bench.line_of({**got, "load_phases": {}}, got)
    # a torch-aoti runner says whether its warm-ups timed cuDNN's algorithms
    assert "captures 0.0 s, cuDNN untimed)" in prepare_bench.line_of(
        {**got, "cudnn_timed": False}, got)
    assert "cuDNN timed)" in prepare_bench.line_of({**got, "cudnn_timed": True}, got)
    assert "cuDNN timed at 16+32)" in prepare_bench.line_of({**got, "cudnn_timed": [16, 32]},
                                                            got)
