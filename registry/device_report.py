"""The device's status document, and the report it sends about itself: the schema
``modelreg edge status --json``, the device's ``/status`` and ``modelreg fleet status``
share (stable API).

:class:`StatusDocument` is what a device says about itself (``edge status``,
docs/reference/status.md): its daemon, its trusted metadata's freshness, its last sync,
and per subscribed model what it serves, held and refused.  :class:`DeviceReport` is
that document plus what a fleet view needs: the device's labels, when it was sent
(``reported``), the daemon's version, and a ``kind`` and ``format``.  One JSON object
per device, stored as ``<device-id>.json``::

    {"kind": "DeviceReport", "format": 4, "device": "cam-0042",
     "labels": {"arch": "x86_64"}, "reported": "2025-01-01T12:00:00.000000Z",
     "daemon": {"running": true, "pid": 123, "listen": "127.0.0.1:8000",
                "started": "...", "version": "0.1.0"},
     "trust": {"timestamp_version": 7, "timestamp_expires": "...", "stale": false,
               "expired": []},
     "sync": {"last_checked": "...", "result": "current", "reason": null, "commit": "..."},
     "models": {"mlp": {"channel": "production", "serving": {...}, "previous": {...},
                        "last_known_good": {...}, "last_update": {...},
                        "rejected": [...], "gate": null, "shadow": {...}}},
     "truncated": false, "sequence": 42}

A device sends it signed, in a DSSE envelope (``signing.device_reports``): the
envelope's payload is this document.

The schema lives here, beside neither side, because both need the same rules: the device
builds its document from these models (``edge_sync.state.status``) and checks every
report against them before sending (it never sends one the reader refuses), and the
reader treats every report as untrusted input (a bucket that many devices write to):
strict keys and types, printable text only, bounded sizes and counts
(:class:`ReportLimits`).  :func:`encode_report` fits a report into those bounds (newest
rejections first, then dropping detail, marked ``truncated``); :func:`parse_report`
refuses anything else with one line (:class:`ReportError`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Final, Literal

from pydantic import (
    AfterValidator,
    AwareDatetime,
    Field,
    StringConstraints,
    ValidationError,
    field_serializer,
)

from registry.agreement import Agreement, OutputSums
from registry.errors import RegistryError, printable
from registry.schema import Labels, Name, SemVer, Strict

__all__ = [
    "DEVICE_ID_RE",
    "KIND",
    "LIMITS",
    "REPORT_FORMAT",
    "DaemonReport",
    "DaemonStatus",
    "DeviceId",
    "DeviceReport",
    "GateReport",
    "InstalledReport",
    "ModelReport",
    "ProvenanceReport",
    "RejectedReport",
    "ReportError",
    "ReportLimits",
    "Role",
    "StatusDocument",
    "SyncReport",
    "TrustReport",
    "UpdateReport",
    "encode_report",
    "parse_report",
]

KIND: Final = "DeviceReport"
REPORT_FORMAT: Final = 4
"""Bumped when a field is added: a reader refuses a newer format with a clear reason
(its schema is strict, so it could not read one anyway), and reads every older one.
Format 2 added each held version's ``model_sha256`` and ``provenance``; format 3 the
report's ``sequence`` (reports travel signed from then on: ``signing.device_reports``);
format 4 each model's ``shadow`` comparison (``registry.agreement``)."""

DEVICE_ID_RE: Final = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
DeviceId = Annotated[str, StringConstraints(pattern=DEVICE_ID_RE)]
"""A device id (``device.id`` in ``edge.yaml``): also a file and object name."""


@dataclass(frozen=True)
class ReportLimits:
    """Bounds on one report: the device fits its report into them, the reader refuses
    what exceeds them.

    Attributes:
        max_bytes: the encoded report (a reader refuses a larger one before parsing).
        max_models: models per report (``edge.yaml`` subscribes at most 64).
        max_rejected: rejected versions listed per model (the newest).
        max_text: characters of a reason (the device records at most 500).
        max_stages: entries of an update's ``stages_ms``.
    """

    max_bytes: int = 64 * 1024
    max_models: int = 64
    max_rejected: int = 8
    max_text: int = 500
    max_stages: int = 32

    @property
    def max_stored_bytes(self) -> int:
        """What one stored report may take: a report of :attr:`max_bytes` in its signed
        envelope (base64, and a signature)."""
        return self.max_bytes * 4 // 3 + 4096


LIMITS: Final = ReportLimits()


class ReportError(RegistryError):
    """A report that cannot be read or sent: too large, not JSON, or not the schema.
    The message is one line, and never quotes the report's content."""


def _printable(value: str) -> str:
    # isprintable() is the fast path (it also refuses spaces other than " ", which
    # printable() keeps); the full check runs only then
    if not value.isprintable() and printable(value, keep="") != value:
        raise ValueError("holds control or format characters")
    return value


def _finite(value: float) -> float:
    if not math.isfinite(value) or value < 0:
        raise ValueError("must be a finite number, 0 or more")
    return value


Text = Annotated[str, StringConstraints(max_length=LIMITS.max_text), AfterValidator(_printable)]
Word = Annotated[str, StringConstraints(max_length=256), AfterValidator(_printable)]
Stamp = Annotated[
    str,
    StringConstraints(pattern=r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?(Z|[+-]\d\d:\d\d)$"),
]
"""An ISO 8601 time with its zone, as the device writes them (``now_iso``)."""
Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
Version = Annotated[SemVer, StringConstraints(max_length=128)]
Stage = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]{0,31}$")]
Millis = Annotated[float, AfterValidator(_finite)]
Role = Literal["root", "targets", "snapshot", "timestamp"]
"""A TUF role the device trusts."""


def _printable_labels(labels: dict[str, str]) -> dict[str, str]:
    for value in labels.values():
        _printable(value)
    return labels


GitCommit = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{7,64}$")]


class ProvenanceReport(Strict):
    """Where a version the device holds came from, as its signed description says
    (``signing.provenance``): who approved it and which CI run released it.

    Attributes:
        commit: the commit the release was built from.
        pull_request: the number of the pull request that declared it.
        approvers: the reviewers whose approvals were counted (None: not counted).
        ci_run: the run that released it (its page, else its id).
        released_at: when it was released.
        unknown: the facts the release could not know (``pull_request``,
            ``approvals``, ``policy``, ``ci``).
    """

    commit: GitCommit
    pull_request: Annotated[int, Field(ge=1)] | None = None
    approvers: Annotated[list[Word], Field(max_length=100)] | None = None
    ci_run: Text | None = None
    released_at: Stamp | None = None
    unknown: Annotated[list[Stage], Field(max_length=16)] = Field(default_factory=list)

    def summary(self) -> str:
        """One line: ``PR #7 approved by ann; CI run <url>``."""
        if self.pull_request is not None:
            who = ", ".join(self.approvers) if self.approvers else "no one"
            line = f"PR #{self.pull_request} approved by " + (
                who if self.approvers is not None else "(approvals not counted)"
            )
        else:
            line = "no pull request known"
        line += f"; CI run {self.ci_run}" if self.ci_run else "; not released by CI"
        return f"{line} (commit {self.commit[:12]})"


class InstalledReport(Strict):
    """A version the device holds: serving, previous or last known good.

    ``model_sha256`` is the signed artifact's SHA-256 that inference answers name, and
    ``provenance`` where the version came from (both absent for versions installed
    before they were recorded, and from reports of format 1).
    """

    version: Version
    sha256: Sha256
    target: Name | None = None
    kind: Literal["artifact", "engine"] = "artifact"
    model_sha256: Sha256 | None = None
    provenance: ProvenanceReport | None = None


class UpdateReport(Strict):
    """The model's last update that installed, failed or rejected something."""

    result: Literal["installed", "failed", "rejected"]
    version: Version | None = None
    method: Literal["delta", "full", "cached"] | None = None
    bytes_fetched: Annotated[int, Field(ge=0)] = 0
    reason: Text | None = None
    finished: Stamp
    stages_ms: Annotated[dict[Stage, Millis], Field(max_length=LIMITS.max_stages)] = Field(
        default_factory=dict
    )


class RejectedReport(Strict):
    """A version the device verified and refused (self-test, health gate, no target)."""

    version: Version
    sha256: Sha256
    reason: Text
    at: Stamp


class GateReport(Strict):
    """A health gate watching the version served."""

    version: Version
    opened: Stamp


def _one_device(found: Agreement) -> Agreement:
    if found.devices != 1:
        raise ValueError("a device reports its own comparison: devices must be 1")
    return found


class ModelReport(Strict):
    """One subscribed model: its channel, what it serves and held, and what failed."""

    channel: Name
    serving: InstalledReport | None = None
    previous: InstalledReport | None = None
    last_known_good: InstalledReport | None = None
    last_update: UpdateReport | None = None
    rejected: list[RejectedReport] = Field(default_factory=list)
    """Oldest first: the device keeps 32, a report carries the newest
    :attr:`ReportLimits.max_rejected` (:func:`parse_report` checks it)."""
    gate: GateReport | None = None
    shadow: Annotated[Agreement, AfterValidator(_one_device)] | None = None
    """The last shadow comparison of a version with the one it replaced
    (``registry.agreement``; format 4): this device's own (``devices`` 1)."""


class DaemonStatus(Strict):
    """The device's daemon: ``running`` while a live process holds the state dir's
    lock, and what it announced (its pid, where it serves, when it started)."""

    running: bool
    pid: Annotated[int, Field(ge=0)] | None = None
    listen: Word | None = None
    grpc_listen: Word | None = None
    """Where it serves the protocol over gRPC (``serve.grpc_listen``), if it does."""
    started: Stamp | None = None


class DaemonReport(DaemonStatus):
    """The daemon that sent the report, with its modelreg version."""

    version: Annotated[Word, StringConstraints(min_length=1, max_length=64)]


class TrustReport(Strict):
    """The device's trusted timestamp role; ``stale`` when any trusted role has expired
    (``expired`` names them: a fresh timestamp over an expired snapshot is a freeze)."""

    timestamp_version: Annotated[int, Field(ge=1)] | None = None
    timestamp_expires: Stamp | None = None
    stale: bool | None = None
    expired: Annotated[list[Role], Field(max_length=4)] = Field(default_factory=list)


class SyncReport(Strict):
    """The last sync as a whole (device-wide failures: repository, metadata)."""

    last_checked: Stamp | None = None
    result: Literal["current", "failed"] | None = None
    reason: Text | None = None
    commit: (
        Annotated[str, StringConstraints(pattern=r"^(sha256:[0-9a-f]{64}|[0-9a-f]{40,64})$")] | None
    ) = None
    """What the device followed: the git commit, or (``repository.source: artifacts``)
    ``sha256:<hex>`` of the mirrored ``timestamp.json``."""


class StatusDocument(Strict):
    """What a device says about itself (``edge status --json``, ``/status``)."""

    device: DeviceId
    daemon: DaemonStatus
    trust: TrustReport
    sync: SyncReport
    models: Annotated[dict[Name, ModelReport], Field(max_length=LIMITS.max_models)]
    """Per subscribed model, in ``edge.yaml``'s order."""


class DeviceReport(StatusDocument):
    """One device's report: its status document and the report's own fields (module
    docstring)."""

    kind: Literal["DeviceReport"]
    format: Literal[1, 2, 3, 4]
    labels: Annotated[Labels, AfterValidator(_printable_labels)] = Field(default_factory=dict)
    reported: AwareDatetime
    daemon: DaemonReport
    truncated: bool = False
    """Detail was dropped to fit :attr:`ReportLimits.max_bytes`."""
    sequence: Annotated[int, Field(ge=1, le=2**53)] | None = None
    """Grows with every report the device sends (a replayed report is older)."""

    @field_serializer("reported", when_used="json")
    def _stamp(self, reported: datetime) -> str:
        # as the device writes its times: UTC, microseconds always shown
        return reported.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _first_problem(error: ValidationError) -> str:
    problems = error.errors(include_url=False, include_input=False, include_context=False)
    if any(p["loc"][:1] == ("format",) for p in problems):
        return f"not a report of format 1 to {REPORT_FORMAT} (made by a newer modelreg?)"
    first = problems[0]
    where = ".".join(str(p) for p in first["loc"]) or "report"
    more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
    return f"{where}: {first['msg']}{more}"


def parse_report(data: bytes, limits: ReportLimits = LIMITS) -> DeviceReport:
    """Read one report, as untrusted input.

    Raises:
        ReportError: larger than ``limits.max_bytes``, not JSON, or not the schema
            (the first problem, with its field path).
    """
    if len(data) > limits.max_bytes:
        raise ReportError(f"larger than {limits.max_bytes} bytes ({len(data)})")
    try:
        report = DeviceReport.model_validate_json(data)
    except ValidationError as e:
        if any(p["type"] == "json_invalid" for p in e.errors(include_url=False)):
            raise ReportError("not a JSON document") from None
        raise ReportError(_first_problem(e)) from None
    # The schema's bounds are the default limits; a caller's narrower ones apply here,
    # with the count of rejections (a status document holds more than a report).
    if len(report.models) > limits.max_models:
        raise ReportError(f"models: more than {limits.max_models}")
    for name, model in report.models.items():
        if len(model.rejected) > limits.max_rejected:
            raise ReportError(f"models.{name}.rejected: more than {limits.max_rejected}")
    return report


def _newest_rejections(doc: dict[str, Any], keep: int) -> None:
    for model in doc.get("models", {}).values():
        if isinstance(model, dict) and len(model.get("rejected") or []) > keep:
            model["rejected"] = model["rejected"][-keep:] if keep else []


def _each_model(doc: dict[str, Any], step: Callable[[dict[str, Any]], None]) -> None:
    for model in doc.get("models", {}).values():
        if isinstance(model, dict):
            step(model)


def _shorter_reasons(model: dict[str, Any]) -> None:
    for entry in [model.get("last_update"), *(model.get("rejected") or [])]:
        if isinstance(entry, dict) and isinstance(entry.get("reason"), str):
            entry["reason"] = entry["reason"][:120]


def _no_stages(model: dict[str, Any]) -> None:
    if isinstance(model.get("last_update"), dict):
        model["last_update"]["stages_ms"] = {}


def _no_latency_histograms(model: dict[str, Any]) -> None:
    if isinstance(model.get("shadow"), dict):
        model["shadow"]["new_hist"] = model["shadow"]["old_hist"] = []


def _few_shadow_outputs(model: dict[str, Any]) -> None:
    """Keep the shadow comparison's two outputs that make its figures (the lowest
    agreement, the largest drift; else the first by name)."""
    shadow = model.get("shadow")
    if not (isinstance(shadow, dict) and isinstance(shadow.get("outputs"), dict)):
        return
    outputs = shadow["outputs"]
    sums = {name: OutputSums.model_validate(found) for name, found in sorted(outputs.items())}
    if len(sums) <= 2:
        return
    least = min(sums, key=lambda n: (sums[n].top1_agreement is None, sums[n].top1_agreement or 0.0))
    most = max(sums, key=lambda n: sums[n].drift or 0.0)
    kept = list(dict.fromkeys([least, most, *sums]))[:2]
    shadow["outputs"] = {name: outputs[name] for name in sorted(kept)}


def _no_shadow(model: dict[str, Any]) -> None:
    model["shadow"] = None


def _no_history(model: dict[str, Any]) -> None:
    model["previous"] = model["last_known_good"] = None
    model["rejected"] = []


# What is given up, in order, when a report is over the size limit: what a fleet view
# needs last (what each model serves, its channel, the last update's result) stays.
_SHEDDING: Final[tuple[Callable[[dict[str, Any]], None], ...]] = (
    lambda doc: _newest_rejections(doc, 2),
    lambda doc: _each_model(doc, _no_stages),
    lambda doc: _each_model(doc, _shorter_reasons),
    lambda doc: _each_model(doc, _no_latency_histograms),
    lambda doc: _each_model(doc, _few_shadow_outputs),
    lambda doc: _each_model(doc, _no_history),
    lambda doc: _each_model(doc, _no_shadow),
)


def encode_report(doc: Mapping[str, Any], limits: ReportLimits = LIMITS) -> bytes:
    """A report (a status document with the report's fields) as the bytes to send:
    checked against the schema, at most ``limits.max_rejected`` rejections per model
    (the newest), and detail dropped until it fits ``limits.max_bytes`` (then
    ``truncated`` is true).

    Raises:
        ReportError: the document does not fit the schema, or cannot be made to fit the
            size limit (neither happens with a document from ``edge status``).
    """
    work: dict[str, Any] = json.loads(json.dumps(doc))  # a deep copy that is plain JSON
    work.setdefault("truncated", False)
    _newest_rejections(work, limits.max_rejected)
    steps = iter(_SHEDDING)
    while True:
        data = json.dumps(work, separators=(",", ":"), ensure_ascii=False).encode()
        if len(data) <= limits.max_bytes:
            break
        step = next(steps, None)
        if step is None:
            raise ReportError(f"over {limits.max_bytes} bytes even without its detail")
        step(work)
        work["truncated"] = True
    parse_report(data, limits)
    return data
