"""Build stage "goldens": the model reproduces each golden case within tolerance, in
every session setup a device may run it in.

``compare_output`` is :func:`registry.goldens.compare` (``numpy.allclose`` semantics,
the rule devices apply in their self-test).  :func:`golden_setups` says which session
setups to run (``registry.sessions``, the owner devices use too: a device accepts a
version only when its goldens pass in each, so CI checks each).  ``run_goldens`` does
the I/O: reads ``.npz`` files (``registry.goldens.read_npz``: no links, caps checked
before any array is read) or inline tensors, runs the model in each setup, and fails
a case naming the setups out of tolerance and the largest error.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines.goldens import input_mismatches
from pipelines.onnx import ort_errors
from registry.errors import GoldenError, one_line
from registry.goldens import Comparison, tensor_set
from registry.goldens import compare as compare_output
from registry.schema import Goldens, Target, TensorSet
from registry.sessions import SessionSetup, session_setups
from registry.yamlsrc import Loc

__all__ = [
    "CaseResult",
    "Comparison",
    "GoldenFailure",
    "compare_output",
    "golden_setups",
    "run_goldens",
]

if TYPE_CHECKING:
    from pipelines.onnx import Session


def golden_setups(targets: Sequence[Target], available: Collection[str]) -> list[SessionSetup]:
    """The session setups to run a version's goldens in: every setup a device of one
    of ``targets`` may run it in (``registry.sessions``) whose providers this runner
    has, each once.  TensorRT targets build their engines on the device, with its own
    precision: not here.  With no target, or none runnable here, ONNX Runtime on CPU.

    Args:
        targets: the version's ``spec.targets``.
        available: the execution providers this runner has.
    """
    found: list[SessionSetup] = []
    for target in targets:
        if target.engine != "onnxruntime":
            continue
        for setup in session_setups(target):
            if setup not in found and all(p in available for p in setup.providers):
                found.append(setup)
    return found or list(session_setups(None))


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
    """Per output, the largest error in any setup."""
    setups: dict[str, dict[str, float | None]] = field(default_factory=dict)
    """Per session setup (its label), per output, the largest error."""

    def to_json(self) -> dict[str, Any]:
        """This result as JSON data."""
        return {
            "case": self.case,
            "passed": self.passed,
            "rtol": self.rtol,
            "atol": self.atol,
            "max_abs_error": self.max_abs_error,
            "setups": self.setups,
        }

    def measured(self, setup: str, output: str, error: float | None) -> None:
        """Record ``output``'s largest error in ``setup``."""
        self.setups.setdefault(setup, {})[output] = error
        known = [e for e in (self.max_abs_error.get(output), error) if e is not None]
        self.max_abs_error[output] = max(known) if known else None


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


def _describe(
    c: Comparison, case: str, output: str, rtol: float, atol: float, *, setups: Sequence[str]
) -> str:
    where = f"case {case!r} output {output!r}"
    if setups:
        where += f" in session setup{'s' if len(setups) > 1 else ''} {', '.join(setups)}"
    if c.reason is not None:
        return f"{where}: {c.reason}"
    if c.max_abs_error is None:
        return f"{where}: {c.bad} of {c.total} values differ"
    return (
        f"{where}: max abs error {c.max_abs_error:.6g} exceeds tolerance "
        f"(rtol={rtol:g}, atol={atol:g}); {c.bad} of {c.total} values out of tolerance"
    )


def run_goldens(
    sessions: Sequence[tuple[SessionSetup, Session]], root: Path, goldens: Goldens
) -> tuple[list[CaseResult], list[GoldenFailure]]:
    """Run every case of ``goldens`` in every session and compare the outputs.

    Every case runs even when an earlier one fails.  An output out of tolerance in
    any setup fails its case once, naming every setup where it is out of tolerance and
    the largest error among them.

    Args:
        sessions: (setup, ONNX Runtime ``InferenceSession`` set up for it), at least
            one (:func:`golden_setups`).
        root: the repository root (``.npz`` paths are relative to it).
        goldens: the version's ``spec.goldens``.

    Returns:
        (results per case, failures located in the manifest).
    """
    results: list[CaseResult] = []
    failures: list[GoldenFailure] = []
    first = sessions[0][1]
    model_inputs = {i.name for i in first.get_inputs()}
    model_outputs = [o.name for o in first.get_outputs()]
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
        mismatches = input_mismatches(first, inputs)
        if mismatches:
            source = case.inputs if isinstance(case.inputs, str) else "inline inputs"
            fail((*loc, "inputs"), f"case {case.name!r}: {source}: {'; '.join(mismatches)}")
            continue
        wanted = [n for n in model_outputs if n in expected]
        out_of_tolerance: dict[str, list[tuple[SessionSetup, Comparison]]] = {}
        for setup, session in sessions:
            try:
                actual = dict(zip(wanted, session.run(wanted, inputs), strict=True))
            except _run_errors() as e:
                fail(
                    (*loc, "inputs"),
                    f"case {case.name!r} in session setup {setup.label}: the model fails: "
                    f"{one_line(str(e))}",
                )
                break
            for name in wanted:
                comparison = compare_output(expected[name], actual[name], rtol, atol)
                result.measured(setup.label, name, comparison.max_abs_error)
                if not comparison.ok:
                    out_of_tolerance.setdefault(name, []).append((setup, comparison))
        for name, found in out_of_tolerance.items():
            # the worst setup's figures; every setup out of tolerance named
            worst = max(found, key=lambda f: f[1].max_abs_error or 0.0)[1]
            labels = [setup.label for setup, _ in found]
            fail((*loc, "outputs"), _describe(worst, case.name, name, rtol, atol, setups=labels))
    return results, failures
