"""Prometheus metrics of one app, in a registry of its own.

A registry per app (not prometheus_client's global one) so that two apps in one process,
as in tests or a benchmark, never share or collide on counters. The batcher reports each
engine call through a listener; HTTP handlers report each request.
"""

from __future__ import annotations

from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ..batcher import Batcher, BatchStats

_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
#: Label sets whose metric children ``record_request`` keeps at hand; beyond this many (a
#: client naming a new model in every request) each request looks its children up again.
_CACHED_LABEL_SETS = 1024


class ServerMetrics:
    """The server's counters and histograms; ``registry`` is what ``/metrics`` exposes."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "trt_bundle_requests", "Requests answered (HTTP and gRPC), by model, endpoint and HTTP status.",
            ["model", "endpoint", "status"], registry=r)
        self.errors = Counter(
            "trt_bundle_errors", "Requests answered with an error, by kind.",
            ["model", "endpoint", "kind"], registry=r)
        self.latency = Histogram(
            "trt_bundle_request_duration_seconds", "Time to answer a request in the app.",
            ["model", "endpoint"], buckets=_LATENCY_BUCKETS, registry=r)
        self.batch_size = Histogram(
            "trt_bundle_batch_size", "Rows per engine call.",
            ["model"], buckets=_BATCH_BUCKETS, registry=r)
        self.queue_time = Histogram(
            "trt_bundle_queue_seconds", "Time a request waited in the batcher before its batch ran.",
            ["model"], buckets=_LATENCY_BUCKETS, registry=r)
        self.compute_time = Histogram(
            "trt_bundle_compute_seconds", "Engine time per batch (model.infer).",
            ["model"], buckets=_LATENCY_BUCKETS, registry=r)
        self.failed = Counter(
            "trt_bundle_failed_inferences", "Requests whose inference raised in the engine.",
            ["model"], registry=r)
        self.queue_length = Gauge(
            "trt_bundle_queue_length", "Requests waiting in the batcher.", ["model"], registry=r)
        self.frontend_connections = Gauge(
            "trt_bundle_frontend_connections",
            "Client connections open on each front-end worker process, by protocol "
            "(built-in servers: the engine process deals them out).",
            ["worker", "protocol"], registry=r)
        # (model, endpoint, status) -> its request counter, error counter (or None) and
        # latency histogram: ``labels()`` validates and locks on every call, and with
        # front-end workers every request's report is applied on the engine's event loop,
        # which each request crosses (py-spy, 2 cores, 1 worker: 13% of that loop's work).
        self._children: dict[tuple[str, str, int], tuple] = {}
        self.cached_label_sets = _CACHED_LABEL_SETS

    def record_request(self, model: str, endpoint: str, status: int, seconds: float) -> None:
        """Count one answered request (HTTP status; gRPC codes are mapped to one)."""
        key = (model, endpoint, status)
        children = self._children.get(key)
        if children is None:
            children = (self.requests.labels(model, endpoint, str(status)),
                        self.errors.labels(model, endpoint, error_kind(status))
                        if status >= 400 else None,
                        self.latency.labels(model, endpoint))
            if len(self._children) < self.cached_label_sets:
                self._children[key] = children
        count, errors, latency = children
        count.inc()
        if errors is not None:
            errors.inc()
        latency.observe(seconds)

    def exposition(self) -> bytes:
        """The text ``/metrics`` answers with."""
        return generate_latest(self.registry)

    def watch_connections(self, worker: str, protocol: str, count: Callable[[], int]) -> None:
        """Report ``count()``, the connections a front-end worker holds open, at each scrape:
        one worker holding most of them is the service's slowest hop."""
        self.frontend_connections.labels(worker, protocol).set_function(count)

    def watch(self, model: str, batcher: Batcher) -> Callable[[BatchStats], None]:
        """Feed this batcher's batches into the histograms; returns the listener."""
        size = self.batch_size.labels(model)
        queue = self.queue_time.labels(model)
        compute = self.compute_time.labels(model)
        failed = self.failed.labels(model)
        self.queue_length.labels(model).set_function(lambda: batcher.queue_length)

        def listener(stats: BatchStats) -> None:
            size.observe(stats.size)
            compute.observe(stats.compute_s)
            for q in stats.queue_s:
                queue.observe(q)
            if stats.failed:
                failed.inc(stats.failed)

        batcher.add_listener(listener)
        return listener


def error_kind(status: int) -> str:
    return {400: "bad_request", 404: "not_found", 409: "conflict", 413: "too_large",
            415: "unsupported_media", 503: "unavailable"}.get(
        status, "internal" if status >= 500 else "client")
