"""``modelreg register``: mirror released versions and channels into MLflow.

Git is the source of truth and MLflow its mirror.  Each RegisteredModel becomes one MLflow
registered model; each released ModelVersion (its manifest committed) becomes one MLflow
model version, logged with the ONNX flavor so ``mlflow.onnx.load_model("models:/mlp@prod")``
works for anyone, and tagged with where it came from::

    modelreg.semver         1.1.0              how modelreg finds the version again
    modelreg.git_commit     <sha>              last commit of the version's manifest
    modelreg.sha256         <hex>              of the ONNX file (MLflow holds those bytes)
    modelreg.dvc_md5        <hex>              DVC's digest, from the .dvc pointer
    modelreg.parent         1.0.0              absent for a first version
    modelreg.bundle_digest  <hex>              SHA-256 of the OMS bundle, when given
    modelreg.diff_summary   <text>             when given
    modelreg.deprecated     <reason>           when ``modelreg version deprecate`` marked it
    modelreg.owner          <who>              the model's ``spec.owner``, when set
    modelreg.ci_run_id/url                     the CI run that registered it (GitHub env)

The version's ``spec.description`` is the MLflow version's description, its
``spec.metrics`` the metrics of the run that logged it (a metric name MLflow cannot hold
is reported, not sent), and model.yaml's description the registered model's.

Aliases mirror the channels exactly: ``production`` in ``model.yaml`` is alias
``production`` on the MLflow version of that SemVer, and an alias with no channel is
removed.  Registering again changes only what differs; :func:`check_drift` reports the
differences (hand edits in MLflow) without changing anything.

Tracking URI: the ``tracking_uri`` argument, else ``MLFLOW_TRACKING_URI``, else
``mlflow.uri`` of ``modelreg.yaml``, else the embedded store
``sqlite:///<repo>/.modelreg/mlflow.db`` with artifacts in ``<repo>/.modelreg/mlartifacts``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from pipelines.context import ReleaseContext
from pipelines.errors import ArtifactError
from pipelines.fetch import fetch_artifact
from pipelines.register._plan import (
    TAG_BUNDLE_DIGEST,
    TAG_CI_RUN_ID,
    TAG_CI_RUN_URL,
    TAG_DEPRECATED,
    TAG_DIFF_SUMMARY,
    TAG_DVC_MD5,
    TAG_GIT_COMMIT,
    TAG_OWNER,
    TAG_PARENT,
    TAG_SEMVER,
    TAG_SHA256,
    CreateModel,
    CreateVersion,
    DeleteAlias,
    DeleteTags,
    DesiredModel,
    DesiredVersion,
    Drift,
    DriftKind,
    LogMetrics,
    ObservedModel,
    Reconciliation,
    SetAlias,
    SetModelDescription,
    SetTags,
    SetVersionDescription,
    reconcile,
)
from pipelines.register._store import Store, is_local, redact, session
from registry import progress
from registry.dvcfile import read_pointer
from registry.errors import RepositoryError, UsageError
from registry.gitinfo import dirty_paths, last_commits, toplevel
from registry.repository import Repository, VersionEntry
from registry.schema import Signature

__all__ = [
    "DEFAULT_ARTIFACTS",
    "DEFAULT_STORE",
    "Change",
    "Drift",
    "DriftKind",
    "RegisterReport",
    "ReleaseExtras",
    "check_drift",
    "register",
    "resolve_tracking_uri",
]

DEFAULT_STORE: Final = ".modelreg/mlflow.db"
"""The embedded MLflow store, relative to the repository root."""
DEFAULT_ARTIFACTS: Final = ".modelreg/mlartifacts"
"""Artifacts of local MLflow stores, relative to the repository root."""
_CHUNK: Final = 1 << 20


@dataclass(frozen=True)
class ReleaseExtras:
    """What a CI run knows about a version beyond Git: attached when registering.

    Attributes:
        bundle: the OMS signature bundle (attached; its SHA-256 becomes a tag).
        diff_report: the markdown diff report against the parent (attached).
        diff_summary: a one-line summary of that report (a tag).
    """

    bundle: Path | None = None
    diff_report: Path | None = None
    diff_summary: str | None = None


@dataclass(frozen=True, slots=True)
class Change:
    """One change ``register`` made in MLflow."""

    model: str
    subject: str
    message: str

    def __str__(self) -> str:
        return f"{self.model}{self.subject}: {self.message}"


@dataclass(frozen=True)
class RegisterReport:
    """What ``register`` did.

    Attributes:
        tracking_uri: the MLflow it mirrored into (password removed).
        changes: every change made, in order; empty when MLflow was in sync.
        drifts: differences left that ``register`` does not repair (an MLflow version
            no manifest declares, a channel serving an uncommitted version).
        versions: (model, SemVer) -> MLflow version number.
        unreleased: (model, SemVer) of versions whose manifest is not committed yet.
    """

    tracking_uri: str
    changes: tuple[Change, ...]
    drifts: tuple[Drift, ...]
    versions: Mapping[tuple[str, str], str]
    unreleased: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready mapping."""
        return {
            "ok": not self.drifts,
            "tracking_uri": self.tracking_uri,
            "changes": [_change_json(c) for c in self.changes],
            "drift": [drift_json(d) for d in self.drifts],
            "versions": [
                {"model": m, "version": v, "mlflow_version": n}
                for (m, v), n in sorted(self.versions.items())
            ],
            "unreleased": [{"model": m, "version": v} for m, v in self.unreleased],
        }


def drift_json(drift: Drift) -> dict[str, Any]:
    """A drift as a JSON object."""
    return {
        "kind": drift.kind,
        "model": drift.model,
        "subject": drift.subject.strip(),
        "message": drift.message,
        "fixable": drift.fixable,
        "text": str(drift),
    }


def _change_json(change: Change) -> dict[str, str]:
    return {
        "model": change.model,
        "subject": change.subject.strip(),
        "message": change.message,
        "text": str(change),
    }


def resolve_tracking_uri(
    repo: Repository, override: str | None = None, env: Mapping[str, str] | None = None
) -> str:
    """The MLflow to mirror into: ``override``, ``MLFLOW_TRACKING_URI``, config, embedded."""
    env = os.environ if env is None else env
    chosen = override or env.get("MLFLOW_TRACKING_URI") or repo.config.mlflow.uri
    if chosen:
        return chosen
    return f"sqlite:///{(repo.root / DEFAULT_STORE).as_posix()}"


@dataclass(frozen=True)
class _Source:
    """Where a desired version's content comes from (for creating it)."""

    entry: VersionEntry
    signature: Signature | None
    extras: ReleaseExtras
    hashed: Path | None
    """The artifact file, when its SHA-256 tag was computed from it (not taken from the
    signed targets, which must then be checked against the bytes uploaded)."""


@dataclass
class _Plan:
    repo: Repository
    fetch: bool
    models: dict[str, DesiredModel] = field(default_factory=dict)
    sources: dict[tuple[str, str], _Source] = field(default_factory=dict)
    unreleased: list[tuple[str, str]] = field(default_factory=list)


def _digests(path: Path, display: str) -> tuple[str, str]:
    """SHA-256 and MD5 of a file in one read."""
    sha, md5 = hashlib.sha256(), hashlib.md5(usedforsecurity=False)
    try:
        with path.open("rb") as fh:
            while chunk := fh.read(_CHUNK):
                sha.update(chunk)
                md5.update(chunk)
    except FileNotFoundError:
        raise ArtifactError(display, "not in the workspace; run `dvc pull` first") from None
    except OSError as e:
        raise ArtifactError(display, f"cannot read: {e.strerror or e}") from None
    return sha.hexdigest(), md5.hexdigest()


def _ci_tags(env: Mapping[str, str]) -> dict[str, str]:
    from pipelines.github import ActionsRun

    run = ActionsRun.from_env(env)
    if run.run_id is None:
        return {}
    tags = {TAG_CI_RUN_ID: run.run_id}
    if run.url is not None:
        tags[TAG_CI_RUN_URL] = run.url
    return tags


def _released(repo: Repository) -> dict[tuple[str, str], str]:
    """(model, version) -> commit of each version whose manifest is committed and clean."""
    top = toplevel(repo.root)
    if top is None:
        raise RepositoryError(
            f"{repo.display(repo.root)}: not a git work tree; register mirrors committed versions"
        )
    base = top.resolve()
    relative = {
        (e.name, e.version): e.path.resolve().relative_to(base).as_posix()
        for e in repo.all_versions()
    }
    under = (repo.root / repo.config.manifests).resolve().relative_to(base).as_posix()
    commits = last_commits(repo.root, relative.values(), under)
    dirty = dirty_paths(repo.root, under)
    return {
        key: commits[path].sha
        for key, path in relative.items()
        if path in commits and path not in dirty
    }


def _signed_digests(run: ReleaseContext) -> dict[tuple[str, str], tuple[str, str]]:
    """(model, version) -> (sha256, dvc md5) of each artifact released as a signed target.

    Lets a mirror run in a fresh checkout skip reading (and pulling) every artifact:
    the signed SHA-256 stands for the file whose pointer records the same md5.
    """
    from signing.workspace import release_states

    if not run.has_trust():
        return {}
    return {
        key: (state.sha256, state.dvc_md5)
        for key, state in release_states(run.trust()).items()
        if state.sha256 is not None and state.dvc_md5 is not None
    }


def _workspace_artifact(repo: Repository, entry: VersionEntry, *, fetch: bool) -> Path:
    """The version's artifact in the work tree, matching its pointer; pulled through DVC
    when missing if ``fetch`` (register), else an error (``--check`` changes nothing)."""
    rel = entry.manifest.spec.artifact.path
    artifact, display = repo.root / rel, repo.display(repo.root / rel)
    if fetch:
        # ONNX external data: MLflow's flavor reads the data files beside the .onnx, so
        # each is pulled and held to its pointer first, as the .onnx is.
        for data in entry.manifest.spec.artifact.files()[1:]:
            fetch_artifact(repo.root, data, repo.display(repo.root / data))
        return fetch_artifact(repo.root, rel, display).path
    pointer = read_pointer(
        artifact.with_name(artifact.name + ".dvc"), display + ".dvc", artifact.name
    )
    md5 = _digests(artifact, display)[1]
    if md5 != pointer.md5:
        raise ArtifactError(
            display,
            f"differs from its DVC pointer (md5 {md5}, pointer says {pointer.md5}); "
            "run `dvc checkout`",
        )
    return artifact


def _desired_version(
    plan: _Plan,
    entry: VersionEntry,
    commit: str,
    extras: ReleaseExtras,
    ci: dict[str, str],
    *,
    signed: tuple[str, str] | None,
    owner: str,
) -> tuple[DesiredVersion, Path | None]:
    """The version as MLflow should hold it, and the artifact file if it was hashed."""
    repo = plan.repo
    spec = entry.manifest.spec
    artifact = repo.root / spec.artifact.path
    display = repo.display(artifact)
    pointer = read_pointer(
        artifact.with_name(artifact.name + ".dvc"), display + ".dvc", artifact.name
    )
    path = None
    if signed is not None and signed[1] == pointer.md5:
        sha256 = signed[0]
    else:
        path = _workspace_artifact(repo, entry, fetch=plan.fetch)
        sha256 = _digests(path, display)[0]
    tags = {
        TAG_SEMVER: entry.version,
        TAG_GIT_COMMIT: commit,
        TAG_SHA256: sha256,
        TAG_DVC_MD5: pointer.md5,
    }
    if spec.parent is not None:
        tags[TAG_PARENT] = spec.parent
    if extras.bundle is not None:
        tags[TAG_BUNDLE_DIGEST] = _digests(extras.bundle, str(extras.bundle))[0]
    if extras.diff_summary is not None:
        tags[TAG_DIFF_SUMMARY] = extras.diff_summary
    if spec.deprecated is not None:
        tags[TAG_DEPRECATED] = spec.deprecated.reason
    if owner:
        tags[TAG_OWNER] = owner
    absent = frozenset(
        tag
        for tag, unset in (
            (TAG_PARENT, spec.parent is None),
            (TAG_DEPRECATED, spec.deprecated is None),
            (TAG_OWNER, not owner),
        )
        if unset
    )
    desired = DesiredVersion(
        entry.version, tags, absent, ci, description=spec.description, metrics=spec.metrics
    )
    return desired, path


def _plan(
    run: ReleaseContext,
    extras: Mapping[tuple[str, str], ReleaseExtras] | None,
    *,
    fetch: bool,
) -> _Plan:
    repo, env = run.repo, run.env
    run.validate()
    extras = dict(extras or {})
    for (model, version), given in extras.items():
        if version not in repo.versions.get(model, {}):
            raise UsageError(f"extras given for {model} {version}, which is not declared")
        for path in (given.bundle, given.diff_report):
            if path is not None and not path.is_file():
                raise UsageError(f"{model} {version}: {path}: no such file")
    released = _released(repo)
    signed = _signed_digests(run)
    ci = _ci_tags(env)
    plan = _Plan(repo, fetch)
    for name in sorted(repo.models):
        spec = repo.models[name].manifest.spec
        versions: dict[str, DesiredVersion] = {}
        unreleased: set[str] = set()
        for entry in repo.sorted_versions(name):
            commit = released.get((name, entry.version))
            if commit is None:
                unreleased.add(entry.version)
                plan.unreleased.append((name, entry.version))
                continue
            given = extras.get((name, entry.version), ReleaseExtras())
            versions[entry.version], hashed = _desired_version(
                plan,
                entry,
                commit,
                given,
                ci,
                signed=signed.get((name, entry.version)),
                owner=spec.owner,
            )
            plan.sources[(name, entry.version)] = _Source(
                entry, entry.manifest.spec.signature or spec.signature, given, hashed
            )
        aliases = {channel: c.version for channel, c in spec.channels.items()}
        plan.models[name] = DesiredModel(
            name, versions, aliases, frozenset(unreleased), spec.description
        )
    return plan


def _extra_files(extras: ReleaseExtras) -> dict[str, Path]:
    files = [p for p in (extras.diff_report, extras.bundle) if p is not None]
    return {p.name: p for p in files}


def _apply(store: Store, plan: _Plan, name: str, rec: Reconciliation) -> list[Change]:
    changes: list[Change] = []
    numbers = dict(rec.numbers)
    desired = plan.models[name]
    for action in rec.actions:
        if isinstance(action, CreateModel):
            store.create_model(name, plan.repo.models[name].manifest.spec.description)
            changes.append(Change(name, "", "created the registered model"))
        elif isinstance(action, SetModelDescription):
            store.set_model_description(name, action.description)
            changes.append(Change(name, "", "set the description"))
        elif isinstance(action, CreateVersion):
            source = plan.sources[(name, action.semver)]
            want = desired.versions[action.semver]
            artifact = source.hashed or _signed_artifact(plan, source.entry, want)
            with progress.stage(f"register {name} {action.semver}", "upload to MLflow"):
                number = store.create_version(
                    name, want, artifact, source.signature, _extra_files(source.extras)
                )
            numbers[action.semver] = number
            changes.append(
                Change(name, f" {action.semver}", f"registered as MLflow version {number}")
            )
        elif isinstance(action, SetTags):
            store.set_tags(name, action.number, action.tags)
            keys = ", ".join(sorted(action.tags))
            changes.append(
                Change(name, f" {action.semver}", f"MLflow version {action.number}: set {keys}")
            )
            _reattach(store, plan, name, action)
        elif isinstance(action, DeleteTags):
            store.delete_tags(name, action.number, action.keys)
            keys = ", ".join(action.keys)
            changes.append(
                Change(name, f" {action.semver}", f"MLflow version {action.number}: removed {keys}")
            )
        elif isinstance(action, SetVersionDescription):
            store.set_version_description(name, action.number, action.description)
            changes.append(
                Change(
                    name, f" {action.semver}", f"MLflow version {action.number}: set description"
                )
            )
        elif isinstance(action, LogMetrics):
            store.log_metrics(action.run_id, action.metrics, f"{name} {action.semver}")
            keys = ", ".join(sorted(action.metrics))
            changes.append(
                Change(
                    name,
                    f" {action.semver}",
                    f"MLflow version {action.number}: logged metrics {keys}",
                )
            )
        elif isinstance(action, SetAlias):
            number = numbers[action.semver]
            store.set_alias(name, action.alias, number)
            changes.append(
                Change(name, f"@{action.alias}", f"-> MLflow version {number} ({action.semver})")
            )
        elif isinstance(action, DeleteAlias):
            store.delete_alias(name, action.alias)
            changes.append(Change(name, f"@{action.alias}", "removed (no such channel)"))
    return changes


def _signed_artifact(plan: _Plan, entry: VersionEntry, want: DesiredVersion) -> Path:
    """The workspace artifact whose SHA-256 tag came from the signed targets (its pointer
    md5 matched): the bytes about to be uploaded must have that SHA-256 too."""
    artifact = _workspace_artifact(plan.repo, entry, fetch=plan.fetch)
    sha256 = _digests(artifact, plan.repo.display(artifact))[0]
    if sha256 != want.tags[TAG_SHA256]:
        raise ArtifactError(
            plan.repo.display(artifact),
            f"SHA-256 {sha256} differs from the released one ({want.tags[TAG_SHA256]})",
        )
    return artifact


def _reattach(store: Store, plan: _Plan, name: str, action: SetTags) -> None:
    # A bundle signed, or a diff computed, after the version was registered: its tag
    # changed, so the file it describes goes to the version's run as well.
    extras = plan.sources[(name, action.semver)].extras
    files: dict[str, Path] = {}
    if TAG_BUNDLE_DIGEST in action.tags and extras.bundle is not None:
        files[extras.bundle.name] = extras.bundle
    if TAG_DIFF_SUMMARY in action.tags and extras.diff_report is not None:
        files[extras.diff_report.name] = extras.diff_report
    if not files:
        return
    run_id = next(
        (
            v.run_id
            for v in store.read_model(name, runs=False).versions
            if v.number == action.number
        ),
        None,
    )
    if run_id is not None:
        store.attach(run_id, files, f"{name} {action.semver}")


def _artifact_root(repo: Repository, uri: str) -> Path | None:
    return repo.root / DEFAULT_ARTIFACTS if is_local(uri) else None


def register(
    start: Path | ReleaseContext,
    *,
    tracking_uri: str | None = None,
    extras: Mapping[tuple[str, str], ReleaseExtras] | None = None,
    env: Mapping[str, str] | None = None,
) -> RegisterReport:
    """Mirror the repository containing ``start`` into MLflow.

    Args:
        start: the repository root or a folder inside it, or the run's context.
        tracking_uri: MLflow to use (see the module docstring for the default).
        extras: bundle, diff report and summary of some versions, by (model, SemVer).
        env: environment to read CI facts and ``MLFLOW_TRACKING_URI`` from
            (default ``os.environ``).

    Returns:
        The changes made and the drift left that ``register`` does not repair.

    Raises:
        RepositoryError: not inside a repository, or not a git work tree.
        ManifestError: the manifests are invalid (nothing is mirrored).
        ArtifactError: an artifact that must be read (a version to create, or one not
            released as a signed target) is in neither the work tree nor DVC's cache or
            remote, or differs from its DVC pointer.
        RegistryMirrorError: MLflow is unreachable or refuses a change.
        VerificationError: the trust metadata in the repository does not verify.
        ToolError: git is missing.
        UsageError: ``extras`` names an undeclared version or a missing file.
    """
    run = ReleaseContext.of(start, env)
    plan = _plan(run, extras, fetch=True)
    uri = resolve_tracking_uri(plan.repo, tracking_uri, run.env)
    changes: list[Change] = []
    left: list[Drift] = []
    versions: dict[tuple[str, str], str] = {}
    with session(uri, _artifact_root(plan.repo, uri)) as store:
        for name, desired in plan.models.items():
            rec = reconcile(desired, store.read_model(name))
            if rec.actions:
                changes.extend(_apply(store, plan, name, rec))
                # Read back what MLflow now holds: the report states facts, not intentions.
                rec = reconcile(desired, store.read_model(name))
            left.extend(rec.drifts)
            versions.update({(name, s): n for s, n in rec.numbers.items()})
    return RegisterReport(
        redact(uri), tuple(changes), tuple(left), versions, tuple(plan.unreleased)
    )


def check_drift(
    start: Path | ReleaseContext,
    *,
    tracking_uri: str | None = None,
    extras: Mapping[tuple[str, str], ReleaseExtras] | None = None,
    env: Mapping[str, str] | None = None,
) -> list[Drift]:
    """Every difference between the repository containing ``start`` and MLflow.

    Reports aliases moved, added or removed by hand, versions missing or registered
    by hand, and tags that differ from Git; changes nothing.

    Args:
        start: the repository root or a folder inside it, or the run's context.
        tracking_uri: MLflow to compare with (see the module docstring for the default).
        extras: as for :func:`register`; only the tags they imply are compared.
        env: environment to read ``MLFLOW_TRACKING_URI`` from (default ``os.environ``).

    Returns:
        The drift, model by model; empty when MLflow mirrors Git exactly.

    Raises:
        RepositoryError: not inside a repository, or not a git work tree.
        ManifestError: the manifests are invalid.
        ArtifactError: an artifact not released as a signed target is missing from the
            work tree (a check pulls nothing) or differs from its DVC pointer.
        RegistryMirrorError: MLflow is unreachable.
        VerificationError: the trust metadata in the repository does not verify.
        ToolError: git is missing.
        UsageError: ``extras`` names an undeclared version or a missing file.
    """
    run = ReleaseContext.of(start, env)
    plan = _plan(run, extras, fetch=False)
    uri = resolve_tracking_uri(plan.repo, tracking_uri, run.env)
    drifts: list[Drift] = []
    if _missing_sqlite(uri):
        # Opening a SQL store creates it; a check changes nothing, not even that.
        for name, desired in plan.models.items():
            drifts.extend(reconcile(desired, ObservedModel(name, exists=False)).drifts)
        return drifts
    with session(uri, None) as store:
        for name, desired in plan.models.items():
            drifts.extend(reconcile(desired, store.read_model(name)).drifts)
    return drifts


def _missing_sqlite(uri: str) -> bool:
    if not uri.startswith("sqlite:///"):
        return False
    return not Path(uri.removeprefix("sqlite:///").partition("?")[0]).exists()


def mlflow_versions(
    start: Path | ReleaseContext,
    *,
    tracking_uri: str | None = None,
    env: Mapping[str, str] | None = None,
    models: Collection[str] | None = None,
) -> dict[tuple[str, str], str]:
    """(model, SemVer) -> MLflow version number, for ``status`` and ``show``.

    Reads only (the models named by ``models``, every model when None); an embedded
    store that was never written is empty (not created).

    Raises:
        RepositoryError: not inside a repository.
        RegistryMirrorError: MLflow is unreachable.
    """
    run = ReleaseContext.of(start, env)
    repo, env = run.repo, run.env
    uri = resolve_tracking_uri(repo, tracking_uri, env)
    found: dict[tuple[str, str], str] = {}
    if _missing_sqlite(uri):
        return found
    with session(uri, None) as store:
        for name in sorted(repo.models if models is None else set(models) & set(repo.models)):
            for version in store.read_model(name, runs=False).versions:
                if version.semver is not None:
                    found[(name, version.semver)] = version.number
    return found
