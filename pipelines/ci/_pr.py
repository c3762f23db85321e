"""``modelreg ci pr``: a reviewer's questions about a pull request, answered in one comment.

Are the manifests valid, does every promotion follow its model's policy (read from the
base branch, never from the pull request), who must approve it, do the changed versions
load and pass their goldens, and what changed against their parents.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Final

from pipelines.build import BuildRecord, build
from pipelines.ci._base import trust_folder_moved
from pipelines.ci._report import CiReport, failed, write_outputs
from pipelines.context import ReleaseContext
from pipelines.diff import base_json, base_markdown, diff_against_base
from pipelines.errors import BuildError
from pipelines.github import PullRequest
from registry.cache import untrusted_checkout
from registry.config import CONFIG_FILE, RepoConfig
from registry.errors import ManifestError, Problem, RegistryError, UsageError
from registry.gitinfo import git
from registry.history import channel_history
from registry.layout import model_dir, model_file, parse_manifest_path, version_file
from registry.loader import load_manifest
from registry.policy import ChannelMove, channel_move, promotion_violations
from registry.render import md_code, md_code_block
from registry.repository import ModelEntry, Repository, VersionEntry
from registry.schema import RegisteredModel
from registry.yamlsrc import parse_yaml
from signing.tuf_facts import TargetFacts
from signing.tuf_repo import TrustRepo


@dataclass(frozen=True)
class _BaseModels:
    """The models as they stood on the base commit.

    Attributes:
        models: each model whose manifest loaded there, by name.
        broken: the folders whose ``model.yaml`` did not load there: their policy is
            unknown, so a change to them is held to the strictest policy.
    """

    models: dict[str, RegisteredModel]
    broken: frozenset[str]

    @property
    def strictest(self) -> int:
        """The most approvals any base policy asks for; one when none loaded or some
        did not (an unreadable policy must not lower the bar)."""
        bar = max((m.spec.promotion.approvals for m in self.models.values()), default=1)
        return max(bar, 1) if self.broken else bar


def _base_models(root: Path, config: RepoConfig, base: str) -> _BaseModels:
    """Every model as it stood on the base commit (where the base's config puts them)."""
    from pipelines.ci._base import blobs

    folder = config.manifests
    # One listing and one batch read for every model.yaml (regular files only, as
    # _base.show reads them): a process or two per model cost seconds at 1,000 models.
    listed = git(root, "ls-tree", "-r", "-z", base, "--", f"{folder}/").stdout
    files: dict[str, str] = {}
    for item in filter(None, listed.split("\x00")):
        meta, _, path = item.partition("\t")
        mode, kind, sha = [*meta.split(), "", "", ""][:3]
        found = parse_manifest_path(path, folder)
        if found is None or found.version is not None:
            continue  # not a model's model.yaml
        if kind == "blob" and mode in ("100644", "100755"):
            files[found.model] = sha
    contents = blobs(root, files.values())
    models: dict[str, RegisteredModel] = {}
    broken: set[str] = set()
    for name, sha in files.items():
        data = contents[sha]
        try:
            manifest = load_manifest(parse_yaml(data, f"{base[:12]}:{model_file(folder, name)}"))
        except ManifestError:
            broken.add(name)
            continue
        if isinstance(manifest, RegisteredModel):
            models[manifest.metadata.name] = manifest
        else:
            broken.add(name)
    return _BaseModels(models, frozenset(broken - set(models)))


@dataclass(frozen=True)
class _Promotion:
    """A change that needs approvals: a model's channels or promotion policy, or the
    repository's configuration or trust metadata.

    Attributes:
        subject: what is changed, as the problem line says it ("promoting 'mlp'").
        approvals: the approvals it needs: the policy as it stood on the base, or the
            new one when that asks for more (a pull request cannot lower the bar it
            is judged by).
        where: the first change, for the problem lines.
        what: how a line that cannot count its approvals names it.
    """

    subject: str
    approvals: int
    where: Problem
    what: str = "this promotion"


def _served_on_base(
    repo: Repository, pr: PullRequest, base_config: RepoConfig, name: str
) -> dict[str, frozenset[str]]:
    """Channel -> every version it served in a release on the base's first-parent history.

    Read from the base, never from the pull request: a rollback may skip the
    promotion order only to a version that really served the channel (or a later one)
    in a release, and that the base's signed metadata still lists as released.
    """
    from pipelines.ci._base import trust_at
    from registry.promote import git_path
    from signing.target_names import artifact_path

    declared = git_path(repo, model_file(base_config.manifests, name))
    metadata = git_path(repo, base_config.trust.metadata)
    if declared is None or metadata is None:
        return {}
    served = channel_history(repo.root, declared, pr.base, released=metadata).served()
    with trust_at(repo.root, pr.base, base_config) as trust:
        if trust is None:
            return {}
        return {
            channel: frozenset(v for v in versions if trust.published(artifact_path(name, v)))
            for channel, versions in served.items()
        }


@dataclass(frozen=True)
class _Deprecation:
    """A version's deprecation that a pull request adds, rewords or removes."""

    model: str
    version: str
    before: str | None
    after: str | None

    def text(self) -> str:
        if self.after is None:
            return f"{self.model} {self.version} no longer deprecated (was: {self.before})"
        return f"{self.model} {self.version} deprecated ({self.after})"


def _deprecations(
    repo: Repository,
    pr: PullRequest,
    base_config: RepoConfig,
    on_base: _BaseModels,
    changed: Collection[tuple[str, str]],
) -> tuple[list[_Deprecation], list[_Promotion]]:
    """Deprecations the pull request changes, and the approvals an un-deprecation needs.

    Deprecating only takes a version out of service: no approval.  Taking the mark
    away lets the version be promoted again, so it needs the approvals of the model's
    base policy (at least one when the base has none), and the comment says so.  A
    released deprecation cannot be removed at all (``released_deprecations``).

    Args:
        changed: the versions the pull request changes, as the build sees them
            (:func:`pipelines.changes.changed_versions`): each is compared with its
            manifest on the base, where the base's configuration puts it.
    """
    from pipelines.ci._base import show
    from registry.schema import ModelVersion

    found: list[_Deprecation] = []
    promotions: list[_Promotion] = []
    for entry in repo.all_versions():
        if (entry.name, entry.version) not in changed:
            continue
        rel = version_file(base_config.manifests, entry.name, entry.version)
        data = show(repo.root, pr.base, rel)
        before = None
        if data is not None:
            try:
                old = load_manifest(parse_yaml(data, f"{pr.base[:12]}:{rel}"))
            except ManifestError:
                old = None
            if isinstance(old, ModelVersion) and old.spec.deprecated is not None:
                before = old.spec.deprecated.reason
        now = entry.manifest.spec.deprecated
        after = now.reason if now is not None else None
        if before == after:
            continue
        found.append(_Deprecation(entry.name, entry.version, before, after))
        if after is None:
            policy = on_base.models.get(entry.name)
            needed = max(policy.spec.promotion.approvals if policy else on_base.strictest, 1)
            line, col = entry.doc.position(("spec",))
            where = Problem(entry.file, "", line, col, "spec.deprecated")
            subject = f"taking the deprecation of {entry.name!r} {entry.version} away"
            promotions.append(_Promotion(subject, needed, where, "this change"))
    return found, promotions


def _promotions(
    repo: Repository, pr: PullRequest, on_base: _BaseModels, base_config: RepoConfig
) -> tuple[list[Problem], list[_Promotion], list[ChannelMove]]:
    """Promotions in this pull request that break their model's policy, and every model
    whose channels or promotion policy it changes.

    The policy is the one on the base (a model new in this pull request has its own):
    a channel that changed must follow the promotion order (the version served the
    channel before it), and the pull request must target the promotion branch.
    Changing ``spec.promotion`` itself, removing a channel or removing a model that
    had channels counts as a promotion.  A model whose manifest did not load on the
    base has no policy to read: any channel it declares, or a change of its
    ``model.yaml``, needs the strictest base policy's approvals (at least one).
    """
    problems: list[Problem] = []
    promotions: list[_Promotion] = []
    moves: list[ChannelMove] = []
    base_models = on_base.models
    for name in sorted(set(base_models) - set(repo.models)):
        gone = base_models[name]
        if gone.spec.channels:
            where = Problem(repo.display(model_dir(repo.root / repo.config.manifests, name)), "")
            promotions.append(
                _Promotion(
                    f"removing {name!r}", gone.spec.promotion.approvals, where, "this removal"
                )
            )
    for name, entry in sorted(repo.models.items()):
        head = entry.manifest
        base = base_models.get(name)
        if base is None and name in on_base.broken:
            promotions += _unknown_policy(repo, pr, entry, on_base.strictest)
            continue
        policy = (base or head).spec.promotion
        before = base.spec.channels if base is not None else {}
        versions = repo.versions.get(name, {})
        deprecated = {
            v: e.manifest.spec.deprecated.reason
            for v, e in versions.items()
            if e.manifest.spec.deprecated is not None
        }
        # A model new in this pull request starts from no channels at all.
        reference = base or head.model_copy(
            update={"spec": head.spec.model_copy(update={"channels": {}})}
        )
        changes: list[Problem] = []
        served: dict[str, frozenset[str]] | None = None
        for channel, assignment in sorted(head.spec.channels.items()):
            if channel in before and before[channel].version == assignment.version:
                continue  # unchanged (a rollout percent may move freely)
            if served is None:
                served = _served_on_base(repo, pr, base_config, name) if base else {}
            line, col = entry.doc.position(("spec", "channels", channel))
            at = Problem(entry.file, "", line, col, f"spec.channels.{channel}")
            changes.append(at)
            old = before[channel].version if channel in before else None
            moves.append(channel_move(reference, channel, old, assignment.version, served))
            problems.extend(
                _at(at, reason)
                for reason in promotion_violations(
                    reference,
                    set(versions),
                    assignment.version,
                    channel,
                    served=served,
                    deprecated=deprecated,
                    previous=old,
                )
            )
        if set(before) - set(head.spec.channels):  # a channel removed
            line, col = entry.doc.position(("spec", "channels"))
            changes.append(Problem(entry.file, "", line, col, "spec.channels"))
        if base is not None and base.spec.promotion != head.spec.promotion:
            line, col = entry.doc.position(("spec", "promotion"))
            changes.append(Problem(entry.file, "", line, col, "spec.promotion"))
        if not changes:
            continue
        needed = max(policy.approvals, head.spec.promotion.approvals)
        promotions.append(_Promotion(f"promoting {name!r}", needed, changes[0]))
        if pr.target_branch and pr.target_branch != policy.branch:
            problems.extend(
                _at(at, f"promotions of {name!r} must target branch {policy.branch!r}, "
                        f"not {pr.target_branch!r}")
                for at in changes
            )  # fmt: skip
    return problems, promotions, moves


def _unknown_policy(
    repo: Repository, pr: PullRequest, entry: ModelEntry, strictest: int
) -> list[_Promotion]:
    """The promotion of a model whose base manifest did not load, if it makes one."""
    head = entry.manifest
    changed = git(repo.root, "diff", "--quiet", pr.base, "--", str(entry.path), check=False)
    if not head.spec.channels and not changed.returncode:
        return []
    key = ("spec", "channels") if head.spec.channels else ("spec",)
    line, col = entry.doc.position(key)
    where = Problem(entry.file, "", line, col, ".".join(key))
    needed = max(strictest, head.spec.promotion.approvals)
    return [
        _Promotion(
            f"promoting {head.metadata.name!r} (its model.yaml does not load on the base, "
            "so the strictest policy applies)",
            needed,
            where,
        )
    ]


def approval_problems(
    promotions: list[_Promotion], pr: PullRequest, env: Mapping[str, str]
) -> tuple[list[Problem], str]:
    """Promotions without the approvals their model's policy asks for.

    Approvals are counted on GitHub (``GITHUB_TOKEN``, ``GITHUB_API_URL``,
    ``GITHUB_REPOSITORY``) for the pull request of the event, failing closed when they
    cannot be.  Outside a pull request (a local run with ``--base``) there is nothing
    to count: no problem, and the line says the approvals were not checked.

    Returns:
        The problems, and a line for the comment saying what was found.
    """
    from pipelines.errors import GitHubError
    from pipelines.github import GitHubEnv, fetch_approvers

    needed = [p for p in promotions if p.approvals > 0]
    if not needed:
        return [], "no promotion needs an approval"
    if pr.number is None or pr.head is None:
        return [], "not checked (no pull request event to count approvals on)"
    github = GitHubEnv.from_env(env)
    repository, token = github.repository, github.token
    reason = None
    if not repository:
        reason = "GITHUB_REPOSITORY is not set"
    elif not token:
        reason = "GITHUB_TOKEN is not set; give the step `GITHUB_TOKEN: ${{ github.token }}`"
    else:
        try:
            names = fetch_approvers(
                repository, pr.number, token, head=pr.head, author=pr.author, api=github.api
            )
        except GitHubError as e:
            reason = str(e)
    if reason is not None:
        return [_at(p.where, f"cannot count the approvals {p.what} needs: {reason}")
                for p in needed], "could not be counted"  # fmt: skip
    problems = [
        _at(
            p.where,
            f"{p.subject} needs {p.approvals} approval(s) of commit {pr.head[:12]}; "
            f"it has {len(names)}" + (f" ({', '.join(sorted(names))})" if names else ""),
        )
        for p in needed
        if len(names) < p.approvals
    ]
    who = ", ".join(sorted(names)) or "none"
    have = f"{len(names)} approval(s) of {pr.head[:12]} ({who})"
    short = max(p.approvals for p in needed) - len(names)
    return problems, (f"awaiting {short} more; " if short > 0 else "") + have


def _at(where: Problem, message: str) -> Problem:
    return Problem(where.file, message, where.line, where.col, where.field)


def _trust_problems(repo: Repository, pr: PullRequest, base_config: RepoConfig) -> list[Problem]:
    """Released versions this pull request changes, and trust metadata it rewinds.

    What is released is what the base's signed metadata says (read from the base
    commit, where the base's config puts it), never what the pull request's own
    metadata says: deleting ``timestamp.json`` or pointing ``trust.metadata`` at
    another folder must not hide a swapped release.  When the pull request touches the
    metadata (a key rotation), the new metadata must verify and follow the base's.
    """
    from pipelines.ci._base import trust_at
    from pipelines.publish import released_changes, released_deprecations
    from signing.workspace import trust_paths

    head_paths = trust_paths(repo.root, repo.config)
    head_rel = repo.config.trust.metadata
    changed = git(
        repo.root, "diff", "--quiet", pr.base, "--", head_rel, base_config.trust.metadata,
        check=False,
    ).returncode != 0 or bool(
        git(repo.root, "ls-files", "--others", "--exclude-standard", "--", head_rel).stdout
    )  # fmt: skip
    where = repo.display(head_paths.metadata)
    problems: list[Problem] = []
    head: TrustRepo | None = None
    if (head_paths.metadata / "1.root.json").is_file():
        try:
            head = TrustRepo.load(head_paths.metadata, expiry=head_paths.expiry)
        except RegistryError as e:
            if changed:  # else the base is broken too, and not this pull request's doing
                problems.append(Problem(where, str(e).removeprefix(f"{where}: ")))
    with trust_at(repo.root, pr.base, base_config) as base:
        if base is not None:
            problems += released_changes(repo, base) + released_deprecations(repo, base)
            problems += _released_spec_changes(repo, pr.base, base_config, base)
            problems += _released_removed(repo, base)
            if head_rel != base_config.trust.metadata:
                problems.append(Problem(CONFIG_FILE, trust_folder_moved(base_config, repo.config)))
            if changed and head is None and not problems:
                problems.append(Problem(where, "the pull request removes the trust metadata"))
            if changed and head is not None:
                try:
                    head.check_follows(base)
                except RegistryError as e:
                    problems.append(Problem(where, str(e)))
    if head is not None:  # a release published locally and not committed yet counts too
        problems += [p for p in released_changes(repo, head) if p not in problems]
    return problems


def _released_removed(repo: Repository, trust: TrustRepo) -> list[Problem]:
    """Released versions whose manifest this pull request deletes (or moves away).

    Devices hold them, channels' history names them, MLflow mirrors them: a released
    version stays declared.  What a team means by removing one is deprecating it.
    """
    problems = []
    for info in trust.targets.values():
        try:
            facts = TargetFacts.from_custom(info.custom)
        except ValueError:
            continue
        if facts.kind != "artifact" or facts.model is None or facts.version is None:
            continue
        if facts.version in repo.versions.get(facts.model, {}):
            continue
        if (facts.model, facts.version) in repo.broken:
            continue  # still there, and its load problem is reported already
        rel = version_file(repo.config.manifests, facts.model, facts.version)
        problems.append(Problem(
            rel,
            f"version {facts.version} of {facts.model!r} is released; its manifest cannot "
            f"be deleted (deprecate it: modelreg version deprecate {facts.model} "
            f"{facts.version} --reason TEXT)",
        ))  # fmt: skip
    return problems


_SIGNED_FIELDS: Final = ("parent", "signature", "targets", "goldens")
"""What a version's signed description holds: fixed once the version is released."""


def _released_spec_changes(
    repo: Repository, base: str, base_config: RepoConfig, trust: TrustRepo
) -> list[Problem]:
    """Released versions whose signed fields, or golden files, this pull request changes.

    A device installs a version by its signed description (targets, engine settings,
    golden cases): a pull request that edits them for a released version would get
    them signed at the next release for devices that have not installed it yet.
    """
    from pipelines.ci._base import show
    from registry.schema import ModelVersion
    from signing.target_names import artifact_path

    problems: list[Problem] = []
    goldens: dict[str, tuple[VersionEntry, int]] = {}
    for entry in repo.all_versions():
        if trust.published(artifact_path(entry.name, entry.version)) is None:
            continue
        rel = version_file(base_config.manifests, entry.name, entry.version)
        data = show(repo.root, base, rel)
        if data is None:
            continue
        try:
            before = load_manifest(parse_yaml(data, f"{base[:12]}:{rel}"))
        except ManifestError:
            continue
        if not isinstance(before, ModelVersion):
            continue
        spec = entry.manifest.spec
        for name in _SIGNED_FIELDS:
            if getattr(before.spec, name) != getattr(spec, name):
                line, col = entry.doc.position(("spec", name))
                problems.append(Problem(
                    entry.file,
                    f"version {entry.version} is released and its {name} "
                    f"{'are' if name.endswith('s') else 'is'} signed with it; declare a new "
                    "version to change it",
                    line, col, f"spec.{name}",
                ))  # fmt: skip
        for index, case in enumerate(spec.goldens.cases if spec.goldens else []):
            for value in (case.inputs, case.outputs):
                if isinstance(value, str):
                    goldens[value] = (entry, index)
    if goldens:
        listed = git(
            repo.root, "diff", "--name-only", "-z", "--relative", base, "--", *goldens
        ).stdout
        for path in sorted(set(listed.split("\x00")) & set(goldens)):
            entry, index = goldens[path]
            line, col = entry.doc.position(("spec", "goldens", "cases", index))
            problems.append(Problem(
                entry.file,
                f"version {entry.version} is released and its golden file {path} is signed "
                "with it; declare a new version to change it",
                line, col, f"spec.goldens.cases.{index}",
            ))  # fmt: skip
    return problems


def _config_changes(
    repo: Repository,
    pr: PullRequest,
    base_config: RepoConfig,
    on_base: _BaseModels,
    dvc_changed: list[str],
) -> list[_Promotion]:
    """Changes of the repository's configuration, trust metadata or DVC setup: each
    needs the approvals of the strictest policy on the base (see ``_BaseModels``)."""
    bar = on_base.strictest
    changed: list[tuple[str, str]] = []
    if git(repo.root, "diff", "--quiet", pr.base, "--", CONFIG_FILE, check=False).returncode:
        changed.append(("changing the repository configuration", CONFIG_FILE))
    folders = {repo.config.trust.metadata, base_config.trust.metadata}
    if git(repo.root, "diff", "--quiet", pr.base, "--", *folders, check=False).returncode:
        changed.append(("changing the trust metadata", base_config.trust.metadata))
    changed.extend(("changing the DVC configuration", path) for path in dvc_changed[:1])
    # an enrolled key makes a device's reports count (they move rollout waves)
    devices = {repo.config.devices, base_config.devices}
    if git(repo.root, "diff", "--quiet", pr.base, "--", *devices, check=False).returncode:
        changed.append(("enrolling or revoking devices", base_config.devices))
    return [_Promotion(subject, bar, Problem(path, ""), what=subject) for subject, path in changed]


def _device_changes(repo: Repository, base: str, report: CiReport) -> list[str]:
    """The devices the pull request enrolls, re-keys or revokes: a comment line each
    kind, and the JSON."""
    from signing.device_reports import KEY_SUFFIX

    folder = repo.config.devices.rstrip("/")
    listed = git(repo.root, "diff", "--name-status", "--no-renames", base, "--", folder).stdout
    kinds: dict[str, list[str]] = {"enrolled": [], "re-keyed": [], "revoked": []}
    for line in listed.splitlines():
        status, _, path = line.partition("\t")
        name = path.rsplit("/", 1)[-1]
        if not name.endswith(KEY_SUFFIX):
            continue
        kind = {"A": "enrolled", "M": "re-keyed", "D": "revoked"}.get(status[:1])
        if kind is not None:
            kinds[kind].append(name.removesuffix(KEY_SUFFIX))
    report.data["devices"] = kinds
    return [
        f"- devices {kind}: {md_code(', '.join(names))}" for kind, names in kinds.items() if names
    ]


def _ci_pr(
    start: Path, *, base: str | None = None, env: Mapping[str, str] | None = None
) -> CiReport:
    """Validate, check policy, build and diff what a pull request changes.

    The pull request is judged by its base: the base's ``modelreg.yaml`` says where
    models and trust metadata were, the base's policies say who must approve, the
    base's signed metadata says what is released.  A change of the configuration, the
    trust metadata or DVC's setup needs the approvals of the strictest base policy.

    Raises:
        RepositoryError: not inside a repository.
        UsageError: no base ref to compare against, or it does not name a commit.
        ToolError: git or DVC fails.
    """
    from pipelines.ci._base import change_problems, dvc_config_changed, pr_changes

    # No parse cache (see ci_pr): .modelreg/ in a pull request's checkout is its own.
    # The repository is loaded and validated once, for the checks, the build and the diff.
    run = ReleaseContext.load(start, env)
    repo, env = run.repo, run.env
    pr = run.github.pull_request(base)
    if git(
        repo.root, "rev-parse", "--verify", "--quiet", f"{pr.base}^{{commit}}", check=False
    ).returncode:
        raise UsageError(f"git ref {pr.base!r} does not name a commit")
    report = CiReport("pr", data={"base": pr.base})
    changes = pr_changes(repo.root, pr.base)
    problems = change_problems(changes) + run.problems()
    checked_out = git(repo.root, "rev-parse", "HEAD").stdout.strip()
    if pr.head is not None and checked_out != pr.head:
        # Approvals are counted on the event's head commit: it must be what is judged.
        problems.append(
            Problem(
                "HEAD",
                f"the checkout is at {checked_out[:12]}, not the pull request's head "
                f"{pr.head[:12]}; check out the head commit (approvals count for it)",
            )
        )
    uncommitted = _uncommitted(repo.root)
    report.data["uncommitted"] = uncommitted
    dvc_changed = dvc_config_changed(changes)
    judged = _Judged([], "not checked (invalid manifests)")
    if not problems:
        problems, judged = _judge(run, pr, dvc_changed)
    waiting, approvals, moves, deprecations = (
        judged.waiting,
        judged.approvals,
        judged.moves,
        judged.deprecations,
    )
    built_versions = run.changed_since(pr.base) if not problems else set()
    if dvc_changed and built_versions:
        problems.append(
            Problem(
                dvc_changed[0],
                "a pull request that changes DVC's configuration cannot also change model "
                "versions (CI never runs DVC with a configuration under review): split it",
            )
        )
    report.problems.extend(str(p) for p in sorted(problems + waiting, key=Problem.sort_key))
    status = "passed" if not problems else f"{len(problems)} problem(s)"
    checks = [f"- manifests and promotion policy: {status}", f"- approvals: {approvals}"]
    if uncommitted:
        checks.append(f"- note: {uncommitted_note(uncommitted)}")
    checks += _channel_lines(report, moves, deprecations)
    if not problems:
        checks += _device_changes(repo, pr.base, report)
    report.data["holds"] = judged.holds
    checks += [_hold_line(h) for h in judged.holds]
    if dvc_changed and not problems:
        checks.append("- build: skipped (DVC's configuration changes; no version changes)")
    elif not problems:  # built and diffed while approvals are awaited: reviewers need the diff
        checks += _build_and_diff(run, pr.base, report, judged.latency_limits)
    verdict = "✅ ready for review" if report.ok else "❌ changes needed"
    head = ["## modelreg", "", f"**{verdict}** (against {md_code(pr.base[:12])})", "", *checks]
    if report.problems:
        head += ["", md_code_block("\n".join(report.problems))]
    report.sections.insert(0, "\n".join(head))
    write_outputs(repo.root, report, env)
    return report


def _build_and_diff(
    run: ReleaseContext, base: str, report: CiReport, limits: Mapping[str, float]
) -> list[str]:
    """Build and diff the changed versions into ``report``: its comment lines."""
    try:
        built = build(run, base=base)
    except BuildError as e:
        built = e.report
        report.problems.extend(str(p) for p in e.problems)
    report.data["build"] = built.to_json()
    lines = [
        f"- build: {len(built.records)} changed version(s), "
        + ("all passed" if built.ok else f"{len(built.problems)} problem(s)")
    ]
    lines += _latency_lines(report, built.records, limits)
    diffs = diff_against_base(run, base)
    report.data["diff"] = base_json(diffs)
    report.sections.append(base_markdown(diffs))
    return lines


def _uncommitted(root: Path) -> list[str]:
    """Paths of the work tree that differ from HEAD (untracked ones included), top-level
    relative; empty outside a git work tree."""
    from registry.gitinfo import dirty_paths, toplevel

    top = toplevel(root)
    if top is None:
        return []
    under = root.resolve().relative_to(top.resolve()).as_posix()
    return sorted(dirty_paths(root, under))


def uncommitted_note(paths: list[str]) -> str:
    """What ``ci pr`` says of a work tree that differs from its commit."""
    shown = ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
    return (
        f"the work tree differs from HEAD in {len(paths)} path(s) ({shown}): they were "
        "judged here, but a pull request holds only commits, and its approvals count for "
        "the head commit: commit them, or stash them to judge HEAD alone"
    )


@dataclass
class _Judged:
    """What the base's policies say of a pull request whose manifests are valid."""

    waiting: list[Problem]
    approvals: str
    moves: list[ChannelMove] = field(default_factory=list)
    deprecations: list[_Deprecation] = field(default_factory=list)
    holds: list[dict[str, str | None]] = field(default_factory=list)
    """Rollouts the pull request holds or resumes: model, channel, version, hold, was."""
    latency_limits: dict[str, float] = field(default_factory=dict)
    """Model -> ``spec.promotion.max_latency_ratio`` as the base has it (the pull
    request's own for a model new in it)."""


def _judge(
    run: ReleaseContext, pr: PullRequest, dvc_changed: list[str]
) -> tuple[list[Problem], _Judged]:
    """Policy, trust and approvals, each as the base commit has them."""
    from pipelines.ci._base import config_at

    repo = run.repo
    base_config = config_at(repo.root, pr.base) or repo.config
    on_base = _base_models(repo.root, base_config, pr.base)
    problems, promotions, moves = _promotions(repo, pr, on_base, base_config)
    changed = run.changed_since(pr.base)
    deprecations, undone = _deprecations(repo, pr, base_config, on_base, changed)
    promotions += undone + _config_changes(repo, pr, base_config, on_base, dvc_changed)
    problems += _trust_problems(repo, pr, base_config)
    waiting, approvals = approval_problems(promotions, pr, run.env)
    limits = {}
    for name, entry in repo.models.items():
        policy = on_base.models.get(name, entry.manifest).spec.promotion
        if policy.max_latency_ratio is not None:
            limits[name] = policy.max_latency_ratio
    judged = _Judged(waiting, approvals, moves, deprecations, _holds(repo, on_base), limits)
    return problems, judged


def _latency_lines(
    report: CiReport, records: list[BuildRecord], limits: Mapping[str, float]
) -> list[str]:
    """A comment line per built version's run time against its parent; a version
    slower than its model's ``max_latency_ratio`` allows is a problem of the report."""
    lines = []
    for record in records:
        latency = record.latency
        if latency is None:
            continue
        where = f"{record.model} {record.version}"
        lines.append(f"- latency {md_code(where)}: {latency.text()}")
        limit, ratio = limits.get(record.model), latency.ratio_p50
        if limit is not None and ratio is not None and ratio > limit:
            report.problems.append(
                str(
                    Problem(
                        record.manifest,
                        f"{where} runs {ratio:.2f}x as long as its parent {latency.parent} "
                        f"at p50 on this runner ({latency.p50_ms:.3g} ms against "
                        f"{latency.parent_p50_ms:.3g} ms; {latency.ratio_p99:.2f}x at p99); "
                        f"the base's spec.promotion.max_latency_ratio of {record.model} "
                        f"allows {limit:g}x",
                    )
                )
            )
    return lines


def _hold_line(hold: Mapping[str, str | None]) -> str:
    """``- hold: `mlp canary 1.1.0: p99 up 3x``` (or ``- resume: ...``)."""
    where = f"{hold['model']} {hold['channel']} {hold['version']}"
    reason, was = hold["hold"], hold["was"]
    if reason is not None:
        return "- hold: " + md_code(f"{where}: {reason}")
    return "- resume: " + md_code(f"{where} (was held: {was})")


def _holds(repo: Repository, on_base: _BaseModels) -> list[dict[str, str | None]]:
    """Each channel whose ``rollout.hold`` the pull request sets, changes or lifts."""
    found: list[dict[str, str | None]] = []
    for name, entry in sorted(repo.models.items()):
        base = on_base.models.get(name)
        for channel, now in sorted(entry.manifest.spec.channels.items()):
            before = base.spec.channels.get(channel) if base is not None else None
            hold = now.rollout.hold if now.rollout else None
            was = before.rollout.hold if before is not None and before.rollout else None
            if hold != was:
                found.append({"model": name, "channel": channel, "version": now.version,
                              "hold": hold, "was": was})  # fmt: skip
    return found


def _channel_lines(
    report: CiReport, moves: list[ChannelMove], deprecations: list[_Deprecation]
) -> list[str]:
    """What the pull request does to channels and deprecations: a comment line each,
    and the JSON."""
    report.data["channels"] = [asdict(move) for move in moves]
    report.data["deprecations"] = [asdict(d) for d in deprecations]
    return [f"- {move.kind}: {md_code(move.text())}" for move in moves] + [
        f"- deprecation: {md_code(d.text())}" for d in deprecations
    ]


def ci_pr(
    start: Path, *, base: str | None = None, env: Mapping[str, str] | None = None
) -> CiReport:
    """Validate, check policy, build and diff what a pull request changes.

    Failures are in the returned report (and the comment, JSON report and GitHub
    outputs are written either way).

    Raises:
        RepositoryError: not inside a repository.
        UsageError: no base ref, or it does not name a commit.
    """
    env = os.environ if env is None else env
    try:
        with untrusted_checkout():
            return _ci_pr(start, base=base, env=env)
    except RegistryError as e:
        return failed(start, "pr", e, env)
