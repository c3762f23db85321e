"""Shadow comparison's aggregates (issue 29, point 1): what two versions' answers to the
same inputs agree on, kept as sums only."""

from __future__ import annotations

import numpy as np
import pytest

from edge_sync.decide.shadow import OutputAgreement, ShadowStats, compare


def _scores(n: int, classes: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, classes)).astype(np.float32)


def test_the_same_answers_agree_fully() -> None:
    probs = _scores(8, 10, 0)
    found = compare({"probs": probs}, {"probs": probs.copy()})["probs"]
    assert (found.rows, found.top1, found.topk, found.k) == (8, 8, 8, 5)
    assert (found.values, found.abs_max, found.rel_max) == (80, 0.0, 0.0)


def test_a_version_that_disagrees_on_a_fifth_of_its_inputs() -> None:
    old = _scores(100, 4, 1)
    new = old.copy()
    flipped = np.arange(0, 100, 5)  # 20 rows: the runner-up wins
    for row in flipped:
        first, second = np.argsort(-old[row])[:2]
        new[row, first], new[row, second] = old[row, second], old[row, first]
    stats = ShadowStats()
    for part in range(4):  # answers of 25 rows each
        rows = slice(25 * part, 25 * (part + 1))
        stats.add({"probs": new[rows]}, {"probs": old[rows]}, new_s=0.002, old_s=0.001)
    assert stats.compared == 4
    assert stats.agreement == pytest.approx(0.8)
    shown = stats.to_json()["outputs"]["probs"]
    assert shown["top1_agreement"] == pytest.approx(0.8)
    assert shown["topk_agreement"] == 1.0  # the old top class is the new runner-up
    assert shown["max_abs_diff"] > 0
    assert stats.latency_ratio == pytest.approx(2.0)


def test_regression_outputs_keep_their_differences() -> None:
    old = np.array([[1.0, -2.0, 0.0]], dtype=np.float32)
    new = np.array([[1.5, -2.0, 0.001]], dtype=np.float32)
    found = compare({"y": new}, {"y": old})["y"]
    assert found.rows == 1  # [1, 3] floats read as the class scores of one row
    assert found.abs_max == pytest.approx(0.5)
    assert found.rel_max == pytest.approx(0.001 / 1e-6, rel=1e-3)  # against the floor
    one = compare({"v": np.array([2.0])}, {"v": np.array([1.0])})["v"]
    assert (one.rows, one.k, one.abs_max, one.rel_max) == (0, None, 1.0, 1.0)


def test_what_cannot_be_compared_is_counted_not_guessed() -> None:
    found = compare(
        {"a": np.zeros((2, 3)), "b": np.zeros(3), "c": np.array(["x"]), "d": np.zeros(1)},
        {"a": np.zeros((2, 4)), "b": np.zeros(3)},
    )
    assert found["a"].incomparable == 1  # a shape that changed
    assert found["c"].incomparable == 1  # not numbers
    assert found["d"].incomparable == 1  # the previous version had no such output
    assert found["b"].incomparable == 0
    nan = compare({"x": np.array([np.nan, 1.0])}, {"x": np.array([0.0, 1.0])})["x"]
    assert nan.abs_max == float("inf")  # NaN on one side only: no bound on the difference


def test_running_sums_add_up() -> None:
    total = OutputAgreement()
    total.add(OutputAgreement(rows=2, top1=1, topk=2, k=5, values=4, abs_sum=1.0, abs_max=0.5))
    total.add(OutputAgreement(rows=2, top1=2, topk=2, k=5, values=4, abs_sum=1.0, abs_max=0.2))
    assert (total.top1_agreement, total.topk_agreement) == (0.75, 1.0)
    assert total.to_json()["mean_abs_diff"] == 0.25
    assert ShadowStats().to_json() == {
        "compared": 0, "agreement": None, "latency_ratio": None, "outputs": {},
    }  # fmt: skip
