"""Unreachable services fail in bounded time with one line: MLflow, DVC remotes.

Every command here runs as a real subprocess, so the time measured includes the
start-up a user waits for too.  The bounds asserted are generous (30 s, the issue's
limit); the figures measured are in the commit that added them.
"""

from __future__ import annotations

import json
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipelines.register._http import MlflowLimits, bounded_client, unreachable
from tests.conftest import Result, git, run_modelreg

pytestmark = pytest.mark.integration

LIMIT_S = 30.0


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def closed_url() -> str:
    """An MLflow URL on a loopback port nobody listens on (connection refused)."""
    return f"http://127.0.0.1:{_closed_port()}"


@pytest.fixture
def blackhole_url() -> Iterator[str]:
    """A port that listens but never accepts nor answers: the kernel completes the
    handshake, then the request meets silence (a hung server, a dropped route)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def fleet(_released_template: Path, tmp_path: Path) -> Path:
    """A copy of the released fleet (mlp 1.0.0 released and mirrored)."""
    root = tmp_path / "fleet"
    shutil.copytree(_released_template, root, symlinks=True)
    return root


def _timed(*args: str, cwd: Path, env: dict[str, str] | None = None) -> tuple[float, Result]:
    start = time.monotonic()
    result = run_modelreg(*args, cwd=cwd, env=env)
    return time.monotonic() - start, result


@pytest.mark.parametrize("kind", ["closed", "blackhole"])
def test_register_fails_fast_with_one_line(
    fleet: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    url: str = request.getfixturevalue(f"{kind}_url")
    # credentials in the URI never reach the output
    with_secret = url.replace("http://", "http://ci-bot:s3cr3t-pw@")
    elapsed, r = _timed("register", "--tracking-uri", with_secret, cwd=fleet)
    assert r.code == 1
    assert r.err.splitlines() == [
        f"modelreg: MLflow at {url.replace('http://', 'http://***@')}: unreachable ("
        + ("connection refused)" if kind == "closed" else "no answer within 10 s)")
    ]
    assert "s3cr3t" not in r.out + r.err
    assert elapsed < LIMIT_S


def test_status_and_check_fail_fast_on_a_silent_server(fleet: Path, blackhole_url: str) -> None:
    env = {"MLFLOW_TRACKING_URI": blackhole_url}
    for args in (("status", "--mlflow"), ("register", "--check")):
        elapsed, r = _timed(*args, cwd=fleet, env=env)
        assert r.code == 1, args
        assert r.err.splitlines() == [
            f"modelreg: MLflow at {blackhole_url}: unreachable (no answer within 10 s)"
        ], args
        assert elapsed < LIMIT_S, args


def test_ci_release_fails_fast_when_mlflow_is_unreachable(fleet: Path, closed_url: str) -> None:
    env = {"MLFLOW_TRACKING_URI": closed_url, "CI": "true"}
    elapsed, r = _timed("ci", "release", "--json", cwd=fleet, env=env)
    assert r.code == 1
    report = json.loads(r.out)
    assert report["problems"] == [f"MLflow at {closed_url}: unreachable (connection refused)"]
    assert elapsed < LIMIT_S
    assert git(fleet, "status", "--porcelain", "--", "manifests", "trust") == ""


def test_probe_passes_any_http_answer_and_skips_local_stores() -> None:
    from tests.github_fake import fake_github

    with fake_github() as fake:  # answers 404 to /health: a server is there
        assert unreachable(fake.url) is None
        assert fake.requests == ["/health"]
    assert unreachable("sqlite:////nonexistent/mlflow.db") is None
    assert unreachable("databricks") is None


def test_probe_retries_a_refused_connection_once(closed_url: str) -> None:
    limits = MlflowLimits(probe_attempts=2, probe_pause=0.2)
    start = time.monotonic()
    assert unreachable(closed_url, limits) == "unreachable (connection refused)"
    assert 0.2 <= time.monotonic() - start < 5


def test_client_limits_respect_the_users_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "9")
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_TIMEOUT", raising=False)
    with bounded_client(MlflowLimits(max_retries=1, request_timeout=7)):
        assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "9"
        assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "7"
    assert "MLFLOW_HTTP_REQUEST_TIMEOUT" not in os.environ
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "9"


def _point_dvc_at(fleet: Path, url: str) -> None:
    """Make ``url`` the default DVC remote and lose the local copies of mlp 1.0.0."""
    from pipelines import dvc

    dvc.set_remote(fleet, "far", url)
    (fleet / "models/mlp/1.0.0.onnx").unlink()
    shutil.rmtree(fleet / ".dvc/cache")


@pytest.mark.parametrize("kind", ["closed", "blackhole"])
def test_a_build_that_must_pull_from_a_dead_remote_fails_fast(
    fleet: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    url: str = request.getfixturevalue(f"{kind}_url")
    _point_dvc_at(fleet, url.replace("http://", "http://ci:hunter2@") + "/store")
    elapsed, r = _timed("build", cwd=fleet)
    assert r.code == 1
    why = "connection refused" if kind == "closed" else "no answer within 10 s"
    shown = url.replace("http://", "http://***@")
    expected = (
        "models/mlp/1.0.0.onnx: missing from the workspace and the DVC cache; "
        f"DVC remote 'far' at {shown}/store: unreachable ({why})"
    )
    assert r.err.splitlines() == [expected]
    assert "hunter2" not in r.out + r.err
    assert elapsed < LIMIT_S


def test_a_push_to_a_silent_remote_fails_fast(fleet: Path, blackhole_url: str) -> None:
    from pipelines import dvc
    from registry.errors import ToolError

    dvc.set_remote(fleet, "far", blackhole_url)
    start = time.monotonic()
    with pytest.raises(ToolError) as info:
        dvc.push(fleet)
    assert time.monotonic() - start < LIMIT_S
    assert str(info.value) == (
        f"DVC remote 'far' at {blackhole_url}: unreachable (no answer within 10 s)"
    )


def test_a_pull_from_the_cache_does_not_ask_the_remote(fleet: Path, blackhole_url: str) -> None:
    from pipelines import dvc
    from pipelines.fetch import fetch_artifact

    dvc.set_remote(fleet, "far", blackhole_url)
    (fleet / "models/mlp/1.0.0.onnx").unlink()  # still in DVC's cache
    start = time.monotonic()
    fetched = fetch_artifact(fleet, "models/mlp/1.0.0.onnx", "models/mlp/1.0.0.onnx")
    assert fetched.fetched
    assert time.monotonic() - start < 5  # no 10 s probe of the silent remote


def test_network_remotes_get_timeouts_unless_configured(fleet: Path, closed_url: str) -> None:
    from pipelines import dvc

    dvc.set_remote(fleet, "far", closed_url)
    repo = dvc.bounded_repo(fleet, probe=False)
    try:
        assert repo.config["remote"]["far"]["connect_timeout"] == 10
        assert repo.config["remote"]["far"]["read_timeout"] == 60
    finally:
        repo.close()
    with (fleet / ".dvc/config").open("a") as fh:
        fh.write("    read_timeout = 600\n")  # the user's choice stands
    repo = dvc.bounded_repo(fleet, probe=False)
    try:
        assert repo.config["remote"]["far"]["read_timeout"] == 600
    finally:
        repo.close()
    assert "connect_timeout" not in (fleet / ".dvc/config").read_text()
