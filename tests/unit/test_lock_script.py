"""scripts/lock_workflow_requirements.py turns pip's installation report into pins.

The resolution itself needs the package index (it is run by hand, ``make lock``); what
the script makes of the report is checked here on reports in pip's documented format.
"""

from __future__ import annotations

import importlib.util
from types import ModuleType
from typing import Any

import pytest

from pipelines.authoring.requirements_lock import Pin
from tests.conftest import REPO_ROOT

SHA = "0" * 63 + "1"


def _script() -> ModuleType:
    path = REPO_ROOT / "scripts" / "lock_workflow_requirements.py"
    spec = importlib.util.spec_from_file_location("lock_workflow_requirements", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _item(name: str, version: str, url: str, sha: str | None = SHA) -> dict[str, Any]:
    info: dict[str, Any] = {"url": url}
    if sha is not None:
        info["archive_info"] = {"hashes": {"sha256": sha}, "hash": f"sha256={sha}"}
    else:
        info["dir_info"] = {}
    return {"metadata": {"name": name, "version": version}, "download_info": info}


def test_index_files_become_pins_and_modelreg_is_left_to_the_workflows() -> None:
    report = [
        _item("modelreg", "0.1.0", "file:///src/modelreg", sha=None),
        _item("click", "8.1.7", "https://files.example/click-8.1.7-py3-none-any.whl"),
        _item(
            "numpy",
            "2.1.0",
            "https://files.example/numpy-2.1.0-cp311-cp311-"
            "manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
        ),
    ]
    assert _script()._pins(report) == [Pin("click", "8.1.7", (SHA,)), Pin("numpy", "2.1.0", (SHA,))]


@pytest.mark.parametrize(
    ("item", "message"),
    [
        (_item("tool", "1.0", "file:///src/tool", sha=None), "not an index file"),
        (
            _item(
                "fast",
                "1.0",
                "https://files.example/fast-1.0-cp311-cp311-manylinux_2_39_x86_64.whl",
            ),
            "needs glibc 2.39, newer than the runners'",
        ),
    ],
)
def test_what_a_runner_could_not_install_is_refused(item: dict[str, Any], message: str) -> None:
    with pytest.raises(SystemExit, match=message):
        _script()._pins([item])
