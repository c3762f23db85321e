"""Cross-reference checks over a loaded repository (pure: reads only DVC pointers).

Each check yields ``Problem``s located in the manifest that must change to fix them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Final

import semver

from registry.dvcfile import check_pointer
from registry.errors import Problem, UnsafeFileError, quote
from registry.layout import (
    model_dir,
    model_file,
    parse_manifest_path,
    version_file,
    version_file_name,
)
from registry.loader import format_loc
from registry.repository import (
    ModelEntry,
    Repository,
    VersionEntry,
    parse_version,
    version_key,
)
from registry.safe_io import check_regular
from registry.schema import Signature, TensorSpec
from registry.yamlsrc import Loc, YamlDocument


def _at(doc: YamlDocument, loc: Loc, message: str, *, key: bool = False) -> Problem:
    line, col = doc.position(loc, key=key)
    return Problem(doc.file, message, line, col, format_loc(loc) or None)


def declared(repo: Repository, name: str) -> str:
    """The declared versions of ``name`` for messages: ``1.0.0, 1.1.0`` or ``none``."""
    valid = {v.version for v in repo.versions.get(name, {}).values()}
    broken = {v for m, v in repo.broken if m == name and v is not None}
    names = [v if v in valid else f"{v} (invalid)" for v in sorted(valid | broken, key=_order)]
    return ", ".join(names) or "none"


def _order(version: str) -> tuple[int, semver.Version | str]:
    try:
        return (0, parse_version(version))
    except ValueError:
        return (1, version)


def _identity(repo: Repository, entry: VersionEntry) -> Iterator[Problem]:
    meta = entry.manifest.metadata
    doc = entry.doc
    if meta.name != entry.name:
        yield _at(
            doc,
            ("metadata", "name"),
            f"is {meta.name!r} but the file lives under model folder {entry.name!r}",
        )
    if meta.version != entry.version:
        yield _at(
            doc,
            ("metadata", "version"),
            f"is {meta.version!r} but the file is named {version_file_name(entry.version)}",
        )
    if entry.name not in repo.models and (entry.name, None) not in repo.broken:
        yield _at(
            doc,
            ("metadata", "name"),
            f"model {entry.name!r} is not declared "
            f"(add {model_file(repo.config.manifests, entry.name)}: "
            f"`modelreg model add {entry.name}`)",
        )


def same_precedence(version: str, others: Iterable[str]) -> str | None:
    """The first of ``others`` that SemVer ranks equal to ``version``, if any.

    SemVer ignores build metadata when ordering (``1.2.0+build.5`` == ``1.2.0``), so
    two such versions of one model would have no order: which one is newer, which
    one a device may roll back to, which one is a parent's child.
    """
    ours = parse_version(version)
    return next((o for o in others if o != version and parse_version(o) == ours), None)


def precedence_message(version: str, other: str) -> str:
    """One line refusing ``version`` beside ``other`` (equal SemVer precedence)."""
    bare = str(parse_version(version).replace(build=None))
    return (
        f"version {version} ranks equal to {other} (SemVer ignores build metadata after "
        f"'+'); declare a distinct version instead, e.g. {bare}-rc.1 or the next patch"
    )


def _unique_precedence(repo: Repository, name: str) -> Iterator[Problem]:
    # Sorted, the version SemVer ranks first among equals (no build metadata, or the
    # lowest file name) stands; each other one is the problem.
    # Grouped first by what precedence compares (build metadata aside): comparing
    # SemVer objects is slow, and a repository of 10,000 versions has no ties at all.
    groups: dict[tuple[int, int, int, str | None], list[VersionEntry]] = {}
    for entry in repo.versions.get(name, {}).values():
        v = entry.semver
        groups.setdefault((v.major, v.minor, v.patch, v.prerelease), []).append(entry)
    for tied in groups.values():
        if len(tied) < 2:
            continue
        first, *others = sorted(tied, key=lambda e: (e.semver.build is not None, e.version))
        for entry in others:
            yield _at(
                entry.doc,
                ("metadata", "version"),
                precedence_message(entry.version, first.version),
            )


def _parent(repo: Repository, entry: VersionEntry) -> Iterator[Problem]:
    parent = entry.manifest.spec.parent
    if parent is None:
        return
    loc = ("spec", "parent")
    if (entry.name, parent) in repo.broken:
        return  # reported in its own file
    if parent not in repo.versions.get(entry.name, {}):
        yield _at(
            entry.doc,
            loc,
            f"version {parent} is not declared for model {entry.name!r} "
            f"(declared: {declared(repo, entry.name)})",
        )
    elif version_key(parent) >= version_key(entry.manifest.metadata.version):
        yield _at(entry.doc, loc, f"parent {parent} must be older than {entry.version}")


Claim = tuple[str, str, str, YamlDocument | None, str, str, Loc]
"""A version naming a file as its artifact or one of its files: (path, "<model> <version>",
"the artifact" or "a file", the manifest or None, its display name, its path, the
location).  Plain data, so that worker processes can send claims back."""


def _claim(entry: VersionEntry, path: str, what: str, loc: Loc, keep_doc: bool) -> Claim:
    doc = entry.doc if keep_doc else None
    return (path, f"{entry.name} {entry.version}", what, doc, entry.file, str(entry.path), loc)


def ownership_problems(claims: Iterable[Claim], root: Path) -> Iterator[Problem]:
    """Each file claimed by more than one version: the first claimant (in the order
    given: model by model, oldest version first) owns it; each other one is a problem.

    Args:
        claims: every claim of the repository, in ``Repository.all_versions`` order.
        root: the repository root (a claim without its document is re-read for its
            position; only a conflict needs one).
    """
    owners: dict[str, str] = {}
    for path, label, what, doc, file, source, loc in claims:
        other = owners.setdefault(path, label)
        if other != label:
            where = doc or YamlDocument(file, None, None, source=Path(source), root=root)
            yield _at(where, loc, f"{path} is already {what} of {other}")


def _artifact(
    repo: Repository, entry: VersionEntry, claims: list[Claim], keep_doc: bool
) -> Iterator[Problem]:
    path = entry.manifest.spec.artifact.path
    raw = entry.doc.data["spec"]["artifact"]
    # the short form `artifact: models/x.onnx` has no `path` key to point at
    loc: Loc = ("spec", "artifact", "path") if isinstance(raw, dict) else ("spec", "artifact")
    claims.append(_claim(entry, path, "the artifact", loc, keep_doc))
    # Loading usually checked the pointer already (in parallel); else check it now.
    check = repo.pointers.get(path) or check_pointer(repo.show.root, repo.show.prefix, path)
    if not check.exists:
        yield _at(
            entry.doc,
            loc,
            f"no DVC pointer {path}.dvc; track the file with `dvc add {path}`",
        )
        return
    yield from check.problems
    # committed with `git add -f`: build would hash its target
    if os.path.islink(os.path.join(repo.show.root, path)):  # noqa: PTH114 - hot path
        yield _at(
            entry.doc, loc, f"{path} is a symbolic link; links in a repository are never followed"
        )
    yield from _external_data(repo, entry, claims, keep_doc)


def _external_data(
    repo: Repository, entry: VersionEntry, claims: list[Claim], keep_doc: bool
) -> Iterator[Problem]:
    """Each external data file: DVC-tracked, not a link (and claimed: owned by one version)."""
    artifact = entry.manifest.spec.artifact
    for i, path in enumerate(artifact.files()[1:]):
        loc: Loc = ("spec", "artifact", "external_data", i)
        claims.append(_claim(entry, path, "a file", loc, keep_doc))
        check = check_pointer(repo.show.root, repo.show.prefix, path)
        if not check.exists:
            yield _at(
                entry.doc, loc, f"no DVC pointer {path}.dvc; track the file with `dvc add {path}`"
            )
            continue
        yield from check.problems
        if (repo.root / path).is_symlink():
            yield _at(
                entry.doc,
                loc,
                f"{path} is a symbolic link; links in a repository are never followed",
            )


def _files_exist(repo: Repository, entry: VersionEntry) -> Iterator[Problem]:
    goldens = entry.manifest.spec.goldens
    if goldens is None:
        return
    for i, case in enumerate(goldens.cases):
        for side in ("inputs", "outputs"):
            value = getattr(case, side)
            if not isinstance(value, str):
                continue
            reason = golden_file_problem(repo.root, value)
            if reason is not None:
                yield _at(entry.doc, ("spec", "goldens", "cases", i, side), reason)


def golden_file_problem(root: Path, path: str) -> str | None:
    """Why the golden file ``path`` (repository-relative) cannot be used, or None.

    Only its kind is looked at (a regular file, reached through no link), never its
    content: the content is checked, within caps, when the goldens run.
    """
    try:
        check_regular(root / path, root=root)
    except UnsafeFileError as e:
        return f"golden file {path} {e.reason}"
    except FileNotFoundError:
        return f"golden file {path} does not exist"
    except OSError as e:
        return f"golden file {path} cannot be opened ({e.strerror or 'I/O error'})"
    return None


def _golden_names(entry: VersionEntry, signature: Signature | None) -> Iterator[Problem]:
    goldens = entry.manifest.spec.goldens
    if goldens is None or signature is None:
        return
    for i, case in enumerate(goldens.cases):
        for side, tensors in (("inputs", signature.inputs), ("outputs", signature.outputs)):
            value = getattr(case, side)
            if isinstance(value, str):
                continue
            names = {t.name for t in tensors}
            for key in value:
                if key not in names:
                    yield _at(
                        entry.doc,
                        ("spec", "goldens", "cases", i, side, key),
                        f"{quote(key)} is not an {side[:-1]} of the model "
                        f"(expected: {', '.join(sorted(names))})",
                        key=True,
                    )


_FLOATS: Final = frozenset({"float16", "bfloat16", "float32", "float64"})


def _exact_goldens(entry: VersionEntry, signature: Signature | None) -> Iterator[Problem]:
    """Golden cases that compare float outputs with no tolerance at all."""
    goldens = entry.manifest.spec.goldens
    if goldens is None or signature is None:
        return
    floats = sorted(t.name for t in signature.outputs if t.dtype in _FLOATS)
    if not floats:
        return  # integer or boolean outputs (class ids, masks) are exact by nature
    for i, case in enumerate(goldens.cases):
        rtol = goldens.rtol if case.rtol is None else case.rtol
        atol = goldens.atol if case.atol is None else case.atol
        if rtol or atol:
            continue
        own = case.rtol is not None or case.atol is not None
        yield _at(
            entry.doc,
            ("spec", "goldens", "cases", i) if own else ("spec", "goldens"),
            f"warning: golden case {quote(case.name)} compares float output"
            f"{'s' if len(floats) > 1 else ''} {', '.join(floats)} exactly (rtol 0, atol 0); "
            "a device whose kernels differ (another CPU, weights shared with the previous "
            "version, TensorRT) can fail it and refuse the version: set a tolerance "
            "(the default is rtol 1e-4, atol 1e-5)",
            key=not own,
        )


def authoring_warnings(repo: Repository) -> list[Problem]:
    """What a reviewer would ask about manifests that are valid: one line each, never a
    reason to refuse (``validate`` prints them and exits 0).

    Today: golden cases that compare float outputs exactly.
    """
    found: list[Problem] = []
    for entry in repo.all_versions():
        owner = repo.models.get(entry.name)
        signature = entry.manifest.spec.signature
        if signature is None and owner is not None:
            signature = owner.manifest.spec.signature
        found.extend(_exact_goldens(entry, signature))
    return found


def _dims_compatible(have: TensorSpec, want: TensorSpec) -> str | None:
    if have.dtype != want.dtype:
        return f"dtype is {have.dtype} but the model declares {want.dtype}"
    if len(have.shape) != len(want.shape):
        return f"rank is {len(have.shape)} but the model declares {len(want.shape)}"
    for i, (h, w) in enumerate(zip(have.shape, want.shape, strict=True)):
        if isinstance(w, int) and h != w:
            return f"dimension {i} is {h} but the model declares {w}"
    return None


SIGNATURE_ADVICE: Final = (
    "if this version changes the model's inputs or outputs, say why in "
    "spec.signature_change (version add --signature-change TEXT) or declare a new model"
)
"""How to change a model's inputs or outputs without breaking the versions before."""


def _signature(model: ModelEntry, entry: VersionEntry) -> Iterator[Problem]:
    want, have = model.manifest.spec.signature, entry.manifest.spec.signature
    if want is None or have is None or entry.manifest.spec.signature_change is not None:
        return  # a declared change serves its own signature
    if _raw_signature(entry.doc) == _raw_signature(model.doc) is not None:
        return  # written the same (plain data compares at C speed; both passed the schema)
    for side in ("inputs", "outputs"):
        wanted = {t.name: t for t in getattr(want, side)}
        for i, tensor in enumerate(getattr(have, side)):
            loc = ("spec", "signature", side, i)
            if tensor.name not in wanted:
                yield _at(
                    entry.doc,
                    (*loc, "name"),
                    f"{side[:-1]} {quote(tensor.name)} is not in the signature of "
                    f"{model.file} ({', '.join(wanted)}); {SIGNATURE_ADVICE}",
                )
                continue
            reason = _dims_compatible(tensor, wanted.pop(tensor.name))
            if reason:
                yield _at(entry.doc, loc, f"{reason} in {model.file}; {SIGNATURE_ADVICE}")
        for name in wanted:
            yield _at(
                entry.doc,
                ("spec", "signature", side),
                f"{side[:-1]} {name!r} of the model's signature is missing; {SIGNATURE_ADVICE}",
            )


def _raw_signature(doc: YamlDocument) -> object:
    spec = doc.data.get("spec") if isinstance(doc.data, dict) else None
    return spec.get("signature") if isinstance(spec, dict) else None


def target_problems(model: ModelEntry, entry: VersionEntry) -> Iterator[Problem]:
    """Targets of ``entry`` that its model's ``spec.targets`` does not allow."""
    allowed = model.manifest.spec.targets
    if not allowed:
        return
    for i, target in enumerate(entry.manifest.spec.targets):
        if target.name not in allowed:
            yield _at(
                entry.doc,
                ("spec", "targets", i, "name"),
                disallowed_target(model, target.name),
            )


def disallowed_target(model: ModelEntry, name: str) -> str:
    """The message for a target the model does not allow, with both ways out."""
    allowed = ", ".join(model.manifest.spec.targets)
    return (
        f"target {name!r} is not allowed for model {model.name!r} (allowed: {allowed}); "
        f"use one of those, or add it to spec.targets in {model.file}"
    )


def _model(repo: Repository, model: ModelEntry) -> Iterator[Problem]:
    spec = model.manifest.spec
    if model.manifest.metadata.name != model.name:
        yield _at(
            model.doc,
            ("metadata", "name"),
            f"is {model.manifest.metadata.name!r} but the file lives under "
            f"model folder {model.name!r}",
        )
    versions = repo.versions.get(model.name, {})
    for channel, assignment in spec.channels.items():
        if (
            assignment.version not in versions
            and (model.name, assignment.version) not in repo.broken
        ):
            loc: Loc = ("spec", "channels", channel, "version")
            if loc not in model.doc.value_marks:
                loc = loc[:-1]
            yield _at(
                model.doc,
                loc,
                f"channel {channel!r} points at version {assignment.version}, which is not "
                f"declared for model {model.name!r} (declared: {declared(repo, model.name)})",
            )
        served = versions.get(assignment.version)
        gone = served.manifest.spec.deprecated if served is not None else None
        if gone is not None:
            loc = ("spec", "channels", channel, "version")
            if loc not in model.doc.value_marks:
                loc = loc[:-1]
            yield _at(
                model.doc,
                loc,
                f"channel {channel!r} points at version {assignment.version}, which is "
                f"deprecated ({gone.reason}); point it at another version "
                f"(modelreg rollback {model.name} --channel {channel})",
            )
        if spec.promotion.order and channel not in spec.promotion.order:
            yield _at(
                model.doc,
                ("spec", "channels", channel),
                f"channel {channel!r} is not in spec.promotion.order "
                f"({', '.join(spec.promotion.order)})",
                key=True,
            )


def check_repository(repo: Repository) -> list[Problem]:
    """Every cross-reference problem of a loaded repository.

    Checks: names match paths, versions belong to a declared model, no two versions
    of a model rank equal in SemVer (build metadata aside), parents are
    declared and older, channels point at declared versions and follow the promotion
    order, targets are allowed by the model, version signatures fit the model's,
    golden files exist and name real tensors, every artifact has a valid DVC pointer
    and belongs to one version only.

    Args:
        repo: a repository from ``load_repository``.

    Returns:
        The problems, in no particular order (``ManifestError`` sorts them).
    """
    problems, claims = check_models(repo, keep_docs=True)
    problems.extend(ownership_problems(claims, repo.root))
    return problems


def check_models(repo: Repository, *, keep_docs: bool = False) -> tuple[list[Problem], list[Claim]]:
    """``check_repository`` but for which file belongs to which version: the problems
    and the claims (for ``ownership_problems``), for a repository loaded whole or for
    some of its models (each model's checks need only that model's files).

    Args:
        repo: a loaded repository, or some models of one.
        keep_docs: put each claiming document in its claim (else: its path).
    """
    problems: list[Problem] = []
    claims: list[Claim] = []
    for model in repo.models.values():
        problems.extend(_model(repo, model))
    for name in repo.versions:
        problems.extend(_unique_precedence(repo, name))
    for entry in repo.all_versions():
        problems.extend(_identity(repo, entry))
        problems.extend(_parent(repo, entry))
        problems.extend(_artifact(repo, entry, claims, keep_docs))
        problems.extend(_files_exist(repo, entry))
        owner = repo.models.get(entry.name)
        signature = entry.manifest.spec.signature
        if owner is not None:
            problems.extend(_signature(owner, entry))
            problems.extend(target_problems(owner, entry))
            signature = signature or owner.manifest.spec.signature
        problems.extend(_golden_names(entry, signature))
    return problems, claims


def _depends_on(repo: Repository, selected: list[Path]) -> set[Path]:
    """The manifests that the selected files or folders depend on (resolved paths)."""
    folder = (repo.root / repo.config.manifests).resolve()
    needed: set[Path] = set()
    for path in selected:
        if path == folder or not path.is_relative_to(folder):
            continue
        name = path.relative_to(folder).parts[0]
        needed.add(model_file(folder, name))
        versions = repo.versions.get(name, {})
        found = parse_manifest_path(path, folder)
        if found is not None and found.version is not None:  # a version: its parent chain
            entry, seen = versions.get(found.version), set[str]()
            while entry is not None and entry.manifest.spec.parent not in (None, *seen):
                parent = str(entry.manifest.spec.parent)
                seen.add(parent)
                needed.add(version_file(folder, name, parent))
                entry = versions.get(parent)
        elif path in (model_dir(folder, name), model_file(folder, name)):
            # the model: the versions its channels serve
            model = repo.models.get(name)
            for assignment in model.manifest.spec.channels.values() if model else ():
                needed.add(version_file(folder, name, assignment.version))
    return needed


def validate_paths(repo: Repository, paths: list[Path] | None = None) -> list[Problem]:
    """Load problems plus cross-reference problems, limited to ``paths`` when given.

    Args:
        repo: a loaded repository.
        paths: files or folders to report on; the whole repository when ``None``.
            Cross-references are always resolved against the whole repository.

    Returns:
        The problems that concern the selected files.
    """
    problems = [*repo.problems, *check_repository(repo)]
    if not paths:
        return problems
    return _about(repo, problems, paths)


def in_paths(problems: list[Problem], paths: list[Path]) -> list[Problem]:
    """The ``problems`` that concern ``paths`` (files or folders) themselves."""
    selected = [p.resolve() for p in paths]
    return [p for p in problems if _under(Path(p.file).resolve(), selected)]


def _under(where: Path, selected: list[Path]) -> bool:
    return any(where == s or s in where.parents for s in selected)


def _about(repo: Repository, problems: list[Problem], paths: list[Path]) -> list[Problem]:
    selected = [p.resolve() for p in paths]
    # A manifest is valid only with what it depends on: its model's model.yaml, its
    # parent chain, the versions its channels name.  Those are reported too when they
    # do not load; their cross-reference problems stay theirs.
    needed = _depends_on(repo, selected)
    broken = {id(p) for p in repo.problems}

    def wanted(problem: Problem) -> bool:
        where = Path(problem.file).resolve()
        return _under(where, selected) or (where in needed and id(problem) in broken)

    return [p for p in problems if wanted(p)]
