"""``modelreg build``: fetch, check, load, test and build engines for model versions.

Per version, in stages (each timed): **fetch** the DVC-tracked artifact and verify
its MD5 against the pointer; **check** it with the ONNX checker and strict shape
inference; compare the declared **signature** with the graph; **load** it in ONNX
Runtime on CPU; run the **goldens** in every session setup a device of the version's
targets may run it in (``registry.sessions``); build the target **engines**.  A record
of all of it goes to ``.modelreg/build/<model>/<version>/build.json``, passing or not.

Every version is built even when an earlier one fails, and within a version every
stage whose inputs are sound still runs (a signature mismatch does not hide a golden
failure); ``build`` then raises one ``BuildError`` listing every problem, one line each.

Stable API: ``build``, ``build_version``, ``changed_versions``, ``BuildRecord``,
``BuildReport``, ``BuildProblem``, ``BuildError``.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar

from pipelines.build._checks import check_onnx, compare_signatures, graph_signature
from pipelines.build._engines import FAILED, EngineResult, build_engines
from pipelines.build._goldens import CaseResult, golden_setups, run_goldens
from pipelines.build._latency import Latency, compare_latency
from pipelines.changes import changed_versions
from pipelines.context import ReleaseContext, repository
from pipelines.errors import ArtifactError, BuildError, PipelineError
from pipelines.fetch import fetch_artifact
from pipelines.onnx import load_onnx_external, load_session
from registry import progress
from registry.atomic import write_atomic
from registry.checks import declared, target_problems
from registry.errors import ManifestError, Problem, UsageError
from registry.layout import model_file, version_file
from registry.loader import format_loc
from registry.repository import (
    Repository,
    VersionEntry,
    display_path,
)
from registry.yamlsrc import Loc, YamlDocument

if TYPE_CHECKING:
    import onnx

Stage = Literal["manifest", "fetch", "check", "signature", "load", "goldens", "engines"]
STAGES: Final[tuple[Stage, ...]] = ("fetch", "check", "signature", "load", "goldens", "engines")
"""The timed stages of a version's build, in order."""
BUILD_DIR: Final = ".modelreg/build"
RECORD_FILE: Final = "build.json"
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class BuildProblem:
    """One problem of one version's build; ``str()`` is its one-line message."""

    model: str
    version: str
    stage: Stage
    problem: Problem

    def __str__(self) -> str:
        return str(self.problem)


@dataclass(frozen=True)
class ExternalFile:
    """One ONNX external data file of a version, as its build verified it.

    Attributes:
        file: its name beside the ``.onnx`` file.
        sha256: its SHA-256.
        size: its size in bytes.
        md5: its MD5, as its DVC pointer records it.
    """

    file: str
    sha256: str
    size: int
    md5: str

    def to_json(self) -> dict[str, Any]:
        """This file as JSON data."""
        return {"file": self.file, "sha256": self.sha256, "size": self.size, "md5": self.md5}


MAX_RECORD_BYTES: Final = 16 << 20
"""Largest ``build.json`` :meth:`BuildRecord.load` reads."""


@dataclass
class BuildRecord:
    """What building one version found and produced (``build.json``).

    Attributes:
        model: model name.
        version: version.
        manifest: the ModelVersion file, as shown in messages.
        artifact: the artifact's repository-relative path.
        record_path: where ``build.json`` was written.
        sha256: SHA-256 of the artifact (None if it could not be fetched).
        size: its size in bytes.
        md5: its MD5, as the DVC pointer records it.
        fetched: whether it had to be pulled through DVC.
        checks_passed: the stages that passed, in order.
        skipped: stages with nothing to check (no signature declared, no goldens,
            no targets); they are in neither ``checks_passed`` nor ``problems``.
        goldens: per golden case: passed, tolerances, max abs error per output (the
            largest in any session setup) and per setup (``setups``).
        engines: per target: status, file, digest, size.
        timings_ms: milliseconds per stage that ran.
        problems: every problem found (empty when the build passed).
        external_data: per external data file (ONNX external data), in manifest order:
            its file name, SHA-256, size and MD5; empty for a self-contained model.
        latency: its run time on the runner against its parent's
            (``pipelines.build._latency``); None when it could not be timed.
    """

    model: str
    version: str
    manifest: str
    artifact: str
    record_path: Path
    sha256: str | None = None
    size: int | None = None
    md5: str | None = None
    fetched: bool = False
    checks_passed: list[Stage] = field(default_factory=list)
    skipped: list[Stage] = field(default_factory=list)
    goldens: list[CaseResult] = field(default_factory=list)
    engines: list[EngineResult] = field(default_factory=list)
    timings_ms: dict[str, float] = field(default_factory=dict)
    problems: list[BuildProblem] = field(default_factory=list)
    external_data: list[ExternalFile] = field(default_factory=list)
    latency: Latency | None = None

    @property
    def ok(self) -> bool:
        """Whether every stage passed."""
        return not self.problems

    @classmethod
    def load(cls, path: Path, *, root: Path) -> BuildRecord:
        """Read a ``build.json`` back, for reading (reports, tools): at most
        :data:`MAX_RECORD_BYTES`, reached from ``root`` through no link.

        A record read back is what some build said, not proof of it: ``publish`` signs
        only the records its own run made, in memory, never one read from a folder.

        Raises:
            PipelineError: it is not JSON, or not a build record of this format.
            UnsafeFileError: it is not a regular file reached from ``root`` through no
                link.
            FileTooLargeError: it is larger than :data:`MAX_RECORD_BYTES`.
            OSError: it cannot be read.
        """
        from registry.safe_io import read_regular

        data = read_regular(path, root=root, max_bytes=MAX_RECORD_BYTES)
        try:
            parsed = json.loads(data)
        except (ValueError, RecursionError) as e:
            raise PipelineError(f"{display_path(path)}: not JSON ({e})") from None
        return _record_from_json(parsed, path)

    def to_json(self) -> dict[str, Any]:
        """The record as JSON data (the content of ``build.json``)."""
        return {
            "apiVersion": "modelreg/v1",
            "kind": "BuildRecord",
            "model": self.model,
            "version": self.version,
            "ok": self.ok,
            "manifest": self.manifest,
            "artifact": self.artifact,
            "sha256": self.sha256,
            "size": self.size,
            "md5": self.md5,
            "fetched": self.fetched,
            "checks_passed": list(self.checks_passed),
            "skipped": list(self.skipped),
            "goldens": [g.to_json() for g in self.goldens],
            "engines": [e.to_json() for e in self.engines],
            "timings_ms": dict(self.timings_ms),
            **(
                {"external_data": [f.to_json() for f in self.external_data]}
                if self.external_data
                else {}
            ),
            "latency": self.latency.to_json() if self.latency is not None else None,
            "tools": dict(_tool_versions()),
            "problems": [_problem_json(p) for p in self.problems],
        }


def _record_from_json(data: object, path: Path) -> BuildRecord:
    """The record ``data`` (parsed ``build.json``) describes.

    Raises:
        PipelineError: it is not a build record of this format.
    """
    from pydantic import ValidationError

    def fail(reason: str) -> PipelineError:
        return PipelineError(f"{display_path(path)}: not a build record ({reason})")

    if not isinstance(data, dict) or data.get("kind") != "BuildRecord":
        raise fail("kind is not BuildRecord")
    if data.get("apiVersion") != "modelreg/v1":
        raise fail(f"apiVersion {data.get('apiVersion')!r} is not modelreg/v1")
    engine_keys = {"target", "engine", "status", "path", "sha256", "size", "ms", "reason"}

    def engine(raw: object) -> dict[str, Any]:
        if not isinstance(raw, dict):
            raise fail("an engine is not an object")
        detail = {k: v for k, v in raw.items() if k not in engine_keys}
        return {**{k: v for k, v in raw.items() if k in engine_keys}, "detail": detail or None}

    def problem(raw: object) -> dict[str, Any]:
        if not isinstance(raw, dict):
            raise fail("a problem is not an object")
        where = {k: raw.get(k) for k in ("file", "message", "line", "col", "field")}
        return {"model": data.get("model"), "version": data.get("version"),
                "stage": raw.get("stage"), "problem": where}  # fmt: skip

    fields = {
        k: data.get(k)
        for k in ("model", "version", "manifest", "artifact", "sha256", "size", "md5")
    }
    try:
        record: BuildRecord = _record_adapter().validate_python(
            {
                **fields,
                "record_path": path,
                "fetched": data.get("fetched", False),
                "checks_passed": data.get("checks_passed", []),
                "skipped": data.get("skipped", []),
                "goldens": data.get("goldens", []),
                "engines": [engine(e) for e in data.get("engines", [])],
                "timings_ms": data.get("timings_ms", {}),
                "problems": [problem(p) for p in data.get("problems", [])],
                "external_data": data.get("external_data", []),
                "latency": _latency_fields(data.get("latency")),
            },
            strict=False,
        )
    except (ValidationError, TypeError) as e:
        first = e.errors()[0] if isinstance(e, ValidationError) else {"msg": str(e), "loc": ()}
        at = ".".join(str(x) for x in first["loc"])
        raise fail(f"{at}: {first['msg']}" if at else str(first["msg"])) from None
    return record


def _latency_fields(raw: object) -> object:
    """A record's latency without what is computed from it (the ratios)."""
    if not isinstance(raw, dict):
        return raw
    return {k: v for k, v in raw.items() if k not in ("ratio_p50", "ratio_p99")}


@functools.cache
def _record_adapter() -> Any:
    from pydantic import TypeAdapter

    return TypeAdapter(BuildRecord)


def _problem_json(p: BuildProblem) -> dict[str, Any]:
    where = p.problem
    return {
        "stage": p.stage,
        "file": where.file,
        "line": where.line,
        "col": where.col,
        "field": where.field,
        "message": where.message,
        "text": str(p),
    }


@dataclass(frozen=True)
class BuildReport:
    """The records of one ``build`` run, in model then SemVer order."""

    root: Path
    records: list[BuildRecord]
    problems: list[BuildProblem]
    base: str | None = None

    @property
    def ok(self) -> bool:
        """Whether every selected version built cleanly."""
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        """The report as JSON data."""
        return {
            "ok": self.ok,
            "base": self.base,
            "versions": [r.to_json() for r in self.records],
            "problems": [str(p) for p in self.problems],
        }


def build_version(
    repo: Repository, name: str, version: str, *, out_dir: Path | None = None
) -> BuildRecord:
    """Build one version and write its record to ``out_dir/build.json``.

    Args:
        repo: a loaded repository (``registry.repository.load_repository``).
        name: model name.
        version: a declared version of it.
        out_dir: where the record and engines go (default
            ``<root>/.modelreg/build/<name>/<version>``).

    Returns:
        The record of a build that passed.

    Raises:
        BuildError: any stage failed (the record is written first; it is in
            ``error.report.records``).
        ManifestError: the version is not declared.
        ToolError: DVC is needed to fetch the artifact and is missing.
        OSError: the build folder cannot be written.
    """
    entry = _entry(repo, name, version)
    record = _build(repo, entry, out_dir)
    if record.problems:
        raise BuildError(BuildReport(repo.root, [record], list(record.problems)))
    return record


def _entry(repo: Repository, name: str, version: str) -> VersionEntry:
    entry = repo.versions.get(name, {}).get(version)
    if entry is not None:
        return entry
    manifests = repo.root / repo.config.manifests
    if (name, version) in repo.broken:
        file = display_path(version_file(manifests, name, version))
        raise ManifestError([p for p in repo.problems if p.file == file])
    if name not in repo.models:
        raise ManifestError.single(
            display_path(model_file(manifests, name)), f"model {name!r} is not declared"
        )
    raise ManifestError.single(
        display_path(version_file(manifests, name, version)),
        f"version {version} of model {name!r} is not declared (declared: {declared(repo, name)})",
    )


def _build(repo: Repository, entry: VersionEntry, out_dir: Path | None) -> BuildRecord:
    out = out_dir or repo.root / BUILD_DIR / entry.name / entry.version
    out.mkdir(parents=True, exist_ok=True)
    # A stale record must never outlive a build that stops halfway (an OSError, ^C).
    (out / RECORD_FILE).unlink(missing_ok=True)
    _tool_versions()  # imports ONNX and ONNX Runtime now, so no stage's timing pays for it
    record = _VersionBuild(repo, entry, out).run()
    text = json.dumps(record.to_json(), indent=2) + "\n"
    write_atomic(record.record_path, text.encode())
    return record


class _VersionBuild:
    """The stages of one version's build, each timed, problems collected in the record."""

    def __init__(self, repo: Repository, entry: VersionEntry, out: Path) -> None:
        self.repo, self.entry, self.out = repo, entry, out
        self.spec = entry.manifest.spec
        self.display = repo.display(repo.root / self.spec.artifact.path)
        self.record = BuildRecord(
            entry.name, entry.version, entry.file, self.spec.artifact.path, out / RECORD_FILE
        )

    def run(self) -> BuildRecord:
        # Later stages need a verified file (fetch, check) and a session (load); the
        # others report and let the build go on, so one run shows every problem.
        artifact = self._stage("fetch", self._fetch)
        if artifact is None:
            return self.record
        model = self._stage("check", lambda: self._check(artifact))
        if model is None:
            return self.record
        self._stage("signature", lambda: self._signature(model))
        session = self._stage("load", lambda: load_session(artifact, self.display))
        if session is None:
            return self.record
        del session  # the goldens and engines load their own: one copy of the weights
        self._stage("goldens", functools.partial(self._goldens, artifact))
        self._latency(artifact)
        self._stage("engines", lambda: self._engines(artifact))
        return self.record

    def _latency(self, artifact: Path) -> None:
        """Time the version against its parent (not a check: ``ci pr`` judges it)."""
        import onnxruntime as ort

        setups = golden_setups(list(self.spec.targets), ort.get_available_providers())
        with progress.stage(f"build {self.entry.name} {self.entry.version}", "latency"):
            try:
                self.record.latency = compare_latency(self.repo, self.entry, artifact, setups)
            except ArtifactError:
                self.record.latency = None  # the goldens and engines say why it fails

    def _stage(self, stage: Stage, work: Callable[[], _T]) -> _T | None:
        before = len(self.record.problems)
        start = time.perf_counter_ns()
        with progress.stage(f"build {self.entry.name} {self.entry.version}", stage) as shown:
            try:
                result: _T | None = work()
            except ArtifactError as e:
                self._problem(stage, Problem(e.path, str(e).removeprefix(f"{e.path}: ")))
                result = None
            finally:
                self.record.timings_ms[stage] = round((time.perf_counter_ns() - start) / 1e6, 3)
            # A problem is collected, not raised, so that one build shows them all.
            shown.failed = len(self.record.problems) > before
        if len(self.record.problems) == before and stage not in self.record.skipped:
            self.record.checks_passed.append(stage)
        return result

    def _problem(self, stage: Stage, problem: Problem) -> None:
        self.record.problems.append(
            BuildProblem(self.entry.name, self.entry.version, stage, problem)
        )

    def _fetch(self) -> Path:
        fetched = fetch_artifact(self.repo.root, self.spec.artifact.path, self.display)
        record = self.record
        record.md5, record.fetched = fetched.pointer.md5, fetched.fetched
        record.sha256, record.size = fetched.sha256, fetched.size
        # Each external data file is DVC-tracked on its own and verified the same way
        # before any checker or session reads a byte of it.
        for name, rel in zip(
            self.spec.artifact.external_data, self.spec.artifact.files()[1:], strict=True
        ):
            data = fetch_artifact(self.repo.root, rel, self.repo.display(self.repo.root / rel))
            record.fetched = record.fetched or data.fetched
            record.external_data.append(
                ExternalFile(name, data.sha256, data.size, data.pointer.md5)
            )
        return fetched.path

    def _check(self, artifact: Path) -> onnx.ModelProto | None:
        _, external = load_onnx_external(artifact, self.display)
        declared_files = sorted(self.spec.artifact.external_data)
        if list(external.files) != declared_files:
            shown = ", ".join(repr(f) for f in external.files) or "none"
            listed = ", ".join(repr(f) for f in declared_files) or "none"
            loc: Loc = ("spec", "artifact", "external_data")
            if not self.spec.artifact.external_data:
                loc = ("spec", "artifact")
            problem = _at(
                self.entry.doc,
                loc,
                f"the graph stores tensors in {shown} but spec.artifact.external_data lists "
                f"{listed}; list exactly the files the graph names",
            )
            self._problem("check", problem)
            return None
        return check_onnx(artifact, self.display)

    def _signature(self, model: onnx.ModelProto) -> None:
        graph = graph_signature(model, self.display)
        declared_sig, doc = self.spec.signature, self.entry.doc
        owner = self.repo.models.get(self.entry.name)
        if declared_sig is None and owner is not None:
            declared_sig, doc = owner.manifest.spec.signature, owner.doc
        if declared_sig is None:  # nothing declared, nothing to hold the graph to
            self.record.skipped.append("signature")
            return
        for mismatch in compare_signatures(declared_sig, graph):
            self._problem("signature", _at(doc, mismatch.loc, mismatch.message))

    def _goldens(self, artifact: Path) -> None:
        """The goldens in every session setup a device of the version's targets may
        run it in (``golden_setups``), each session loaded in turn."""
        if self.spec.goldens is None:
            self.record.skipped.append("goldens")
            return
        import onnxruntime as ort

        setups = golden_setups(list(self.spec.targets), ort.get_available_providers())
        sessions = [(s, load_session(artifact, self.display, setup=s)) for s in setups]
        self.record.goldens, failures = run_goldens(sessions, self.repo.root, self.spec.goldens)
        for f in failures:
            self._problem("goldens", _at(self.entry.doc, f.loc, f.message))

    def _engines(self, artifact: Path) -> None:
        targets = list(self.spec.targets)
        if not targets:
            self.record.skipped.append("engines")
            return
        owner = self.repo.models.get(self.entry.name)
        refused = list(target_problems(owner, self.entry)) if owner is not None else []
        for problem in refused:  # never built: a device would be sent a target the policy bars
            self._problem("engines", problem)
        if refused:
            return
        self.record.engines = build_engines(
            artifact, self.display, targets, self.out, self.repo.root
        )
        for i, engine in enumerate(self.record.engines):
            if engine.status == FAILED:
                message = f"target {engine.target!r}: {engine.reason}"
                self._problem("engines", _at(self.entry.doc, ("spec", "targets", i), message))


def _at(doc: YamlDocument, loc: Loc, message: str) -> Problem:
    line, col = doc.position(loc)
    return Problem(doc.file, message, line, col, format_loc(loc) or None)


@functools.cache
def _tool_versions() -> dict[str, str]:
    import onnx
    import onnxruntime

    return {"onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__}


def build(
    root: Path | ReleaseContext,
    *,
    base: str | None = None,
    versions: list[tuple[str, str]] | None = None,
    out_root: Path | None = None,
) -> BuildReport:
    """Build versions of the repository at (or above) ``root``.

    Args:
        root: the repository root or a folder inside it, or the run's context.
        base: build only the versions changed since this git ref (see
            ``changed_versions``).
        versions: build exactly these (model, version) pairs.  Without ``base`` or
            ``versions``, every declared version is built.
        out_root: where records and engines go, as ``<out_root>/<model>/<version>/``
            (default ``<root>/.modelreg/build``).  ``ci release`` builds into a private
            folder of its own: what it signs must come from this run, never from a
            folder a pull request could have filled.

    Returns:
        The report, when every selected version built cleanly.

    Raises:
        BuildError: any version failed; every version was still built and recorded.
        ManifestError: a version in ``versions`` is not declared.
        UsageError: both ``base`` and ``versions`` were given, or ``base`` is not a commit.
        ToolError: git fails, or DVC is needed and missing.
        OSError: a build folder cannot be written.
    """
    if base is not None and versions is not None:
        raise UsageError("give either base or versions, not both")
    repo = repository(root, jobs=1)
    problems: list[BuildProblem] = []
    if versions is not None:
        selected = list(dict.fromkeys(versions))
        entries = [_entry(repo, n, v) for n, v in selected]
    else:
        wanted = None
        if base is not None and isinstance(root, ReleaseContext):
            wanted = root.changed_since(base)  # asked of git once per run
        elif base is not None:
            wanted = changed_versions(repo, base)
        entries = [
            e for e in repo.all_versions() if wanted is None or (e.name, e.version) in wanted
        ]
        for name, version in sorted(repo.broken):
            if version is not None and (wanted is None or (name, version) in wanted):
                problems.extend(_broken(repo, name, version))
    records = [
        _build(repo, entry, out_root / entry.name / entry.version if out_root else None)
        for entry in entries
    ]
    for record in records:
        problems.extend(record.problems)
    report = BuildReport(repo.root, records, problems, base)
    if problems:
        raise BuildError(report)
    return report


def _broken(repo: Repository, name: str, version: str) -> list[BuildProblem]:
    # A version whose manifest does not load cannot be built; say why, in its words.
    file = display_path(version_file(repo.root / repo.config.manifests, name, version))
    found = [p for p in repo.problems if p.file == file] or [
        Problem(file, "not built: the manifest is invalid (run `modelreg validate`)")
    ]
    return [BuildProblem(name, version, "manifest", p) for p in found]


__all__ = [
    "BUILD_DIR",
    "RECORD_FILE",
    "STAGES",
    "BuildProblem",
    "BuildRecord",
    "BuildReport",
    "Stage",
    "build",
    "build_version",
    "changed_versions",
]
