"""The release's decisions without I/O (issue 13, point 5): which online roles a
release signs (``plan_release``) and which channel changes a branch may release
(``branch_problems``).  Each row builds its inputs in memory and names the exact
outcome: the roles in signing order, the error, or the problems."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from tuf.api.metadata import MetaFile, Signed

from pipelines.publish import branch_problems
from registry.config import RepoConfig
from registry.errors import Problem
from registry.loader import load_manifest
from registry.repository import ModelEntry, Repository
from registry.schema import RegisteredModel
from registry.yamlsrc import parse_yaml
from signing.errors import KeyMaterialError
from signing.tuf_facts import ChannelEntry, ChannelsDoc
from signing.tuf_roles import (
    ONLINE_ROLES,
    Expiry,
    build_snapshot,
    build_targets,
    build_timestamp,
    plan_release,
)

# --- plan_release -------------------------------------------------------------------------

NOW = datetime(2025, 3, 1, 12, tzinfo=UTC)
EXPIRY = Expiry()  # targets 90 days, snapshot 7, timestamp 1
ALL = frozenset(ONLINE_ROLES)
SECOND = timedelta(seconds=1)
FRESH = "fresh"
"""A role signed just now: it expires a whole period from now."""


def _signed(role: str, expires: datetime) -> Signed:
    if role == "targets":
        return build_targets(1, expires, {})
    if role == "snapshot":
        return build_snapshot(1, expires, MetaFile(1))
    return build_timestamp(1, expires, MetaFile(1))


def _current(left: Mapping[str, timedelta | str | None]) -> dict[str, Signed | None]:
    """Each role fresh unless ``left`` says how long it has left (None: not signed yet)."""
    out: dict[str, Signed | None] = {}
    for role in ONLINE_ROLES:
        value = left.get(role, FRESH)
        if value is None:
            continue
        remaining = EXPIRY.period(role) if value == FRESH else value
        assert isinstance(remaining, timedelta)
        out[role] = _signed(role, NOW + remaining)
    return out


DAY, HOURS_12 = timedelta(days=1), timedelta(hours=12)


@pytest.mark.parametrize(
    ("left", "options", "expected"),
    [
        pytest.param({}, {}, (), id="all fresh, nothing changed: nothing signed"),
        pytest.param(dict.fromkeys(ONLINE_ROLES), {}, ONLINE_ROLES, id="first release: every role"),
        pytest.param({}, {"targets_changed": True}, ONLINE_ROLES, id="new targets: targets, then the roles that list it"),
        pytest.param({}, {"force": {"targets"}}, ONLINE_ROLES, id="targets forced (key replaced): the listers follow"),
        pytest.param({}, {"force": {"snapshot"}}, ("snapshot", "timestamp"), id="snapshot forced: targets left alone"),
        pytest.param({}, {"force": {"timestamp"}}, ("timestamp",), id="timestamp forced: only it"),
        pytest.param({}, {"force": {"root"}}, (), id="forcing an offline role changes no online role"),
        pytest.param({"targets": None}, {}, ONLINE_ROLES, id="targets missing"),
        pytest.param({"snapshot": None}, {}, ("snapshot", "timestamp"), id="snapshot missing"),
        pytest.param({"timestamp": None}, {}, ("timestamp",), id="timestamp missing"),
        # must re-sign because of expiry (renew_early off isolates the "must" rule)
        pytest.param({"timestamp": timedelta(0)}, {"renew_early": False}, ("timestamp",), id="timestamp expiring right now: must"),
        pytest.param({"timestamp": -DAY}, {"renew_early": False}, ("timestamp",), id="timestamp expired a day ago: must"),
        pytest.param({"timestamp": SECOND}, {"renew_early": False}, (), id="timestamp valid one more second: need not"),
        pytest.param({"timestamp": HOURS_12}, {"renew_early": False}, (), id="timestamp within the horizon is not judged by it"),
        pytest.param({"snapshot": DAY - SECOND}, {"renew_early": False}, ("snapshot", "timestamp"), id="snapshot would expire before a new timestamp: must"),
        pytest.param({"snapshot": DAY}, {"renew_early": False}, (), id="snapshot expires with a new timestamp: need not"),
        pytest.param({"targets": DAY - SECOND}, {"renew_early": False}, ONLINE_ROLES, id="targets would expire before a new timestamp: must"),
        pytest.param({"targets": DAY}, {"renew_early": False}, (), id="targets expires with a new timestamp: need not"),
        pytest.param({"targets": -DAY}, {"renew_early": False}, ONLINE_ROLES, id="targets expired: must"),
        # renewing early: less than half of the period left
        pytest.param({"targets": timedelta(days=45) - SECOND}, {}, ONLINE_ROLES, id="targets under half its period: renewed"),
        pytest.param({"targets": timedelta(days=45)}, {}, (), id="targets at exactly half its period: not yet"),
        pytest.param({"targets": timedelta(days=45) - SECOND}, {"renew_early": False}, (), id="targets under half, renew_early off: left alone"),
        pytest.param({"snapshot": timedelta(days=3, hours=12) - SECOND}, {}, ("snapshot", "timestamp"), id="snapshot under half its period: renewed"),
        pytest.param({"timestamp": HOURS_12 - SECOND}, {}, ("timestamp",), id="timestamp under half its period: renewed"),
        pytest.param({"timestamp": HOURS_12}, {}, (), id="timestamp at exactly half its period: not yet"),
        # keys at hand
        pytest.param({"targets": timedelta(days=10)}, {"can_sign": {"snapshot", "timestamp"}}, (), id="renewal due without the targets key: skipped, nothing else moves"),
        pytest.param({"snapshot": timedelta(days=1, hours=1)}, {"can_sign": {"targets", "timestamp"}}, (), id="snapshot renewal due without its key: skipped"),
        pytest.param({}, {"can_sign": set()}, (), id="no keys and nothing to do: no error"),
        pytest.param({"timestamp": -DAY}, {"can_sign": {"timestamp"}}, ("timestamp",), id="the timestamp key alone refreshes the timestamp"),
    ],
)  # fmt: skip
def test_plan_release(
    left: Mapping[str, timedelta | str | None],
    options: Mapping[str, object],
    expected: tuple[str, ...],
) -> None:
    can_sign = options.get("can_sign", ALL)
    force = options.get("force", frozenset())
    assert isinstance(can_sign, set | frozenset)
    assert isinstance(force, set | frozenset)
    plan = plan_release(
        _current(left),
        now=NOW,
        expiry=EXPIRY,
        can_sign=can_sign,
        targets_changed=options.get("targets_changed") is True,
        force=force,
        renew_early=options.get("renew_early", True) is True,
    )
    assert plan == expected


@pytest.mark.parametrize(
    ("left", "can_sign", "targets_changed", "missing"),
    [
        pytest.param({"targets": None}, {"snapshot", "timestamp"}, False, "targets", id="targets missing, no targets key"),
        pytest.param({}, {"snapshot", "timestamp"}, True, "targets", id="new targets, no targets key"),
        pytest.param({}, {"targets", "timestamp"}, True, "snapshot", id="new targets, no snapshot key to list them"),
        pytest.param({}, {"targets", "snapshot"}, True, "timestamp", id="new targets, no timestamp key to list the snapshot"),
        pytest.param({"timestamp": timedelta(0)}, {"targets", "snapshot"}, False, "timestamp", id="timestamp expired, no timestamp key"),
        pytest.param({"snapshot": HOURS_12}, {"targets", "timestamp"}, False, "snapshot", id="snapshot expiring before the horizon, no snapshot key"),
    ],
)  # fmt: skip
def test_plan_release_refuses_a_role_it_must_sign_without_its_key(
    left: Mapping[str, timedelta | None],
    can_sign: set[str],
    targets_changed: bool,
    missing: str,
) -> None:
    with pytest.raises(KeyMaterialError) as info:
        plan_release(
            _current(left),
            now=NOW,
            expiry=EXPIRY,
            can_sign=can_sign,
            targets_changed=targets_changed,
        )
    assert str(info.value) == f"{missing} metadata must be re-signed: no {missing} key given"


@pytest.mark.parametrize(
    "left",
    [
        pytest.param(dict.fromkeys(ONLINE_ROLES), id="first release"),
        pytest.param({"targets": timedelta(days=10)}, id="targets renewed early"),
        pytest.param({"timestamp": -DAY, "snapshot": SECOND}, id="snapshot and timestamp expired"),
    ],
)
def test_planning_twice_plans_nothing_the_second_time(
    left: Mapping[str, timedelta | None],
) -> None:
    current = _current(left)
    plan = plan_release(current, now=NOW, expiry=EXPIRY, can_sign=ALL)
    assert plan
    signed = {**current, **{r: _signed(r, NOW + EXPIRY.period(r)) for r in plan}}
    assert plan_release(signed, now=NOW, expiry=EXPIRY, can_sign=ALL) == ()


# --- branch_problems ----------------------------------------------------------------------

CONFIG = RepoConfig.model_validate({"apiVersion": "modelreg/v1", "kind": "RegistryConfig"})


def _entry(name: str, branch: str) -> ModelEntry:
    text = (
        f"apiVersion: modelreg/v1\nkind: RegisteredModel\nmetadata:\n  name: {name}\n"
        f"spec:\n  channels:\n    production: 1.0.0\n  promotion:\n    branch: {branch}\n"
    )
    file = f"manifests/{name}/model.yaml"
    doc = parse_yaml(text.encode(), file)
    manifest = load_manifest(doc, "RegisteredModel")
    assert isinstance(manifest, RegisteredModel)
    return ModelEntry(name, file, Path("/nowhere") / file, doc, manifest)


# Channels are at line 7, column 5 of every model's file (see _entry).
REPO = Repository(
    Path("/nowhere"),
    CONFIG,
    models={"mlp": _entry("mlp", "main"), "cnn": _entry("cnn", "release")},
)
Desired = dict[str, dict[str, tuple[str, float | None]]]
SIGNED = ChannelsDoc(
    sequence=3,
    models={
        "mlp": {
            "production": ChannelEntry(version="1.0.0", sequence=1),
            "canary": ChannelEntry(version="1.1.0", percent=10, sequence=3),
        },
        "cnn": {"production": ChannelEntry(version="2.0.0", sequence=2)},
    },
)
AS_SIGNED: Desired = {
    "mlp": {"production": ("1.0.0", None), "canary": ("1.1.0", 10)},
    "cnn": {"production": ("2.0.0", None)},
}
MLP_MOVED: Desired = {**AS_SIGNED, "mlp": {"production": ("1.1.0", None), "canary": ("1.1.0", 10)}}
CNN_MOVED: Desired = {**AS_SIGNED, "cnn": {"production": ("2.1.0", None)}}


def _off(name: str, allowed: str, here: str) -> Problem:
    return Problem(
        f"manifests/{name}/model.yaml",
        f"channel changes of {name!r} are released from branch {allowed!r} only, not from {here}",
        7,
        5,
        "spec.channels",
    )


DETACHED = "a detached HEAD or a ref that is not a branch"


@pytest.mark.parametrize(
    ("previous", "desired", "branch", "expected"),
    [
        pytest.param(SIGNED, AS_SIGNED, "feature", [], id="nothing moves: any branch may release"),
        pytest.param(SIGNED, AS_SIGNED, None, [], id="nothing moves: a detached HEAD may release"),
        pytest.param(SIGNED, MLP_MOVED, "main", [], id="a move on the model's promotion branch"),
        pytest.param(SIGNED, MLP_MOVED, "feature", [_off("mlp", "main", "branch 'feature'")], id="a move off the promotion branch"),
        pytest.param(SIGNED, MLP_MOVED, None, [_off("mlp", "main", DETACHED)], id="a move from a detached HEAD"),
        pytest.param(SIGNED, MLP_MOVED, "Main", [_off("mlp", "main", "branch 'Main'")], id="branch names compare exactly"),
        pytest.param(SIGNED, MLP_MOVED, "", [_off("mlp", "main", DETACHED)], id="an empty branch name is no branch"),
        pytest.param(SIGNED, {**AS_SIGNED, "mlp": {"production": ("1.0.0", None), "canary": ("1.1.0", 25)}}, "feature", [_off("mlp", "main", "branch 'feature'")], id="a rollout step is a channel change"),
        pytest.param(SIGNED, {**AS_SIGNED, "mlp": {"production": ("1.0.0", None), "canary": ("1.1.0", 50)}}, "main", [], id="a wave advance (fleet advance) on the promotion branch"),
        pytest.param(SIGNED, {**AS_SIGNED, "mlp": {"production": ("1.0.0", None)}}, "feature", [_off("mlp", "main", "branch 'feature'")], id="a channel removed is a channel change"),
        pytest.param(SIGNED, {**AS_SIGNED, "mlp": {**AS_SIGNED["mlp"], "dev": ("1.2.0", None)}}, "feature", [_off("mlp", "main", "branch 'feature'")], id="a channel added is a channel change"),
        pytest.param(SIGNED, CNN_MOVED, "main", [_off("cnn", "release", "branch 'main'")], id="each model has its own promotion branch"),
        pytest.param(SIGNED, CNN_MOVED, "release", [], id="the other model's branch releases it"),
        pytest.param(SIGNED, {**MLP_MOVED, "cnn": CNN_MOVED["cnn"]}, "feature", [_off("cnn", "release", "branch 'feature'"), _off("mlp", "main", "branch 'feature'")], id="both moved off branch: one problem each, by name"),
        pytest.param(SIGNED, {**MLP_MOVED, "cnn": CNN_MOVED["cnn"]}, "main", [_off("cnn", "release", "branch 'main'")], id="both moved on one model's branch: the other refused"),
        pytest.param(None, AS_SIGNED, "main", [_off("cnn", "release", "branch 'main'")], id="first release: every channel is new"),
        pytest.param(None, {"mlp": {}, "cnn": {}}, "feature", [], id="first release without channels: nothing moves"),
        pytest.param(ChannelsDoc(sequence=0), {"mlp": {"production": ("1.0.0", None)}}, "feature", [_off("mlp", "main", "branch 'feature'")], id="a model new to the signed channels"),
        pytest.param(SIGNED, {}, "feature", [], id="no desired channels: nothing to judge"),
    ],
)  # fmt: skip
def test_branch_problems(
    previous: ChannelsDoc | None, desired: Desired, branch: str | None, expected: list[Problem]
) -> None:
    assert branch_problems(REPO, previous, desired, branch) == expected


def test_a_model_removed_off_the_promotion_branch_is_a_channel_change() -> None:
    # Emptying cnn's channels is refused off its branch (the row above proves the rule
    # applies); deleting the model does the same to the devices, and must be too.
    emptied = branch_problems(REPO, SIGNED, {**AS_SIGNED, "cnn": {}}, "feature")
    assert emptied == [_off("cnn", "release", "branch 'feature'")]
    # cnn's folder deleted: the repository (so ``desired``) no longer has it
    without = Repository(Path("/nowhere"), CONFIG, models={"mlp": REPO.models["mlp"]})
    removed = branch_problems(without, SIGNED, {"mlp": AS_SIGNED["mlp"]}, "feature")
    assert [p.file for p in removed] == [f"{CONFIG.manifests}/cnn/model.yaml"]
    assert "'cnn' is deleted but its channels are released" in removed[0].message
    # Its policy went with it: no branch may release that, not even its own.
    for branch in ("main", "release"):
        again = branch_problems(without, SIGNED, {"mlp": AS_SIGNED["mlp"]}, branch)
        assert [p.message for p in again] == [removed[0].message]
    # A model deleted once its channels were emptied (released so) is no change.
    emptied_doc = ChannelsDoc(sequence=SIGNED.sequence + 1, models={**SIGNED.models, "cnn": {}})
    assert branch_problems(without, emptied_doc, {"mlp": AS_SIGNED["mlp"]}, "feature") == []
