"""``modelreg publish``: push artifacts and release them as signed TUF targets (stable API).

:func:`publish` stages each version (ONNX file, OMS bundle, delta from its parent, the
engines this run built, the device-facing description) as targets, uploads them through
:class:`TargetStore` before the metadata that names them, signs, and mirrors the
signed metadata to the remote (``_mirror``); :func:`refresh_metadata` re-signs the
timestamp and mirrors it (``modelreg freshness refresh``, ``_refresh``).
The description and golden files are made in ``_description``, external-data files
and their deltas in ``_external``.
"""

from __future__ import annotations

from pipelines.publish._refresh import RefreshReport, refresh_metadata
from pipelines.publish._stage import (
    RELEASE_DIR,
    TUF_SUBDIR,
    CiContext,
    PublishReport,
    TargetStore,
    branch_problems,
    current_branch,
    engine_file_name,
    publish,
    published_provenance,
    released_changes,
    released_deprecations,
)

__all__ = [
    "RELEASE_DIR",
    "TUF_SUBDIR",
    "CiContext",
    "PublishReport",
    "RefreshReport",
    "TargetStore",
    "branch_problems",
    "current_branch",
    "engine_file_name",
    "publish",
    "published_provenance",
    "refresh_metadata",
    "released_changes",
    "released_deprecations",
]
