"""Golden files on the CI side: the bounded reader as ``pipelines`` reports it, and
recording the expected outputs of a new version.

Reading, writing and comparing golden tensors lives in :mod:`registry.goldens`, shared
with devices; this module re-exports its reader with the pipeline's error type
(``ArtifactError``), which the build and ``version add`` report.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines.build_checks import ort_errors
from pipelines.errors import ArtifactError
from registry import goldens
from registry.errors import GoldenError
from registry.goldens import (
    DEFAULT_NPZ_LIMITS,
    NpyHeader,
    NpzLimits,
    array_problem,
    directory_problem,
    npz_bytes,
)

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = [
    "DEFAULT_NPZ_LIMITS",
    "NpyHeader",
    "NpzLimits",
    "array_problem",
    "directory_problem",
    "read_npz",
    "record_outputs",
]


def read_npz(
    path: Path, display: str, *, root: Path | None = None, limits: NpzLimits = DEFAULT_NPZ_LIMITS
) -> dict[str, npt.NDArray[Any]]:
    """The arrays of an ``.npz`` file, by name, read within ``limits``
    (:func:`registry.goldens.read_npz`).

    Raises:
        ArtifactError: a link, missing, not a regular file, over a cap, or not a
            readable ``.npz`` of plain arrays (one line, never the file's content).
    """
    try:
        return goldens.read_npz(path, display, root=root, limits=limits)
    except GoldenError as e:
        raise ArtifactError(e.path, e.reason) from None


def record_outputs(model: Path, inputs_npz: Path) -> tuple[bytes, bytes]:
    """Run ``model`` on the arrays of ``inputs_npz`` (CPU, ONNX Runtime).

    Returns:
        (inputs, outputs) as canonical ``.npz`` bytes, arrays keyed by tensor name.

    Raises:
        ArtifactError: the inputs are not a readable ``.npz`` within caps, don't match
            the model, or the model does not run.
    """
    import onnxruntime as ort

    inputs = read_npz(inputs_npz, str(inputs_npz))
    try:
        session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
        wanted = {i.name for i in session.get_inputs()}
        if set(inputs) != wanted:
            raise ArtifactError(
                str(inputs_npz),
                f"holds arrays {sorted(inputs)} but the model takes {sorted(wanted)}",
            )
        names = [o.name for o in session.get_outputs()]
        values = session.run(names, inputs)
    except ort_errors() as e:
        raise ArtifactError(str(model), f"ONNX Runtime failed: {e}") from None
    return npz_bytes(inputs), npz_bytes(dict(zip(names, values, strict=True)))
