"""Gitless metadata (issue 14, point 1): ``publish`` mirrors the signed metadata to the
artifact remote, and a device with ``repository: {source: artifacts}`` follows it
there: one small conditional request per idle poll, the same trust, the same state,
the same attacks refused (the attack tests of ``test_attacks.py`` and the freeze of
``test_hardening.py`` run in both modes; those below concern the mirror itself).

Real transports: the release's own mirror in a folder, a real HTTP server on loopback
that answers conditional requests like a web server or CDN
(``tests/http_sim.StaticServer``), and a real S3 server (moto)."""

from __future__ import annotations

import datetime as _dt
import json
import time
import types
from typing import Any

import pytest

from registry.errors import ManifestError
from signing.tuf_repo import TrustRepo
from tests.conftest import git
from tests.edge.conftest import SOURCES, EdgeRig
from tests.http_sim import StaticServer

pytestmark = pytest.mark.integration

GITLESS = {"source": "artifacts", "poll_interval": "1s"}


def _mirrored(rig: EdgeRig) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in rig.mirror.iterdir()}


def _signed(rig: EdgeRig) -> dict[str, bytes]:
    trust = TrustRepo.load(rig.root / "trust/metadata")
    return dict(trust.mirror_files())


# --- the repository side ---------------------------------------------------------------


def test_a_release_mirrors_what_it_signed_byte_for_byte(rig: EdgeRig) -> None:
    mirrored = _mirrored(rig)
    assert _signed(rig).items() <= mirrored.items()  # every file a client fetches, exact
    rig.release_version("1.1.0", "1.0.0")
    assert _signed(rig).items() <= _mirrored(rig).items()
    assert (
        json.loads(_mirrored(rig)["timestamp.json"])["signed"]["version"]
        > json.loads(mirrored["timestamp.json"])["signed"]["version"]
    )
    # a release with nothing new writes nothing, not even the timestamp
    before = (rig.mirror / "timestamp.json").stat()
    rig.run("ci", "release")
    after = (rig.mirror / "timestamp.json").stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_freshness_refresh_mirrors_the_new_timestamp(rig: EdgeRig) -> None:
    kept = (rig.mirror / "timestamp.json").read_bytes()
    skipped = rig.run("freshness", "refresh", "--no-mirror", "--json")
    assert json.loads(skipped.out)["mirrored"] == []
    assert (rig.mirror / "timestamp.json").read_bytes() == kept
    done = json.loads(rig.run("freshness", "refresh", "--json").out)
    assert done["mirrored"] == ["timestamp.json"]
    assert (rig.mirror / "timestamp.json").read_bytes() == (
        rig.root / "trust/metadata/timestamp.json"
    ).read_bytes()
    rig.source = "artifacts"
    assert rig.sync().updates["mlp"].version == "1.0.0"


def test_a_remote_that_cannot_be_reached_does_not_stop_the_refresh(rig: EdgeRig) -> None:
    """Devices that follow git still get their timestamp (the workflow commits it);
    the failed mirror is one line and exit code 1."""
    config = rig.root / ".dvc/config"
    text = config.read_text()
    config.write_text(text.replace("url = ../.modelreg/remote", "url = http://u:pw@127.0.0.1:9/x"))
    before = json.loads((rig.root / "trust/metadata/timestamp.json").read_bytes())
    refresh = rig.cli("freshness", "refresh", cwd=rig.root)
    assert refresh.code == 1
    (line,) = refresh.err.strip().splitlines()
    assert "timestamp re-signed, not mirrored" in line
    assert "127.0.0.1:9" in line
    assert "pw@" not in line
    after = json.loads((rig.root / "trust/metadata/timestamp.json").read_bytes())
    assert after["signed"]["version"] == before["signed"]["version"] + 1


def test_a_timestamp_mirrored_by_a_lost_push_is_signed_above(rig: EdgeRig) -> None:
    """Refreshes mirrored timestamps whose commits never reached git (the workflow's
    push was lost); a device following the mirror holds the newest.  The next run,
    from git's older timestamp, signs above it, and the device moves on."""
    rig.source = "artifacts"
    for _ in range(2):
        rig.run("freshness", "refresh")  # mirrored, never committed
    assert rig.sync().updates["mlp"].version == "1.0.0"
    held = json.loads((rig.mirror / "timestamp.json").read_bytes())["signed"]["version"]
    git(rig.root, "checkout", "-q", "--", "trust/metadata")
    behind = json.loads((rig.root / "trust/metadata/timestamp.json").read_bytes())
    assert behind["signed"]["version"] == held - 2
    done = json.loads(rig.run("freshness", "refresh", "--json").out)
    assert done["versions"] == {"timestamp": held + 1}
    assert done["mirrored"] == ["timestamp.json"]
    rig.release_version("1.1.0", "1.0.0")
    assert rig.sync().updates["mlp"].version == "1.1.0"


# --- the device side --------------------------------------------------------------------


def test_edge_yaml_chooses_the_source_strictly(rig: EdgeRig) -> None:
    from edge_sync.config import load_edge_config

    gitless = load_edge_config(rig.config("a", repository=GITLESS))
    assert (gitless.repository.source, gitless.repository.url) == ("artifacts", None)
    assert load_edge_config(rig.config("b")).repository.source == "git"  # the default
    for repository, said in (
        ({**GITLESS, "url": str(rig.root)}, "repository.url: not used with source: artifacts"),
        ({**GITLESS, "branch": "main"}, "repository.branch: not used with source: artifacts"),
        ({"poll_interval": "1s"}, "url: the git repository to follow is required"),
        ({"source": "s3"}, "repository.source"),
    ):
        with pytest.raises(ManifestError) as caught:
            load_edge_config(rig.config("c", repository=repository))
        (problem,) = caught.value.problems
        assert said in str(problem), problem
        assert problem.line is not None
        assert problem.line > 1


def test_a_device_follows_the_mirror_over_http_with_one_small_request_per_idle_poll(
    rig: EdgeRig,
) -> None:
    with StaticServer(rig.remote) as server:
        over_http = {"repository": GITLESS, "artifacts": {"url": server.url()}}
        update = rig.sync(**over_http).updates["mlp"]
        assert (update.result, update.version) == ("installed", "1.0.0")
        assert rig.sync(**over_http).result == "current"
        server.clear()
        with rig.updater(**over_http) as updater:
            assert updater.sync().result == "current"
            idle = (updater.watcher.requests, updater.watcher.bytes_received)
        (served,) = server.served
        assert (served.path, served.status) == ("/metadata/timestamp.json", 304)
        assert idle == (1, served.sent)
        assert served.sent <= 1024, served  # 190 bytes here: a status line and 4 headers
        assert served.asked <= 1024, served
        assert rig.state().sync.commit is not None
        assert rig.state().sync.commit.startswith("sha256:")
        # a release: the next poll sees it, fetches the timestamp once, and installs
        rig.release_version("1.1.0", "1.0.0")
        server.clear()
        update = rig.sync(**over_http).updates["mlp"]
        assert (update.result, update.version, update.method) == ("installed", "1.1.0", "delta")
        paths = [s.path for s in server.served]
        assert paths.count("/metadata/timestamp.json") == 1
        assert all(s.status in (200, 404) for s in server.served)
        assert rig.sync(**over_http).result == "current"


def test_a_frozen_mirror_answering_not_modified_is_refused_once_metadata_expires(
    rig: EdgeRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The freeze attack over HTTP: the remote answers 304 to every poll for ever.  The
    device does not take "not modified" for "fresh": once its trusted timestamp
    expires it verifies again, and says so."""
    import tuf.ngclient._internal.trusted_metadata_set as tms

    from edge_sync import clock

    with StaticServer(rig.remote) as server:
        over_http = {"repository": GITLESS, "artifacts": {"url": server.url()}}
        assert rig.sync(**over_http).updates["mlp"].version == "1.0.0"

        class Later(_dt.datetime):
            @classmethod
            def now(cls, tz: Any = None) -> Any:
                return _dt.datetime.now(tz) + _dt.timedelta(days=2)

        monkeypatch.setattr(tms, "datetime", types.SimpleNamespace(
            datetime=Later, timezone=_dt.timezone, timedelta=_dt.timedelta))  # fmt: skip
        monkeypatch.setattr(clock, "now", lambda: Later.now(_dt.UTC))
        server.clear()
        report = rig.sync(**over_http)
        assert report.result == "failed"
        assert "timestamp.json is expired" in (report.reason or ""), report.reason
        statuses = [(s.path, s.status, s.conditional) for s in server.served]
        assert statuses[0] == ("/metadata/timestamp.json", 304, True)  # "not modified" ...
        assert ("/metadata/timestamp.json", 200, False) in statuses  # ... checked anyway
        assert rig.state().models["mlp"].serving.version == "1.0.0"


@pytest.mark.parametrize("rig", SOURCES, indirect=True)
def test_a_replayed_timestamp_is_refused(rig: EdgeRig) -> None:
    old = (rig.root / "trust/metadata/timestamp.json").read_bytes()
    assert rig.sync().updates["mlp"].version == "1.0.0"
    rig.release_version("1.1.0", "1.0.0")
    assert rig.sync().updates["mlp"].version == "1.1.0"
    (rig.root / "trust/metadata/timestamp.json").write_bytes(old)  # genuinely signed, older
    rig.push("replay an old timestamp")
    report = rig.sync()
    assert report.result == "failed"
    assert "timestamp" in (report.reason or "")
    assert "version" in (report.reason or "")
    assert rig.state().models["mlp"].serving.version == "1.1.0"


@pytest.mark.parametrize("rig", SOURCES, indirect=True)
def test_tampered_targets_metadata_is_refused(rig: EdgeRig) -> None:
    assert rig.sync().updates["mlp"].version == "1.0.0"
    rig.release_version("1.1.0", "1.0.0")
    trust = TrustRepo.load(rig.root / "trust/metadata")
    path = rig.root / f"trust/metadata/{trust.version('targets')}.targets.json"
    doc = json.loads(path.read_bytes())
    for info in doc["signed"]["targets"].values():
        info["length"] += 1  # every file "longer": a device must never believe it
    path.write_text(json.dumps(doc, indent=1))
    rig.push("tamper with the targets metadata")
    report = rig.sync()
    assert report.result == "failed"
    assert "does not match expected hash" in (report.reason or ""), report.reason
    assert rig.state().models["mlp"].serving.version == "1.0.0"


def test_a_device_follows_the_mirror_on_s3_with_one_conditional_request(
    rig: EdgeRig, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import boto3

    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_endpoint)
    s3 = boto3.client("s3", endpoint_url=s3_endpoint)
    for path in rig.remote.rglob("*"):
        if path.is_file():
            key = f"private/modelreg/{path.relative_to(rig.remote).as_posix()}"
            s3.put_object(Bucket="fleet", Key=key, Body=path.read_bytes())
    over_s3 = {"repository": GITLESS, "artifacts": {"url": "s3://fleet/private/modelreg"}}
    assert rig.sync(**over_s3).updates["mlp"].version == "1.0.0"
    with rig.updater(**over_s3) as updater:
        assert updater.sync().result == "current"
        last = updater.watcher.last
        assert last is not None
        assert last.body is None
        assert (updater.watcher.requests, last.requests) == (1, 1)
        assert last.received <= 1024
    missing = {**over_s3, "artifacts": {"url": "s3://fleet/private/nothing"}}
    report = rig.sync("other", **missing)
    assert report.result == "failed"
    assert "not found" in (report.reason or ""), report.reason


def test_git_stays_the_default_and_the_state_carries_over(rig: EdgeRig) -> None:
    """A device moved from git to the mirror keeps its trust and what it serves."""
    assert rig.sync().updates["mlp"].version == "1.0.0"
    rig.source = "artifacts"
    report = rig.sync()
    assert (report.result, report.updates) == ("current", {})
    assert rig.state().sync.commit is not None
    assert rig.state().sync.commit.startswith("sha256:")
    rig.release_version("1.1.0", "1.0.0")
    assert rig.sync().updates["mlp"].version == "1.1.0"


def test_the_daemon_follows_the_mirror_over_http(rig: EdgeRig) -> None:
    """``modelreg edge run`` with no git: it installs, idles on 304s, installs a release."""
    from tests.edge.test_daemon import _serving, _start, _stop, _wait

    with StaticServer(rig.remote) as server:
        config = rig.config(repository=GITLESS, artifacts={"url": server.url()})
        proc = _start(config)
        try:
            _wait(config, lambda s: _serving(s) == "1.0.0")
            time.sleep(2.5)  # a couple of idle polls (poll_interval 1s)
            idle = [s for s in server.served if s.path == "/metadata/timestamp.json"][1:]
            assert idle
            assert all((s.status, s.conditional) == (304, True) for s in idle), idle
            rig.release_version("1.1.0", "1.0.0")
            status = _wait(config, lambda s: _serving(s) == "1.1.0")
            assert status["sync"]["commit"].startswith("sha256:")
        finally:
            _stop(proc)
