"""Build stage "goldens": the model reproduces each golden case within tolerance.

``compare_output`` is :func:`registry.goldens.compare` (``numpy.allclose`` semantics,
the rule devices apply in their self-test).  ``run_goldens`` does the I/O: reads
``.npz`` files (``registry.goldens.read_npz``: no links, caps checked before any array
is read) or inline tensors, and runs the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines.goldens import input_mismatches
from pipelines.onnx import ort_errors
from registry.errors import GoldenError, one_line
from registry.goldens import Comparison, tensor_set
from registry.goldens import compare as compare_output
from registry.schema import Goldens, TensorSet
from registry.yamlsrc import Loc

__all__ = ["CaseResult", "Comparison", "GoldenFailure", "compare_output", "run_goldens"]

if TYPE_CHECKING:
    from pipelines.onnx import Session


def _run_errors() -> tuple[type[BaseException], ...]:
    # ORT's own, and what a golden array of a type it cannot take raises in its binding.
    return (*ort_errors(), TypeError, MemoryError)


@dataclass(frozen=True, slots=True)
class GoldenFailure:
    """A golden problem, located in the ModelVersion manifest."""

    loc: Loc
    message: str


@dataclass
class CaseResult:
    """The outcome of one golden case, for the build record."""

    case: str
    rtol: float
    atol: float
    passed: bool = True
    max_abs_error: dict[str, float | None] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """This result as JSON data."""
        return {
            "case": self.case,
            "passed": self.passed,
            "rtol": self.rtol,
            "atol": self.atol,
            "max_abs_error": self.max_abs_error,
        }


class _TensorsError(Exception):
    """A golden tensor set cannot be read (message is one line)."""


def _tensors(root: Path, value: TensorSet) -> dict[str, Any]:
    for name, tensor in {} if isinstance(value, str) else value.items():
        if tensor.dtype == "bfloat16":
            # Stored as bits (registry.goldens), but ONNX Runtime's Python API returns
            # no bfloat16 outputs to compare: the build cannot run such a case.
            raise _TensorsError(f"inline tensor {name!r}: {tensor.dtype} is not supported")
    try:
        return tensor_set(value, root)
    except GoldenError as e:
        raise _TensorsError(str(e)) from None


def _describe(c: Comparison, case: str, output: str, rtol: float, atol: float) -> str:
    where = f"case {case!r} output {output!r}"
    if c.reason is not None:
        return f"{where}: {c.reason}"
    if c.max_abs_error is None:
        return f"{where}: {c.bad} of {c.total} values differ"
    return (
        f"{where}: max abs error {c.max_abs_error:.6g} exceeds tolerance "
        f"(rtol={rtol:g}, atol={atol:g}); {c.bad} of {c.total} values out of tolerance"
    )


def run_goldens(
    session: Session, root: Path, goldens: Goldens
) -> tuple[list[CaseResult], list[GoldenFailure]]:
    """Run every case of ``goldens`` through ``session`` and compare the outputs.

    Every case runs even when an earlier one fails.

    Args:
        session: an ONNX Runtime ``InferenceSession``.
        root: the repository root (``.npz`` paths are relative to it).
        goldens: the version's ``spec.goldens``.

    Returns:
        (results per case, failures located in the manifest).
    """
    results: list[CaseResult] = []
    failures: list[GoldenFailure] = []
    model_inputs = {i.name for i in session.get_inputs()}
    model_outputs = [o.name for o in session.get_outputs()]
    for i, case in enumerate(goldens.cases):
        loc: Loc = ("spec", "goldens", "cases", i)
        rtol = goldens.rtol if case.rtol is None else case.rtol
        atol = goldens.atol if case.atol is None else case.atol
        result = CaseResult(case.name, rtol, atol)
        results.append(result)

        def fail(where: Loc, message: str, result: CaseResult = result) -> None:
            result.passed = False
            failures.append(GoldenFailure(where, message))

        try:
            inputs = _tensors(root, case.inputs)
            expected = _tensors(root, case.outputs)
        except _TensorsError as e:
            fail(loc, f"case {case.name!r}: {e}")
            continue
        if set(inputs) != model_inputs:
            fail(
                (*loc, "inputs"),
                f"case {case.name!r}: inputs are {sorted(inputs)} but the model takes "
                f"{sorted(model_inputs)}",
            )
            continue
        unknown = sorted(set(expected) - set(model_outputs))
        if unknown:
            fail(
                (*loc, "outputs"),
                f"case {case.name!r}: outputs {unknown} are not outputs of the model "
                f"({', '.join(model_outputs)})",
            )
        mismatches = input_mismatches(session, inputs)
        if mismatches:
            source = case.inputs if isinstance(case.inputs, str) else "inline inputs"
            fail((*loc, "inputs"), f"case {case.name!r}: {source}: {'; '.join(mismatches)}")
            continue
        wanted = [n for n in model_outputs if n in expected]
        try:
            actual = dict(zip(wanted, session.run(wanted, inputs), strict=True))
        except _run_errors() as e:
            fail((*loc, "inputs"), f"case {case.name!r}: the model fails: {one_line(str(e))}")
            continue
        for name in wanted:
            comparison = compare_output(expected[name], actual[name], rtol, atol)
            result.max_abs_error[name] = comparison.max_abs_error
            if not comparison.ok:
                fail((*loc, "outputs"), _describe(comparison, case.name, name, rtol, atol))
    return results, failures
