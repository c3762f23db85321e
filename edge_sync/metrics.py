"""What a device exports at ``/metrics`` (Prometheus text; names prefixed ``modelreg_``).

One :class:`Metrics` per daemon, on its own registry (no global state): requests by
model, version and outcome with their latency, updates by model and result with the
time of each stage, engine swaps, and the process's memory and CPU
(``modelreg_process_*``).  Made with ``prometheus_client``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

if TYPE_CHECKING:
    from edge_sync.state import UpdateRecord

__all__ = ["CONTENT_TYPE", "Metrics"]

CONTENT_TYPE = CONTENT_TYPE_LATEST
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
_STAGE_BUCKETS = (0.001, 0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class Metrics:
    """The daemon's counters and histograms."""

    def __init__(self) -> None:
        """A fresh registry with the process collector."""
        self.registry = CollectorRegistry()
        ProcessCollector(namespace="modelreg", registry=self.registry)
        self.requests = Counter(
            "modelreg_requests", "Inference requests by model, version and outcome.",
            ["model", "version", "outcome"], registry=self.registry,
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

    def request(self, model: str, version: str, outcome: str, seconds: float) -> None:
        """Count one inference request (``outcome``: ok, bad_request, error ...)."""
        self.requests.labels(model, version, outcome).inc()
        self.request_seconds.labels(model).observe(seconds)

    def update(self, model: str, record: UpdateRecord) -> None:
        """Count one update and the time of its stages."""
        self.updates.labels(model, record.result).inc()
        for stage, ms in record.stages_ms.items():
            self.update_stage_seconds.labels(stage).observe(ms / 1000)
        if record.result == "installed":
            self.swaps.labels(model).inc()

    def text(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)
