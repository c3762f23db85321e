"""Entry point: the command tree and the mapping of errors to exit codes.

Exit codes: 0 success, 1 a domain failure (invalid manifest, failed verification,
policy violation, tool failure) with one line per problem, 2 a usage error.  No
traceback is printed unless ``--traceback`` (or ``MODELREG_TRACEBACK=1``) is given.

Every error, click's usage errors and tracebacks included, is rendered here through
``_output`` and so redacted (:mod:`registry.redact`): no secret from the environment,
a URL or a key reaches stderr.
"""

from __future__ import annotations

import atexit
import gc
import io
import os
import sys
import traceback
from collections.abc import Iterable
from typing import Any, NoReturn

import click

from modelreg import __version__
from modelreg.cli._examples import apply_examples
from modelreg.cli._output import emit_json, error_lines, error_text, problem_json
from registry import progress
from registry.errors import ManifestError, Problem, RegistryError, UsageError

_TRACEBACK_ENV = "MODELREG_TRACEBACK"


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="modelreg")
@click.option(
    "--traceback",
    is_flag=True,
    envvar=_TRACEBACK_ENV,
    help="Show Python tracebacks for unexpected errors.",
)
def cli(traceback: bool) -> None:
    """modelreg: a GitOps model registry for edge fleets.

    Declare model versions as YAML in Git (artifacts tracked by DVC), validate and
    promote them by pull request, and let devices follow the repository.
    """


def _register() -> None:
    from modelreg.cli import (
        build_cmd,
        check_cmds,
        ci_cmds,
        diff_cmd,
        edge_cmds,
        fleet_advance_cmd,
        fleet_cmds,
        inspect_cmds,
        register_cmd,
        repo_cmds,
        trust_cmds,
    )

    cli.add_command(repo_cmds.init)
    cli.add_command(repo_cmds.model)
    cli.add_command(repo_cmds.version)
    cli.add_command(repo_cmds.promote)
    cli.add_command(repo_cmds.rollback)
    cli.add_command(check_cmds.validate)
    cli.add_command(check_cmds.schema)
    cli.add_command(check_cmds.status)
    cli.add_command(trust_cmds.keys)
    cli.add_command(trust_cmds.freshness)
    cli.add_command(trust_cmds.verify)
    cli.add_command(trust_cmds.sign)
    cli.add_command(trust_cmds.publish)
    cli.add_command(build_cmd.build)
    cli.add_command(diff_cmd.diff)
    cli.add_command(ci_cmds.ci)
    cli.add_command(register_cmd.register)
    cli.add_command(edge_cmds.edge)
    cli.add_command(fleet_cmds.fleet)
    cli.add_command(inspect_cmds.history)
    cli.add_command(inspect_cmds.show)
    cli.add_command(inspect_cmds.list_)
    # after any `fleet` group above: advance joins it
    fleet_advance_cmd.attach(cli)
    # last: the examples of every command registered above (one table, _examples.py)
    apply_examples(cli)


_register()


_JSON_ERRORS = False
"""Set by ``main`` when the command was asked for ``--json``: errors are JSON too."""


def _fail(
    lines: Iterable[str], code: int, show_tb: bool, problems: Iterable[Problem] | None = None
) -> NoReturn:
    """Print the error lines on stderr and exit; with ``--json`` also the errors as JSON
    on stdout, ``{"ok": false, "exit_code": N, "errors": [{"file", "line", "col",
    "field", "message"}]}``
    (a file, line and column only where the error has them)."""
    shown = list(lines)
    if show_tb:
        error_text(traceback.format_exc())
    error_lines(shown)
    if _JSON_ERRORS:
        found = (
            list(problems)
            if problems is not None
            else [
                Problem("", " ".join(t.removeprefix("modelreg: ").removeprefix("error: ").split()))
                for t in shown
            ]
        )
        errors = [
            {k: v for k, v in problem_json(p).items() if k != "text"} | {"file": p.file or None}
            for p in found
        ]
        emit_json({"ok": False, "exit_code": code, "errors": errors})
    sys.exit(code)


def _wants_json(args: list[str]) -> bool:
    end = args.index("--") if "--" in args else len(args)
    return "--json" in args[:end]


def _traceback_first(args: list[str]) -> list[str]:
    """``args`` with ``--traceback`` moved before the subcommand, where click accepts it.

    The internal-error line tells the user to rerun "with --traceback", and most do so by
    appending it; after ``--`` it stays an argument.
    """
    end = args.index("--") if "--" in args else len(args)
    if "--traceback" not in args[:end]:
        return args
    rest = [a for a in args[:end] if a != "--traceback"]
    return ["--traceback", *rest, *args[end:]]


# Everything a command built lives until the process ends: the interpreter's last
# collection would only walk it again (about a second after a ``ci release`` that
# imported MLflow, DVC and ONNX).  Frozen, it is freed without that walk.
atexit.register(gc.freeze)


def main(argv: list[str] | None = None) -> Any:
    """Run the CLI and exit with the documented code."""
    global _JSON_ERRORS  # noqa: PLW0603 - one process, one command line
    args = sys.argv[1:] if argv is None else argv
    _JSON_ERRORS = _wants_json(args)
    show_tb = "--traceback" in args or os.environ.get(_TRACEBACK_ENV, "") not in ("", "0")
    try:
        # Long steps show progress on stderr (rich on a terminal, lines in CI); the
        # display is closed before any error line below is printed.
        with progress.reporting(progress.for_environment()):
            cli.main(args=_traceback_first(args), prog_name="modelreg", standalone_mode=False)
    except click.exceptions.Abort:
        _fail(["modelreg: aborted"], 1, show_tb=False)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.ClickException as e:
        # click quotes the offending argument, which may be a secret pasted by mistake.
        shown = io.StringIO()
        e.show(file=shown)
        if _JSON_ERRORS:
            message = " ".join(e.format_message().split())  # click's may hold tabs, newlines
            _fail([f"modelreg: error: {message}"], e.exit_code, show_tb=False)
        error_text(shown.getvalue())
        sys.exit(e.exit_code)
    except ManifestError as e:
        _fail((str(p) for p in e.problems), 1, show_tb, e.problems)
    except RegistryError as e:
        lines = str(e).splitlines() or [""]
        path = getattr(e, "path", None)  # errors about one file carry it (ArtifactError)
        subject = None
        if isinstance(path, str) and path and len(lines) == 1:
            subject = [Problem(path, lines[0].removeprefix(f"{path}: "))]
        _fail([f"modelreg: {lines[0]}", *lines[1:]], 1, show_tb, subject)
    except UsageError as e:
        # An argument the library cannot accept; any other ValueError is a bug (below).
        _fail([f"modelreg: error: {e}"], 2, show_tb)
    except OSError as e:
        # The machine refused (permissions, a full disk, a file where a folder goes).
        where = f"{e.filename}: " if e.filename else ""
        if e.filename and e.filename2:  # a rename or a link: both ends
            where = f"{e.filename} -> {e.filename2}: "
        _fail([f"modelreg: {where}{e.strerror or e}"], 1, show_tb)
    except KeyboardInterrupt:
        _fail(["modelreg: interrupted"], 130, show_tb=False)
    except Exception as e:  # noqa: BLE001 - the last line of defence: one line, no traceback
        name = type(e).__name__
        _fail([f"modelreg: internal error: {name}: {e} (rerun with --traceback)"], 1, show_tb)
    sys.exit(0)
