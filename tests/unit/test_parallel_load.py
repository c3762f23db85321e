"""Loading a repository large enough for the worker pool gives what one process gives.

The pool only starts from ``registry.repository._PARALLEL_FROM`` files, so these tests
write a repository that size (the benchmark's generator), break some of its files in
every way a load reports, and compare a pooled load with a single-process one: the
same manifests, documents, pointer checks and problems, in the same order.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from benchmarks._scale_repos import write_modelreg_tree
from registry import repository
from registry.checks import validate_paths
from registry.repository import load_repository


@pytest.fixture(scope="module")
def big_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pooled") / "repo"
    versions = 10
    models = repository._PARALLEL_FROM // (versions + 1) + 10
    write_modelreg_tree(root, models, versions)
    manifests = root / "manifests"
    # One of each kind of problem a load meets, spread over the chunks of the pool.
    (manifests / "m0003" / "versions" / "1.2.0.yaml").write_text("spec: [unclosed\n")
    bad = manifests / "m0040" / "versions" / "1.1.0.yaml"
    bad.write_text(bad.read_text().replace("format: onnx", "format: onnx\n    extra: 1"))
    (root / "models" / "m0077" / "1.3.0.onnx.dvc").unlink()
    (root / "models" / "m0090" / "1.0.0.onnx.dvc").write_text("outs: nope\n")
    linked = manifests / "m0120" / "versions" / "1.4.0.yaml"
    linked.unlink()
    linked.symlink_to(manifests / "m0120" / "versions" / "1.3.0.yaml")
    shutil.rmtree(manifests / "m0130" / "versions" / "1.5.0.yaml", ignore_errors=True)
    (manifests / "m0130" / "versions" / "1.5.0.yaml").write_bytes(b"\xff\xfe")
    (manifests / "m0141" / "model.yaml").unlink()
    return root


def _picture(root: Path, jobs: int) -> dict[str, Any]:
    repo = load_repository(root, jobs=jobs, cache=False)
    return {
        "models": {n: (m.file, m.path, m.doc.data, m.manifest) for n, m in repo.models.items()},
        "versions": [
            (e.name, e.version, e.file, e.path, e.doc.data, e.manifest) for e in repo.all_versions()
        ],
        "pointers": repo.pointers,
        "broken": repo.broken,
        "files": repo.files,
        "problems": [str(p) for p in validate_paths(repo)],
        "positions": [e.doc.position(("spec", "artifact")) for e in repo.all_versions()][:50],
    }


def test_a_pooled_load_equals_a_single_process_load(big_repo: Path) -> None:
    assert sum(1 for _ in big_repo.rglob("*.yaml")) > repository._PARALLEL_FROM
    pooled, single = _picture(big_repo, 2), _picture(big_repo, 1)
    assert pooled == single
    problems = "\n".join(pooled["problems"])
    for expected in (
        "m0003/versions/1.2.0.yaml:1:7: invalid YAML",
        "m0040/versions/1.1.0.yaml:12:5: spec.artifact.extra: unknown key",
        "no DVC pointer models/m0077/1.3.0.onnx.dvc",
        "models/m0090/1.0.0.onnx.dvc:1:7: outs: expected a list",
        "m0120/versions/1.4.0.yaml: is a symbolic link",
        "m0130/versions/1.5.0.yaml:1:1: not UTF-8",
        "m0141/model.yaml: model folder 'm0141' has versions but no model.yaml",
    ):
        assert expected in problems, expected
    assert len(pooled["versions"]) == sum(1 for _ in big_repo.rglob("versions/*.yaml")) - 4


def test_the_pool_runs_in_other_processes(big_repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pooled load parses in workers (not a quiet fallback to this process)."""
    parsed_here: list[int] = []
    original = repository._parse

    def counting(task: Any, show: Any) -> Any:
        parsed_here.append(os.getpid())
        return original(task, show)

    monkeypatch.setattr(repository, "_parse", counting)
    load_repository(big_repo, jobs=2, cache=False)
    assert os.getpid() not in parsed_here
    load_repository(big_repo, jobs=1, cache=False)
    assert os.getpid() in parsed_here
