"""``modelreg build``: check, load, run the goldens of and compile each version (stable API).

The stages of one version run in :mod:`pipelines.build._stage`; the ONNX checks in
``_checks``, golden cases in ``_goldens``, engines (ONNX Runtime, TensorRT) in ``_engines``.
A build writes a record per version (:class:`BuildRecord`; :meth:`BuildRecord.load`
reads one back for reports and tools).  ``publish`` signs only from the records of its
own run's build, in memory, never from a record read back.
"""

from __future__ import annotations

from pipelines.build._engines import BUILT, FAILED, ON_DEVICE, EngineResult
from pipelines.build._stage import (
    BUILD_DIR,
    MAX_RECORD_BYTES,
    RECORD_FILE,
    STAGES,
    BuildProblem,
    BuildRecord,
    BuildReport,
    ExternalFile,
    Stage,
    build,
    build_version,
)
from pipelines.changes import changed_versions
from pipelines.errors import BuildError

__all__ = [
    "BUILD_DIR",
    "BUILT",
    "FAILED",
    "MAX_RECORD_BYTES",
    "ON_DEVICE",
    "RECORD_FILE",
    "STAGES",
    "BuildError",
    "BuildProblem",
    "BuildRecord",
    "BuildReport",
    "EngineResult",
    "ExternalFile",
    "Stage",
    "build",
    "build_version",
    "changed_versions",
]
