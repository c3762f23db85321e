"""``modelreg publish``: upload artifacts with DVC and release them as signed TUF targets.

For every declared version the ONNX artifact, an OMS signature bundle, the delta from
its parent, the engines this run built, and the device-facing description with its
golden files (:mod:`pipelines.publish._description`) become TUF targets (with the model
facts as custom data), and the channels of every model become the signed
``channels.json``.  Target files are copied to the artifact remote *before*
the metadata that names them is written, so an interrupted publish leaves nothing a
device could fetch half-way, and re-running it finishes the job.  Released files are
immutable: a version already published is never re-signed, so a second run with
nothing new writes nothing.

The TUF targets live under ``<DVC remote>/modelreg/targets/`` (consistent-snapshot
names), on any remote DVC can write; devices use ``<DVC remote>/modelreg`` as their
artifact remote.  Once signed, the metadata is mirrored beside them, under
``<DVC remote>/modelreg/metadata/`` (:mod:`pipelines.publish._mirror`), for devices that
follow the remote instead of git.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from pipelines import dvc
from pipelines.build import BUILT, BuildRecord, BuildReport, EngineResult
from pipelines.context import ReleaseContext
from pipelines.errors import ArtifactError
from pipelines.fetch import fetch_artifact
from pipelines.provenance import ReleaseFacts
from pipelines.publish._description import stage_description
from pipelines.publish._external import (
    data_changed,
    data_rel,
    md5_of,
    sign_version,
    stage_data_deltas,
)
from pipelines.publish._mirror import (
    TIMESTAMP,
    FsMirror,
    LocalMirror,
    MirrorFolder,
    MirrorState,
    mirror,
    read_state,
    timestamp_floor,
)
from pipelines.publish._tensors import ObjectSource
from registry import progress
from registry.atomic import write_atomic
from registry.errors import (
    ManifestError,
    PolicyError,
    Problem,
    RegistryError,
    ToolError,
    UsageError,
)
from registry.gitinfo import git
from registry.layout import model_file
from registry.repository import Repository, VersionEntry
from signing import target_names
from signing.errors import FileSetError
from signing.keys import private_key_from_env
from signing.oms import ModelFacts
from signing.provenance import Provenance
from signing.target_names import (
    artifact_path,
    bundle_path,
    delta_path,
    deprecation_path,
    engine_path,
    external_data_path,
    object_path,
    provenance_path,
    version_path,
)
from signing.tuf_facts import CHANNELS_PATH, ChannelsDoc, TargetFacts, next_channels
from signing.tuf_repo import TrustRepo
from signing.tuf_roles import MIRROR_DIR, TARGETS_DIR, stored_name
from signing.workspace import ONLINE, TrustPaths, signer

TUF_SUBDIR: Final = "modelreg"
RELEASE_DIR: Final = ".modelreg/release"


@dataclass(frozen=True)
class CiContext:
    """Where a release is being made: the commit and, in CI, the run."""

    git_commit: str
    ci_run: str | None = None
    ci_url: str | None = None
    facts: ReleaseFacts | None = None
    """Where each version came from (its pull request, approvals, policy, run)."""

    @classmethod
    def from_env(cls, root: Path, env: Mapping[str, str] | None = None) -> CiContext:
        """The work tree's ``HEAD`` and the run from ``GITHUB_RUN_ID``/``GITHUB_SERVER_URL``/
        ``GITHUB_REPOSITORY``.

        The commit is what is built, ``HEAD``: ``GITHUB_SHA`` names the commit that
        started the run, which a re-run or a manual run has moved past.

        Raises:
            ToolError: git is missing or the work tree has no commit.
        """
        from pipelines.github import ActionsRun

        env = os.environ if env is None else env
        run = ActionsRun.from_env(env)
        commit = git(root, "rev-parse", "HEAD").stdout.strip()
        return cls(commit, run.run_id, run.url, ReleaseFacts(root, commit, env))


@dataclass(frozen=True)
class PublishReport:
    """What a publish did."""

    remote: str
    pushed: int
    added: list[str] = field(default_factory=list)
    versions: Mapping[str, int] = field(default_factory=dict)
    metadata: list[Path] = field(default_factory=list)
    mirrored: list[str] = field(default_factory=list)
    """Metadata files uploaded to the remote's mirror (``<remote>/metadata/``), in order."""

    @property
    def changed(self) -> bool:
        """Whether anything new was released."""
        return bool(self.added or self.metadata)


class TargetStore:
    """Where TUF targets go: ``<DVC remote>/modelreg/targets/``, local or not.

    A local remote is written directly.  Any other DVC remote (S3, HTTP, SSH, ...) is
    reached through DVC's own filesystem for it, so the same credentials and config
    apply: targets are staged in a local folder and uploaded file by file, skipping
    those already there (target names carry their hash, so equal names are equal bytes).
    """

    def __init__(self, root: Path, remote: str | None) -> None:
        url = dvc.remote_url(root, remote)
        self.url = url.rstrip("/") + "/" + TUF_SUBDIR
        self.local: Path | None = None
        self._fs: Any = None
        self._base = ""
        if "://" not in url or url.startswith("file://"):
            self.local = Path(url.removeprefix("file://")) / TUF_SUBDIR
        else:
            handle = dvc.remote_fs(root, remote)
            self._fs, self._base = handle.fs, handle.fs.join(handle.path, TUF_SUBDIR)

    def load_channels(self, trust: TrustRepo) -> ChannelsDoc | None:
        """The signed channels document as published (verified), if any.

        Raises:
            DigestMismatchError: the remote copy differs from the signed one.
            ToolError: the remote cannot be read.
        """
        if trust.published(CHANNELS_PATH) is None:
            return None
        return ChannelsDoc.from_bytes(self.read(trust, CHANNELS_PATH))

    def read(self, trust: TrustRepo, path: str) -> bytes:
        """A published target's bytes from the store, verified against the signed metadata.

        Raises:
            FileSetError: ``path`` is not published, or the store has no copy.
            DigestMismatchError: the store's copy differs from the signed one.
            ToolError: the remote cannot be read.
        """
        if self.local is not None:
            return trust.read_target(self.local, path)
        info = trust.published(path)
        if info is None:
            raise FileSetError("not published", path)
        with tempfile.TemporaryDirectory() as tmp:
            rel = f"{TARGETS_DIR}/{stored_name(info)}"
            dest = Path(tmp, rel)
            dest.parent.mkdir(parents=True)
            self._call("download", self._fs.get_file, self._fs.join(self._base, rel), str(dest))
            return trust.read_target(Path(tmp), path)

    def write(self, trust: TrustRepo) -> list[str]:
        """Copy the staged targets to the store; returns what was uploaded.

        Raises:
            DigestMismatchError: a source changed since it was staged.
            ToolError: the remote cannot be written.
        """
        if self.local is not None:
            return [str(p) for p in trust.write_targets_to(self.local)]
        uploaded = []
        with tempfile.TemporaryDirectory() as tmp:
            trust.write_targets_to(Path(tmp))
            for path in sorted(Path(tmp).rglob("*")):
                if not path.is_file():
                    continue
                rel = path.relative_to(tmp).as_posix()
                dest = self._fs.join(self._base, rel)
                if not self._call("check", self._fs.exists, dest):
                    self._call("upload", self._fs.put_file, str(path), dest)
                    uploaded.append(rel)
        return uploaded

    def write_objects(self, objects: Mapping[str, ObjectSource]) -> list[str]:
        """Write each object (``signing.target_names.object_path``) the store lacks;
        returns the paths written (an object already there has the same bytes: its
        name is their digest).

        Raises:
            OSError: a source cannot be read, or the local store not written.
            ToolError: the remote cannot be written.
        """
        written = []
        for digest, source in sorted(objects.items()):
            rel = f"{TARGETS_DIR}/{object_path(digest)}"
            if self.local is not None:
                dest = self.local / rel
                if dest.is_file() and dest.stat().st_size == source.length:
                    continue  # written whole before (renamed into place once complete)
                source.copy_to(dest, digest)
            else:
                remote = self._fs.join(self._base, rel)
                if self._call("check", self._fs.exists, remote):
                    continue
                with tempfile.TemporaryDirectory() as tmp:
                    staged = Path(tmp, digest)
                    source.copy_to(staged, digest)
                    self._call("upload", self._fs.put_file, str(staged), remote)
            written.append(rel)
        return written

    def mirror_state(self, trust: TrustRepo) -> MirrorState:
        """What ``<store>/metadata/`` holds of ``trust``'s files (see
        :func:`pipelines.publish._mirror.read_state`).

        Raises:
            ToolError: the remote cannot be read.
        """
        return read_state(self._mirror_folder(), trust.mirror_files())

    def mirror_floor(self, trust: TrustRepo) -> dict[str, int]:
        """The versions to sign above, before signing: a timestamp ``trust``'s keys
        signed that the mirror holds and git does not (see
        :func:`pipelines.publish._mirror.timestamp_floor`).

        Raises:
            ToolError: the remote cannot be read.
        """
        ours = dict(trust.mirror_files()).get(TIMESTAMP)
        return timestamp_floor(ours, self.mirror_state(trust), trust.mirrored_timestamp)

    def write_metadata(self, trust: TrustRepo) -> list[str]:
        """Mirror the signed metadata to ``<store>/metadata/``; returns what was uploaded.

        Call it after :meth:`write` and after signing: the roots, then targets and
        snapshot metadata, then ``timestamp.json`` last (see
        :mod:`pipelines.publish._mirror`), so no reader sees a timestamp that names a
        file not uploaded yet.  Nothing changed since the last mirror uploads nothing.

        Raises:
            RollbackError: the mirror holds a newer timestamp ``trust``'s keys signed.
            ToolError: the remote cannot be read or written.
        """
        return mirror(self._mirror_folder(), trust.mirror_files(), trust.mirrored_timestamp)

    def _mirror_folder(self) -> MirrorFolder:
        if self.local is not None:
            return LocalMirror(self.local / MIRROR_DIR)
        base = self._fs.join(self._base, MIRROR_DIR)
        return FsMirror(self._fs, base, f"{self.url}/{MIRROR_DIR}")

    def _call(self, what: str, fn: Any, *args: str) -> Any:
        try:
            return fn(*args)
        except Exception as e:  # fsspec backends raise anything; report it in one line
            raise ToolError(f"cannot {what} {args[-1]} on {self.url}: {e}") from e


def _facts(entry: VersionEntry, kind: str, ctx: CiContext, **extra: str) -> TargetFacts:
    spec = entry.manifest.spec
    return TargetFacts.model_validate(
        {
            "kind": kind,
            "model": entry.name,
            "version": entry.version,
            "git_commit": ctx.git_commit,
            "ci_run": ctx.ci_url or ctx.ci_run,
            "parent": spec.parent,
            "targets": [t.name for t in spec.targets],
            **extra,
        }
    )


def _stage_version(
    repo: Repository,
    trust: TrustRepo,
    entry: VersionEntry,
    *,
    ctx: CiContext,
    paths: TrustPaths,
    env: Mapping[str, str] | None,
    record: BuildRecord | None,
    objects: dict[str, ObjectSource],
) -> list[str]:
    added: list[str] = []
    artifact = repo.root / entry.manifest.spec.artifact.path
    target = artifact_path(entry.name, entry.version)
    bundle_target = bundle_path(entry.name, entry.version)
    data_targets = [
        external_data_path(entry.name, entry.version, name)
        for name in entry.manifest.spec.artifact.external_data
    ]
    wanted = [target, bundle_target, version_path(entry.name, entry.version), *data_targets]
    if any(trust.published(t) is None for t in wanted):
        _fetch(repo, entry)
    if trust.published(target) is None:
        md5 = _pointer_md5(repo, entry)
        extra = {"dvc_md5": md5} if md5 else {}
        trust.add_target(target, artifact, _facts(entry, "artifact", ctx, **extra))
        added.append(target)
    for name in entry.manifest.spec.artifact.external_data:
        data_target = external_data_path(entry.name, entry.version, name)
        if trust.published(data_target) is None:
            md5 = md5_of(repo, data_rel(entry, name))
            extra = {"dvc_md5": md5} if md5 else {}
            facts_data = _facts(entry, "external_data", ctx, file=name, **extra)
            trust.add_target(data_target, artifact.parent / name, facts_data)
            added.append(data_target)
    if trust.published(bundle_target) is None:
        key = private_key_from_env("targets", env, paths.keys)
        facts = ModelFacts(
            model=entry.name,
            version=entry.version,
            git_commit=ctx.git_commit,
            ci_run=ctx.ci_url or ctx.ci_run or "local",
            parent=entry.manifest.spec.parent,
            targets=tuple(t.name for t in entry.manifest.spec.targets),
        )
        with progress.stage(f"publish {entry.name} {entry.version}", "sign"):
            bundle = sign_version(artifact, entry, key, facts)
        data = json.dumps(bundle, separators=(",", ":")).encode()
        trust.add_target(bundle_target, data, _facts(entry, "bundle", ctx))
        # Kept beside the build records, so the MLflow mirror can attach it.
        local = repo.root / RELEASE_DIR / bundle_target
        local.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(local, data)
        added.append(bundle_target)
    added.extend(_stage_engines(trust, entry, ctx, record))
    parent = entry.manifest.spec.parent
    if parent is not None:
        delta_target = delta_path(entry.name, entry.version, parent)
        if trust.published(delta_target) is None:
            added.extend(_stage_delta(repo, trust, entry, delta_target, ctx))
        added.extend(
            stage_data_deltas(
                repo, trust, entry, parent,
                fetch=_fetch, facts=lambda kind, **extra: _facts(entry, kind, ctx, **extra),
                out_dir=repo.root / RELEASE_DIR,
            )
        )  # fmt: skip
    provenance = _provenance(repo, trust, entry, ctx=ctx, paths=paths, env=env, added=added)
    # Last: the description names the engines staged above.
    added.extend(
        stage_description(
            repo, trust, entry, lambda kind: _facts(entry, kind, ctx), objects,
            provenance=provenance,
        )
    )  # fmt: skip
    deprecated = entry.manifest.spec.deprecated
    gone = deprecation_path(entry.name, entry.version)
    if deprecated is not None and trust.published(gone) is None:
        trust.add_target(gone, deprecated.reason.encode(), _facts(entry, "deprecation", ctx))
        added.append(gone)
    return added


def _provenance(
    repo: Repository,
    trust: TrustRepo,
    entry: VersionEntry,
    *,
    ctx: CiContext,
    paths: TrustPaths,
    env: Mapping[str, str] | None,
    added: list[str],
) -> Provenance | None:
    """Where the version came from, when its description or its SLSA provenance is
    still to be signed (asked of git and GitHub once, for both); the SLSA provenance
    staged (its path appended to ``added``)."""
    slsa = provenance_path(entry.name, entry.version)
    description = version_path(entry.name, entry.version)
    if ctx.facts is None or all(trust.published(t) for t in (slsa, description)):
        return None
    provenance = ctx.facts.of(repo, entry)
    if trust.published(slsa) is None:
        added.append(_stage_slsa(trust, entry, provenance, ctx=ctx, paths=paths, env=env))
    return provenance


def _stage_slsa(
    trust: TrustRepo,
    entry: VersionEntry,
    provenance: Provenance,
    *,
    ctx: CiContext,
    paths: TrustPaths,
    env: Mapping[str, str] | None,
) -> str:
    """Stage the version's SLSA provenance: its released files as subjects, signed by
    the targets key in a DSSE envelope (``signing.provenance``)."""
    from signing.provenance import sign_envelope, slsa_statement

    files = [artifact_path(entry.name, entry.version)] + [
        external_data_path(entry.name, entry.version, name)
        for name in entry.manifest.spec.artifact.external_data
    ]
    subjects = {f: trust.targets[f].hashes["sha256"] for f in files if f in trust.targets}
    parent = entry.manifest.spec.parent
    base = artifact_path(entry.name, parent) if parent is not None else None
    parent_artifact = None
    if base is not None and base in trust.targets:
        parent_artifact = (base, trust.targets[base].hashes["sha256"])
    statement = slsa_statement(
        subjects, model=entry.name, version=entry.version, provenance=provenance,
        repository_url=ctx.facts.repository_url if ctx.facts is not None else None,
        parent_artifact=parent_artifact, finished_on=provenance.released_at,
    )  # fmt: skip
    key = private_key_from_env("targets", env, paths.keys)
    target = provenance_path(entry.name, entry.version)
    trust.add_target(target, sign_envelope(statement, key), _facts(entry, "provenance", ctx))
    return target


def _fetch(repo: Repository, entry: VersionEntry) -> Path:
    """The version's artifact in the work tree, pulled through DVC if it is missing there
    (a fresh CI checkout has none) and checked against its pointer, and so is each of
    its external data files (beside it)."""
    first, *data = entry.manifest.spec.artifact.files()
    for rel in data:
        fetch_artifact(repo.root, rel, repo.display(repo.root / rel))
    return fetch_artifact(repo.root, first, repo.display(repo.root / first)).path


def _pointer_md5(repo: Repository, entry: VersionEntry) -> str | None:
    """The md5 the version's DVC pointer records (checked while loading, else now)."""
    return md5_of(repo, entry.manifest.spec.artifact.path)


def released_deprecations(repo: Repository, trust: TrustRepo) -> list[Problem]:
    """Versions whose signed deprecation the manifests remove or reword.

    A released deprecation is a signed file devices act on (they never install the
    version); like every released file it is immutable.  A version deprecated by
    mistake is declared again under a new version number.
    """
    problems = []
    for entry in repo.all_versions():
        info = trust.published(deprecation_path(entry.name, entry.version))
        if info is None:
            continue
        deprecated = entry.manifest.spec.deprecated
        now = deprecated.reason.encode() if deprecated is not None else None
        if now is not None and hashlib.sha256(now).hexdigest() == info.hashes.get("sha256"):
            continue
        line, col = entry.doc.position(("spec", "deprecated") if now else ("spec",))
        what = "changed" if now is not None else "removed"
        problems.append(Problem(
            entry.file,
            f"version {entry.version} is released as deprecated (devices refuse it); the "
            f"deprecation cannot be {what}: declare a new version to serve these weights",
            line, col, "spec.deprecated",
        ))  # fmt: skip
    return problems


def released_changes(repo: Repository, trust: TrustRepo) -> list[Problem]:
    """Released versions whose artifact no longer matches what was signed.

    Versions are immutable once released: a different file must be a new version.
    The check compares the DVC pointer's md5 with the one signed at release (no
    hashing); for releases signed before that fact existed, the workspace file's
    SHA-256 when it is present.
    """
    from registry.safe_io import open_regular

    problems = []
    for entry in repo.all_versions():
        info = trust.published(artifact_path(entry.name, entry.version))
        if info is None:
            continue
        facts = TargetFacts.from_custom(info.custom)
        artifact = entry.manifest.spec.artifact.path
        if facts.dvc_md5 is not None:
            changed = _pointer_md5(repo, entry) not in (None, facts.dvc_md5)
        else:
            try:
                with open_regular(repo.root / artifact, root=repo.root) as fh:
                    hasher = hashlib.sha256()
                    while chunk := fh.read(1 << 20):
                        hasher.update(chunk)
                digest = hasher.hexdigest()
            except (RegistryError, OSError):
                continue  # not in the work tree (or a link, which validation reports)
            changed = digest != info.hashes.get("sha256")
        changed = changed or data_changed(repo, trust, entry)
        if changed:
            line, col = entry.doc.position(("spec", "artifact"))
            problems.append(
                Problem(
                    entry.file,
                    f"version {entry.version} is released and its artifact {artifact} has "
                    "changed since; versions are immutable: declare a new version",
                    line,
                    col,
                    "spec.artifact",
                )
            )
    return problems


def _stage_engines(
    trust: TrustRepo, entry: VersionEntry, ctx: CiContext, record: BuildRecord | None
) -> list[str]:
    """The engines this run built for this version and that passed their check.

    ``record`` is this run's build of the version, held in memory: nothing is read
    from a build record on disk, which a pull request could have committed (one that
    named ``.git/config`` or a key file as an engine had them signed).  Each engine
    file is read from the run's build folder under the name the layout gives it,
    never through a link, for a target the manifest declares, and must still have the
    digest the build recorded.  TensorRT engines are built on the device (their GPU
    decides), so only what the runner could build is published; a version this run
    did not build publishes none.

    Raises:
        ArtifactError: an engine is not what this run built.
    """
    if record is None or not record.ok:
        return []
    declared = {t.name: t.engine for t in entry.manifest.spec.targets}
    added = []
    for engine in record.engines:
        if engine.status != BUILT:
            continue
        name = engine_file_name(engine.target, declared.get(engine.target))
        target = engine_path(entry.name, entry.version, engine.target, declared[engine.target])
        if trust.published(target) is not None:
            continue
        data = _built_engine(record.record_path.parent, name, engine)
        trust.add_target(target, data, _facts(entry, "engine", ctx, target=engine.target))
        added.append(target)
    return added


def engine_file_name(target: str, engine: str | None) -> str:
    """The file a build writes for a declared target (``<target>.ort.onnx`` or ``.plan``,
    :func:`signing.target_names.engine_file_name`).

    Raises:
        ArtifactError: the target is not declared, or its engine makes no file here.
    """
    try:
        return target_names.engine_file_name(target, engine)
    except UsageError:
        raise ArtifactError(
            target, "not a target this version declares; no engine published"
        ) from None


def _built_engine(folder: Path, name: str, engine: EngineResult) -> bytes:
    """The bytes of engine ``name`` in this run's build ``folder``, as the build recorded them.

    Raises:
        ArtifactError: the file is a link or not a regular file, or its size or
            SHA-256 differs from what the build recorded.
    """
    from registry.safe_io import open_regular

    path = folder / name
    try:
        with open_regular(path, root=folder, max_bytes=engine.size or 0) as fh:
            data = fh.read((engine.size or 0) + 1)
    except (RegistryError, OSError) as e:
        reason = f"engine not readable as a regular file of the size built ({e})"
        raise ArtifactError(str(path), reason) from None
    if len(data) != engine.size or hashlib.sha256(data).hexdigest() != engine.sha256:
        raise ArtifactError(str(path), "engine changed since it was built; not published")
    return data


def _stage_delta(
    repo: Repository, trust: TrustRepo, entry: VersionEntry, target: str, ctx: CiContext
) -> list[str]:
    """A delta from the parent's artifact, so devices holding it download only what changed."""
    from registry.delta import encode
    from signing.hashing import sha256_file

    parent = repo.versions.get(entry.name, {}).get(entry.manifest.spec.parent or "")
    if parent is None:
        return []  # validation already reported the dangling parent
    base, new = _fetch(repo, parent), _fetch(repo, entry)
    with progress.stage(f"publish {entry.name} {entry.version}", f"delta from {parent.version}"):
        facts = _facts(entry, "delta", ctx, base=parent.version, base_sha256=sha256_file(base))
        trust.add_target(target, encode(base, new), facts)
    return [target]


def published_provenance(repo: Repository, model: str, version: str) -> Provenance | None:
    """Where a released version came from, as its signed description says: read from
    the artifact remote and checked against the repository's signed metadata.

    Returns:
        None when the description signs no provenance (a release made before it was
        recorded).

    Raises:
        FileSetError: the version's description is not published, or the remote has
            no copy.
        DigestMismatchError: the remote's copy differs from the signed one.
        VerificationError: the trust metadata does not verify.
        ToolError: the remote cannot be read.
    """
    from signing.version_doc import VersionDoc
    from signing.workspace import trust_paths

    paths = trust_paths(repo.root, repo.config)
    trust = TrustRepo.load(paths.metadata, expiry=paths.expiry)
    data = TargetStore(repo.root, repo.config.remote).read(trust, version_path(model, version))
    try:
        return VersionDoc.from_bytes(data).provenance
    except ValueError as e:
        raise FileSetError(
            f"not a version description ({e})", version_path(model, version)
        ) from None


def current_branch(root: Path, env: Mapping[str, str] | None = None) -> str | None:
    """The branch being released: ``GITHUB_REF`` in CI, else the work tree's ``HEAD``.

    None when it is not a branch (a tag, a pull-request ref, a detached ``HEAD``).
    """
    from pipelines.github import GitHubEnv

    github = GitHubEnv.from_env(os.environ if env is None else env)
    if github.ref is not None:
        return github.branch
    proc = git(root, "symbolic-ref", "--quiet", "--short", "HEAD", check=False)
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def branch_problems(
    repo: Repository,
    previous: ChannelsDoc | None,
    desired: Mapping[str, Mapping[str, tuple[str, float | None]]],
    branch: str | None,
) -> list[Problem]:
    """Channel changes that may not be released from ``branch`` (the model's
    ``spec.promotion.branch`` is the only one whose commits move its channels).

    A model deleted while its channels are released is refused from every branch (its
    policy went with its manifest).  A guard against releasing from the wrong checkout,
    read from the manifests being released; the boundary against a rogue release is
    where the online keys live (the release job on the promotion branch), and ``ci pr``
    holds changes of the policy itself to the approvals of the base.
    """
    old = previous.models if previous is not None else {}
    here = f"branch {branch!r}" if branch else "a detached HEAD or a ref that is not a branch"
    # A model deleted while devices follow its signed channels: its policy (and so its
    # branch) went with its manifest, and its released versions may not go (ci pr refuses
    # that too).  Emptying its channels is the release that stops serving it.
    problems = [
        Problem(
            model_file(repo.config.manifests, name),
            f"{name!r} is deleted but its channels are released: devices serve it; "
            "restore it, release it with no channels, and deprecate its versions",
        )
        for name in sorted(set(old) - set(repo.models))
        if old[name]
    ]
    for name, channels in sorted(desired.items()):
        allowed = repo.models[name].manifest.spec.promotion.branch
        if branch == allowed:
            continue
        before = {c: (e.version, e.percent) for c, e in old.get(name, {}).items()}
        if before == dict(channels):
            continue
        entry = repo.models[name]
        line, col = entry.doc.position(("spec", "channels"))
        problems.append(
            Problem(
                entry.file,
                f"channel changes of {name!r} are released from branch {allowed!r} only, "
                f"not from {here}",
                line,
                col,
                "spec.channels",
            )
        )
    return problems


def publish(
    start: Path | ReleaseContext,
    *,
    env: Mapping[str, str] | None = None,
    push: bool = True,
    built: BuildReport | None = None,
) -> PublishReport:
    """Push artifacts and release every version as signed TUF targets.

    Engines are published only from ``built``, the build this same run made (``ci
    release`` passes it); without it no engine is published.

    Raises:
        ManifestError: the manifests are invalid, or a golden case of a version
            whose description is not released yet cannot be read (nothing is
            published).
        ArtifactError: an engine of ``built`` changed since it was built, or an
            artifact is in neither the work tree nor DVC's cache or
            remote, or differs from its pointer.
        KeyMaterialError: the targets, snapshot or timestamp key is not available.
        ToolError: DVC or git fails, or the remote cannot be written.
        VerificationError: the trust metadata in the repository does not verify; a
            ``RollbackError`` when the remote's metadata mirror is ahead of it.
    """
    # The signer parses every manifest itself: no parse cache from the checkout.
    run = ReleaseContext.of(start, env, cache=False)
    repo, env = run.repo, run.env
    run.validate()
    paths = run.trust_paths
    # Every key is resolved before anything is pushed or written: a missing secret
    # fails the job at once instead of half-way.
    signers = {role: signer(paths, role, env) for role in ONLINE}
    store = TargetStore(repo.root, repo.config.remote)
    trust = run.trust()
    swapped = released_changes(repo, trust) + released_deprecations(repo, trust)
    if swapped:
        raise ManifestError(swapped)
    previous = store.load_channels(trust)
    desired = {
        name: {
            channel: (a.version, a.rollout.percent if a.rollout else None)
            for channel, a in model.manifest.spec.channels.items()
        }
        for name, model in repo.models.items()
    }
    off_branch = branch_problems(repo, previous, desired, current_branch(repo.root, env))
    if off_branch:
        raise PolicyError(off_branch)
    pushed = dvc.push(repo.root, repo.config.remote) if push else 0
    ctx = CiContext.from_env(repo.root, env)
    added: list[str] = []
    records = {(r.model, r.version): r for r in built.records} if built is not None else {}
    objects: dict[str, ObjectSource] = {}
    for entry in repo.all_versions():
        record = records.get((entry.name, entry.version))
        added.extend(
            _stage_version(
                repo, trust, entry, ctx=ctx, paths=paths, env=env, record=record, objects=objects
            )
        )
    shadows = {
        name: {c: a.shadow for c, a in model.manifest.spec.channels.items() if a.shadow}
        for name, model in repo.models.items()
    }
    channels = next_channels(previous, desired, shadows)
    if channels is not previous:
        trust.set_channels(channels, previous)
        added.append(CHANNELS_PATH)
    with progress.stage("publish", f"upload targets to {store.url}"):
        # objects first: a description names them, and a device may read it at once
        store.write_objects(objects)
        store.write(trust)
    # a timestamp mirrored by a run whose metadata commit was lost: sign above it
    floor = store.mirror_floor(trust)
    with progress.stage("publish", "sign metadata"):
        result = trust.publish(signers, floor=floor)
    run.signed(trust)
    with progress.stage("publish", f"mirror metadata to {store.url}"):
        mirrored = store.write_metadata(trust)
    return PublishReport(
        store.url, pushed, added, dict(result.versions), list(result.written), mirrored
    )
