"""``modelreg fleet advance``: commit the next rollout wave of each channel that may take
it, or hold a rollout whose stop condition tripped (the I/O around ``fleet.waves``).

Everything it reads comes from git and the device reports: a wave's start is the
release that first served it (``registry.history.rollout_started``), never a file of
its own, so the whole rollout stays in the history of ``model.yaml``.  Each change is
one commit of the model's ``model.yaml`` alone, on the model's promotion branch, made
with the same round-trip edit as ``modelreg promote --percent``; the release job then
signs the new percent as it signs any promotion.  Nothing is ever rolled back here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, MutableMapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fleet.summary import ChannelProgress, channel_progress
from fleet.waves import Advance, Decision, Done, Progress, Stop, Wait, decide
from registry.atomic import write_atomic
from registry.device_report import DeviceReport
from registry.edit import set_channel, set_hold
from registry.errors import ManifestError, PolicyError, Problem, RepositoryError, UsageError
from registry.gitinfo import git
from registry.history import Assignment, LogCommit, rollout_started
from registry.layout import model_file
from registry.loader import load_manifest
from registry.promote import declared_model, git_path
from registry.repository import Repository, load_repository
from registry.schema import Rollout
from registry.yamlsrc import parse_yaml

__all__ = [
    "ChannelStep",
    "ProgressSource",
    "StagedChannel",
    "advance",
    "progress_from_reports",
    "staged_channels",
]

ProgressSource = Callable[[str, str, str, float], Progress]
"""``(model, channel, version, percent)`` -> the version's progress on the devices of
that channel's cohort at that percent (made from the device reports)."""


def progress_from_reports(
    reports: Iterable[DeviceReport],
    now: datetime,
    seen: MutableMapping[tuple[str, str], ChannelProgress] | None = None,
) -> ProgressSource:
    """The progress ``fleet advance`` decides on, from device reports already read (and,
    where the repository enrolls devices, counted: ``fleet.reports.load_reports``):
    ``fleet.summary.channel_progress`` reduced to what ``fleet.waves`` reads, the
    summed shadow comparisons included; ``seen`` keeps each channel's full progress
    (for the output)."""
    kept = list(reports)

    def progress_of(model: str, channel: str, version: str, percent: float) -> Progress:
        found = channel_progress(kept, model, channel, version, percent, now=now)
        if seen is not None:
            seen[model, channel] = found
        return Progress(
            found.cohort, found.on_target, len(found.failed), found.subscribed,
            found.lowest_draw, behaviour=found.behaviour,
        )  # fmt: skip

    return progress_of


@dataclass(frozen=True, slots=True)
class StagedChannel:
    """A channel whose rollout lists waves."""

    model: str
    channel: str
    version: str
    rollout: Rollout
    file: str
    path: Path


@dataclass(frozen=True, slots=True)
class ChannelStep:
    """What ``fleet advance`` found and did for one channel.

    Attributes:
        started: the release that started the current wave (None: not released).
        commit: the commit made (an advance or a hold); None when nothing was
            written (waiting, done, already held, or a dry run).
    """

    target: StagedChannel
    started: LogCommit | None
    progress: Progress
    decision: Decision
    commit: str | None = None

    @property
    def action(self) -> str:
        """``advance``, ``wait``, ``stop`` (tripped now), ``held`` or ``done``."""
        decision = self.decision
        if isinstance(decision, Stop):
            return "held" if decision.held else "stop"
        return {Advance: "advance", Wait: "wait", Done: "done"}[type(decision)]

    def text(self) -> str:
        """One line: ``mlp canary 1.1.0 at 10% (wave 1 of 3): advance to 50%: ...``
        (``wait: ...``, ``stop, rollout held: ...``, ``on hold: ...``, ``done: ...``)."""
        t = self.target
        index = t.rollout.wave_index()
        where = f"{t.model} {t.channel} {t.version} at {t.rollout.percent:g}%"
        where += f" (wave {(index or 0) + 1} of {len(t.rollout.waves)})"
        decision = self.decision
        what = self.action
        if isinstance(decision, Advance):
            what = f"advance to {decision.to_percent:g}%"
        elif isinstance(decision, Stop) and not decision.held:
            what = "stop, rollout held"
        done = f" [{self.commit[:12]}]" if self.commit else ""
        if what == "held":  # the reason says it: "on hold: ..."
            return f"{where}: {decision.reason}{done}"
        return f"{where}: {what}: {decision.reason}{done}"

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready mapping of the step."""
        t, d, p = self.target, self.decision, self.progress
        until = d.until.isoformat() if isinstance(d, Wait) and d.until else None
        return {
            "model": t.model,
            "channel": t.channel,
            "version": t.version,
            "percent": t.rollout.percent,
            "wave": (t.rollout.wave_index() or 0) + 1,
            "waves": [w.percent for w in t.rollout.waves],
            "action": self.action,
            "reason": d.reason,
            "to_percent": d.to_percent if isinstance(d, Advance) else None,
            "until": until,
            "started": {"commit": self.started.sha, "date": self.started.date}
            if self.started
            else None,
            "progress": {
                "cohort": p.cohort,
                "on_target": p.on_target,
                "failed": p.failed,
                "failure_share": p.failure_share,
                "behaviour": None if p.behaviour is None else p.behaviour.figures(),
            },
            "commit": self.commit,
        }


def staged_channels(
    repo: Repository, model: str | None = None, channel: str | None = None
) -> list[StagedChannel]:
    """The channels with rollout waves, by model then channel name.

    Raises:
        ManifestError: ``model`` is not declared or does not load.
        UsageError: ``model`` or ``channel`` was given and names no channel with waves.
    """
    names = [declared_model(repo, model).name] if model is not None else sorted(repo.models)
    found: list[StagedChannel] = []
    for name in names:
        entry = repo.models[name]
        for ch, assignment in sorted(entry.manifest.spec.channels.items()):
            rollout = assignment.rollout
            if (channel is None or ch == channel) and rollout is not None and rollout.waves:
                found.append(
                    StagedChannel(name, ch, assignment.version, rollout, entry.file, entry.path)
                )
    if not found and (model is not None or channel is not None):
        asked = [f"model {model!r}"] if model is not None else []
        asked += [f"channel {channel!r}"] if channel is not None else []
        raise UsageError(f"no channel with rollout waves matches {' and '.join(asked)}")
    return found


def _started_at(commit: LogCommit | None) -> datetime | None:
    """When a wave's release reached the branch: the later of its author and committer
    dates (an author date can be set back to any time; a merge, rebase or squash sets
    the committer date), so that a soak is never shortened by a date someone chose."""
    if commit is None:
        return None
    dates = [datetime.fromisoformat(d) for d in (commit.date, commit.committed) if d]
    return max(d if d.tzinfo is not None else d.replace(tzinfo=UTC) for d in dates)


def _committed(repo: Repository, target: StagedChannel) -> None:
    """Refuse a ``model.yaml`` that differs from HEAD: the decision reads the history of
    what is committed, and the commit must carry nothing else."""
    proc = git(repo.root, "diff", "--quiet", "HEAD", "--", str(target.path), check=False)
    if proc.returncode != 0:
        raise RepositoryError(
            f"{target.file} has changes that are not committed; fleet advance decides from "
            "and commits on top of HEAD (commit or stash them)"
        )


def _on_branch(repo: Repository, target: StagedChannel) -> None:
    branch = repo.models[target.model].manifest.spec.promotion.branch
    proc = git(repo.root, "symbolic-ref", "--quiet", "--short", "HEAD", check=False)
    here = proc.stdout.strip() if proc.returncode == 0 else ""
    if here != branch:
        shown = f"branch {here!r}" if here else "a detached HEAD"
        raise PolicyError([Problem(target.file, (
            f"rollout waves of {target.model!r} are committed on {branch!r}, its promotion "
            f"branch, not on {shown} (use --dry-run to see the decision)"
        ))])  # fmt: skip


def _commit(repo: Repository, target: StagedChannel, text: str, message: list[str]) -> str:
    """Write ``text`` as the model's ``model.yaml`` (validated first) and commit that file
    alone; the commit's SHA."""
    load_manifest(parse_yaml(text.encode(), target.file), "RegisteredModel")
    write_atomic(target.path, text.encode())
    args = ["commit", "-q"]
    for paragraph in message:
        args += ["-m", paragraph]
    git(repo.root, *args, "--", str(target.path))
    return git(repo.root, "rev-parse", "HEAD").stdout.strip()


def _apply(repo: Repository, step: ChannelStep) -> ChannelStep:
    t, d = step.target, step.decision
    where = f"{t.model} {t.channel} {t.version}"
    text = t.path.read_text(encoding="utf-8")
    if isinstance(d, Advance):
        new = set_channel(text, t.file, t.channel, t.version, d.to_percent)
        subject = (
            f"modelreg: {where} rollout {t.rollout.percent:g}% -> {d.to_percent:g}% "
            f"(wave {d.wave} of {len(t.rollout.waves)})"
        )
        body = f"{d.reason}."
    elif isinstance(d, Stop) and not d.held:
        new = set_hold(text, t.file, t.channel, d.reason)
        subject = f"modelreg: hold {where} rollout at {t.rollout.percent:g}%"
        body = (
            f"{d.reason}. Remove rollout.hold to go on, or roll back "
            f"(modelreg rollback {t.model} --channel {t.channel})."
        )
    else:
        return step
    started = f"{step.started.sha[:12]} ({step.started.date})" if step.started else "none"
    trailer = f"Decided by modelreg fleet advance from the device reports; wave release: {started}."
    sha = _commit(repo, t, new, [subject, body, trailer])
    return ChannelStep(t, step.started, step.progress, d, sha)


def advance(
    start: Path,
    progress_of: ProgressSource,
    *,
    model: str | None = None,
    channel: str | None = None,
    now: datetime | None = None,
    dry_run: bool = False,
) -> list[ChannelStep]:
    """Judge every channel with rollout waves and commit what the fleet allows.

    An advance commits ``rollout.percent`` of the next wave; a stop condition that
    trips commits ``rollout.hold`` with the reason (so that the next run, and every
    reader of the history, sees the rollout stopped, and it does not resume by itself
    when a report changes); waiting, done and held channels are left as they are.

    Args:
        start: a folder inside the repository.
        progress_of: the fleet's progress on a channel's version (device reports).
        model: only this model's channels.
        channel: only channels of this name.
        now: the time to judge at (default: the clock, UTC).
        dry_run: decide and report, write and commit nothing.

    Returns:
        One step per channel with waves, in model and channel order.

    Raises:
        RepositoryError: not inside a repository, or a ``model.yaml`` to change has
            uncommitted changes.
        ManifestError: a manifest does not load, or ``model`` is unknown.
        PolicyError: HEAD is not the model's promotion branch (not for a dry run).
        UsageError: ``model``/``channel`` name no channel with waves.
        ToolError: git fails.
    """
    repo = load_repository(start, jobs=1)
    if repo.problems:
        raise ManifestError(repo.problems)
    moment = now or datetime.now(UTC)
    trust = git_path(repo, repo.config.trust.metadata)
    steps: list[ChannelStep] = []
    for target in staged_channels(repo, model, channel):
        declared = git_path(repo, model_file(repo.config.manifests, target.model))
        if declared is None:
            raise RepositoryError(f"{repo.root} is not inside a git work tree")
        if not dry_run:
            _committed(repo, target)
        current = Assignment(target.version, target.rollout.percent)
        started = rollout_started(repo.root, declared, target.channel, current, released=trust)
        progress = progress_of(target.model, target.channel, target.version, target.rollout.percent)
        decision = decide(
            target.rollout, _started_at(started), moment, progress, version=target.version
        )
        step = ChannelStep(target, started, progress, decision)
        writes = isinstance(decision, Advance) or (isinstance(decision, Stop) and not decision.held)
        if writes and not dry_run:
            _on_branch(repo, target)
            step = _apply(repo, step)
        steps.append(step)
    return steps
