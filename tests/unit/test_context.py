"""The run context: one load for every stage, no secret in its printed form, and no
stage that must parse everything itself fed a context parsed through the cache."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pipelines.context import ReleaseContext, repository
from pipelines.publish import publish
from registry.errors import UsageError
from tests.conftest import REPO_ROOT

SECRETS = {
    "GITHUB_TOKEN": "ghp_0123456789abcdefghijklmnopqrstuvwxyzAB",
    "MODELREG_TARGETS_KEY": "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49\n",
    "GITHUB_REF": "refs/heads/main",
}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    shutil.copy(REPO_ROOT / "modelreg.yaml", tmp_path / "modelreg.yaml")
    (tmp_path / "manifests").mkdir()
    return tmp_path


def test_the_printed_context_shows_no_secret(root: Path) -> None:
    run = ReleaseContext.load(root, SECRETS)
    shown = repr(run)
    assert "ghp_0123456789" not in shown
    assert "PRIVATE KEY" not in shown
    assert "MIGHAgEAMBMGByqGSM49" not in shown
    assert run.github.token == SECRETS["GITHUB_TOKEN"]  # kept, only not shown
    assert run.github.branch == "main"


def test_a_context_is_passed_through_and_a_path_is_loaded(root: Path) -> None:
    run = ReleaseContext.load(root, SECRETS)
    assert ReleaseContext.of(run) is run
    assert ReleaseContext.of(run, SECRETS) is run
    assert repository(run) is run.repo
    fresh = ReleaseContext.of(root / "manifests", {})
    assert fresh is not run
    assert fresh.root == run.root
    assert fresh.github.token is None


def test_a_run_has_one_environment(root: Path) -> None:
    run = ReleaseContext.load(root, SECRETS)
    with pytest.raises(UsageError, match="give one, not two"):
        ReleaseContext.of(run, {"GITHUB_TOKEN": "another"})


def test_a_signer_is_never_given_manifests_parsed_through_the_cache(root: Path) -> None:
    cached = ReleaseContext.load(root, {})
    assert cached.cached
    with pytest.raises(UsageError, match="cache=False"):
        ReleaseContext.of(cached, cache=False)
    with pytest.raises(UsageError, match="cache=False"):
        publish(cached, push=False)
    assert ReleaseContext.of(ReleaseContext.load(root, {}, cache=False), cache=False).root == root


def test_validation_runs_once_per_context(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pipelines.context

    calls: list[object] = []
    real = pipelines.context.validate_paths  # type: ignore[attr-defined]

    def spy(repo: object) -> object:
        calls.append(repo)
        return real(repo)  # type: ignore[arg-type]

    monkeypatch.setattr(pipelines.context, "validate_paths", spy)
    run = ReleaseContext.load(root, {})
    assert run.problems() == []
    run.validate()
    assert run.problems() == []
    assert len(calls) == 1
