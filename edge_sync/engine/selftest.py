"""The self-test an engine passes before it serves (stable API): the signed golden cases
within their tolerances, in every session setup the device may run the version in, then
warm-up runs (docs/reference/daemon.md).

The setups are ``registry.sessions.session_setups`` of the engine's request: the engine
answers for its own, and the host builds one in each other setup for the goldens and
releases it at once.  So every device of a target gives a version the same verdict,
whatever setup (``serve.prepack``, a timing measurement) it runs the version in.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from edge_sync.engine.base import Engine, SetupHost
from edge_sync.engine.heap import trim_heap
from edge_sync.errors import SelfTestError
from registry.sessions import session_setups

__all__ = ["WARMUP_RUNS", "GoldenArrays", "check_goldens", "self_test"]

WARMUP_RUNS: Final = 1
"""Runs after the goldens before a version serves: one brings its pages in and lets ONNX
Runtime settle its allocations; more only measured the same thing again (issue 25)."""


@dataclass(frozen=True)
class GoldenArrays:
    """A signed golden case, read (``registry.schema.GoldenCase`` names its files): its
    name, input and expected output arrays, and tolerances."""

    name: str
    inputs: Mapping[str, Any]
    outputs: Mapping[str, Any]
    rtol: float
    atol: float


def _first_line(e: Exception) -> str:
    return str(e).splitlines()[0][:300] if str(e) else type(e).__name__


def check_goldens(engine: Engine, cases: Sequence[GoldenArrays], setup: str | None = None) -> None:
    """Every golden case of ``cases`` on ``engine``, within its tolerances.

    Args:
        engine: the engine to run them on.
        cases: the signed golden cases.
        setup: the session setup's label, named in a failure (``registry.sessions``).

    Raises:
        SelfTestError: a case fails to run or an output is out of tolerance (the
            message names the case, the output, the setup and the largest error).
    """
    from registry.goldens import compare

    where = f" in the {setup} session" if setup else ""
    for case in cases:
        wanted = list(case.outputs)
        try:
            got = engine.run(case.inputs, wanted)
        except Exception as e:  # noqa: BLE001 - ORT raises many types for bad inputs
            raise SelfTestError(
                f"golden case {case.name!r}{where}: the model fails: {_first_line(e)}"
            ) from None
        for name in wanted:
            result = compare(case.outputs[name], got[name], case.rtol, case.atol)
            if not result.ok:
                detail = result.reason or (
                    f"{result.bad} of {result.total} values out of tolerance "
                    f"(max abs error {result.max_abs_error:.3g}, rtol {case.rtol:g}, "
                    f"atol {case.atol:g})"
                )
                raise SelfTestError(f"golden case {case.name!r}, output {name!r}{where}: {detail}")


def _check_every_setup(
    engine: Engine, cases: Sequence[GoldenArrays], host: SetupHost | None
) -> None:
    """The goldens in every setup of the engine's request (only the engine's own when
    it names none, or without a host or cases)."""
    own = engine.setup
    if not cases or own is None or host is None:
        check_goldens(engine, cases, own.label if own is not None else None)
        return
    request = engine.request
    for setup in session_setups(request.target, request.kind):
        if setup == own:
            check_goldens(engine, cases, setup.label)
            continue
        other = host.build_in(request, setup)
        try:
            check_goldens(other, cases, setup.label)
        finally:
            other.close()
            trim_heap()  # a private copy of every weight: given back now


def self_test(
    engine: Engine,
    cases: Sequence[GoldenArrays],
    *,
    warmup_runs: int = WARMUP_RUNS,
    host: SetupHost | None = None,
) -> dict[str, float]:
    """Prove ``engine`` before it serves: every golden case within its tolerances in
    every session setup the device may run the version in (see the module doc), then
    ``warmup_runs`` runs (of the first case's inputs, or of
    :meth:`~edge_sync.engine.base.Engine.sample_inputs` when the version has none).

    Args:
        engine: the candidate.
        cases: its signed golden cases.
        warmup_runs: runs after the goldens.
        host: what builds engines in the other setups (None, or an engine that names
            no setup: only ``engine`` is checked).

    Returns:
        Milliseconds spent in ``goldens`` and ``warmup``.

    Raises:
        SelfTestError: a case fails to run or an output is out of tolerance (the
            message names the case, the output, the setup and the largest error).
        EngineError: the version cannot be built in another setup.
    """
    timings: dict[str, float] = {}
    start = time.perf_counter()
    _check_every_setup(engine, cases, host)
    timings["goldens"] = (time.perf_counter() - start) * 1000
    start = time.perf_counter()
    warm = cases[0].inputs if cases else engine.sample_inputs()
    for _ in range(warmup_runs):
        try:
            engine.run(warm)
        except Exception as e:  # noqa: BLE001 - ORT raises many types for bad inputs
            raise SelfTestError(f"warm-up run fails: {_first_line(e)}") from None
    timings["warmup"] = (time.perf_counter() - start) * 1000
    return timings
