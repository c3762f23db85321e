"""Device reports for the fleet tests: the shape a daemon sends, with what a test varies."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
SHA = {v: f"{n:x}" * 64 for n, v in enumerate(["1.0.0", "1.1.0", "1.2.0", "2.0.0"], start=1)}


def stamp(at: datetime) -> str:
    """A time as devices write it."""
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def installed(version: str) -> dict[str, Any]:
    return {"version": version, "sha256": SHA[version], "target": "cpu", "kind": "artifact"}


def model(
    serving: str | None = "1.0.0",
    channel: str = "production",
    *,
    update: dict[str, Any] | None = None,
    rejected: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One model's entry: serving ``serving`` (None: nothing yet)."""
    last = update
    if last is None and serving is not None:
        last = {"result": "installed", "version": serving, "method": "full",
                "bytes_fetched": 1000, "reason": None, "finished": stamp(NOW),
                "stages_ms": {"fetch": 1.5, "swap": 0.2}}  # fmt: skip
    return {
        "channel": channel,
        "serving": installed(serving) if serving else None,
        "previous": None,
        "last_known_good": installed(serving) if serving else None,
        "last_update": last,
        "rejected": rejected or [],
        "gate": None,
    }


def shadow(
    version: str = "1.1.0",
    against: str = "1.0.0",
    *,
    compared: int = 500,
    agree: int | None = None,
    drift: float = 0.01,
    new_ms: float = 10.0,
    old_ms: float = 10.0,
    still: bool = False,
) -> dict[str, Any]:
    """A model's ``shadow`` (report format 4): ``compared`` requests of ``version`` run on
    ``against`` too, ``agree`` of them (default all) with the same top class, answers
    ``drift`` apart (relative L1), every run taking ``new_ms`` and ``old_ms``."""
    from registry.agreement import bucket

    return {
        "version": version, "against": against, "compared": compared, "dropped": 3,
        "new_s": compared * new_ms / 1000, "old_s": compared * old_ms / 1000,
        "new_hist": [[bucket(new_ms / 1000), compared]],
        "old_hist": [[bucket(old_ms / 1000), compared]],
        "outputs": {"scores": {
            "rows": compared, "top1": compared if agree is None else agree,
            "topk": compared, "k": 3, "values": 10 * compared,
            "abs_sum": drift * 10 * compared, "ref_sum": 10.0 * compared,
        }},
        "open": still,
    }  # fmt: skip


def report(
    device: str,
    models: dict[str, Any] | None = None,
    *,
    age_s: float = 30,
    sync: dict[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A device's report, sent ``age_s`` before :data:`NOW`."""
    doc = {
        "kind": "DeviceReport",
        "format": 1,
        "device": device,
        "labels": {"arch": "x86_64"},
        "reported": stamp(NOW - timedelta(seconds=age_s)),
        "daemon": {
            "running": True,
            "pid": 42,
            "listen": "127.0.0.1:8000",
            "started": stamp(NOW - timedelta(hours=1)),
            "version": "0.1.0",
        },
        "trust": {
            "timestamp_version": 3,
            "timestamp_expires": stamp(NOW + timedelta(days=1)),
            "stale": False,
        },
        "sync": sync
        or {"last_checked": stamp(NOW), "result": "current", "reason": None, "commit": "a" * 40},
        "models": copy.deepcopy(models) if models is not None else {"mlp": model()},
        "truncated": False,
    }
    doc.update(extra)
    return doc


def write(folder: Path, *docs: dict[str, Any]) -> Path:
    """Store each report as ``<device>.json`` in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    for doc in docs:
        (folder / f"{doc['device']}.json").write_text(json.dumps(doc))
    return folder
