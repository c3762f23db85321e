"""Who must approve what in ``ci pr``, without git or GitHub (issue 13, point 5).

``approval_problems`` counts approvals itself through ``pipelines.github.
fetch_approvers`` (the one I/O call); the rows replace that call by a double with its
signature that runs the real decision (``pipelines.github.approvers``) on the row's
reviews, so a row also shows that the pull request's head and author reach it.  The
review rules themselves (latest verdict, write access) are tabled in
``tests/unit/test_github_reviews.py``.  What each change asks for is decided by
``_promotions`` (the git-free paths: new, removed and re-policied models) and by the
strictest base policy (``_BaseModels.strictest``) for configuration and trust changes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pipelines.ci import approval_problems
from pipelines.ci._pr import _BaseModels, _Promotion, _promotions
from pipelines.errors import GitHubError
from pipelines.github import Access, PullRequest, Review, approvers
from registry.config import RepoConfig
from registry.errors import Problem
from registry.loader import load_manifest
from registry.repository import ModelEntry, Repository, VersionEntry
from registry.schema import ModelVersion, RegisteredModel
from registry.yamlsrc import parse_yaml

HEAD, OLD = "a" * 40, "b" * 40
AUTHOR = "zed"
PR = PullRequest("c" * 40, "main", 7, HEAD, AUTHOR)
ENV = {"GITHUB_REPOSITORY": "acme/fleet", "GITHUB_TOKEN": "t0ken"}

MLP_AT = Problem("manifests/mlp/model.yaml", "", 7, 5, "spec.channels.production")
CNN_AT = Problem("manifests/cnn/model.yaml", "", 7, 5, "spec.channels.production")
MLP = _Promotion("promoting 'mlp'", 1, MLP_AT)
CNN = _Promotion("promoting 'cnn'", 2, CNN_AT)
FREE = _Promotion("promoting 'toy'", 0, Problem("manifests/toy/model.yaml", ""))
TRUST = _Promotion(
    "changing the trust metadata", 2, Problem("trust/metadata", ""), "changing the trust metadata"
)


def _by(name: str, state: str = "APPROVED", commit: str = HEAD, *, bot: bool = False) -> Review:
    return Review(name, state, commit, "MEMBER", bot)


WRITE = Access("write", "write")


@dataclass
class FakeGitHub:
    """``fetch_approvers`` without the network: the real decision on in-memory reviews."""

    reviews: Sequence[Review] = ()
    readers: frozenset[str] = frozenset()
    error: str | None = None
    calls: list[dict[str, object]] = field(default_factory=list)

    def fetch_approvers(
        self,
        repository: str,
        number: int,
        token: str,
        *,
        head: str,
        author: str | None,
        api: str,
    ) -> frozenset[str]:
        self.calls.append({"repository": repository, "number": number, "token": token,
                           "head": head, "author": author, "api": api})  # fmt: skip
        if self.error is not None:
            raise GitHubError(self.error)
        access = {r.reviewer: Access("read") if r.reviewer in self.readers else WRITE
                  for r in self.reviews}  # fmt: skip
        return approvers(self.reviews, access, head=head, author=author)


@pytest.fixture
def github(monkeypatch: pytest.MonkeyPatch) -> FakeGitHub:
    fake = FakeGitHub()
    monkeypatch.setattr("pipelines.github.fetch_approvers", fake.fetch_approvers)
    return fake


def _short(p: _Promotion, have: int, names: str = "") -> Problem:
    return Problem(
        p.where.file,
        f"{p.subject} needs {p.approvals} approval(s) of commit {HEAD[:12]}; it has {have}"
        + (f" ({names})" if names else ""),
        p.where.line,
        p.where.col,
        p.where.field,
    )


def _uncounted(p: _Promotion, reason: str) -> Problem:
    return Problem(
        p.where.file,
        f"cannot count the approvals {p.what} needs: {reason}",
        p.where.line,
        p.where.col,
        p.where.field,
    )


H = HEAD[:12]
WITHOUT_TOKEN_REASON = "GITHUB_TOKEN is not set; give the step `GITHUB_TOKEN: ${{ github.token }}`"  # noqa: S105 - the message, not a secret
NOT_CHECKED = "not checked (no pull request event to count approvals on)"
API_DOWN = "GitHub API unreachable at https://api.github.com: timed out"


@dataclass(frozen=True)
class Row:
    promotions: list[_Promotion]
    reviews: Sequence[Review] = ()
    expected: list[Problem] = field(default_factory=list)
    line: str = ""
    pr: PullRequest = PR
    env: Mapping[str, str] = field(default_factory=lambda: ENV)
    readers: frozenset[str] = frozenset()
    error: str | None = None
    asks: bool = True


@pytest.mark.parametrize(
    "row",
    [
        # nothing to count
        pytest.param(Row([], line="no promotion needs an approval", asks=False), id="no promotion"),
        pytest.param(Row([FREE], line="no promotion needs an approval", asks=False), id="a policy asking for no approval"),
        pytest.param(Row([MLP], pr=PullRequest("c" * 40), line=NOT_CHECKED, asks=False), id="a local run: no pull request to count on"),
        pytest.param(Row([MLP], pr=PullRequest("c" * 40, "main", 7, None, AUTHOR), line=NOT_CHECKED, asks=False), id="an event without a head commit"),
        pytest.param(Row([MLP], pr=PullRequest("c" * 40, "main", None, HEAD, AUTHOR), line=NOT_CHECKED, asks=False), id="an event without a number"),
        # cannot count: fail closed, one problem per change that needs approvals
        pytest.param(Row([MLP, FREE, TRUST], env={"GITHUB_TOKEN": "t"}, expected=[_uncounted(MLP, "GITHUB_REPOSITORY is not set"), _uncounted(TRUST, "GITHUB_REPOSITORY is not set")], line="could not be counted", asks=False), id="no repository named"),
        pytest.param(Row([MLP], env={**ENV, "GITHUB_REPOSITORY": ""}, expected=[_uncounted(MLP, "GITHUB_REPOSITORY is not set")], line="could not be counted", asks=False), id="an empty repository name"),
        pytest.param(Row([MLP], env={"GITHUB_REPOSITORY": "acme/fleet"}, expected=[_uncounted(MLP, WITHOUT_TOKEN_REASON)], line="could not be counted", asks=False), id="no token"),
        pytest.param(Row([MLP], env={**ENV, "GITHUB_TOKEN": ""}, expected=[_uncounted(MLP, WITHOUT_TOKEN_REASON)], line="could not be counted", asks=False), id="an empty token"),
        pytest.param(Row([MLP, TRUST], reviews=[_by("ann"), _by("bob")], error=API_DOWN, expected=[_uncounted(MLP, API_DOWN), _uncounted(TRUST, API_DOWN)], line="could not be counted"), id="the API fails: approvals given do not count"),
        # counted
        pytest.param(Row([MLP], [_by("ann")], line=f"1 approval(s) of {H} (ann)"), id="one of one"),
        pytest.param(Row([MLP], [], [_short(MLP, 0)], f"awaiting 1 more; 0 approval(s) of {H} (none)"), id="none of one"),
        pytest.param(Row([CNN], [_by("bob"), _by("ann")], line=f"2 approval(s) of {H} (ann, bob)"), id="two of two, names sorted"),
        pytest.param(Row([CNN], [_by("ann")], [_short(CNN, 1, "ann")], f"awaiting 1 more; 1 approval(s) of {H} (ann)"), id="short by one"),
        pytest.param(Row([CNN], [_by("ann"), _by("bob"), _by("cat")], line=f"3 approval(s) of {H} (ann, bob, cat)"), id="more than enough"),
        pytest.param(Row([MLP, CNN], [_by("ann")], [_short(CNN, 1, "ann")], f"awaiting 1 more; 1 approval(s) of {H} (ann)"), id="two changes: only the one short is a problem"),
        pytest.param(Row([MLP, TRUST], [], [_short(MLP, 0), _short(TRUST, 0)], f"awaiting 2 more; 0 approval(s) of {H} (none)"), id="awaiting counts against the highest bar"),
        pytest.param(Row([FREE, MLP], [_by("ann")], line=f"1 approval(s) of {H} (ann)"), id="a change needing none is not counted"),
        # approvals that do not count
        pytest.param(Row([MLP], [_by(AUTHOR)], [_short(MLP, 0)], f"awaiting 1 more; 0 approval(s) of {H} (none)"), id="the author's own approval"),
        pytest.param(Row([MLP], [_by("dependabot", bot=True)], [_short(MLP, 0)], f"awaiting 1 more; 0 approval(s) of {H} (none)"), id="a bot's approval"),
        pytest.param(Row([MLP], [_by("ann", commit=OLD)], [_short(MLP, 0)], f"awaiting 1 more; 0 approval(s) of {H} (none)"), id="a stale approval (before the last push)"),
        pytest.param(Row([MLP], [_by("ann"), _by("ann", "CHANGES_REQUESTED")], [_short(MLP, 0)], f"awaiting 1 more; 0 approval(s) of {H} (none)"), id="an approval taken back"),
        pytest.param(Row([MLP], [_by("ann"), _by("ann", "DISMISSED")], [_short(MLP, 0)], f"awaiting 1 more; 0 approval(s) of {H} (none)"), id="an approval dismissed"),
        pytest.param(Row([MLP], [_by("ann"), _by("ann", "COMMENTED")], line=f"1 approval(s) of {H} (ann)"), id="a later comment keeps the approval"),
        pytest.param(Row([MLP], [_by("ann")], [_short(MLP, 0)], f"awaiting 1 more; 0 approval(s) of {H} (none)", readers=frozenset({"ann"})), id="an approval without write access"),
        pytest.param(Row([CNN], [_by("ann"), _by("ann"), _by("ann")], [_short(CNN, 1, "ann")], f"awaiting 1 more; 1 approval(s) of {H} (ann)"), id="one reviewer approving twice counts once"),
    ],
)  # fmt: skip
def test_approval_problems(github: FakeGitHub, row: Row) -> None:
    github.reviews, github.readers, github.error = row.reviews, row.readers, row.error
    problems, line = approval_problems(row.promotions, row.pr, row.env)
    assert problems == row.expected
    assert line == row.line
    assert bool(github.calls) == row.asks


@pytest.mark.parametrize(
    ("env", "api"),
    [
        pytest.param(ENV, "https://api.github.com", id="github.com by default"),
        pytest.param({**ENV, "GITHUB_API_URL": ""}, "https://api.github.com", id="an empty API URL"),
        pytest.param({**ENV, "GITHUB_API_URL": "https://ghe.example/api/v3"}, "https://ghe.example/api/v3", id="GitHub Enterprise"),
    ],
)  # fmt: skip
def test_approvals_are_asked_of_the_event_pull_request(
    github: FakeGitHub, env: Mapping[str, str], api: str
) -> None:
    approval_problems([MLP], PR, env)
    assert github.calls == [{
        "repository": "acme/fleet", "number": 7, "token": "t0ken", "head": HEAD,
        "author": AUTHOR, "api": api,
    }]  # fmt: skip


# --- the bar: the strictest base policy, for configuration and trust changes ------------


def _model(
    name: str,
    approvals: int | None = None,
    *,
    channels: Mapping[str, object] | None = None,
    promotion: Mapping[str, object] | None = None,
) -> RegisteredModel:
    policy = {**(promotion or {})} | ({"approvals": approvals} if approvals is not None else {})
    return RegisteredModel.model_validate({
        "apiVersion": "modelreg/v1", "kind": "RegisteredModel", "metadata": {"name": name},
        "spec": {"channels": dict(channels or {}), "promotion": policy},
    })  # fmt: skip


@pytest.mark.parametrize(
    ("approvals", "broken", "bar"),
    [
        pytest.param([], set(), 1, id="no model on the base: one"),
        pytest.param([None], set(), 1, id="the default policy: one"),
        pytest.param([0, 0], set(), 0, id="every base policy asks for none"),
        pytest.param([0, 3, 2], set(), 3, id="the strictest policy wins"),
        pytest.param([0], {"bad"}, 1, id="an unreadable policy does not lower the bar below one"),
        pytest.param([3], {"bad"}, 3, id="an unreadable policy does not lower a higher bar"),
        pytest.param([], {"bad"}, 1, id="only unreadable policies: one"),
    ],
)  # fmt: skip
def test_strictest_base_policy(approvals: list[int | None], broken: set[str], bar: int) -> None:
    models = {f"m{i}": _model(f"m{i}", a) for i, a in enumerate(approvals)}
    assert _BaseModels(models, frozenset(broken)).strictest == bar


# --- what a model's change asks for (_promotions, the paths that read no git) ----------

CONFIG = RepoConfig.model_validate({"apiVersion": "modelreg/v1", "kind": "RegistryConfig"})
ROOT = Path("/nowhere")


def _yaml_of(manifest: RegisteredModel) -> str:
    spec = manifest.spec
    lines = ["apiVersion: modelreg/v1", "kind: RegisteredModel", "metadata:",
             f"  name: {manifest.metadata.name}", "spec:", "  channels:"]  # fmt: skip
    for channel, a in spec.channels.items():
        rollout = f", rollout: {{percent: {a.rollout.percent}}}" if a.rollout else ""
        lines.append(f"    {channel}: {{version: {a.version}{rollout}}}")
    if not spec.channels:
        lines[-1] += " {}"
    order = ", ".join(spec.promotion.order)
    lines += ["  promotion:", f"    order: [{order}]", f"    branch: {spec.promotion.branch}",
              f"    approvals: {spec.promotion.approvals}"]  # fmt: skip
    return "\n".join(lines) + "\n"


def _entry(manifest: RegisteredModel) -> ModelEntry:
    name = manifest.metadata.name
    file = f"manifests/{name}/model.yaml"
    doc = parse_yaml(_yaml_of(manifest).encode(), file)
    loaded = load_manifest(doc, "RegisteredModel")
    assert loaded == manifest
    assert isinstance(loaded, RegisteredModel)
    return ModelEntry(name, file, ROOT / file, doc, loaded)


def _version(name: str, version: str) -> VersionEntry:
    file = f"manifests/{name}/versions/{version}.yaml"
    text = (
        f"apiVersion: modelreg/v1\nkind: ModelVersion\nmetadata: {{name: {name}, version: {version}}}\n"
        f"spec:\n  artifact: {{path: models/{name}/{version}.onnx, format: onnx}}\n"
    )
    doc = parse_yaml(text.encode(), file)
    manifest = load_manifest(doc, "ModelVersion")
    assert isinstance(manifest, ModelVersion)
    return VersionEntry(name, version, file, ROOT / file, doc, manifest)


def _repo(*models: RegisteredModel) -> Repository:
    entries = {m.metadata.name: _entry(m) for m in models}
    versions = {name: {v: _version(name, v) for v in ("1.0.0", "1.1.0")} for name in entries}
    return Repository(ROOT, CONFIG, models=entries, versions=versions)


ORDER = {"order": ["canary", "production"]}
SERVING = {"canary": "1.1.0", "production": "1.0.0"}
BASE = _model("mlp", 2, channels=SERVING, promotion=ORDER)


def _at(field_: str, line: int, col: int) -> Problem:
    return Problem("manifests/mlp/model.yaml", "", line, col, field_)


@dataclass(frozen=True)
class Change:
    head: tuple[RegisteredModel, ...]
    base: tuple[RegisteredModel, ...]
    promotions: list[_Promotion]
    problems: list[str] = field(default_factory=list)
    target: str | None = "main"


# In _yaml_of's layout the first channel is on line 7 (its mapping at column 5, its
# value after the name), the promotion block one line after the last channel.
@pytest.mark.parametrize(
    "change",
    [
        pytest.param(Change((BASE,), (BASE,), []), id="nothing changed"),
        pytest.param(Change((_model("mlp", 2, channels={"canary": {"version": "1.1.0", "rollout": {"percent": 50}}, "production": "1.0.0"}, promotion=ORDER),), (BASE,), []), id="a rollout step needs no approval"),
        pytest.param(Change((_model("mlp", 0, channels=SERVING, promotion=ORDER),), (BASE,), [_Promotion("promoting 'mlp'", 2, _at("spec.promotion", 10, 5))]), id="lowering approvals: the base's bar still applies"),
        pytest.param(Change((_model("mlp", 3, channels=SERVING, promotion=ORDER),), (BASE,), [_Promotion("promoting 'mlp'", 3, _at("spec.promotion", 10, 5))]), id="raising approvals: the new bar applies already"),
        pytest.param(Change((_model("mlp", 2, channels=SERVING, promotion={"order": ["production"]}),), (BASE,), [_Promotion("promoting 'mlp'", 2, _at("spec.promotion", 10, 5))]), id="shortening the order is a promotion"),
        pytest.param(Change((_model("mlp", 2, channels=SERVING, promotion={**ORDER, "branch": "dev"}),), (BASE,), [_Promotion("promoting 'mlp'", 2, _at("spec.promotion", 10, 5))]), id="moving the promotion branch is a promotion"),
        pytest.param(Change((_model("mlp", 2, channels={"canary": "1.1.0"}, promotion=ORDER),), (BASE,), [_Promotion("promoting 'mlp'", 2, _at("spec.channels", 7, 5))]), id="removing a channel is a promotion"),
        pytest.param(Change((_model("mlp", 0, channels={"canary": "1.1.0"}, promotion=ORDER),), (BASE,), [_Promotion("promoting 'mlp'", 2, _at("spec.channels", 7, 5))]), id="removing a channel while lowering the bar"),
        pytest.param(Change((_model("mlp", 2, channels={"canary": "1.1.0"}, promotion=ORDER),), (BASE,), [_Promotion("promoting 'mlp'", 2, _at("spec.channels", 7, 5))], ["manifests/mlp/model.yaml:7:5: spec.channels: promotions of 'mlp' must target branch 'main', not 'release'"], "release"), id="a promotion targeting another branch"),
        pytest.param(Change((_model("mlp", 2, channels={"canary": "1.1.0"}, promotion=ORDER),), (BASE,), [_Promotion("promoting 'mlp'", 2, _at("spec.channels", 7, 5))], [], None), id="target branch unknown: not judged"),
        pytest.param(Change((), (BASE,), [_Promotion("removing 'mlp'", 2, Problem("/nowhere/manifests/mlp", ""), "this removal")]), id="removing a model that has channels"),
        pytest.param(Change((), (_model("mlp", 2, promotion=ORDER),), []), id="removing a model without channels"),
        pytest.param(Change((_model("mlp", 1, channels={"canary": "1.0.0"}, promotion=ORDER),), (), [_Promotion("promoting 'mlp'", 1, _at("spec.channels.canary", 7, 13))]), id="a new model: its own policy"),
        pytest.param(Change((_model("mlp", 1, channels={"production": "1.0.0"}, promotion=ORDER),), (), [_Promotion("promoting 'mlp'", 1, _at("spec.channels.production", 7, 17))], ["manifests/mlp/model.yaml:7:17: spec.channels.production: version 1.0.0 must be promoted to 'canary' before 'production' (promotion order: canary, production)"]), id="a new model starts from no channel"),
        pytest.param(Change((_model("mlp", 1, channels={"canary": "3.0.0"}, promotion=ORDER),), (), [_Promotion("promoting 'mlp'", 1, _at("spec.channels.canary", 7, 13))], ["manifests/mlp/model.yaml:7:13: spec.channels.canary: version 3.0.0 is not declared for model 'mlp' (declared: 1.0.0, 1.1.0)"]), id="a new model serving an undeclared version"),
        pytest.param(Change((_model("mlp", 1, promotion=ORDER),), (), []), id="a new model without channels"),
    ],
)  # fmt: skip
def test_promotions(change: Change) -> None:
    repo = _repo(*change.head)
    on_base = _BaseModels({m.metadata.name: m for m in change.base}, frozenset())
    pr = PullRequest("c" * 40, change.target, 7, HEAD, AUTHOR)
    problems, promotions, _ = _promotions(repo, pr, on_base, CONFIG)
    assert promotions == change.promotions
    assert [str(p) for p in problems] == change.problems
