"""runtime_py/server/metrics.py: request reports counted right through the label cache."""

from __future__ import annotations

import pytest

pytest.importorskip("prometheus_client", reason="the server extra (prometheus-client) is not installed")

from runtime_py.server import metrics as metrics_mod  # noqa: E402
from runtime_py.server.metrics import ServerMetrics  # noqa: E402


def _value(m: ServerMetrics, name: str, labels: dict) -> float | None:
    return m.registry.get_sample_value(name, labels)


def test_repeated_reports_count_each_request_and_error():
    m = ServerMetrics()
    for _ in range(3):
        m.record_request("toy", "infer", 200, 0.001)
    m.record_request("toy", "infer", 400, 0.002)
    m.record_request("toy", "infer", 400, 0.003)
    m.record_request("toy", "grpc_infer", 503, 0.004)
    assert _value(m, "trt_bundle_requests_total",
                  {"model": "toy", "endpoint": "infer", "status": "200"}) == 3
    assert _value(m, "trt_bundle_requests_total",
                  {"model": "toy", "endpoint": "infer", "status": "400"}) == 2
    assert _value(m, "trt_bundle_errors_total",
                  {"model": "toy", "endpoint": "infer", "kind": "bad_request"}) == 2
    assert _value(m, "trt_bundle_errors_total",
                  {"model": "toy", "endpoint": "grpc_infer", "kind": "unavailable"}) == 1
    assert _value(m, "trt_bundle_request_duration_seconds_count",
                  {"model": "toy", "endpoint": "infer"}) == 5
    assert _value(m, "trt_bundle_request_duration_seconds_sum",
                  {"model": "toy", "endpoint": "infer"}) == pytest.approx(0.008)


def test_label_sets_beyond_the_cache_are_still_counted():
    """A client naming a new model in every request fills the cache; later label sets are
    looked up each time and counted all the same."""
    m = ServerMetrics()
    assert m.cached_label_sets == metrics_mod._CACHED_LABEL_SETS
    m.cached_label_sets = 2
    for k in range(4):
        for _ in range(2):
            m.record_request(f"m{k}", "infer", 404, 0.001)
    assert len(m._children) == 2
    for k in range(4):
        assert _value(m, "trt_bundle_requests_total",
                      {"model": f"m{k}", "endpoint": "infer", "status": "404"}) == 2
        assert _value(m, "trt_bundle_errors_total",
                      {"model": f"m{k}", "endpoint": "infer", "kind": "not_found"}) == 2
