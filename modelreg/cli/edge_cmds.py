"""``modelreg edge run`` and ``modelreg edge status``: the device daemon."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from modelreg.cli._output import detail, emit_json, ok

if TYPE_CHECKING:
    from registry.device_report import ModelReport

_CONFIG = click.option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="EDGE_YAML",
    help="The device's edge.yaml.",
)


@click.group()
def edge() -> None:
    """Run the device daemon, or read its status."""


@edge.command("run")
@_CONFIG
def edge_run(config_path: Path) -> None:
    """Follow the repository, verify and install what the channels assign, and serve.

    Serves what the state dir names at once (no network needed), syncs now and every
    poll interval; SIGHUP syncs at once, SIGTERM stops cleanly.
    """
    from edge_sync.config import load_edge_config
    from edge_sync.daemon import Daemon

    config = load_edge_config(config_path)

    def said(report: Any) -> None:
        for model, update in report.updates.items():
            detail(f"{model}: {update.result} {update.version or ''} "
                   f"({update.method or '-'}, {update.bytes_fetched} bytes)"
                   + (f": {update.reason}" if update.reason else ""))  # fmt: skip
        if report.result == "failed" and report.reason and not report.updates:
            detail(f"sync failed: {report.reason}")

    sys.exit(Daemon(config, on_sync=said).run())


@edge.command("key")
@_CONFIG
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the public key to this file (named <device-id>.pub for `fleet enroll "
    "--from`) instead of printing it.",
)
def edge_key(config_path: Path, out: Path | None) -> None:
    """Print the device's public key, to enroll it (`modelreg fleet enroll`).

    The key is made in the state dir the first time (by `edge run` or here): Ed25519,
    mode 0600; the private key never leaves the device and is never printed.
    """
    from edge_sync.config import load_edge_config
    from edge_sync.state.device_key import DeviceKey
    from registry.atomic import write_atomic

    config = load_edge_config(config_path)
    pem = DeviceKey.load_or_create(config.state_path).public_pem()
    if out is None:
        click.echo(pem.decode(), nl=False)
        return
    write_atomic(out, pem)
    ok(f"public key of {config.device.id} in {out}: enroll it with "
       f"`modelreg fleet enroll {config.device.id} --public-key {out.name}`")  # fmt: skip


@edge.command("status")
@_CONFIG
@click.option("--json", "as_json", is_flag=True, help="Print the status document as JSON.")
def edge_status(config_path: Path, as_json: bool) -> None:
    """What the device serves, what it last did and why (works while the daemon runs)."""
    from edge_sync.config import load_edge_config
    from edge_sync.daemon import device_status

    doc = device_status(load_edge_config(config_path))
    if as_json:
        emit_json(doc.model_dump(mode="json"))
        return
    daemon = doc.daemon
    running = f"running (pid {daemon.pid})" if daemon.running else "not running"
    ok(f"device {doc.device}: daemon {running}")
    sync = doc.sync
    if sync.last_checked:
        detail(f"last sync {sync.last_checked}: {sync.result}"
               + (f" ({sync.reason})" if sync.reason else ""))  # fmt: skip
    if doc.trust.stale:
        detail(f"trust: stale, {', '.join(doc.trust.expired)} expired "
               "(nothing new is accepted until the repository signs fresh metadata)")  # fmt: skip
    for name, model in doc.models.items():
        _model_lines(name, model)


def _model_lines(name: str, model: ModelReport) -> None:
    """``edge status``'s lines for one model: what it serves, its last update, its
    rejections."""
    from edge_sync.sync.updater import STAGES

    def held(found: Any) -> str:
        return f"{found.version} ({found.sha256[:12]})" if found else "nothing"

    detail(f"{name}@{model.channel}: serving {held(model.serving)}")
    if model.serving is not None and model.serving.provenance is not None:
        detail(f"  provenance: {model.serving.provenance.summary()}")
    if model.gate is not None:
        detail(f"  health gate: open on {model.gate.version} since {model.gate.opened}")
    if model.shadow is not None:
        running = " (comparing)" if model.shadow.open else ""
        detail(f"  shadow: {model.shadow.version} against {model.shadow.against}: "
               f"{model.shadow.text()}{running}")  # fmt: skip
    if model.previous is not None:
        detail(f"  previous: {held(model.previous)} (kept loaded for a rollback)")
    if model.last_known_good is not None:
        detail(f"  last known good: {held(model.last_known_good)}")
    update = model.last_update
    if update:
        # a gate's rollback fetched nothing: no method, no bytes to speak of
        how = f" via {update.method}, {update.bytes_fetched} bytes" if update.method else ""
        detail(f"  last update: {update.result} {update.version or '-'}{how} at {update.finished}"
               + (f": {update.reason}" if update.reason else ""))  # fmt: skip
        timed = update.stages_ms
        order = [s for s in STAGES if s in timed] + sorted(set(timed) - set(STAGES))
        stages = ", ".join(f"{s} {timed[s]:.1f}" for s in order)
        if stages:
            detail(f"  stages (ms): {stages}")
    for rejected in model.rejected:
        detail(f"  rejected {rejected.version}: {rejected.reason}")


@edge.command("export")
@_CONFIG
@click.argument("model")
@click.option("--version", "version", default=None, help="A version the device holds "
              "(default: the one it serves).")  # fmt: skip
@click.option(
    "--out",
    "out",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write the .onnx (external data files go beside it).",
)
def edge_export(config_path: Path, model: str, version: str | None, out: Path) -> None:
    """Write the verified whole file of a version the device holds.

    A version held as tensors is joined from its skeleton and tensors; either way the
    bytes written must hash to the version's signed whole-file digest, or nothing is
    left at OUT (exit 1).
    """
    from edge_sync.config import load_edge_config
    from edge_sync.state.store import StateDir
    from edge_sync.sync.tensors import export_version
    from registry.errors import UsageError

    config = load_edge_config(config_path)
    state_dir = StateDir(config.state_path)
    held = state_dir.load().models.get(model)
    if held is None:
        raise UsageError(f"the device holds no version of {model!r}")
    wanted = version or (held.serving.version if held.serving else None)
    installed = next((i for i in held.held() if i.version == wanted), None)
    if installed is None:
        versions = ", ".join(sorted({i.version for i in held.held()})) or "none"
        raise UsageError(f"{model} {wanted or '(nothing served)'} is not held (held: {versions})")
    size = export_version(state_dir.root, state_dir.blobs, model, installed, out)
    ok(f"{model} {installed.version}: {size} bytes, sha256 {installed.sha256} verified")
    detail(f"written to {out}")


@edge.command("unit")
@click.option(
    "--config",
    "config_path",
    default="/etc/modelreg/edge.yaml",
    show_default=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The edge.yaml the service runs with.",
)
@click.option(
    "--exec",
    "executable",
    default=None,
    help="The modelreg executable (default: the one running now).",
)
def edge_unit(config_path: Path, executable: str | None) -> None:
    """Print a systemd unit for the daemon (Type=notify, watchdog, restart, sandboxing).

    The config is loaded first (a missing or invalid one is refused): the state dir and
    a report folder it names are the paths the sandboxed service may write.
    """
    import shutil
    from pathlib import PurePosixPath

    from edge_sync.config import load_edge_config
    from edge_sync.daemon import systemd_unit

    config = load_edge_config(config_path)
    exe = executable or shutil.which("modelreg") or f"{sys.executable} -m modelreg"
    click.echo(systemd_unit(PurePosixPath(config_path.absolute()), exe, config), nl=False)
