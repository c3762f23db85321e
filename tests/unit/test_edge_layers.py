"""The device side's layers: what each part of ``edge_sync`` may import of the others, as
the layer map in docs/architecture.md ("Inside edge_sync") draws it, checked on the source.

A part is a top-level module (``daemon``, ``config``) or a subpackage (``decide``,
``sync``); an entry ``part.module`` allows that one module only (``serve`` may name the
state's models, never the state dir).  Imports under ``if TYPE_CHECKING:`` count too: a
layer that names another's types for annotations still depends on what they mean.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

ROOT = REPO_ROOT / "edge_sync"

PAGE = REPO_ROOT / "docs/architecture.md"
MAP_HEADER = "| part | imports of `edge_sync` |"


def layer_map(page: str) -> dict[str, set[str]]:
    """The layer map as docs/architecture.md draws it: part -> what it may import (the
    parts and modules named in its row, type-only imports included; "all of the above":
    every part drawn before it)."""
    lines = page[page.index(MAP_HEADER) :].splitlines()[2:]
    layers: dict[str, set[str]] = {}
    for line in lines:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        part = cells[0].strip("`")
        if cells[1] == "all of the above":
            layers[part] = set(layers)
        else:
            layers[part] = set(re.findall(r"`([\w.]+)`", cells[1]))
    return layers


EDGE_LAYERS = layer_map(PAGE.read_text())
"""What each part of ``edge_sync`` may import of the others (the page is the rule)."""


def _part(path: Path) -> str:
    return path.relative_to(ROOT).parts[0].removesuffix(".py")


def _imports(path: Path) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "edge_sync":
                found += [(node.lineno, f"edge_sync.{a.name}") for a in node.names]
            else:
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
    return found


def allowed(layers: dict[str, set[str]], part: str, imported: str) -> bool:
    """Whether ``part`` may import the module ``imported`` (``edge_sync.x.y``)."""
    bits = imported.split(".")
    if bits[0] != "edge_sync" or len(bits) < 2 or bits[1] == part:
        return True
    rules = layers[part]
    return bits[1] in rules or (len(bits) > 2 and f"{bits[1]}.{bits[2]}" in rules)


def test_every_part_has_its_place() -> None:
    parts = {_part(p) for p in ROOT.rglob("*.py")} - {"__init__"}
    assert parts == set(EDGE_LAYERS), "a new part of edge_sync/ needs its place in EDGE_LAYERS"


@pytest.mark.parametrize("path", sorted(ROOT.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_each_part_imports_only_the_layers_below_it(path: Path) -> None:
    part = _part(path)
    if part == "__init__":
        return
    wrong = [
        f"line {line}: {name}"
        for line, name in _imports(path)
        if not allowed(EDGE_LAYERS, part, name)
    ]
    assert not wrong, f"edge_sync/{path.relative_to(ROOT)} ({part}) imports {wrong}"


SAMPLE = f"""
{MAP_HEADER}
| --- | --- |
| `errors` | nothing |
| `state` | `errors` |
| `serve` | `errors`; for types only `state.models` |
| `daemon` | all of the above |

after the table
"""


def test_the_map_is_read_as_drawn() -> None:
    assert layer_map(SAMPLE) == {
        "errors": set(),
        "state": {"errors"},
        "serve": {"errors", "state.models"},
        "daemon": {"errors", "state", "serve"},
    }


@pytest.mark.parametrize(
    ("part", "imported", "ok"),
    [
        ("serve", "edge_sync.state.models", True),
        ("serve", "edge_sync.state.store", False),
        ("state", "edge_sync.serve.app", False),
        ("state", "edge_sync.errors", True),
        ("state", "edge_sync.state.store", True),
        ("errors", "registry.errors", True),
        ("errors", "edge_sync.daemon", False),
        ("daemon", "edge_sync.serve.app", True),
    ],
)
def test_the_rule_itself(part: str, imported: str, ok: bool) -> None:
    assert allowed(layer_map(SAMPLE), part, imported) is ok
