"""The build's latency comparison: a version against its parent, on the runner.

A reviewer asks "is it slower?" before "is it right?".  The build times the new
version and its parent in one process, in the same session setup (the one a device of
the version's first ONNX Runtime target runs, prepacked where there is one), on one
intra-op thread (the figure least disturbed by a shared runner), on the same inputs
(the first golden case's, else a seeded sample shaped like the inputs).  Runs
alternate between the two, each pair in the other order than the last, so that a
noisy neighbour or a CPU clock change slows both alike; the ratio of their medians is
what ``spec.promotion.max_latency_ratio`` is held to (``ci pr``), the p99 ratio is
shown beside it.

Absolute figures are the runner's, not a device's: only the ratio carries over.
A comparison that cannot be made (no parent, the parent's artifact not in DVC, inputs
the parent does not take) leaves the version's own figures and says why.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from pipelines.errors import ArtifactError
from pipelines.onnx import load_session, ort_errors
from registry.errors import GoldenError, one_line
from registry.sessions import PREPACKED, SessionSetup

if TYPE_CHECKING:
    from pipelines.onnx import Session
    from registry.repository import Repository, VersionEntry

__all__ = ["Latency", "compare_latency", "measure"]

BUDGET_S: Final = 1.0
"""Time spent running both versions, after warm-up (a large model still gets MIN_RUNS)."""
MIN_RUNS: Final = 10
MAX_RUNS: Final = 200
WARMUP_RUNS: Final = 3
MAX_BUDGETS: Final = 10
"""The timed rounds of a slow model stop at this many budgets of time."""


@dataclass
class Latency:
    """One version's run time on the runner, and its parent's beside it.

    Attributes:
        inputs: ``goldens`` (the first case's inputs) or ``sample`` (seeded arrays).
        setup: the session setup both ran in (``registry.sessions`` label).
        runs: timed runs of each version.
        p50_ms: the version's median, in milliseconds.
        p99_ms: its 99th percentile.
        parent: the parent version compared with, None when there is none.
        parent_p50_ms: the parent's median, when it ran.
        parent_p99_ms: the parent's 99th percentile, when it ran.
        reason: why the parent was not compared (None when it was, or there is none).
    """

    inputs: Literal["goldens", "sample"]
    setup: str
    runs: int
    p50_ms: float
    p99_ms: float
    parent: str | None = None
    parent_p50_ms: float | None = None
    parent_p99_ms: float | None = None
    reason: str | None = None

    @property
    def ratio_p50(self) -> float | None:
        """The version's median over its parent's (2.0: twice as slow)."""
        return _ratio(self.p50_ms, self.parent_p50_ms)

    @property
    def ratio_p99(self) -> float | None:
        """The version's p99 over its parent's."""
        return _ratio(self.p99_ms, self.parent_p99_ms)

    def to_json(self) -> dict[str, Any]:
        """The comparison as JSON data (in ``build.json``)."""
        return {
            "inputs": self.inputs,
            "setup": self.setup,
            "runs": self.runs,
            "p50_ms": self.p50_ms,
            "p99_ms": self.p99_ms,
            "parent": self.parent,
            "parent_p50_ms": self.parent_p50_ms,
            "parent_p99_ms": self.parent_p99_ms,
            "ratio_p50": self.ratio_p50,
            "ratio_p99": self.ratio_p99,
            "reason": self.reason,
        }

    def text(self) -> str:
        """One line: ``p50 0.021 ms, p99 0.034 ms; 1.04x / 1.10x 1.0.0's (...)``."""
        own = f"p50 {self.p50_ms:.3g} ms, p99 {self.p99_ms:.3g} ms"
        how = f"{self.inputs}, {self.setup}, {self.runs} runs each"
        if self.ratio_p50 is not None and self.ratio_p99 is not None:
            return (
                f"{own}; {self.ratio_p50:.2f}x at p50, {self.ratio_p99:.2f}x at p99 of "
                f"{self.parent}'s ({how})"
            )
        if self.reason is not None:
            return f"{own} ({how}); not compared with {self.parent}: {self.reason}"
        return f"{own} ({how}); no parent to compare with"


def _ratio(new: float, old: float | None) -> float | None:
    if old is None or old <= 0:
        return None
    return round(new / old, 3)


def _quantile(sorted_ms: Sequence[float], q: float) -> float:
    """The ``q`` quantile of sorted samples (nearest rank: a value that was measured)."""
    index = min(len(sorted_ms) - 1, max(0, round(q * len(sorted_ms) + 0.5) - 1))
    return round(sorted_ms[index], 4)


def measure(
    runs: Sequence[Callable[[], object]], *, budget_s: float = BUDGET_S
) -> tuple[int, list[tuple[float, float]]]:
    """Time each callable, alternating between them: the rounds run, and (p50, p99)
    milliseconds of each callable.

    Every callable is warmed up first; the number of timed rounds is what fits
    ``budget_s`` at the speed of the warm-up, within [MIN_RUNS, MAX_RUNS], and never
    more than :data:`MAX_BUDGETS` budgets of time in all: a model a pull request made
    to run for a minute is run a few times, not two dozen.  Each round runs them in
    turn, starting from a different one each round.
    """
    start = time.perf_counter()
    for run in runs:
        run()
    per_round = time.perf_counter() - start
    if per_round * WARMUP_RUNS <= budget_s:  # a slow model is warm after one run
        start = time.perf_counter()
        for run in runs:
            for _ in range(WARMUP_RUNS - 1):
                run()
        per_round = (time.perf_counter() - start) / (WARMUP_RUNS - 1)
    fits = budget_s / max(per_round, 1e-9)
    ceiling = max(1, int(MAX_BUDGETS * budget_s / max(per_round, 1e-9)))
    rounds = int(min(MAX_RUNS, ceiling, max(MIN_RUNS, fits)))
    samples: list[list[float]] = [[] for _ in runs]
    for r in range(rounds):
        for k in range(len(runs)):
            i = (r + k) % len(runs)
            t0 = time.perf_counter_ns()
            runs[i]()
            samples[i].append((time.perf_counter_ns() - t0) / 1e6)
    out = []
    for times in samples:
        times.sort()
        out.append((_quantile(times, 0.5), _quantile(times, 0.99)))
    return rounds, out


def _setup(setups: Sequence[SessionSetup]) -> SessionSetup:
    return next((s for s in setups if s.name == PREPACKED), setups[0])


def _inputs(
    repo: Repository, entry: VersionEntry, session: Session
) -> tuple[Literal["goldens", "sample"], dict[str, Any]]:
    from pipelines.goldens import sample_inputs
    from registry.goldens import tensor_set

    goldens = entry.manifest.spec.goldens
    if goldens is not None:
        try:
            return "goldens", tensor_set(goldens.cases[0].inputs, repo.root)
        except GoldenError:
            pass  # the goldens stage reports it; time on a sample instead
    try:
        return "sample", sample_inputs(session)
    except (ValueError, TypeError) as e:  # more than is sampled, or no numpy type
        raise ArtifactError(repo.display(repo.root / entry.manifest.spec.artifact.path),
                            f"cannot be timed: {one_line(str(e))}") from None  # fmt: skip


def _parent_artifact(repo: Repository, entry: VersionEntry, parent: str) -> Path | str:
    """The parent's verified artifact, or why there is none here."""
    from pipelines.fetch import fetch_artifact

    found = repo.versions.get(entry.name, {}).get(parent)
    if found is None:
        return "its manifest is not in this checkout"
    files = found.manifest.spec.artifact.files()
    try:
        paths = [fetch_artifact(repo.root, f, repo.display(repo.root / f)).path for f in files]
    except ArtifactError as e:
        return f"its artifact is not available ({one_line(str(e))})"
    return paths[0]


def compare_latency(
    repo: Repository,
    entry: VersionEntry,
    artifact: Path,
    setups: Sequence[SessionSetup],
    *,
    budget_s: float = BUDGET_S,
) -> Latency:
    """Time ``entry`` (its verified ``artifact``) against its parent.

    Args:
        repo: the loaded repository.
        entry: the version built.
        artifact: its artifact, fetched and verified by the build.
        setups: the session setups its goldens run in (``golden_setups``): the
            prepacked one (else the first) is the one timed.
        budget_s: time for the timed runs of both.

    Raises:
        ArtifactError: the version itself cannot be loaded or run (the build's other
            stages say why; a parent that cannot is a ``reason``, not an error).
    """
    setup = _setup(setups)
    display = repo.display(artifact)
    session = load_session(artifact, display, setup=setup, threads=1)
    kind, feed = _inputs(repo, entry, session)
    new = _runner(session, feed)
    try:
        new()
    except _run_errors() as e:
        raise ArtifactError(display, f"cannot be timed: {one_line(str(e))}") from None
    parent = entry.manifest.spec.parent
    runners = [new]
    reason = None
    if parent is not None:
        found = _parent_artifact(repo, entry, parent)
        if isinstance(found, str):
            reason = found
        else:
            try:
                old = load_session(found, repo.display(found), setup=setup, threads=1)
                runners.append(_runner(old, feed))
                runners[1]()
            except ArtifactError as e:
                reason = f"it does not load ({one_line(str(e))})"
                runners[1:] = []
            except _run_errors() as e:
                reason = f"it does not take these inputs ({one_line(str(e))})"
                runners[1:] = []
    rounds, figures = measure(runners, budget_s=budget_s)
    latency = Latency(kind, setup.label, rounds, *figures[0], parent=parent, reason=reason)
    if len(figures) > 1:
        latency.parent_p50_ms, latency.parent_p99_ms = figures[1]
    return latency


def _run_errors() -> tuple[type[Exception], ...]:
    return (*ort_errors(), TypeError, MemoryError)


def _runner(session: Session, feed: Mapping[str, Any]) -> Callable[[], object]:
    names = [o.name for o in session.get_outputs()]
    inputs = dict(feed)
    return lambda: session.run(names, inputs)
