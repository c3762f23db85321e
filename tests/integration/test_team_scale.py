"""MLflow as a team runs it: a tracking server on PostgreSQL with its artifacts in S3.

Real components on loopback (``tests/services.py``): a PostgreSQL cluster of the test's
own, moto's S3 server and two ``mlflow server`` processes sharing one database, one
proxying artifacts to S3 (``--artifacts-destination``: clients hold no S3 credentials),
one sending its clients to S3 directly (``--default-artifact-root``: they do).  A
:class:`FaultProxy` in front of MLflow and of S3 stops PostgreSQL, cuts S3, answers
5xx or stalls at a chosen request, so that the failure tests hit the middle of a
release and then prove the next run completes the mirror with no duplicate.

The services start once, in the one xdist worker that runs these tests (they share
an ``xdist_group``; ``make test`` distributes with ``--dist loadgroup``): ~30 s, more on
a loaded machine.  Where they cannot start (PostgreSQL not installed) the tests skip with the reason, except in CI
(``CI=true``), where that is a failure: ``.ci/run`` installs PostgreSQL.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import git, quiet_mlflow, run_modelreg
from tests.services import (
    S3_CREDENTIALS,
    ArtifactMode,
    Fault,
    FaultProxy,
    MlflowServer,
    Postgres,
    ServiceUnavailable,
    mlflow_servers,
    postgres,
    s3_server,
)

# One worker runs them all (`--dist loadgroup`, see the Makefile): the services start once.
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("team-services")]

# Read at import: the autouse fixture of tests/conftest.py unsets CI inside each test.
_IN_CI = os.environ.get("CI") == "true"
BUCKET = "team-mlflow"
CREATE_VERSION = "/api/2.0/mlflow/model-versions/create"
ARTIFACT_UPLOAD = "/api/2.0/mlflow-artifacts/artifacts/"
TRACKING_USER, TRACKING_PASSWORD = "ci-bot", "tracking-password-not-to-be-printed"


@dataclass(frozen=True)
class Team:
    """The running services.

    Attributes:
        pg: the PostgreSQL cluster behind both servers.
        s3: moto's endpoint (for looking at the bucket).
        s3_gate: the proxy every S3 client goes through (servers and direct clients).
        servers: the two MLflow servers by artifact mode.
    """

    pg: Postgres
    s3: str
    s3_gate: FaultProxy
    servers: dict[ArtifactMode, MlflowServer]


@pytest.fixture(scope="session")
def team(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Team]:
    logs = tmp_path_factory.mktemp("team-services")
    with contextlib.ExitStack() as stack:
        try:
            pg = stack.enter_context(postgres())
            pg.create_database("mlflow")
            s3 = stack.enter_context(s3_server(BUCKET))
            gate = stack.enter_context(FaultProxy(s3))
            servers = stack.enter_context(
                mlflow_servers(
                    pg.url("mlflow"),
                    gate.url,
                    {"proxied": f"s3://{BUCKET}/proxied", "direct": f"s3://{BUCKET}/direct"},
                    logs,
                )
            )
        except ServiceUnavailable as e:
            if _IN_CI:
                pytest.fail(f"CI=true: the team-scale services must run here: {e}")
            pytest.skip(f"team-scale services unavailable here: {e}")
        yield Team(pg, s3, gate, servers)


@pytest.fixture
def s3_gate(team: Team) -> Iterator[FaultProxy]:
    """The S3 proxy, healthy again after the test whatever it did."""
    yield team.s3_gate
    team.s3_gate.down = False
    team.s3_gate.faults.clear()


def _point_at(monkeypatch: pytest.MonkeyPatch, team: Team, mode: ArtifactMode, uri: str) -> None:
    """The environment of a CI job using ``uri``: S3 credentials only where the client
    writes to S3 itself."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    for var in (*S3_CREDENTIALS, "MLFLOW_S3_ENDPOINT_URL"):
        monkeypatch.delenv(var, raising=False)
    if mode == "direct":
        for var, value in S3_CREDENTIALS.items():
            monkeypatch.setenv(var, value)
        monkeypatch.setenv("MLFLOW_S3_ENDPOINT_URL", team.s3_gate.url)


def _repo(tmp_path: Path, cli, example_models: Path, name: str, *, released: bool) -> Path:
    """A repository with ``name`` 1.0.0 on production and 1.1.0 on canary, committed."""
    root = tmp_path / "fleet"
    assert cli("init", str(root), cwd=tmp_path).code == 0
    assert cli("model", "add", name, "--channel-order", "canary,production", cwd=root).code == 0
    versions = ("1.0.0", "1.1.0") if released else ("1.0.0",)
    for version in versions:
        r = cli("version", "add", name, version, "--artifact",
                str(example_models / f"mlp/{version}.onnx"), cwd=root)  # fmt: skip
        assert r.code == 0, r.err
    assert cli("promote", name, "1.0.0", "-c", "canary", cwd=root).code == 0
    if released:
        assert cli("promote", name, "1.0.0", "-c", "production", cwd=root).code == 0
        assert cli("promote", name, "1.1.0", "-c", "canary", cwd=root).code == 0
    git(root, "add", "-A")
    git(root, "commit", "-qm", f"{name}: {', '.join(versions)}")
    return root


def _mirror(uri: str, name: str) -> tuple[dict[str, list[str]], dict[str, str]]:
    """MLflow's versions of ``name`` by modelreg SemVer tag (numbers), and its aliases."""
    with quiet_mlflow() as mlflow:
        client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
        by_semver: dict[str, list[str]] = {}
        for mv in client.search_model_versions(f"name = '{name}'"):
            by_semver.setdefault(mv.tags.get("modelreg.semver", "?"), []).append(str(mv.version))
        aliases = dict(client.get_registered_model(name).aliases)
    return {k: sorted(v) for k, v in by_semver.items()}, aliases


def _keys(endpoint: str, prefix: str) -> list[str]:
    import boto3

    s3 = boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id=S3_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1",
    )  # fmt: skip
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return [item["Key"] for page in pages for item in page.get("Contents", [])]


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


# --- 1. register, register --check, ci release, status --mlflow, load_model ------------


@pytest.mark.parametrize("mode", ["proxied", "direct"])
def test_a_release_mirrors_into_mlflow_on_postgres_with_s3_artifacts(
    mode: ArtifactMode, team: Team, tmp_path: Path, cli, *, example_models: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    server = team.servers[mode]
    name = f"mlp-{mode}"
    _point_at(monkeypatch, team, mode, server.url)
    root = _repo(tmp_path, cli, example_models, name, released=True)

    check = cli("register", "--check", cwd=root)
    assert check.code == 1
    assert f"{name}: registered model is missing in MLflow" in check.err

    r = cli("ci", "release", "--json", cwd=root)
    assert r.code == 0, r.err
    assert json.loads(r.out)["mlflow"]["uri"] == server.url
    assert _mirror(server.url, name) == (
        {"1.0.0": ["1"], "1.1.0": ["2"]},
        {"production": "1", "canary": "2"},
    )
    # The bytes went to the bucket under this server's prefix (no local artifacts).
    onnx_keys = [k for k in _keys(team.s3, f"{mode}/") if k.endswith(".onnx")]
    assert len(onnx_keys) >= 2, onnx_keys
    assert not (root / ".modelreg/mlartifacts").exists()

    assert cli("register", "--check", cwd=root).code == 0
    again = cli("register", cwd=root)
    assert again.code == 0, again.err
    assert again.out.endswith("2 versions, 0 changes\n")
    status = json.loads(cli("status", "--mlflow", "--json", cwd=root).out)
    rows = status["versions"] if isinstance(status, dict) else status
    assert {(row["version"], row["mlflow_version"]) for row in rows} == {
        ("1.0.0", "1"),
        ("1.1.0", "2"),
    }

    # Anyone loads the production model from a fresh process, with the usual variables
    # only (proxied: no S3 credentials at all).
    code = (
        "import hashlib, sys, mlflow.onnx\n"
        "m = mlflow.onnx.load_model(sys.argv[1])\n"
        "print(hashlib.sha256(m.SerializeToString()).hexdigest())\n"
    )
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}  # as _point_at left it
    loaded = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code, f"models:/{name}@production"],
        capture_output=True, text=True, env=env, check=False, timeout=120,
    )  # fmt: skip
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    import onnx

    want = onnx.load_model(str(example_models / "mlp/1.0.0.onnx")).SerializeToString()
    assert loaded.stdout.strip() == hashlib.sha256(want).hexdigest()


def test_credentials_come_from_the_environment_and_are_never_printed(
    team: Team, s3_gate: FaultProxy, tmp_path: Path, cli, *, example_models: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    # MLflow behind a gate that wants the team's basic-auth credentials, S3 direct.
    token = base64.b64encode(f"{TRACKING_USER}:{TRACKING_PASSWORD}".encode()).decode()
    with FaultProxy(team.servers["direct"].url, auth=f"Basic {token}") as tracking:
        _point_at(monkeypatch, team, "direct", tracking.url)
        root = _repo(tmp_path, cli, example_models, "mlp-secrets", released=False)
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", TRACKING_USER)
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", TRACKING_PASSWORD)
        s3_gate.down = True  # S3 cut: the error names S3's endpoint, not the keys
        failed = run_modelreg("register", cwd=root)
        s3_gate.down = False
        done = run_modelreg("register", "--json", cwd=root)
        assert done.code == 0, done.err
    # every request carried the team's credentials, taken from the environment
    api = [h for seen, h in zip(tracking.seen, tracking.headers_seen, strict=True)
           if " /api/" in seen]  # fmt: skip
    assert api
    assert {h.get("Authorization") for h in api} == {f"Basic {token}"}
    assert failed.code == 1
    line = _one_line(failed.err)
    assert line.startswith(f"modelreg: MLflow at {tracking.url}: cannot register mlp-secrets")
    secrets = (TRACKING_PASSWORD, token, S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
               S3_CREDENTIALS["AWS_ACCESS_KEY_ID"], team.pg.password)  # fmt: skip
    for result in (failed, done):
        for secret in secrets:
            assert secret not in result.out + result.err
    assert _mirror(team.servers["direct"].url, "mlp-secrets")[0] == {"1.0.0": ["1"]}


# --- 2. failures in the middle of a release ---------------------------------------------


@pytest.mark.slow
def test_postgres_down_mid_release_is_one_line_and_the_next_run_completes(
    team: Team, tmp_path: Path, cli, example_models: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = team.servers["proxied"]
    # PostgreSQL stops as the first model version is about to be created: the run and
    # its artifacts exist, the model version does not.
    fault = Fault("POST", CREATE_VERSION, before=team.pg.stop)
    with FaultProxy(server.url, faults=[fault]) as tracking:
        _point_at(monkeypatch, team, "proxied", tracking.url)
        root = _repo(tmp_path, cli, example_models, "mlp-pg", released=True)
        try:
            failed = cli("ci", "release", cwd=root)
        finally:
            team.pg.start()
        assert failed.code == 1
        line = _one_line(failed.err)
        assert f"MLflow at {tracking.url}: cannot register mlp-pg 1.0.0: " in line
        done = cli("ci", "release", "--json", cwd=root)
        assert done.code == 0, done.err
        assert cli("register", "--check", cwd=root).code == 0
    assert _mirror(server.url, "mlp-pg") == (
        {"1.0.0": ["1"], "1.1.0": ["2"]},
        {"production": "1", "canary": "2"},
    )


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["proxied", "direct"])
def test_s3_down_mid_upload_is_one_line_and_the_next_run_completes(
    mode: ArtifactMode, team: Team, s3_gate: FaultProxy, tmp_path: Path, cli, *,
    example_models: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    server = team.servers[mode]
    name = f"mlp-s3-{mode}"

    def cut() -> None:
        s3_gate.down = True

    # Proxied: S3 goes as the server receives the model's files; direct: as the run
    # that will upload them is created (the client's own S3 writes fail).
    where = ARTIFACT_UPLOAD if mode == "proxied" else "/api/2.0/mlflow/runs/create"
    method = "PUT" if mode == "proxied" else "POST"
    with FaultProxy(server.url, faults=[Fault(method, where, before=cut)]) as tracking:
        _point_at(monkeypatch, team, mode, tracking.url)
        root = _repo(tmp_path, cli, example_models, name, released=False)
        failed = cli("register", cwd=root)
        s3_gate.down = False
        assert failed.code == 1
        assert _one_line(failed.err).startswith(
            f"modelreg: MLflow at {tracking.url}: cannot register {name} 1.0.0: "
        )
        done = cli("register", cwd=root)
        assert done.code == 0, done.err
    assert _mirror(server.url, name) == ({"1.0.0": ["1"]}, {"canary": "1"})


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["5xx-after-commit", "slow-answer"])
def test_a_lost_answer_to_a_create_makes_no_duplicate_version(
    fault: str, team: Team, tmp_path: Path, cli, *, example_models: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    server = team.servers["proxied"]
    name = f"mlp-{fault}"
    # The version is created, but the client hears a 504 from a gateway, or nothing
    # within its timeout: MLflow's client alone would send the create again.
    injected: dict[str, Any] = (
        {"status_after": 504} if fault == "5xx-after-commit" else {"delay_s": 4.0}
    )
    if fault == "slow-answer":
        monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    with FaultProxy(server.url, faults=[Fault("POST", CREATE_VERSION, **injected)]) as tracking:
        _point_at(monkeypatch, team, "proxied", tracking.url)
        root = _repo(tmp_path, cli, example_models, name, released=False)
        r = cli("register", cwd=root)
        assert r.code == 0, r.err
        assert sum(CREATE_VERSION in s for s in tracking.seen) == 1, tracking.seen
        assert cli("register", "--check", cwd=root).code == 0
    assert _mirror(server.url, name) == ({"1.0.0": ["1"]}, {"canary": "1"})
