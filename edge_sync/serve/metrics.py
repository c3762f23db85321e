"""What a device exports at ``/metrics`` (Prometheus text; names prefixed ``modelreg_``).

One :class:`Metrics` per daemon, on its own registry (no global state): requests by
model, version, outcome and protocol with their latency, updates by model and result
with the time of each stage, failed syncs by what failed and the time of the last good
one, when each trusted metadata role expires, engine swaps and their duration,
health-gate rollbacks, the engines loaded (bytes of weights each holds and shares),
the memory budget's hits, misses and evictions, the process's memory and CPU
(``modelreg_process_*``), and
``modelreg_model_info{model,version,sha256} 1`` for what each model serves now, so that a
Prometheus scraping the fleet counts the devices on each version
(``count by (model, version) (modelreg_model_info)``).  Made with ``prometheus_client``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from edge_sync.engine.base import EngineHost
    from edge_sync.serve.shadow import ShadowRunner
    from edge_sync.state.models import UpdateRecord

__all__ = ["CONTENT_TYPE", "Metrics"]

CONTENT_TYPE = CONTENT_TYPE_LATEST
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
_STAGE_BUCKETS = (0.001, 0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class Metrics:
    """The daemon's counters and histograms."""

    def __init__(self, host: EngineHost | None = None) -> None:
        """A fresh registry with the process collector (and ``host``'s engines, when
        there is one)."""
        self.registry = CollectorRegistry()
        ProcessCollector(namespace="modelreg", registry=self.registry)
        if host is not None:
            self.registry.register(_EngineCollector(host))
            self.registry.register(_ServingCollector(host))
        self.requests = Counter(
            "modelreg_requests",
            "Inference requests by model, version, outcome and protocol (rest, grpc).",
            ["model", "version", "outcome", "protocol"], registry=self.registry,
        )  # fmt: skip
        self.request_seconds = Histogram(
            "modelreg_request_seconds", "Inference latency, request to answer.",
            ["model"], buckets=_LATENCY_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.updates = Counter(
            "modelreg_updates", "Updates by model and result (installed, failed, rejected).",
            ["model", "result"], registry=self.registry,
        )  # fmt: skip
        self.update_stage_seconds = Histogram(
            "modelreg_update_stage_seconds", "Time of each update stage.",
            ["stage"], buckets=_STAGE_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.swaps = Counter(
            "modelreg_swaps", "Engines swapped in, by model.", ["model"], registry=self.registry
        )
        self.swap_seconds = Histogram(
            "modelreg_swap_seconds", "Time of each engine swap (the reference assignment).",
            ["model"], buckets=_LATENCY_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.sync_failures = Counter(
            "modelreg_sync_failures",
            "Failed syncs by what failed (repository, trust, model, internal).",
            ["reason"], registry=self.registry,
        )  # fmt: skip
        self.last_success = Gauge(
            "modelreg_last_successful_sync_timestamp_seconds",
            "When a sync last ended without failing (Unix time; 0: none since start).",
            registry=self.registry,
        )  # fmt: skip
        self.batch_rows = Histogram(
            "modelreg_batch_rows", "Rows of each batched run (serve.batching), by model.",
            ["model"], buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 1024), registry=self.registry,
        )  # fmt: skip
        self.batch_requests = Histogram(
            "modelreg_batch_requests", "Requests in each batched run, by model.",
            ["model"], buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 1024), registry=self.registry,
        )  # fmt: skip
        self.batch_queue = Gauge(
            "modelreg_batch_queue_depth", "Requests waiting for a batch, by model.",
            ["model"], registry=self.registry,
        )  # fmt: skip
        self.rollbacks = Counter(
            "modelreg_rollbacks", "Versions swapped back out by the health gate, by model.",
            ["model"], registry=self.registry,
        )  # fmt: skip

    def request(
        self, model: str, version: str, outcome: str, seconds: float, protocol: str = "rest"
    ) -> None:
        """Count one inference request (``outcome``: ok, http_400 ...)."""
        self.requests.labels(model, version, outcome, protocol).inc()
        self.request_seconds.labels(model).observe(seconds)

    def update(self, model: str, record: UpdateRecord) -> None:
        """Count one update and the time of its stages."""
        self.updates.labels(model, record.result).inc()
        for stage, ms in record.stages_ms.items():
            self.update_stage_seconds.labels(stage).observe(ms / 1000)
        if record.result == "installed" or "swap" in record.stages_ms:
            self.swaps.labels(model).inc()
        if "swap" in record.stages_ms:
            self.swap_seconds.labels(model).observe(record.stages_ms["swap"] / 1000)

    def batch(self, model: str, requests: int, rows: int) -> None:
        """Count one batched run."""
        self.batch_requests.labels(model).observe(requests)
        self.batch_rows.labels(model).observe(rows)

    def queue_depth(self, model: str, waiting: int) -> None:
        """How many requests to ``model`` wait for a batch now."""
        self.batch_queue.labels(model).set(waiting)

    def sync(self, failed: bool, failure: str | None = None, at: float | None = None) -> None:
        """Count one sync: a failure by what failed (``failure``: repository, trust, model
        or internal; None: a stop, not counted), else the time of the success."""
        if failed:
            if failure is not None:
                self.sync_failures.labels(failure).inc()
        else:
            self.last_success.set(time.time() if at is None else at)

    def watch_trust(self, expiries: Callable[[], Mapping[str, float]]) -> None:
        """Export when each trusted role expires (``expiries()``: Unix time by role, read
        at each scrape: ``modelreg_trust_expiry_timestamp_seconds{role}``)."""
        self.registry.register(_TrustCollector(expiries))

    def watch_shadow(self, runner: ShadowRunner, models: list[str]) -> None:
        """Export each model's shadow comparison (running, else the last one), read at
        each scrape: ``modelreg_shadow_*{model,version,against}``."""
        self.registry.register(_ShadowCollector(runner, models))

    def text(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)


class _EngineCollector(Collector):
    """The host's engines and memory-budget counters, read at each scrape."""

    def __init__(self, host: EngineHost) -> None:
        self.host = host

    def collect(self) -> Iterator[Any]:
        loaded = GaugeMetricFamily(
            "modelreg_engine_loaded",
            "Engines held, by model and version (1: in memory; 0: evicted by the budget).",
            labels=["model", "version"],
        )
        own = GaugeMetricFamily(
            "modelreg_engine_weight_bytes",
            "Weight bytes an engine holds, by model, version and whether they are shared "
            "with another loaded version.",
            labels=["model", "version", "shared"],
        )
        for engine in self.host.loaded():
            is_loaded = engine.loaded
            loaded.add_metric([engine.model, engine.version], 1.0 if is_loaded else 0.0)
            weights = engine.weights
            if weights is not None:
                own.add_metric([engine.model, engine.version, "false"], weights.own_bytes)
                own.add_metric([engine.model, engine.version, "true"], weights.shared_bytes)
            elif is_loaded:
                own.add_metric([engine.model, engine.version, "false"], engine.size_bytes)
        yield loaded
        yield own
        families = {
            name: CounterMetricFamily(f"modelreg_engine_cache_{name}", text, labels=["model"])
            for name, text in (
                ("hits", "Requests that found their engine loaded."),
                ("misses", "Requests that had to load their engine again (evicted before)."),
                ("evictions", "Engines unloaded to keep within serve.memory_budget."),
            )
        }
        for model, stats in dict(self.host.cache).items():
            counts = {"hits": stats.hits, "misses": stats.misses, "evictions": stats.evictions}
            for name, family in families.items():
                family.add_metric([model], counts[name])
        yield from families.values()


class _TrustCollector(Collector):
    """The trusted metadata's expiry, per role, as the device last verified it."""

    def __init__(self, expiries: Callable[[], Mapping[str, float]]) -> None:
        self.expiries = expiries

    def collect(self) -> Iterator[Any]:
        expiry = GaugeMetricFamily(
            "modelreg_trust_expiry_timestamp_seconds",
            "When each trusted metadata role expires (Unix time): a device whose "
            "timestamp is near it cannot reach its repository's signer.",
            labels=["role"],
        )
        for role, at in self.expiries().items():
            expiry.add_metric([role], at)
        yield expiry


class _ServingCollector(Collector):
    """What serves each model, read from the host at each scrape (a health gate's swap
    back shows at once, before the state file says so)."""

    def __init__(self, host: EngineHost) -> None:
        self.host = host

    def collect(self) -> Iterator[Any]:
        info = GaugeMetricFamily(
            "modelreg_model_info",
            "The version each model serves now, with the digest of the file its engine runs.",
            labels=["model", "version", "sha256"],
        )
        for model, engine in sorted(self.host.models().items()):
            info.add_metric([model, engine.version, engine.sha256], 1.0)
        yield info


class _ShadowCollector(Collector):
    """Each model's shadow comparison (``edge_sync.serve.shadow``): what was compared and
    dropped, and the figures (docs/guide/behaviour.md)."""

    def __init__(self, runner: ShadowRunner, models: list[str]) -> None:
        self.runner, self.models = runner, models

    def collect(self) -> Iterator[Any]:
        labels = ["model", "version", "against"]
        counters = {
            "compared": CounterMetricFamily(
                "modelreg_shadow_compared", "Requests run on both versions and compared.",
                labels=labels),
            "dropped": CounterMetricFamily(
                "modelreg_shadow_dropped",
                "Sampled requests not compared (busy, or the CPU budget spent).", labels=labels),
        }  # fmt: skip
        gauges = {
            "agreement": GaugeMetricFamily(
                "modelreg_shadow_agreement",
                "Share of compared rows whose top class is the previous version's.",
                labels=labels),
            "drift": GaugeMetricFamily(
                "modelreg_shadow_drift",
                "Relative L1 difference of the answers from the previous version's.",
                labels=labels),
            "p99_ratio": GaugeMetricFamily(
                "modelreg_shadow_p99_ratio",
                "p99 run time over the previous version's, on the same requests.",
                labels=labels),
            "running": GaugeMetricFamily(
                "modelreg_shadow_running", "1 while the comparison runs.", labels=labels),
        }  # fmt: skip
        for model in self.models:
            found = self.runner.latest(model)
            if found is None:
                continue
            values = [model, found.version, found.against]
            counters["compared"].add_metric(values, found.compared)
            counters["dropped"].add_metric(values, found.dropped)
            figures = {"agreement": found.agreement, "drift": found.drift,
                       "p99_ratio": found.p99_ratio, "running": float(found.open)}  # fmt: skip
            for name, value in figures.items():
                if value is not None:
                    gauges[name].add_metric(values, value)
        cpu = CounterMetricFamily(
            "modelreg_shadow_cpu_seconds", "CPU time the shadow comparisons took."
        )
        cpu.add_metric([], self.runner.cpu_s)
        yield from counters.values()
        yield from gauges.values()
        yield cpu
