"""Gather the version-state table for a repository (I/O: manifests and git)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from registry.errors import Problem
from registry.gitinfo import dirty_paths, last_commits, toplevel
from registry.repository import load_repository
from registry.status import VersionStatus, collect_status


@dataclass(frozen=True)
class StatusReport:
    """Rows of the version-state table plus any loading problems."""

    root: Path
    rows: list[VersionStatus]
    problems: list[Problem]
    models: tuple[str, ...] = ()


def repository_status(
    start: Path, *, model: str | None = None, jobs: int | None = None, cache: bool = True
) -> StatusReport:
    """Load the repository containing ``start`` and build its status rows.

    Raises:
        RepositoryError: not inside a repository.
        ManifestError: ``modelreg.yaml`` is invalid.
        ToolError: git is missing.
    """
    repo = load_repository(start, jobs=jobs, cache=cache)
    top = toplevel(repo.root)
    # Manifest paths come from scanning the resolved root, so the git-relative name is
    # a string operation (resolving 10,000 paths one by one costs most of a second).
    base = str((top if top is not None else repo.root).resolve()) + os.sep
    relative: dict[str, str] = {}
    for entry in repo.all_versions():
        path = str(entry.path)
        if path.startswith(base):
            relative[entry.file] = path[len(base) :].replace(os.sep, "/")
        else:
            relative[entry.file] = entry.path.resolve().relative_to(base).as_posix()
    under = (repo.root / repo.config.manifests).resolve()
    under_rel = under.relative_to(top.resolve()).as_posix() if top is not None else "."
    commits = last_commits(repo.root, relative.values(), under_rel) if top is not None else {}
    dirty = dirty_paths(repo.root, under_rel) if top is not None else set()
    rows = collect_status(repo, commits, dirty, relative)
    if model is not None:
        rows = [r for r in rows if r.model == model]
    return StatusReport(repo.root, rows, repo.problems, tuple(repo.models))
