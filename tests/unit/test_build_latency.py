"""The build's latency comparison against what a pull request's model can do to the
runner (issue 27, point 14): a model that runs for long is run a few times, and a graph
declaring inputs of any size allocates none of it."""

from __future__ import annotations

import time
from collections.abc import Callable
from types import SimpleNamespace

import pytest

from pipelines.build._latency import MAX_BUDGETS, MIN_RUNS, measure
from pipelines.goldens import sample_inputs


def test_a_slow_model_is_timed_within_a_few_budgets() -> None:
    calls = {"new": 0, "old": 0}

    def slow(name: str) -> Callable[[], None]:
        def run() -> None:
            calls[name] += 1
            time.sleep(0.05)

        return run

    start = time.perf_counter()
    rounds, figures = measure([slow("new"), slow("old")], budget_s=0.02)
    took = time.perf_counter() - start
    # one warm-up run each, then what fits ten budgets (0.2 s): 2 rounds, not MIN_RUNS
    assert rounds < MIN_RUNS
    assert calls == {"new": 1 + rounds, "old": 1 + rounds}
    assert took < (MAX_BUDGETS + 4) * 0.02 + 0.3
    assert all(p50 >= 50 for p50, _ in figures)


def test_a_fast_model_is_timed_enough_times() -> None:
    rounds, _ = measure([lambda: None, lambda: None], budget_s=0.05)
    assert MIN_RUNS <= rounds <= 200


def _session(*shapes: list[object]) -> object:
    inputs = [SimpleNamespace(name=f"x{i}", shape=s, type="tensor(float)")
              for i, s in enumerate(shapes)]  # fmt: skip
    return SimpleNamespace(get_inputs=lambda: inputs)


def test_a_sample_is_never_larger_than_its_cap() -> None:
    arrays = sample_inputs(_session(["batch", 16], [3, None]))  # type: ignore[arg-type]
    assert (arrays["x0"].shape, arrays["x1"].shape) == ((1, 16), (3, 1))
    # a graph may declare an input of 10^10 values: refused before any is allocated
    with pytest.raises(ValueError, match="would hold 10000000000 values"):
        sample_inputs(_session([100_000, 100_000]))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="over the 100 sampled"):
        sample_inputs(_session([60], [60]), max_values=100)  # type: ignore[arg-type]
