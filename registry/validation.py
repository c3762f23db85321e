"""``modelreg validate`` of a whole repository, with its result reused while the tree
is unchanged (stable API).

A repository of 10,000 versions takes about a second to load and check; a developer
runs ``validate`` again and again between edits of one file.  The result of a run is
kept under the fingerprint of the tree it read (``registry.result_cache``) and printed
again while the fingerprint matches: the second run of an unchanged tree costs one
``lstat`` per file.  Any change runs the whole validation again (with the parse cache,
so only the changed files are parsed).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from registry import result_cache
from registry.cache import in_untrusted_checkout
from registry.errors import Problem
from registry.root import find_root

if TYPE_CHECKING:
    from registry.checks import Claim
    from registry.repository import Repository

# Only what finding a stored result needs is imported up front: the loader and the
# checks (pydantic, the schema: half of a hit's time) come in on a miss.

_COMMAND: Final = "validate"


@dataclass(frozen=True)
class Validation:
    """What ``validate`` found in a whole repository."""

    problems: list[Problem]
    models: int
    versions: int
    files: int
    reused: bool = False
    """Whether this is the stored result of an unchanged tree."""
    warnings: list[Problem] = field(default_factory=list)
    """Valid but doubtful (``registry.checks.authoring_warnings``)."""

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready mapping (what the result cache stores)."""
        return {
            "problems": [result_cache.problem_row(p) for p in self.problems],
            "warnings": [result_cache.problem_row(p) for p in self.warnings],
            "models": self.models,
            "versions": self.versions,
            "files": self.files,
        }

    @classmethod
    def from_json(cls, data: Any) -> Validation | None:
        """The validation a stored mapping holds; None when it is not one."""
        try:
            models, versions, files = data["models"], data["versions"], data["files"]
            rows, warned = data["problems"], data["warnings"]
            counts = (models, versions, files)
            if not all(type(n) is int and n >= 0 for n in counts) or type(rows) is not list:
                return None
            if type(warned) is not list:
                return None
            problems = [result_cache.problem_from_row(row) for row in rows]
            warnings = [result_cache.problem_from_row(row) for row in warned]
        except (KeyError, TypeError, ValueError):
            return None
        return cls(problems, models, versions, files, reused=True, warnings=warnings)


def validate_repository(start: Path, *, jobs: int | None = None, cache: bool = True) -> Validation:
    """Load and check the whole repository containing ``start``.

    Args:
        start: the repository root or a folder inside it.
        jobs: parser processes (see ``load_repository``).
        cache: reuse parsed files, and the whole result of an unchanged tree.  Neither
            is used inside ``untrusted_checkout``.

    Raises:
        RepositoryError: not inside a repository.
        ManifestError: ``modelreg.yaml`` itself is invalid.
    """
    root = find_root(start)
    key = None
    if cache and not in_untrusted_checkout():
        key = result_cache.fingerprint(root, result_cache.context(_COMMAND))
        if key is not None:
            stored = Validation.from_json(result_cache.load(root, _COMMAND, key))
            if stored is not None:
                return stored
    from registry.checks import validate_paths
    from registry.repository import load_repository

    result = None
    if not cache or in_untrusted_checkout():
        result = _in_workers(root, jobs)  # every file is read: read and check in parallel
    if result is None:
        repo = load_repository(root, jobs=jobs, cache=cache)
        result = _counted(repo, validate_paths(repo))
    if key is not None:
        result_cache.store(root, _COMMAND, key, result.to_json())
    return result


def _counted(repo: Repository, problems: list[Problem]) -> Validation:
    from registry.checks import authoring_warnings

    return Validation(
        problems,
        models=len(repo.models),
        versions=sum(len(v) for v in repo.versions.values()),
        files=len(repo.files),
        warnings=authoring_warnings(repo),
    )


def _check_group(repo: Repository) -> tuple[Validation, list[Claim]]:
    from registry.checks import check_models

    problems, claims = check_models(repo)
    return _counted(repo, [*repo.problems, *problems]), claims


def _in_workers(root: Path, jobs: int | None) -> Validation | None:
    """The validation of a repository loaded and checked by groups of models in worker
    processes (``registry.repository.map_models``); None where workers would not pay."""
    from registry.checks import ownership_problems
    from registry.repository import map_models, outline

    found = outline(root)
    groups = map_models(found, _check_group, jobs=jobs)
    if groups is None:
        return None
    problems = list(found.problems)
    warnings: list[Problem] = []
    claims: list[Claim] = []
    for part, claimed in groups:
        problems.extend(part.problems)
        warnings.extend(part.warnings)
        claims.extend(claimed)
    # Which version owns a file is the one check across models: claims come back in
    # model order, as one process would have made them.
    problems.extend(ownership_problems(claims, found.root))
    return Validation(
        problems,
        models=sum(part.models for part, _ in groups),
        versions=sum(part.versions for part, _ in groups),
        files=sum(part.files for part, _ in groups),
        warnings=warnings,
    )


__all__ = ["Validation", "validate_repository"]
