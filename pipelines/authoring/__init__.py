"""Authoring commands that need DVC and ONNX: ``init``, ``model add``, ``version add``.

Edits that need only the YAML (``promote``, ``rollback``, ``deprecate``) live in
:mod:`registry`, which the device side may import; these need DVC and ONNX, so they live
here.  ``requirements_lock`` writes the hash-pinned requirement files the workflows
install from.
"""

from __future__ import annotations

from pipelines.authoring._workspace import (
    INDEX_ENV,
    WORKFLOWS,
    AddVersionResult,
    InitResult,
    add_model,
    add_version,
    init_repo,
    write_workflows,
)

__all__ = [
    "INDEX_ENV",
    "WORKFLOWS",
    "AddVersionResult",
    "InitResult",
    "add_model",
    "add_version",
    "init_repo",
    "write_workflows",
]
