"""Every command's ``--help`` ends with examples that run as written (they cannot rot).

The examples live in one table (``modelreg/cli/_examples.py``). This walks the real
command tree: a command, group or leaf, without an entry fails; an entry for no
command fails; each example line is parsed with click's own parser against the
command it names, so an option the command does not define, a missing argument or a
value outside a choice fails.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping

import click
import pytest

from modelreg.cli._examples import EXAMPLES, command_paths, epilog
from modelreg.cli.main import cli

PATHS = dict(command_paths(cli))


def _tokens(line: str) -> list[str]:
    """The modelreg invocation of a shell line: up to the first operator or comment."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    out = []
    for token in lexer:
        if set(token) <= set("();<>|&"):
            break  # a redirection or the next command: the shell's, not ours
        out.append(token)
    return out


def resolve(line: str, root: click.Group = cli) -> tuple[str, list[str]]:
    """Parse ``line`` as click would; return the command path it runs and the problems.

    Raises:
        click.UsageError: an option the command does not define, or one missing its value.
    """
    tokens = _tokens(line)
    if not tokens or tokens[0] != "modelreg":
        return "", [f"does not start with 'modelreg': {line!r}"]
    command: click.Command = root
    ctx = click.Context(root, info_name="modelreg")
    args, path = tokens[1:], list[str]()
    while True:
        opts, rest, _ = command.make_parser(ctx).parse_args(args)
        problems = _values(command, opts)
        if not isinstance(command, click.Group):
            break
        if not rest:
            return " ".join(path), [*problems, "names no subcommand"]
        sub = command.get_command(ctx, rest[0])
        if sub is None:
            return " ".join(path), [*problems, f"no command {rest[0]!r}"]
        path.append(rest[0])
        ctx = click.Context(sub, info_name=rest[0], parent=ctx)
        command, args = sub, rest[1:]
    for param in command.params:
        # an argument the line gave is text; click marks one it lacks with a sentinel
        given = isinstance(opts.get(param.name or ""), str | tuple | list)
        if isinstance(param, click.Argument) and param.required and not given:
            problems.append(f"missing argument {param.human_readable_name}")
    if rest:
        problems.append(f"unexpected arguments {rest}")
    return " ".join(path), problems


def _values(command: click.Command, opts: dict[str, object]) -> list[str]:
    """Values a choice would refuse (other types need the files the example names)."""
    problems = []
    for param in command.params:
        value = opts.get(param.name or "")
        if isinstance(param.type, click.Choice) and isinstance(value, str | list | tuple):
            given = [value] if isinstance(value, str) else value
            problems += [f"{param.name}: {v!r} is not one of {list(param.type.choices)}"
                         for v in given if v not in param.type.choices]  # fmt: skip
    return problems


def missing_examples(
    root: click.Group, table: Mapping[str, tuple[str, ...]] = EXAMPLES
) -> list[str]:
    return [path or "modelreg" for path, _ in command_paths(root) if not table.get(path)]


def test_every_command_has_an_example() -> None:
    assert missing_examples(cli) == []
    stale = sorted(set(EXAMPLES) - set(PATHS))
    assert stale == [], f"examples for commands that do not exist: {stale}"


def test_a_command_added_without_an_example_is_found() -> None:
    """What the next command (say ``fleet advance``) meets until it has its entry."""
    root = click.Group("modelreg")
    fleet = click.Group("fleet")
    fleet.add_command(click.Command("status"))
    fleet.add_command(click.Command("advance"))
    root.add_command(fleet)
    root.add_command(click.Command("init"))
    table = {"": ("modelreg init",), "init": ("modelreg init",), "fleet status": ("x",)}
    assert missing_examples(root, table) == ["fleet", "fleet advance"]


@pytest.mark.parametrize(("path", "line"), [(p, line) for p, ls in EXAMPLES.items() for line in ls])
def test_each_example_runs_the_command_it_documents(path: str, line: str) -> None:
    try:
        ran, problems = resolve(line)
    except click.UsageError as e:
        pytest.fail(f"{line!r}: {e.format_message()}")
    assert problems == [], line
    command = PATHS[path]
    if isinstance(command, click.Group):
        # a group's example shows one of its commands at work
        assert ran.startswith(path), (path, line)
        assert ran != path, (path, line)
    else:
        assert ran == path, (path, line)


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("modelreg promote mlp 1.0.0 --chanel canary", "--chanel"),
        ("modelreg promote mlp 1.0.0", None),  # parses; --channel is required at run time
        ("modelreg version add mlp --artifact m.onnx", "missing argument VERSION"),
        ("modelreg keys generate --role owner --out k", "'owner' is not one of"),
        ("modelreg list extra", "unexpected arguments ['extra']"),
        ("modelreg ci", "names no subcommand"),
        ("modelreg rollout mlp -c production", "no command 'rollout'"),
        ("dvc push", "does not start with 'modelreg'"),
    ],
)
def test_the_checker_catches_a_rotten_example(line: str, problem: str | None) -> None:
    try:
        _, problems = resolve(line)
    except click.UsageError as e:
        problems = [e.format_message()]
    if problem is None:
        assert problems == []
    else:
        assert any(problem in p for p in problems), problems


def test_help_ends_with_the_examples_line_by_line() -> None:
    """Rendered under "Examples:", one line each: click's \\b keeps it from re-wrapping."""
    from click.testing import CliRunner

    runner = CliRunner()
    for path, lines in EXAMPLES.items():
        result = runner.invoke(cli, [*path.split(), "--help"], terminal_width=60)
        assert result.exit_code == 0, result.output
        shown = result.output.split("Examples:\n", 1)
        assert len(shown) == 2, (path, result.output)
        assert shown[1].splitlines() == [f"    {line}" for line in lines], path
    assert epilog(("a", "b")) == "\b\nExamples:\n  a\n  b"
