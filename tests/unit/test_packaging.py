"""What each install pulls in: a device install must never bring MLflow or DVC."""

from __future__ import annotations

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
        ("modelreg.cli.main, edge_sync.trust, signing.oms, registry.checks", REGISTRY_SIDE),
        # The daemon and its command: no registry-side tool either.
        (
            (
                "modelreg.cli.edge_cmds, edge_sync.daemon, edge_sync.updater, edge_sync.engine, "
                "edge_sync.watcher, edge_sync.state, edge_sync.config"
            ),
            REGISTRY_SIDE | {"onnxruntime"},
        ),
        # What a device's updater and self-test import: not even ONNX Runtime up front.
        (
            "registry.goldens, registry.atomic, signing.target_names, signing.version_doc",
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
}


def test_dependency_direction() -> None:
    # SPEC section 2: registry <- signing <- pipelines; registry, signing <- edge_sync.
    import ast

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
