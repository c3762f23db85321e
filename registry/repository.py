"""Load a whole GitOps model repository: every manifest, with problems collected.

Loading never stops at the first bad file: a reviewer wants every problem of a pull
request in one run.  Large repositories are parsed on all cores (a process pool over
fork, since parsing is CPU-bound and each file is independent).

Stable API: ``Repository``, ``ModelEntry``, ``VersionEntry``, ``load_repository``,
``version_key``, ``no_gc`` (also for other bulk loads: the fleet's device reports).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import re
import stat
from collections.abc import Callable, Collection, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Final, NamedTuple, TypeVar

import semver
import yaml

from registry.cache import ParseCache, Stamp, in_untrusted_checkout, stamp_of
from registry.config import RepoConfig, load_config
from registry.dvcfile import PointerCheck, check_pointer
from registry.errors import ManifestError, Problem, UnsafeFileError, quote
from registry.layout import (
    MODEL_FILE,
    VERSION_SUFFIX,
    VERSIONS_DIR,
    model_dir,
    model_file,
    version_file,
    version_file_name,
    versions_dir,
)
from registry.loader import load_manifest
from registry.root import CONFIG_FILE, find_root
from registry.safe_io import check_folder, reusing_folders
from registry.schema import ModelVersion, RegisteredModel, is_semver, repo_path
from registry.yamlsrc import DEFAULT_LIMITS, YamlDocument, read_yaml

_LINK: Final = "is a symbolic link"
# Below this many files a pool costs more to start than it saves.
_PARALLEL_FROM: Final = 1500
_MD5: Final = re.compile(r"[0-9a-f]{32}")


@dataclass(frozen=True)
class ModelEntry:
    """A loaded ``RegisteredModel`` and where it came from."""

    name: str
    file: str
    path: Path
    doc: YamlDocument
    manifest: RegisteredModel


@dataclass(frozen=True)
class VersionEntry:
    """A loaded ``ModelVersion`` and where it came from."""

    name: str
    version: str
    file: str
    path: Path
    doc: YamlDocument
    manifest: ModelVersion

    @property
    def semver(self) -> semver.Version:
        """The parsed version, for ordering."""
        return parse_version(self.version)


@dataclass
class Repository:
    """Every manifest of a repository, and every problem met while loading them."""

    root: Path
    config: RepoConfig
    models: dict[str, ModelEntry] = field(default_factory=dict)
    versions: dict[str, dict[str, VersionEntry]] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    show: _Display = field(init=False, repr=False)
    pointers: dict[str, PointerCheck] = field(default_factory=dict, repr=False)
    """DVC pointer checks made while loading, by artifact path."""
    broken: set[tuple[str, str | None]] = field(default_factory=set)
    """(model, version) whose file exists but did not load; version None for model.yaml."""

    def display(self, path: Path) -> str:
        """Name of ``path`` in messages: relative to the working directory when inside it."""
        return display_path(path)

    def sorted_versions(self, name: str) -> list[VersionEntry]:
        """Versions of ``name`` in SemVer order (oldest first)."""
        return sorted(self.versions.get(name, {}).values(), key=lambda v: version_key(v.version))

    def relative(self, path: Path) -> str:
        """``path`` (below the root) relative to the root, in POSIX form.

        A string operation for the paths a load made (under the root as scanned):
        ``Path.relative_to`` per version costs more than a large repository's checks.
        """
        text, root = str(path), str(self.root)
        if text.startswith(root + os.sep):
            return text[len(root) + 1 :].replace(os.sep, "/")
        return path.relative_to(self.root).as_posix()

    def version_files(self) -> dict[str, Path]:
        """Display name -> path of every version that loaded."""
        return {e.file: e.path for e in self.all_versions()}

    def all_versions(self) -> Iterator[VersionEntry]:
        """Every version, by model name then SemVer order."""
        for name in sorted(self.versions):
            yield from self.sorted_versions(name)


@functools.lru_cache(maxsize=1 << 16)
def parse_version(version: str) -> semver.Version:
    """Parse a SemVer string (memoized: large repositories compare versions a lot).

    Raises:
        ValueError: not a SemVer version.
    """
    return semver.Version.parse(version)


PrecedenceKey = tuple[int, int, int, tuple[Any, ...]]


@functools.lru_cache(maxsize=1 << 16)
def version_key(version: str) -> PrecedenceKey:
    """A sort key that orders versions as SemVer precedence does (``semver.Version``'s
    comparison, build metadata ignored), as a plain tuple: comparing tuples costs a
    fraction of comparing ``semver.Version`` objects, and large repositories sort a lot.

    Raises:
        ValueError: not a SemVer version.
    """
    parsed = parse_version(version)
    pre = parsed.prerelease
    # A release ranks above each of its pre-releases; pre-release identifiers compare
    # one by one (numbers by value and below words, words as ASCII), then by count.
    rest: tuple[Any, ...] = (1,) if not pre else (0, *map(_identifier_key, pre.split(".")))
    return (parsed.major, parsed.minor, parsed.patch, rest)


def _identifier_key(identifier: str) -> tuple[int, int, str]:
    if not identifier.isdigit():
        return (1, 0, identifier)
    if not identifier.isascii():
        identifier = str(int(identifier))
    digits = identifier.lstrip("0") or "0"  # by value, without int() of any length
    return (0, len(digits), digits)


class _Display:
    """Names paths for messages relative to the working directory, without pathlib:
    relative when the repository is at or below the working directory, else absolute
    (also from a folder inside the repository: one name per file whichever of its
    folders a command runs from, as the parse cache keys entries by name).

    Building a display name per file with pathlib costs more than parsing the file's
    YAML does in a 10,000-version repository, so this works on strings.
    """

    def __init__(self, root: Path) -> None:
        cwd = os.getcwd()
        self.root = str(root)
        self.root_path = root
        inside = self.root == cwd or self.root.startswith(cwd.rstrip(os.sep) + os.sep)
        rel = os.path.relpath(self.root, cwd) if inside else self.root
        self.prefix = "" if rel == "." else rel.replace(os.sep, "/") + "/"
        self.real_folders: dict[str, bool] = {}
        """Repository-relative folders seen in this load: real folders all the way?"""

    def __call__(self, path: str) -> str:
        if path.startswith(self.root + os.sep):
            return self.prefix + path[len(self.root) + 1 :].replace(os.sep, "/")
        return display_path(Path(path))


def display_path(path: Path) -> str:
    """``path`` relative to the working directory if it is inside it, else absolute."""
    try:
        return path.relative_to(Path.cwd()).as_posix()
    except ValueError:
        return path.as_posix()


# Named tuples, not frozen dataclasses: a load makes one of each per file, and a frozen
# dataclass's __init__ (a setattr per field) costs more than the tuple's construction.
class _Task(NamedTuple):
    path: Path
    file: str
    kind: str | None
    model_dir: str


class _Result(NamedTuple):
    task: _Task
    doc: YamlDocument | None
    manifest: RegisteredModel | ModelVersion | None
    problems: tuple[Problem, ...]
    pointer: PointerCheck | None = None


_Parsed = tuple[YamlDocument | None, tuple[Problem, ...], PointerCheck | None]


def _artifact_of(data: Any) -> str | None:
    """The artifact path a version's raw data names, if it is a clean relative path."""
    spec = data.get("spec") if isinstance(data, dict) else None
    artifact = spec.get("artifact") if isinstance(spec, dict) else None
    path = artifact.get("path") if isinstance(artifact, dict) else artifact
    if not isinstance(path, str):
        return None
    try:
        return repo_path(path)
    except ValueError:
        return None  # validation reports it; never read outside the repository


def _parse(task: _Task, show: _Display) -> _Parsed:
    # The part worth a worker process: plain data pickles back cheaply, while the
    # validated pydantic models would cost more to pickle than they cost to build.
    # A version's DVC pointer is read here too, so that I/O runs in parallel as well.
    try:
        doc = read_yaml(task.path, task.file, root=show.root_path)
    except ManifestError as e:
        return None, e.problems, None
    artifact = _artifact_of(doc.data) if task.kind == "ModelVersion" else None
    pointer = check_pointer(show.root, show.prefix, artifact) if artifact else None
    return doc, (), pointer


def _validate(
    task: _Task,
    doc: YamlDocument | None,
    problems: tuple[Problem, ...],
    pointer: PointerCheck | None = None,
) -> _Result:
    if doc is None:
        return _Result(task, None, None, problems)
    try:
        manifest = load_manifest(doc, task.kind)
    except ManifestError as e:
        return _Result(task, None, None, e.problems)
    assert isinstance(manifest, RegisteredModel | ModelVersion)  # noqa: S101 - load_manifest's contract
    return _Result(task, doc, manifest, (), pointer)


def _linked(path: str, show: _Display) -> Problem:
    return Problem(show(path), f"{_LINK}; links in a repository are never followed")


def _scan(
    manifests: Path, show: _Display, problems: list[Problem], only: Collection[str] | None = None
) -> list[_Task]:
    return [
        task
        for name in _model_folders(manifests, show, problems, only)
        for task in _scan_model(str(manifests), name, show, problems)
    ]


def _model_folders(
    manifests: Path, show: _Display, problems: list[Problem], only: Collection[str] | None = None
) -> Iterator[str]:
    """The model folders of ``manifests`` in name order, each as it is met (so that
    problems found below it come after those found before it)."""
    try:
        check_folder(manifests, root=Path(show.root))
    except UnsafeFileError as e:
        problems.append(Problem(display_path(manifests), e.reason))
        return
    except OSError:
        problems.append(
            Problem(display_path(manifests), "manifests folder is missing or not a folder")
        )
        return
    for entry in sorted(os.scandir(manifests), key=lambda e: e.name):
        if only is not None and entry.name not in only:
            continue
        # A linked folder would move every manifest below it out of the repository
        # (manifests/mlp -> /etc); a linked file would read whatever it points at.
        if entry.is_symlink():
            problems.append(_linked(entry.path, show))
        elif not entry.is_dir(follow_symlinks=False):
            if entry.name.endswith((".yaml", ".yml")):
                problems.append(
                    Problem(
                        show(entry.path),
                        "unexpected manifest location; use "
                        f"{model_file('manifests', '<model>')} and "
                        f"{version_file('manifests', '<model>', '<version>')}",
                    )
                )
        elif not entry.name.startswith("."):
            yield entry.name


def _scan_model(manifests: str, name: str, show: _Display, problems: list[Problem]) -> list[_Task]:
    declared = model_file(manifests, name)
    tasks = [_Task(Path(declared), show(declared), "RegisteredModel", name)]
    for entry in os.scandir(model_dir(manifests, name)):
        if entry.name in (MODEL_FILE, VERSIONS_DIR) or not entry.name.endswith((".yaml", ".yml")):
            continue
        problems.append(
            Problem(
                show(entry.path),
                f"unexpected file; the model is declared in {MODEL_FILE} "
                f"and its versions in {VERSIONS_DIR}/{version_file_name('<version>')}",
            )
        )
    versions = Path(versions_dir(manifests, name))
    if versions.is_symlink():
        problems.append(_linked(str(versions), show))
        return tasks
    if not versions.is_dir():
        return tasks
    for entry in sorted(os.scandir(versions), key=lambda e: e.name):
        if entry.name.endswith(".yml"):
            problems.append(Problem(show(entry.path), "version files end in .yaml, not .yml"))
        elif entry.name.endswith(VERSION_SUFFIX):
            # A linked version file is a task too: read_yaml refuses it, with its name.
            tasks.append(_Task(Path(entry.path), show(entry.path), "ModelVersion", name))
    return tasks


_Wire = tuple[Any, tuple[Problem, ...], tuple[str, bool, tuple[Problem, ...], str | None] | None]
"""What a worker sends back for one task: plain data only (the data of the document,
its problems, the pointer check as a tuple).  The task itself, the document's paths
and the dataclasses would cost more to pickle than the YAML costs to parse."""

_work: tuple[list[_Task], _Display] | None = None
"""The tasks of this load, in a worker (inherited through fork, never pickled)."""


def _start_worker(tasks: list[_Task], show: _Display) -> None:
    global _work  # noqa: PLW0603 - a worker process's one piece of state
    _work = (tasks, show)


def _parse_span(start: int, stop: int) -> list[_Wire]:
    """Parse tasks ``start:stop`` of this worker's load, for the wire."""
    assert _work is not None  # noqa: S101 - set by the pool's initializer
    tasks, show = _work
    out: list[_Wire] = []
    for task in tasks[start:stop]:
        doc, problems, pointer = _parse(task, show)
        sent = (
            (pointer.artifact, pointer.exists, pointer.problems, pointer.md5) if pointer else None
        )
        out.append((doc.data if doc is not None else None, problems, sent))
    return out


def _from_wire(task: _Task, wire: _Wire, show: _Display) -> _Parsed:
    data, problems, sent = wire
    if problems:
        return None, problems, None
    doc = YamlDocument(task.file, data, None, source=task.path, root=show.root_path)
    return doc, (), PointerCheck(*sent) if sent is not None else None


def _fork_pool(workers: int, start: Callable[..., None], *state: Any) -> ProcessPoolExecutor:
    """Worker processes forked from this one, each given ``state`` by ``start``: inherited
    through fork, never pickled (a load's tasks, a group's work function)."""
    return ProcessPoolExecutor(
        workers, mp_context=get_context("fork"), initializer=start, initargs=state
    )


def _parse_all(tasks: list[_Task], jobs: int | None, show: _Display) -> Iterator[_Parsed]:
    """Parsed documents in task order, yielded as soon as each chunk is ready.

    The caller validates what arrives while the workers parse the rest, so schema
    validation (in this process) overlaps with parsing (in the pool).
    """
    workers = jobs if jobs is not None else (os.cpu_count() or 1)
    if workers <= 1 or len(tasks) < _PARALLEL_FROM:
        yield from (_parse(t, show) for t in tasks)
        return
    chunk = max(64, len(tasks) // (workers * 8))
    spans = [(i, min(i + chunk, len(tasks))) for i in range(0, len(tasks), chunk)]
    with _fork_pool(workers, _start_worker, tasks, show) as pool:
        futures = [pool.submit(_parse_span, start, stop) for start, stop in spans]
        for (start, _), future in zip(spans, futures, strict=True):
            for i, wire in enumerate(future.result(), start):
                yield _from_wire(tasks[i], wire, show)


def _run(
    tasks: list[_Task], jobs: int | None, cache: ParseCache | None, show: _Display
) -> list[_Result]:
    parsed: dict[int, _Parsed] = {}
    stamps: dict[int, Stamp] = {}
    if cache is not None:
        for i, task in enumerate(tasks):
            try:
                info = task.path.lstat()
            except OSError:
                continue  # read_yaml reports it
            if not stat.S_ISREG(info.st_mode):
                continue  # a link or no file: read_yaml refuses it, never the cache
            stamps[i] = stamp_of(info)
            data = cache.get(task.file, stamps[i])
            if data is not None:
                doc = YamlDocument(task.file, data, None, source=task.path, root=show.root_path)
                parsed[i] = (doc, (), _pointer_of(cache, task, data, show))
        versions = {_pointer_key(t) for t in tasks if t.kind == "ModelVersion"}
        cache.keep_only({t.file for t in tasks} | versions)
    results: dict[int, _Result] = {i: _validate(tasks[i], *result) for i, result in parsed.items()}
    missing = [i for i in range(len(tasks)) if i not in parsed]
    todo = [tasks[i] for i in missing]
    for i, result in zip(missing, _parse_all(todo, jobs, show), strict=True):
        if cache is not None and result[0] is not None and i in stamps:
            cache.put(tasks[i].file, stamps[i], result[0].data)
            _keep_pointer(cache, tasks[i], result[2], show)
        results[i] = _validate(tasks[i], *result)
    return [results[i] for i in range(len(tasks))]


# A version's DVC pointer check is cached beside its manifest, keyed by the pointer
# file's own stamp: reading ten thousand pointers again costs more than the rest of
# a warm load.  Only a clean pointer is kept (a problem is reported from a fresh read).
def _pointer_key(task: _Task) -> str:
    return f"{task.file}#pointer" if task.kind == "ModelVersion" else ""


def _pointer_stamp(artifact: str, show: _Display) -> Stamp | None:
    """The pointer's stamp, or None (never cached) when it is not a regular file reached
    through real folders: a folder moved and replaced by a link keeps the pointer's own
    stamp, and a fresh read refuses it."""
    if not _real_folders(artifact.rpartition("/")[0], show):
        return None
    try:
        info = os.lstat(os.path.join(show.root, f"{artifact}.dvc"))
    except OSError:
        return None
    return stamp_of(info) if stat.S_ISREG(info.st_mode) else None


def _real_folders(folder: str, show: _Display) -> bool:
    """Whether every folder of ``folder`` (repository-relative) is a folder, not a link
    (asked once per folder and load)."""
    if not folder:
        return True
    known = show.real_folders.get(folder)
    if known is None:
        try:
            mode = os.lstat(os.path.join(show.root, folder)).st_mode
        except OSError:
            mode = 0
        known = stat.S_ISDIR(mode) and _real_folders(folder.rpartition("/")[0], show)
        show.real_folders[folder] = known
    return known


def _pointer_of(cache: ParseCache, task: _Task, data: Any, show: _Display) -> PointerCheck | None:
    """The pointer check of a version whose manifest came from the cache."""
    artifact = _artifact_of(data) if task.kind == "ModelVersion" else None
    if artifact is None:
        return None
    stamp = _pointer_stamp(artifact, show)
    cached = _cached_pointer(cache, task, artifact, stamp) if stamp is not None else None
    if cached is not None:
        return cached
    checked = check_pointer(show.root, show.prefix, artifact)
    _keep_pointer(cache, task, checked, show)
    return checked


def _cached_pointer(
    cache: ParseCache, task: _Task, artifact: str, stamp: Stamp
) -> PointerCheck | None:
    found = cache.get(_pointer_key(task), stamp)
    if (
        not isinstance(found, list)
        or len(found) != 2
        or found[0] != artifact
        or not isinstance(found[1], str)
        or _MD5.fullmatch(found[1]) is None
    ):
        return None  # a cache file is never trusted to say more than a pointer could
    return PointerCheck(artifact, exists=True, md5=str(found[1]))


def _keep_pointer(
    cache: ParseCache, task: _Task, pointer: PointerCheck | None, show: _Display
) -> None:
    if pointer is None or not pointer.exists or pointer.problems or pointer.md5 is None:
        return
    stamp = _pointer_stamp(pointer.artifact, show)
    if stamp is not None:
        cache.put(_pointer_key(task), stamp, [pointer.artifact, pointer.md5])


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    """Within this block the cyclic garbage collector does not run; what was made in it
    is frozen out of later collections (it lives until the command ends).

    For bulk loads of many small objects that all stay alive."""
    # Loading creates millions of small objects that all stay alive; the cyclic
    # collector would scan them again and again for nothing (a third of the load
    # time on 10,000 versions).  The workers inherit this through fork.
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        # What was loaded stays alive until the command ends: keep it out of every
        # later collection instead of scanning it again.
        gc.freeze()
        if enabled:
            gc.enable()


def cache_key() -> str:
    """What parsed data depends on besides the files: modelreg's version, the limits."""
    from registry.about import modelreg_version

    return f"modelreg {modelreg_version()}; pyyaml {yaml.__version__}; {DEFAULT_LIMITS}"


def _named_by_version(result: _Result) -> _Result:
    """A version file whose name is not a SemVer version is a problem, not a version.

    Versions are ordered by their file names (``versions/latest.yaml`` would have no
    place in that order), so such a file never enters ``Repository.versions``.
    """
    task = result.task
    stem = task.path.name.removesuffix(VERSION_SUFFIX)
    if task.kind != "ModelVersion" or is_semver(stem):
        return result
    loc = ("metadata", "version")
    line, col = result.doc.position(loc) if result.doc is not None else (1, 1)
    declared = (
        result.manifest.metadata.version if isinstance(result.manifest, ModelVersion) else None
    )
    fix = (
        f"rename it {version_file_name(declared)}"
        if declared
        else f"name it {version_file_name('<MAJOR.MINOR.PATCH>')}"
    )
    problem = Problem(
        task.file,
        f"file name {quote(stem)} is not a SemVer version; {fix}",
        line,
        col,
        "metadata.version" if result.doc is not None else None,
    )
    return _Result(task, None, None, (*result.problems, problem))


def load_repository(
    start: Path,
    *,
    jobs: int | None = None,
    cache: bool = True,
    models: Collection[str] | None = None,
) -> Repository:
    """Load the repository containing ``start``; problems are collected, not raised.

    Args:
        start: the repository root or any folder inside it.
        jobs: worker processes for parsing (default: one per core; 1 disables the pool).
        cache: reuse parsed data of files unchanged since the last load
            (``.modelreg/cache/``); results are the same either way.  Ignored (no
            cache) inside ``registry.cache.untrusted_checkout``.
        models: load only these model folders (``show`` and ``history`` of one model
            need nothing else); cross-references to other models are then unknown,
            so such a repository is for reading one model, never for validation.

    Returns:
        The repository with every manifest that loaded and every problem found.  Cross-
        references are checked separately by ``registry.checks.check_repository``.

    Raises:
        RepositoryError: no ``modelreg.yaml`` at or above ``start``.
        ManifestError: ``modelreg.yaml`` itself is invalid.
    """
    found = outline(start, models=models, files=True)
    assert found.tasks is not None  # noqa: S101 - files=True
    repo = found.empty()
    repo.problems.extend(found.problems)
    use_cache = cache and not in_untrusted_checkout()
    _load(repo, found.tasks, jobs=jobs, cache=use_cache, prune=models is None)
    return repo


@dataclass(frozen=True)
class Outline:
    """A repository found but not yet read: its root, configuration and model folders."""

    root: Path
    config: RepoConfig
    show: _Display
    models: list[str]
    """Model folders, in name order."""
    problems: list[Problem]
    """What the scan found wrong (links, files out of place)."""
    tasks: list[_Task] | None = None
    """The manifest files, when the model folders were scanned too."""

    def empty(self) -> Repository:
        """A repository of this root and configuration with nothing loaded."""
        repo = Repository(root=self.root, config=self.config)
        repo.show = self.show
        return repo


def outline(start: Path, *, models: Collection[str] | None = None, files: bool = False) -> Outline:
    """Find the repository containing ``start`` and list its model folders.

    Args:
        start: the repository root or any folder inside it.
        models: only these model folders.
        files: scan the model folders too (``Outline.tasks``); else their problems
            are found by whoever scans them.

    Raises:
        RepositoryError: no ``modelreg.yaml`` at or above ``start``.
        ManifestError: ``modelreg.yaml`` itself is invalid.
    """
    root = find_root(start)
    config = load_config(root, display_path(root / CONFIG_FILE))
    show = _Display(root)
    problems: list[Problem] = []
    manifests = root / config.manifests
    names = []
    tasks: list[_Task] | None = [] if files else None
    for name in _model_folders(manifests, show, problems, models):
        names.append(name)
        if tasks is not None:
            tasks.extend(_scan_model(str(manifests), name, show, problems))
    return Outline(root, config, show, names, problems, tasks)


def _load(
    repo: Repository, tasks: list[_Task], *, jobs: int | None, cache: bool, prune: bool
) -> None:
    with no_gc(), reusing_folders():
        # Decoding the cache builds as many objects as parsing did: no collections.
        parse_cache = ParseCache(repo.root, cache_key()) if cache else None
        results = _run(tasks, jobs, parse_cache, repo.show)
    if parse_cache is not None and prune:  # a partial load would prune the rest
        parse_cache.save()
    for loaded in results:
        result = _named_by_version(loaded)
        task = result.task
        repo.files.append(task.file)
        if result.problems:
            present = os.path.lexists(task.path)  # a link is present (and refused), not missing
            if present:
                version = (
                    None
                    if task.kind == "RegisteredModel"
                    else task.path.name.removesuffix(VERSION_SUFFIX)
                )
                repo.broken.add((task.model_dir, version))
            if (
                task.kind == "RegisteredModel"
                and not present
                and (task.path.parent / VERSIONS_DIR).is_dir()
            ):
                repo.problems.append(
                    Problem(
                        task.file,
                        f"model folder {task.model_dir!r} has versions but no {MODEL_FILE}",
                    )
                )
            elif task.kind == "RegisteredModel" and not present:
                repo.problems.append(
                    Problem(display_path(task.path.parent), f"model folder without {MODEL_FILE}")
                )
            else:
                repo.problems.extend(result.problems)
            continue
        assert result.doc is not None  # noqa: S101 - set together with manifest
        manifest = result.manifest
        if result.pointer is not None:
            repo.pointers[result.pointer.artifact] = result.pointer
        if isinstance(manifest, RegisteredModel):
            repo.models[task.model_dir] = ModelEntry(
                task.model_dir, task.file, task.path, result.doc, manifest
            )
        elif isinstance(manifest, ModelVersion):
            version = task.path.name.removesuffix(VERSION_SUFFIX)
            repo.versions.setdefault(task.model_dir, {})[version] = VersionEntry(
                task.model_dir, version, task.file, task.path, result.doc, manifest
            )


T = TypeVar("T")

_groups: tuple[Outline, Callable[[Repository], Any]] | None = None
"""A worker's outline and work (inherited through fork, never pickled)."""


def _start_group_worker(found: Outline, work: Callable[[Repository], Any]) -> None:
    global _groups  # noqa: PLW0603 - a worker process's one piece of state
    _groups = (found, work)
    # A worker lives for one load and frees nothing: the cyclic collector would only
    # walk (and so copy, page by page) the memory it shares with its parent.
    gc.disable()


def _run_group(start: int, stop: int) -> Any:
    assert _groups is not None  # noqa: S101 - set by the pool's initializer
    found, work = _groups
    repo = found.empty()
    manifests = found.root / found.config.manifests
    tasks = [
        task
        for name in found.models[start:stop]
        for task in _scan_model(str(manifests), name, found.show, repo.problems)
    ]
    _load(repo, tasks, jobs=1, cache=False, prune=False)
    # Kept until the worker exits (os._exit: nothing is freed one object at a time);
    # freeing a loaded group costs as much as checking it.
    _kept.append(repo)
    return work(repo)


_kept: list[Repository] = []


def _files_per_model(found: Outline) -> list[int]:
    """How many manifests each model folder holds (a listing each, nothing parsed)."""
    manifests = os.path.join(found.root, found.config.manifests)
    sizes = []
    for name in found.models:
        folder = versions_dir(manifests, name)
        if os.path.islink(folder):  # noqa: PTH114 - never listed through a link
            sizes.append(1)  # (the scan refuses it)
            continue
        try:
            with os.scandir(folder) as entries:
                sizes.append(1 + sum(1 for _ in entries))
        except OSError:
            sizes.append(1)  # no versions folder (or not one): the scan reports it
    return sizes


def map_models(
    found: Outline, work: Callable[[Repository], T], *, jobs: int | None = None
) -> list[T] | None:
    """``work`` on the repository one group of whole models at a time, in worker
    processes: each scans and loads its models' files (without the parse cache) and
    runs ``work`` on them, and only what ``work`` returns comes back.

    For what needs every file read but only a summary back (``validate``, ``status``
    of a repository checked out cold): loading and checking in the workers costs a
    fraction of sending loaded manifests between processes, and leaves this process
    nothing to do but wait.

    Args:
        found: the repository's model folders (``outline`` without ``files``); its own
            problems are the caller's to report (those found scanning a model folder are
            in that group's ``repo.problems``).
        work: what to do with each group's repository (its models' files only, so
            nothing that needs another model); its result must pickle.
        jobs: worker processes (default: one per core).

    Returns:
        ``work``'s results, one per group, in model order; None when workers would not
        pay (one job, or fewer files than ``_PARALLEL_FROM``): load the whole
        repository instead.
    """
    if found.tasks is not None:
        raise ValueError("map_models scans the model folders itself: outline(files=False)")
    workers = jobs if jobs is not None else (os.cpu_count() or 1)
    if workers <= 1 or not found.models:
        return None
    sizes = _files_per_model(found)
    total = sum(sizes)
    if total < _PARALLEL_FROM or max(sizes) * workers > total:
        return None  # too small, or one model is more than a worker's share: a group each
    # Groups of whole models, about the same number of files each, several per worker
    # so that an uneven group does not leave a worker idle at the end.
    target = max(1, total // (workers * 4))
    spans: list[tuple[int, int]] = []
    start = files = 0
    for i, size in enumerate(sizes):
        files += size
        if files >= target or i == len(sizes) - 1:
            spans.append((start, i + 1))
            start, files = i + 1, 0
    with _fork_pool(workers, _start_group_worker, found, work) as pool:
        futures = [pool.submit(_run_group, a, b) for a, b in spans]
        return [f.result() for f in futures]
