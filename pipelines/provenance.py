"""What ``ci release`` can find out about where a version came from (the I/O side of
:mod:`signing.provenance`).

For each version it releases: the commit that last changed the version's manifest,
the pull request GitHub says merged that commit into the release branch
(``GET /repos/{owner}/{repo}/commits/{sha}/pulls``), the approvals of the pull
request's head counted by the rule ``ci pr`` counts with (:func:`pipelines.github.
fetch_approvals`), the base commit's ``model.yaml`` (the policy that judged it), and
the Actions run.  Each fact it cannot find is left out with the reason (no
``GITHUB_TOKEN``, a commit pushed without a pull request, GitHub unreachable, a release
made by hand): a release is never blocked by provenance, and never signs a fact it
did not read.  Lookups are made once per commit and per pull request in a run.
"""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from pipelines.errors import GitHubError
from pipelines.github import ActionsRun, GitHubEnv, fetch_approvals, fetch_merged_pull
from registry.errors import one_line, printable
from registry.gitinfo import last_commits, toplevel
from registry.repository import Repository, VersionEntry
from signing.provenance import Approval, CiRun, Policy, Provenance, PullRequestFacts

__all__ = ["ReleaseFacts"]

_MAX_REASON: Final = 500


def _reason(text: str) -> str:
    """A reason as the provenance keeps it: one line of printable text, bounded (an
    error from GitHub quotes what the API answered)."""
    shown = printable(one_line(text))
    return shown if len(shown) <= _MAX_REASON else shown[: _MAX_REASON - 1] + "…"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class ReleaseFacts:
    """The facts of one release run, looked up as versions ask for them.

    Attributes:
        root: the repository root.
        commit: the commit being released (``HEAD``).
        env: the run's environment (GitHub Actions' variables).
    """

    root: Path
    commit: str
    env: Mapping[str, str]
    _github: GitHubEnv = field(init=False)
    _pulls: dict[str, PullRequestFacts | str] = field(default_factory=dict, init=False)
    _approvals: dict[int, list[Approval] | str] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self._github = GitHubEnv.from_env(self.env)

    @property
    def repository_url(self) -> str | None:
        """The source repository's page, when the run says where it is."""
        return self._github.run.repository_url

    def ci_run(self) -> CiRun | None:
        """The Actions run (None outside Actions)."""
        run: ActionsRun = self._github.run
        if run.run_id is None:
            return None
        return CiRun(
            repository=run.repository, workflow_ref=run.workflow_ref, run_id=run.run_id,
            run_attempt=run.attempt, url=run.url, event=run.event,
            runner_environment=run.runner_environment, runner_os=run.runner_os,
        )  # fmt: skip

    def of(self, repo: Repository, entry: VersionEntry) -> Provenance:
        """The review provenance of ``entry`` (see the module doc)."""
        unknown: dict[str, str] = {}
        ci = self.ci_run()
        if ci is None:
            unknown["ci"] = "released outside GitHub Actions (GITHUB_RUN_ID is not set)"
        pull = self._pull(repo, entry)
        approvals: list[Approval] | None = None
        policy: Policy | None = None
        if isinstance(pull, str):
            for fact in ("pull_request", "approvals", "policy"):
                unknown[fact] = pull
            pull_request = None
        else:
            pull_request = pull
            counted = self._counted(pull)
            if isinstance(counted, str):
                unknown["approvals"] = counted
            else:
                approvals = counted
            found = self._policy(repo, entry, pull.base)
            if isinstance(found, str):
                unknown["policy"] = found
            else:
                policy = found
        return Provenance(
            commit=self.commit, released_at=_now(), pull_request=pull_request,
            approvals=approvals, policy=policy, ci=ci,
            unknown={fact: _reason(why) for fact, why in unknown.items()},
        )  # fmt: skip

    def _manifest_commit(self, repo: Repository, entry: VersionEntry) -> str | None:
        top = toplevel(repo.root)
        if top is None:
            return None
        base = top.resolve()
        path = entry.path.resolve().relative_to(base).as_posix()
        under = (repo.root / repo.config.manifests).resolve().relative_to(base).as_posix()
        found = last_commits(repo.root, [path], under).get(path)
        return found.sha if found is not None else None

    def _pull(self, repo: Repository, entry: VersionEntry) -> PullRequestFacts | str:
        """The pull request that merged the version's manifest, or why it is unknown."""
        github = self._github
        if not github.repository:
            return "GITHUB_REPOSITORY is not set: no pull request to look up"
        if not github.token:
            return (
                "GITHUB_TOKEN is not set: give the release step `GITHUB_TOKEN: "
                "${{ github.token }}` and the job `pull-requests: read`"
            )
        commit = self._manifest_commit(repo, entry)
        if commit is None:
            return "the version's manifest is not committed"
        if commit not in self._pulls:
            branch = github.branch
            try:
                found = fetch_merged_pull(
                    github.repository, commit, github.token, branch=branch, api=github.api
                )
            except GitHubError as e:
                self._pulls[commit] = str(e)
            else:
                self._pulls[commit] = found or (
                    f"commit {commit[:12]}, the last to change the version's manifest, came "
                    f"by no pull request merged into {branch or 'any branch'}"
                )
        return self._pulls[commit]

    def _counted(self, pull: PullRequestFacts) -> list[Approval] | str:
        github = self._github
        if pull.number not in self._approvals:
            assert github.repository is not None  # noqa: S101 - _pull checked it
            assert github.token is not None  # noqa: S101 - _pull checked it
            try:
                self._approvals[pull.number] = fetch_approvals(
                    github.repository, pull.number, github.token,
                    head=pull.head, author=pull.author, api=github.api,
                )  # fmt: skip
            except GitHubError as e:
                self._approvals[pull.number] = str(e)
        return self._approvals[pull.number]

    def _policy(self, repo: Repository, entry: VersionEntry, base: str) -> Policy | str:
        """The base commit's ``model.yaml`` of the version's model, or why it is unknown."""
        model = repo.models.get(entry.name)
        top = toplevel(repo.root)
        if model is None or top is None:
            return "the model's manifest is not in this checkout"
        path = model.path.resolve().relative_to(top.resolve()).as_posix()
        argv = ["git", "-C", str(repo.root), "cat-file", "blob", f"{base}:{path}"]
        try:  # the file's bytes as committed (git() decodes text)
            proc = subprocess.run(argv, capture_output=True, check=False)
        except FileNotFoundError:
            return "git is not installed"
        if proc.returncode != 0:
            return f"{path} is not in base commit {base[:12]} (not in this clone, or a new model)"
        return Policy(file=path, commit=base, sha256=hashlib.sha256(proc.stdout).hexdigest())
