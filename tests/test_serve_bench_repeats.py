"""benchmarks/serve_bench.py --repeats: each path measured in several rounds, each next to
its own batcher figure, the round with the median ratio shown (the H200's and the 2-core
machine's single windows moved by +-10%, and some landed in a split-cohort state)."""

from __future__ import annotations

import json

import pytest

from benchmark_modules import load_benchmark


pytest.importorskip("starlette")


@pytest.fixture(scope="module")
def serve_bench():
    return load_benchmark("serve_bench")


def test_the_median_round_is_a_real_round(serve_bench):
    rounds = [(700.0, 350.0, "cpu1", "t1", "u1"),     # 0.50: a split window
              (700.0, 630.0, "cpu2", "t2", "u2"),     # 0.90
              (400.0, 600.0, "cpu3", "t3", "u3")]     # 1.50: a split reference
    assert serve_bench._median_round(rounds)[2] == "cpu2"
    # an even count: the lower of the two middle rounds
    assert serve_bench._median_round(rounds[:2])[2] == "cpu1"


def test_a_failed_round_fails_the_path(serve_bench):
    rounds = [(700.0, 630.0, "cpu1", "t1", "u1"), (700.0, "http: ConnectionError", {}, {}, {})]
    assert serve_bench._median_round(rounds)[1] == "http: ConnectionError"


def test_repeats_end_to_end_on_the_synthetic_model(serve_bench, capsys):
    """Three rounds of HTTP over the synthetic model: three ratios, and the figure shown is
    the median one's."""
    result = serve_bench.main([
        "--synthetic", "--light", "--dtype", "uint8", "--image-size", "64", "--cost-ms", "2",
        "--paths", "http", "--workers-list", "0", "--http-clients", "4", "--http-procs", "1",
        "--seconds", "0.3", "--warmup", "0.1", "--repeats", "3", "--json"])
    capsys.readouterr()
    rounds = result["paths_over_batcher_rounds"]["http_w0"]
    assert result["repeats"] == 3 and len(rounds) == 3
    assert result["paths_over_batcher"]["http_w0"] == sorted(rounds)[1]
    json.dumps(result)      # what --json prints


def test_zero_repeats_is_a_usage_error(serve_bench, capsys):
    with pytest.raises(SystemExit) as e:
        serve_bench.main(["--synthetic", "--repeats", "0"])
    assert e.value.code == 2
    assert "one positive integer" in capsys.readouterr().err


def test_stage_ahead_modes_are_measured_side_by_side(serve_bench, capsys):
    """``--stage-ahead off,on``: each path measured with the batcher's staging off and on,
    one figure each (the synthetic model stages nothing: its share is 0)."""
    result = serve_bench.main([
        "--synthetic", "--light", "--dtype", "uint8", "--image-size", "64", "--cost-ms", "2",
        "--paths", "http", "--workers-list", "0", "--http-clients", "4", "--http-procs", "1",
        "--seconds", "0.3", "--warmup", "0.1", "--stage-ahead", "off,on", "--json"])
    capsys.readouterr()
    assert result["stage_ahead"] == ["off", "on"]
    assert set(result["paths_img_s"]) == {"http_w0@stage-off", "http_w0@stage-on"}
    assert all(u["staged_share"] == 0 for u in result["dispatch_rule_use"].values())


def test_an_unknown_stage_ahead_mode_is_a_usage_error(serve_bench, capsys):
    with pytest.raises(SystemExit) as e:
        serve_bench.main(["--synthetic", "--stage-ahead", "soon"])
    assert e.value.code == 2
    assert "--stage-ahead" in capsys.readouterr().err
