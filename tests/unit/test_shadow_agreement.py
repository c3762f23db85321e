"""Shadow comparison's sums and the gate's reading of them (issue 29, points 1 and 2): what
two versions' answers to the same inputs agree on, kept as sums only, added up over
devices, and judged."""

from __future__ import annotations

import numpy as np
import pytest

from edge_sync.decide.health import GatePolicy, Window, judge
from edge_sync.decide.shadow import Pair, ShadowPolicy, ShadowStats, check, compare
from registry.agreement import (
    MAX_COUNT,
    MAX_SUM,
    Agreement,
    OutputSums,
    bucket,
    combine,
    percentile,
)


def _scores(n: int, classes: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, classes)).astype(np.float32)


def _flipped(old: np.ndarray, every: int) -> np.ndarray:
    """``old`` with the runner-up winning on every ``every``-th row."""
    new = old.copy()
    for row in range(0, len(old), every):
        first, second = np.argsort(-old[row])[:2]
        new[row, first], new[row, second] = old[row, second], old[row, first]
    return new


def test_the_same_answers_agree_fully() -> None:
    probs = _scores(8, 10, 0)
    found = compare({"probs": probs}, {"probs": probs.copy()})["probs"]
    assert (found.rows, found.top1, found.topk, found.k) == (8, 8, 8, 5)
    assert (found.values, found.abs_max, found.rel_max, found.drift) == (80, 0.0, 0.0, 0.0)


def test_a_version_that_disagrees_on_a_fifth_of_its_inputs() -> None:
    old = _scores(100, 4, 1)
    new = _flipped(old, 5)  # 20 rows: the runner-up wins
    stats = ShadowStats()
    for part in range(4):  # answers of 25 rows each
        rows = slice(25 * part, 25 * (part + 1))
        stats.add({"probs": new[rows]}, {"probs": old[rows]}, new_s=0.002, old_s=0.001)
    sums = stats.report("1.1.0", "1.0.0")
    assert sums.compared == 4
    assert sums.agreement == pytest.approx(0.8)
    shown = sums.figures()["outputs"]["probs"]  # type: ignore[index]
    assert shown["top1_agreement"] == pytest.approx(0.8)
    assert shown["topk_agreement"] == 1.0  # the old top class is the new runner-up
    assert shown["max_abs_diff"] > 0
    assert sums.latency_ratio == pytest.approx(2.0)
    assert sums.p99_ratio == pytest.approx(2.0, rel=0.11)  # histogram buckets: 10 %
    assert "agreement 80% over 4 compared requests" in sums.text()


def test_regression_outputs_keep_their_differences() -> None:
    old = np.array([[1.0, -2.0, 0.0]], dtype=np.float32)
    new = np.array([[1.5, -2.0, 0.001]], dtype=np.float32)
    found = compare({"y": new}, {"y": old})["y"]
    assert found.rows == 1  # [1, 3] floats read as the class scores of one row
    assert found.abs_max == pytest.approx(0.5)
    assert found.rel_max == pytest.approx(0.001 / 1e-6, rel=1e-3)  # against the floor
    assert found.drift == pytest.approx(0.501 / 3.0, rel=1e-3)  # relative L1
    one = compare({"v": np.array([2.0])}, {"v": np.array([1.0])})["v"]
    assert (one.rows, one.k, one.abs_max, one.rel_max, one.drift) == (0, None, 1.0, 1.0, 1.0)


def test_what_cannot_be_compared_is_counted_not_guessed() -> None:
    found = compare(
        {"a": np.zeros((2, 3)), "b": np.zeros(3), "c": np.array(["x"]), "d": np.zeros(1)},
        {"a": np.zeros((2, 4)), "b": np.zeros(3)},
    )
    assert found["a"].incomparable == 1  # a shape that changed
    assert found["c"].incomparable == 1  # not numbers
    assert found["d"].incomparable == 1  # the previous version had no such output
    assert found["b"].incomparable == 0


def test_a_value_that_becomes_nan_is_drift_not_an_unbounded_sum() -> None:
    nan = compare({"x": np.array([np.nan, 1.0])}, {"x": np.array([0.0, 1.0])})["x"]
    assert (nan.values, nan.nonfinite, nan.abs_sum) == (1, 1, 0.0)
    assert nan.drift == 0.5  # half the values became non-finite
    both = compare({"x": np.array([np.nan, np.inf])}, {"x": np.array([np.nan, np.inf])})["x"]
    assert (both.values, both.nonfinite, both.drift) == (2, 0, 0.0)
    huge = compare({"x": np.array([1e308])}, {"x": np.array([-1e308])})["x"]
    sums = Agreement(version="1.0.1", against="1.0.0", outputs={"x": huge})
    assert sums.drift is not None  # fits a report
    assert np.isfinite(huge.abs_sum)


def test_devices_sums_add_up_to_the_fleets() -> None:
    one = Agreement(
        version="1.1.0", against="1.0.0", compared=10, new_s=0.02, old_s=0.01,
        new_hist=[[bucket(0.002), 10]], old_hist=[[bucket(0.001), 10]],
        outputs={"p": OutputSums(rows=10, top1=9, topk=10, k=5, values=40, abs_sum=2.0,
                                 ref_sum=40.0)},
    )  # fmt: skip
    two = one.model_copy(update={
        "compared": 30, "outputs": {"p": OutputSums(rows=30, top1=15, topk=30, k=5)},
        "new_hist": [[bucket(0.004), 30]]})  # fmt: skip
    fleet = combine([one, two])
    assert fleet is not None
    assert (fleet.compared, fleet.devices) == (40, 2)
    assert fleet.agreement == pytest.approx(24 / 40)  # rows summed, not shares averaged
    assert percentile(fleet.new_hist, 0.99) == pytest.approx(0.004, rel=0.11)
    assert "on 2 devices" in fleet.text()
    assert combine([]) is None
    with pytest.raises(ValueError, match="different versions"):
        combine([one, one.model_copy(update={"against": "0.9.0"})])


def test_report_bounds_refuse_what_a_device_could_not_have_sent() -> None:
    with pytest.raises(ValueError, match="bucket"):
        Agreement(version="1.0.0", against="0.9.0", new_hist=[[999, 1]])
    with pytest.raises(ValueError, match="finite number"):
        Agreement(version="1.0.0", against="0.9.0", new_s=float("inf"))
    with pytest.raises(ValueError, match="control or format characters"):
        Agreement(version="1.0.0", against="0.9.0", outputs={"bad\nname": OutputSums()})


def test_sums_that_do_not_add_up_are_refused() -> None:
    with pytest.raises(ValueError, match="top1 <= topk <= rows"):
        OutputSums(rows=10, top1=11, topk=11)
    with pytest.raises(ValueError, match="top1 <= topk <= rows"):
        OutputSums(rows=10, top1=5, topk=4)
    with pytest.raises(ValueError, match="largest difference"):
        OutputSums(values=2, abs_sum=1.0, abs_max=2.0)
    with pytest.raises(ValueError, match="more answers not comparable"):
        Agreement(version="1.0.0", against="0.9.0", compared=1,
                  outputs={"y": OutputSums(incomparable=2)})  # fmt: skip


def test_fleet_sums_saturate_instead_of_refusing_the_fleet() -> None:
    most = MAX_COUNT
    part = Agreement(
        version="1.1.0", against="1.0.0", compared=most, devices=most,
        outputs={"p": OutputSums(rows=most, top1=most, topk=most, k=5, values=most,
                                 abs_sum=MAX_SUM, ref_sum=MAX_SUM, incomparable=most)},
    )  # fmt: skip
    fleet = combine([part, part, part])
    assert fleet is not None
    assert (fleet.compared, fleet.devices, fleet.outputs["p"].rows) == (most, most, most)
    assert fleet.outputs["p"].abs_sum == MAX_SUM


def test_huge_and_oddly_named_outputs_still_make_a_report() -> None:
    stats = ShadowStats()
    huge = np.array([[1.7e308, -1.7e308, 3.0]])
    stats.add({"y": huge, "odd\x1b[2Jname": huge}, {"y": -huge, "odd\x1b[2Jname": huge},
              new_s=0.001, old_s=0.001)  # fmt: skip
    report = stats.report("1.1.0", "1.0.0")  # validates: no sum or largest past MAX_SUM
    assert report.outputs["y"].abs_max == MAX_SUM
    assert report.outputs["y"].rel_max == MAX_SUM
    assert "odd[2Jname" in report.outputs  # the escape character dropped


def test_names_that_come_out_alike_are_told_apart_not_merged() -> None:
    stats = ShadowStats()
    same = _scores(8, 4, 1)
    stats.add({"logits": same, "logits\x01": same}, {"logits": _flipped(same, 1), "logits\x01": same},
              new_s=0.001, old_s=0.001)  # fmt: skip
    report = stats.report("1.1.0", "1.0.0")
    assert sorted(report.outputs) == ["logits", "logits~2"]
    assert report.agreement == 0.0  # the disagreeing output is not hidden by its twin


def test_an_output_numpy_cannot_hold_is_not_comparable_not_a_crash() -> None:
    ragged = [[1.0, 2.0], [3.0]]
    stats = ShadowStats()
    stats.add_many([({"seq": ragged}, {"seq": ragged}, 0.001, 0.001)] * 3)
    report = stats.report("1.1.0", "1.0.0")
    assert (report.compared, report.outputs["seq"].incomparable, report.comparable) == (3, 3, 0)


def test_sums_merged_from_bursts_are_the_sums_of_all() -> None:
    pairs: list[Pair] = [
        ({"p": _scores(3, 6, i)}, {"p": _flipped(_scores(3, 6, i), 2)}, 0.002, 0.001)
        for i in range(6)
    ]
    pairs.insert(3, ({"p": _scores(3, 6, 9)}, {"p": _scores(3, 6, 9)}, None, 0.001))
    whole, merged = ShadowStats(), ShadowStats()
    whole.add_many(pairs)
    for burst in (pairs[:2], pairs[2:5], pairs[5:]):
        part = ShadowStats()
        part.add_many(burst)
        merged.merge(part)
    got, want = merged.report("1.1.0", "1.0.0"), whole.report("1.1.0", "1.0.0")
    assert got.model_dump(exclude={"outputs"}) == want.model_dump(exclude={"outputs"})
    # the same sums, added in another order
    assert got.outputs["p"].model_dump() == pytest.approx(want.outputs["p"].model_dump())
    # the run batched with others (no run time of its own) is compared, not timed
    assert whole.compared == 7
    assert sum(n for _, n in whole.report("1.1.0", "1.0.0").new_hist) == 6


GATING = ShadowPolicy(sample=1.0, min_agreement=0.95, min_compared=20)


def _sums(compared: int, top1: int, rows: int) -> Agreement:
    return Agreement(
        version="1.1.0", against="1.0.0", compared=compared,
        outputs={"p": OutputSums(rows=rows, top1=top1, topk=rows, k=5)},
    )  # fmt: skip


@pytest.mark.parametrize(
    ("policy", "found", "decision", "said"),
    [
        (ShadowPolicy(), None, "pass", ""),  # no threshold: the figures are shown only
        (GATING, None, "wait", "0 of 20 requests compared"),
        (GATING, _sums(19, 0, 19), "wait", "19 of 20"),
        (GATING, _sums(20, 16, 20), "fail", "agreement 80% over 20 compared requests"),
        (GATING, _sums(20, 19, 20), "pass", "agreement 95% over 20"),
        (ShadowPolicy(max_output_drift=0.01, min_compared=1),
         Agreement(version="1.1.0", against="1.0.0", compared=1,
                   outputs={"y": OutputSums(values=10, abs_sum=1.0, ref_sum=10.0)}),
         "fail", "drift 10%"),
        # answers the previous version failed on (or gave unlike) are not evidence
        (GATING, Agreement(version="1.1.0", against="1.0.0", compared=30,
                           outputs={"p": OutputSums(rows=10, top1=10, topk=10, k=5,
                                                    incomparable=20)}),
         "wait", "10 of 20 requests compared (20 answers not comparable)"),
        # a threshold whose figure the outputs cannot give judges nothing: the gate
        # waits, then passes the version "not judged on its answers"
        (GATING, Agreement(version="1.1.0", against="1.0.0", compared=30,
                           outputs={"y": OutputSums(values=10, abs_sum=1.0, ref_sum=10.0)}),
         "wait", "agreement not measured: no output is shaped like class scores"),
        (ShadowPolicy(max_output_drift=0.01, min_compared=1),
         Agreement(version="1.1.0", against="1.0.0", compared=5,
                   outputs={"y": OutputSums(rows=5, top1=5, topk=5, k=2)}),
         "wait", "drift not measured: no output value was compared"),
        # a new output the previous version does not give takes nothing from the
        # evidence of the others: the disagreement is judged
        (GATING, Agreement(version="1.1.0", against="1.0.0", compared=100,
                           outputs={"p": OutputSums(rows=100, top1=7, topk=100, k=5),
                                    "extra": OutputSums(incomparable=100)}),
         "fail", "agreement 7% over 100 compared requests"),
    ],
)  # fmt: skip
def test_what_the_gate_reads_of_a_comparison(
    policy: ShadowPolicy, found: Agreement | None, decision: str, said: str
) -> None:
    got, reason = check(policy, found)
    assert got == decision
    assert said in reason


BUSY = Window(100, 0, tuple((10, 0.001) for _ in range(100)))


def test_a_gate_fails_on_disagreement_at_once_and_waits_for_comparisons() -> None:
    policy = GatePolicy(window_s=30, min_requests=20)
    failed = check(GATING, _sums(20, 10, 20))
    verdict = judge(policy, BUSY, BUSY, 1.0, shadow=failed)  # before the window ends
    assert (verdict.decision, verdict.reason) == ("fail", failed[1])
    waiting = check(GATING, _sums(3, 3, 3))
    assert judge(policy, BUSY, BUSY, 31.0, shadow=waiting).decision == "wait"
    late = judge(policy, BUSY, BUSY, 121.0, shadow=waiting)  # the extended window ended
    assert late.decision == "pass"
    assert "not judged on its answers: not compared" in late.reason
    kept = judge(policy, BUSY, BUSY, 31.0, shadow=check(GATING, _sums(40, 40, 40)))
    assert kept.decision == "pass"
    assert "agreement 100% over 40 compared requests" in kept.reason
