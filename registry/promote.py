"""``modelreg promote``, ``modelreg rollback`` and ``modelreg fleet hold``/``resume``:
point a channel at a version (or hold its staged rollout) with a round-trip YAML edit,
staged in git."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from difflib import get_close_matches
from pathlib import Path

from registry.atomic import write_atomic
from registry.edit import set_channel, set_hold, set_rollout, set_shadow
from registry.errors import ManifestError, PolicyError, Problem, UsageError
from registry.gitinfo import git, stage
from registry.history import ChannelHistory, channel_history
from registry.layout import model_dir, model_file
from registry.loader import load_manifest
from registry.policy import promotion_violations, served_channels, unknown_channel
from registry.repository import (
    ModelEntry,
    Repository,
    load_repository,
    parse_version,
)
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
    waves_kept: bool = False
    """Without a percent: the channel's waves (and stop conditions) stay, at the last
    wave, for the next promotion."""


def _model_problems(repo: Repository, name: str) -> list[Problem]:
    """The load problems of the files in model ``name``'s folder."""
    folder = model_dir(repo.root / repo.config.manifests, name).resolve()
    return [p for p in repo.problems if Path(p.file).resolve().is_relative_to(folder)]


def declared_model(repo: Repository, name: str) -> ModelEntry:
    """The model ``name``, or the problems of its files when they do not load.

    Raises:
        ManifestError: the model is not declared, or its files do not load.
    """
    model = repo.models.get(name)
    if model is not None:
        return model
    broken = _model_problems(repo, name)
    if broken:  # the model's own files do not load: say where, not "not declared"
        raise ManifestError(broken)
    known = ", ".join(sorted(repo.models)) or "none"
    raise ManifestError(
        [
            Problem(
                model_file(repo.config.manifests, name),
                f"model {name!r} is not declared (declared: {known})",
            )
        ]
    )


def declared_versions(repo: Repository, model: ModelEntry) -> tuple[set[str], dict[str, str]]:
    """Declared versions, and the deprecated ones with their reasons.

    Raises:
        ManifestError: a version file of the model does not load (it may be the very
            version asked for: the broken file is named, not "not declared").
    """
    broken = _model_problems(repo, model.name)
    if broken:
        raise ManifestError(broken)
    name = model.name
    versions = repo.versions.get(name, {})
    deprecated = {
        v: e.manifest.spec.deprecated.reason
        for v, e in versions.items()
        if e.manifest.spec.deprecated is not None
    }
    return set(versions), deprecated


def git_path(repo: Repository, rel: str) -> str | None:
    """``rel`` (relative to the modelreg root) as a path from the git top level, built
    as text (nothing in the work tree is resolved: a link there is not followed);
    None outside a git work tree."""
    proc = git(repo.root, "rev-parse", "--show-prefix", check=False)
    if proc.returncode != 0:
        return None
    return f"{proc.stdout.strip()}{rel}"


def served_history(repo: Repository, model: ModelEntry) -> ChannelHistory:
    """What the model's channels served in the releases on HEAD's history.

    Raises:
        ToolError: git fails.
    """
    declared = git_path(repo, model_file(repo.config.manifests, model.name))
    trust = git_path(repo, repo.config.trust.metadata)
    if declared is None or trust is None:
        return ChannelHistory({})
    return channel_history(repo.root, declared, released=trust)


def promote(
    start: Path,
    name: str,
    version: str,
    channel: str,
    percent: float | None,
    *,
    force: bool = False,
    waves: Sequence[tuple[float, str | None]] = (),
    stop: Mapping[str, float | int] | None = None,
    shadow: float | None = None,
) -> PromoteResult:
    """Point ``channel`` of model ``name`` at ``version`` in its ``model.yaml``.

    The file is edited in place keeping comments and formatting, re-validated,
    replaced atomically and staged in git; on any error it is left untouched.  A
    version that served this channel or a later one before may come back without the
    earlier steps of the order (a rollback; see ``registry.policy``).

    Args:
        start: a folder inside the repository.
        name: model name.
        version: version to serve.
        channel: channel name.
        percent: rollout share (0..100), or None for the whole channel.
        force: skip the promotion-order policy (still requires a declared version
            that is not deprecated and a channel that the order lists).
        waves: a staged rollout (percent, soak) instead of ``percent``: the channel
            starts at the first wave, ``modelreg fleet advance`` takes the next ones.
        stop: the rollout's stop conditions (``failure_share``, ``min_reports``,
            ``min_agreement``, ``max_output_drift``, ``max_p99_ratio``, ``min_compared``).
        shadow: the share of requests the channel's devices compare with the previous
            version while its gate is open (``registry.schema.Shadow``).

    Returns:
        What changed.

    Raises:
        RepositoryError: not inside a repository.
        ManifestError: the model is unknown or one of its manifests is invalid.
        PolicyError: the promotion breaks the model's policy.
        UsageError: percent outside 0..100.
        ToolError: git fails.
    """
    if percent is not None and not (0 <= percent <= 100 and round(percent, 3) == percent):
        raise UsageError(f"--percent must be 0..100 with at most 3 decimals, got {percent:g}")
    if waves and percent is not None:
        raise UsageError("give --percent or --waves, not both (waves start at the first one)")
    if stop and not waves:
        raise UsageError("stop conditions apply to a staged rollout: give --waves too")
    repo = load_repository(start, jobs=1)
    model = declared_model(repo, name)
    declared, deprecated = declared_versions(repo, model)
    now = model.manifest.spec.channels.get(channel)
    reasons = promotion_violations(
        model.manifest, declared, version, channel,
        served=served_history(repo, model).served(), deprecated=deprecated,
        previous=now.version if now is not None else None,
    )  # fmt: skip
    if version not in declared or version in deprecated:
        raise PolicyError([Problem(model.file, reasons[0])])
    order = model.manifest.spec.promotion.order
    if order and channel not in order:
        # Forced, the channel would be written and then refused by validate.
        raise PolicyError([Problem(model.file, unknown_channel(name, order, channel))])
    if reasons and not force:
        raise PolicyError([Problem(model.file, r + " (use --force to override)") for r in reasons])
    if waves and percent is not None:
        raise UsageError(
            "give either --percent or --waves (a staged rollout starts at its first wave)"
        )
    if stop and not waves:
        raise UsageError("stop conditions apply to a staged rollout: give --waves too")
    return _write_channel(repo, model, channel, version, percent, waves, stop, shadow)


def _write_channel(  # noqa: PLR0917 - one edit, every form of it
    repo: Repository,
    model: ModelEntry,
    channel: str,
    version: str,
    percent: float | None,
    waves: Sequence[tuple[float, str | None]] = (),
    stop: Mapping[str, float | int] | None = None,
    shadow: float | None = None,
) -> PromoteResult:
    previous = model.manifest.spec.channels.get(channel)
    text = model.path.read_text(encoding="utf-8")
    if waves:
        new_text = set_rollout(text, model.file, channel, version, waves, stop=stop)
        percent = waves[0][0]
    else:
        new_text = set_channel(text, model.file, channel, version, percent)
    if shadow is not None:
        new_text = set_shadow(new_text, model.file, channel, shadow)
    written = load_manifest(parse_yaml(new_text.encode(), model.file), "RegisteredModel")
    now = written.spec.channels.get(channel)  # type: ignore[attr-defined]
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
        waves_kept=percent is None and now is not None and bool(now.rollout and now.rollout.waves),
    )


@dataclass(frozen=True, slots=True)
class HoldResult:
    """What ``fleet hold`` or ``fleet resume`` changed."""

    file: str
    channel: str
    version: str
    reason: str | None
    """The hold now (None: resumed)."""
    previous: str | None
    """The hold before."""
    changed: bool


def hold(start: Path, name: str, channel: str, reason: str | None) -> HoldResult:
    """Put ``channel``'s staged rollout on hold with ``reason`` (``fleet advance``
    then never takes its next wave), or lift the hold (``reason`` None).  The edit is
    validated, atomic and staged, as a promotion's.

    Raises:
        RepositoryError: not inside a repository.
        ManifestError: the model is unknown or one of its manifests is invalid.
        PolicyError: the channel does not exist or has no waves to hold.
        UsageError: an empty or multi-line reason.
        ToolError: git fails.
    """
    if reason is not None:
        reason = " ".join(reason.split())
        if not reason or len(reason) > 500:
            raise UsageError("--reason must be one line of 1 to 500 characters")
    repo = load_repository(start, jobs=1)
    model = declared_model(repo, name)
    current = model.manifest.spec.channels.get(channel)
    if current is None:
        listed = ", ".join(sorted(model.manifest.spec.channels)) or "none"
        raise PolicyError([Problem(model.file, (
            f"model {name!r} has no channel {channel!r} (channels: {listed})"
        ))])  # fmt: skip
    if current.rollout is None or not current.rollout.waves:
        raise PolicyError([Problem(model.file, (
            f"channel {channel!r} of {name!r} serves {current.version} without waves: there "
            f"is no rollout to hold (a staged one: modelreg promote {name} VERSION "
            f"--channel {channel} --waves 10:1h,100)"
        ))])  # fmt: skip
    before = current.rollout.hold
    text = model.path.read_text(encoding="utf-8")
    new_text = set_hold(text, model.file, channel, reason)
    load_manifest(parse_yaml(new_text.encode(), model.file), "RegisteredModel")
    changed = new_text != text
    if changed:
        write_atomic(model.path, new_text.encode())
        stage(repo.root, [model.path])
    return HoldResult(model.file, channel, current.version, reason, before, changed)


def rollback(start: Path, name: str, channel: str, to: str | None = None) -> PromoteResult:
    """Point ``channel`` back at the version it served before (or at ``to``), to all devices.

    Without ``to``, the version is the newest one the channel served (git history of
    ``model.yaml``) that ranks below what it serves now and is neither deprecated nor
    removed.  With ``to``, that version must have served this channel or a later one
    in the promotion order, and rank below the current one (going forward is a
    promotion).  The edit is the one ``promote`` makes: validated, atomic, staged.

    Raises:
        RepositoryError: not inside a repository.
        ManifestError: the model is unknown or one of its manifests is invalid.
        PolicyError: nothing to go back to, or ``to`` is not a version to go back to.
        ToolError: git fails.
    """
    repo = load_repository(start, jobs=1)
    model = declared_model(repo, name)
    declared, deprecated = declared_versions(repo, model)
    order = model.manifest.spec.promotion.order
    current = model.manifest.spec.channels.get(channel)
    if current is None:
        listed = ", ".join(sorted(model.manifest.spec.channels)) or "none"
        why = f"channel {channel!r} of {name!r} serves nothing to roll back (serving: {listed})"
        if order and channel not in order:
            why = unknown_channel(name, order, channel)
        raise PolicyError([Problem(model.file, why)])
    now = current.version
    history = served_history(repo, model)
    target = to if to is not None else rollback_target(history, channel, now, declared, deprecated)
    if target is None:
        raise PolicyError([Problem(model.file, (
            f"no release of {name!r} served a version below {now} on {channel!r} that "
            "is still declared and not deprecated; name one with --to, or promote"
        ))])  # fmt: skip
    problem = rollback_problem(
        model, history, channel, now=now, to=target, declared=declared, deprecated=deprecated
    )
    if problem is not None:
        raise PolicyError([Problem(model.file, problem)])
    return _write_channel(repo, model, channel, target, None)


def rollback_target(
    history: ChannelHistory, channel: str, now: str, declared: set[str], deprecated: dict[str, str]
) -> str | None:
    """The newest version the channel served below ``now`` that may serve again."""
    bound = parse_version(now)
    for version in reversed(history.assignments.get(channel, ())):
        if parse_version(version) < bound and version in declared and version not in deprecated:
            return version
    return None


def rollback_problem(
    model: ModelEntry,
    history: ChannelHistory,
    channel: str,
    *,
    now: str,
    to: str,
    declared: set[str],
    deprecated: dict[str, str],
) -> str | None:
    """Why ``to`` is not a version ``channel`` may go back to (None if it is)."""
    name = model.name
    if to not in declared:
        close = get_close_matches(to, sorted(declared), n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        listed = ", ".join(sorted(declared, key=parse_version)) or "none"
        return f"version {to} is not declared for model {name!r} (declared: {listed}){hint}"
    if to in deprecated:
        return f"version {to} of {name!r} is deprecated ({deprecated[to]}); it cannot serve again"
    if to == now:
        return f"channel {channel!r} of {name!r} already serves {to}"
    if parse_version(to) > parse_version(now):
        return (
            f"version {to} is newer than what {channel!r} serves ({now}): going forward is "
            f"a promotion (modelreg promote {name} {to} --channel {channel})"
        )
    order = model.manifest.spec.promotion.order
    if order and not served_channels(order, channel, history.served(), to):
        seen = ", ".join(sorted(history.served().get(channel, ()), key=parse_version))
        return (
            f"version {to} never served {channel!r} or a later channel of {name!r} in a "
            f"release ({channel!r} served: {seen or 'nothing'}); a version that did not "
            "serve it goes through the promotion order (modelreg promote)"
        )
    return None
