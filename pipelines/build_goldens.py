"""Build stage "goldens": the model reproduces each golden case within tolerance.

``compare_output`` is pure and follows ``numpy.allclose``:
``|actual - expected| <= atol + rtol * |expected|`` element-wise, NaN never equal.
``run_goldens`` does the I/O: reads ``.npz`` files (``pipelines.goldens.read_npz``: no
links, caps checked before any array is read) or inline tensors, and runs the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines.build_checks import one_line, ort_errors
from pipelines.errors import ArtifactError
from pipelines.goldens import read_npz
from registry.errors import quote
from registry.schema import Goldens, Tensor, TensorSet
from registry.yamlsrc import Loc


@dataclass(frozen=True, slots=True)
class Comparison:
    """One output of one case against its expected value.

    Attributes:
        ok: within tolerance everywhere.
        max_abs_error: the largest ``|actual - expected|`` (None when not comparable).
        bad: how many values are out of tolerance.
        total: how many values there are.
        reason: why the arrays could not be compared (shape or dtype), else None.
    """

    ok: bool
    max_abs_error: float | None
    bad: int
    total: int
    reason: str | None = None


def compare_output(expected: Any, actual: Any, rtol: float, atol: float) -> Comparison:
    """Compare two arrays with ``numpy.allclose`` semantics.

    Numbers are compared in float64 (so integer outputs compare exactly unless the
    tolerances allow otherwise); bools and strings must be equal.

    Returns:
        The comparison; ``reason`` is set when the shapes differ.
    """
    import numpy as np

    exp, act = np.asarray(expected), np.asarray(actual)
    if exp.shape != act.shape:
        reason = f"shape is {act.shape}, expected {exp.shape}"
        return Comparison(ok=False, max_abs_error=None, bad=exp.size, total=exp.size, reason=reason)
    numeric = all(np.issubdtype(a.dtype, np.number) for a in (exp, act))
    if not numeric and (exp.dtype.kind == "U") != (act.dtype.kind == "U"):
        reason = f"dtype is {act.dtype}, expected {exp.dtype}"
        return Comparison(ok=False, max_abs_error=None, bad=exp.size, total=exp.size, reason=reason)
    if not numeric:
        equal = exp == act
        bad = int(np.size(equal) - np.count_nonzero(equal))
        return Comparison(bad == 0, None, bad, int(exp.size))
    e64, a64 = exp.astype(np.float64), act.astype(np.float64)
    close = np.isclose(a64, e64, rtol=rtol, atol=atol, equal_nan=False)
    bad = int(close.size - np.count_nonzero(close))
    err = np.abs(a64 - e64)
    max_err = float(np.max(err)) if err.size else 0.0
    return Comparison(bad == 0, max_err, bad, int(exp.size))


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
    if isinstance(value, str):
        try:
            return read_npz(root / value, value, root=root)
        except ArtifactError as e:
            raise _TensorsError(str(e)) from None
    return {name: _inline(name, t) for name, t in value.items()}


def _inline(name: str, tensor: Tensor) -> Any:
    import numpy as np

    try:
        dtype = np.dtype(object if tensor.dtype == "string" else tensor.dtype)
    except TypeError:  # bfloat16: numpy has no such dtype
        raise _TensorsError(f"inline tensor {name!r}: {tensor.dtype} is not supported") from None
    try:
        return np.asarray(tensor.data, dtype=dtype).reshape(tensor.shape)
    except (ValueError, TypeError, OverflowError) as e:
        # data: ["x"] for a float32 tensor, 300 for an int8 one: the manifest's mistake.
        raise _TensorsError(
            f"inline tensor {quote(name)}: data does not fit {tensor.dtype} "
            f"({one_line(str(e), 120)})"
        ) from None


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
    session: Any, root: Path, goldens: Goldens
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
