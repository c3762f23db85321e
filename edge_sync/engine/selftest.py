"""The self-test an engine passes before it serves (stable API): the signed golden cases
within their tolerances, in every session setup the device may run the version in, then
warm-up runs (docs/reference/daemon.md).

The setups are ``registry.sessions.session_setups`` of the engine's request: the engine
answers for its own, and the host builds one in each other setup for the goldens and
releases it at once.  So every device of a target gives a version the same verdict,
whatever setup (``serve.prepack``, a timing measurement) it runs the version in.

The other setups need not delay the swap: a private prepacked copy of a large model
costs far more than the shared-weight build it checks.  An update that replaces a
serving version checks its own setup before the swap and the others right after it
(:func:`confirm_setups`), with the replaced engine still loaded to serve again and the
state saying the version is unconfirmed until then (``GateRecord.confirmed``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from edge_sync.engine.base import Engine, SetupHost
from edge_sync.engine.heap import trim_heap
from edge_sync.errors import SelfTestError
from registry.sessions import SessionSetup, session_setups

__all__ = [
    "WARMUP_RUNS",
    "GoldenArrays",
    "check_goldens",
    "confirm_setups",
    "other_setups",
    "self_test",
]

WARMUP_RUNS: Final = 1
"""Runs of the model before a version serves, its golden cases' runs counted: one brings
its pages in and lets ONNX Runtime settle its allocations; more only measured the same
thing again (issue 25).  A version with golden cases makes no run of its own."""


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


def _other_setups(
    engine: Engine, host: SetupHost | None
) -> tuple[list[SessionSetup], list[SessionSetup]]:
    """The setups of the engine's request other than its own: (those checked before
    its own, those after), in :func:`~registry.sessions.session_setups` order."""
    own = engine.setup
    if own is None or host is None:
        return [], []
    setups = list(session_setups(engine.request.target, engine.request.kind))
    if own not in setups:
        return [], setups
    at = setups.index(own)
    return setups[:at], setups[at + 1 :]


def _check_in(
    engine: Engine, cases: Sequence[GoldenArrays], host: SetupHost, setups: Sequence[SessionSetup]
) -> None:
    """The goldens in each of ``setups``, on an engine built for it and released at once."""
    request = engine.request
    for setup in setups:
        other = host.build_in(request, setup)
        try:
            check_goldens(other, cases, setup.label)
        finally:
            other.close()
            trim_heap()  # a private copy of every weight: given back now


def confirm_setups(engine: Engine, cases: Sequence[GoldenArrays], host: SetupHost) -> None:
    """The goldens in every session setup of ``engine``'s request other than its own,
    in a fixed order: what :func:`self_test` with ``confirm=False`` left out.  The
    updater runs it right after a version swapped in beside the one it replaced, which
    serves again if it fails (docs/reference/daemon.md, "Hot swap").

    Raises:
        SelfTestError: a case fails in one of them (the message names the setup).
        EngineError: the version cannot be built in one of them.
    """
    _check_in(engine, cases, host, other_setups(engine, cases, host))


def other_setups(
    engine: Engine, cases: Sequence[GoldenArrays], host: SetupHost | None
) -> tuple[SessionSetup, ...]:
    """The setups :func:`confirm_setups` checks ``engine`` in (none without golden
    cases, or a host, or when the engine names no setup of its own)."""
    if not cases:
        return ()
    before, after = _other_setups(engine, host)
    return (*before, *after)


def self_test(
    engine: Engine,
    cases: Sequence[GoldenArrays],
    *,
    warmup_runs: int = WARMUP_RUNS,
    host: SetupHost | None = None,
    confirm: bool = True,
) -> dict[str, float]:
    """Prove ``engine`` before it serves: every golden case within its tolerances in
    its own session setup and, with ``confirm``, in every other one the device may run
    the version in (see the module doc), then warm-up runs until the engine ran
    ``warmup_runs`` times (of the first case's inputs; of
    :meth:`~edge_sync.engine.base.Engine.sample_inputs` when the version has none).

    Whatever ``confirm`` says, a failure names the first setup in the fixed order that
    fails, so identical devices tuned apart give the same reason: when the engine's own
    setup fails, the setups before it are checked first.

    Args:
        engine: the candidate.
        cases: its signed golden cases.
        warmup_runs: runs of the engine before it serves, each golden case's run
            counted.
        host: what builds engines in the other setups (None, or an engine that names
            no setup: only ``engine`` is checked).
        confirm: check the other setups here too (False: the caller runs
            :func:`confirm_setups` once the version serves).

    Returns:
        Milliseconds spent in ``goldens`` and ``warmup``.

    Raises:
        SelfTestError: a case fails to run or an output is out of tolerance (the
            message names the case, the output, the setup and the largest error).
        EngineError: the version cannot be built in another setup.
    """
    timings: dict[str, float] = {}
    start = time.perf_counter()
    before, after = _other_setups(engine, host) if cases else ([], [])
    own = engine.setup.label if engine.setup is not None else None
    try:
        check_goldens(engine, cases, own)
    except SelfTestError:
        if host is not None and before:
            _check_in(engine, cases, host, before)  # an earlier setup's reason first
        raise
    if confirm and host is not None:
        _check_in(engine, cases, host, [*before, *after])
    timings["goldens"] = (time.perf_counter() - start) * 1000
    start = time.perf_counter()
    warm = cases[0].inputs if cases else engine.sample_inputs()
    for _ in range(max(0, warmup_runs - len(cases))):
        try:
            engine.run(warm)
        except Exception as e:  # noqa: BLE001 - ORT raises many types for bad inputs
            raise SelfTestError(f"warm-up run fails: {_first_line(e)}") from None
    timings["warmup"] = (time.perf_counter() - start) * 1000
    return timings
