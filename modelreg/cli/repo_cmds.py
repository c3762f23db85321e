"""Repository authoring: ``init``, ``model add``, ``version add``, ``promote``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from modelreg.cli._output import detail, display_path, emit_json, ok, warning_lines

if TYPE_CHECKING:
    from registry.promote import PromoteResult

_json = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")


def _pairs(values: tuple[str, ...], what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint=what)
        out[key] = value
    return out


def _metrics(values: tuple[str, ...]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in _pairs(values, "--metric").items():
        try:
            out[key] = float(value)
        except ValueError:
            raise click.BadParameter(
                f"{key}={value!r} is not a number", param_hint="--metric"
            ) from None
    return out


def _target(text: str) -> dict[str, str]:
    name, sep, engine = text.partition("=")
    kind, _, precision = engine.partition(":")
    if not sep or not name or kind not in ("onnxruntime", "tensorrt"):
        raise click.BadParameter(
            f"expected NAME=onnxruntime or NAME=tensorrt[:PRECISION], got {text!r}",
            param_hint="--target",
        )
    target = {"name": name, "engine": kind}
    if precision:
        if kind != "tensorrt":
            raise click.BadParameter(
                "only tensorrt targets take a precision", param_hint="--target"
            )
        target["precision"] = precision
    return target


@click.command()
@click.argument("directory", type=click.Path(path_type=Path), default=".")
@click.option(
    "--remote", metavar="URL", help="DVC remote URL (default: a local folder .modelreg/remote)."
)
@click.option(
    "--branch", default="main", show_default=True, help="Initial branch when git is initialized."
)
@click.option("--no-trust", is_flag=True, help="Skip creating keys and the signed trust root.")
@_json
def init(directory: Path, remote: str | None, branch: str, no_trust: bool, as_json: bool) -> None:
    """Scaffold a GitOps model repository in DIRECTORY.

    Initializes git (if needed) and DVC with a default remote, writes modelreg.yaml,
    manifests/ and the manifest JSON Schemas, and creates the trust root (TUF root
    metadata and keys for the root, targets, snapshot and timestamp roles).
    """
    from pipelines.authoring import init_repo

    result = init_repo(directory, remote=remote, branch=branch, trust=not no_trust)
    if as_json:
        emit_json(
            {
                "root": str(result.root),
                "remote": result.remote,
                "remote_is_local_folder": remote is None,
                "modelreg_pinned_by_version_only": result.self_pin,
                "git_initialized": result.git_initialized,
                "created": [str(p) for p in result.created],
                "keys": [str(p) for p in result.keys],
            }
        )
        return
    ok(f"initialized modelreg repository in {result.root}")
    detail(f"  DVC remote: {result.remote}")
    if result.self_pin is not None:
        click.echo(
            f"  note: the workflows pin modelreg by version only ({result.self_pin}); "
            "see .github/modelreg-self-requirements.txt",
            err=True,
        )
    if remote is None:
        click.echo(
            "  note: this DVC remote is a folder inside this clone: teammates' clones and CI "
            "cannot reach it; for a team, use a shared one: modelreg init --remote "
            "s3://bucket/path (or `dvc remote modify storage url URL`)",
            err=True,
        )
    if result.keys:
        keys_dir = display_path(result.keys[0].parent)
        click.echo(f"  trust root: trust/metadata/1.root.json; keys in {keys_dir}/")
        click.echo("  move the root key offline and give CI the online keys as secrets")
    click.echo(
        "  next: modelreg model add NAME; modelreg version add NAME 1.0.0 --artifact model.onnx"
    )


@click.group()
def model() -> None:
    """Declare registered models."""


@model.command("add")
@click.argument("name")
@click.option("--owner", default="", help="Owner (default: git user.email).")
@click.option("--task", default="", help="What the model does, e.g. classification.")
@click.option("--description", default="", help="One paragraph about the model.")
@click.option("--label", "labels", multiple=True, metavar="KEY=VALUE", help="Label (repeatable).")
@click.option(
    "--target", "targets", multiple=True, metavar="NAME", help="Allowed target (repeatable)."
)
@click.option(
    "--channel-order",
    default="",
    metavar="C1,C2",
    help="Promotion order of channels, e.g. canary,production.",
)
@click.option(
    "--signature-from",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Take the I/O signature from this ONNX file (default: from the first version).",
)
@_json
def model_add(
    name: str,
    owner: str,
    task: str,
    description: str,
    labels: tuple[str, ...],
    targets: tuple[str, ...],
    channel_order: str,
    signature_from: Path | None,
    as_json: bool,
) -> None:
    """Declare model NAME (writes manifests/NAME/model.yaml)."""
    from pipelines.authoring import add_model

    path = add_model(
        Path.cwd(),
        name,
        owner=owner,
        task=task,
        description=description,
        labels=_pairs(labels, "--label"),
        targets=targets,
        order=[c.strip() for c in channel_order.split(",") if c.strip()],
        signature_from=signature_from,
    )
    if as_json:
        emit_json({"model": name, "manifest": str(path)})
    else:
        ok(f"declared model {name} in {display_path(path)}")


@click.group()
def version() -> None:
    """Declare model versions."""


@version.command("add")
@click.argument("name")
@click.argument("version_", metavar="VERSION")
@click.option(
    "--artifact",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The ONNX file of this version.",
)
@click.option("--parent", metavar="VERSION", help="Parent version (default: the latest older one).")
@click.option("--no-parent", is_flag=True, help="Declare no parent even if older versions exist.")
@click.option("--description", default="", help="What changed in this version.")
@click.option(
    "--metric", "metrics", multiple=True, metavar="KEY=NUMBER", help="Metric (repeatable)."
)
@click.option("--source-run", default=None, help="Training run id or URL.")
@click.option("--dataset", "datasets", multiple=True, help="Dataset reference (repeatable).")
@click.option(
    "--golden-inputs",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="An .npz of model inputs; expected outputs are recorded with ONNX Runtime.",
)
@click.option(
    "--target",
    "targets",
    multiple=True,
    metavar="NAME=ENGINE",
    help="Build target (repeatable): NAME=onnxruntime or NAME=tensorrt[:fp32|fp16|int8].",
)
@click.option(
    "--signature-change",
    metavar="TEXT",
    help="This version changes the model's inputs or outputs, and why (it serves its own "
    "signature; the model's stays).",
)
@click.option(
    "--update-model-signature",
    is_flag=True,
    help="Give the model this version's I/O signature (only when every other version fits it).",
)
@_json
def version_add(
    name: str,
    version_: str,
    artifact: Path,
    parent: str | None,
    no_parent: bool,
    description: str,
    metrics: tuple[str, ...],
    source_run: str | None,
    datasets: tuple[str, ...],
    golden_inputs: Path | None,
    targets: tuple[str, ...],
    signature_change: str | None,
    update_model_signature: bool,
    as_json: bool,
) -> None:
    """Declare VERSION of model NAME with its ONNX artifact (tracked by DVC)."""
    from pipelines.authoring import add_version

    if parent and no_parent:
        raise click.UsageError("--parent and --no-parent exclude each other")
    source = {"run": source_run, "datasets": list(datasets)} if source_run or datasets else None
    result = add_version(
        Path.cwd(),
        name,
        version_,
        artifact,
        parent=parent,
        auto_parent=not no_parent,
        description=description,
        metrics=_metrics(metrics),
        source=source,
        golden_inputs=golden_inputs,
        update_model_signature=update_model_signature,
        signature_change=" ".join(signature_change.split()) if signature_change else None,
        targets=[_target(t) for t in targets],
    )
    if as_json:
        emit_json(
            {
                "model": name,
                "version": version_,
                "manifest": str(result.manifest),
                "artifact": str(result.artifact),
                "pointer": str(result.pointer),
                "parent": result.parent,
                "signature": result.signature.model_dump(),
                "model_signature_updated": result.model_signature_updated,
                "goldens": [str(p) for p in result.goldens],
                "warnings": result.warnings,
            }
        )
        return
    parent_note = f" (parent {result.parent})" if result.parent else ""
    ok(f"declared {name} {version_}{parent_note} in {display_path(result.manifest)}")
    click.echo(f"  artifact: {display_path(result.artifact)} (DVC pointer {result.pointer.name})")
    if result.model_signature_updated:
        click.echo(f"  model {name} signature set from this version")
    warning_lines(f"warning: {w}" for w in result.warnings)


@click.command()
@click.argument("name")
@click.argument("version_", metavar="VERSION")
@click.option("--channel", "-c", required=True, help="Channel to point at VERSION.")
@click.option(
    "--percent",
    type=click.FloatRange(0, 100),
    help="Roll out to this share of the channel's devices (default: all).",
)
@click.option(
    "--waves",
    metavar="P:SOAK,...",
    help="A staged rollout instead: waves of PERCENT[:SOAK], e.g. 10:1h,50:4h,100 (the "
    "channel starts at the first; `modelreg fleet advance` takes the next ones).",
)
@click.option(
    "--stop-failures",
    metavar="SHARE",
    help="With --waves: hold the rollout when more than this share of a wave's devices "
    "failed the version (5% or 0.05).",
)
@click.option(
    "--min-reports",
    type=click.IntRange(0, 10_000_000),
    help="With --waves: devices of a wave that must report running the version before "
    "the next wave.",
)
@click.option(
    "--shadow",
    metavar="SHARE",
    help="The channel's devices compare this share of requests with the previous "
    "version while its health gate is open (5% or 0.05; docs/guide/behaviour.md).",
)
@click.option(
    "--stop-agreement",
    metavar="SHARE",
    help="With --waves: hold the rollout when a wave's devices report that fewer "
    "answers than this keep the previous version's top class (95%; needs a shadow).",
)
@click.option(
    "--stop-drift",
    metavar="SHARE",
    help="With --waves: hold the rollout when the answers differ from the previous "
    "version's by more than this relative L1 difference (5%; needs a shadow).",
)
@click.option(
    "--stop-p99",
    type=click.FloatRange(1, 1000),
    metavar="RATIO",
    help="With --waves: hold the rollout when the version's p99 run time is more than "
    "RATIO times the previous version's on the same requests (needs a shadow).",
)
@click.option("--force", is_flag=True, help="Ignore the promotion order policy.")
@_json
def promote(
    name: str,
    version_: str,
    channel: str,
    percent: float | None,
    waves: str | None,
    stop_failures: str | None,
    min_reports: int | None,
    shadow: str | None,
    stop_agreement: str | None,
    stop_drift: str | None,
    stop_p99: float | None,
    force: bool,
    as_json: bool,
) -> None:
    """Point CHANNEL of model NAME at VERSION (edits model.yaml in place)."""
    from registry.promote import promote as do_promote

    stop: dict[str, float | int] = {}
    if stop_failures is not None:
        stop["failure_share"] = _share(stop_failures)
    if min_reports is not None:
        stop["min_reports"] = min_reports
    if stop_agreement is not None:
        stop["min_agreement"] = _share(stop_agreement)
    if stop_drift is not None:
        stop["max_output_drift"] = _share(stop_drift)
    if stop_p99 is not None:
        stop["max_p99_ratio"] = stop_p99
    result = do_promote(
        Path.cwd(), name, version_, channel, percent, force=force,
        waves=_waves(waves) if waves is not None else (), stop=stop or None,
        shadow=_share(shadow) if shadow is not None else None,
    )  # fmt: skip
    if as_json:
        emit_json(
            {
                "model": name,
                "version": result.version,
                "channel": result.channel,
                "previous": result.previous,
                "percent": result.percent,
                "changed": result.changed,
                "manifest": result.file,
            }
        )
        return
    share = f" at {result.percent:g}%" if result.percent is not None else ""
    if waves is not None:
        share += f" (wave 1 of {len(_waves(waves))}; modelreg fleet advance takes the next)"
    was = (
        f" (was {result.previous})" if result.previous and result.previous != result.version else ""
    )
    verb = "promoted" if result.changed else "already promoted:"
    was += _share_change(result)
    ok(f"{verb} {name} {result.version} to {result.channel}{share}{was} in {result.file}")


def _waves(spec: str) -> list[tuple[float, str | None]]:
    """``10:1h,50:4h,100`` as (percent, soak) pairs.

    Raises:
        UsageError: a wave that is not PERCENT[:SOAK].
    """
    from registry.errors import UsageError

    found: list[tuple[float, str | None]] = []
    for part in spec.split(","):
        percent, _, soak = part.strip().partition(":")
        try:
            value = float(percent.strip().removesuffix("%"))
        except ValueError:
            raise UsageError(
                f"--waves: {part.strip()!r} is not PERCENT[:SOAK] (e.g. 10:1h,50:4h,100)"
            ) from None
        found.append((value, soak.strip() or None))
    return found


def _share(text: str) -> float:
    """``5%`` or ``0.05`` as 0.05.

    Raises:
        UsageError: not a share of 0..1 (0..100%).
    """
    from registry.errors import UsageError

    raw = text.strip()
    try:
        share = float(raw.removesuffix("%")) / (100 if raw.endswith("%") else 1)
    except ValueError:
        share = -1.0
    if not 0 <= share <= 1:
        raise UsageError(f"--stop-failures must be a share such as 5% or 0.05, got {text!r}")
    return share


def _share_change(result: PromoteResult) -> str:
    """What became of a partial rollout when a channel went to all its devices."""
    if result.previous_percent is None or result.percent is not None or not result.changed:
        return ""
    if result.previous_percent == 100:
        return ""
    kept = (
        "; its waves and stop conditions stay for the next promotion" if result.waves_kept else ""
    )
    return f" (rollout {result.previous_percent:g}% -> all devices{kept})"


@click.command()
@click.argument("name")
@click.option("--channel", "-c", required=True, help="Channel to roll back.")
@click.option(
    "--to",
    "to",
    metavar="VERSION",
    help="Version to go back to (default: the one the channel served before).",
)
@_json
def rollback(name: str, channel: str, to: str | None, as_json: bool) -> None:
    """Point CHANNEL of model NAME back at the version it served before.

    The version comes from the git history of model.yaml (or --to); it must have
    served this channel or a later one.  The policy accepts it without the earlier
    steps of the promotion order, with the approvals the policy asks for.
    """
    from registry.promote import rollback as do_rollback

    result = do_rollback(Path.cwd(), name, channel, to)
    if as_json:
        emit_json(
            {
                "model": name,
                "channel": result.channel,
                "version": result.version,
                "previous": result.previous,
                "changed": result.changed,
                "manifest": result.file,
            }
        )
        return
    ok(
        f"rolled back {name} {result.channel}: {result.previous} -> {result.version}"
        f"{_share_change(result)} in {result.file}; commit it and open a pull request"
    )


@version.command("deprecate")
@click.argument("name")
@click.argument("version_", metavar="VERSION")
@click.option("--reason", required=True, help="Why it must not be served (one line).")
@_json
def version_deprecate(name: str, version_: str, reason: str, as_json: bool) -> None:
    """Mark VERSION of model NAME deprecated: never promoted or installed again."""
    import hashlib
    import re

    from registry.config import find_root, load_config
    from registry.deprecate import deprecate
    from registry.errors import PolicyError, Problem
    from registry.layout import version_file
    from registry.schema import DNS_LABEL_RE, is_semver
    from signing.workspace import released_deprecation

    root = find_root(Path.cwd())
    config = load_config(root)
    # names that are no model or version are for deprecate() to answer (closest one)
    valid = is_semver(version_) and re.fullmatch(DNS_LABEL_RE, name) is not None
    signed = released_deprecation(root, config, name, version_) if valid else None
    wanted = hashlib.sha256(" ".join(reason.split()).encode()).hexdigest()
    if signed is not None and signed != wanted:
        raise PolicyError([Problem(
            version_file(config.manifests, name, version_),
            f"version {version_} is released as deprecated and its reason is signed; a "
            "released deprecation cannot change",
        )])  # fmt: skip
    result = deprecate(Path.cwd(), name, version_, reason)
    if as_json:
        emit_json(
            {
                "model": name,
                "version": result.version,
                "reason": result.reason,
                "previous_reason": result.previous,
                "changed": result.changed,
                "manifest": result.file,
            }
        )
        return
    verb = "deprecated" if result.changed else "already deprecated:"
    ok(f"{verb} {name} {result.version} ({result.reason}) in {result.file}")
