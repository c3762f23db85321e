"""The examples every ``--help`` ends with, kept in one table.

``EXAMPLES`` maps a command's path (``""`` for ``modelreg`` itself, ``"version add"``)
to its example lines; :func:`apply_examples` renders them into each command's epilog
when ``main`` registers the tree.  A new command needs one entry here:
``tests/unit/test_cli_examples.py`` walks the whole command tree and fails for any
command, group or leaf, without one, and parses every line against the command it
names, so an example that uses an option the command lost stops the build.

An example is one shell line: ``modelreg``, the command's path, its arguments, then
optionally a shell operator (``>``, ``|``, ``&&``) and a ``# comment``; what follows the
operator is not modelreg's and is not checked.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Final

import click

__all__ = ["EXAMPLES", "apply_examples", "command_paths", "epilog"]

EXAMPLES: Final[Mapping[str, tuple[str, ...]]] = {
    "": (
        "modelreg init fleet-models",
        "modelreg validate --json",
        "modelreg --traceback status   # a Python traceback for an unexpected error",
    ),
    "init": (
        "modelreg init fleet-models",
        "modelreg init . --remote s3://acme-models/fleet   # an existing repo, an S3 remote",
    ),
    "model": ("modelreg model add mlp --channel-order canary,production",),
    "model add": (
        "modelreg model add mlp --task classification --channel-order canary,production",
        "modelreg model add cnn --owner vision@acme.example --label team=vision --target cpu",
    ),
    "version": ("modelreg version add mlp 1.0.0 --artifact mlp.onnx",),
    "version add": (
        (
            "modelreg version add mlp 1.0.0 --artifact mlp.onnx --golden-inputs in.npz "
            "--metric accuracy=0.91"
        ),
        "modelreg version add mlp 1.1.0 --artifact ft.onnx --target jetson=tensorrt:fp16",
    ),
    "version deprecate": (
        'modelreg version deprecate mlp 1.1.0 --reason "drifts on night images"',
    ),
    "rollback": (
        "modelreg rollback mlp --channel production   # to what it served before",
        "modelreg rollback mlp -c canary --to 1.0.0 --json",
    ),
    "promote": (
        "modelreg promote mlp 1.0.0 --channel canary --percent 10",
        "modelreg promote mlp 1.0.0 -c production   # all devices of the channel",
        "modelreg promote mlp 1.1.0 -c canary --waves 10:1h,50:4h,100 --min-reports 3",
        "modelreg promote mlp 1.2.0 -c production --waves 10,100 --shadow 5% --stop-agreement 95%",
    ),
    "validate": (
        "modelreg validate",
        "modelreg validate manifests/mlp --json",
    ),
    "schema": ("modelreg schema --kind version > version.schema.json",),
    "status": (
        "modelreg status",
        "modelreg status --model mlp --mlflow --json",
    ),
    "keys": ("modelreg keys generate --role targets --out keys",),
    "keys generate": (
        "modelreg keys generate --role targets --out keys",
        "modelreg keys generate --role root --out /media/offline --passphrase-env ROOT_PASS",
    ),
    "keys rotate": (
        "modelreg keys rotate --role timestamp",
        "modelreg keys rotate --role targets --new-public-key hsm-targets.pub",
    ),
    "keys revoke": (
        "modelreg keys revoke --role targets --keyid KEYID --replacement new-targets.pub",
    ),
    "freshness": ("modelreg freshness refresh",),
    "freshness refresh": ("modelreg freshness refresh --json",),
    "verify": (
        (
            "modelreg verify models/mlp/1.0.0.onnx --bundle mlp.sigstore.json "
            "--public-key .modelreg/keys/targets.pub"
        ),
    ),
    "sign": (
        (
            "modelreg sign models/mlp/1.0.0.onnx --bundle mlp.sigstore.json "
            "--model mlp --version 1.0.0"
        ),
    ),
    "publish": (
        "modelreg publish",
        "modelreg publish --no-push --json   # artifacts already pushed with dvc push",
    ),
    "build": (
        "modelreg build mlp 1.1.0",
        "modelreg build --base origin/main --json",
    ),
    "diff": (
        "modelreg diff mlp 1.0.0 1.1.0",
        "modelreg diff --base origin/main -o pr-comment.md",
    ),
    "ci": ("modelreg ci pr --base origin/main",),
    "ci pr": (
        "modelreg ci pr",
        "modelreg ci pr --base origin/main --json",
    ),
    "ci release": ("modelreg ci release --json",),
    "register": (
        "modelreg register",
        "modelreg register --check --tracking-uri http://mlflow.acme.example:5000",
    ),
    "fleet": ("modelreg fleet status --reports s3://fleet-reports/fleet/",),
    "fleet status": (
        "modelreg fleet status --reports s3://fleet-reports/fleet/ --json",
        "modelreg fleet status --reports /srv/fleet/reports --repo fleet-models --stale-after 1h",
    ),
    "fleet advance": (
        "modelreg fleet advance --reports s3://fleet-reports/fleet/",
        "modelreg fleet advance --reports ./reports --model mlp -c canary --dry-run --json",
    ),
    "fleet devices": (
        "modelreg fleet devices --reports s3://fleet-reports/fleet/ --model mlp",
        "modelreg fleet devices --reports /srv/fleet/reports --label site=berlin --json",
    ),
    "fleet hold": ("modelreg fleet hold mlp -c canary --reason 'p99 up 3x on the night cameras'",),
    "fleet resume": ("modelreg fleet resume mlp -c canary",),
    "fleet enroll": (
        "modelreg fleet enroll cam-0042 --public-key cam-0042.pub",
        "modelreg fleet enroll --from /mnt/factory/keys",
    ),
    "fleet revoke": ("modelreg fleet revoke cam-0042",),
    "edge key": ("modelreg edge key --config /etc/modelreg/edge.yaml --out cam-0042.pub",),
    "edge": ("modelreg edge status --config /etc/modelreg/edge.yaml",),
    "edge run": ("modelreg edge run --config /etc/modelreg/edge.yaml",),
    "edge status": ("modelreg edge status --config /etc/modelreg/edge.yaml --json",),
    "edge export": (
        "modelreg edge export detector --config /etc/modelreg/edge.yaml --out detector.onnx",
    ),
    "edge unit": (
        (
            "modelreg edge unit --config /etc/modelreg/edge.yaml "
            "> /etc/systemd/system/modelreg-edge.service"
        ),
    ),
    "history": ("modelreg history mlp --channel production",),
    "show": (
        "modelreg show mlp",
        "modelreg show mlp:1.1.0 --json",
        "modelreg show mlp@production --mlflow",
    ),
    "list": ("modelreg list --json",),
}
"""Example lines by command path; the first line of each is the most common use."""


def epilog(lines: tuple[str, ...]) -> str:
    r"""The ``Examples:`` section of a help page.

    ``\b`` keeps click from re-wrapping the paragraph, so each example stays on its
    own line, copyable as it is.
    """
    return "\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)


def command_paths(group: click.Group, prefix: str = "") -> Iterator[tuple[str, click.Command]]:
    """Every command under ``group`` (``group`` itself as ``prefix``), by path."""
    yield prefix, group
    for name, command in sorted(group.commands.items()):
        path = f"{prefix} {name}".strip()
        if isinstance(command, click.Group):
            yield from command_paths(command, path)
        else:
            yield path, command


def apply_examples(root: click.Group) -> None:
    """Set the epilog of every command under ``root`` that has examples.

    A command without an entry keeps its epilog; the test suite, not the user running
    ``--help``, is where a missing example fails.
    """
    for path, command in command_paths(root):
        lines = EXAMPLES.get(path)
        if lines:
            command.epilog = epilog(lines)
