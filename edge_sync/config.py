"""``edge.yaml``: what one device follows, trusts, and serves (stable API).

Strict like the manifests: unknown keys and bad values are refused, each with
``edge.yaml:line:col`` (the same loader and error type, ``registry.errors.ManifestError``).
Durations are written ``500ms``, ``30s``, ``5m``, ``1h`` (a bare number is seconds);
sizes ``512MiB``, ``2GiB``, ``100MB`` (a bare number is bytes).  Paths, and URLs that
are plain paths, are relative to the config file's folder.  See docs/reference/daemon.md::

    apiVersion: modelreg/v1
    kind: EdgeConfig
    device: {id: cam-0042, labels: {arch: x86_64}}
    repository: {url: git://127.0.0.1/fleet.git, branch: main, poll_interval: 60s}
    # or, without git on the device: the metadata mirrored to the artifact remote
    # repository: {source: artifacts, poll_interval: 60s}
    trust: {root: /etc/modelreg/1.root.json}
    artifacts: {url: file:///srv/models/modelreg}
    models: [{name: mlp, channel: production}]
    state_dir: /var/lib/modelreg
    serve: {listen: 127.0.0.1:8000, memory_budget: 2GiB}  # limits: ServeLimitsConfig
    report: {url: s3://fleet-reports/fleet/, heartbeat: 5m}
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Final, Literal
from urllib.parse import urlparse

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    StringConstraints,
    ValidationInfo,
    field_validator,
    model_validator,
)

from registry.device_report import DeviceId
from registry.errors import ManifestError
from registry.loader import validate_document
from registry.schema import Labels, Name, Shadow, Strict
from registry.units import parse_duration
from registry.yamlsrc import read_yaml

__all__ = [
    "ArtifactsConfig",
    "BatchingConfig",
    "DeviceConfig",
    "EdgeConfig",
    "ModelLimits",
    "ReportConfig",
    "RepositoryConfig",
    "ServeConfig",
    "ServeLimitsConfig",
    "Subscription",
    "TrustAnchorConfig",
    "batching_of",
    "load_edge_config",
    "parse_duration",
    "parse_size",
]

_SIZE: Final = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
_SIZE_UNITS: Final = {
    "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
}  # fmt: skip
_SCHEMES: Final = ("file", "git", "http", "https", "ssh")
_ARTIFACT_SCHEMES: Final = ("file", "http", "https", "s3")
_REPORT_SCHEMES: Final = ("file", "http", "https", "s3")
_LOCAL_URL: Final = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def parse_size(value: object) -> int:
    """Bytes from ``512MiB``, ``2GiB``, ``100MB``, ``4096`` ...

    Raises:
        ValueError: anything else.
    """
    if isinstance(value, bool):
        raise ValueError("expected a size such as 512MiB or 2GiB")  # noqa: TRY004
    if isinstance(value, int):
        size = value
    else:
        match = _SIZE.match(value) if isinstance(value, str) else None
        if match is None:
            raise ValueError("expected a size such as 512MiB or 2GiB")
        size = int(float(match.group(1)) * _SIZE_UNITS[(match.group(2) or "b").lower()])
    if size <= 0:
        raise ValueError("a size must be positive")
    return size


Duration = Annotated[float, BeforeValidator(parse_duration)]
Size = Annotated[int, BeforeValidator(parse_size)]
Text = Annotated[str, StringConstraints(min_length=1, max_length=4096)]


def _url(schemes: tuple[str, ...]) -> Any:
    def check(value: str) -> str:
        if _LOCAL_URL.match(value):
            scheme = urlparse(value).scheme.lower()
            if scheme not in schemes:
                shown = ", ".join(f"{s}://" for s in schemes)
                raise ValueError(f"unsupported URL scheme {scheme!r}: use a path or {shown}")
        return value

    return AfterValidator(check)


def _on_off(value: object) -> object:
    """YAML 1.1 reads an unquoted ``on``/``off`` (and ``yes``/``no``, ``true``/``false``)
    as a boolean: it means the same as the word, so it is taken as ``on``/``off``."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return value


OnnxRuntimeLog = Literal["verbose", "info", "warning", "error", "fatal"]


def _listen(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError("expected host:port, e.g. 127.0.0.1:8000 (port 0 picks a free one)")
    return value


class DeviceConfig(Strict):
    """Who the device is: its id (rollout cohorts hash it) and its labels (matched by
    the selectors of a version's targets)."""

    id: DeviceId
    labels: Labels = Field(default_factory=dict)


class RepositoryConfig(Strict):
    """Where the device follows the signed metadata, and how often it asks.

    ``source: git`` (the default) follows ``branch`` of the git repository at ``url``;
    ``source: artifacts`` follows the copy that ``publish`` mirrors to the artifact
    remote (``<artifacts.url>/metadata/``), with one conditional request per idle poll
    and no git on the device; ``url`` and ``branch`` are then not used (and refused).
    Either way the metadata is verified against the device's root.
    """

    source: Literal["git", "artifacts"] = "git"
    url: Annotated[Text, _url(_SCHEMES)] | None = None
    branch: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._/-]{1,255}$")] = "main"
    poll_interval: Annotated[Duration, Field(gt=0)] = 60.0
    jitter: Annotated[float, Field(ge=0, lt=1)] = 0.2
    max_backoff: Annotated[Duration, Field(gt=0)] = 900.0

    @field_validator("url", "branch")
    @classmethod
    def _git_only(cls, value: str | None, info: ValidationInfo) -> str | None:
        if info.data.get("source") == "artifacts" and value is not None:
            raise ValueError(
                "not used with source: artifacts (the device follows the metadata mirrored "
                "to artifacts.url); remove it, or use source: git"
            )
        return value

    @model_validator(mode="after")
    def _branch_is_a_ref(self) -> RepositoryConfig:
        if self.source == "git" and self.url is None:
            raise ValueError(
                "url: the git repository to follow is required with source: git (or use "
                "source: artifacts to follow the metadata mirrored to the artifact remote)"
            )
        if ".." in self.branch or self.branch.startswith(("-", "/")) or self.branch.endswith("/"):
            raise ValueError(f"branch {self.branch!r} is not a branch name")
        return self


class TrustAnchorConfig(Strict):
    """The provisioned trust anchor (the repository's ``1.root.json``)."""

    root: Text


class ArtifactsConfig(Strict):
    """The artifact remote: ``<DVC remote>/modelreg``."""

    url: Annotated[Text, _url(_ARTIFACT_SCHEMES)]


class BatchingConfig(Strict):
    """Dynamic batching (``edge_sync.serve.batching``): requests to a model whose inputs
    leave their first dimension open, arriving within ``max_queue_delay`` of each other
    with the same shapes past it, datatypes and outputs asked for, are stacked into one
    run of at most ``max_batch_size`` rows on one engine, and split again."""

    max_batch_size: Annotated[int, Field(ge=2, le=4096)] = 8
    max_queue_delay: Annotated[Duration, Field(gt=0, le=1)] = 0.002


class Subscription(Strict):
    """One model the device runs, and the channel it follows (``batching``: this
    model's own, over ``serve.batching``; ``false`` turns it off for this model).

    ``shadow`` compares each new version's answers with the previous version's while
    its health gate is open (``registry.schema.Shadow``, docs/guide/behaviour.md); unset,
    the channel's declaration in ``model.yaml`` applies; ``false``: never compare.
    """

    name: Name
    channel: Name
    batching: BatchingConfig | Literal[False] | None = None
    shadow: Shadow | Literal[False] | None = None


def batching_of(serve: ServeConfig, models: Sequence[Subscription]) -> dict[str, BatchingConfig]:
    """The models served with dynamic batching and how: a model's own ``batching``, else
    ``serve.batching`` (``false`` for a model: none)."""
    found = {}
    for sub in models:
        chosen = serve.batching if sub.batching is None else sub.batching
        if chosen:
            found[sub.name] = chosen
    return found


class HealthGateConfig(Strict):
    """The watch after each swap (``edge_sync.decide.health``): a version that fails it is
    swapped back and rejected.  ``window: 0s`` turns the gate off."""

    window: Annotated[Duration, Field(ge=0)] = 30.0
    min_requests: Annotated[int, Field(ge=1, le=1_000_000)] = 20
    max_error_rate: Annotated[float, Field(ge=0, le=1)] = 0.05
    max_latency_ratio: Annotated[float, Field(ge=1)] = 2.0


class ModelLimits(Strict):
    """Caps on one request to a model, checked from the shapes before the engine runs
    (413 over them).  ``max_batch`` bounds the first dimension of an input where the
    model leaves it open (its batch); elements count the values of one input tensor,
    and of all the outputs together where the shapes tell them in advance (and after
    the run otherwise)."""

    max_batch: Annotated[int, Field(ge=1)] = 64
    max_input_elements: Annotated[int, Field(ge=1)] = 1 << 24
    max_output_elements: Annotated[int, Field(ge=1)] = 1 << 24


class ServeLimitsConfig(Strict):
    """The server's bounds (``serve.limits``): what any client of the inference port
    may make the device hold.  The defaults fit a device with 1 GiB of memory.

    Attributes:
        max_concurrent: inference requests decoded or run at once in worker threads;
            others wait (at most ``max_queued`` of them, ``queue_timeout`` each).
        inflight: decoded bytes of every request in flight together (bodies as read,
            inflated, parsed and as arrays); over it a request is refused with 503.
        max_request: decoded bytes of one request (413 over it).
        max_body: one body, as sent and inflated (413 over it).
        max_header: one request's line and headers (431 over it).
        header_timeout: to send a request's line and headers (a connection that takes
            longer is closed).
        keepalive_timeout: an idle connection between requests is closed after it.
        body_timeout: a request's body may pause this long between reads (408).
        max_connections: open connections (default: the descriptor limit less a
            reserve for the update loop, never more).
    """

    max_concurrent: Annotated[int, Field(ge=1, le=1024)] = 8
    max_queued: Annotated[int, Field(ge=0, le=100_000)] = 256
    queue_timeout: Annotated[Duration, Field(gt=0, le=300)] = 5.0
    inflight: Size = 512 << 20
    max_request: Size = 256 << 20
    max_body: Size = 64 << 20
    max_header: Annotated[Size, Field(ge=1024, le=16 << 20)] = 64 << 10
    header_timeout: Annotated[Duration, Field(gt=0, le=3600)] = 10.0
    keepalive_timeout: Annotated[Duration, Field(gt=0, le=3600)] = 5.0
    body_timeout: Annotated[Duration, Field(gt=0, le=3600)] = 30.0
    max_connections: Annotated[int, Field(ge=1)] | None = None
    model: ModelLimits = ModelLimits()
    """Every model's caps (unless ``models`` names it)."""
    models: dict[Name, ModelLimits] = Field(default_factory=dict)
    """Caps of the models named (the others take ``model``)."""

    @model_validator(mode="after")
    def _fits(self) -> ServeLimitsConfig:
        if self.max_request > self.inflight:
            raise ValueError("max_request must not exceed inflight (one request alone)")
        return self


class ServeConfig(Strict):
    """The inference server (Open Inference Protocol v2)."""

    listen: Annotated[str, AfterValidator(_listen)] = "127.0.0.1:8000"
    management_listen: Annotated[str, AfterValidator(_listen)] | None = None
    """Serve ``/status`` and ``/metrics`` here, and no longer on ``listen``."""
    batching: BatchingConfig | None = None
    """Batch the requests of every model that can be (off when unset; a model's own
    ``batching`` in ``models`` wins)."""
    grpc_listen: Annotated[str, AfterValidator(_listen)] | None = None
    """Serve the protocol over gRPC here too (``edge_sync.serve.grpc_server``; off when
    unset), within the same ``limits`` as REST."""
    limits: ServeLimitsConfig = ServeLimitsConfig()
    memory_budget: Size | None = None
    threads: Annotated[int, Field(ge=1, le=256)] = 1
    """ONNX Runtime intra-op threads per session (1 is fastest for small models on
    2 cores: requests run in parallel across sessions' runs instead)."""
    prepack: Annotated[Literal["auto", "on", "off"], BeforeValidator(_on_off)] = "auto"
    """Prepack weights (faster for some models, but a private copy of every weight, so
    nothing is shared between versions); ``auto`` measures each model once.  An
    unquoted ``on``/``off`` (a YAML boolean) means the same as the quoted word."""
    onnxruntime_log: OnnxRuntimeLog = "warning"
    """The least severe of ONNX Runtime's own messages written to the daemon's log
    (``edge_sync.engine.ortlog``: through Python's ``logging``, one line each)."""
    health_gate: HealthGateConfig = HealthGateConfig()
    remote_sync: bool = False
    """Accept ``POST /v2/repository/sync`` from any client (default: this machine only)."""


class ReportConfig(Strict):
    """Where the device sends its report (``edge_sync.sync.report``): on every change and at
    each heartbeat, as ``<device-id>.json`` under ``url``.

    ``url`` is a folder (a path or ``file://``, NFS included), ``s3://bucket/prefix/``,
    or an ``http(s)://`` URL that takes a PUT: a base ending in ``/`` gets
    ``<device-id>.json`` appended, and ``{device}`` anywhere in an s3 or http URL is
    replaced by the device id instead.  ``credentials`` is a file only this device can
    read: for S3 an AWS shared-credentials file (its ``[default]`` keys), for HTTP a
    bearer token; without it, S3 takes the standard AWS configuration and HTTP the
    token in ``MODELREG_REPORT_TOKEN``, if any.
    """

    url: Annotated[Text, _url(_REPORT_SCHEMES)]
    heartbeat: Annotated[Duration, Field(ge=1)] = 300.0
    timeout: Annotated[Duration, Field(gt=0, le=300)] = 10.0
    """Each send's connect and read time limit."""
    credentials: Text | None = None

    @property
    def scheme(self) -> str:
        """``file`` for a folder, else the URL's scheme."""
        return urlparse(self.url).scheme.lower() if _LOCAL_URL.match(self.url) else "file"

    @model_validator(mode="after")
    def _names_each_device(self) -> ReportConfig:
        if self.scheme != "file" and not (self.url.endswith("/") or "{device}" in self.url):
            raise ValueError(
                "the URL must name each device's report: end it with / (<device-id>.json "
                "is added) or put {device} in it"
            )
        if self.scheme == "file" and self.credentials is not None:
            raise ValueError("credentials are for s3:// and http(s):// report URLs")
        return self


def _unique_models(subscriptions: list[Subscription]) -> list[Subscription]:
    names = [s.name for s in subscriptions]
    for name in names:
        if names.count(name) > 1:
            raise ValueError(f"model {name!r} is subscribed twice (one channel per model)")
    return subscriptions


class EdgeConfig(Strict):
    """``edge.yaml``: the whole configuration of one device's daemon."""

    api_version: Literal["modelreg/v1"] = Field(alias="apiVersion")
    kind: Literal["EdgeConfig"]
    device: DeviceConfig
    repository: RepositoryConfig
    trust: TrustAnchorConfig
    artifacts: ArtifactsConfig
    models: Annotated[list[Subscription], Field(max_length=64), AfterValidator(_unique_models)] = (
        Field(default_factory=list)
    )
    state_dir: Text
    serve: ServeConfig = ServeConfig()
    report: ReportConfig | None = None
    """Send the device's report to a fleet sink (``modelreg fleet status`` reads them)."""

    def batching(self) -> dict[str, BatchingConfig]:
        """The models served with dynamic batching and how (:func:`batching_of`)."""
        return batching_of(self.serve, self.models)

    @model_validator(mode="after")
    def _limits_name_models(self) -> EdgeConfig:
        unknown = sorted(set(self.serve.limits.models) - {m.name for m in self.models})
        if unknown:
            raise ValueError(f"serve.limits.models names {unknown}, not subscribed in models")
        return self

    @property
    def state_path(self) -> Path:
        """The state dir (absolute once loaded by :func:`load_edge_config`)."""
        return Path(self.state_dir)

    @property
    def root_path(self) -> Path:
        """The provisioned root file."""
        return Path(self.trust.root)


def _resolve(value: str, base: Path) -> str:
    """A path (or a URL that is a plain path) made absolute against ``base``."""
    if _LOCAL_URL.match(value):
        return value
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else (base / path))


def _resolved_report(report: ReportConfig | None, base: Path) -> ReportConfig | None:
    if report is None:
        return None
    credentials = report.credentials
    return report.model_copy(
        update={
            "url": _resolve(report.url, base),
            "credentials": _resolve(credentials, base) if credentials else None,
        }
    )


def load_edge_config(path: Path) -> EdgeConfig:
    """Read and validate ``edge.yaml``; relative paths resolved against its folder.

    Raises:
        ManifestError: unreadable, invalid YAML, or invalid content (file:line:col).
    """
    doc = read_yaml(path, str(path))
    config = validate_document(doc, EdgeConfig)
    base = path.resolve().parent
    try:
        return config.model_copy(
            update={
                "state_dir": _resolve(config.state_dir, base),
                "trust": config.trust.model_copy(
                    update={"root": _resolve(config.trust.root, base)}
                ),
                "repository": config.repository.model_copy(
                    update={"url": config.repository.url and _resolve(config.repository.url, base)}
                ),
                "artifacts": config.artifacts.model_copy(
                    update={"url": _resolve(config.artifacts.url, base)}
                ),
                "report": _resolved_report(config.report, base),
            }
        )
    except ValueError as e:  # pragma: no cover - model_copy does not validate
        raise ManifestError.single(str(path), str(e)) from None
