"""The device's status document, built from its state: what ``edge status --json``
prints, ``/status`` serves and the fleet report carries.

The document's schema is :class:`registry.device_report.StatusDocument`, shared with the
fleet that reads the reports; :func:`build_status` is the one mapping from the state
models (:mod:`edge_sync.state.models`) to it.  It does no I/O: the caller reads the state
dir, the daemon's announcement, the last sync record and the trusted metadata's
freshness (``edge_sync.sync.trust.freshness``, passed in as :class:`FreshnessFacts`), and
the running daemon adds what only it knows (:class:`LiveStatus`: engines loaded, open
health gates, prepacking decisions) to what ``/status`` serves (:class:`ServedStatus`).

The document is built as the state holds it, without the report's checks (a model's 32
rejections, a reason recorded by an older daemon): ``edge status`` shows what is there,
and the report is checked when it is encoded (``registry.device_report.encode_report``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Final, Protocol, TypeVar, cast, overload

from pydantic import BaseModel, Field

from edge_sync.state.models import DaemonInfo, DeviceState, ModelState, SyncInfo
from registry.agreement import Agreement
from registry.device_report import (
    DaemonStatus,
    GateReport,
    InstalledReport,
    ModelReport,
    RejectedReport,
    Role,
    StatusDocument,
    SyncReport,
    TrustReport,
    UpdateReport,
)
from registry.schema import Strict

__all__ = [
    "EngineStatus",
    "FreshnessFacts",
    "LiveStatus",
    "LoadedEngine",
    "OpenGateStatus",
    "ServedStatus",
    "WeightBytes",
    "build_status",
    "served_status",
]

_EXPIRES_FORMAT: Final = "%Y-%m-%dT%H:%M:%SZ"
_Shown = TypeVar("_Shown", bound=BaseModel)


class TimestampFacts(Protocol):
    """The trusted timestamp role (``edge_sync.sync.trust.RoleState``)."""

    @property
    def version(self) -> int: ...  # pragma: no cover - protocol

    @property
    def expires(self) -> datetime: ...  # pragma: no cover - protocol


class FreshnessFacts(Protocol):
    """How fresh the trusted metadata is (``edge_sync.sync.trust.Freshness``)."""

    @property
    def timestamp(self) -> TimestampFacts | None: ...  # pragma: no cover - protocol

    @property
    def expired(self) -> Sequence[str]: ...  # pragma: no cover - protocol

    @property
    def stale(self) -> bool | None: ...  # pragma: no cover - protocol


@overload
def _shown(schema: type[_Shown], record: BaseModel) -> _Shown: ...
@overload
def _shown(schema: type[_Shown], record: BaseModel | None) -> _Shown | None: ...
def _shown(schema: type[_Shown], record: BaseModel | None) -> _Shown | None:
    """``record`` (a state model) as the document shows it: the fields ``schema`` names,
    unchecked (module docstring)."""
    if record is None:
        return None
    # attributes as they are (a nested report, ProvenanceReport, stays its model)
    fields = set(schema.model_fields) & set(type(record).model_fields)
    return schema.model_construct(**{name: getattr(record, name) for name in fields})


def _model(channel: str, model: ModelState | None) -> ModelReport:
    """One subscribed model's entry (``model`` None: nothing installed yet)."""
    if model is None:
        return ModelReport.model_construct(channel=channel)
    return ModelReport.model_construct(
        channel=channel,
        serving=_shown(InstalledReport, model.serving),
        previous=_shown(InstalledReport, model.previous),
        last_known_good=_shown(InstalledReport, model.last_known_good),
        last_update=_shown(UpdateReport, model.last_update),
        rejected=[_shown(RejectedReport, r) for r in model.rejected],
        # a health gate watching the version served (not known good yet)
        gate=_shown(GateReport, model.gate),
        shadow=model.shadow,
    )


def _trust(fresh: FreshnessFacts) -> TrustReport:
    timestamp = fresh.timestamp
    return TrustReport.model_construct(
        timestamp_version=timestamp.version if timestamp else None,
        timestamp_expires=timestamp.expires.strftime(_EXPIRES_FORMAT) if timestamp else None,
        stale=fresh.stale,
        expired=cast("list[Role]", list(fresh.expired)),  # the trust layer names roles only
    )


def build_status(
    device: str,
    channels: Mapping[str, str],
    state: DeviceState,
    *,
    running: bool,
    announced: DaemonInfo | None,
    trust: FreshnessFacts,
    sync: SyncInfo,
) -> StatusDocument:
    """The status document of ``device``.

    Args:
        device: the device id (``edge.yaml``'s ``device.id``).
        channels: each subscribed model's channel, in ``edge.yaml``'s order; a model the
            state holds but the config no longer subscribes is not shown.
        state: the committed state.
        running: whether a live daemon holds the state dir's lock.
        announced: the daemon's announcement (``daemon.json``); read only while running.
        trust: the trusted metadata's freshness.
        sync: the last sync record (``StateDir.last_sync``); its number is not shown (it
            orders records on the device only).
    """
    info = announced if running else None
    daemon = DaemonStatus.model_construct(
        running=running,
        pid=info.pid if info else None,
        listen=info.listen if info else None,
        grpc_listen=info.grpc_listen if info else None,
        started=info.started if info else None,
    )
    return StatusDocument.model_construct(
        device=device,
        daemon=daemon,
        trust=_trust(trust),
        sync=_shown(SyncReport, sync),
        models={name: _model(chan, state.models.get(name)) for name, chan in channels.items()},
    )


# --- what only the running daemon knows ---------------------------------------------


class WeightSizes(Protocol):
    """An engine's weights (``edge_sync.engine.weights.Weights``)."""

    @property
    def own_bytes(self) -> int: ...  # pragma: no cover - protocol

    @property
    def shared_bytes(self) -> int: ...  # pragma: no cover - protocol


class LoadedEngine(Protocol):
    """What ``/status`` reads of a loaded engine (members of
    ``edge_sync.engine.base.Engine``, which state/ does not import)."""

    @property
    def model(self) -> str: ...  # pragma: no cover - protocol

    @property
    def version(self) -> str: ...  # pragma: no cover - protocol

    @property
    def loaded(self) -> bool: ...  # pragma: no cover - protocol

    @property
    def shared(self) -> bool: ...  # pragma: no cover - protocol

    @property
    def weights(self) -> WeightSizes | None: ...  # pragma: no cover - protocol


class WeightBytes(Strict):
    """An engine's weight bytes: its own, and those it maps from a version it shares
    them with (None: an engine without shared weights)."""

    own: int | None = None
    shared: int | None = None


class EngineStatus(Strict):
    """One loaded engine: serving, a candidate, or draining after a swap."""

    version: str
    serving: bool
    loaded: bool
    in_flight: int
    shared_weights: bool
    weight_bytes: WeightBytes

    @classmethod
    def of(cls, engine: LoadedEngine, *, serving: bool, in_flight: int) -> EngineStatus:
        """``engine``'s entry."""
        weights = engine.weights
        return cls(
            version=engine.version,
            serving=serving,
            loaded=engine.loaded,
            in_flight=in_flight,
            shared_weights=engine.shared,
            weight_bytes=WeightBytes(
                own=weights.own_bytes if weights is not None else None,
                shared=weights.shared_bytes if weights is not None else None,
            ),
        )


class OpenGateStatus(Strict):
    """A health gate watching a version now: the version it would swap back to, and
    for how long it has watched."""

    version: str
    previous: str
    open_s: float


class LiveStatus(Strict):
    """What only the running daemon knows: the engines loaded per model, the open
    health gates, and per model whether prepacking won when measured."""

    engines: dict[str, list[EngineStatus]] = Field(default_factory=dict)
    gates: dict[str, OpenGateStatus] = Field(default_factory=dict)
    prepack: dict[str, dict[str, float | bool | str]] = Field(default_factory=dict)
    shadow: dict[str, Agreement] = Field(default_factory=dict)
    """Per model, the shadow comparison running now (its sums as of this request)."""


class ServedStatus(LiveStatus, StatusDocument):
    """``/status``: the status document and the live part (the report carries only
    the document)."""


def served_status(doc: StatusDocument, live: LiveStatus) -> ServedStatus:
    """``doc`` with ``live`` added."""
    return ServedStatus.model_construct(**dict(doc), **dict(live))
