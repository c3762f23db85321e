"""The device's report sender (``edge_sync.sync.report``) and its ``edge.yaml`` section: it
sends on change and at each heartbeat, logs a failing sink once, tries again later, and
never raises; the HTTP sink PUTs with the device's token on real HTTP on loopback."""

from __future__ import annotations

import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from edge_sync.config import EdgeConfig, load_edge_config
from edge_sync.errors import SendError
from edge_sync.sync.report import TOKEN_ENV, FolderSink, HttpSink, Reporter, S3Sink, sink_for
from fleet.reports import load_reports
from registry.device_report import StatusDocument, parse_report
from registry.errors import ManifestError
from tests.fleet_reports import model, report
from tests.http_sim import running

BASE: dict[str, Any] = {
    "apiVersion": "modelreg/v1",
    "kind": "EdgeConfig",
    "device": {"id": "cam-0042", "labels": {"arch": "x86_64", "site": "plant-3"}},
    "repository": {"url": "fleet.git"},
    "trust": {"root": "1.root.json"},
    "artifacts": {"url": "remote"},
    "models": [{"name": "mlp", "channel": "production"}],
    "state_dir": "state",
}


def _config(tmp_path: Path, report_section: Any) -> EdgeConfig:
    path = tmp_path / "edge.yaml"
    path.write_text(json.dumps({**BASE, "report": report_section}))
    return load_edge_config(path)


def _status(device: str = "cam-0042", **changes: Any) -> StatusDocument:
    """An ``edge status`` document (a report less the report's own fields)."""
    doc = report(device, **changes)
    for key in ("kind", "format", "labels", "reported", "truncated"):
        doc.pop(key)
    doc["daemon"].pop("version")
    return StatusDocument.model_validate(doc)


# --- edge.yaml --------------------------------------------------------------------------


def test_the_report_section_resolves_paths_and_reads_durations(tmp_path: Path) -> None:
    config = _config(tmp_path, {"url": "reports", "heartbeat": "1m"})
    assert config.report is not None
    assert config.report.url == str(tmp_path / "reports")
    assert (config.report.heartbeat, config.report.timeout) == (60.0, 10.0)
    s3 = _config(tmp_path, {"url": "s3://b/fleet/", "credentials": "keys/report.ini"}).report
    assert s3 is not None
    assert s3.credentials == str(tmp_path / "keys/report.ini")
    assert _config(tmp_path, None).report is None


@pytest.mark.parametrize(
    ("section", "says"),
    [
        ({"url": "ftp://host/fleet/"}, "report.url: unsupported URL scheme 'ftp'"),
        ({"url": "s3://bucket/fleet"}, "report: the URL must name each device's report"),
        ({"url": "https://h/fleet"}, "report: the URL must name each device's report"),
        ({"url": "reports", "credentials": "x"}, "credentials are for s3:// and http(s)://"),
        ({"url": "reports", "heartbeat": "0s"}, "report.heartbeat"),
        ({"url": "reports", "timeout": "1h"}, "report.timeout"),
        ({"url": "reports", "every": "5m"}, "report.every"),
    ],
)
def test_a_bad_report_section_is_one_line(tmp_path: Path, section: Any, says: str) -> None:
    with pytest.raises(ManifestError) as caught:
        _config(tmp_path, section)
    assert says in str(caught.value), str(caught.value)


def test_each_url_form_names_the_devices_object(tmp_path: Path) -> None:
    def where(url: str) -> str:
        section = _config(tmp_path, {"url": url}).report
        assert section is not None
        return sink_for(section, "cam-0042").where

    assert isinstance(sink_for(_config(tmp_path, {"url": "s3://b/p/"}).report, "x"), S3Sink)  # type: ignore[arg-type]
    assert where("s3://b/fleet/") == "s3://b/fleet/cam-0042.json"
    assert where("s3://b/fleet/{device}/status.json") == "s3://b/fleet/cam-0042/status.json"
    assert where("https://h/fleet/") == "https://h/fleet/cam-0042.json"
    assert where("https://h/put?device={device}") == "https://h/put?device=cam-0042"
    assert where(str(tmp_path / "out")) == str(tmp_path / "out")
    assert where((tmp_path / "out").as_uri()) == str(tmp_path / "out")


# --- the sender's decisions -------------------------------------------------------------


class _Sink:
    where = "memory"

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.error: Exception | None = None

    def send(self, data: bytes) -> None:
        if self.error is not None:
            raise self.error
        self.sent.append(json.loads(data))


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _reporter(
    tmp_path: Path, status: list[StatusDocument]
) -> tuple[Reporter, _Sink, _Clock, list[str]]:
    sink, clock, logged = _Sink(), _Clock(), list[str]()
    config = _config(tmp_path, {"url": "reports", "heartbeat": "5m"})
    reporter = Reporter(config, lambda: status[0], "9.9.9", sink=sink, clock=clock,
                        log=logged.append)  # fmt: skip
    return reporter, sink, clock, logged


def test_a_report_goes_out_on_change_and_at_each_heartbeat(tmp_path: Path) -> None:
    status = [_status()]
    reporter, sink, clock, _ = _reporter(tmp_path, status)
    assert reporter.tick() is True  # the first look always sends
    sent = parse_report(json.dumps(sink.sent[0]).encode())
    assert (sent.device, sent.daemon.version) == ("cam-0042", "9.9.9")
    assert sent.labels == {"arch": "x86_64", "site": "plant-3"}
    # a poll that changed nothing but its time: nothing to say
    status[0] = _status(
        sync={**status[0].sync.model_dump(), "last_checked": "2030-01-01T00:00:00Z"}
    )
    clock.now += 60
    assert reporter.tick() is None
    # an install, a failure, a rejection: each is a change
    status[0] = _status(models={"mlp": model("1.1.0")})
    assert reporter.tick() is True
    assert sink.sent[-1]["models"]["mlp"]["serving"]["version"] == "1.1.0"
    assert reporter.tick() is None
    clock.now += 299
    assert reporter.tick() is None
    clock.now += 1  # the heartbeat: the same report, sent again
    assert reporter.tick() is True
    assert len(sink.sent) == 3


def test_a_failing_sink_is_logged_once_and_tried_again_later(tmp_path: Path) -> None:
    status = [_status()]
    reporter, sink, clock, logged = _reporter(tmp_path, status)
    sink.error = SendError("HTTP 503 Service Unavailable")
    assert reporter.tick() is False
    said = "HTTP 503 Service Unavailable (tried again at the next change or heartbeat)"
    assert logged == [f"not sent to memory: {said}"]
    clock.now += 10
    assert reporter.tick() is None  # no hammering: wait for a change or the heartbeat
    clock.now += 300
    assert reporter.tick() is False  # the heartbeat tried again, quietly
    assert len(logged) == 1
    status[0] = _status(models={"mlp": model("1.1.0")})
    assert reporter.tick() is False  # a new report that fails is worth a line
    assert len(logged) == 2
    sink.error = None
    clock.now += 300
    assert reporter.tick() is True
    assert logged[-1] == "sent to memory again"
    assert sink.sent[-1]["models"]["mlp"]["serving"]["version"] == "1.1.0"


@pytest.mark.parametrize(
    ("error", "says"),
    [
        (OSError(28, "No space left on device"), "not sent to memory: No space left on device"),
        (RuntimeError("a bug in a sink"), "internal error: RuntimeError: a bug in a sink"),
    ],
)
def test_no_error_of_a_sink_escapes(tmp_path: Path, error: Exception, says: str) -> None:
    reporter, sink, _, logged = _reporter(tmp_path, [_status()])
    sink.error = error
    assert reporter.tick() is False
    (line,) = logged
    assert says in line


def test_an_unreadable_status_is_logged_not_raised(tmp_path: Path) -> None:
    def broken() -> StatusDocument:
        raise ValueError("corrupt state file")

    sink, logged = _Sink(), list[str]()
    config = _config(tmp_path, {"url": "reports"})
    reporter = Reporter(config, broken, "1", sink=sink, log=logged.append)
    assert reporter.tick() is False
    assert reporter.tick() is False
    assert len(logged) == 1  # once, not at every poll
    assert "cannot read the status: ValueError: corrupt state file" in logged[0]


def test_the_thread_sends_at_start_and_when_poked(tmp_path: Path) -> None:
    status = [_status()]
    sink = _Sink()
    config = _config(tmp_path, {"url": "reports", "heartbeat": "1h"})
    reporter = Reporter(config, lambda: status[0], "1", sink=sink, log=lambda _: None)
    reporter.start()
    try:
        _until(lambda: len(sink.sent) == 1)
        status[0] = _status(models={"mlp": model("1.1.0")})
        reporter.poke()
        _until(lambda: len(sink.sent) == 2)
    finally:
        reporter.stop()
    assert reporter._thread is not None
    assert not reporter._thread.is_alive()


def _until(done: Any, timeout: float = 10) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline
        time.sleep(0.01)


# --- the sinks ---------------------------------------------------------------------------


def test_a_folder_sink_writes_what_fleet_status_reads(tmp_path: Path) -> None:
    config = _config(tmp_path, {"url": "fleet/reports"})
    reporter = Reporter(config, _status, "1", log=lambda _: None)
    assert reporter.tick() is True
    loaded = load_reports(str(tmp_path / "fleet/reports"))
    assert [r.device for r in loaded.reports] == ["cam-0042"]
    assert loaded.unreadable == []
    assert isinstance(reporter.sink, FolderSink)


class _PutServer(ThreadingHTTPServer):
    received: list[tuple[str, str | None, bytes]]
    answer: int


class _PutHandler(BaseHTTPRequestHandler):
    server: _PutServer

    def do_PUT(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.received.append((self.path, self.headers.get("Authorization"), body))
        self.send_response(self.server.answer)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def put_server() -> Iterator[_PutServer]:
    server = _PutServer(("127.0.0.1", 0), _PutHandler)
    server.received, server.answer = [], 201
    with running(server):
        yield server


def test_an_http_sink_puts_with_the_devices_token(
    tmp_path: Path, put_server: _PutServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = f"http://127.0.0.1:{put_server.server_address[1]}"
    data = json.dumps({"device": "cam-0042"}).encode()
    monkeypatch.setenv(TOKEN_ENV, "token-from-the-environment")
    HttpSink(f"{base}/fleet/cam-0042.json", 5).send(data)
    token_file = tmp_path / "token"
    token_file.write_text("token-from-a-file\n")
    HttpSink(f"{base}/fleet/cam-0042.json", 5, str(token_file)).send(data)
    assert put_server.received == [
        ("/fleet/cam-0042.json", "Bearer token-from-the-environment", data),
        ("/fleet/cam-0042.json", "Bearer token-from-a-file", data),
    ]
    put_server.answer = 403
    with pytest.raises(SendError, match="HTTP 403") as caught:
        HttpSink(f"{base}/fleet/cam-0042.json", 5, str(token_file)).send(data)
    assert "token-from" not in str(caught.value)


def test_an_http_sink_that_does_not_answer_fails_within_its_time_limit() -> None:
    import socket
    import time

    with socket.socket() as silent:  # accepts the connection, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(SendError, match="cannot reach it"):
            HttpSink(f"http://127.0.0.1:{port}/cam.json", 0.5).send(b"{}")
        assert time.monotonic() - started < 5


def test_s3_credentials_come_from_the_devices_file_and_are_never_shown(tmp_path: Path) -> None:
    good = tmp_path / "good.ini"
    good.write_text("[default]\naws_access_key_id = AKIDEVICE\naws_secret_access_key = s3cr3t\n")
    assert S3Sink("s3://b/k.json", 1, str(good))._keys() == {
        "aws_access_key_id": "AKIDEVICE", "aws_secret_access_key": "s3cr3t",
    }  # fmt: skip
    bad = tmp_path / "bad.ini"
    bad.write_text("[other]\naws_access_key_id = AKIDEVICE\naws_secret_access_key = s3cr3t\n")
    with pytest.raises(SendError, match=r"no \[default\] section") as caught:
        S3Sink("s3://b/k.json", 1, str(bad))._keys()
    assert "s3cr3t" not in str(caught.value)
    with pytest.raises(SendError, match="cannot read the report credentials"):
        S3Sink("s3://b/k.json", 1, str(tmp_path / "missing.ini"))._keys()


def test_with_the_device_key_each_report_is_numbered_and_signed(tmp_path: Path) -> None:
    """Issue 28, point 3: what leaves the device is an envelope signed by its own key,
    whose report carries a sequence that grows with every send (heartbeats too)."""
    from edge_sync.state.device_key import DeviceKey
    from signing.device_reports import public_key_from_pem, verify_report

    status = [_status()]
    sink, clock = _Sink(), _Clock()
    key = DeviceKey.load_or_create(tmp_path / "state")
    config = _config(tmp_path, {"url": "reports", "heartbeat": "5m"})
    reporter = Reporter(config, lambda: status[0], "9.9.9", sink=sink, clock=clock,
                        log=lambda _: None, key=key)  # fmt: skip
    assert reporter.tick() is True
    clock.now += 301  # a heartbeat
    assert reporter.tick() is True
    public = public_key_from_pem(key.public_pem(), "device.pub")
    reports = [parse_report(verify_report(envelope, public, "r")) for envelope in sink.sent]
    assert [r.sequence for r in reports] == [1, 2]
    assert {(r.device, r.format) for r in reports} == {("cam-0042", 4)}
