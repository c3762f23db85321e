"""``modelreg version deprecate``: mark a version that must not be served again.

The mark is ``spec.deprecated.reason`` in the version's own manifest (a released
version's signed fields stay as they are): validation then refuses any channel that
points at it, ``promote`` and ``ci pr`` refuse to promote it, ``publish`` lists it in
the signed channels document so that devices refuse to install it, and ``register``
tags its MLflow version ``modelreg.deprecated``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from registry.atomic import write_atomic
from registry.edit import set_deprecated
from registry.errors import ManifestError, PolicyError, Problem, UsageError
from registry.gitinfo import stage
from registry.loader import load_manifest
from registry.repository import load_repository, parse_version
from registry.schema import ModelVersion
from registry.yamlsrc import parse_yaml

if TYPE_CHECKING:
    from registry.history import ChannelHistory


@dataclass(frozen=True, slots=True)
class DeprecateResult:
    """What ``deprecate`` changed."""

    file: str
    version: str
    reason: str
    previous: str | None
    changed: bool


def _move(  # noqa: PLR0917 - the facts one hint weighs
    file: str,
    name: str,
    channel: str,
    version: str,
    history: ChannelHistory,
    declared: set[str],
    deprecated: dict[str, str],
) -> str:
    """The command that moves ``channel`` off ``version``: a rollback when there is a
    version to go back to, else a promotion of the newest version above it, else
    what to edit."""
    from registry.promote import rollback_target

    back = rollback_target(history, channel, version, declared, deprecated)
    if back is not None:
        return f"modelreg rollback {name} --channel {channel} (to {back})"
    newer = [
        v for v in declared if v not in deprecated and parse_version(v) > parse_version(version)
    ]
    if newer:
        return f"modelreg promote {name} {max(newer, key=parse_version)} --channel {channel}"
    return (
        f"no other version may serve {channel!r}: declare one (modelreg version add) or "
        f"remove the channel from spec.channels in {file}"
    )


def deprecate(start: Path, name: str, version: str, reason: str) -> DeprecateResult:
    """Mark version ``version`` of ``name`` deprecated with ``reason``.

    The version file is edited in place (comments kept), re-validated, replaced
    atomically and staged.  A version a channel still serves is refused: move the
    channel first (``modelreg rollback``), in the same pull request if need be.

    Raises:
        RepositoryError: not inside a repository.
        ManifestError: the model or version is unknown, or one of its files is invalid.
        PolicyError: a channel still serves the version.
        UsageError: the reason is empty or not one line of at most 500 characters.
        ToolError: git fails to stage the file.
    """
    from registry.promote import declared_model, declared_versions, served_history

    text = " ".join(reason.split())
    if not text or len(text) > 500:
        raise UsageError("--reason must be one line of 1 to 500 characters")
    repo = load_repository(start, jobs=1)
    model = declared_model(repo, name)
    declared, deprecated = declared_versions(repo, model)
    entry = repo.versions.get(name, {}).get(version)
    if entry is None:
        from registry.inspect import suggest

        raise suggest(version, sorted(declared), "version", f" for model {name!r}")
    serving = sorted(c for c, a in model.manifest.spec.channels.items() if a.version == version)
    history = served_history(repo, model)
    if serving:
        moves = "; ".join(
            _move(model.file, name, c, version, history, declared, deprecated) for c in serving
        )
        raise PolicyError([Problem(
            model.file,
            f"version {version} of {name!r} still serves channel(s) {', '.join(serving)}; "
            f"point them at another version first ({moves})",
        )])  # fmt: skip
    # A partial rollout leaves the devices outside its share on what the channel
    # served before: deprecating that version would strand them on it.
    for channel, assignment in sorted(model.manifest.spec.channels.items()):
        if assignment.rollout is None or assignment.rollout.percent >= 100:
            continue
        served = [v for v in history.assignments.get(channel, ()) if v != assignment.version]
        if served and served[-1] == version:
            raise PolicyError([Problem(model.file, (
                f"channel {channel!r} of {name!r} rolls {assignment.version} out to "
                f"{assignment.rollout.percent:g}% of its devices; the others still run "
                f"{version}: finish the rollout first (modelreg promote {name} "
                f"{assignment.version} --channel {channel}) or roll it back"
            ))])  # fmt: skip
    before = entry.manifest.spec.deprecated
    original = entry.path.read_text(encoding="utf-8")
    new = set_deprecated(original, entry.file, text)
    manifest = load_manifest(parse_yaml(new.encode(), entry.file), "ModelVersion")
    if not isinstance(manifest, ModelVersion):  # pragma: no cover - the kind was checked
        raise ManifestError.single(entry.file, "is not a ModelVersion")
    changed = new != original
    if changed:
        write_atomic(entry.path, new.encode())
        stage(repo.root, [entry.path])
    return DeprecateResult(
        entry.file, version, text, before.reason if before is not None else None, changed
    )
