"""One run's loaded state, shared by the stages it runs (``ci release`` above all).

A stage that starts from a path loads the repository, validates it and verifies the
trust metadata itself; given a :class:`ReleaseContext` it takes them from there, so
``ci release`` parses the manifests once, validates them once and verifies the TUF
metadata once for build, publish, diff and register together.  The context also holds
the environment the run was given and its GitHub part
(:class:`pipelines.github.GitHubEnv`, the one reader of ``GITHUB_*``).

In ``ci pr`` the checkout is the pull request's: its trust metadata says nothing of
what is released (``ci pr`` reads the base's, :func:`pipelines.ci._base.trust_at`), so
a pull request's context is never asked for :meth:`ReleaseContext.trust`.

Nothing here is cached across runs: a context lives as long as one command.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pipelines.changes import changed_versions
from pipelines.github import GitHubEnv
from registry.checks import validate_paths
from registry.errors import ManifestError, Problem, UsageError
from registry.repository import Repository, load_repository

if TYPE_CHECKING:
    from signing.tuf_repo import TrustRepo
    from signing.workspace import TrustPaths

__all__ = ["ReleaseContext", "repository"]


@dataclass
class ReleaseContext:
    """The repository, its verified trust state and the environment of one run.

    Attributes:
        repo: the repository, loaded once.
        env: the environment the run reads (secrets, tracking URI, CI facts).
        github: the GitHub part of ``env``.
        cached: whether the manifests could be parsed through the parse cache (False
            for a signer; inside ``untrusted_checkout`` the cache is never used).
    """

    repo: Repository = field(repr=False)
    env: Mapping[str, str] = field(repr=False)  # secrets and keys: never shown
    github: GitHubEnv
    cached: bool = True
    _problems: list[Problem] | None = field(default=None, repr=False)
    _trust: TrustRepo | None = field(default=None, repr=False)
    _changed: dict[str, set[tuple[str, str]]] = field(default_factory=dict, repr=False)

    @classmethod
    def load(
        cls, start: Path, env: Mapping[str, str] | None = None, *, cache: bool = True
    ) -> ReleaseContext:
        """Load the repository containing ``start``.

        Args:
            start: the repository root or a folder inside it.
            env: the run's environment (default ``os.environ``).
            cache: reuse the parse cache (a signer passes False: it parses everything
                itself; inside ``untrusted_checkout`` there is no cache either way).

        Raises:
            RepositoryError: no repository at or above ``start``.
            ManifestError: ``modelreg.yaml`` is invalid.
        """
        env = os.environ if env is None else env
        repo = load_repository(start, cache=cache)
        return cls(repo, env, GitHubEnv.from_env(env), cached=cache)

    @classmethod
    def of(
        cls,
        start: Path | ReleaseContext,
        env: Mapping[str, str] | None = None,
        *,
        cache: bool = True,
    ) -> ReleaseContext:
        """``start`` itself when it is a context, else one loaded from it (see :meth:`load`).

        Raises:
            UsageError: ``start`` is a context and ``env`` another environment (a run
                has one), or ``cache`` is False and the context was parsed through the
                parse cache (a signer parses every manifest itself).
        """
        if isinstance(start, ReleaseContext):
            if env is not None and env is not start.env:
                raise UsageError("the environment of a run is its context's; give one, not two")
            if not cache and start.cached:
                raise UsageError("this step parses every manifest itself: load the context "
                                 "with cache=False")  # fmt: skip
            return start
        return cls.load(start, env, cache=cache)

    @property
    def root(self) -> Path:
        """The repository root."""
        return self.repo.root

    def problems(self) -> list[Problem]:
        """Every problem of the manifests and their files (validated once)."""
        if self._problems is None:
            self._problems = validate_paths(self.repo)
        return self._problems

    def validate(self) -> None:
        """Raise when the manifests are invalid.

        Raises:
            ManifestError: with every problem.
        """
        if problems := self.problems():
            raise ManifestError(problems)

    @property
    def trust_paths(self) -> TrustPaths:
        """Where the repository's trust metadata and keys are."""
        from signing.workspace import trust_paths

        return trust_paths(self.repo.root, self.repo.config)

    def has_trust(self) -> bool:
        """Whether the repository has trust metadata (a root) at all."""
        return (self.trust_paths.metadata / "1.root.json").is_file()

    def trust(self) -> TrustRepo:
        """The repository's trust metadata, verified on first use.

        Raises:
            VerificationError: it does not verify.
            RepositoryError: the repository has none (see :meth:`has_trust`).
        """
        if self._trust is None:
            from signing.tuf_repo import TrustRepo

            paths = self.trust_paths
            self._trust = TrustRepo.load(paths.metadata, expiry=paths.expiry)
        return self._trust

    def changed_since(self, base: str) -> set[tuple[str, str]]:
        """The versions changed since git ref ``base`` (asked of git once per run; see
        :func:`pipelines.changes.changed_versions`).

        Raises:
            UsageError: ``base`` does not name a commit.
            ToolError: git is missing or fails.
        """
        if base not in self._changed:
            self._changed[base] = changed_versions(self.repo, base)
        return set(self._changed[base])

    def signed(self, trust: TrustRepo) -> None:
        """``trust`` was just signed by this run (publish): later stages read it."""
        self._trust = trust


def repository(start: Path | ReleaseContext, *, jobs: int | None = None) -> Repository:
    """The run's repository, or the one containing ``start`` loaded now (``jobs`` as for
    :func:`registry.repository.load_repository`).

    Raises:
        RepositoryError: no repository at or above ``start``.
        ManifestError: ``modelreg.yaml`` is invalid.
    """
    if isinstance(start, ReleaseContext):
        return start.repo
    return load_repository(start, jobs=jobs)
