"""How many times a self-test runs a version before it serves (issue 25): each golden
case once, and a warm-up run only for a version without golden cases; a failing case
names itself."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest

from edge_sync.engine.selftest import WARMUP_RUNS, GoldenArrays, self_test
from edge_sync.errors import SelfTestError


class _Counting:
    """An engine of no session setup that doubles its input, counting its runs."""

    setup = None
    runs = 0

    def run(
        self, inputs: Mapping[str, Any], outputs: Sequence[str] | None = None
    ) -> dict[str, Any]:
        self.runs += 1
        return {"y": np.asarray(inputs["x"]) * 2}

    def sample_inputs(self) -> dict[str, Any]:
        return {"x": np.zeros(3, np.float32)}


def _case(name: str, factor: float = 2) -> GoldenArrays:
    x = np.arange(3, dtype=np.float32)
    return GoldenArrays(name, {"x": x}, {"y": x * factor}, rtol=0, atol=0)


@pytest.mark.parametrize(("cases", "runs"), [(0, WARMUP_RUNS), (1, 1), (3, 3)])
def test_golden_runs_count_as_warm_up(cases: int, runs: int) -> None:
    engine = _Counting()
    timings = self_test(engine, [_case(f"c{i}") for i in range(cases)])  # type: ignore[arg-type]
    assert engine.runs == runs
    assert set(timings) == {"goldens", "warmup"}


def test_a_case_out_of_tolerance_names_itself() -> None:
    engine = _Counting()
    with pytest.raises(
        SelfTestError, match=r"golden case 'off', output 'y': 2 of 3 values .*max abs error 2"
    ):
        self_test(engine, [_case("ok"), _case("off", factor=3)])  # type: ignore[arg-type]
