"""Gather the version-state table for a repository (I/O: manifests and git)."""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from registry import result_cache
from registry.cache import in_untrusted_checkout
from registry.errors import ManifestError, Problem, ToolError
from registry.gitinfo import StatusQuery, toplevel
from registry.root import CONFIG_FILE, find_root
from registry.status import VersionStatus

if TYPE_CHECKING:
    from registry.repository import Repository
    from registry.status import RowFields

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
    root = find_root(start)
    top = toplevel(root)
    # Git's paths are relative to its top level; the repository may be a folder in it.
    below = root.resolve().relative_to(top.resolve()).as_posix() if top is not None else "."
    prefix = "" if below == "." else below + "/"
    with contextlib.ExitStack() as stack:
        # git answers while the manifests load: it starts on the folder modelreg.yaml
        # names before the loader (and its schema) is even imported; the validated
        # configuration decides whether that was the folder.
        asked = _manifests_named(root)
        git = None
        if asked is not None:
            with contextlib.suppress(ToolError):  # no head start: asked again below
                git = stack.enter_context(_git_query(root, top, asked))
            if git is None:
                asked = None

        def ask_about(manifests: str) -> StatusQuery | None:
            nonlocal asked, git
            if manifests != asked:
                if git is not None:
                    git.close()
                asked, git = manifests, stack.enter_context(_git_query(root, top, manifests))
            return git

        # The loader comes in here, not up front: a stored result needs none of it.
        from registry.repository import load_repository, map_models, outline
        from registry.status import make_rows, row_fields

        def fields(repo: Repository) -> list[RowFields]:
            relative = {f: prefix + repo.relative(p) for f, p in repo.version_files().items()}
            return row_fields(repo, relative)

        def group(repo: Repository) -> tuple[list[RowFields], list[Problem], list[str]]:
            return fields(repo), repo.problems, list(repo.models)

        grouped = not cache or in_untrusted_checkout()  # every file is read: in parallel
        found = outline(start, files=False) if grouped else None
        groups = None
        if found is not None:
            git = ask_about(found.config.manifests)
            groups = map_models(found, group, jobs=jobs)
        if groups is not None and found is not None:
            problems = list(found.problems)
            table: list[RowFields] = []
            names: list[str] = []
            for part, problem, models in groups:
                table.extend(part)
                problems.extend(problem)
                names.extend(models)
        else:
            repo = load_repository(start, jobs=jobs, cache=cache)
            git = ask_about(repo.config.manifests)
            table, problems, names = fields(repo), repo.problems, list(repo.models)
        commits, dirty = (git.commits(), git.dirty()) if git is not None else ({}, set())
    rows = make_rows(table, commits, dirty)
    if model is not None:
        rows = [r for r in rows if r.model == model]
    problems.sort(key=Problem.sort_key)  # one order, whichever way the files were read
    return StatusReport(root, rows, problems, tuple(names))


_PLAIN_FOLDER: Final = re.compile(r"[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*")
_GUESS_LIMIT: Final = 255  # a folder name as people write them; anything else waits


def _manifests_named(root: Path) -> str | None:
    """The manifests folder ``modelreg.yaml`` names, read without the schema; None when
    it does not plainly name one.  Only a head start for git: what is used is what the
    validated configuration says."""
    from registry.yamlsrc import read_yaml  # here: a stored status needs no YAML reader

    try:
        data = read_yaml(root / CONFIG_FILE, CONFIG_FILE, root=root).data
    except ManifestError:
        return None  # loading the configuration reports it
    named = data.get("manifests", "manifests") if isinstance(data, dict) else None
    if (
        not isinstance(named, str)
        or len(named) > _GUESS_LIMIT
        or not _PLAIN_FOLDER.fullmatch(named)
    ):
        return None
    return None if {".", ".."} & set(named.split("/")) else named


@contextlib.contextmanager
def _git_query(root: Path, top: Path | None, manifests: str) -> Iterator[StatusQuery | None]:
    """git's answers about ``manifests`` (None outside a git work tree, or for a folder
    outside it); git runs at its top level, the pathspec relative to it (the repository
    may be a folder inside a larger work tree)."""
    try:
        under = (root / manifests).resolve().relative_to(top.resolve()) if top else None
    except (OSError, ValueError, RuntimeError):
        under = None  # a linked folder that leads out: the scan refuses it
    if top is None or under is None:
        yield None
        return
    with StatusQuery(top, under.as_posix()) as query:
        yield query


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
