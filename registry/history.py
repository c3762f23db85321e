"""A model's history from git: versions added and deprecated, promotions, rollbacks,
rollout holds, and releases (of versions and of deprecations).

Like ``gto history``, every event is read from the commits of the branch, never from a
separate store: the manifests are the registry.  The cost does not grow with one git
process per commit: one ``git log --name-status`` lists every commit that touched the
model's folder or the trust metadata, and one ``git cat-file --batch`` reads each
``model.yaml`` and version file the log names, whatever the number of commits or versions.

The log follows the first parent (``--first-parent``, merges diffed against it), so a
merged pull request is one event carrying the merge commit's PR number, as a reviewer
saw it on the branch, and the commits inside the pull request are not repeated.

Decisions are pure functions (:func:`parse_log`, :func:`channel_map`,
:func:`derive_events`); :func:`read_log` and :func:`read_blobs` do the I/O.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from registry.errors import ManifestError, ToolError
from registry.gitinfo import git
from registry.layout import model_file, parse_manifest_path
from registry.repository import parse_version
from registry.schema import is_semver
from registry.yamlsrc import parse_yaml

EventKind = Literal[
    "version added", "version removed", "promotion", "rollback", "rollout", "channel removed",
    "released", "deprecated", "deprecation released", "hold", "hold lifted",
]  # fmt: skip

_START: Final = "\x01"
_FORMAT: Final = "%x01%H%x00%aI%x00%cI%x00%an%x00%s"
"""With ``-z``: every field ends with NUL, which no author name, subject or path holds
(an author or a subject is whoever pushed it: a separator they can type, a tab or a
carriage return, would shift or forge fields)."""
_PR: Final = (re.compile(r"Merge pull request #(\d+)"), re.compile(r"\(#(\d+)\)\s*$"))


@dataclass(frozen=True, slots=True)
class LogCommit:
    """One commit of ``git log``, with the files it changed (status letter, path)."""

    sha: str
    author: str
    date: str
    subject: str
    changes: tuple[tuple[str, str], ...] = ()
    committed: str = ""
    """The committer date: when the commit reached the branch by a merge, a rebase or
    a squash (the author date is whatever its author set)."""

    @property
    def pr(self) -> int | None:
        """The pull request the subject names ("Merge pull request #12", "... (#12)")."""
        for pattern in _PR:
            found = pattern.search(self.subject)
            if found:
                return int(found.group(1))
        return None


@dataclass(frozen=True, slots=True)
class Assignment:
    """What a channel served after a commit."""

    version: str
    percent: float | None = None

    def text(self) -> str:
        """``1.1.0`` or ``1.1.0 (10%)``."""
        return self.version if self.percent is None else f"{self.version} ({self.percent:g}%)"


@dataclass(frozen=True, slots=True)
class Event:
    """One thing that happened to a model, in one commit."""

    kind: EventKind
    commit: str
    author: str
    date: str
    subject: str
    pr: int | None
    version: str | None = None
    channel: str | None = None
    previous: str | None = None
    previous_percent: float | None = None
    percent: float | None = None
    ci_run: str | None = None
    reason: str | None = None
    """A deprecation's or a hold's reason."""

    def summary(self) -> str:
        """What changed, in a few words: ``channel production: 1.0.0 -> 1.1.0``."""
        why = f": {self.reason}" if self.reason else ""
        if self.kind in ("hold", "hold lifted"):
            state = "held" if self.kind == "hold" else "resumed"
            return f"channel {self.channel}: rollout {state}{why}"
        if self.channel is None:
            run = f" by CI run {self.ci_run}" if self.ci_run else ""
            return f"version {self.version} {self.kind.removeprefix('version ')}{run}{why}"
        before = Assignment(self.previous, self.previous_percent).text() if self.previous else "-"
        after = Assignment(self.version, self.percent).text() if self.version else "-"
        return f"channel {self.channel}: {before} -> {after}"

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready mapping (``summary`` included)."""
        return {**asdict(self), "summary": self.summary()}


@dataclass(frozen=True)
class Release:
    """When a version's release appeared: the trust file that first lists it.

    Attributes:
        targets_file: git-relative path of the first ``N.targets.json`` naming the
            version's artifact.
        ci_run: the CI run its signed facts name.
    """

    targets_file: str
    ci_run: str | None = None


@dataclass(frozen=True)
class ModelLog:
    """Where a model's history lives in git (git-relative POSIX paths)."""

    model_dir: str
    trust_dir: str | None = None
    releases: Mapping[str, Release] = field(default_factory=dict)
    deprecations: Mapping[str, Release] = field(default_factory=dict)
    """Version -> the trust file that first lists its signed deprecation."""

    @property
    def model_file(self) -> str:
        """The model's ``model.yaml``."""
        manifests, _, model = self.model_dir.rpartition("/")
        return model_file(manifests, model)


def parse_log(text: str) -> list[LogCommit]:
    """Commits from ``git log -z --format=<_FORMAT> --name-status`` output, as listed.

    Fields are read by position between NULs: a commit's five fields, then (status,
    path) pairs up to the next commit's mark, so no text inside a field is read as
    structure.
    """
    commits: list[LogCommit] = []
    tokens = text.split("\0")
    pos = 0
    while pos < len(tokens):
        token = tokens[pos].lstrip("\n")
        if not token.startswith(_START):
            pos += 1  # the empty tail
            continue
        fields = [token[1:], *tokens[pos + 1 : pos + 5]]
        fields += [""] * (5 - len(fields))
        sha, date, committed, author, subject = fields
        pos += 5
        changes: list[tuple[str, str]] = []
        while pos + 1 < len(tokens):
            status = tokens[pos].lstrip("\n")
            if not status or status.startswith(_START):
                break
            changes.append((status[:1], tokens[pos + 1]))
            pos += 2
        commits.append(LogCommit(sha, author, date, subject, tuple(changes), committed))
    return commits


def read_log(root: Path, paths: Sequence[str], rev: str = "HEAD") -> list[LogCommit]:
    """Every first-parent commit of ``rev`` that changed ``paths`` (git-relative), newest first.

    Raises:
        ToolError: git is missing or fails.
    """
    if not paths:
        return []
    head = git(root, "rev-parse", "--verify", "-q", f"{rev}^{{commit}}", check=False)
    if head.returncode != 0:
        return []  # no commit yet
    proc = git(
        root,
        "-c",
        "core.quotePath=false",
        "log",
        "-z",
        f"--format={_FORMAT}",
        "--name-status",
        "--no-renames",
        "--first-parent",
        "--diff-merges=first-parent",
        head.stdout.strip(),
        "--",
        *(f":(top,literal){p}" for p in paths),
    )
    return parse_log(proc.stdout)


def read_blobs(root: Path, specs: Iterable[str]) -> dict[str, bytes | None]:
    """Contents of ``<rev>:<path>`` objects through one ``git cat-file --batch``.

    Missing objects map to None.

    Raises:
        ToolError: git is missing or fails.
    """
    wanted = list(dict.fromkeys(specs))
    if not wanted:
        return {}
    argv = ["git", "-C", str(root), "cat-file", "--batch"]
    try:
        proc = subprocess.run(
            argv, input="".join(f"{s}\n" for s in wanted).encode(), capture_output=True, check=False
        )
    except FileNotFoundError:
        raise ToolError("git is not installed or not on PATH", argv) from None
    if proc.returncode != 0:
        raise ToolError("git cat-file --batch failed", argv, proc.stderr.decode(errors="replace"))
    out: dict[str, bytes | None] = {}
    data = proc.stdout
    pos = 0
    for spec in wanted:
        end = data.index(b"\n", pos)
        header = data[pos:end].split()
        pos = end + 1
        if len(header) == 3 and header[1] == b"blob":
            size = int(header[2])
            out[spec] = data[pos : pos + size]
            pos += size + 1
        else:
            out[spec] = None
    return out


def channel_map(raw: bytes | None, file: str) -> dict[str, Assignment]:
    """The channels a ``model.yaml`` declares, read leniently (an old commit may be broken).

    A file that does not parse, or a channel without a SemVer version, counts as no
    assignment: history reports what was declared, validation what is wrong.
    """
    if raw is None:
        return {}
    try:
        data = parse_yaml(raw, file).data
    except ManifestError:
        return {}
    spec = data.get("spec") if isinstance(data, dict) else None
    channels = spec.get("channels") if isinstance(spec, dict) else None
    out: dict[str, Assignment] = {}
    for name, value in (channels or {}).items() if isinstance(channels, dict) else ():
        version, percent = value, None
        if isinstance(value, dict):
            version = value.get("version")
            rollout = value.get("rollout")
            got = rollout.get("percent") if isinstance(rollout, dict) else None
            percent = float(got) if isinstance(got, int | float) else None
        if isinstance(name, str) and isinstance(version, str) and is_semver(version):
            out[name] = Assignment(version, percent)
    return out


def channel_holds(raw: bytes | None, file: str) -> dict[str, str]:
    """The channels a ``model.yaml`` holds (``rollout.hold``), with the reason, read
    leniently as :func:`channel_map`."""
    data = _lenient(raw, file)
    spec = data.get("spec") if isinstance(data, dict) else None
    channels = spec.get("channels") if isinstance(spec, dict) else None
    out: dict[str, str] = {}
    for name, value in channels.items() if isinstance(channels, dict) else ():
        rollout = value.get("rollout") if isinstance(value, dict) else None
        hold = rollout.get("hold") if isinstance(rollout, dict) else None
        if isinstance(name, str) and isinstance(hold, str) and hold:
            out[name] = hold
    return out


def deprecation_of(raw: bytes | None, file: str) -> str | None:
    """The deprecation reason a version file declares (None: none, or unreadable)."""
    data = _lenient(raw, file)
    spec = data.get("spec") if isinstance(data, dict) else None
    found = spec.get("deprecated") if isinstance(spec, dict) else None
    reason = found.get("reason") if isinstance(found, dict) else None
    return reason if isinstance(reason, str) else None


def _lenient(raw: bytes | None, file: str) -> object:
    if raw is None:
        return None
    try:
        return parse_yaml(raw, file).data
    except ManifestError:
        return None


def _hold_events(
    commit: LogCommit, before: Mapping[str, str], after: Mapping[str, str]
) -> list[Event]:
    base = (commit.sha, commit.author, commit.date, commit.subject, commit.pr)
    events = []
    for channel in sorted(set(before) | set(after)):
        old, new = before.get(channel), after.get(channel)
        if new is not None and new != old:
            events.append(Event("hold", *base, channel=channel, reason=new))
        elif new is None and old is not None:
            events.append(Event("hold lifted", *base, channel=channel, reason=old))
    return events


def _channel_events(
    commit: LogCommit, before: Mapping[str, Assignment], after: Mapping[str, Assignment]
) -> list[Event]:
    events: list[Event] = []
    base = (commit.sha, commit.author, commit.date, commit.subject, commit.pr)
    for channel in sorted(set(before) | set(after)):
        old, new = before.get(channel), after.get(channel)
        if old == new:
            continue
        kind: EventKind
        if new is None:
            kind = "channel removed"
        elif old is None or parse_version(new.version) > parse_version(old.version):
            kind = "promotion"
        elif parse_version(new.version) < parse_version(old.version):
            kind = "rollback"
        else:
            kind = "rollout"
        events.append(
            Event(
                kind,
                *base,
                version=new.version if new else None,
                channel=channel,
                previous=old.version if old else None,
                previous_percent=old.percent if old else None,
                percent=new.percent if new else None,
            )
        )
    return events


def derive_events(
    commits: Sequence[LogCommit], log: ModelLog, models: Mapping[str, bytes | None]
) -> list[Event]:
    """Every event of the model, newest first.

    Args:
        commits: the log, newest first (as :func:`read_log` returns it).
        log: where the model and its trust metadata live.
        models: ``<sha>:<model.yaml>`` -> the file's bytes at that commit.
    """
    manifests, _, model = log.model_dir.rpartition("/")
    by_file: dict[str, list[tuple[EventKind, str, Release]]] = {}
    sources: tuple[tuple[EventKind, Mapping[str, Release]], ...] = (
        ("released", log.releases), ("deprecation released", log.deprecations)
    )  # fmt: skip
    for what, found_in in sources:
        for version, release in found_in.items():
            by_file.setdefault(release.targets_file, []).append((what, version, release))
    channels: dict[str, Assignment] = {}
    holds: dict[str, str] = {}
    deprecated: dict[str, str | None] = {}
    timeline: list[list[Event]] = []
    for commit in reversed(commits):
        here: list[Event] = []
        base = (commit.sha, commit.author, commit.date, commit.subject, commit.pr)
        for status, path in commit.changes:
            found = parse_manifest_path(path, manifests)
            if found is not None and found.model == model and found.version is not None:
                version = found.version
                if not is_semver(version):
                    continue
                if status in "AD":
                    kind: EventKind = "version added" if status == "A" else "version removed"
                    here.append(Event(kind, *base, version=version))
                reason = None if status == "D" else deprecation_of(
                    models.get(f"{commit.sha}:{path}"), path
                )  # fmt: skip
                if reason is not None and deprecated.get(version) is None:
                    here.append(Event("deprecated", *base, version=version, reason=reason))
                deprecated[version] = reason
            elif status == "A" and path in by_file:
                listed = sorted(by_file[path], key=lambda e: (parse_version(e[1]), e[0]))
                here += [
                    Event(what, *base, version=version, ci_run=release.ci_run)
                    for what, version, release in listed
                ]
            elif path == log.model_file:
                raw = None if status == "D" else models.get(f"{commit.sha}:{path}")
                after = channel_map(raw, path)
                here.extend(_channel_events(commit, channels, after))
                channels = after
                held = channel_holds(raw, path)
                here.extend(_hold_events(commit, holds, held))
                holds = held
        timeline.append(here)
    return [event for here in reversed(timeline) for event in here]


def model_history(root: Path, log: ModelLog) -> list[Event]:
    """Read the git history of one model (two git processes in all), newest first.

    Raises:
        ToolError: git is missing or fails.
    """
    paths = [log.model_dir] + ([log.trust_dir] if log.trust_dir else [])
    commits = read_log(root, paths)
    manifests, _, model = log.model_dir.rpartition("/")

    def wanted(path: str) -> bool:  # model.yaml and the version files
        if path == log.model_file:
            return True
        found = parse_manifest_path(path, manifests)
        return found is not None and found.model == model and found.version is not None

    specs = [
        f"{c.sha}:{path}" for c in commits for status, path in c.changes
        if status != "D" and wanted(path)
    ]  # fmt: skip
    return derive_events(commits, log, read_blobs(root, specs))


@dataclass(frozen=True)
class ChannelHistory:
    """What each channel of one model served, oldest first, from git history.

    Attributes:
        assignments: channel -> the versions it pointed at, in order, a version
            repeated only when the channel left it and came back (a rollout step
            that keeps the version is not a new assignment).
    """

    assignments: Mapping[str, Sequence[str]]

    def served(self) -> dict[str, frozenset[str]]:
        """Channel -> every version it served (the rollback policy's input)."""
        return {c: frozenset(v) for c, v in self.assignments.items()}

    def before(self, channel: str, current: str) -> str | None:
        """The newest version ``channel`` served that ranks below ``current``.

        After 1.0.0 -> 1.1.0 -> 1.2.0 -> 1.1.0 (a rollback) it is 1.0.0: going back
        twice goes further back, never forward again.
        """
        now = parse_version(current)
        for version in reversed(self.assignments.get(channel, ())):
            if parse_version(version) < now:
                return version
        return None


def timeline(maps: Iterable[Mapping[str, Assignment]]) -> ChannelHistory:
    """A :class:`ChannelHistory` from a model's channel maps, oldest first (pure)."""
    out: dict[str, list[str]] = {}
    for channels in maps:
        for channel, assignment in channels.items():
            seen = out.setdefault(channel, [])
            if not seen or seen[-1] != assignment.version:
                seen.append(assignment.version)
    return ChannelHistory(out)


def channel_history(
    root: Path, model_file: str, rev: str = "HEAD", *, released: str | None = None
) -> ChannelHistory:
    """What one model's channels served on ``rev``'s first-parent history.

    With ``released`` (the git-relative trust metadata folder), only what was released
    counts: the channels as ``model.yaml`` stood at each commit that added or changed
    signed targets metadata (a release commits its metadata on top of what it
    published).  A state that was committed and changed again before any release
    (inside a fast-forward or rebase merge, say) never reached a device and was never
    judged as a whole: it is not history a rollback may lean on.

    Args:
        root: the repository.
        model_file: git-relative path of the ``model.yaml``.
        rev: the commit whose history is read (``ci pr`` reads the base's).
        released: the trust metadata folder, git-relative; None counts every commit.

    Raises:
        ToolError: git is missing or fails.
    """
    commits, blobs = _model_file_log(root, model_file, rev, released)
    maps: list[dict[str, Assignment]] = []
    state: dict[str, Assignment] = {}
    prefix = f"{released.rstrip('/')}/" if released else None
    for commit in commits:
        release = False
        for status, path in commit.changes:
            if path == model_file:
                state = (
                    {} if status == "D" else channel_map(blobs.get(f"{commit.sha}:{path}"), path)
                )
                if prefix is None:
                    maps.append(state)
            elif prefix and path.startswith(prefix) and path.endswith("targets.json"):
                release = release or status in "AM"
        if release:
            maps.append(state)
    return timeline(maps)


def released_since(
    commits: Sequence[LogCommit],
    model_file: str,
    blobs: Mapping[str, bytes | None],
    channel: str,
    current: Assignment,
    *,
    released: str | None = None,
) -> LogCommit | None:
    """The release since which ``channel`` has served ``current`` without a break (pure).

    A rollout wave starts when devices can see it: at the first release (a commit
    that adds or changes signed targets metadata) of a ``model.yaml`` state in which
    the channel has ``current``'s version and percent, counting back from the newest
    release while every release in between had it too.  Edits of the rollout that
    keep both (waves, stop conditions, a hold) do not restart it.

    Args:
        commits: ``read_log`` of ``model_file`` and the trust folder, oldest first.
        model_file: git-relative path of the ``model.yaml``.
        blobs: ``<sha>:<model_file>`` -> the file's bytes at that commit.
        channel: the channel.
        current: what the channel serves now (the work tree's, committed).
        released: the trust metadata folder, git-relative; None counts every commit
            that changed ``model_file`` as a release.

    Returns:
        The release commit, or None when the newest release does not serve
        ``current`` on the channel (it is not released yet).
    """
    prefix = f"{released.rstrip('/')}/" if released else None
    state: Assignment | None = None
    last: Assignment | None = None
    since: LogCommit | None = None
    for commit in commits:
        release = False
        for status, path in commit.changes:
            if path == model_file:
                raw = None if status == "D" else blobs.get(f"{commit.sha}:{path}")
                state = channel_map(raw, path).get(channel)
                release = release or prefix is None
            elif prefix and path.startswith(prefix) and path.endswith("targets.json"):
                release = release or status in "AM"
        if release:
            if since is None or state != last:
                since = commit
            last = state
    return since if last == current else None


def rollout_started(
    root: Path,
    model_file: str,
    channel: str,
    current: Assignment,
    *,
    released: str | None = None,
    rev: str = "HEAD",
) -> LogCommit | None:
    """When ``channel`` started serving ``current`` to devices: :func:`released_since`
    over ``rev``'s first-parent history (two git processes).

    Raises:
        ToolError: git is missing or fails.
    """
    commits, blobs = _model_file_log(root, model_file, rev, released)
    return released_since(commits, model_file, blobs, channel, current, released=released)


def _model_file_log(
    root: Path, model_file: str, rev: str, released: str | None
) -> tuple[list[LogCommit], dict[str, bytes | None]]:
    """Oldest first, the commits of ``rev`` that changed ``model_file`` (or, with
    ``released``, the trust metadata), and that file's content at each of them."""
    paths = [model_file] + ([released] if released else [])
    commits = list(reversed(read_log(root, paths, rev)))
    blobs = read_blobs(
        root,
        [
            f"{c.sha}:{model_file}"
            for c in commits
            for st, p in c.changes
            if p == model_file and st != "D"
        ],
    )
    return commits, blobs
