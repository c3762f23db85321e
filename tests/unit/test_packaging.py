"""What each install pulls in: a device install must never bring MLflow or DVC."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib

import pytest

from tests.conftest import REPO_ROOT

HEAVY = {"mlflow", "mlflow-skinny", "dvc", "gitpython", "onnx"}


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0].lower() for r in requirements}


def test_edge_extra_excludes_registry_side_tools() -> None:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    edge = _names(project["dependencies"]) | _names(project["optional-dependencies"]["edge"])
    assert not edge & HEAVY, edge & HEAVY
    assert {"onnxruntime", "tuf", "zstandard"} <= edge
    ci = _names(project["optional-dependencies"]["ci"])
    assert {"mlflow", "dvc", "onnx"} <= ci
    assert project["scripts"] == {"modelreg": "modelreg.cli.main:main"}


REGISTRY_SIDE = {"mlflow", "dvc", "onnx", "pipelines", "git"}


@pytest.mark.parametrize(
    ("modules", "forbidden"),
    [
        # The CLI and the trust verifier load without MLflow, DVC, ONNX or pipelines.
        ("modelreg.cli.main, edge_sync.sync.trust, signing.oms, registry.checks", REGISTRY_SIDE),
        # The daemon and its command: no registry-side tool either.
        (
            (
                "modelreg.cli.edge_cmds, edge_sync.daemon, edge_sync.sync.updater, edge_sync.engine.ort, "
                "edge_sync.sync.report, "
                "edge_sync.sync.watcher, edge_sync.state.store, edge_sync.config"
            ),
            REGISTRY_SIDE | {"onnxruntime"},
        ),
        # Reading the fleet's reports: an operator's machine, no device code either.
        ("fleet.reports, fleet.summary", REGISTRY_SIDE | {"onnxruntime", "edge_sync"}),
        # What a device's updater and self-test import: not even ONNX Runtime up front.
        (
            (
                "registry.goldens, registry.atomic, registry.sessions, signing.target_names, "
                "signing.version_doc"
            ),
            REGISTRY_SIDE | {"onnxruntime"},
        ),
    ],
)
def test_device_side_code_imports_no_registry_side_tool(modules: str, forbidden: set[str]) -> None:
    code = (
        f"import sys, {modules};"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        f"{sorted(forbidden)!r});"
        "print(','.join(bad))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO_ROOT
    )
    assert out.stdout.strip() == ""


ALLOWED = {
    "registry": set(),
    "signing": {"registry"},
    "pipelines": {"registry", "signing"},
    "edge_sync": {"registry", "signing"},
    # what the fleet's devices report (the schema is registry's), and whether their
    # signatures verify (signing's)
    "fleet": {"registry", "signing"},
}


def test_dependency_direction() -> None:
    # docs/architecture.md: registry <- signing <- pipelines; registry, signing <- edge_sync;
    # registry, signing <- fleet.

    ours = {*ALLOWED, "modelreg"}
    for package, allowed in ALLOWED.items():
        for path in (REPO_ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top in ours and top != package:
                        assert top in allowed, f"{path.relative_to(REPO_ROOT)} imports {name}"


PIPELINE_LAYERS = {
    # shared by the stages; none of them imports a stage
    "errors": set(),
    "_probe": set(),
    "dvc": {"_probe"},
    "github": {"errors"},
    "changes": set(),
    "context": {"changes", "github"},
    "onnx": {"errors"},
    "fetch": {"dvc", "errors"},
    "goldens": {"errors", "onnx"},
    "model_bundle": {"onnx"},
    # the stages, in the order a release runs them
    "authoring": {"dvc", "errors", "goldens", "onnx"},
    "build": {"changes", "context", "errors", "fetch", "goldens", "onnx"},
    "diff": {"changes", "context", "errors", "fetch", "github", "onnx"},
    "publish": {
        "build",
        "context",
        "dvc",
        "errors",
        "fetch",
        "github",
        "model_bundle",
        "provenance",
    },
    "provenance": {"errors", "github"},
    "register": {"_probe", "context", "errors", "fetch", "github"},
    # the workflows' entry points, over every stage
    "ci": {"build", "context", "diff", "errors", "github", "publish", "register"},
}
"""What each part of ``pipelines`` may import of the others (docs/architecture.md)."""


def _runtime_imports(tree: ast.Module) -> list[str]:
    """Modules imported at run time (``if TYPE_CHECKING:`` blocks are for types only)."""
    checking = {
        id(n)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and getattr(block.test, "id", None) == "TYPE_CHECKING"
        for stmt in block.body
        for n in ast.walk(stmt)
    }
    found: list[str] = []
    for node in ast.walk(tree):
        if id(node) in checking:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "pipelines":
                found += [f"pipelines.{a.name}" for a in node.names]
            else:
                found.append(node.module)
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names]
    return found


def test_pipelines_layers() -> None:
    root = REPO_ROOT / "pipelines"
    assert {p.stem if p.is_file() else p.name for p in root.iterdir()
            if p.suffix == ".py" or (p / "__init__.py").is_file()} - {"__init__"} == set(
        PIPELINE_LAYERS
    ), "a new part of pipelines/ needs its place in PIPELINE_LAYERS"  # fmt: skip
    for path in root.rglob("*.py"):
        rel = path.relative_to(root).parts
        part = rel[0].removesuffix(".py")
        if part == "__init__":
            continue
        for name in _runtime_imports(ast.parse(path.read_text(), str(path))):
            bits = name.split(".")
            if bits[0] != "pipelines" or len(bits) < 2 or bits[1] == part:
                continue
            assert bits[1] in PIPELINE_LAYERS[part], f"pipelines/{'/'.join(rel)} imports {name}"


def test_the_architecture_page_names_every_part_of_pipelines() -> None:
    page = (REPO_ROOT / "docs/architecture.md").read_text()
    missing = [part for part in PIPELINE_LAYERS if part != "_probe" and f"`{part}`" not in page]
    assert not missing, f"docs/architecture.md does not say what these own: {missing}"
