"""``modelreg fleet devices``: one row per device and model, from the devices' reports
(pure: the reports are read by ``fleet.reports``).

A row says what an operator looks for first on a device: its labels, what it serves of
the model on which channel, how its last update ended and why, when it last reported
(and whether that is stale), and when its trusted metadata expires.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from typing import Any

from registry.device_report import DeviceReport, ModelReport

__all__ = ["DeviceRow", "device_rows", "render_rows"]


@dataclass(frozen=True, slots=True)
class DeviceRow:
    """One device's state for one model (``model`` None: it follows no model)."""

    device: str
    labels: dict[str, str]
    model: str | None
    channel: str | None
    serving: str | None
    last_update: str | None
    """``installed``, ``failed`` or ``rejected``, and the version."""
    reason: str | None
    reported: str
    age_s: float
    stale: bool
    trust_expires: str | None
    approvers: list[str] | None = None
    """Who approved the version served, as its signed provenance says (None: unknown)."""

    def to_json(self) -> dict[str, Any]:
        """The row as JSON (``fleet devices --json``)."""
        return asdict(self)


def device_rows(
    reports: Iterable[DeviceReport],
    *,
    now: datetime,
    stale_after_s: float,
    model: str | None = None,
    labels: Mapping[str, str] | None = None,
) -> list[DeviceRow]:
    """The rows of ``reports``, sorted by device then model; only ``model`` and
    devices carrying every one of ``labels`` when given."""
    rows = []
    for report in reports:
        if labels and any(report.labels.get(k) != v for k, v in labels.items()):
            continue
        age = (now - report.reported).total_seconds()
        expires = report.trust.timestamp_expires
        base = DeviceRow(
            device=report.device, labels=dict(sorted(report.labels.items())), model=None,
            channel=None, serving=None, last_update=None, reason=None,
            reported=report.reported.isoformat(), age_s=round(age, 3),
            stale=age > stale_after_s,
            trust_expires=str(expires) if expires is not None else None,
        )  # fmt: skip
        models = {k: v for k, v in report.models.items() if model is None or k == model}
        if not models and model is None:
            rows.append(base)
        for name, state in sorted(models.items()):
            update = state.last_update
            rows.append(
                replace(
                    base,
                    model=name,
                    channel=state.channel,
                    serving=state.serving.version if state.serving else None,
                    last_update=f"{update.result} {update.version or '-'}" if update else None,
                    reason=update.reason if update else None,
                    approvers=_approvers(state),
                )
            )
    return sorted(rows, key=lambda r: (r.device, r.model or ""))


_HEAD = ("device", "labels", "model", "channel", "serving", "last update", "last seen",
         "trust expires")  # fmt: skip


def render_rows(rows: Iterable[DeviceRow]) -> str:
    """The rows as an aligned text table (a stale device's last report is marked)."""
    table = [_HEAD]
    reasons = []
    for r in rows:
        seen = _age(r.age_s) + (" STALE" if r.stale else "")
        labels = ",".join(f"{k}={v}" for k, v in r.labels.items()) or "-"
        table.append((r.device, labels, r.model or "-", r.channel or "-", r.serving or "-",
                      r.last_update or "-", seen, r.trust_expires or "-"))  # fmt: skip
        if r.reason:
            reasons.append(f"{r.device} {r.model}: {r.last_update}: {r.reason}")
    widths = [max(len(row[i]) for row in table) for i in range(len(_HEAD))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in table]  # fmt: skip
    return "\n".join(lines + reasons) + "\n"


def _approvers(state: ModelReport) -> list[str] | None:
    origin = state.serving.provenance if state.serving is not None else None
    return None if origin is None or origin.approvers is None else list(origin.approvers)


def _age(seconds: float) -> str:
    """``42s ago``, ``5m ago``, ``3h ago``, ``2d ago``."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit} ago"
    return f"{max(0, int(seconds))}s ago"
