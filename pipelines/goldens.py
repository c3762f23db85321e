"""Golden files on the CI side: the bounded reader as ``pipelines`` reports it, and
recording the expected outputs of a new version.

Reading, writing and comparing golden tensors lives in :mod:`registry.goldens`, shared
with devices; this module re-exports its reader with the pipeline's error type
(``ArtifactError``), which the build and ``version add`` report.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from pipelines.errors import ArtifactError
from pipelines.onnx import ort_errors
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

    from pipelines.onnx import Session

__all__ = [
    "DEFAULT_NPZ_LIMITS",
    "NpyHeader",
    "NpzLimits",
    "array_problem",
    "directory_problem",
    "input_mismatches",
    "read_npz",
    "record_outputs",
    "sample_inputs",
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


def _dtype_name(ort_type: str) -> str:
    """numpy's name for an ONNX Runtime input type (``tensor(float)`` -> ``float32``)."""
    inner = ort_type.removeprefix("tensor(").removesuffix(")")
    return {"float": "float32", "double": "float64"}.get(inner, inner)


def _dims(shape: Sequence[object]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def input_mismatches(session: Session, arrays: Mapping[str, npt.NDArray[Any]]) -> list[str]:
    """One line per golden input whose dtype or shape the model does not take.

    Checked before running: ONNX Runtime's own refusal is several lines of its
    internals (``index: 1 Got: 8 Expected: 16``) and names neither file nor tensor.
    Symbolic dimensions (``batch``) accept any size.

    Args:
        session: an ONNX Runtime ``InferenceSession``.
        arrays: input name -> array; names the model does not take are not looked at.

    Returns:
        ``input 'x' expects float32 [batch, 16], given float64 [2, 8]`` lines.
    """
    found = []
    for spec in session.get_inputs():
        array = arrays.get(spec.name)
        if array is None:
            continue
        want = _dtype_name(spec.type)
        shape = list(spec.shape)
        dtype_ok = str(array.dtype) == want or (want == "string" and array.dtype.kind in "OUS")
        shape_ok = len(shape) == array.ndim and all(
            not isinstance(w, int) or w == g for w, g in zip(shape, array.shape, strict=True)
        )
        if not (dtype_ok and shape_ok):
            found.append(
                f"input {spec.name!r} expects {want} {_dims(shape)}, "
                f"given {array.dtype} {_dims(array.shape)}"
            )
    return found


SAMPLE_MAX_VALUES: Final = 1 << 24
"""Values all sample inputs together may hold (64 MiB of float32)."""


def sample_inputs(
    session: Session, seed: int = 0, max_values: int = SAMPLE_MAX_VALUES
) -> dict[str, npt.NDArray[Any]]:
    """Inputs the model takes, for timing a version without golden cases: every
    symbolic dimension 1, floats drawn from a seeded normal distribution (the same
    arrays for every version timed), integers 0, booleans False, strings empty.

    Raises:
        ValueError: the inputs' fixed dimensions would hold more than ``max_values``
            values (a graph may declare any size: none is allocated), or a type numpy
            has no name for.
    """
    import math

    import numpy as np

    rng = np.random.default_rng(seed)
    arrays: dict[str, npt.NDArray[Any]] = {}
    shapes = {
        spec.name: [d if isinstance(d, int) and d >= 0 else 1 for d in spec.shape]
        for spec in session.get_inputs()
    }
    total = sum(math.prod(dims) for dims in shapes.values())
    if total > max_values:
        raise ValueError(f"its inputs would hold {total} values, over the {max_values} sampled")
    for spec in session.get_inputs():
        dims = shapes[spec.name]
        name = _dtype_name(spec.type)
        if name == "string":
            arrays[spec.name] = np.full(dims, "", dtype=object)
        elif name.startswith("float"):
            arrays[spec.name] = rng.standard_normal(dims).astype(name)
        else:
            arrays[spec.name] = np.zeros(dims, dtype=name)
    return arrays


def record_outputs(model: Path, inputs_npz: Path) -> tuple[bytes, bytes]:
    """Run ``model`` on the arrays of ``inputs_npz`` (CPU, ONNX Runtime).

    Returns:
        (inputs, outputs) as canonical ``.npz`` bytes, arrays keyed by tensor name.

    Raises:
        ArtifactError: the inputs are not a readable ``.npz`` within caps, don't match
            the model, or the model does not run.
    """
    from pipelines.onnx import load_session

    inputs = read_npz(inputs_npz, str(inputs_npz))
    session = load_session(model, str(model))
    try:
        wanted = {i.name for i in session.get_inputs()}
        if set(inputs) != wanted:
            raise ArtifactError(
                str(inputs_npz),
                f"holds arrays {sorted(inputs)} but the model takes {sorted(wanted)}",
            )
        mismatches = input_mismatches(session, inputs)
        if mismatches:
            raise ArtifactError(str(inputs_npz), "; ".join(mismatches))
        names = [o.name for o in session.get_outputs()]
        values = session.run(names, inputs)
    except ort_errors() as e:
        raise ArtifactError(str(model), f"ONNX Runtime failed: {e}") from None
    return npz_bytes(inputs), npz_bytes(dict(zip(names, values, strict=True)))
