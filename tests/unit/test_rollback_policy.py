"""The rollback decisions, without I/O: what a channel served (from release states),
which version ``rollback`` picks, and when the promotion order may be skipped."""

from __future__ import annotations

import pytest

from registry.history import Assignment, ChannelHistory, timeline
from registry.policy import channel_move, promotion_violations
from registry.promote import rollback_target
from registry.schema import RegisteredModel

ORDER = ["canary", "production"]


def _model(channels: dict[str, str]) -> RegisteredModel:
    return RegisteredModel.model_validate({
        "apiVersion": "modelreg/v1", "kind": "RegisteredModel", "metadata": {"name": "mlp"},
        "spec": {"channels": channels, "promotion": {"order": ORDER}},
    })  # fmt: skip


def test_timeline_keeps_each_change_of_version_once() -> None:
    maps = [
        {"canary": Assignment("1.0.0")},
        {"canary": Assignment("1.1.0", 10.0)},
        {"canary": Assignment("1.1.0")},  # a rollout step: not a new assignment
        {"canary": Assignment("1.0.0"), "production": Assignment("1.0.0")},
        {"canary": Assignment("1.1.0"), "production": Assignment("1.0.0")},
    ]
    history = timeline(maps)
    assert history.assignments == {
        "canary": ["1.0.0", "1.1.0", "1.0.0", "1.1.0"],
        "production": ["1.0.0"],
    }
    assert history.served() == {
        "canary": frozenset({"1.0.0", "1.1.0"}),
        "production": frozenset({"1.0.0"}),
    }


@pytest.mark.parametrize(
    ("served", "now", "deprecated", "expected"),
    [
        (["1.0.0", "1.1.0", "1.2.0"], "1.2.0", {}, "1.1.0"),
        # going back twice goes further back, never forward again
        (["1.0.0", "1.1.0", "1.2.0", "1.1.0"], "1.1.0", {}, "1.0.0"),
        # a deprecated version is skipped, and the newest eligible one below stays the pick
        (["1.0.0", "1.2.0", "1.1.0", "1.3.0"], "1.3.0", {"1.1.0": "x"}, "1.2.0"),
        (["1.0.0", "1.3.0"], "1.3.0", {"1.0.0": "x"}, None),
        (["2.0.0"], "1.0.0", {}, None),
    ],
)
def test_rollback_target(
    served: list[str], now: str, deprecated: dict[str, str], expected: str | None
) -> None:
    history = ChannelHistory({"production": served})
    declared = {"1.0.0", "1.1.0", "1.2.0", "1.3.0", "2.0.0"}
    assert rollback_target(history, "production", now, declared, deprecated) == expected


SERVED = {"canary": frozenset({"1.0.0", "1.1.0", "2.0.0"}), "production": frozenset({"1.1.0"})}


@pytest.mark.parametrize(
    ("channels", "version", "previous", "deprecated", "reason"),
    [
        # back to what production served: no canary step
        ({"canary": "2.0.0", "production": "2.0.0"}, "1.1.0", "2.0.0", {}, None),
        # back to what only canary served: the order applies
        ({"canary": "2.0.0", "production": "2.0.0"}, "1.0.0", "2.0.0", {}, "canary' before"),
        # forward to a version pulled back: the order applies again
        ({"canary": "1.1.0", "production": "1.1.0"}, "2.0.0", "1.1.0", {}, "canary' before"),
        # a new channel has nothing to go back from
        ({"canary": "2.0.0"}, "1.1.0", None, {}, "canary' before"),
        ({"canary": "2.0.0", "production": "2.0.0"}, "1.1.0", "2.0.0", {"1.1.0": "PII"},
         "is deprecated (PII)"),
    ],
)  # fmt: skip
def test_the_order_is_skipped_only_going_back_to_what_served(
    channels: dict[str, str],
    version: str,
    previous: str | None,
    deprecated: dict[str, str],
    reason: str | None,
) -> None:
    model = _model(channels)
    declared = {"1.0.0", "1.1.0", "2.0.0"}
    reasons = promotion_violations(
        model, declared, version, "production",
        served=SERVED, deprecated=deprecated, previous=previous,
    )  # fmt: skip
    if reason is None:
        assert reasons == []
    else:
        assert any(reason in r for r in reasons), reasons


def test_channel_moves_say_what_a_reviewer_needs() -> None:
    model = _model({"canary": "2.0.0", "production": "2.0.0"})
    back = channel_move(model, "production", "2.0.0", "1.1.0", SERVED)
    assert (back.kind, back.served_before) == ("rollback", ("production",))
    assert back.text() == "mlp production: 2.0.0 -> 1.1.0 (rollback; it served production before)"
    forward = channel_move(model, "production", "1.1.0", "2.0.0", SERVED)
    assert (forward.kind, forward.text()) == ("promotion", "mlp production: 1.1.0 -> 2.0.0")
    new = channel_move(model, "production", None, "1.0.0", SERVED)
    assert new.text() == "mlp production: - -> 1.0.0"
