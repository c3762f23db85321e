"""Trust: ``keys generate|rotate|revoke``, ``verify``, ``freshness refresh``."""

from __future__ import annotations

import os
from pathlib import Path

import click

from modelreg.cli._output import emit_json, ok
from registry.repository import display_path


@click.group()
def keys() -> None:
    """ECDSA P-256 keys for the TUF roles and OMS bundles, and root rotation."""


@keys.command("generate")
@click.option(
    "--role",
    required=True,
    type=click.Choice(["root", "targets", "snapshot", "timestamp"]),
    help="Role the key signs for (targets also signs OMS bundles).",
)
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder for ROLE.key (mode 0600) and ROLE.pub.",
)
@click.option(
    "--passphrase-env",
    metavar="VAR",
    help="Encrypt the private key with the passphrase held in environment variable VAR.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def keys_generate(role: str, out_dir: Path, passphrase_env: str | None, as_json: bool) -> None:
    """Generate a key pair for ROLE in OUT (never overwrites an existing key)."""
    from signing.keys import write_keypair

    passphrase = None
    if passphrase_env:
        value = os.environ.get(passphrase_env)
        if not value:
            raise click.UsageError(f"--passphrase-env: ${passphrase_env} is not set or empty")
        passphrase = value.encode()
    files = write_keypair(out_dir, role, passphrase)
    if as_json:
        emit_json(
            {
                "role": role,
                "keyid": files.keyid,
                "private": str(files.private),
                "public": str(files.public),
            }
        )
        return
    ok(f"generated {role} key {files.keyid[:16]}")
    click.echo(f"  private: {display_path(files.private)} (keep it secret; mode 0600)")
    click.echo(f"  public:  {display_path(files.public)}")
