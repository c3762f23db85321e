"""The device's status document built from its state (``edge_sync.state.status``), with
no I/O: each row builds the state in memory and names the exact JSON the document must
have (the shape ``edge status --json``, ``/status`` and the fleet report share,
docs/reference/status.md), then the report a device sends from it and ``/status``'s live
part."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from edge_sync.config import EdgeConfig
from edge_sync.state.models import (
    DaemonInfo,
    DeviceState,
    GateRecord,
    Installed,
    ModelState,
    Rejected,
    SyncInfo,
    UpdateRecord,
)
from edge_sync.state.status import (
    EngineStatus,
    LiveStatus,
    OpenGateStatus,
    build_status,
    served_status,
)
from edge_sync.sync.report import report_document
from edge_sync.sync.trust import Freshness, RoleState
from registry.agreement import Agreement, OutputSums
from registry.device_report import (
    LIMITS,
    ProvenanceReport,
    ReportError,
    StatusDocument,
    encode_report,
    parse_report,
)

AT = "2025-06-01T12:00:00.000000Z"
SHA = {v: f"{n:x}" * 64 for n, v in enumerate(["1.0.0", "1.1.0", "1.2.0"], start=1)}
EMPTY = DeviceState()
NO_TRUST = Freshness(None, ())
FRESH = Freshness(RoleState(7, datetime(2025, 6, 2, 12, tzinfo=UTC)), ())
FROZEN = Freshness(RoleState(7, datetime(2025, 6, 2, 12, tzinfo=UTC)), ("snapshot",))
NEVER_SYNCED = SyncInfo()
SYNCED = SyncInfo(last_checked=AT, result="current", commit="a" * 40, seq=12)
ANNOUNCED = DaemonInfo(pid=42, listen="127.0.0.1:8000", started=AT)


ORIGIN = ProvenanceReport(commit="c" * 40, pull_request=7, approvers=["ann"],
                          ci_run="https://github.example/acme/fleet/actions/runs/4242",
                          released_at="2025-06-01T10:00:00Z")  # fmt: skip


def _held(version: str) -> Installed:
    # 1.0.0 was installed before the model digest and provenance were recorded
    recorded = version != "1.0.0"
    return Installed(version=version, sha256=SHA[version], artifact_sha256=SHA[version],
                     target="cpu", external={"w.bin": "e" * 64},
                     model_sha256=SHA[version] if recorded else None,
                     provenance=ORIGIN if recorded else None)  # fmt: skip


def _shown(version: str) -> dict[str, Any]:
    """How the document shows a held version (its blob details stay on the device)."""
    shown: dict[str, Any] = {"version": version, "sha256": SHA[version], "target": "cpu",
                             "kind": "artifact", "model_sha256": None, "provenance": None}  # fmt: skip
    if version != "1.0.0":
        shown["model_sha256"] = SHA[version]
        shown["provenance"] = {
            "commit": "c" * 40, "pull_request": 7, "approvers": ["ann"],
            "ci_run": "https://github.example/acme/fleet/actions/runs/4242",
            "released_at": "2025-06-01T10:00:00Z", "unknown": [],
        }  # fmt: skip
    return shown


UPDATE = UpdateRecord(result="installed", version="1.1.0", method="delta", bytes_fetched=1234,
                      finished=AT, stages_ms={"fetch": 1.5, "swap": 0.25})  # fmt: skip
REJECTED = Rejected(version="1.2.0", sha256=SHA["1.2.0"], signed="s" * 64,
                    reason="self-test: outputs differ", at=AT)  # fmt: skip
GATE = GateRecord(version="1.1.0", sha256=SHA["1.1.0"], signed="s" * 64, opened=AT,
                  restore_serving=_held("1.0.0"), unclean_stops=1)  # fmt: skip
COMPARED = Agreement(version="1.1.0", against="1.0.0", compared=40, new_s=0.04, old_s=0.02,
                     new_hist=[[60, 40]], old_hist=[[53, 40]], open=True,
                     outputs={"probs": OutputSums(rows=80, top1=76, topk=80, k=4)})  # fmt: skip
FULL = ModelState(channel="canary", serving=_held("1.1.0"), previous=_held("1.0.0"),
                  last_known_good=_held("1.0.0"), last_update=UPDATE, rejected=[REJECTED],
                  gate=GATE, shadow=COMPARED)  # fmt: skip
NOTHING_YET: dict[str, Any] = {
    "channel": "production", "serving": None, "previous": None, "last_known_good": None,
    "last_update": None, "rejected": [], "gate": None, "shadow": None,
}  # fmt: skip
FULL_SHOWN: dict[str, Any] = {
    "channel": "production",  # the subscription's, not the state's
    "serving": _shown("1.1.0"),
    "previous": _shown("1.0.0"),
    "last_known_good": _shown("1.0.0"),
    "last_update": {
        "result": "installed",
        "version": "1.1.0",
        "method": "delta",
        "bytes_fetched": 1234,
        "reason": None,
        "finished": AT,
        "stages_ms": {"fetch": 1.5, "swap": 0.25},
    },
    "rejected": [
        {
            "version": "1.2.0",
            "sha256": SHA["1.2.0"],
            "reason": "self-test: outputs differ",
            "at": AT,
        }
    ],
    "gate": {"version": "1.1.0", "opened": AT},
    "shadow": COMPARED.model_dump(mode="json"),  # the sums, as the state keeps them
}
NOT_RUNNING = {"running": False, "pid": None, "listen": None, "grpc_listen": None, "started": None}
NO_TRUST_SHOWN: dict[str, Any] = {"timestamp_version": None, "timestamp_expires": None,
                                  "stale": None, "expired": []}  # fmt: skip
NEVER_SYNCED_SHOWN = {"last_checked": None, "result": None, "reason": None, "commit": None}


def _doc(
    state: DeviceState = EMPTY,
    *,
    channels: dict[str, str] | None = None,
    running: bool = False,
    announced: DaemonInfo | None = None,
    trust: Freshness = NO_TRUST,
    sync: SyncInfo = NEVER_SYNCED,
) -> dict[str, Any]:
    doc = build_status("cam-0042", channels or {"mlp": "production"}, state, running=running,
                       announced=announced, trust=trust, sync=sync)  # fmt: skip
    data = doc.model_dump(mode="json")
    assert json.loads(json.dumps(data)) == data  # plain JSON, as served
    return data


def test_before_the_first_run_the_device_serves_nothing() -> None:
    assert _doc() == {
        "device": "cam-0042",
        "daemon": NOT_RUNNING,
        "trust": NO_TRUST_SHOWN,
        "sync": NEVER_SYNCED_SHOWN,
        "models": {"mlp": NOTHING_YET},
    }


@pytest.mark.parametrize(
    ("running", "announced", "daemon"),
    [
        (False, None, NOT_RUNNING),
        (False, ANNOUNCED, NOT_RUNNING),  # a dead daemon's announcement is not shown
        (
            True,
            ANNOUNCED,
            {
                "running": True,
                "pid": 42,
                "listen": "127.0.0.1:8000",
                "grpc_listen": None,
                "started": AT,
            },
        ),
        (True, None, {**NOT_RUNNING, "running": True}),  # running, announcement unreadable
    ],
)
def test_the_daemon_entry(running: bool, announced: DaemonInfo | None, daemon: Any) -> None:
    assert _doc(running=running, announced=announced)["daemon"] == daemon


@pytest.mark.parametrize(
    ("trust", "shown"),
    [
        (NO_TRUST, NO_TRUST_SHOWN),
        (
            FRESH,
            {
                "timestamp_version": 7,
                "timestamp_expires": "2025-06-02T12:00:00Z",
                "stale": False,
                "expired": [],
            },
        ),
        (
            FROZEN,
            {
                "timestamp_version": 7,
                "timestamp_expires": "2025-06-02T12:00:00Z",
                "stale": True,
                "expired": ["snapshot"],
            },
        ),
    ],
)
def test_the_trust_entry(trust: Freshness, shown: Any) -> None:
    assert _doc(trust=trust)["trust"] == shown


@pytest.mark.parametrize(
    ("sync", "shown"),
    [
        (NEVER_SYNCED, NEVER_SYNCED_SHOWN),
        # the record's number orders records on the device only
        (SYNCED, {"last_checked": AT, "result": "current", "reason": None, "commit": "a" * 40}),
        (SyncInfo(last_checked=AT, result="failed", reason="git: unreachable", seq=3),
         {"last_checked": AT, "result": "failed", "reason": "git: unreachable", "commit": None}),
    ],
)  # fmt: skip
def test_the_sync_entry(sync: SyncInfo, shown: Any) -> None:
    assert _doc(sync=sync)["sync"] == shown


@pytest.mark.parametrize(
    ("state", "channels", "models"),
    [
        (EMPTY, {"mlp": "production"}, {"mlp": NOTHING_YET}),
        (DeviceState(models={"mlp": FULL}), {"mlp": "production"}, {"mlp": FULL_SHOWN}),
        # a model the config no longer subscribes is not shown; one new to it is empty
        (DeviceState(models={"old": FULL}), {"cnn": "production"}, {"cnn": NOTHING_YET}),
        (DeviceState(models={"mlp": FULL}), {"cnn": "dev", "mlp": "production"},
         {"cnn": {**NOTHING_YET, "channel": "dev"}, "mlp": FULL_SHOWN}),
    ],
)  # fmt: skip
def test_the_models_entry(
    state: DeviceState, channels: dict[str, str], models: dict[str, Any]
) -> None:
    shown = _doc(state, channels=channels)["models"]
    assert shown == models
    assert list(shown) == list(channels)  # in edge.yaml's order


def test_the_document_shows_what_the_state_holds_even_off_the_report_schema() -> None:
    # a refusal recorded without a digest, and the 32 rejections a device keeps: shown
    # as they are; the report checks (and trims) what it sends
    odd = Rejected(version="1.2.0", sha256="", signed="s", reason="no target", at=AT)
    many = [REJECTED.model_copy(update={"reason": f"try {i}"}) for i in range(31)]
    model = FULL.model_copy(update={"rejected": [odd, *many]})
    rejected = _doc(DeviceState(models={"mlp": model}))["models"]["mlp"]["rejected"]
    assert len(rejected) == 32
    assert rejected[0]["sha256"] == ""
    assert rejected[-1]["reason"] == "try 30"


# --- the report carries the document ----------------------------------------------------


def _config() -> EdgeConfig:
    return EdgeConfig.model_validate({
        "apiVersion": "modelreg/v1", "kind": "EdgeConfig",
        "device": {"id": "cam-0042", "labels": {"site": "plant-3"}},
        "repository": {"url": "/r"}, "trust": {"root": "/root.json"},
        "artifacts": {"url": "/a"}, "models": [{"name": "mlp", "channel": "production"}],
        "state_dir": "/s",
    })  # fmt: skip


def _full_status(rejected: list[Rejected]) -> StatusDocument:
    model = FULL.model_copy(update={"rejected": rejected})
    return build_status("cam-0042", {"mlp": "production"}, DeviceState(models={"mlp": model}),
                        running=True, announced=ANNOUNCED, trust=FRESH, sync=SYNCED)  # fmt: skip


@pytest.mark.parametrize("stopped", [False, True])
def test_the_report_is_the_document_and_its_own_fields(stopped: bool) -> None:
    status = _full_status([REJECTED])
    report = report_document(_config(), status, "9.9.9", stopped=stopped)
    sent = json.loads(encode_report(report.model_dump(mode="json")))
    own = {"kind", "format", "labels", "reported", "truncated", "sequence"}
    document = status.model_dump(mode="json")
    assert set(sent) == set(document) | own
    daemon = NOT_RUNNING if stopped else document["daemon"]
    assert sent["daemon"] == {**daemon, "version": "9.9.9"}
    assert {k: v for k, v in sent.items() if k not in own | {"daemon"}} == {
        k: v for k, v in document.items() if k != "daemon"
    }
    assert (sent["kind"], sent["format"], sent["labels"]) == (
        "DeviceReport",
        4,
        {"site": "plant-3"},
    )
    assert sent["sequence"] is None  # numbered by the reporter, as it signs
    assert sent["truncated"] is False
    assert parse_report(encode_report(sent)).reported.tzinfo is not None


def test_a_report_carries_the_newest_rejections_the_schema_allows() -> None:
    kept = [REJECTED.model_copy(update={"reason": f"try {i}"}) for i in range(32)]
    report = report_document(_config(), _full_status(kept), "1")
    sent = parse_report(encode_report(report.model_dump(mode="json")))
    reasons = [r.reason for r in sent.models["mlp"].rejected]
    assert reasons == [f"try {i}" for i in range(32 - LIMITS.max_rejected, 32)]


def test_a_report_of_a_document_off_the_schema_is_refused_before_it_is_sent() -> None:
    odd = Rejected(version="1.2.0", sha256="", signed="s", reason="no target", at=AT)
    report = report_document(_config(), _full_status([odd]), "1")
    with pytest.raises(ReportError, match=r"models\.mlp\.rejected\.0\.sha256"):
        encode_report(report.model_dump(mode="json"))


# --- /status: the document and what only the running daemon knows -----------------------


class _Weights:
    own_bytes, shared_bytes = 100, 4000


class _Engine:
    model, version, loaded, shared = "mlp", "1.1.0", True, True
    weights: _Weights | None = _Weights()


class _Private(_Engine):
    version, shared, weights = "1.0.0", False, None


@pytest.mark.parametrize(
    ("engine", "serving", "in_flight", "shown"),
    [
        (_Engine(), True, 3, {"version": "1.1.0", "serving": True, "loaded": True,
                              "in_flight": 3, "shared_weights": True,
                              "weight_bytes": {"own": 100, "shared": 4000}}),
        (_Private(), False, 0, {"version": "1.0.0", "serving": False, "loaded": True,
                                "in_flight": 0, "shared_weights": False,
                                "weight_bytes": {"own": None, "shared": None}}),
    ],
)  # fmt: skip
def test_an_engine_entry(engine: _Engine, serving: bool, in_flight: int, shown: Any) -> None:
    entry = EngineStatus.of(engine, serving=serving, in_flight=in_flight)
    assert entry.model_dump(mode="json") == shown


def test_status_serves_the_document_and_the_live_part_the_report_leaves_out() -> None:
    status = _full_status([REJECTED])
    live = LiveStatus(
        engines={"mlp": [EngineStatus.of(_Engine(), serving=True, in_flight=1)]},
        gates={"mlp": OpenGateStatus(version="1.1.0", previous="1.0.0", open_s=2.5)},
        prepack={"mlp": {"prepack": False, "shared_ms": 1.25}},
    )
    served = served_status(status, live).model_dump(mode="json")
    document = status.model_dump(mode="json")
    assert {k: v for k, v in served.items() if k in document} == document
    assert set(served) - set(document) == {"engines", "gates", "prepack", "shadow"}
    assert served["gates"] == {"mlp": {"version": "1.1.0", "previous": "1.0.0", "open_s": 2.5}}
    assert served["prepack"] == {"mlp": {"prepack": False, "shared_ms": 1.25}}
    report = report_document(_config(), served_status(status, live), "1")
    assert not {"engines", "gates", "prepack"} & set(report.model_dump(mode="json"))
