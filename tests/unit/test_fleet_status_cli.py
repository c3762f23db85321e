"""``modelreg fleet status``: the human table (a golden file), ``--json``, and the exit
codes (0 with unreadable reports listed, 1 when the reports cannot be read, 2 for a bad
option).  The rollout columns against a real repository and real daemons are in
``tests/edge/test_reports.py``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fleet.render import age_text, render_json, render_text
from fleet.reports import load_reports
from fleet.summary import ChannelTarget, summarize
from tests.conftest import assert_golden
from tests.fleet_reports import NOW, model, report, shadow, stamp, write


def _fleet(folder: Path) -> Path:
    failed = {"result": "failed", "version": "1.1.0", "finished": stamp(NOW),
              "reason": "fetch: connection reset by peer"}  # fmt: skip
    offline = {"last_checked": stamp(NOW), "result": "failed", "commit": None,
               "reason": "repository: git fetch: connection refused"}  # fmt: skip
    approved = model("1.1.0", "canary")
    approved["serving"] |= {
        "model_sha256": approved["serving"]["sha256"],
        "provenance": {"commit": "c" * 40, "pull_request": 12, "approvers": ["ann", "bob"],
                       "ci_run": "https://github.example/acme/fleet/actions/runs/7",
                       "released_at": stamp(NOW), "unknown": []},
    }  # fmt: skip
    by_hand = model("1.0.0")
    by_hand["serving"]["provenance"] = {"commit": "d" * 40, "unknown": ["approvals", "ci"]}
    # the canary's shadow comparisons of 1.1.0 (issue 29): summed over its devices
    approved["shadow"] = shadow(compared=800, agree=795, drift=0.004, new_ms=11.5)
    failed_too = model("1.0.0", "canary", update=failed)
    failed_too["shadow"] = shadow(compared=434, agree=429, drift=0.004, new_ms=11.5, still=True)
    docs = [
        report("cam-01", {"mlp": approved}, format=4),
        report("cam-02", {"mlp": failed_too}, format=4),
        report("cam-03", {"mlp": model("1.0.0", "canary")}, sync=offline),
        report("cam-04", {"mlp": model("1.0.0")}, age_s=2 * 3600 + 180),
        report("cam-05", {"mlp": by_hand, "det": model("2.0.0", "beta")}, format=2),
        report("cam-06", {"mlp": model(None)}),
    ]
    write(folder, *docs)
    (folder / "cam-07.json").write_text("[1, 2")
    (folder / "cam-08.json").write_text(json.dumps(report("cam-[bold]08[/]")))
    return folder


CHANNELS = {
    "mlp": {"canary": ChannelTarget("1.1.0"), "production": ChannelTarget("1.0.0", 50.0)},
}


def test_the_human_status_reads_as_a_table(tmp_path: Path) -> None:
    loaded = load_reports(str(_fleet(tmp_path / "reports")))
    loaded = type(loaded)("s3://fleet-reports/fleet/", loaded.reports, loaded.unreadable)
    summary = summarize(loaded.reports, CHANNELS, now=NOW)
    text = render_text(summary, loaded, stale_after_s=900, repository=Path("fleet-models"))
    assert_golden("fleet_status.txt", text)


def test_each_waves_comparisons_are_shown_with_their_figures(tmp_path: Path) -> None:
    """Issue 29: ``fleet status`` shows each channel's summed shadow comparisons: one
    line of figures (text), ``Agreement.figures()`` (JSON)."""
    loaded = load_reports(str(_fleet(tmp_path / "reports")))
    summary = summarize(loaded.reports, CHANNELS, now=NOW)
    text = render_text(
        summary, loaded, stale_after_s=900, repository=Path("fleet-models"), width=200
    )
    (line,) = [ln for ln in text.splitlines() if ln.startswith("behaviour")]
    assert line == (
        "behaviour: mlp@canary 1.1.0 against 1.0.0: agreement 99.2% over 1,234 compared "
        "requests on 2 devices, drift 0.4%, p99 1.21x (still comparing)"
    )
    doc = render_json(summary, loaded, now=NOW, stale_after_s=900, repository=Path("x"))
    canary, production = doc["channels"]
    assert canary["behaviour"] == summary.channels[0].comparisons[0].figures()
    assert (canary["behaviour"]["compared"], canary["behaviour"]["devices"]) == (1234, 2)
    assert canary["behaviour"]["agreement"] == pytest.approx(1224 / 1234)
    assert canary["behaviour_not_judged"] == []
    assert production["behaviour"] is None  # none of its devices compared 1.0.0


def test_ages_read_at_a_useful_precision() -> None:
    assert [age_text(s) for s in (-1, 45, 960, 7380, 3 * 86400 + 4 * 3600 + 59)] == [
        "0s", "45s", "16m", "2h 03m", "3d 04h",
    ]  # fmt: skip


def test_json_without_a_repository(tmp_path: Path, cli: Any) -> None:
    folder = _fleet(tmp_path / "reports")
    r = cli("fleet", "status", "--reports", str(folder), "--json", cwd=tmp_path)
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert (doc["devices"], doc["repository"], doc["channels"]) == (6, None, [])
    assert {"model": "mlp", "version": None, "devices": 1, "approvers": None} in doc["versions"]
    # who approved what runs, as the devices' signed provenance says (issue 28)
    approvers = {row["version"]: row["approvers"] for row in doc["versions"]}
    assert approvers["1.1.0"] == ["ann", "bob"]
    assert approvers["1.0.0"] is None  # released by hand: not counted
    assert [u["source"] for u in doc["unreadable"]] == ["cam-07.json", "cam-08.json"]
    # reports sent in 2025 are all stale now; the oldest first
    assert doc["stale"][0]["device"] == "cam-04"
    assert len(doc["stale"]) == 6
    r = cli("fleet", "status", "--reports", str(folder), cwd=tmp_path)
    assert r.code == 0
    assert "no rollout progress: no model repository here (give --repo)" in r.out


def test_exit_codes(tmp_path: Path, cli: Any) -> None:
    r = cli("fleet", "status", "--reports", str(tmp_path / "nowhere"), cwd=tmp_path)
    assert r.code == 1
    assert r.err.strip() == f"modelreg: {tmp_path / 'nowhere'}: no such folder"
    r = cli("fleet", "status", "--reports", str(tmp_path), "--stale-after", "soon", cwd=tmp_path)
    assert r.code == 2
    assert "--stale-after" in r.err
    r = cli("fleet", "status", "--reports", str(tmp_path), "--repo", str(tmp_path), cwd=tmp_path)
    assert r.code == 1
    assert "modelreg.yaml" in r.err
    r = cli("fleet", "status", "--reports", str(tmp_path), "--json", cwd=tmp_path)
    assert (r.code, json.loads(r.out)["devices"]) == (0, 0)  # an empty fleet is no error
    (tmp_path / "cam-1.json").write_text("{}")
    r = cli("fleet", "status", "--reports", str(tmp_path), "--json", cwd=tmp_path)
    assert r.code == 1  # every report unreadable: nothing is known
    assert json.loads(r.out)["unreadable"][0]["source"] == "cam-1.json"
    assert r.err.strip() == f"modelreg: none of the 1 reports in {tmp_path} could be read"


def test_a_held_rollout_is_said_with_how_to_lift_it(tmp_path: Path) -> None:
    """Issue 27, point 10: a hold shows in ``fleet status`` (text and JSON)."""
    loaded = load_reports(str(_fleet(tmp_path / "reports")))
    held = {"mlp": {**CHANNELS["mlp"], "production": ChannelTarget("1.0.0", 50.0, "p99 up 3x")}}
    summary = summarize(loaded.reports, held, now=NOW)
    text = render_text(summary, loaded, stale_after_s=900, repository=Path("fleet-models"))
    assert "held: mlp@production 1.0.0: p99 up 3x (modelreg fleet resume mlp -c production)" in (
        text
    )
    (production,) = [c for c in summary.channels if c.channel == "production"]
    assert production.to_json()["hold"] == "p99 up 3x"
    plain = render_text(
        summarize(loaded.reports, CHANNELS, now=NOW), loaded, stale_after_s=900,
        repository=Path("fleet-models"),
    )  # fmt: skip
    assert "held:" not in plain


def test_fleet_devices_lists_one_row_per_device_and_model(tmp_path: Path, cli: Any) -> None:
    """Issue 27, point 11: ``fleet devices``: sorted rows with labels, channel, version
    served, last update and why, last seen and staleness, trust expiry; filterable by
    model and label; unreadable reports listed; exit 1 when none can be read."""
    from fleet.devices import device_rows, render_rows

    folder = _fleet(tmp_path / "reports")
    loaded = load_reports(str(folder))
    rows = device_rows(loaded.reports, now=NOW, stale_after_s=900)
    assert [(r.device, r.model) for r in rows] == [
        ("cam-01", "mlp"), ("cam-02", "mlp"), ("cam-03", "mlp"), ("cam-04", "mlp"),
        ("cam-05", "det"), ("cam-05", "mlp"), ("cam-06", "mlp"),
    ]  # fmt: skip
    by = {(r.device, r.model): r for r in rows}
    failed = by["cam-02", "mlp"]
    assert (failed.channel, failed.serving, failed.last_update) == (
        "canary",
        "1.0.0",
        "failed 1.1.0",
    )
    assert failed.reason == "fetch: connection reset by peer"
    assert failed.labels == {"arch": "x86_64"}
    assert failed.trust_expires is not None
    assert by["cam-04", "mlp"].stale
    assert not by["cam-01", "mlp"].stale
    assert by["cam-06", "mlp"].serving is None
    # who approved what each device serves, from its signed provenance (issue 28)
    assert by["cam-01", "mlp"].approvers == ["ann", "bob"]
    assert by["cam-05", "mlp"].approvers is None  # released by hand: not counted
    text = render_rows(rows)
    assert text.splitlines()[0].split()[:3] == ["device", "labels", "model"]
    assert "2h ago STALE" in text
    assert "cam-02 mlp: failed 1.1.0: fetch: connection reset by peer" in text
    assert [r.device for r in device_rows(loaded.reports, now=NOW, stale_after_s=900,
                                          model="det")] == ["cam-05"]  # fmt: skip
    assert device_rows(loaded.reports, now=NOW, stale_after_s=900, labels={"arch": "arm64"}) == []
    # the command: JSON, filters, unreadable reports, exit codes
    r = cli("fleet", "devices", "--reports", str(folder), "--model", "mlp", "--json", cwd=tmp_path)
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert [d["device"] for d in doc["devices"]] == [f"cam-0{i}" for i in range(1, 7)]
    assert {u["report"].rsplit("/", 1)[-1] for u in doc["unreadable"]} >= {"cam-07.json"}
    r = cli("fleet", "devices", "--reports", str(folder), "--label", "arch=x86_64", cwd=tmp_path)
    assert r.code == 0
    listed = [line.split()[:3] for line in r.out.splitlines()[1:] if line.startswith("cam-")]
    assert ["cam-05", "arch=x86_64", "det"] in listed
    assert "unreadable: " in r.err
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "x.json").write_text("[")
    assert cli("fleet", "devices", "--reports", str(bad), cwd=tmp_path).code == 1
    assert (
        cli("fleet", "devices", "--reports", str(folder), "--label", "arch", cwd=tmp_path).code == 2
    )
