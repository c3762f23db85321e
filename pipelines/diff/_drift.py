"""Golden output drift: the old and the new model run on the new version's golden inputs.

Part of the semantic diff (:mod:`pipelines.diff._stage`); the API is stable with it.  Drift is
informational: a case that cannot be run (inputs the old model does not accept, a
missing ``.npz``, ONNX Runtime refusing a model) is reported as skipped with the reason,
never raised, because the golden test step already fails the pull request for those.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import numpy.typing as npt

from pipelines.errors import ArtifactError
from pipelines.onnx import load_session
from registry.errors import GoldenError
from registry.goldens import compare, inline_array, read_npz
from registry.schema import Goldens, Tensor, TensorSet

Array = npt.NDArray[Any]
ModelSource = str | bytes
"""What ONNX Runtime loads: a file path (external data resolved beside it) or bytes."""

if TYPE_CHECKING:
    from pipelines.onnx import Session


@dataclass(frozen=True)
class OutputDrift:
    """How far one output of the old model is from the new model's, on one case.

    Attributes:
        case: golden case name.
        output: output tensor name.
        max_abs: largest absolute difference; None when not comparable (shape changed,
            not numeric).
        relative: ``max_abs / max |old|``, the drift on the scale of the output (an
            element-wise ratio explodes on near-zero values such as softmax tails);
            None when not comparable or the old output is all zeros and drift is not.
        within_tolerance: ``numpy.allclose(new, old, rtol, atol)`` with the case's
            tolerances: whether the old model would still pass the new goldens.
        note: why the output is not comparable, else empty.
    """

    case: str
    output: str
    max_abs: float | None
    relative: float | None
    within_tolerance: bool
    note: str = ""


@dataclass(frozen=True)
class SkippedCase:
    """A golden case whose drift was not measured, and why."""

    case: str
    reason: str


@dataclass(frozen=True)
class GoldenDrift:
    """Drift of every output on every golden case of the new version."""

    outputs: tuple[OutputDrift, ...]
    skipped: tuple[SkippedCase, ...]

    @property
    def within_tolerance(self) -> bool | None:
        """Whether every measured output stayed within tolerance; None if none was measured."""
        return all(o.within_tolerance for o in self.outputs) if self.outputs else None


class _Skip(Exception):  # noqa: N818 - control flow inside this module, never escapes
    """A case cannot be measured; the message says why."""


def _inline(name: str, tensor: Tensor) -> Array:
    if tensor.dtype == "bfloat16":
        raise _Skip("inline bfloat16 tensors have no numpy dtype")
    try:
        return inline_array(name, tensor)
    except GoldenError:
        raise _Skip(f"inline data does not fit {tensor.dtype} {list(tensor.shape)}") from None


def _tensor_set(spec: TensorSet, root: Path | None) -> dict[str, Array]:
    """Arrays of a golden tensor set: an ``.npz`` under ``root`` or inline tensors.

    Raises:
        _Skip: the file is missing or unreadable, or a tensor cannot be built.
    """
    if not isinstance(spec, str):
        return {name: _inline(name, t) for name, t in spec.items()}
    if root is None:
        raise _Skip(f"{spec}: .npz goldens need the repository root")
    # The one bounded reader: golden files come with pull requests (links, bombs).
    try:
        return read_npz(root / spec, spec, root=root)
    except GoldenError as e:
        raise _Skip(str(e)) from None


def _fits(session: Session, inputs: Mapping[str, Array], which: str) -> None:
    wanted = {str(i.name): i for i in session.get_inputs()}
    if set(inputs) != set(wanted):
        raise _Skip(f"the {which} model takes {sorted(wanted)}, the goldens hold {sorted(inputs)}")
    for name, spec in wanted.items():
        shape = tuple(inputs[name].shape)
        dims = list(spec.shape)
        if len(dims) != len(shape) or any(
            isinstance(d, int) and d != s for d, s in zip(dims, shape, strict=True)
        ):
            shown = ",".join("?" if d is None else str(d) for d in dims)
            raise _Skip(
                f"the {which} model takes {name}[{shown}], the golden input is {list(shape)}"
            )


def _run(session: Session, inputs: Mapping[str, Array], which: str) -> dict[str, Array]:
    names = [str(o.name) for o in session.get_outputs()]
    try:
        values = cast("list[Array]", session.run(names, dict(inputs)))
    except (RuntimeError, ValueError, TypeError, MemoryError) as e:  # inputs ORT rejects
        raise _Skip(f"ONNX Runtime failed on the {which} model: {e}") from None
    return dict(zip(names, values, strict=True))


def compare_output(
    case: str, output: str, old: Array, new: Array, *, rtol: float, atol: float
) -> OutputDrift:
    """Drift of one output (pure; exposed for tests).

    Whether it is within tolerance is :func:`registry.goldens.compare` with the old
    output as the expected value: the golden test's own rule.
    """
    if old.shape != new.shape:
        note = f"shape {list(old.shape)} → {list(new.shape)}"
        return OutputDrift(case, output, None, None, within_tolerance=False, note=note)
    found = compare(old, new, rtol, atol)
    if found.reason is not None:
        note = f"dtype {old.dtype} → {new.dtype}"
        return OutputDrift(case, output, None, None, within_tolerance=False, note=note)
    if found.max_abs_error is None:  # booleans and strings: equal or not
        return OutputDrift(case, output, None, None, found.ok, "" if found.ok else "values differ")
    scale = float(np.max(np.abs(old.astype(np.float64)))) if old.size else 0.0
    max_abs = found.max_abs_error
    relative = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else None)
    return OutputDrift(case, output, max_abs, relative, found.ok)


def golden_drift(
    old: ModelSource,
    new: ModelSource,
    goldens: Goldens,
    root: Path | None,
    *,
    blocked: Sequence[str] = (),
) -> GoldenDrift:
    """Run both models on every golden case of ``goldens`` and compare their outputs.

    Args:
        old: the old model (path or bytes).
        new: the new model (path or bytes).
        goldens: the new version's golden cases.
        root: folder that ``.npz`` paths are relative to (the repository root).
        blocked: reasons the old model cannot take the new inputs (breaking input
            changes); when given, every case is skipped with them.

    Returns:
        Drift per case and output present in both models, and the skipped cases.
    """
    if blocked:
        reason = "input signature changed: " + "; ".join(blocked)
        return GoldenDrift((), tuple(SkippedCase(c.name, reason) for c in goldens.cases))
    sessions: dict[str, Any] = {}
    for which, model in (("old", old), ("new", new)):
        try:
            sessions[which] = load_session(model, f"the {which} model")
        except ArtifactError as e:
            reason = str(e)  # "the old model: ONNX Runtime cannot load it: ..."
            return GoldenDrift((), tuple(SkippedCase(c.name, reason) for c in goldens.cases))
    measured: list[OutputDrift] = []
    skipped: list[SkippedCase] = []
    for case in goldens.cases:
        rtol = goldens.rtol if case.rtol is None else case.rtol
        atol = goldens.atol if case.atol is None else case.atol
        try:
            inputs = _tensor_set(case.inputs, root)
            for which in ("old", "new"):
                _fits(sessions[which], inputs, which)
            before = _run(sessions["old"], inputs, "old")
            after = _run(sessions["new"], inputs, "new")
        except _Skip as e:
            skipped.append(SkippedCase(case.name, str(e)))
            continue
        measured.extend(
            compare_output(case.name, name, before[name], after[name], rtol=rtol, atol=atol)
            for name in sorted(set(before) & set(after))
        )
    return GoldenDrift(tuple(measured), tuple(skipped))


__all__ = [
    "GoldenDrift",
    "ModelSource",
    "OutputDrift",
    "SkippedCase",
    "compare_output",
    "golden_drift",
]
