"""``modelreg promote``: point a channel at a version with a round-trip YAML edit."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from registry.atomic import write_atomic
from registry.edit import set_channel
from registry.errors import ManifestError, PolicyError, Problem, UsageError
from registry.gitinfo import stage
from registry.loader import load_manifest
from registry.policy import promotion_violations, unknown_channel
from registry.repository import load_repository
from registry.yamlsrc import parse_yaml


@dataclass(frozen=True, slots=True)
class PromoteResult:
    """What a promotion changed."""

    file: str
    channel: str
    version: str
    previous: str | None
    percent: float | None
    changed: bool
    previous_percent: float | None = None


def promote(
    start: Path,
    name: str,
    version: str,
    channel: str,
    percent: float | None,
    *,
    force: bool = False,
) -> PromoteResult:
    """Point ``channel`` of model ``name`` at ``version`` in its ``model.yaml``.

    The file is edited in place keeping comments and formatting, re-validated,
    replaced atomically and staged in git; on any error it is left untouched.

    Args:
        start: a folder inside the repository.
        name: model name.
        version: version to serve.
        channel: channel name.
        percent: rollout share (0..100), or None for the whole channel.
        force: skip the promotion-order policy (still requires a declared version
            and a channel that the order lists).

    Returns:
        What changed.

    Raises:
        RepositoryError: not inside a repository.
        ManifestError: the model is unknown or its manifest is invalid.
        PolicyError: the promotion breaks the model's policy.
        UsageError: percent outside 0..100.
        ToolError: git fails to stage the file.
    """
    if percent is not None and not (0 <= percent <= 100 and round(percent, 3) == percent):
        raise UsageError(f"--percent must be 0..100 with at most 3 decimals, got {percent:g}")
    repo = load_repository(start, jobs=1)
    model = repo.models.get(name)
    if model is None:
        known = ", ".join(sorted(repo.models)) or "none"
        raise ManifestError(
            [
                Problem(
                    f"manifests/{name}/model.yaml",
                    f"model {name!r} is not declared (declared: {known})",
                )
            ]
        )
    declared = set(repo.versions.get(name, {}))
    reasons = promotion_violations(model.manifest, declared, version, channel)
    if version not in declared:
        raise PolicyError([Problem(model.file, reasons[0])])
    order = model.manifest.spec.promotion.order
    if order and channel not in order:
        # Forced, the channel would be written and then refused by validate.
        raise PolicyError([Problem(model.file, unknown_channel(name, order, channel))])
    if reasons and not force:
        raise PolicyError([Problem(model.file, r + " (use --force to override)") for r in reasons])
    previous = model.manifest.spec.channels.get(channel)
    text = model.path.read_text(encoding="utf-8")
    new_text = set_channel(text, model.file, channel, version, percent)
    load_manifest(parse_yaml(new_text.encode(), model.file), "RegisteredModel")
    changed = new_text != text
    if changed:
        write_atomic(model.path, new_text.encode())
        # Staged as ``model add`` and ``version add`` stage theirs: a plain
        # ``git commit`` must not leave the channel change behind.
        stage(repo.root, [model.path])
    return PromoteResult(
        file=model.file,
        channel=channel,
        version=version,
        previous=previous.version if previous else None,
        percent=percent,
        changed=changed,
        previous_percent=previous.rollout.percent if previous and previous.rollout else None,
    )
