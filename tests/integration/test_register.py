"""``modelreg register`` against real MLflow: the embedded sqlite store and a real server."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from modelreg.cli.main import cli as group
from modelreg.cli.register_cmd import register as register_command
from pipelines.register import ReleaseExtras, check_drift, register
from tests.conftest import REPO_ROOT, git, quiet_mlflow
from tests.services import free_port

pytestmark = pytest.mark.integration

if "register" not in group.commands:  # main.py may register it itself one day
    group.add_command(register_command)

FIX = (
    "to fix: run `modelreg register` (Git decides: it sets tags, descriptions, metrics and "
    "aliases back and registers missing versions)"
)
CI_ENV = {
    "GITHUB_RUN_ID": "4242",
    "GITHUB_SERVER_URL": "https://github.example",
    "GITHUB_REPOSITORY": "acme/models",
}


def _client(uri: str) -> Any:
    with quiet_mlflow() as mlflow:
        return mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)


def _versions(client: Any, name: str = "mlp") -> dict[str, Any]:
    """MLflow versions of ``name`` by their semver tag (or 'untagged-<n>')."""
    with quiet_mlflow():
        found = client.search_model_versions(f"name = '{name}'")
    return {v.tags.get("modelreg.semver", f"untagged-{v.version}"): v for v in found}


def _aliases(client: Any, name: str = "mlp") -> dict[str, str]:
    with quiet_mlflow():
        model = client.get_registered_model(name)
    return {a: str(v) for a, v in model.aliases.items()}


@pytest.fixture
def released(tmp_path: Path, cli, example_models: Path) -> Path:
    """mlp 1.0.0 and 1.1.0 committed; production serves 1.0.0, canary 1.1.0."""
    root = tmp_path / "models-repo"
    assert cli("init", str(root), cwd=tmp_path).code == 0
    assert cli("model", "add", "mlp", "--task", "classification",
               "--channel-order", "canary,production", cwd=root).code == 0  # fmt: skip
    for version in ("1.0.0", "1.1.0"):
        r = cli("version", "add", "mlp", version,
                "--artifact", str(example_models / f"mlp/{version}.onnx"), cwd=root)  # fmt: skip
        assert r.code == 0, r.err
    for version, channel in (("1.0.0", "canary"), ("1.0.0", "production"), ("1.1.0", "canary")):
        r = cli("promote", "mlp", version, "--channel", channel, cwd=root)
        assert r.code == 0, r.err
    git(root, "add", "-A")
    git(root, "commit", "-qm", "mlp 1.0.0 in production, 1.1.0 in canary")
    return root


def _check_registered(
    root: Path, uri: str, client: Any, example_models: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    versions = _versions(client)
    assert sorted(versions) == ["1.0.0", "1.1.0"]
    assert _aliases(client) == {
        "production": str(versions["1.0.0"].version),
        "canary": str(versions["1.1.0"].version),
    }
    head = git(root, "rev-parse", "HEAD").strip()
    for semver, mv in versions.items():
        data = (example_models / f"mlp/{semver}.onnx").read_bytes()
        assert mv.tags["modelreg.semver"] == semver
        assert mv.tags["modelreg.git_commit"] == head
        assert mv.tags["modelreg.sha256"] == hashlib.sha256(data).hexdigest()
        assert mv.tags["modelreg.dvc_md5"] == hashlib.md5(data, usedforsecurity=False).hexdigest()
    assert "modelreg.parent" not in versions["1.0.0"].tags
    assert versions["1.1.0"].tags["modelreg.parent"] == "1.0.0"
    # What anyone does with a registry: load a model by alias, with plain MLflow.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    with quiet_mlflow() as mlflow:
        import mlflow.onnx

        prod = mlflow.onnx.load_model("models:/mlp@production")
        canary = mlflow.onnx.load_model("models:/mlp@canary")
    assert prod.SerializeToString() == (example_models / "mlp/1.0.0.onnx").read_bytes()
    assert canary.SerializeToString() == (example_models / "mlp/1.1.0.onnx").read_bytes()


def _snapshot(client: Any) -> tuple[Any, ...]:
    with quiet_mlflow():
        model = client.get_registered_model("mlp")
    versions = _versions(client)
    return (
        model.last_updated_timestamp,
        dict(model.aliases),
        sorted((k, v.version, v.last_updated_timestamp, dict(v.tags)) for k, v in versions.items()),
    )


def test_register_embedded_store_mirrors_git(
    released: Path, cli, tmp_path: Path, example_models: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = tmp_path / "1.1.0.onnx.sig"
    bundle.write_text('{"mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json"}\n')
    report_md = tmp_path / "diff-1.1.0.md"
    report_md.write_text("# mlp 1.0.0 -> 1.1.0\n\n2 tensors changed\n")
    extras = {("mlp", "1.1.0"): ReleaseExtras(bundle, report_md, "2 of 8 tensors changed")}

    report = register(released, extras=extras, env=CI_ENV)

    db = released / ".modelreg/mlflow.db"
    uri = f"sqlite:///{db}"
    assert db.is_file()
    assert report.tracking_uri == uri
    assert not report.drifts
    assert [str(c) for c in report.changes] == [
        "mlp: created the registered model",
        "mlp 1.0.0: registered as MLflow version 1",
        "mlp 1.1.0: registered as MLflow version 2",
        "mlp@canary: -> MLflow version 2 (1.1.0)",
        "mlp@production: -> MLflow version 1 (1.0.0)",
    ]
    assert dict(report.versions) == {("mlp", "1.0.0"): "1", ("mlp", "1.1.0"): "2"}
    client = _client(uri)
    _check_registered(released, uri, client, example_models, monkeypatch)
    v11 = _versions(client)["1.1.0"]
    assert v11.tags["modelreg.ci_run_id"] == "4242"
    assert v11.tags["modelreg.ci_run_url"] == "https://github.example/acme/models/actions/runs/4242"
    assert v11.tags["modelreg.bundle_digest"] == hashlib.sha256(bundle.read_bytes()).hexdigest()
    assert v11.tags["modelreg.diff_summary"] == "2 of 8 tensors changed"
    with quiet_mlflow():
        attached = {a.path for a in client.list_artifacts(v11.run_id, "modelreg")}
    assert attached == {"modelreg/1.1.0.onnx.sig", "modelreg/diff-1.1.0.md"}
    # artifacts stay inside the repository's ignored state folder
    assert list((released / ".modelreg/mlartifacts").rglob("model.onnx"))
    assert not (released / "mlruns").exists()

    # Second run, through the CLI, without the CI facts: nothing changes.
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    before = _snapshot(client)
    again = cli("register", cwd=released)
    assert again.code == 0, again.err
    assert again.out.splitlines() == [f"MLflow at {uri} mirrors Git: 2 versions, 0 changes"]
    assert _snapshot(client) == before
    assert cli("register", "--check", cwd=released).code == 0

    # Dropping a channel in Git drops its alias.
    model_yaml = released / "manifests/mlp/model.yaml"
    doc = yaml.safe_load(model_yaml.read_text())
    assert set(doc["spec"]["channels"]) == {"canary", "production"}
    model_yaml.write_text(
        "\n".join(ln for ln in model_yaml.read_text().splitlines() if "canary: 1.1.0" not in ln)
        + "\n"
    )
    assert set(yaml.safe_load(model_yaml.read_text())["spec"]["channels"]) == {"production"}
    check = cli("register", "--check", cwd=released)
    assert check.code == 1
    assert check.err.splitlines() == [
        "mlp@canary: alias points at MLflow version 2 (1.1.0); Git declares no channel 'canary'",
        FIX,
    ]
    dropped = cli("register", cwd=released)
    assert dropped.code == 0, dropped.err
    assert dropped.out.splitlines()[0] == "mlp@canary: removed (no such channel)"
    assert _aliases(client) == {"production": "1"}


def test_check_reports_hand_edits_and_register_repairs_them(
    released: Path, cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = f"sqlite:///{released / '.modelreg/mlflow.db'}"
    fresh = cli("register", "--check", cwd=released)
    assert fresh.code == 1
    assert fresh.err.splitlines()[:3] == [
        "mlp: registered model is missing in MLflow",
        "mlp 1.0.0: not registered in MLflow",
        "mlp 1.1.0: not registered in MLflow",
    ]
    assert not (released / ".modelreg/mlflow.db").exists()  # a check creates nothing
    first = cli("register", cwd=released)
    assert first.code == 0, first.err

    # Hand edits, as someone with the MLflow UI would make them.  The SQL registry
    # store resolves logged models through the process-wide tracking URI.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    client = _client(uri)
    v1, v2 = _versions(client)["1.0.0"], _versions(client)["1.1.0"]
    sha = v1.tags["modelreg.sha256"]
    with quiet_mlflow():
        client.set_registered_model_alias("mlp", "production", v2.version)
        client.set_registered_model_alias("mlp", "staging", v1.version)
        client.delete_model_version_tag("mlp", v1.version, "modelreg.sha256")
        client.set_model_version_tag("mlp", v2.version, "modelreg.semver", "9.9.9")
        stray = client.create_model_version("mlp", source=v1.source, model_id=v1.model_id)

    check = cli("register", "--check", cwd=released)
    assert check.code == 1
    assert check.out == ""
    assert check.err.splitlines() == [
        "mlp MLflow version 3: no manifest declares it (no modelreg.semver tag)",
        f"mlp 1.0.0: MLflow version 1: tag modelreg.sha256 is missing, Git says {sha!r}",
        "mlp 1.1.0: MLflow version 2: tag modelreg.semver is '9.9.9', Git says '1.1.0'",
        "mlp@production: alias points at MLflow version 2 (1.1.0); Git says MLflow version 1 (1.0.0)",
        "mlp@staging: alias points at MLflow version 1 (1.0.0); Git declares no channel 'staging'",
        FIX + "; MLflow versions that no manifest declares are never deleted by modelreg: "
        "delete them in MLflow, or declare them with `modelreg version add`",
    ]
    assert [d.kind for d in check_drift(released)] == [
        "version-unknown", "tag-missing", "tag-differs", "alias-moved", "alias-extra",
    ]  # fmt: skip

    # register repairs what Git decides, and leaves the stray version to a human.
    repaired = cli("register", cwd=released)
    assert repaired.code == 1
    assert repaired.out.splitlines() == [
        "mlp 1.0.0: MLflow version 1: set modelreg.sha256",
        "mlp 1.1.0: MLflow version 2: set modelreg.semver",
        "mlp@production: -> MLflow version 1 (1.0.0)",
        "mlp@staging: removed (no such channel)",
    ]
    assert repaired.err.splitlines() == [
        "mlp MLflow version 3: no manifest declares it (no modelreg.semver tag)"
    ]
    assert _aliases(client) == {"production": "1", "canary": "2"}
    with quiet_mlflow():
        client.delete_model_version("mlp", stray.version)
    clean = cli("register", "--check", "--json", cwd=released)
    assert clean.code == 0, clean.err
    assert clean.out.strip().startswith('{\n  "ok": true')


def test_register_refuses_invalid_or_missing_artifacts(released: Path, cli) -> None:
    subprocess.run([str(REPO_ROOT / ".venv/bin/dvc"), "push", "-q"], cwd=released, check=True)
    artifact = released / "models/mlp/1.1.0.onnx"
    data = artifact.read_bytes()
    artifact.write_bytes(data + b"\x00")
    r = cli("register", "--check", cwd=released)
    assert r.code == 1
    assert r.err.startswith("modelreg: models/mlp/1.1.0.onnx: differs from its DVC pointer")
    r = cli("register", cwd=released)
    assert r.code == 1
    assert "does not match models/mlp/1.1.0.onnx.dvc" in r.err
    artifact.unlink()
    r = cli("register", "--check", cwd=released)  # a check pulls nothing
    assert r.code == 1
    assert r.err.strip() == (
        "modelreg: models/mlp/1.1.0.onnx: not in the workspace; run `dvc pull` first"
    )
    assert not artifact.exists()
    assert not (released / ".modelreg/mlflow.db").exists()
    bad = cli("register", "--bundle", "mlp=1.0.0", cwd=released)
    assert bad.code == 2
    # like a CI job on a fresh checkout, register pulls what it must read through DVC
    shutil.rmtree(released / ".dvc/cache")
    r = cli("register", cwd=released)
    assert r.code == 0, r.err
    assert artifact.read_bytes() == data
    # and says so in one line when DVC cannot restore it either
    artifact.unlink()
    shutil.rmtree(released / ".dvc/cache")
    shutil.rmtree(released / ".modelreg/remote")
    r = cli("register", cwd=released)
    assert r.code == 1
    assert r.err.startswith(
        "modelreg: models/mlp/1.1.0.onnx: missing from the workspace, the DVC cache and "
        "the DVC remote"
    ), r.err
    assert len(r.err.strip().splitlines()) == 1


def test_pipelines_import_without_mlflow() -> None:
    code = (
        "import sys, pipelines.register, modelreg.cli.register_cmd;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'mlflow'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --- a real MLflow tracking server ------------------------------------------------------


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``mlflow server`` on loopback with a sqlite backend and proxied artifacts."""
    base = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    log = (base / "server.log").open("wb")
    argv = [
        str(Path(sys.executable).with_name("mlflow")), "server",
        "--backend-store-uri", f"sqlite:///{base / 'mlflow.db'}",
        "--artifacts-destination", str(base / "artifacts"),
        "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
    ]  # fmt: skip
    env = {**os.environ, "HOME": str(base), "MLFLOW_DISABLE_TELEMETRY": "true"}
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=base,
                            start_new_session=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                pytest.fail(f"mlflow server exited: {(base / 'server.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:  # noqa: S310
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"mlflow server not up in 60 s: {(base / 'server.log').read_text()}")
            time.sleep(0.25)
        yield url
    finally:
        # The server runs workers in its own process group: stop the whole group.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


@pytest.mark.slow
def test_register_against_real_mlflow_server(
    released: Path, cli, mlflow_server: str, example_models: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = cli("register", "--tracking-uri", mlflow_server, "--json", cwd=released)
    assert r.code == 0, r.err
    assert '"tracking_uri": "' + mlflow_server in r.out
    client = _client(mlflow_server)
    _check_registered(released, mlflow_server, client, example_models, monkeypatch)
    # nothing stored in the repository: the server keeps the artifacts
    assert not (released / ".modelreg/mlflow.db").exists()
    assert not (released / ".modelreg/mlartifacts").exists()
    before = _snapshot(client)
    again = cli("register", cwd=released)  # MLFLOW_TRACKING_URI now names the server
    assert again.code == 0, again.err
    assert again.out.endswith("2 versions, 0 changes\n")
    assert _snapshot(client) == before
    with quiet_mlflow():
        client.set_registered_model_alias("mlp", "production", _versions(client)["1.1.0"].version)
    check = cli("register", "--check", cwd=released)
    assert check.code == 1
    assert check.err.splitlines() == [
        "mlp@production: alias points at MLflow version 2 (1.1.0); Git says MLflow version 1 (1.0.0)",
        FIX,
    ]


def test_a_deprecation_is_mirrored_as_a_tag_and_its_removal_too(
    released: Path, cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = f"sqlite:///{released / '.modelreg/mlflow.db'}"
    assert cli("register", cwd=released).code == 0
    assert cli("promote", "mlp", "1.0.0", "-c", "canary", cwd=released).code == 0
    r = cli("version", "deprecate", "mlp", "1.1.0", "--reason", "bad recall", cwd=released)
    assert r.code == 0, r.err
    git(released, "commit", "-qm", "deprecate 1.1.0")
    drift = cli("register", "--check", cwd=released)
    assert drift.code == 1
    assert (
        "mlp 1.1.0: MLflow version 2: tag modelreg.deprecated is missing, Git says 'bad recall'"
        in (drift.err)
    )
    assert cli("register", cwd=released).code == 0
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    client = _client(uri)
    assert _versions(client)["1.1.0"].tags["modelreg.deprecated"] == "bad recall"
    assert "modelreg.deprecated" not in _versions(client)["1.0.0"].tags
    path = released / "manifests/mlp/versions/1.1.0.yaml"
    path.write_text(path.read_text().replace("deprecated:\n    reason: bad recall\n", ""))
    git(released, "commit", "-qam", "1.1.0 is fine after all")
    assert cli("register", cwd=released).code == 0
    assert "modelreg.deprecated" not in _versions(client)["1.1.0"].tags


def test_show_names_the_mlflow_version_of_a_version_and_of_a_model(released: Path, cli) -> None:
    import json

    before = json.loads(cli("show", "mlp:1.1.0", "--mlflow", "--json", cwd=released).out)
    assert before["mlflow_version"] is None  # not registered yet (and nothing created)
    assert not (released / ".modelreg/mlflow.db").exists()
    assert cli("register", cwd=released).code == 0
    one = json.loads(cli("show", "mlp@canary", "--mlflow", "--json", cwd=released).out)
    assert (one["version"], one["mlflow_version"]) == ("1.1.0", "2")
    model = json.loads(cli("show", "mlp", "--mlflow", "--json", cwd=released).out)
    assert model["mlflow_versions"] == {"1.0.0": "1", "1.1.0": "2"}
    text = cli("show", "mlp:1.0.0", "--mlflow", cwd=released)
    assert re.search(r"\n  mlflow_version: +1\n", text.out)


def _run_metrics(client: Any, run_id: str) -> dict[str, float]:
    with quiet_mlflow():
        return dict(client.get_run(run_id).data.metrics)


def test_metrics_descriptions_and_owner_are_mirrored_and_their_drift_reported(
    released: Path, cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = f"sqlite:///{released / '.modelreg/mlflow.db'}"
    model_yaml = released / "manifests/mlp/model.yaml"
    model_yaml.write_text(
        model_yaml.read_text().replace("spec:\n", "spec:\n  description: Tiny MLP.\n", 1)
    )
    version_yaml = released / "manifests/mlp/versions/1.1.0.yaml"
    version_yaml.write_text(
        version_yaml.read_text().replace(
            "spec:\n",
            "spec:\n  description: Recall up at night.\n"
            "  metrics:\n    accuracy: 0.93\n    top-1@night: 0.8\n",
            1,
        )
    )
    git(released, "commit", "-qam", "describe mlp, measure 1.1.0")
    owner = yaml.safe_load(model_yaml.read_text())["spec"]["owner"]
    assert owner  # model add records git user.email

    first = cli("register", cwd=released)
    # The name MLflow cannot hold is reported, the rest mirrored.
    assert first.code == 1
    assert first.err.splitlines() == [
        (
            "mlp 1.1.0: metric 'top-1@night' cannot be an MLflow metric name (MLflow allows "
            "letters, digits, _ - . / : and spaces); rename it in the manifest"
        )
    ]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    client = _client(uri)
    with quiet_mlflow():
        assert client.get_registered_model("mlp").description == "Tiny MLP."
    v1, v2 = _versions(client)["1.0.0"], _versions(client)["1.1.0"]
    assert v2.description == "Recall up at night."
    assert not v1.description
    assert {v1.tags["modelreg.owner"], v2.tags["modelreg.owner"]} == {owner}
    assert _run_metrics(client, v2.run_id) == {"accuracy": 0.93}
    assert _run_metrics(client, v1.run_id) == {}

    version_yaml.write_text(version_yaml.read_text().replace("top-1@night", "top1_night"))
    git(released, "commit", "-qam", "a metric name MLflow takes")
    assert (
        "mlp 1.1.0: MLflow version 2: metric top1_night is missing, Git says 0.8"
        in cli("register", "--check", cwd=released).err.splitlines()
    )
    mended = cli("register", cwd=released)
    assert mended.code == 0, mended.err
    assert mended.out.splitlines()[:2] == [
        "mlp 1.1.0: MLflow version 2: set modelreg.git_commit",  # the manifest's last commit
        "mlp 1.1.0: MLflow version 2: logged metrics top1_night",
    ]
    assert _run_metrics(client, v2.run_id) == {"accuracy": 0.93, "top1_night": 0.8}

    # Hand edits in MLflow: each is drift, and register puts Git's values back.
    with quiet_mlflow():
        client.update_registered_model("mlp", description="edited in the UI")
        client.update_model_version("mlp", v2.version, description="better")
        client.delete_model_version_tag("mlp", v1.version, "modelreg.owner")
        client.log_metric(v2.run_id, "accuracy", 0.99)
        client.log_metric(v1.run_id, "loss", 0.1)
    check = cli("register", "--check", cwd=released)
    assert check.code == 1
    assert check.err.splitlines() == [
        "mlp: description is 'edited in the UI', Git says 'Tiny MLP.'",
        f"mlp 1.0.0: MLflow version 1: tag modelreg.owner is missing, Git says {owner!r}",
        (
            f"mlp 1.0.0: MLflow version 1: run {v1.run_id} has metric loss = 0.1, Git "
            "declares none (MLflow cannot delete a run's metric: declare it in the manifest, "
            "or delete MLflow version 1 and register again)"
        ),
        "mlp 1.1.0: MLflow version 2: description is 'better', Git says 'Recall up at night.'",
        "mlp 1.1.0: MLflow version 2: metric accuracy is 0.99, Git says 0.93",
        FIX + "; the others need the change each line names",
    ]
    assert [d.kind for d in check_drift(released)] == [
        "description-differs", "tag-missing", "metric-unexpected", "description-differs",
        "metric-differs",
    ]  # fmt: skip
    repaired = cli("register", cwd=released)
    assert repaired.code == 1  # the hand-logged metric stays: MLflow cannot delete it
    assert repaired.out.splitlines() == [
        "mlp: set the description",
        "mlp 1.0.0: MLflow version 1: set modelreg.owner",
        "mlp 1.1.0: MLflow version 2: set description",
        "mlp 1.1.0: MLflow version 2: logged metrics accuracy",
    ]
    assert [ln.split(":")[0] for ln in repaired.err.splitlines()] == ["mlp 1.0.0"]
    assert _run_metrics(client, v2.run_id)["accuracy"] == 0.93
    assert _versions(client)["1.1.0"].description == "Recall up at night."
