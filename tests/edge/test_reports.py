"""Device reports end to end: real daemons report to a folder and to an S3 bucket (moto on
loopback), send again when what they run changes, export ``modelreg_model_info``, and
``modelreg fleet status`` counts them against the repository's channels, cohorts
included."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from fleet.reports import LoadedReports, ReportsError, load_reports
from registry.cohort import in_cohort
from signing.device_reports import open_envelope
from tests.conftest import git
from tests.edge.conftest import EdgeRig
from tests.http_sim import running

pytestmark = pytest.mark.integration

_QUIET = {"url": "", "poll_interval": "1h"}
"""A repository section that syncs at start and when asked only."""


@contextmanager
def _daemon(rig: EdgeRig, name: str, **overrides: Any) -> Iterator[Any]:
    """Device ``name``'s real daemon loop in a thread (no server: its sync and reports)."""
    from edge_sync.config import load_edge_config
    from edge_sync.daemon import Daemon

    repository = {**_QUIET, "url": str(rig.root)}
    config = load_edge_config(rig.config(name, repository=repository, **overrides))
    daemon = Daemon(config, serving=False)
    thread = threading.Thread(target=daemon.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    try:
        yield daemon
    finally:
        daemon.stop()
        thread.join(timeout=60)
        assert not thread.is_alive()


def _wait(url: str, done: Callable[[LoadedReports], bool], timeout: float = 90) -> LoadedReports:
    deadline = time.monotonic() + timeout
    loaded = LoadedReports(url)
    while True:
        with contextlib.suppress(ReportsError):  # no report written yet
            loaded = load_reports(url)
            if done(loaded):
                return loaded
        assert time.monotonic() < deadline, [r.model_dump(mode="json") for r in loaded.reports]
        time.sleep(0.1)


def _serving(loaded: LoadedReports) -> dict[str, str | None]:
    found = {}
    for r in loaded.reports:
        serving = r.models["mlp"].serving
        found[r.device] = serving.version if serving else None
    return found


def _metrics(base: str) -> str:
    with urllib.request.urlopen(f"{base}/metrics", timeout=30) as response:  # noqa: S310
        return str(response.read().decode())


def _fleet_status(rig: EdgeRig, url: str) -> dict[str, Any]:
    r = rig.cli("fleet", "status", "--reports", url, "--json", cwd=rig.root)
    assert r.code == 0, r.err
    return dict(json.loads(r.out))


def test_daemons_report_to_a_folder_on_change_and_fleet_status_counts_them(
    rig: EdgeRig,
) -> None:
    reports = rig.tmp / "reports"
    section = {"url": str(reports), "heartbeat": "1h"}  # a change, never the heartbeat
    config = rig.config("a", repository={**_QUIET, "url": str(rig.root)}, report=section)
    with config.with_suffix(".log").open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "modelreg", "edge", "run", "--config", str(config)],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        with _daemon(rig, "b", report=section) as b:
            loaded = _wait(str(reports), lambda r: set(_serving(r).values()) == {"1.0.0"}
                           and len(r.reports) == 2)  # fmt: skip
            assert loaded.unreadable == []
            first = {r.device: r for r in loaded.reports}["a-0001"]
            assert first.labels == {"arch": "x86_64"}
            assert first.daemon.running
            assert first.daemon.version
            assert first.sync.result == "current"
            listen = first.daemon.listen
            assert listen
            base = f"http://{listen}"
            serving = first.models["mlp"].serving
            assert serving is not None
            sha = serving.sha256
            # where it came from, as its signed description says: released by hand here
            assert serving.model_sha256 == sha
            origin = serving.provenance
            assert origin is not None
            assert (origin.pull_request, origin.approvers, origin.ci_run) == (None, None, None)
            assert origin.unknown == ["approvals", "ci", "policy", "pull_request"]
            assert git(rig.root, "cat-file", "-t", origin.commit).strip() == "commit"
            info = f'modelreg_model_info{{model="mlp",sha256="{sha}",version="1.0.0"}} 1.0'
            assert info in _metrics(base).splitlines()

            rig.release_version("1.1.0", "1.0.0")
            request = urllib.request.Request(f"{base}/v2/repository/sync", data=b"{}")  # noqa: S310
            urllib.request.urlopen(request, timeout=30).close()  # noqa: S310
            b.request_sync()
            loaded = _wait(str(reports), lambda r: set(_serving(r).values()) == {"1.1.0"})
            new = {r.device: r for r in loaded.reports}["a-0001"]
            assert new.reported > first.reported
            update = new.models["mlp"].last_update
            assert update is not None
            assert (update.result, update.version) == ("installed", "1.1.0")
            assert new.models["mlp"].previous.version == "1.0.0"  # type: ignore[union-attr]
            text = _metrics(base)
            assert 'modelreg_model_info{model="mlp",sha256=' in text
            assert 'version="1.1.0"} 1.0' in text
            assert 'version="1.0.0"} 1.0' not in text.split("modelreg_model_info{", 1)[1]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    assert "report: not sent" not in config.with_suffix(".log").read_text()

    status = _fleet_status(rig, str(reports))
    assert status["devices"] == 2
    assert status["versions"] == [
        {"model": "mlp", "version": "1.1.0", "devices": 2, "approvers": None}
    ]
    (canary,) = status["channels"]
    assert canary | {"failed": [], "pending": []} == {
        "model": "mlp", "channel": "canary", "version": "1.1.0", "percent": None, "hold": None,
        "subscribed": 2, "cohort": 2, "on_target": 2, "failed": [], "pending": [], "stale": [],
        "behaviour": None, "behaviour_not_judged": [],  # the channel declares no shadow
    }  # fmt: skip
    assert status["unreadable"] == []
    assert status["repository"] == str(rig.root)
    assert status["authenticated"] is False  # the repository enrolls no device yet

    # The daemons signed every report with a key of their own: once a's is enrolled,
    # only a's reports count; b is listed apart (issue 28, point 3).
    key = rig.tmp / "a/state/device.pub"
    assert (rig.tmp / "a/state/device.key").stat().st_mode & 0o777 == 0o600
    printed = rig.cli("edge", "key", "--config", str(config), cwd=rig.tmp)
    assert printed.code == 0
    assert printed.out.encode() == key.read_bytes()
    assert "PRIVATE" not in printed.out
    rig.run("fleet", "enroll", "a-0001", "--public-key", str(key))
    status = _fleet_status(rig, str(reports))
    assert (status["authenticated"], status["devices"]) == (True, 1)
    assert status["untrusted"] == [{"source": "b-0001.json", "reason": (
        "device 'b-0001' is not enrolled (modelreg fleet enroll b-0001 --public-key FILE)"
    )}]  # fmt: skip


def test_daemons_report_to_s3_with_their_own_credentials_and_cohorts_agree(
    rig: EdgeRig,
    s3_endpoint: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import boto3

    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_endpoint)
    keys = rig.tmp / "device.credentials"
    keys.write_text("[default]\naws_access_key_id = cam\naws_secret_access_key = cam-secret\n")
    broken = rig.tmp / "broken.credentials"
    broken.write_text("aws_access_key_id = cam\n")  # no section: the device says so
    url = "s3://fleet/reports/"
    section = {"url": "s3://fleet/reports/{device}.json", "heartbeat": "1h",
               "credentials": str(keys), "timeout": "5s"}  # fmt: skip
    s3 = boto3.client("s3", endpoint_url=s3_endpoint)
    s3.put_object(Bucket="fleet", Key="reports/intruder.json", Body=b'{"kind": "Device')
    names = ("a", "b", "c")
    with (
        _daemon(rig, "a", report=section) as a,
        _daemon(rig, "b", report=section) as b,
        _daemon(rig, "c", report=section) as c,
        _daemon(rig, "d", report={**section, "credentials": str(broken)}) as d,
    ):
        _wait(url, lambda r: len(r.reports) == 3 and set(_serving(r).values()) == {"1.0.0"})
        # 1.1.0 to half of the channel: a is in its cohort, b and c are not (a stable hash)
        rig.run("version", "add", "mlp", "1.1.0", "--artifact",
                str(rig.models / "mlp/1.1.0.onnx"), "--parent", "1.0.0")  # fmt: skip
        rig.promote("1.1.0", percent=50)
        for daemon in (a, b, c, d):
            daemon.request_sync()
        cohort = [n for n in names if in_cohort(f"{n}-0001", "mlp", "1.1.0", 50)]
        assert cohort == ["a"]
        wanted = {f"{n}-0001": "1.1.0" if n in cohort else "1.0.0" for n in names}
        _wait(url, lambda r: _serving(r) == wanted)
        assert d.stopping is False  # the broken sink stopped nothing
    said = [line for line in capsys.readouterr().err.splitlines() if "report:" in line]
    expected = (
        f"modelreg edge: report: not sent to s3://fleet/reports/d-0001.json: {broken}: not an "
        "AWS credentials file (tried again at the next change or heartbeat)"
    )
    assert set(said) == {expected}
    # once per report it had to send (at start, 1.0.0 installed, 1.1.0 installed), not per try
    assert 1 <= len(said) <= 3
    status = _fleet_status(rig, url)
    assert status["devices"] == 3
    assert status["unreadable"] == [{"source": "intruder.json", "reason": "not a JSON document"}]
    (canary,) = status["channels"]
    assert (canary["version"], canary["percent"]) == ("1.1.0", 50.0)
    assert (canary["subscribed"], canary["cohort"], canary["on_target"]) == (3, len(cohort),
                                                                            len(cohort))  # fmt: skip
    on_new = sum(v["devices"] for v in status["versions"] if v["version"] == "1.1.0")
    assert on_new == len(cohort)  # the devices outside the cohort kept 1.0.0
    listed = s3.list_objects_v2(Bucket="fleet", Prefix="reports/")["Contents"]
    assert sorted(o["Key"] for o in listed) == [
        "reports/a-0001.json", "reports/b-0001.json", "reports/c-0001.json",
        "reports/intruder.json",
    ]  # fmt: skip


def _start(config: Path) -> subprocess.Popen[bytes]:
    with config.with_suffix(".log").open("w") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "modelreg", "edge", "run", "--config", str(config)],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip


def test_a_clean_stop_sends_a_last_report_and_fleet_status_sees_the_device_stopped(
    rig: EdgeRig,
) -> None:
    reports = rig.tmp / "reports"
    section = {"url": str(reports), "heartbeat": "1h"}
    config = rig.config("a", repository={**_QUIET, "url": str(rig.root)}, report=section)
    proc = _start(config)
    try:
        loaded = _wait(str(reports), lambda r: set(_serving(r).values()) == {"1.0.0"})
        (running,) = loaded.reports
        assert running.daemon.running
        assert running.daemon.pid == proc.pid
        assert _fleet_status(rig, str(reports))["stopped"] == []
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    # on disk once the daemon has exited: sent before it, not left to a thread
    (stopped,) = load_reports(str(reports)).reports
    assert stopped.daemon.model_dump() == {
        "running": False, "pid": None, "listen": None, "grpc_listen": None, "started": None,
        "version": running.daemon.version,
    }  # fmt: skip
    assert stopped.reported > running.reported
    assert stopped.models["mlp"].serving == running.models["mlp"].serving  # what it held
    status = _fleet_status(rig, str(reports))
    assert status["stopped"] == ["a-0001"]
    r = rig.cli("fleet", "status", "--reports", str(reports), cwd=rig.root)
    assert r.code == 0, r.err
    assert "stopped: a-0001 (its daemon stopped: it serves nothing now)" in r.out
    # started again, it reports running again
    proc = _start(config)
    try:
        _wait(str(reports), lambda r: all(d.daemon.running for d in r.reports))
        assert _fleet_status(rig, str(reports))["stopped"] == []
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0


class _SlowSink(BaseHTTPRequestHandler):
    """A report sink that takes the first report and then never answers."""

    bodies: ClassVar[list[bytes]] = []
    release: ClassVar[threading.Event] = threading.Event()

    def do_PUT(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).bodies.append(body)
        if len(type(self).bodies) > 1:
            type(self).release.wait(120)  # slower than any stop may wait
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_args: Any) -> None:
        pass


def test_a_slow_report_sink_does_not_hold_up_the_stop(rig: EdgeRig) -> None:
    from edge_sync.sync.report import LAST_REPORT_S

    _SlowSink.bodies, _SlowSink.release = [], threading.Event()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SlowSink)
    server.daemon_threads = True
    with running(server):
        url = f"http://127.0.0.1:{server.server_address[1]}/reports/"
        section = {"url": url, "heartbeat": "1h", "timeout": "5m"}
        config = rig.config("a", repository={**_QUIET, "url": str(rig.root)}, report=section)
        proc = _start(config)
        try:
            deadline = time.monotonic() + 120
            while len(_SlowSink.bodies) < 2:  # the sink now holds a send
                assert proc.poll() is None
                assert time.monotonic() < deadline, _SlowSink.bodies
                time.sleep(0.1)
        finally:
            began = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=120)
            took = time.monotonic() - began
            _SlowSink.release.set()
    assert code == 0
    assert took < LAST_REPORT_S + 15, took  # the stop waited for the sink at most that
    # what the sink got: the device's report, in the envelope its key signed
    sent = open_envelope(json.loads(_SlowSink.bodies[0]), "report")
    assert json.loads(sent)["daemon"]["running"] is True
