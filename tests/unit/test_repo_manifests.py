"""This repository's own manifests: valid, and reproducible from our example script."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import yaml

from modelreg.examples import EXAMPLE_VERSIONS, model_bytes, run_onnxruntime
from registry.checks import validate_paths
from registry.repository import load_repository
from tests.conftest import REPO_ROOT


def test_own_manifests_are_valid() -> None:
    repo = load_repository(REPO_ROOT, jobs=1)
    assert validate_paths(repo) == []
    assert {name: sorted(v) for name, v in repo.versions.items()} == {
        name: sorted(versions) for name, versions in EXAMPLE_VERSIONS.items()
    }


def test_dvc_pointers_match_the_example_generator() -> None:
    # The ONNX files are DVC-tracked, not in git: `make examples` rebuilds them, and this
    # proves the rebuild yields exactly the bytes the committed pointers name.
    for name, versions in EXAMPLE_VERSIONS.items():
        for version in versions:
            pointer = REPO_ROOT / "models" / name / f"{version}.onnx.dvc"
            out = yaml.safe_load(pointer.read_text())["outs"][0]
            data = model_bytes(name, version)
            assert out["md5"] == hashlib.md5(data).hexdigest(), pointer  # noqa: S324 - DVC's digest
            assert out["size"] == len(data)


def test_goldens_reproduce_with_onnxruntime() -> None:
    repo = load_repository(REPO_ROOT, jobs=1)
    for entry in repo.all_versions():
        goldens = entry.manifest.spec.goldens
        assert goldens is not None
        data = model_bytes(entry.name, entry.version)
        for case in goldens.cases:
            assert isinstance(case.inputs, str)
            assert isinstance(case.outputs, str)
            with (
                np.load(Path(REPO_ROOT, case.inputs)) as ins,
                np.load(Path(REPO_ROOT, case.outputs)) as outs,
            ):
                got = run_onnxruntime(data, {k: ins[k] for k in ins.files})
                for key in outs.files:
                    np.testing.assert_allclose(
                        got[key], outs[key], rtol=goldens.rtol, atol=goldens.atol
                    )
