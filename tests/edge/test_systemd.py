"""On a real device: the systemd unit `modelreg edge unit` writes for a config (paths,
watchdog, start limits; `systemd-analyze verify` clean), and the daemon's readiness, status
and watchdog pings through the ``NOTIFY_SOCKET`` protocol (issue 9, point 7; issue 23)."""

from __future__ import annotations

import configparser
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from edge_sync._systemd import Watchdog
from edge_sync.daemon import systemd_unit
from registry.errors import UsageError
from tests.edge.conftest import EdgeRig

# Read at import: the autouse fixture of tests/conftest.py unsets CI inside each test.
_IN_CI = os.environ.get("CI") == "true"


def _unit(text: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None, comment_prefixes="#")
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(text)
    return parser


def _edge_yaml(path: Path, **overrides: Any) -> Path:
    """An ``edge.yaml`` with absolute paths (the device's layout, docs/reference/daemon.md)."""
    doc: dict[str, Any] = {
        "apiVersion": "modelreg/v1", "kind": "EdgeConfig", "device": {"id": "cam-1"},
        "repository": {"url": "git://127.0.0.1/fleet.git"},
        "trust": {"root": "/etc/modelreg/1.root.json"},
        "artifacts": {"url": "https://models.internal/modelreg"},
        "models": [{"name": "mlp", "channel": "production"}],
        "state_dir": "/var/lib/modelreg",
    }  # fmt: skip
    doc.update(overrides)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))  # JSON is YAML
    return path


def _verify(text: str, tmp_path: Path) -> None:
    """``systemd-analyze verify`` accepts the unit without a word (it exits 0 even for
    a setting it ignores, saying so on stderr).  Where systemd is not installed the
    check is skipped (its own test only: every other check of the units runs), except
    in CI, where ``.ci/run`` installs it."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        if _IN_CI:
            pytest.fail("systemd-analyze is not installed (.ci/run installs it)")
        pytest.skip("systemd-analyze is not installed: `apt-get install systemd`")
    # the unit's ExecStart must name an executable file, as on a device
    path = tmp_path / "modelreg-edge.service"
    path.write_text(text)
    proc = subprocess.run(
        [analyze, "verify", str(path)], check=False, capture_output=True, text=True, timeout=120
    )
    assert (proc.returncode, proc.stderr, proc.stdout) == (0, "", ""), text


def test_the_unit_runs_the_daemon_as_a_sandboxed_notify_service(tmp_path: Path) -> None:
    from edge_sync.config import load_edge_config

    config = load_edge_config(_edge_yaml(tmp_path / "edge.yaml"))
    text = systemd_unit(PurePosixPath("/etc/modelreg/edge.yaml"), sys.executable, config)
    unit = _unit(text)
    service = unit["Service"]
    assert service["Type"] == "notify"
    assert service["ExecStart"] == f"{sys.executable} edge run --config /etc/modelreg/edge.yaml"
    assert service["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert service["Restart"] == "on-failure"
    # systemd reads start limits in [Unit] only (in [Service] they are ignored)
    assert unit["Unit"]["StartLimitIntervalSec"] == "0"
    assert "StartLimitIntervalSec" not in service
    assert "StartLimitBurst" not in service
    assert service["WatchdogSec"] == "15min"
    assert int(service["LimitNOFILE"]) >= 65536
    # the default layout: systemd creates the state dir, owned by the service's user
    assert service["StateDirectory"] == "modelreg"
    assert service["StateDirectoryMode"] == "0700"
    assert service["ConfigurationDirectory"] == "modelreg"
    assert "ReadWritePaths" not in service
    for hardening in ("NoNewPrivileges", "ProtectHome", "PrivateTmp", "ProtectKernelModules"):
        assert service[hardening] == "yes", hardening
    assert service["ProtectSystem"] == "strict"
    assert unit["Install"]["WantedBy"] == "multi-user.target"
    assert "@" not in text.replace("@system-service", "")  # every placeholder filled
    with pytest.raises(UsageError):
        systemd_unit(PurePosixPath("/etc/model reg/edge.yaml"), "/usr/bin/modelreg", config)
    with pytest.raises(UsageError):
        systemd_unit(PurePosixPath("/etc/modelreg/edge.yaml"), "/usr/bin/$(reboot)", config)


def test_systemd_analyze_accepts_every_unit_edge_unit_writes(tmp_path: Path) -> None:
    """The default layout, paths elsewhere (``ReadWritePaths``) and a home folder
    (``ProtectHome=read-only``): systemd itself reads each unit without a word."""
    from edge_sync.config import load_edge_config

    layouts: list[tuple[str, dict[str, Any]]] = [
        ("/etc/modelreg/edge.yaml", {}),
        ("/opt/edge/edge.yaml", {"state_dir": "/srv/edge/state",
                                 "report": {"url": "file:///mnt/fleet-reports/plant-3"}}),
        ("/home/pi/modelreg/edge.yaml", {"state_dir": "/home/pi/modelreg/state"}),
    ]  # fmt: skip
    for n, (where, fields) in enumerate(layouts):
        config = load_edge_config(_edge_yaml(tmp_path / f"edge-{n}.yaml", **fields))
        _verify(systemd_unit(PurePosixPath(where), sys.executable, config), tmp_path)


def test_the_unit_lets_the_daemon_write_where_its_config_says(tmp_path: Path) -> None:
    """``ProtectSystem=strict`` makes every path read-only but those the unit names: a
    state dir and a report folder elsewhere than the default get ``ReadWritePaths``."""
    from edge_sync.config import load_edge_config

    edge = _edge_yaml(
        tmp_path / "edge.yaml", state_dir="/srv/edge/state",
        report={"url": "file:///mnt/fleet-reports/plant-3", "heartbeat": "5m"},
    )  # fmt: skip
    config = load_edge_config(edge)
    text = systemd_unit(PurePosixPath("/opt/edge/edge.yaml"), sys.executable, config)
    service = _unit(text)["Service"]
    written = [line.partition("=")[2] for line in text.splitlines()
               if line.startswith("ReadWritePaths=")]  # fmt: skip
    assert written == ["/srv/edge/state", "/mnt/fleet-reports/plant-3"]
    assert "StateDirectory" not in service
    assert "ConfigurationDirectory" not in service  # not under /etc: nothing to create
    assert service["ProtectHome"] == "yes"

    # a state dir under /var/lib is still systemd's to create; a report path as written
    config = load_edge_config(_edge_yaml(
        tmp_path / "edge.yaml", state_dir="/var/lib/modelreg/cam-1",
        report={"url": "/srv/reports"},
    ))  # fmt: skip
    text = systemd_unit(PurePosixPath("/etc/modelreg/edge.yaml"), sys.executable, config)
    service = _unit(text)["Service"]
    assert service["StateDirectory"] == "modelreg/cam-1"
    assert service["ReadWritePaths"] == "/srv/reports"

    # a device run from a home folder: hidden by ProtectHome=yes, so read-only instead
    home = _edge_yaml(tmp_path / "edge.yaml", state_dir="/home/pi/modelreg/state")
    text = systemd_unit(
        PurePosixPath("/home/pi/modelreg/edge.yaml"), sys.executable, load_edge_config(home)
    )
    service = _unit(text)["Service"]
    assert service["ProtectHome"] == "read-only"
    assert service["ReadWritePaths"] == "/home/pi/modelreg/state"

    # an S3 or HTTP sink is no path to open
    s3 = _edge_yaml(tmp_path / "edge.yaml", report={"url": "s3://fleet/reports/"})
    text = systemd_unit(PurePosixPath("/etc/modelreg/edge.yaml"), "/usr/bin/modelreg",
                        load_edge_config(s3))  # fmt: skip
    assert "ReadWritePaths" not in _unit(text)["Service"]
    bad = _edge_yaml(tmp_path / "edge.yaml", state_dir="/srv/state %h")
    with pytest.raises(UsageError, match="without quoting or expansion"):
        systemd_unit(PurePosixPath("/etc/modelreg/edge.yaml"), "/usr/bin/modelreg",
                     load_edge_config(bad))  # fmt: skip


def test_edge_unit_prints_the_unit_of_a_config_that_loads(cli: Any, tmp_path: Path) -> None:
    edge = _edge_yaml(tmp_path / "srv/edge.yaml", state_dir="/srv/modelreg")
    r = cli("edge", "unit", "--config", str(edge), "--exec", "/opt/bin/modelreg", cwd=tmp_path)
    assert r.code == 0, r.err
    assert f"ExecStart=/opt/bin/modelreg edge run --config {edge}\n" in r.out
    assert "ReadWritePaths=/srv/modelreg\n" in r.out
    # a config that does not exist, or does not load, is refused in one line
    missing = tmp_path / "nowhere/edge.yaml"
    r = cli("edge", "unit", "--config", str(missing), cwd=tmp_path)
    assert (r.code, r.out) == (1, "")
    (line,) = r.err.strip().splitlines()
    assert str(missing) in line
    assert "not found" in line
    edge.write_text(edge.read_text().replace('"/srv/modelreg"', '"/srv/modelreg", "x": 1'))
    r = cli("edge", "unit", "--config", str(edge), cwd=tmp_path)
    assert (r.code, r.out) == (1, "")
    (line,) = r.err.strip().splitlines()
    assert line.startswith(f"{edge}:1:")
    assert "x" in line


@pytest.mark.integration
def test_the_daemon_tells_systemd_it_is_ready_and_stopping(rig: EdgeRig) -> None:
    address = rig.tmp / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(address))
        sock.settimeout(60)
        config = rig.config(repository={"url": str(rig.root), "poll_interval": "1h"})
        env = {**os.environ, "NOTIFY_SOCKET": str(address)}
        with config.with_suffix(".log").open("w") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "modelreg", "edge", "run", "--config", str(config)],
                stdout=log, stderr=subprocess.STDOUT, env=env,
            )  # fmt: skip
        try:
            messages: list[str] = []
            deadline = time.monotonic() + 60
            while not any("STATUS=last sync" in m for m in messages):
                assert time.monotonic() < deadline, messages
                messages.append(sock.recv(4096).decode())
            assert messages[0].startswith("READY=1\n"), messages
            assert "STATUS=last sync: updated" in messages[-1]
            proc.send_signal(signal.SIGTERM)
            assert sock.recv(4096).decode() == "STOPPING=1"
            assert proc.wait(timeout=30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _received(
    sock: socket.socket, seconds: float, until: str | None = None
) -> list[tuple[float, str]]:
    """What systemd would receive over ``seconds``, with when (up to the message
    ``until``, when it comes sooner)."""
    got: list[tuple[float, str]] = []
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            got.append((time.monotonic(), sock.recv(4096).decode()))
        except TimeoutError:
            break
        if got[-1][1] == until:
            break
    return got


@pytest.mark.integration
def test_the_daemon_feeds_systemds_watchdog_while_idle(rig: EdgeRig) -> None:
    """A long idle wait (poll interval 1 h) still pings well within WatchdogSec."""
    address = rig.tmp / "notify.sock"
    period_s = 2.0  # the loop wakes every second: a gap of two would be a missed ping
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(address))
        config = rig.config(repository={"url": str(rig.root), "poll_interval": "1h"})
        env = {**os.environ, "NOTIFY_SOCKET": str(address),
               "WATCHDOG_USEC": str(int(period_s * 1e6))}  # fmt: skip
        with config.with_suffix(".log").open("w") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "modelreg", "edge", "run", "--config", str(config)],
                stdout=log, stderr=subprocess.STDOUT, env=env,
            )  # fmt: skip
        try:
            sock.settimeout(120)
            while "STATUS=last sync" not in sock.recv(4096).decode():
                pass
            idle = _received(sock, 3 * period_s)
            pings = [at for at, message in idle if message == "WATCHDOG=1"]
            assert len(pings) >= 3, idle
            gaps = [b - a for a, b in itertools.pairwise(pings)]
            assert max(gaps) < period_s, gaps  # systemd would have killed it otherwise
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.mark.integration
def test_a_stuck_loop_does_not_feed_the_watchdog(
    rig: EdgeRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pings come from the loop itself, not from a thread beside it: while the loop
    is stuck (here in its sync callback) systemd hears nothing, and would restart it."""
    import threading

    from edge_sync.config import load_edge_config
    from edge_sync.daemon import Daemon

    address = rig.tmp / "notify.sock"
    stuck, entered = threading.Event(), threading.Event()

    def hang(_report: object) -> None:
        if not stuck.is_set():
            entered.set()
            assert stuck.wait(120)

    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(address))
        monkeypatch.setenv("NOTIFY_SOCKET", str(address))
        monkeypatch.setenv("WATCHDOG_USEC", "1000000")
        monkeypatch.delenv("WATCHDOG_PID", raising=False)
        config = load_edge_config(rig.config(repository={"url": str(rig.root),
                                                         "poll_interval": "1h"}))  # fmt: skip
        daemon = Daemon(config, serving=False, on_sync=hang)
        thread = threading.Thread(target=daemon.run, kwargs={"install_signals": False},
                                  daemon=True)  # fmt: skip
        thread.start()
        try:
            assert entered.wait(120)
            _received(sock, 0.2)  # what was sent before the loop got stuck
            during = _received(sock, 3.0)  # three periods of systemd's watchdog
            assert [m for _, m in during if "WATCHDOG" in m] == []
            stuck.set()
            after = _received(sock, 3.0, until="WATCHDOG=1")
            assert [m for _, m in after if m == "WATCHDOG=1"], after
        finally:
            stuck.set()
            daemon.stop()
            thread.join(timeout=60)
            assert not thread.is_alive()


def test_the_watchdog_follows_what_systemd_asks() -> None:
    sent: list[str] = []
    now = [0.0]
    dog = Watchdog({"WATCHDOG_USEC": "2000000"}, send=sent.append, clock=lambda: now[0])
    assert (dog.period_s, dog.wait_s) == (2.0, 1.0)
    dog.ping()
    dog.ping()  # at most four times a period: a download's chunks do not flood systemd
    now[0] = 0.5
    dog.ping()
    assert sent == ["WATCHDOG=1", "WATCHDOG=1"]
    for env in ({}, {"WATCHDOG_USEC": "0"}, {"WATCHDOG_USEC": "x"},
                {"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid() + 1)}):  # fmt: skip
        off = Watchdog(env, send=sent.append)
        off.ping()
        assert (off.period_s, off.wait_s) == (None, float("inf")), env
    assert len(sent) == 2
    own = Watchdog({"WATCHDOG_USEC": "1000", "WATCHDOG_PID": str(os.getpid())})
    assert own.period_s == 0.001
