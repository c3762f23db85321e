"""Which versions a branch changed: what ``ci pr`` builds, diffs and checks for changed
deprecations, one rule for all three.

Shared by the build, the diff and ``ci pr``'s deprecation check (and memoized per run
by :meth:`pipelines.context.ReleaseContext.changed_since`), so that what a pull request
builds is also what its comment diffs and what it says of deprecations, and git is
asked once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from registry.errors import ManifestError, UsageError
from registry.gitinfo import git
from registry.layout import version_file
from registry.repository import Repository

__all__ = ["changed_versions"]


def changed_versions(repo: Repository, base: str) -> set[tuple[str, str]]:
    """The versions whose inputs differ between git ref ``base`` and the work tree.

    A version changed when its manifest, its artifact's ``.dvc`` pointer or one of its
    golden files differs from ``base`` (uncommitted and untracked files count), or when
    it takes its signature from ``model.yaml`` and that signature changed.  Other edits
    of ``model.yaml`` (channels, promotion) do not rebuild anything.

    Args:
        repo: a loaded repository inside a git work tree.
        base: a commit-ish (branch, tag, SHA).

    Returns:
        (model, version) pairs of declared versions that changed.

    Raises:
        UsageError: ``base`` does not name a commit.
        ToolError: git is missing or fails.
    """
    root = repo.root
    if git(root, "rev-parse", "--verify", "--quiet", f"{base}^{{commit}}", check=False).returncode:
        raise UsageError(f"git ref {base!r} does not name a commit")
    # --relative: paths relative to the modelreg root, which may be a subfolder of the repo.
    diff = git(root, "diff", "--name-only", "--no-renames", "--relative", base, "--").stdout
    untracked = git(root, "ls-files", "--others", "--exclude-standard").stdout
    changed = set(diff.splitlines()) | set(untracked.splitlines())
    signature_changed = {
        name
        for name, model in repo.models.items()
        if repo.relative(model.path) in changed
        and _old_signature(root, base, repo.relative(model.path))
        != model.doc.data["spec"].get("signature")
    }
    selected: set[tuple[str, str]] = set()
    for entry in repo.all_versions():
        spec = entry.manifest.spec
        inputs = {repo.relative(entry.path)}
        inputs.update(f"{file}.dvc" for file in spec.artifact.files())
        for case in spec.goldens.cases if spec.goldens else []:
            inputs.update(v for v in (case.inputs, case.outputs) if isinstance(v, str))
        if inputs & changed or (spec.signature is None and entry.name in signature_changed):
            selected.add((entry.name, entry.version))
    for name, version in repo.broken:
        if version is not None and version_file(repo.config.manifests, name, version) in changed:
            selected.add((name, version))
    return selected


def _old_signature(root: Path, base: str, path: str) -> Any:
    from registry.yamlsrc import parse_yaml

    shown = git(root, "show", f"{base}:./{path}", check=False)
    if shown.returncode:
        return None  # the model is new since base
    try:
        data = parse_yaml(shown.stdout.encode(), f"{base}:{path}").data
    except ManifestError:
        return None
    spec = data.get("spec") if isinstance(data, dict) else None
    return spec.get("signature") if isinstance(spec, dict) else None
