"""``fleet.reports`` and ``fleet.summary``: reports read from a folder as untrusted input
(one bad report never hides the others), and the fleet counted from them (pure)."""

from __future__ import annotations

import json
import os
import urllib.parse
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from fleet.reports import FleetLimits, ReportsError, load_reports
from fleet.summary import ChannelTarget, channel_progress, latest, summarize
from registry.cohort import in_cohort
from registry.device_report import LIMITS, DeviceReport, parse_report
from tests.fleet_reports import NOW, model, report, shadow, stamp, write
from tests.http_sim import running


def _parsed(*docs: dict[str, Any]) -> list[DeviceReport]:
    return [parse_report(json.dumps(d).encode()) for d in docs]


# --- reading --------------------------------------------------------------------------


def test_one_bad_report_never_hides_the_others(tmp_path: Path) -> None:
    folder = write(tmp_path / "fleet", report("cam-1"), report("cam-2"))
    (folder / "cam-3.json").write_text('{"kind": "DeviceReport"')  # cut off
    (folder / "cam-4.json").write_text(json.dumps(report("cam-4", labels={"arch": 5})))
    (folder / "cam-5.json").write_bytes(b" " * (LIMITS.max_bytes + 1))
    (folder / "cam-6.json").write_text(json.dumps(report("cam-1")))  # claims another device
    (folder / "not a device!.json").write_text(json.dumps(report("cam-7")))
    (folder / "cam-8.json").symlink_to(folder / "cam-1.json")
    (folder / "cam-9.json").mkdir()
    # not reports: an atomic write's temporary file, other files
    (folder / ".cam-1.json.0a1b2c.tmp").write_text("{")
    (folder / "README.txt").write_text("reports of plant 3")
    loaded = load_reports(str(folder))
    assert sorted(r.device for r in loaded.reports) == ["cam-1", "cam-2"]
    why = {u.source: u.reason for u in loaded.unreadable}
    assert why == {
        "cam-3.json": "not a JSON document",
        "cam-4.json": "labels.arch: Input should be a valid string",
        "cam-5.json": f"larger than {LIMITS.max_bytes} bytes ({LIMITS.max_bytes + 1})",
        "cam-6.json": "reports device 'cam-1', not the device it is named after",
        "not a device!.json": "the name is not <device-id>.json",
        "cam-8.json": why["cam-8.json"],
        "cam-9.json": why["cam-9.json"],
    }
    assert "link" in why["cam-8.json"]
    assert "directory" in why["cam-9.json"].lower()
    assert loaded.skipped == 0


def test_a_file_url_and_a_path_read_the_same(tmp_path: Path) -> None:
    folder = write(tmp_path / "fleet", report("cam-1"))
    assert [r.device for r in load_reports(folder.as_uri()).reports] == ["cam-1"]


def test_reports_past_the_count_limit_are_counted_not_read(tmp_path: Path) -> None:
    folder = write(tmp_path / "fleet", *(report(f"cam-{i}") for i in range(5)))
    loaded = load_reports(str(folder), FleetLimits(max_reports=3))
    assert [r.device for r in loaded.reports] == ["cam-0", "cam-1", "cam-2"]
    assert loaded.skipped == 2


@pytest.mark.parametrize("make", ["missing", "file"])
def test_a_source_that_cannot_be_listed_is_an_error(tmp_path: Path, make: str) -> None:
    target = tmp_path / "fleet"
    if make == "file":
        target.write_text("")
    with pytest.raises(ReportsError, match=r"no such folder|not a folder"):
        load_reports(str(target))


def test_a_folder_that_cannot_be_read_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = write(tmp_path / "fleet", report("cam-1"))
    # chmod 0 stops nobody who runs as root (as CI does): the listing itself is refused
    real_scandir = os.scandir

    def refused(path: Any) -> Any:
        if Path(path) == folder:
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", refused)
    with pytest.raises(ReportsError, match=r"cannot list it \(Permission denied\)"):
        load_reports(str(folder))


def test_an_unknown_scheme_is_refused() -> None:
    with pytest.raises(ReportsError, match="folder, s3:// or http"):
        load_reports("ftp://user:secret@example.invalid/fleet/")


# --- counting ---------------------------------------------------------------------------


def test_duplicates_of_a_device_count_once_the_newest() -> None:
    old = report("cam-1", {"mlp": model("1.0.0")}, age_s=600)
    new = report("cam-1", {"mlp": model("1.1.0")}, age_s=10)
    for order in ((old, new), (new, old)):
        (only,) = latest(_parsed(*order)).values()
        assert only.models["mlp"].serving.version == "1.1.0"  # type: ignore[union-attr]


IDS = [f"cam-{i:04d}" for i in range(400)]


def _fleet() -> list[dict[str, Any]]:
    """400 devices on mlp@production, 1.1.0 rolling out to 25 %: of its cohort, some
    installed it, some failed, one rejected it in its health gate, the rest wait."""
    cohort = [d for d in IDS if in_cohort(d, "mlp", "1.1.0", 25)]
    failed, rolled_back, waiting = cohort[0], cohort[1], cohort[2]
    docs = []
    for device in IDS:
        entry = model("1.0.0")
        if device in cohort and device not in (failed, rolled_back, waiting):
            entry = model("1.1.0")
        elif device == failed:
            entry = model("1.0.0", update={"result": "failed", "version": "1.1.0",
                          "reason": "fetch: connection reset", "finished": stamp(NOW)})  # fmt: skip
        elif device == rolled_back:
            entry = model("1.0.0", update={"result": "rejected", "version": "1.1.0",
                          "reason": "health gate: error rate 0.3", "finished": stamp(NOW)})  # fmt: skip
        docs.append(report(device, {"mlp": entry}))
    docs[-1]["models"]["mlp"]["channel"] = "canary"  # follows another channel
    return docs


def test_a_channels_progress_counts_its_cohort_by_the_devices_own_rule() -> None:
    docs = _fleet()
    cohort = [d for d in IDS[:-1] if in_cohort(d, "mlp", "1.1.0", 25)]
    progress = channel_progress(_parsed(*docs), "mlp", "production", "1.1.0", 25, now=NOW)
    assert (progress.subscribed, progress.cohort) == (399, len(cohort))
    assert 70 < progress.cohort < 130  # about a quarter
    assert progress.on_target == len(cohort) - 3
    assert progress.failed == tuple(sorted([
        (cohort[0], "fetch: connection reset"), (cohort[1], "health gate: error rate 0.3"),
    ]))  # fmt: skip
    assert progress.pending == ((cohort[2], None),)
    assert progress.stale == ()
    assert progress.failure_share == pytest.approx(2 / len(cohort))
    everyone = channel_progress(_parsed(*docs), "mlp", "production", "1.1.0", None, now=NOW)
    assert everyone.cohort == 399
    assert everyone.on_target == progress.on_target


def test_a_rejection_earlier_than_the_last_update_still_counts_as_a_failure() -> None:
    rejected = [{"version": "1.1.0", "sha256": "e" * 64, "reason": "self-test: mismatch",
                 "at": stamp(NOW)}]  # fmt: skip
    doc = report("cam-1", {"mlp": model("1.0.0", rejected=rejected)})
    progress = channel_progress(_parsed(doc), "mlp", "production", "1.1.0", None, now=NOW)
    assert progress.failed == (("cam-1", "rejected: self-test: mismatch"),)


def test_a_device_wide_failure_is_a_reason_to_wait_not_a_failed_install() -> None:
    sync = {"last_checked": stamp(NOW), "result": "failed", "commit": None,
            "reason": "repository: git fetch failed: connection refused"}  # fmt: skip
    doc = report("cam-1", sync=sync)
    progress = channel_progress(_parsed(doc), "mlp", "production", "1.1.0", None, now=NOW)
    assert progress.failed == ()
    assert progress.pending == (("cam-1", "repository: git fetch failed: connection refused"),)


def test_stale_devices_are_those_silent_longer_than_the_limit() -> None:
    docs = [report("cam-1", age_s=60), report("cam-2", age_s=16 * 60),
            report("cam-3", age_s=3 * 3600)]  # fmt: skip
    progress = channel_progress(_parsed(*docs), "mlp", "production", "1.0.0", None, now=NOW)
    assert progress.stale == ("cam-2", "cam-3")
    assert progress.on_target == 3  # counted by what they last said
    summary = summarize(_parsed(*docs), {}, now=NOW, stale_after_s=3600)
    assert [(s.device, s.age_s) for s in summary.stale] == [("cam-3", 3 * 3600.0)]


def test_the_summary_counts_versions_channels_and_what_is_not_declared() -> None:
    docs = [*_fleet(), report("new-1", {"mlp": model(None)}),
            report("cam-x", {"mlp": model("1.0.0", channel="beta")}, age_s=7200),
            report("det-1", {"det": model("2.0.0", channel="canary")})]  # fmt: skip
    docs[-1]["trust"]["stale"] = True
    channels = {"mlp": {"production": ChannelTarget("1.1.0", 25.0),
                        "canary": ChannelTarget("1.0.0")}}  # fmt: skip
    summary = summarize(_parsed(*docs), channels, now=NOW)
    assert summary.devices == 403
    on_new = summary.channels[1].on_target
    assert summary.versions == {"det": {"2.0.0": 1},
                                "mlp": {"1.0.0": 402 - on_new - 1, "1.1.0": on_new, None: 1}}  # fmt: skip
    assert [(c.channel, c.version) for c in summary.channels] == [
        ("canary", "1.0.0"), ("production", "1.1.0"),
    ]  # fmt: skip
    assert (summary.channels[0].subscribed, summary.channels[0].on_target) == (1, 1)
    assert summary.undeclared == [("det", "canary", 1), ("mlp", "beta", 1)]
    assert [s.device for s in summary.stale] == ["cam-x"]
    assert summary.stale[0].age_s == pytest.approx(7200)
    assert summary.trust_stale == ["det-1"]
    assert (
        channel_progress(_parsed(*docs), "mlp", "production", "1.1.0", 25.0, now=NOW)
        == summary.channels[1]
    )


def _compared(device: str, serving: str, found: dict[str, Any], **kw: Any) -> dict[str, Any]:
    entry = model(serving, **kw)
    entry["shadow"] = found
    return report(device, {"mlp": entry}, format=4)


def test_a_waves_shadow_comparisons_are_summed_over_its_cohort() -> None:
    """Issue 29: the cohort's comparisons of the channel's version are added up (a
    device the gate rolled back included), per previous version; the rollout is judged
    on those against the version most devices compared with, the others are shown."""
    cohort = [d for d in IDS if in_cohort(d, "mlp", "1.1.0", 25)]
    outside = next(d for d in IDS if not in_cohort(d, "mlp", "1.1.0", 25))
    rolled_back = {"result": "rejected", "version": "1.1.0", "finished": stamp(NOW),
                   "reason": "health gate: agreement 80%"}  # fmt: skip
    docs = [
        _compared(cohort[0], "1.1.0", shadow(compared=500, agree=490, drift=0.01)),
        _compared(cohort[1], "1.1.0", shadow(compared=300, agree=300, drift=0.03, still=True)),
        _compared(cohort[2], "1.0.0", shadow(compared=200, agree=160), update=rolled_back),
        # compared with an older version (the device lagged): summed apart, not judged
        _compared(cohort[3], "1.1.0", shadow(against="0.9.0", compared=900, agree=500)),
        _compared(cohort[4], "1.1.0", shadow(against="0.9.0", compared=100, agree=100)),
        # another version's comparison, and a device outside the cohort: not counted
        _compared(cohort[5], "1.0.0", shadow("1.0.0", "0.9.0", compared=50, agree=0)),
        _compared(outside, "1.0.0", shadow(compared=10_000, agree=0)),
        report(cohort[6], {"mlp": model("1.1.0")}),
    ]
    progress = channel_progress(_parsed(*docs), "mlp", "production", "1.1.0", 25, now=NOW)
    judged = progress.behaviour
    assert judged is not None
    assert [(c.against, c.devices, c.compared) for c in progress.comparisons] == [
        ("1.0.0", 3, 1000), ("0.9.0", 2, 1000),
    ]  # fmt: skip
    assert judged.agreement == pytest.approx((490 + 300 + 160) / 1000)
    assert judged.drift == pytest.approx((0.01 * 500 + 0.03 * 300 + 0.01 * 200) / 1000)
    assert (judged.dropped, judged.open) == (9, True)
    assert judged.p99_ratio == pytest.approx(1.0)
    out = progress.to_json()
    assert out["behaviour"] == judged.figures()
    assert out["behaviour"]["agreement"] == pytest.approx(0.95)
    assert [c["against"] for c in out["behaviour_not_judged"]] == ["0.9.0"]
    assert (progress.cohort, progress.failed) == (7, ((cohort[2], "health gate: agreement 80%"),))
    # the summary of the fleet gives the same; a channel none compared has none
    summary = summarize(_parsed(*docs), {"mlp": {"production": ChannelTarget("1.1.0", 25.0)}},
                        now=NOW)  # fmt: skip
    assert summary.channels[0].comparisons == progress.comparisons
    plain = channel_progress(_parsed(report("cam-1")), "mlp", "production", "1.1.0", None)
    assert (plain.behaviour, plain.to_json()["behaviour"], plain.comparisons) == (None, None, ())
    assert plain.to_json()["behaviour_not_judged"] == []


def test_the_judged_comparison_has_the_most_devices_then_compared_then_newest() -> None:
    def judged(*found: dict[str, Any]) -> str | None:
        docs = [_compared(f"cam-{i}", "1.1.0", f) for i, f in enumerate(found)]
        progress = channel_progress(_parsed(*docs), "mlp", "production", "1.1.0", None, now=NOW)
        return None if progress.behaviour is None else progress.behaviour.against

    assert judged(shadow(against="0.9.0"), shadow(against="1.0.0"),
                  shadow(against="0.9.0")) == "0.9.0"  # fmt: skip
    assert judged(shadow(against="1.0.0", compared=10),
                  shadow(against="0.9.0", compared=11)) == "0.9.0"  # fmt: skip
    assert judged(shadow(against="0.10.0"), shadow(against="0.9.0")) == "0.10.0"  # SemVer order
    assert judged(shadow(against="1.0.0-rc.1"), shadow(against="1.0.0")) == "1.0.0"
    assert judged() is None


def test_staleness_defaults_to_the_current_time() -> None:
    doc = report("cam-1", age_s=0)  # sent at NOW, long ago
    progress = channel_progress(_parsed(doc), "mlp", "production", "1.0.0", None)
    assert progress.stale == ("cam-1",)
    just_now = report("cam-1", reported=stamp(NOW.now(NOW.tzinfo) - timedelta(seconds=1)))
    assert channel_progress(_parsed(just_now), "mlp", "production", "1.0.0", None).stale == ()


# --- an HTTP folder (nginx: dav_methods PUT; autoindex on; autoindex_format json) ---------


class _Folder(ThreadingHTTPServer):
    files: dict[str, bytes]
    listing: bytes
    requests: list[str]


class _FolderHandler(BaseHTTPRequestHandler):
    server: _Folder

    def do_GET(self) -> None:
        self.server.requests.append(self.path)
        name = urllib.parse.unquote(self.path.removeprefix("/fleet/"))
        body = self.server.listing if name == "" else self.server.files.get(name)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def http_folder() -> Iterator[_Folder]:
    server = _Folder(("127.0.0.1", 0), _FolderHandler)
    server.files, server.requests = {}, []
    with running(server):
        yield server


def test_reports_from_an_http_folder_listing(http_folder: _Folder) -> None:
    good = [report(f"cam-{i}") for i in range(3)]
    http_folder.files = {f"{d['device']}.json": json.dumps(d).encode() for d in good}
    http_folder.files["cam-9.json"] = b"<html>oops</html>"
    entries = [{"name": n, "type": "file", "mtime": "Sun, 01 Jun 2025 12:00:00 GMT",
                "size": len(b)} for n, b in http_folder.files.items()]  # fmt: skip
    entries += [{"name": "archive", "type": "directory"}, {"name": "gone.json", "type": "file"}]
    http_folder.listing = json.dumps(entries).encode()
    base = f"http://127.0.0.1:{http_folder.server_address[1]}/fleet/"
    loaded = load_reports(base)
    assert sorted(r.device for r in loaded.reports) == ["cam-0", "cam-1", "cam-2"]
    assert {u.source: u.reason for u in loaded.unreadable} == {
        "cam-9.json": "not a JSON document", "gone.json": "HTTP 404",
    }  # fmt: skip
    assert "/fleet/archive" not in http_folder.requests
    # a plain array of names is a listing too
    http_folder.listing = json.dumps(["cam-0.json"]).encode()
    assert [r.device for r in load_reports(base).reports] == ["cam-0"]
    with pytest.raises(ReportsError, match="folder URL ending in /"):
        load_reports(base + "cam-0.json")
    http_folder.listing = b'{"not": "a list"}'
    with pytest.raises(ReportsError, match="the listing is not a JSON array"):
        load_reports(base)
    with pytest.raises(ReportsError, match=r"cannot list the reports \(HTTP 404\)"):
        load_reports(base.replace("/fleet/", "/elsewhere/"))


@pytest.mark.parametrize("command", ["status", "advance"])
def test_a_reports_url_with_credentials_is_never_printed(
    http_folder: _Folder, tmp_path: Path, cli: Any, command: str
) -> None:
    # rollout.yml passes the reports URL from a secret: userinfo and query tokens in it
    # appear in no output, whether the reports are read or not.
    http_folder.files = {"cam-0.json": json.dumps(report("cam-0")).encode()}
    http_folder.listing = json.dumps(["cam-0.json"]).encode()
    port = http_folder.server_address[1]
    # advance runs in a model repository (one with no waves: it reads, and says so)
    (tmp_path / "modelreg.yaml").write_text("apiVersion: modelreg/v1\nkind: RegistryConfig\n")
    for url in (
        f"http://fleet:S3cretPassw0rd@127.0.0.1:{port}/fleet/",
        f"http://127.0.0.1:{port}/fleet/?token=S3cretPassw0rd",
        f"http://fleet:S3cretPassw0rd@127.0.0.1:{port}/elsewhere/",
    ):
        for extra in ([], ["--json"]):
            r = cli("fleet", command, "--reports", url, *extra, cwd=tmp_path)
            assert "S3cretPassw0rd" not in r.out + r.err, (url, r.out, r.err)
            if command == "status" or extra or "elsewhere" in url:
                assert f"127.0.0.1:{port}" in r.out + r.err  # it did say where it read


def test_a_device_whose_daemon_stopped_is_listed_as_stopped() -> None:
    stopped = report("cam-2")
    stopped["daemon"].update(running=False, pid=None, listen=None, started=None)
    summary = summarize(_parsed(report("cam-1"), stopped), {}, now=NOW)
    assert summary.stopped == ["cam-2"]
    assert summary.versions == {"mlp": {"1.0.0": 2}}  # what it held, counted as before
    # a newer report from the same device (started again) is what counts
    again = report("cam-2", age_s=1)
    assert summarize(_parsed(stopped, again), {}, now=NOW).stopped == []
