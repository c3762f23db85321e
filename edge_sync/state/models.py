"""The device's state as it is stored (``state.json``, ``daemon.json``): pydantic models,
frozen, that ignore fields a newer daemon added (stable API).

:mod:`edge_sync.state.store` reads and writes them atomically; the decisions in
:mod:`edge_sync.decide` take and return them.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from registry.agreement import Agreement
from registry.device_report import ProvenanceReport
from registry.errors import one_line, printable
from registry.redact import redact

__all__ = [
    "FORMAT",
    "MAX_REJECTED",
    "Attempt",
    "DaemonInfo",
    "DeviceState",
    "GateRecord",
    "Installed",
    "ModelState",
    "Rejected",
    "SyncInfo",
    "UpdateRecord",
    "reason_text",
]

FORMAT: Final = 1
MAX_REJECTED: Final = 32
"""Rejected digests kept per model (the oldest are forgotten first)."""

REASON_LIMIT: Final = 500
"""Characters of a recorded reason (a remote's message is cut there)."""


def reason_text(text: str) -> str:
    """A reason as the device records and shows it: one line of printable text, at
    most :data:`REASON_LIMIT` characters, secrets redacted.

    Reasons quote what remotes said (a git host's error line, an S3 error code) and the
    URLs the device was given, which may carry credentials; ``/status`` serves them over
    HTTP and ``edge status`` prints them on a terminal, where an escape sequence from a
    remote would act.
    """
    return printable(one_line(redact(text), REASON_LIMIT))


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Installed(_Model):
    """One installed version: the verified file served, and how it came.

    Attributes:
        version: the model version.
        sha256: digest of the file the engine loads (the artifact, or a prebuilt engine).
        artifact_sha256: digest of the version's artifact when the device holds it (the
            base of a later delta), else None.
        target: the device target whose settings run it.
        kind: ``artifact`` (an ONNX file run by ONNX Runtime) or ``engine`` (a
            prebuilt engine file).
        external: for an artifact stored with ONNX external data, each data file's blob
            digest by the name its graph uses (empty for a self-contained model).
        graph: for a version built from tensors (``edge_sync.sync.tensors``), its
            skeleton's blob digest; its tensors are in the kept layout, and
            ``sha256`` names the whole file they make, which the device may not hold.
        model_sha256: the SHA-256 of the version's signed artifact, named by every
            answer its engine computes (None in a state kept before it was recorded).
        provenance: where the version came from, as its signed description says
            (None: a release made before it was signed, or a state kept before).
    """

    version: str
    sha256: str
    artifact_sha256: str | None = None
    target: str | None = None
    kind: Literal["artifact", "engine"] = "artifact"
    external: dict[str, str] = Field(default_factory=dict)
    graph: str | None = None
    model_sha256: str | None = None
    provenance: ProvenanceReport | None = None


class Rejected(_Model):
    """A version that verified but failed its self-test (or could not be installed for
    a reason that another try would not change); not tried again while ``signed`` (the
    digest of its signed description and artifact) is the same."""

    version: str
    sha256: str
    signed: str
    reason: str
    at: str


class UpdateRecord(_Model):
    """The last sync that installed, failed or rejected something for one model."""

    result: Literal["installed", "failed", "rejected"]
    version: str | None = None
    method: Literal["delta", "full", "cached"] | None = None
    bytes_fetched: int = 0
    reason: str | None = None
    finished: str
    stages_ms: dict[str, float] = Field(default_factory=dict)


class GateRecord(_Model):
    """A health gate open on the version served: what it watches, and what to serve
    again if the version fails it (or the daemon dies while it watches)."""

    version: str
    sha256: str
    signed: str
    opened: str
    restore_serving: Installed | None = None
    restore_previous: Installed | None = None
    restore_last_known_good: Installed | None = None
    unclean_stops: int = 0
    """Unclean stops of the daemon while this gate was open (``edge_sync.decide.restarts``)."""
    confirmed: bool = True
    """Whether the version's goldens passed in every session setup.  False from its swap
    until the setups other than the one serving it are checked (right after the swap:
    ``edge_sync.engine.selftest.confirm_setups``); a restart meanwhile serves what it
    replaced again and tries the version anew (``edge_sync.decide.gate_state``)."""


class Attempt(_Model):
    """A version being loaded and swapped in: written (fsynced) before its engine is
    built, gone once it is committed or refused, so that a version that kills the
    daemon while it loads is counted (``edge_sync.decide.restarts``)."""

    version: str
    signed: str
    sha256: str = ""
    started: str
    unclean_stops: int = 0


class ModelState(_Model):
    """What one subscribed model runs, ran, and refused."""

    channel: str
    serving: Installed | None = None
    previous: Installed | None = None
    last_known_good: Installed | None = None
    last_update: UpdateRecord | None = None
    rejected: list[Rejected] = Field(default_factory=list)
    gate: GateRecord | None = None
    """A health gate open on ``serving`` (it is not known good yet)."""
    attempt: Attempt | None = None
    """A version being loaded (see :class:`Attempt`)."""
    shadow: Agreement | None = None
    """The last shadow comparison of a version with the one it replaced (its sums; open
    while it runs: ``edge_sync.serve.shadow``)."""

    def held(self) -> tuple[Installed, ...]:
        """Every installed version this state names (its blobs are kept)."""
        found = [self.serving, self.previous, self.last_known_good]
        if self.gate is not None:
            found += [self.gate.restore_serving, self.gate.restore_previous,
                      self.gate.restore_last_known_good]  # fmt: skip
        return tuple(i for i in found if i is not None)

    def with_rejected(self, rejected: Rejected) -> ModelState:
        """A copy with ``rejected`` recorded, keeping the newest :data:`MAX_REJECTED`."""
        return self.model_copy(update={"rejected": [*self.rejected, rejected][-MAX_REJECTED:]})


class SyncInfo(_Model):
    """The last sync as a whole (device-wide failures land here).

    Attributes:
        seq: the record's number, given when it is first written (:meth:`StateDir.commit`,
            :meth:`StateDir.note_sync`): the newest record has the highest, whatever
            the clock said (0: not written yet, or written before records had one).
    """

    last_checked: str | None = None
    result: Literal["current", "failed"] | None = None
    reason: str | None = None
    commit: str | None = None
    seq: Annotated[int, Field(ge=0)] = 0


class DeviceState(_Model):
    """``state.json``."""

    format: Annotated[int, Field(ge=1)] = FORMAT
    device: str = ""
    channels: dict[str, Any] | None = None
    """The last accepted signed channels document (its sequences are high-water marks)."""
    models: dict[str, ModelState] = Field(default_factory=dict)
    sync: SyncInfo = SyncInfo()

    def with_model(self, name: str, model: ModelState) -> DeviceState:
        """A copy with ``name``'s state replaced."""
        return self.model_copy(update={"models": {**self.models, name: model}})

    def referenced_blobs(self) -> set[str]:
        """Every blob digest the state names (serving, previous, last known good)."""
        found: set[str] = set()
        for model in self.models.values():
            for installed in model.held():
                found.add(installed.sha256)
                if installed.artifact_sha256:
                    found.add(installed.artifact_sha256)
                found.update(installed.external.values())
                if installed.graph is not None:
                    found.add(installed.graph)
        return found


class DaemonInfo(_Model):
    """``daemon.json``: written by the running daemon for ``edge status``."""

    pid: int
    listen: str | None = None
    grpc_listen: str | None = None
    started: str
