"""Gather the version-state table for a repository (I/O: manifests and git)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from registry import result_cache
from registry.cache import in_untrusted_checkout
from registry.errors import Problem
from registry.gitinfo import dirty_paths, last_commits, toplevel
from registry.root import find_root
from registry.status import VersionStatus

_COMMAND: Final = "status"


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
    # The loader comes in here, not up front: a stored result needs none of it.
    from registry.repository import load_repository
    from registry.status import collect_status

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
    # git runs at its top level: the pathspec is relative to it (the repository may be a
    # folder inside a larger git work tree).
    commits = last_commits(top, relative.values(), under_rel) if top is not None else {}
    dirty = dirty_paths(top, under_rel) if top is not None else set()
    rows = collect_status(repo, commits, dirty, relative)
    if model is not None:
        rows = [r for r in rows if r.model == model]
    return StatusReport(repo.root, rows, repo.problems, tuple(repo.models))


Fill = Callable[[Path, list[VersionStatus]], list[VersionStatus]]
"""Adds what another layer knows to the rows (``signed``, ``published``, ``ci_run``)."""


def cached_status(
    start: Path,
    *,
    model: str | None = None,
    cache: bool = True,
    fill: Fill | None = None,
    packages: Sequence[str] = ("registry",),
) -> tuple[StatusReport, bool]:
    """:func:`repository_status` (then ``fill``), or its stored result while nothing it
    read has changed: the tree below the root (``registry.result_cache``), git's HEAD
    and index, the working directory, the code of ``packages`` (``fill``'s too).

    Returns:
        The report, and whether it is a stored one.

    Raises:
        RepositoryError, ManifestError, ToolError: as :func:`repository_status`.
    """
    root = find_root(start)
    key = None
    if cache and not in_untrusted_checkout():
        git = result_cache.git_state(root)
        if git is not None:
            context = result_cache.context(_COMMAND, model or "", git, packages=packages)
            key = result_cache.fingerprint(root, context)
        if key is not None:
            stored = _from_json(root, result_cache.load(root, _COMMAND, key))
            if stored is not None:
                return stored, True
    report = repository_status(start, model=model, cache=cache)
    if fill is not None:
        report = dataclasses.replace(report, rows=fill(report.root, report.rows))
    if key is not None:
        result_cache.store(root, _COMMAND, key, _to_json(report))
    return report, False


def _to_json(report: StatusReport) -> dict[str, Any]:
    return {
        "rows": [r.to_json() for r in report.rows],
        "problems": [result_cache.problem_row(p) for p in report.problems],
        "models": list(report.models),
    }


def _from_json(root: Path, data: Any) -> StatusReport | None:
    try:
        rows = [VersionStatus.from_json(r) for r in data["rows"]]
        problems = [result_cache.problem_from_row(p) for p in data["problems"]]
        models = data["models"]
        if not (isinstance(models, list) and all(isinstance(m, str) for m in models)):
            return None
    except (KeyError, TypeError, ValueError):
        return None
    return StatusReport(root, rows, problems, tuple(models))
