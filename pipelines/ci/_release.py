"""``modelreg ci release``: build, publish, commit and mirror what is not released yet.

Runs on the main branch: the versions not yet released are built into a folder of this
run's own, published (DVC push, OMS bundles, signed TUF targets and channels), the
re-signed metadata is committed with ``[skip ci]`` and the release is mirrored into
MLflow; with nothing new it changes nothing.
"""

from __future__ import annotations

import contextlib
import gc
import os
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Final

from pipelines.build import build
from pipelines.ci._base import trust_folder_moved
from pipelines.ci._report import CiReport, failed, write_outputs
from pipelines.context import ReleaseContext
from pipelines.errors import BuildError
from registry import progress
from registry.atomic import write_atomic
from registry.cache import untrusted_checkout
from registry.config import CONFIG_FILE
from registry.errors import ManifestError, RegistryError
from registry.gitinfo import git
from registry.repository import Repository
from signing.tuf_repo import TrustRepo
from signing.workspace import release_states

if TYPE_CHECKING:
    from pipelines.register import RegisterReport, ReleaseExtras


def _check_history(run: ReleaseContext) -> None:
    """Refuse to sign on top of trust metadata that goes back on the branch's history.

    Raises:
        ManifestError: a root was rewritten or removed, a role is below a version the
            branch already released, or the metadata does not continue the branch's
            before the last merge (its first parent).
        VerificationError: the metadata (or its first parent's) does not verify.
    """
    from pipelines.ci._base import history_problems
    from signing.errors import HistoryError, RollbackError

    repo, paths = run.repo, run.trust_paths
    if not run.has_trust():
        if git(repo.root, "log", "-1", "--format=%H", "--", repo.config.trust.metadata).stdout:
            raise ManifestError.single(
                repo.display(paths.metadata),
                "the trust metadata this branch released is gone; restore it from the "
                "last release commit",
            )
        return
    trust = run.trust()
    where = repo.display(paths.metadata)
    try:
        regressions = history_problems(repo.root, repo.config, trust)
        _check_follows_parent(repo, trust)
    except (RollbackError, HistoryError) as e:
        raise ManifestError.single(where, str(e).removeprefix(f"{where}: ")) from None
    if regressions:
        raise ManifestError(regressions)


def _check_follows_parent(repo: Repository, trust: TrustRepo) -> None:
    """Check that the checkout's metadata continues the branch's before the last merge:
    that of the nearest first-parent ancestor whose metadata verifies (a revert of a bad
    merge follows the commit before it), wherever that commit's config put it.

    Raises:
        RollbackError, HistoryError: it goes back on what that ancestor released.
        ManifestError: the configuration moved the released metadata to another folder
            (devices read it where it was).
    """
    from pipelines.ci._base import config_at, trust_at
    from signing.errors import VerificationError

    listed = git(
        repo.root, "rev-list", "--first-parent", f"--max-count={_ANCESTORS}", "HEAD^1", "--",
        check=False,
    )  # fmt: skip
    for commit in listed.stdout.split() if not listed.returncode else []:
        try:
            config = config_at(repo.root, commit)
            if config is None:
                return  # before the repository was set up: nothing released to follow
            with trust_at(repo.root, commit, config) as previous:
                pass  # its state is kept in memory
        except (VerificationError, ManifestError):
            continue  # a broken commit (the merge being reverted): look further back
        if previous is None:
            continue  # nothing released there, or all removed (history_problems' case)
        if config.trust.metadata != repo.config.trust.metadata:
            raise ManifestError.single(CONFIG_FILE, trust_folder_moved(config, repo.config))
        trust.check_follows(previous)
        return


_ANCESTORS: Final = 64
"""First-parent ancestors searched for metadata that verifies."""


def _commit_metadata(repo: Repository, targets: int) -> str | None:
    """Commit the re-signed trust metadata with ``[skip ci]``; the new commit, if any."""
    from signing.workspace import trust_paths

    metadata = str(trust_paths(repo.root, repo.config).metadata)
    git(repo.root, "add", "--", metadata)
    staged = git(repo.root, "diff", "--cached", "--quiet", "--", metadata, check=False)
    if not staged.returncode:
        return None
    message = f"modelreg release: {targets} target(s) [skip ci]"
    git(repo.root, "commit", "-q", "-m", message, "--", metadata)
    return git(repo.root, "rev-parse", "HEAD").stdout.strip()


class _Stopwatch:
    """Milliseconds per named stage, in order (reported by ``ci release``), each stage
    shown while it runs (:mod:`registry.progress`)."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        with progress.stage("release", name) as running:
            try:
                yield
            finally:
                self.timings[name] = round((time.perf_counter() - running.started) * 1000, 1)
                # What a stage imported and built (MLflow, DVC, ONNX; the repository)
                # stays alive until the command ends: later stages' collections need
                # not walk it again (as registry.repository does after a load).
                gc.freeze()


def _ci_release(start: Path, *, env: Mapping[str, str] | None = None) -> CiReport:
    """Build what is not yet released, publish it, commit the signed metadata, mirror MLflow.

    The report's ``timings_ms`` gives each stage: validate, build, publish (DVC push,
    signing, deltas, TUF metadata), commit, diff (the reports attached in MLflow),
    register.

    Raises:
        ManifestError: the manifests are invalid.
        RepositoryError: manifests, pointers or goldens differ from the last commit.
        KeyMaterialError: an online key is missing.
        ToolError: git or DVC fails.
    """
    from pipelines.ci._base import refuse_uncommitted, tracked_local_state
    from pipelines.publish import publish
    from pipelines.register import register

    env = os.environ if env is None else env
    clock = _Stopwatch()
    report = CiReport("release", data={"timings_ms": clock.timings})
    with clock.stage("validate"):
        # No local state from the checkout (no parse cache: see ci_release): a merged
        # pull request may have committed some (build records, keys, caches) for the
        # signer.  The repository is loaded, validated and its trust metadata verified
        # once here, for every stage of the run.
        run = ReleaseContext.load(start, env, cache=False)
        repo = run.repo
        refuse_uncommitted(repo)
        problems = run.problems() + tracked_local_state(repo.root)
        if problems:
            raise ManifestError(problems)
        _check_history(run)
    state = release_states(run.trust()) if run.has_trust() else {}
    pending = [
        (e.name, e.version)
        for e in repo.all_versions()
        if not (released := state.get((e.name, e.version))) or not released.published
    ]
    # Built into a folder of this run's own: what is signed comes from this build.
    with tempfile.TemporaryDirectory(prefix="modelreg-release-build-") as out:
        built = None
        if pending:
            try:
                with clock.stage("build"):
                    built = build(run, versions=pending, out_root=Path(out))
            except BuildError as e:
                report.problems.extend(str(p) for p in e.problems)
                report.data["build"] = e.report.to_json()
                report.sections.append(
                    "## modelreg release\n\n**❌ build failed; nothing published**"
                )
                write_outputs(repo.root, report, env)
                return report
            report.data["build"] = built.to_json()
        else:
            clock.timings["build"] = 0.0
        with clock.stage("publish"):
            published = publish(run, built=built)
    report.data["published"] = published.added
    committed = None
    with clock.stage("commit"):
        if published.changed:
            committed = _commit_metadata(repo, len(published.added))
    report.data["commit"] = committed
    # Git is the source of truth; MLflow mirrors what was just released.  Versions
    # MLflow lacks (new ones, or ones a failed run did not mirror) get their OMS bundle
    # and their diff report attached.
    with clock.stage("diff"):
        extras, summaries, failures = _mirror_extras(run)
    report.problems.extend(failures)
    with clock.stage("register"):
        mirrored = register(run, extras=extras)
    report.data["mlflow"] = {"changes": len(mirrored.changes), "uri": mirrored.tracking_uri}
    report.problems.extend(str(d) for d in mirrored.drifts)
    report.sections.append(_release_section(published.added, summaries, mirrored, clock))
    write_outputs(repo.root, report, env)
    return report


def _release_section(
    added: list[str],
    summaries: Mapping[tuple[str, str], str],
    mirrored: RegisterReport,
    clock: _Stopwatch,
) -> str:
    lines = [f"- `{t}`" for t in added] or ["- nothing new: every version is released"]
    lines.extend(f"- {model} {version}: {text}" for (model, version), text in summaries.items())
    lines.append(f"- MLflow: {len(mirrored.changes)} change(s) at {mirrored.tracking_uri}")
    stages = ", ".join(f"{k} {v / 1000:.1f} s" for k, v in clock.timings.items())
    lines.append(f"- stages: {stages}")
    return "\n".join(["## modelreg release", "", *lines])


def _mirror_extras(
    run: ReleaseContext,
) -> tuple[dict[tuple[str, str], ReleaseExtras], dict[tuple[str, str], str], list[str]]:
    """OMS bundle and diff report of each released version that MLflow does not hold yet.

    The bundle is read from the artifact remote (verified against the signed metadata),
    the diff is computed against the parent and written under ``.modelreg/release/diffs``.
    A bundle that cannot be read or a diff that cannot be made is a problem of the run,
    but does not hold the mirror back.

    Returns:
        The extras by (model, version), the one-line diff summaries, and the problems.
    """
    from pipelines.diff import diff_versions, summary, to_markdown
    from pipelines.publish import RELEASE_DIR, TargetStore
    from pipelines.register import ReleaseExtras, mlflow_versions
    from signing.target_names import bundle_path

    extras: dict[tuple[str, str], ReleaseExtras] = {}
    summaries: dict[tuple[str, str], str] = {}
    problems: list[str] = []
    repo = run.repo
    if not run.has_trust():
        return extras, summaries, problems
    trust = run.trust()
    state = release_states(trust)
    held = mlflow_versions(run)
    missing = [
        e for e in repo.all_versions() if (e.name, e.version) not in held and
        (released := state.get((e.name, e.version))) and released.signed
    ]  # fmt: skip
    if not missing:
        return extras, summaries, problems
    store = TargetStore(repo.root, repo.config.remote)
    release = repo.root / RELEASE_DIR
    for entry in missing:
        key = (entry.name, entry.version)
        # The released bundle, as devices get it (a local copy may be from another run).
        target = bundle_path(entry.name, entry.version)
        bundle: Path | None = None
        try:
            data = store.read(trust, target)
        except RegistryError as e:
            problems.append(f"{entry.name} {entry.version}: OMS bundle not attached: {e}")
        else:
            bundle = release / target
            bundle.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(bundle, data)
        report, text = None, None
        parent = entry.manifest.spec.parent
        if parent is not None:
            try:
                diff = diff_versions(run, entry.name, parent, entry.version)
            except RegistryError as e:
                problems.append(f"{entry.name} {entry.version}: no diff against {parent}: {e}")
            else:
                text = summary(diff)
                report = release / f"diffs/{entry.name}/{entry.version}.diff.md"
                report.parent.mkdir(parents=True, exist_ok=True)
                write_atomic(report, (to_markdown(diff) + "\n").encode())
                summaries[key] = text
        extras[key] = ReleaseExtras(bundle=bundle, diff_report=report, diff_summary=text)
    return extras, summaries, problems


def ci_release(start: Path, *, env: Mapping[str, str] | None = None) -> CiReport:
    """Build, publish, commit and mirror what is not yet released (see ``_ci_release``).

    Failures are in the returned report (and the report files and GitHub outputs are
    written either way).

    Raises:
        RepositoryError: not inside a repository.
    """
    env = os.environ if env is None else env
    try:
        with untrusted_checkout():
            return _ci_release(start, env=env)
    except RegistryError as e:
        return failed(start, "release", e, env)
