"""Trust: ``keys generate|rotate|revoke``, ``verify``, ``freshness refresh``."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from modelreg.cli._output import detail, display_path, emit_json, ok

if TYPE_CHECKING:
    from signing.workspace import TrustPaths

F = TypeVar("F", bound=Callable[..., Any])


def _role(help_text: str) -> Callable[[F], F]:
    """The ``--role`` option of the key commands (the four TUF roles)."""
    return click.option(
        "--role",
        required=True,
        type=click.Choice(["root", "targets", "snapshot", "timestamp"]),
        help=help_text,
    )


@click.group()
def keys() -> None:
    """ECDSA P-256 keys for the TUF roles and OMS bundles, and root rotation."""


@keys.command("generate")
@_role("Role the key signs for (targets also signs OMS bundles).")
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


def _repo_trust() -> TrustPaths:
    from registry.config import find_root, load_config
    from signing.workspace import trust_paths

    root = find_root(Path.cwd())
    return trust_paths(root, load_config(root))


@keys.command("rotate")
@_role("Role whose key is replaced.")
@click.option(
    "--new-public-key",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Use this public key (its private half held elsewhere) instead of generating one.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def keys_rotate(role: str, new_public_key: Path | None, as_json: bool) -> None:
    """Replace ROLE's key in a new root version signed by the old and new root keys.

    Keys are read from MODELREG_<ROLE>_KEY or the repository's key folder. Commit
    the new files under the trust metadata folder; devices follow on their next
    refresh.
    """
    from signing.workspace import rotate

    paths = _repo_trust()
    version, keyid = rotate(paths, role, new_public=new_public_key)
    if as_json:
        emit_json({"role": role, "keyid": keyid, "root_version": version})
        return
    ok(f"rotated {role} key to {keyid[:16]}; root is now version {version}")
    if new_public_key is None:
        click.echo(f"  new key: {display_path(paths.keys / f'{role}.key')}")
    click.echo(
        f"  devices: commit {display_path(paths.metadata)} (devices reading git follow on "
        "their next refresh); gitless devices (repository.source: artifacts) see the new "
        "root once the metadata is mirrored to the DVC remote: modelreg freshness refresh, "
        "or the next release, does it"
    )


@keys.command("revoke")
@_role("Role that trusted the key.")
@click.option("--keyid", required=True, help="Id of the key to revoke (see trust/metadata).")
@click.option(
    "--replacement",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Public key that takes its place.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def keys_revoke(role: str, keyid: str, replacement: Path | None, as_json: bool) -> None:
    """Stop trusting KEYID for ROLE (a new root version; online roles re-signed at once)."""
    from signing.workspace import revoke

    paths = _repo_trust()
    result = revoke(paths, role, keyid, replacement=replacement)
    if as_json:
        emit_json({"role": role, "revoked": keyid, "versions": dict(result.versions)})
        return
    versions = ", ".join(f"{r} {v}" for r, v in sorted(result.versions.items()))
    ok(f"revoked {role} key {keyid[:16]} ({versions})")


@click.group()
def freshness() -> None:
    """Keep signed metadata from expiring (the scheduled workflow)."""


@freshness.command("refresh")
@click.option(
    "--mirror/--no-mirror",
    default=True,
    show_default=True,
    help="Mirror the signed metadata to the DVC remote (<remote>/modelreg/metadata/), "
    "for devices that follow it instead of git; needs the remote's credentials.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def freshness_refresh(mirror: bool, as_json: bool) -> None:
    """Re-sign the timestamp role (and snapshot/targets when they would expire first),
    and mirror the metadata to the artifact remote."""
    from pipelines.publish import refresh_metadata
    from registry.config import find_root

    report = refresh_metadata(find_root(Path.cwd()), mirror=mirror)
    result = report.result
    if as_json:
        emit_json({
            "versions": dict(result.versions),
            "written": [str(p) for p in result.written],
            "mirrored": report.mirrored,
        })  # fmt: skip
        return
    versions = ", ".join(f"{r} {v}" for r, v in sorted(result.versions.items())) or "nothing due"
    ok(f"refreshed: {versions}")
    if report.mirrored:
        detail(f"  mirrored to {report.remote}/metadata: {', '.join(report.mirrored)}")


@click.command()
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@click.option(
    "--bundle",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The OMS signature bundle (sigstore bundle JSON).",
)
@click.option(
    "--public-key",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="ECDSA P-256 public key (PEM) the bundle must be signed with.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the verified facts as JSON.")
def verify(path: Path, bundle: Path, public_key: Path, as_json: bool) -> None:
    """Verify a model file or directory against its OMS signature bundle."""
    from pipelines.model_bundle import check_covered
    from signing.hashing import SINGLE_FILE
    from signing.oms import verify_model

    result = verify_model(path, bundle, public_key)
    check_covered(result)  # an .onnx's external data is signed too
    facts = result.facts.to_json() if result.facts is not None else None
    if as_json:
        emit_json(
            {
                "verified": True,
                "path": str(path),
                "name": result.name,
                "digest": result.digest,
                "sha256": result.files.get(SINGLE_FILE),
                "files": dict(result.files),
                "facts": facts,
            }
        )
        return
    if SINGLE_FILE in result.files:
        # The file's own SHA-256, what `sha256sum` prints; the OMS subject digest
        # (``digest``) is a digest over the file list, not of the file.
        ok(f"verified {path}: sha256 {result.files[SINGLE_FILE]}")
    else:
        ok(f"verified {path}: {len(result.files)} file(s), model digest {result.digest}")
    if facts:
        click.echo(
            "  " + ", ".join(f"{k}={v}" for k, v in facts.items() if v not in (None, [], ()))
        )


@click.command()
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@click.option(
    "--bundle",
    "bundle_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write the OMS signature bundle.",
)
@click.option(
    "--private-key",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="ECDSA P-256 private key (default: $MODELREG_TARGETS_KEY, else the repo's targets key).",
)
@click.option("--model", "model_name", help="Model name to record (signed).")
@click.option("--version", "version_", help="Version to record (signed).")
@click.option(
    "--git-commit", default="", help="Git commit to record (signed; default: HEAD of the cwd)."
)
@click.option("--ci-run", default="", help="CI run to record (signed; default: local).")
@click.option("--parent", default=None, help="Parent version to record (signed).")
@click.option("--json", "as_json", is_flag=True, help="Print what was signed as JSON.")
def sign(
    path: Path,
    bundle_path: Path,
    private_key: Path | None,
    model_name: str | None,
    version_: str | None,
    git_commit: str,
    ci_run: str,
    parent: str | None,
    as_json: bool,
) -> None:
    """Sign a model file or directory into an OMS bundle (verifiable with model_signing).

    An .onnx stored with external data is signed with every data file it names beside
    it (the bundle lists each file, as `ci release` writes them).
    """
    from pipelines.model_bundle import sign_path
    from signing.keys import load_private_key, private_key_from_env
    from signing.oms import ModelFacts, write_bundle

    if private_key is not None:
        key = load_private_key(private_key)
    else:
        from registry.errors import RepositoryError

        try:
            key_dir: Path | None = _repo_trust().keys
        except RepositoryError:
            key_dir = None  # outside a repository only the environment can hold the key
        key = private_key_from_env("targets", key_dir=key_dir)
    facts = None
    if model_name and version_:
        if not git_commit:
            from registry.gitinfo import git

            head = git(Path.cwd(), "rev-parse", "HEAD", check=False)
            git_commit = head.stdout.strip() if head.returncode == 0 else ""
        if not git_commit:
            raise click.UsageError("--git-commit is needed outside a git work tree")
        try:
            facts = ModelFacts(
                model=model_name,
                version=version_,
                git_commit=git_commit,
                ci_run=ci_run or "local",
                parent=parent,
            )
        except ValueError as e:
            raise click.UsageError(str(e)) from None
    elif model_name or version_:
        raise click.UsageError("--model and --version go together")
    bundle, external = sign_path(path, key, facts=facts, bundle_path=bundle_path)
    write_bundle(bundle, bundle_path)
    if as_json:
        emit_json(
            {
                "signed": True,
                "path": str(path),
                "bundle": str(bundle_path),
                "bundle_sha256": hashlib.sha256(bundle_path.read_bytes()).hexdigest(),
                "key_hint": bundle["verificationMaterial"]["publicKey"]["hint"],
                "facts": facts.to_json() if facts is not None else None,
                "external_data": list(external),
            }
        )
        return
    ok(f"signed {path} -> {display_path(bundle_path)}")
    if external:
        detail(f"  with its external data: {', '.join(external)}")


@click.command()
@click.option("--no-push", is_flag=True, help="Skip `dvc push` (artifacts already on the remote).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def publish(no_push: bool, as_json: bool) -> None:
    """Push artifacts with DVC and release every version as signed TUF targets.

    Each version's ONNX file and OMS bundle, and the channels of every model, become
    targets on the artifact remote; the trust metadata is re-signed (commit it).
    Idempotent: a second run with nothing new changes nothing.
    """
    from pipelines.publish import publish as do_publish

    report = do_publish(Path.cwd(), push=not no_push)
    if as_json:
        emit_json(
            {
                "remote": str(report.remote),
                "pushed": report.pushed,
                "added": report.added,
                "versions": dict(report.versions),
                "metadata": [str(p) for p in report.metadata],
            }
        )
        return
    if not report.changed:
        ok("nothing to publish: every version is already released")
        return
    versions = ", ".join(f"{r} {v}" for r, v in sorted(report.versions.items()))
    where = report.remote if "://" in report.remote else display_path(Path(report.remote))
    ok(f"published {len(report.added)} target(s) to {where} ({versions})")
    for target in report.added:
        click.echo(f"  {target}")
