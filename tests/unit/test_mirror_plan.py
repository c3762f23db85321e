"""``reconcile``, the MLflow mirror's decision, without MLflow: each case a Git state,
what MLflow holds, and the drift and actions that must follow (issue 13, point 5)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest

from pipelines.register._plan import (
    TAG_DEPRECATED,
    TAG_PARENT,
    TAG_SEMVER,
    TAG_SHA256,
    CreateModel,
    CreateVersion,
    DeleteAlias,
    DeleteTags,
    DesiredModel,
    DesiredVersion,
    LogMetrics,
    ObservedModel,
    ObservedVersion,
    SetAlias,
    SetModelDescription,
    SetTags,
    SetVersionDescription,
    mirrorable_metric,
    reconcile,
)

A, B = "a" * 64, "b" * 64


def _want(semver: str, sha: str, **extra: str) -> DesiredVersion:
    absent = frozenset({TAG_PARENT, TAG_DEPRECATED} - set(extra))
    return DesiredVersion(semver, {TAG_SEMVER: semver, TAG_SHA256: sha, **extra}, absent)


def _have(number: str, semver: str | None, sha: str, **extra: str) -> ObservedVersion:
    tags = {TAG_SHA256: sha, **extra} | ({TAG_SEMVER: semver} if semver else {})
    return ObservedVersion(number, tags)


def _mirror(versions: tuple[ObservedVersion, ...], aliases: Mapping[str, str]) -> ObservedModel:
    return ObservedModel("mlp", exists=True, versions=versions, aliases=aliases)


DESIRED = DesiredModel(
    "mlp",
    {"1.0.0": _want("1.0.0", A), "1.1.0": _want("1.1.0", B, **{TAG_PARENT: "1.0.0"})},
    {"production": "1.0.0", "canary": "1.1.0"},
)
MIRRORED = ObservedModel(
    "mlp",
    exists=True,
    versions=(_have("1", "1.0.0", A), _have("2", "1.1.0", B, **{TAG_PARENT: "1.0.0"})),
    aliases={"production": "1", "canary": "2"},
)


def _measured(**metrics: float) -> DesiredModel:
    """DESIRED with 1.1.0 described and measured."""
    v11 = DESIRED.versions["1.1.0"]
    measured = DesiredVersion(
        "1.1.0", v11.tags, v11.absent, description="night recall", metrics=metrics
    )
    return DesiredModel("mlp", {**DESIRED.versions, "1.1.0": measured}, DESIRED.aliases)


def _ran(metrics: Mapping[str, float] | None, description: str = "night recall") -> ObservedModel:
    """MIRRORED with 1.1.0's run (``r2``) holding ``metrics`` (None: no run)."""
    v2 = MIRRORED.versions[1]
    run = None if metrics is None else "r2"
    have = ObservedVersion(v2.number, v2.tags, run, description=description, metrics=metrics)
    return _mirror((MIRRORED.versions[0], have), MIRRORED.aliases)


@dataclass(frozen=True)
class Case:
    observed: ObservedModel
    kinds: list[str]
    actions: list[object]
    desired: DesiredModel = DESIRED
    fixable: list[bool] = field(default_factory=list)


CASES = {
    "in sync": Case(MIRRORED, [], []),
    "nothing registered yet": Case(
        ObservedModel("mlp", exists=False),
        ["model-missing", "version-missing", "version-missing", "alias-missing", "alias-missing"],
        [CreateModel(), CreateVersion("1.0.0"), CreateVersion("1.1.0"),
         SetAlias("canary", "1.1.0"), SetAlias("production", "1.0.0")],
    ),
    "an alias moved by hand, another added": Case(
        _mirror(MIRRORED.versions, {"production": "2", "canary": "2",
                                                       "staging": "1"}),
        ["alias-moved", "alias-extra"],
        [SetAlias("production", "1.0.0"), DeleteAlias("staging")],
    ),
    "a semver tag edited: paired by digest": Case(
        _mirror((_have("1", "9.9.9", A), MIRRORED.versions[1]),
                      MIRRORED.aliases),
        ["tag-differs"],
        [SetTags("1.0.0", "1", {TAG_SEMVER: "1.0.0"})],
    ),
    "a version no manifest declares is never deleted": Case(
        _mirror((*MIRRORED.versions, _have("3", None, "c" * 64)),
                      MIRRORED.aliases),
        ["version-unknown"],
        [],
        fixable=[False],
    ),
    "registered twice: the first kept, the rest for a human": Case(
        _mirror((*MIRRORED.versions, _have("3", "1.0.0", A)),
                      MIRRORED.aliases),
        ["version-duplicate"],
        [],
        fixable=[False],
    ),
    "a tag Git says must not exist": Case(
        _mirror((_have("1", "1.0.0", A, **{TAG_PARENT: "0.9.0"}),
                                    MIRRORED.versions[1]), MIRRORED.aliases),
        ["tag-unexpected"],
        [DeleteTags("1.0.0", "1", (TAG_PARENT,))],
    ),
    "a deprecation to mirror": Case(
        MIRRORED,
        ["tag-missing"],
        [SetTags("1.0.0", "1", {TAG_DEPRECATED: "leaks PII"})],
        desired=DesiredModel(
            "mlp",
            {**DESIRED.versions, "1.0.0": _want("1.0.0", A, **{TAG_DEPRECATED: "leaks PII"})},
            DESIRED.aliases,
        ),
    ),
    "a channel on a version whose manifest is not committed": Case(
        MIRRORED,
        ["alias-unreleased"],
        [],
        desired=DesiredModel("mlp", DESIRED.versions, {**DESIRED.aliases, "beta": "2.0.0"},
                             frozenset({"2.0.0"})),
        fixable=[False],
    ),
    "a description and metrics to mirror onto a version registered before": Case(
        _ran({}, description=""),
        ["description-differs", "metric-missing", "metric-missing"],
        [SetVersionDescription("1.1.0", "2", "night recall"),
         LogMetrics("1.1.0", "2", "r2", {"acc": 0.9, "f1": 0.8})],
        desired=_measured(acc=0.9, f1=0.8),
    ),
    "a metric changed by hand is set back; one logged by hand stays, reported": Case(
        _ran({"acc": 0.99, "f1": 0.8, "loss": 0.1}),
        ["metric-differs", "metric-unexpected"],
        [LogMetrics("1.1.0", "2", "r2", {"acc": 0.9})],
        desired=_measured(acc=0.9, f1=0.8),
        fixable=[True, False],
    ),
    "metrics for a version with no run": Case(
        _ran(None),
        ["metric-missing"],
        [],
        desired=_measured(acc=0.9),
        fixable=[False],
    ),
    "a metric name MLflow refuses is reported, the others mirrored": Case(
        _ran({"acc": 0.9}),
        ["metric-unmirrorable"],
        [],
        desired=_measured(acc=0.9, **{"top-1@night": 0.7}),
        fixable=[False],
    ),
    "the model's description edited in MLflow": Case(
        ObservedModel("mlp", exists=True, versions=MIRRORED.versions,
                      aliases=MIRRORED.aliases, description="edited"),
        ["description-differs"],
        [SetModelDescription("")],
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", list(CASES))
def test_reconcile(name: str) -> None:
    case = CASES[name]
    result = reconcile(case.desired, case.observed)
    assert [d.kind for d in result.drifts] == case.kinds
    assert list(result.actions) == case.actions
    if case.fixable:
        assert [d.fixable for d in result.drifts] == case.fixable
    for drift in result.drifts:
        assert "\n" not in str(drift)
        assert str(drift).startswith("mlp")


def test_the_numbers_name_each_version_mlflow_holds() -> None:
    assert reconcile(DESIRED, MIRRORED).numbers == {"1.0.0": "1", "1.1.0": "2"}
    assert reconcile(DESIRED, ObservedModel("mlp", exists=False)).numbers == {}


@pytest.mark.parametrize(
    ("name", "ok"),
    [("accuracy", True), ("eval/top-1 at 5", True), ("a:b", True), ("top-1@night", False),
     ("a//b", False), ("./a", False), ("/a", False), (".", False), ("", False)],
)  # fmt: skip
def test_metric_names_follow_mlflows_rule(name: str, ok: bool) -> None:
    assert mirrorable_metric(name) is ok
