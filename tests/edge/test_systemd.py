"""On a real device: the systemd unit shipped with the package, and the daemon's
readiness and status through the ``NOTIFY_SOCKET`` protocol (issue 9, point 7)."""

from __future__ import annotations

import configparser
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from edge_sync.daemon import systemd_unit
from registry.errors import UsageError
from tests.edge.conftest import EdgeRig


def _unit(text: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None, comment_prefixes="#")
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(text)
    return parser


def test_the_unit_runs_the_daemon_as_a_sandboxed_notify_service(tmp_path: Path) -> None:
    text = systemd_unit(Path("/etc/modelreg/edge.yaml"), "/usr/local/bin/modelreg")
    unit = _unit(text)
    service = unit["Service"]
    assert service["Type"] == "notify"
    assert (
        service["ExecStart"] == "/usr/local/bin/modelreg edge run --config /etc/modelreg/edge.yaml"
    )
    assert service["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert service["Restart"] == "on-failure"
    assert service["StateDirectory"] == "modelreg"
    for hardening in ("NoNewPrivileges", "ProtectHome", "PrivateTmp", "ProtectKernelModules"):
        assert service[hardening] == "yes", hardening
    assert service["ProtectSystem"] == "strict"
    assert unit["Install"]["WantedBy"] == "multi-user.target"
    assert "@" not in text.replace("@system-service", "")  # every placeholder filled
    analyze = shutil.which("systemd-analyze")
    if analyze:  # where systemd is installed, it must accept the unit
        path = tmp_path / "modelreg-edge.service"
        path.write_text(text)
        subprocess.run([analyze, "verify", str(path)], check=False, capture_output=True)
    with pytest.raises(UsageError):
        systemd_unit(Path("/etc/model reg/edge.yaml"), "/usr/bin/modelreg")
    with pytest.raises(UsageError):
        systemd_unit(Path("/etc/modelreg/edge.yaml"), "/usr/bin/$(reboot)")


def test_edge_unit_prints_the_unit(cli: Any, tmp_path: Path) -> None:
    r = cli("edge", "unit", "--config", "/srv/edge.yaml", "--exec", "/opt/bin/modelreg",
            cwd=tmp_path)  # fmt: skip
    assert r.code == 0, r.err
    assert "ExecStart=/opt/bin/modelreg edge run --config /srv/edge.yaml\n" in r.out


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
