"""Looking around the registry: ``history``, ``show``, ``list`` (read-only)."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from modelreg.cli._output import detail, emit_json, error_lines
from registry.errors import one_line

if TYPE_CHECKING:
    from registry.history import Event
    from registry.repository import Repository, VersionEntry
    from signing.workspace import ReleaseState

_NO_CACHE = click.option(
    "--no-cache", is_flag=True, help="Parse every file again (ignore .modelreg/cache)."
)
_JSON = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")


def _load(no_cache: bool, model: str | None = None) -> Repository:
    """The repository; with ``model``, only that model's folder is parsed (what one
    model's ``show`` or ``history`` needs), and everything when it is not there (the
    error then suggests the closest name)."""
    from registry.repository import load_repository

    if model is not None:
        repo = load_repository(Path.cwd(), cache=not no_cache, models=[model])
        if model in repo.models or any(m == model for m, _ in repo.broken):
            return repo
    return load_repository(Path.cwd(), cache=not no_cache)


def _model_of(ref: str) -> str:
    for mark in ("@", ":"):
        if mark in ref:
            return ref.partition(mark)[0]
    return ref


def _releases(repo: Repository) -> dict[tuple[str, str], ReleaseState]:
    from signing.workspace import release_state

    return release_state(repo.root, repo.config) or {}


def _git_relative(top: Path, path: Path) -> str:
    return path.resolve().relative_to(top.resolve()).as_posix()


def _table(rows: Sequence[tuple[str, ...]], header: tuple[str, ...]) -> None:
    # a cell is one line: an author or a subject may hold newlines and tabs
    cells = [header, *(tuple(one_line(c) for c in row) for row in rows)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    for row in cells:
        detail("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def _problems_note(repo: Repository) -> None:
    """Each manifest that did not load, one line each, then exit 1 (what was shown
    leaves them out)."""
    if repo.problems:
        error_lines(str(p) for p in repo.problems)
        error_lines([f"{len(repo.problems)} manifest problem(s); run `modelreg validate`"])
        sys.exit(1)


@click.command()
@click.argument("name")
@click.option("--channel", "-c", help="Only this channel's promotions and rollbacks.")
@_JSON
@_NO_CACHE
def history(name: str, channel: str | None, as_json: bool, no_cache: bool) -> None:
    """Every version added or deprecated, promotion, rollback, rollout hold and release
    of model NAME, newest first.

    Read from the git history of the model's manifests and the trust metadata on the
    current branch (first parent: a merged pull request is one entry with its number).
    """
    from registry.gitinfo import toplevel
    from registry.history import ModelLog, Release, model_history
    from registry.inspect import model_entry, suggest
    from registry.layout import model_dir
    from signing.release_log import first_listed
    from signing.target_names import artifact_path, deprecation_path
    from signing.workspace import trust_paths

    repo = _load(no_cache, name)
    model_entry(repo, name)
    top = toplevel(repo.root)
    events: list[Event] = []
    if top is not None:
        metadata = trust_paths(repo.root, repo.config).metadata
        trust_dir = _git_relative(top, metadata)
        released = {
            v: s for (m, v), s in _releases(repo).items() if m == name and (s.published or s.signed)
        }
        declared = list(repo.versions.get(name, {}))
        first = first_listed(
            metadata,
            [artifact_path(name, v) for v in released]
            + [deprecation_path(name, v) for v in declared],
        )
        releases = {
            v: Release(f"{trust_dir}/{first[artifact_path(name, v)]}.targets.json", s.ci_run)
            for v, s in released.items()
            if artifact_path(name, v) in first
        }
        deprecations = {
            v: Release(f"{trust_dir}/{first[deprecation_path(name, v)]}.targets.json")
            for v in declared
            if deprecation_path(name, v) in first
        }
        folder = _git_relative(top, model_dir(repo.root / repo.config.manifests, name))
        events = model_history(top, ModelLog(folder, trust_dir, releases, deprecations))
    if channel is not None:
        seen = {e.channel for e in events if e.channel} | set(
            repo.models[name].manifest.spec.channels
        )
        if channel not in seen:
            raise suggest(channel, sorted(seen), "channel", f" for model {name!r}")
        events = [e for e in events if e.channel == channel]
    if as_json:
        emit_json({"model": name, "channel": channel, "events": [e.to_json() for e in events]})
        return
    rows = [
        (
            e.date[:16].replace("T", " "),
            e.commit[:8],
            f"#{e.pr}" if e.pr else "-",
            e.author,
            e.kind,
            e.summary(),
        )
        for e in events
    ]
    if not rows:
        detail(f"no history for {name}" + (f" channel {channel}" if channel else "") + " yet")
        return
    _table(rows, ("date", "commit", "pr", "author", "event", "what"))


@click.command()
@click.argument("ref", metavar="NAME[:VERSION|@CHANNEL]")
@_JSON
@_NO_CACHE
@click.option(
    "--mlflow",
    "with_mlflow",
    is_flag=True,
    help="Also ask MLflow which model version mirrors each version.",
)
@click.option(
    "--provenance",
    "with_provenance",
    is_flag=True,
    help="Also read where a released version came from (its pull request, approvers, CI "
    "run) from its signed description on the artifact remote.",
)
def show(ref: str, as_json: bool, no_cache: bool, with_mlflow: bool, with_provenance: bool) -> None:
    """Show a model, a version (NAME:VERSION) or what a channel serves (NAME@CHANNEL).

    A model: description, owner, task, signature, channels and versions.  A version:
    parent, artifact and its digests, signature, metrics, goldens, targets, the
    channels that serve it, whether it is released (signed and published, by which CI
    run) and the commit that last changed its manifest.
    """
    from registry.gitinfo import last_commits, toplevel
    from registry.inspect import model_facts, resolve, version_facts

    repo = _load(no_cache, _model_of(ref))
    found = resolve(repo, ref)
    releases = _releases(repo)
    facts: dict[str, Any]
    if found.version is None:
        facts = model_facts(repo, found.model)
        facts["released"] = [
            v
            for v in facts["versions"]
            if releases.get((found.model.name, v), None) is not None
            and releases[(found.model.name, v)].published
        ]
    else:
        entry = found.version
        facts = version_facts(repo, found.model, entry)
        if found.channel is not None:
            facts["via_channel"] = found.channel
        state = releases.get((entry.name, entry.version))
        facts["release"] = dataclasses.asdict(state) if state is not None else None
        facts["released"] = bool(state and state.published)
        top = toplevel(repo.root)
        commit = None
        if top is not None:
            rel = _git_relative(top, entry.path)
            under = rel.rsplit("/", 1)[0]
            commit = last_commits(repo.root, [rel], under).get(rel)
        facts["commit"] = {"sha": commit.sha, "date": commit.date} if commit else None
    if with_mlflow:
        from pipelines.register import mlflow_versions

        numbers = mlflow_versions(repo.root, models=[found.model.name])
        if found.version is None:
            facts["mlflow_versions"] = {
                v: numbers.get((found.model.name, v)) for v in facts["versions"]
            }
        else:
            facts["mlflow_version"] = numbers.get((found.model.name, found.version.version))
    if with_provenance and found.version is not None:
        facts["provenance"] = _provenance(repo, found.version, released=facts["released"])
    if as_json:
        emit_json(facts)
    else:
        _print_facts(facts)
    _problems_note(repo)


def _provenance(repo: Repository, entry: VersionEntry, *, released: bool) -> dict[str, Any]:
    """A released version's signed provenance, or why there is none to show."""
    from pipelines.publish import published_provenance
    from registry.errors import RegistryError

    if not released:
        return {"error": "not released yet"}
    try:
        found = published_provenance(repo, entry.name, entry.version)
    except RegistryError as e:
        return {"error": one_line(str(e))}
    if found is None:
        return {"error": "released before provenance was signed"}
    return {"summary": found.summary(), **found.model_dump(mode="json", exclude_none=True)}


def _print_facts(facts: dict[str, Any]) -> None:
    title = facts["model"] + (f":{facts['version']}" if facts["kind"] == "version" else "")
    via = f" (channel {facts['via_channel']})" if facts.get("via_channel") else ""
    detail(f"{title}{via}")
    for key, value in facts.items():
        if key in ("kind", "model", "version", "via_channel"):
            continue
        label = f"{key}:".ljust(16) if len(key) < 15 else f"{key}: "  # never run together
        detail(f"  {label}{_text(key, value)}")


def _text(key: str, value: Any) -> str:
    if value is None or value in ("", [], {}):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if key == "signature":
        return "; ".join(
            f"{side} " + ", ".join(f"{t['name']} {t['dtype']}{t['shape']}" for t in value[side])
            for side in ("inputs", "outputs")
        )
    if key == "channels" and isinstance(value, dict):
        return ", ".join(
            f"{c}={a['version']}"
            + (f" ({a['percent']:g}%)" if a["percent"] is not None else "")
            + (f" [held: {a['hold']}]" if a.get("hold") else "")
            for c, a in value.items()
        )
    if key == "targets" and value and isinstance(value[0], dict):
        return ", ".join(f"{t['name']}={t['engine']}" for t in value)
    if key == "commit" and isinstance(value, dict):
        return f"{value['sha'][:8]} {value['date']}"
    if key == "provenance" and isinstance(value, dict):
        return str(value.get("summary") or f"not shown: {value.get('error')}")
    if isinstance(value, dict):
        return ", ".join(f"{k}={_text(k, v)}" for k, v in value.items())
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    return str(value)


@click.command(name="list")
@_JSON
@_NO_CACHE
def list_(as_json: bool, no_cache: bool) -> None:
    """List the models with their versions and channels."""
    from registry.inspect import list_models

    repo = _load(no_cache)
    models = list_models(repo)
    releases = _releases(repo)
    for m in models:
        m["released"] = [
            v for v in m["versions"] if (s := releases.get((m["model"], v))) and s.published
        ]
    if as_json:
        emit_json({"models": models})
    else:
        rows = [
            (
                m["model"],
                str(len(m["versions"])),
                m["latest"] or "-",
                _text("versions", _ellipsis(m["versions"])),
                _text("channels", m["channels"]),
            )
            for m in models
        ]
        _table(rows, ("model", "count", "latest", "versions", "channels"))
    _problems_note(repo)


def _ellipsis(versions: list[str], keep: int = 6) -> list[str]:
    if len(versions) <= keep:
        return versions
    return [*versions[: keep // 2], "...", *versions[-keep // 2 :]]
