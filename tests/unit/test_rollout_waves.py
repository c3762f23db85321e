"""Rollout waves in the manifest (issue 14, point 4): what the schema accepts, the
round-trip edits ``fleet advance`` and ``promote`` make, and when a wave started
(``registry.history.released_since``, pure).  The decisions are in
``test_wave_decisions.py``."""

from __future__ import annotations

from typing import Any

import pytest

from registry.edit import set_channel, set_hold
from registry.errors import ManifestError
from registry.history import Assignment, LogCommit, released_since
from registry.jsonschema import json_schema
from registry.loader import load_manifest
from registry.schema import RegisteredModel, Rollout, RolloutStop, Wave
from registry.yamlsrc import parse_yaml

MODEL = "manifests/mlp/model.yaml"
WAVES_YAML = """\
apiVersion: modelreg/v1
kind: RegisteredModel
metadata:
  name: mlp
spec:
  channels:
    production: 1.0.0
    canary:
      version: 1.1.0
      rollout:
        percent: 10  # the wave we are in
        waves:
          - {percent: 10, soak: 1h}
          - {percent: 50, soak: 4h}
          - {percent: 100}
        stop: {failure_share: 0.05, min_reports: 20}
  promotion:
    order: [canary, production]
"""


def _load(text: str) -> RegisteredModel:
    model = load_manifest(parse_yaml(text.encode(), MODEL), "RegisteredModel")
    assert isinstance(model, RegisteredModel)
    return model


def _rollout(**fields: Any) -> Rollout:
    return Rollout.model_validate(fields)


def test_waves_and_stop_conditions_load() -> None:
    canary = _load(WAVES_YAML).spec.channels["canary"]
    assert canary.rollout == Rollout(
        percent=10,
        waves=[Wave(percent=10, soak=3600), Wave(percent=50, soak=14400), Wave(percent=100)],
        stop=RolloutStop(failure_share=0.05, min_reports=20),
    )
    assert canary.rollout.wave_index() == 0
    # a plain rollout is unchanged: no waves, no stop, no hold
    assert _rollout(percent=10) == Rollout(percent=10)
    assert _rollout(percent=10).wave_index() is None


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        # soak: the duration forms of edge.yaml; a bare number is seconds; 0 by default
        ({"percent": 5, "waves": [{"percent": 5, "soak": "30m"}, {"percent": 100}]}, 1800.0),
        ({"percent": 5, "waves": [{"percent": 5, "soak": 90}, {"percent": 100}]}, 90.0),
        ({"percent": 5, "waves": [{"percent": 5, "soak": "1.5h"}, {"percent": 100}]}, 5400.0),
        ({"percent": 5, "waves": [{"percent": 5}, {"percent": 100}]}, 0.0),
    ],
)
def test_soak_forms(fields: dict[str, Any], expected: float) -> None:
    assert _rollout(**fields).waves[0].soak == expected


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"percent": 50, "waves": [{"percent": 50}, {"percent": 10}]}, "wave percents must increase: waves[1] is 10% after 50%"),
        ({"percent": 10, "waves": [{"percent": 10}, {"percent": 10}]}, "wave percents must increase"),
        ({"percent": 20, "waves": [{"percent": 10}, {"percent": 100}]}, "rollout.percent 20 is not one of the waves' percents (10, 100)"),
        ({"percent": 0, "waves": [{"percent": 10}, {"percent": 100}]}, "rollout.percent 0 is not one of the waves' percents"),
        ({"percent": 10, "waves": [{"percent": 10}, {"percent": 100, "soak": "1h"}]}, "the last wave (100%) has no next wave to soak for"),
        ({"percent": 10, "waves": [{"percent": 0}, {"percent": 10}]}, "greater than 0"),
        ({"percent": 10, "waves": [{"percent": 10, "soak": "1d"}]}, "expected a duration"),
        ({"percent": 10, "waves": [{"percent": 10, "soak": True}]}, "expected a duration"),
        ({"percent": 10, "waves": [{"percent": 10.0001}]}, "more than 3 decimals"),
        ({"percent": 10, "stop": {"failure_share": 0.1}}, "rollout.stop applies to waves"),
        ({"percent": 10, "hold": "x"}, "rollout.hold applies to waves"),
        ({"percent": 10, "waves": [{"percent": 10}], "stop": {"failure_share": 1.5}}, "less than or equal to 1"),
        ({"percent": 10, "waves": [{"percent": 10}], "stop": {"min_reports": -1}}, "greater than or equal to 0"),
        ({"percent": 10, "waves": [{"percent": 10}], "stop": {"failure": 0.1}}, "Extra inputs"),
        ({"percent": 10, "waves": [{"percent": 10}], "hold": "two\nlines"}, "should match pattern"),
        ({"percent": 10, "waves": [{"percent": 10, "wait": "1h"}]}, "Extra inputs"),
        ({"percent": 10, "waves": [{"percent": p} for p in range(1, 34)]}, "at most 32 items"),
    ],
)  # fmt: skip
def test_invalid_waves_are_refused(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match="validation error") as info:
        _rollout(**fields)
    assert message in str(info.value)


def test_errors_name_file_line_and_column() -> None:
    text = WAVES_YAML.replace("- {percent: 50, soak: 4h}", "- {percent: 5, soak: 4h}")
    with pytest.raises(ManifestError) as info:
        _load(text)
    assert [str(p) for p in info.value.problems] == [
        (
            f"{MODEL}:13:11: spec.channels.canary.rollout.waves: wave percents must increase: "
            "waves[1] is 5% after 10%"
        )
    ]
    with pytest.raises(ManifestError) as info:
        _load(WAVES_YAML.replace("percent: 10  #", "percent: 30  #"))
    assert [str(p) for p in info.value.problems] == [
        (
            f"{MODEL}:11:9: spec.channels.canary.rollout: rollout.percent 30 is not one of the "
            "waves' percents (10, 50, 100); set it to the wave the channel is in"
        )
    ]


def test_json_schema_describes_waves_for_editors() -> None:
    defs = json_schema("RegisteredModel")["$defs"]
    assert set(defs["Rollout"]["properties"]) == {"percent", "waves", "stop", "hold"}
    assert defs["Wave"]["properties"]["percent"]["exclusiveMinimum"] == 0
    soak = defs["Wave"]["properties"]["soak"]
    assert [s["type"] for s in soak["anyOf"]] == ["string", "number"]
    assert set(defs["RolloutStop"]["properties"]) == {
        "failure_share", "min_reports",
        "min_agreement", "max_output_drift", "max_p99_ratio", "min_compared",  # issue 29
    }  # fmt: skip
    for name in ("Wave", "RolloutStop"):
        assert defs[name]["additionalProperties"] is False


# --- the edits -------------------------------------------------------------------------


def test_advancing_a_wave_keeps_waves_comments_and_layout() -> None:
    edited = set_channel(WAVES_YAML, MODEL, "canary", "1.1.0", 50)
    assert edited == WAVES_YAML.replace("percent: 10  # the wave", "percent: 50  # the wave")
    assert _load(edited).spec.channels["canary"].rollout == _rollout(
        percent=50,
        waves=[{"percent": 10, "soak": "1h"}, {"percent": 50, "soak": "4h"}, {"percent": 100}],
        stop={"failure_share": 0.05, "min_reports": 20},
    )


def test_hold_is_written_and_lifted() -> None:
    held = set_hold(WAVES_YAML, MODEL, "canary", "3 of 20 devices failed 1.1.0: rejected")
    assert held == WAVES_YAML.replace(
        "        stop: {failure_share: 0.05, min_reports: 20}\n",
        "        stop: {failure_share: 0.05, min_reports: 20}\n"
        "        hold: '3 of 20 devices failed 1.1.0: rejected'\n",
    )
    assert _load(held).spec.channels["canary"].rollout.hold == (  # type: ignore[union-attr]
        "3 of 20 devices failed 1.1.0: rejected"
    )
    assert set_hold(held, MODEL, "canary", None) == WAVES_YAML
    with pytest.raises(ManifestError, match="channel 'production' has no rollout mapping"):
        set_hold(WAVES_YAML, MODEL, "production", "x")


def test_a_hold_goes_with_its_version() -> None:
    """A hold stopped one version: promoting another one to the channel lifts it, and
    the waves stay for the new version's rollout."""
    held = set_hold(WAVES_YAML, MODEL, "canary", "stopped")
    same = set_channel(held, MODEL, "canary", "1.1.0", 10)
    assert _load(same).spec.channels["canary"].rollout.hold == "stopped"  # type: ignore[union-attr]
    moved = _load(set_channel(held, MODEL, "canary", "1.2.0", 10)).spec.channels["canary"]
    assert moved.version == "1.2.0"
    assert moved.rollout is not None
    assert moved.rollout.hold is None
    assert [w.percent for w in moved.rollout.waves] == [10, 50, 100]
    # all devices at once: the last wave (100 %), the waves and stop kept for the next
    # promotion (issue 27, bug 5: they were deleted), the hold lifted
    whole = _load(set_channel(held, MODEL, "canary", "1.2.0", None)).spec.channels["canary"]
    assert whole.rollout is not None
    assert (whole.rollout.percent, whole.rollout.hold) == (100, None)
    assert [w.percent for w in whole.rollout.waves] == [10, 50, 100]
    assert whole.rollout.stop is not None
    # waves that end below 100 % cannot serve all devices: the rollout goes
    short = WAVES_YAML.replace("- {percent: 100}", "- {percent: 60}")
    assert short != WAVES_YAML
    bare = _load(set_channel(short, MODEL, "canary", "1.2.0", None)).spec.channels["canary"]
    assert bare.rollout is None


# --- when a wave started ---------------------------------------------------------------

TRUST = "trust/metadata"


def _model(percent: float | None, version: str = "1.1.0", extra: str = "") -> bytes:
    rollout = "" if percent is None else f", rollout: {{percent: {percent:g}{extra}}}"
    return (
        "apiVersion: modelreg/v1\nkind: RegisteredModel\nmetadata:\n  name: mlp\n"
        f"spec:\n  channels:\n    canary: {{version: {version}{rollout}}}\n"
    ).encode()


def _history(
    *steps: tuple[str, bytes | None, bool],
) -> tuple[list[LogCommit], dict[str, bytes | None]]:
    """Commits oldest first: (sha, the model.yaml it writes or None, whether it releases)."""
    commits: list[LogCommit] = []
    blobs: dict[str, bytes | None] = {}
    for i, (sha, model, release) in enumerate(steps):
        changes = []
        if model is not None:
            changes.append(("M", MODEL))
            blobs[f"{sha}:{MODEL}"] = model
        if release:
            changes.append(("A", f"{TRUST}/{i + 2}.targets.json"))
        commits.append(LogCommit(sha, "ci", f"2024-05-01T0{i}:00:00+00:00", "s", tuple(changes)))
    return commits, blobs


TEN, FIFTY = Assignment("1.1.0", 10.0), Assignment("1.1.0", 50.0)


@pytest.mark.parametrize(
    ("steps", "current", "expected"),
    [
        pytest.param([("a", _model(10), False), ("b", None, True)], TEN, "b", id="the release after the edit starts the wave"),
        pytest.param([("a", _model(10), True)], TEN, "a", id="edit and release in one commit"),
        pytest.param([("a", _model(10), False)], TEN, None, id="committed, not released"),
        pytest.param([("a", _model(10), True), ("b", _model(50), False)], FIFTY, None, id="the next wave committed, not released yet"),
        pytest.param([("a", _model(10), True), ("b", _model(50), False), ("c", None, True)], FIFTY, "c", id="the next wave released"),
        pytest.param([("a", _model(10), True), ("b", None, True), ("c", None, True)], TEN, "a", id="later releases (other models) do not restart it"),
        pytest.param([("a", _model(10), True), ("b", _model(10, extra=", hold: x, waves: []"), True)], TEN, "a", id="a rollout edit that keeps version and percent does not restart it"),
        pytest.param([("a", _model(10), True), ("b", _model(50), True), ("c", _model(10), True)], TEN, "c", id="back at a percent after a change: the newest run counts"),
        pytest.param([("a", _model(10, "1.0.0"), True), ("b", _model(10), True)], TEN, "b", id="another version at the same percent is another rollout"),
        pytest.param([("a", _model(None), True)], TEN, None, id="the release serves all devices, not the wave"),
        pytest.param([], TEN, None, id="no history"),
    ],
)  # fmt: skip
def test_released_since(
    steps: list[tuple[str, bytes | None, bool]], current: Assignment, expected: str | None
) -> None:
    commits, blobs = _history(*steps)
    found = released_since(commits, MODEL, blobs, "canary", current, released=TRUST)
    assert (found.sha if found else None) == expected


def test_released_since_without_trust_counts_every_edit() -> None:
    commits, blobs = _history(("a", _model(10), False), ("b", None, False))
    found = released_since(commits, MODEL, blobs, "canary", TEN)
    assert found is not None
    assert found.sha == "a"
    assert found.date == "2024-05-01T00:00:00+00:00"
