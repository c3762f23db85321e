"""The promotion and rollback decisions without I/O (issue 13, point 5), as tables.

``tests/unit/test_edit_policy.py`` covers the promotion order for a version that
serves (or does not serve) the channel before, and the unknown-channel hints;
``tests/unit/test_rollback_policy.py`` covers the rollback exemption in its main
cases and which version ``rollback`` picks.  The rows here cover the rest: every rule
of ``promotion_violations`` at its boundary (deprecated, undeclared, later channels,
going back vs forward vs the same version, SemVer order rather than text order), the
reasons ``rollback_problem`` gives, and the helpers both use.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import pytest

from registry.history import ChannelHistory
from registry.loader import load_manifest
from registry.policy import channel_move, promotion_violations, served_channels
from registry.promote import rollback_problem, rollback_target
from registry.repository import ModelEntry
from registry.schema import RegisteredModel
from registry.yamlsrc import parse_yaml

ORDER = ("dev", "canary", "production")
ORDER_TEXT = "promotion order: dev, canary, production"
DECLARED = frozenset({"1.0.0", "1.1.0", "1.9.0", "1.10.0", "2.0.0-rc.1", "2.0.0"})


def _model(channels: Mapping[str, str], order: tuple[str, ...] = ORDER) -> RegisteredModel:
    spec: dict[str, object] = {"channels": dict(channels)}
    if order:
        spec["promotion"] = {"order": list(order)}
    return RegisteredModel.model_validate({
        "apiVersion": "modelreg/v1", "kind": "RegisteredModel", "metadata": {"name": "mlp"},
        "spec": spec,
    })  # fmt: skip


def _must(version: str, before: str, channel: str) -> str:
    return f"version {version} must be promoted to {before!r} before {channel!r} ({ORDER_TEXT})"


def _deprecated(version: str, why: str) -> str:
    return f"version {version} of 'mlp' is deprecated ({why}); it cannot be promoted"


UNDECLARED_9 = (
    "version 9.0.0 is not declared for model 'mlp' "
    "(declared: 1.0.0, 1.1.0, 1.10.0, 1.9.0, 2.0.0, 2.0.0-rc.1)"
)
BETA = (
    "channel 'beta' is not in the promotion order of 'mlp' (dev, canary, production); "
    "to add a channel, list it in spec.promotion.order of the model"
)
# What production and canary served in past releases.
SERVED = {
    "production": frozenset({"1.0.0", "1.9.0", "2.0.0-rc.1"}),
    "canary": frozenset({"1.0.0", "1.1.0", "1.9.0", "1.10.0", "2.0.0-rc.1"}),
}
NOW = {"dev": "2.0.0", "canary": "2.0.0", "production": "1.10.0"}


@pytest.mark.parametrize(
    ("channels", "version", "channel", "extra", "expected"),
    [
        # deprecation: refused whatever the order says, and before it is read
        pytest.param(NOW, "1.1.0", "dev", {"deprecated": {"1.1.0": "leaks PII"}}, [_deprecated("1.1.0", "leaks PII")], id="deprecated, first channel"),
        pytest.param(NOW, "2.0.0", "production", {"deprecated": {"2.0.0": "bad"}}, [_deprecated("2.0.0", "bad")], id="deprecated while serving the channel before"),
        pytest.param(NOW, "1.1.0", "anything", {"order": (), "deprecated": {"1.1.0": "x"}}, [_deprecated("1.1.0", "x")], id="deprecated, no promotion order"),
        pytest.param(NOW, "1.1.0", "dev", {"deprecated": {"1.0.0": "x"}}, [], id="another version deprecated: no effect"),
        pytest.param(NOW, "1.1.0", "dev", {"deprecated": {"1.1.0": ""}}, [_deprecated("1.1.0", "")], id="deprecated with an empty reason still counts"),
        # undeclared: one reason each, every rule still applies
        pytest.param(NOW, "9.0.0", "production", {}, [UNDECLARED_9, _must("9.0.0", "canary", "production")], id="undeclared and out of order: both said"),
        pytest.param(NOW, "9.0.0", "beta", {}, [UNDECLARED_9, BETA], id="undeclared on an unknown channel: both said"),
        pytest.param(NOW, "9.0.0", "dev", {"deprecated": {"9.0.0": "x"}}, [UNDECLARED_9, _deprecated("9.0.0", "x")], id="undeclared and deprecated: both said"),
        pytest.param(NOW, "1.0.0", "dev", {"declared": frozenset()}, ["version 1.0.0 is not declared for model 'mlp' (declared: none)"], id="nothing declared"),
        pytest.param(NOW, "1.1.0", "beta", {"deprecated": {"1.1.0": "x"}}, [_deprecated("1.1.0", "x"), BETA], id="deprecated on an unknown channel: both said"),
        # the order: the channel before, this channel or a later one
        pytest.param({"production": "1.1.0"}, "1.1.0", "canary", {}, [], id="serving a later channel: may enter an earlier one"),
        pytest.param({"production": "1.1.0"}, "1.1.0", "production", {}, [], id="serving this very channel: a re-pin"),
        pytest.param({"dev": "1.1.0"}, "1.1.0", "canary", {}, [], id="serving the channel just before"),
        pytest.param({"dev": "1.1.0"}, "1.1.0", "production", {}, [_must("1.1.0", "canary", "production")], id="serving two channels before: one step short"),
        pytest.param({"shadow": "1.1.0"}, "1.1.0", "canary", {}, [_must("1.1.0", "dev", "canary")], id="serving a channel outside the order: no step"),
        pytest.param({}, "1.1.0", "dev", {}, [], id="the first channel of the order is open"),
        pytest.param({}, "1.1.0", "production", {"order": ("production",)}, [], id="a one-channel order is open"),
        pytest.param({"canary": "1.1.0"}, "1.1.0", "dev", {}, [], id="going down the order from a later channel"),
        # going back: only to what served this channel or a later one, below what it serves now
        pytest.param(NOW, "1.9.0", "production", {"served": SERVED, "previous": "1.10.0"}, [], id="back to what production served (1.9.0 < 1.10.0 as SemVer)"),
        pytest.param(NOW, "2.0.0-rc.1", "production", {"served": SERVED, "previous": "2.0.0"}, [], id="back to a pre-release of the current version"),
        pytest.param(NOW, "1.9.0", "canary", {"served": SERVED, "previous": "1.10.0"}, [], id="back on canary to what production served"),
        pytest.param(NOW, "1.1.0", "production", {"served": SERVED, "previous": "1.10.0"}, [_must("1.1.0", "canary", "production")], id="back to what only an earlier channel served"),
        pytest.param(NOW, "1.1.0", "canary", {"served": {"production": frozenset({"1.1.0"})}, "previous": "2.0.0"}, [], id="back to what only a later channel served"),
        pytest.param(NOW, "1.9.0", "production", {"served": SERVED, "previous": "1.9.0"}, [_must("1.9.0", "canary", "production")], id="the same version as now is not going back"),
        pytest.param(NOW, "1.9.0", "production", {"served": SERVED, "previous": "1.1.0"}, [_must("1.9.0", "canary", "production")], id="forward to what served: the order again"),
        pytest.param(NOW, "1.9.0", "production", {"served": SERVED}, [_must("1.9.0", "canary", "production")], id="a new channel has nothing to go back from"),
        pytest.param(NOW, "1.9.0", "production", {"previous": "1.10.0"}, [_must("1.9.0", "canary", "production")], id="going back with no history known"),
        pytest.param(NOW, "1.9.0", "production", {"served": SERVED, "previous": "1.10.0", "deprecated": {"1.9.0": "x"}}, [_deprecated("1.9.0", "x")], id="back to what served, but deprecated"),
    ],
)  # fmt: skip
def test_promotion_violations(
    channels: Mapping[str, str],
    version: str,
    channel: str,
    extra: Mapping[str, object],
    expected: list[str],
) -> None:
    order = extra.get("order", ORDER)
    declared = extra.get("declared", DECLARED)
    served = extra.get("served")
    deprecated = extra.get("deprecated")
    previous = extra.get("previous")
    assert isinstance(order, tuple)
    assert isinstance(declared, frozenset)
    assert served is None or isinstance(served, dict)
    assert deprecated is None or isinstance(deprecated, dict)
    assert previous is None or isinstance(previous, str)
    reasons = promotion_violations(
        _model(channels, order), declared, version, channel,
        served=served, deprecated=deprecated, previous=previous,
    )  # fmt: skip
    assert reasons == expected


def test_an_undeclared_version_that_is_not_semver_is_a_reason_not_a_crash() -> None:
    reasons = promotion_violations(
        _model(NOW), DECLARED, "latest", "production", served=SERVED, previous="1.10.0"
    )
    undeclared = UNDECLARED_9.replace("9.0.0", "latest")
    assert reasons == [undeclared, _must("latest", "canary", "production")]


# --- served_channels and channel_move --------------------------------------------------


@pytest.mark.parametrize(
    ("channel", "served", "expected"),
    [
        pytest.param("canary", SERVED, ["canary", "production"], id="this channel and every later one, in order"),
        pytest.param("production", SERVED, ["production"], id="earlier channels never count"),
        pytest.param("production", {"canary": SERVED["canary"]}, [], id="served only before this channel"),
        pytest.param("beta", {"beta": frozenset({"1.9.0"})}, ["beta"], id="a channel outside the order: itself only"),
        pytest.param("beta", {"production": frozenset({"1.9.0"})}, [], id="outside the order, served elsewhere"),
        pytest.param("dev", {}, [], id="no history"),
    ],
)  # fmt: skip
def test_served_channels(
    channel: str, served: Mapping[str, frozenset[str]], expected: list[str]
) -> None:
    assert served_channels(ORDER, channel, served, "1.9.0") == expected


@pytest.mark.parametrize(
    ("order", "previous", "version", "text"),
    [
        pytest.param(ORDER, "1.9.0", "1.9.0", "mlp production: 1.9.0 -> 1.9.0", id="same version: not a rollback"),
        pytest.param(ORDER, "1.9.0", "1.10.0", "mlp production: 1.9.0 -> 1.10.0", id="forward as SemVer, backward as text"),
        pytest.param(ORDER, "1.10.0", "1.9.0", "mlp production: 1.10.0 -> 1.9.0 (rollback; it served production before)", id="back as SemVer"),
        pytest.param(ORDER, "2.0.0", "2.0.0-rc.1", "mlp production: 2.0.0 -> 2.0.0-rc.1 (rollback; it served production before)", id="back to a pre-release"),
        pytest.param(ORDER, "1.9.0", "1.1.0", "mlp production: 1.9.0 -> 1.1.0 (rollback)", id="back to what production never served"),
        pytest.param((), "1.10.0", "1.9.0", "mlp production: 1.10.0 -> 1.9.0 (rollback; it served production before)", id="no order: served this channel"),
        pytest.param((), "1.9.0", "1.1.0", "mlp production: 1.9.0 -> 1.1.0 (rollback)", id="no order: never served it"),
    ],
)  # fmt: skip
def test_channel_move(order: tuple[str, ...], previous: str, version: str, text: str) -> None:
    move = channel_move(_model({}, order), "production", previous, version, SERVED)
    assert move.text() == text
    assert move.kind == ("rollback" if "(rollback" in text else "promotion")


# --- rollback_problem and rollback_target -----------------------------------------------


def _entry(order: tuple[str, ...] = ORDER) -> ModelEntry:
    manifest = _model({"production": "1.10.0"}, order)
    text = json.dumps(manifest.model_dump(mode="json", by_alias=True, exclude_defaults=True))
    doc = parse_yaml(text.encode(), "manifests/mlp/model.yaml")
    loaded = load_manifest(doc, "RegisteredModel")
    assert isinstance(loaded, RegisteredModel)
    return ModelEntry("mlp", doc.file, Path("/nowhere") / doc.file, doc, loaded)


HISTORY = ChannelHistory({
    "canary": ["1.0.0", "1.1.0", "1.9.0", "1.10.0"],
    "production": ["1.0.0", "1.9.0", "1.10.0"],
})  # fmt: skip
NEVER = (
    "version 1.1.0 never served 'production' or a later channel of 'mlp' in a release "
    "('production' served: 1.0.0, 1.9.0, 1.10.0); a version that did not serve it goes "
    "through the promotion order (modelreg promote)"
)


@pytest.mark.parametrize(
    ("channel", "now", "to", "extra", "expected"),
    [
        pytest.param("production", "1.10.0", "1.9.0", {}, None, id="back to what it served, below it as SemVer"),
        pytest.param("production", "1.10.0", "1.0.0", {}, None, id="further back to what it served"),
        pytest.param("canary", "1.10.0", "1.0.0", {"history": ChannelHistory({"production": ["1.0.0"]})}, None, id="back to what a later channel served"),
        pytest.param("production", "1.10.0", "1.1.0", {}, NEVER, id="what only an earlier channel served"),
        pytest.param("production", "1.10.0", "1.1.0", {"history": ChannelHistory({})}, "version 1.1.0 never served 'production' or a later channel of 'mlp' in a release ('production' served: nothing); a version that did not serve it goes through the promotion order (modelreg promote)", id="no history at all"),
        pytest.param("production", "1.10.0", "1.1.0", {"order": ()}, None, id="no promotion order: any lower declared version"),
        pytest.param("production", "1.10.0", "1.10.0", {}, "channel 'production' of 'mlp' already serves 1.10.0", id="the version it serves"),
        pytest.param("production", "1.9.0", "1.10.0", {}, "version 1.10.0 is newer than what 'production' serves (1.9.0): going forward is a promotion (modelreg promote mlp 1.10.0 --channel production)", id="forward as SemVer, backward as text"),
        pytest.param("production", "2.0.0-rc.1", "2.0.0", {}, "version 2.0.0 is newer than what 'production' serves (2.0.0-rc.1): going forward is a promotion (modelreg promote mlp 2.0.0 --channel production)", id="from a pre-release to its release is forward"),
        pytest.param("production", "1.10.0", "1.9.0", {"deprecated": {"1.9.0": "leaks PII"}}, "version 1.9.0 of 'mlp' is deprecated (leaks PII); it cannot serve again", id="deprecated"),
        pytest.param("production", "1.10.0", "1.10.0", {"deprecated": {"1.10.0": "x"}}, "version 1.10.0 of 'mlp' is deprecated (x); it cannot serve again", id="deprecation said before 'already serves'"),
        pytest.param("production", "1.10.0", "1.9.1", {}, "version 1.9.1 is not declared for model 'mlp' (declared: 1.0.0, 1.1.0, 1.9.0, 1.10.0, 2.0.0-rc.1, 2.0.0); did you mean 1.9.0?", id="undeclared: SemVer-sorted list and the closest"),
        pytest.param("production", "1.10.0", "7", {}, "version 7 is not declared for model 'mlp' (declared: 1.0.0, 1.1.0, 1.9.0, 1.10.0, 2.0.0-rc.1, 2.0.0)", id="undeclared, nothing close"),
        pytest.param("production", "1.10.0", "1.9.0", {"declared": set()}, "version 1.9.0 is not declared for model 'mlp' (declared: none)", id="nothing declared"),
    ],
)  # fmt: skip
def test_rollback_problem(
    channel: str, now: str, to: str, extra: Mapping[str, object], expected: str | None
) -> None:
    order = extra.get("order", ORDER)
    history = extra.get("history", HISTORY)
    declared = extra.get("declared", set(DECLARED))
    deprecated = extra.get("deprecated", {})
    assert isinstance(order, tuple)
    assert isinstance(history, ChannelHistory)
    assert isinstance(declared, set)
    assert isinstance(deprecated, dict)
    problem = rollback_problem(
        _entry(order), history, channel, now=now, to=to, declared=declared, deprecated=deprecated
    )
    assert problem == expected


@pytest.mark.parametrize(
    ("assignments", "now", "declared", "expected"),
    [
        pytest.param(["1.9.0", "1.10.0"], "1.10.0", DECLARED, "1.9.0", id="below as SemVer, not as text"),
        pytest.param(["1.0.0", "1.9.0", "1.10.0"], "1.10.0", DECLARED - {"1.9.0"}, "1.0.0", id="a version no longer declared is skipped"),
        pytest.param(["2.0.0-rc.1", "2.0.0"], "2.0.0", DECLARED, "2.0.0-rc.1", id="back to the pre-release"),
        pytest.param(["1.10.0"], "1.10.0", DECLARED, None, id="only ever served what it serves now"),
        pytest.param([], "1.10.0", DECLARED, None, id="the channel has no history"),
    ],
)  # fmt: skip
def test_rollback_target(
    assignments: list[str], now: str, declared: frozenset[str], expected: str | None
) -> None:
    history = ChannelHistory({"production": assignments} if assignments else {})
    assert rollback_target(history, "production", now, set(declared), {}) == expected


def test_a_channel_in_waves_counts_as_serving_its_version() -> None:
    """Waves change how many devices of a channel take a version, not which version it
    serves: the promotion order reads the version, whatever the wave or a hold."""
    waves = {"percent": 10, "waves": [{"percent": 10, "soak": "1h"}, {"percent": 100}],
             "stop": {"failure_share": 0.05}, "hold": "2 of 10 devices failed"}  # fmt: skip
    model = RegisteredModel.model_validate({
        "apiVersion": "modelreg/v1", "kind": "RegisteredModel", "metadata": {"name": "mlp"},
        "spec": {"channels": {"dev": "2.0.0", "canary": {"version": "2.0.0", "rollout": waves}},
                 "promotion": {"order": list(ORDER)}},
    })  # fmt: skip
    assert promotion_violations(model, DECLARED, "2.0.0", "production") == []
    assert promotion_violations(model, DECLARED, "1.1.0", "production") == [
        _must("1.1.0", "canary", "production")
    ]
