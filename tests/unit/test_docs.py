"""The documentation inside the repository holds together (issue 24, point 4).

Every relative link in README.md and docs/ names a file of the repository (and, for a
Markdown page, a heading of it); nothing points outside the repository (the contract is
docs/reference/, not a file beside the checkout); every ``edge.yaml`` the pages show
loads; the command-line reference names every command ``modelreg --help`` has.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from edge_sync.config import load_edge_config
from modelreg.cli.main import cli
from tests.conftest import REPO_ROOT

PAGES = sorted([REPO_ROOT / "README.md", *(REPO_ROOT / "docs").rglob("*.md")])
SOURCE_DIRS = ("benchmarks", "edge_sync", "fleet", "modelreg", "pipelines", "registry",
               "scripts", "signing", "tests", "docs", ".github")  # fmt: skip
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6} +(.+?) *#*$", re.MULTILINE)
_FENCE = re.compile(r"^ *```.*?^ *```", re.MULTILINE | re.DOTALL)
# spelled in pieces, so that this file does not find itself
_OUTSIDE = ("../" + "shared", "shared/" + "SPEC", "SPEC" + ".md", "SPEC" + " section")


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of a Markdown page's headings (outside code blocks)."""
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    return {slug(h) for h in _HEADING.findall(text)}


def links(page: Path) -> Iterator[str]:
    """Every link target of a page outside code blocks, external ones included."""
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    text = re.sub(r"`[^`\n]*`", "", text)  # `[x](y)` in inline code is not a link
    for match in _LINK.finditer(text):
        yield match.group(1) or match.group(2)


def link_problem(page: Path, target: str) -> str | None:
    """Why ``target``, linked from ``page``, does not resolve inside the repository."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
        return None
    path_part, _, anchor = target.partition("#")
    dest = (page.parent / path_part).resolve() if path_part else page
    if not dest.is_relative_to(REPO_ROOT):
        return "points outside the repository"
    if not dest.exists():
        return "names no file"
    if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
        return f"names no heading #{anchor} of {dest.relative_to(REPO_ROOT)}"
    return None


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("The loop", "the-loop"),
        ("edge.yaml", "edgeyaml"),
        ("`edge status --json`", "edge-status---json"),
        ("Inside `edge_sync`", "inside-edge_sync"),
        ("Everyday work: going back, retiring a version", "everyday-work-going-back-retiring-a-version"),
        ("[Fleet](fleet.md) reports", "fleet-reports"),
    ],
)  # fmt: skip
def test_heading_anchors_as_github_makes_them(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


@pytest.mark.parametrize(
    ("target", "problem"),
    [
        ("docs/architecture.md", None),
        ("docs/architecture.md#inside-edge_sync", None),
        ("docs/reference/daemon.md#the-loop", None),
        ("https://example.com/x.md", None),
        ("docs/architecture.md#no-such-heading", "names no heading #no-such-heading"),
        ("docs/nowhere.md", "names no file"),
        ("../beside/anything.md", "points outside the repository"),
        ("docs/../../outside.md", "points outside the repository"),
    ],
)  # fmt: skip
def test_the_link_check_itself(target: str, problem: str | None) -> None:
    found = link_problem(REPO_ROOT / "README.md", target)
    assert (found is None) == (problem is None), found
    if problem is not None:
        assert found is not None
        assert found.startswith(problem), found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_relative_link_resolves_inside_the_repository(page: Path) -> None:
    bad = [f"{t}: {why}" for t in links(page) if (why := link_problem(page, t)) is not None]
    assert not bad, f"{page.relative_to(REPO_ROOT)}: {bad}"


def test_the_readme_leads_to_the_reference_and_the_guides() -> None:
    targets = set(links(REPO_ROOT / "README.md"))
    for page in ("docs/reference/index.md", "docs/architecture.md", "docs/guide/device.md",
                 "docs/guide/github-actions.md", "docs/guide/fleet.md"):  # fmt: skip
        assert page in targets, page


def _text_files() -> Iterator[Path]:
    yield REPO_ROOT / "README.md"
    yield REPO_ROOT / "Makefile"
    yield REPO_ROOT / "pyproject.toml"
    for folder in SOURCE_DIRS:
        for path in (REPO_ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".md", ".yml", ".yaml", ".toml", ".txt") and path.is_file():
                yield path


def test_no_file_points_outside_the_repository() -> None:
    found = [
        f"{path.relative_to(REPO_ROOT)}:{n}: {line.strip()}"
        for path in _text_files()
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
        if any(marker in line for marker in _OUTSIDE)
    ]
    assert not found, "\n".join(found)


def _edge_configs() -> Iterator[tuple[str, str]]:
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for n, match in enumerate(re.finditer(r"^( *)```yaml\n(.*?)^\1```", text, re.M | re.S)):
            block = textwrap.dedent(match.group(2))
            if "kind: EdgeConfig" in block:
                yield f"{page.relative_to(REPO_ROOT)}#{n}", block


EDGE_CONFIGS = list(_edge_configs())


def test_the_pages_show_edge_configs() -> None:
    where = {name.split("#")[0] for name, _ in EDGE_CONFIGS}
    assert {"docs/guide/device.md", "docs/reference/daemon.md"} <= where, where


@pytest.mark.parametrize(("name", "block"), EDGE_CONFIGS, ids=[n for n, _ in EDGE_CONFIGS])
def test_every_edge_config_the_pages_show_loads(tmp_path: Path, name: str, block: str) -> None:
    path = tmp_path / "edge.yaml"
    path.write_text(block)
    config = load_edge_config(path)
    assert config.device.id == "cam-0042", name


def _commands(group: click.Group, prefix: str) -> Iterator[str]:
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            yield from _commands(command, f"{prefix} {name}")
        else:
            yield f"{prefix} {name}"


def test_the_cli_reference_names_every_command() -> None:
    page = (REPO_ROOT / "docs/reference/cli.md").read_text(encoding="utf-8")
    commands = list(_commands(cli, "modelreg"))
    assert len(commands) > 25, commands
    missing = [c for c in commands if f"`{c}" not in page]
    assert not missing, f"docs/reference/cli.md does not list: {missing}"
