"""What each install pulls in: a device install must never bring MLflow or DVC."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib

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


def test_device_side_code_imports_no_registry_side_tool() -> None:
    # The CLI and the trust verifier load without MLflow, DVC, ONNX or pipelines.
    code = (
        "import sys, modelreg.cli.main, modelreg.cli.edge_cmds, edge_sync.trust, "
        "edge_sync.daemon, edge_sync.updater, edge_sync.engine, edge_sync.watcher, "
        "signing.oms, signing.version_doc, signing.target_names, registry.checks;"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'mlflow', 'dvc', 'onnx', 'pipelines', 'git'});"
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
