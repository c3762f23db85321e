"""Authoring commands that touch git and DVC: init, model add, version add."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Final

import semver

from pipelines import dvc
from pipelines.dvc import DEFAULT_REMOTE_DIR, REMOTE_NAME
from pipelines.onnx import load_onnx_external, read_signature, signature_from_model
from registry.atomic import AtomicFile, write_atomic
from registry.checks import declared, disallowed_target, precedence_message, same_precedence
from registry.config import CONFIG_FILE
from registry.edit import set_signature
from registry.errors import ManifestError, RepositoryError, UsageError
from registry.gitinfo import git, stage, toplevel
from registry.jsonschema import schema_comment, write_schemas
from registry.layout import model_dir, model_file, version_file
from registry.loader import load_manifest
from registry.redact import redact
from registry.render import render_model, render_version
from registry.repository import (
    ModelEntry,
    Repository,
    display_path,
    load_repository,
)
from registry.schema import DNS_LABEL_RE, Signature
from registry.yamlsrc import parse_yaml

if TYPE_CHECKING:
    import onnx

_GITIGNORE: Final = """\
# modelreg: local state (MLflow store, local DVC remote, caches); schemas are shared
/.modelreg/*
!/.modelreg/schemas/
"""
_MANIFESTS_README: Final = """\
# Manifests

One folder per model: `<model>/model.yaml` (RegisteredModel) and
`<model>/versions/<semver>.yaml` (ModelVersion). Edit them by pull request;
`modelreg validate` checks them, `modelreg schema` prints their JSON Schema.
"""


@dataclass(frozen=True)
class InitResult:
    """What ``init_repo`` created."""

    root: Path
    remote: str
    created: list[Path] = field(default_factory=list)
    git_initialized: bool = False
    keys: list[Path] = field(default_factory=list)
    self_pin: str | None = None
    """Why the workflows pin modelreg by version only (None: by hash too)."""


def _write_new(path: Path, text: str, created: list[Path]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text.encode())
    created.append(path)


def _untracked(root: Path, path: Path) -> bool:
    if toplevel(root) is None:
        return False
    return git(root, "ls-files", "--error-unmatch", "--", str(path), check=False).returncode != 0


def _stage(root: Path, paths: Sequence[Path]) -> None:
    stage(root, paths)


def init_repo(
    target: Path, *, remote: str | None = None, branch: str = "main", trust: bool = True
) -> InitResult:
    """Scaffold a GitOps model repository in ``target`` (created if missing).

    Runs ``git init`` when ``target`` is not in a work tree, ``dvc init``, configures
    a DVC remote (``.modelreg/remote`` by default), writes ``modelreg.yaml``,
    ``manifests/`` and the JSON Schemas, creates the trust root (keys in
    ``.modelreg/keys``, ``trust/metadata/1.root.json``) unless ``trust`` is off, and
    stages what it wrote.

    Raises:
        RepositoryError: ``target`` already holds a ``modelreg.yaml`` or is a file.
        ToolError: git or DVC is missing or fails.
    """
    if target.exists() and not target.is_dir():
        raise RepositoryError(f"{target}: exists and is not a directory")
    if (target / CONFIG_FILE).exists():
        raise RepositoryError(
            f"{display_path(target / CONFIG_FILE)}: already a modelreg repository"
        )
    target.mkdir(parents=True, exist_ok=True)
    root = target.resolve()
    created: list[Path] = []
    top = toplevel(root)
    if top is not None and git(top, "check-ignore", "-q", str(root), check=False).returncode == 0:
        top = None  # inside a work tree that ignores it: it gets a repository of its own
    git_initialized = top is None
    if top is None:
        git(root, "init", "--quiet", f"--initial-branch={branch}")
        top = root
    dvc.init(root, subdir=top.resolve() != root)
    if remote is None:
        (root / DEFAULT_REMOTE_DIR).mkdir(parents=True, exist_ok=True)
    # DVC reads a relative path given here against the working directory and stores
    # it relative to .dvc/ (absolute ones stay absolute): passing the default relative
    # to the cwd makes it land as ../.modelreg/remote, which moves with the repository.
    default = os.path.relpath(root / DEFAULT_REMOTE_DIR, Path.cwd())
    dvc.set_remote(root, REMOTE_NAME, remote or default)
    config = schema_comment(root / CONFIG_FILE, root, "RegistryConfig") + (
        "apiVersion: modelreg/v1\n"
        "kind: RegistryConfig\n"
        "manifests: manifests\n"
        "artifacts: models\n"
        f"remote: {REMOTE_NAME}\n"
        "trust:\n"
        "  metadata: trust/metadata   # signed release metadata devices verify (TUF)\n"
        "  keys: .modelreg/keys       # local keys; CI uses MODELREG_<ROLE>_KEY secrets\n"
    )
    _write_new(root / "manifests" / "README.md", _MANIFESTS_README, created)
    gitignore = root / ".gitignore"
    existing = gitignore.read_text(encoding="utf-8") if gitignore.exists() else ""
    if "/.modelreg/*" not in existing:
        sep = "" if not existing or existing.endswith("\n") else "\n"
        write_atomic(gitignore, (existing + sep + _GITIGNORE).encode())
        created.append(gitignore)
    created.extend(write_schemas(root))
    workflows, self_pin = write_workflows(root)
    created.extend(workflows)
    keys: list[Path] = []
    if trust:
        from registry.config import RepoConfig
        from registry.loader import validate_document
        from signing.keys import ROLES
        from signing.workspace import init_trust, trust_paths

        parsed = validate_document(parse_yaml(config.encode(), CONFIG_FILE), RepoConfig)
        paths = trust_paths(root, parsed)
        if not (paths.metadata / "1.root.json").exists():  # else an init that stopped
            init_trust(paths)  # half-way made it, with the keys, which are reused
        keys = [k for r in ROLES if (k := paths.keys / f"{r}.key").is_file()]
        created.append(paths.metadata / "1.root.json")
    # modelreg.yaml last: until it exists the folder is not a repository, so an init that
    # failed half-way (a tool missing, a key folder not writable) can simply be run again.
    _write_new(root / CONFIG_FILE, config, created)
    staged = [*created, root / ".dvc"]
    if gitignore not in created and _untracked(root, gitignore):
        staged.append(gitignore)  # written by an init that stopped before staging it
    _stage(root, staged)
    return InitResult(root, remote or DEFAULT_REMOTE_DIR, created, git_initialized, keys, self_pin)


WORKFLOWS: Final = ("pr.yml", "review.yml", "release.yml", "freshness.yml", "rollout.yml")


INDEX_ENV: Final = "MODELREG_INDEX_URL"
"""The package index whose JSON API lists modelreg's release hashes (default PyPI)."""
_INDEX_DEFAULT: Final = "https://pypi.org"
_INDEX_TIMEOUT_S: Final = 10.0
_INDEX_MAX_BYTES: Final = 1 << 20


def release_hashes(version: str, index: str) -> tuple[list[str], str | None]:
    """The SHA-256 of each file of modelreg ``version`` as ``index``'s JSON API lists
    them (``<index>/pypi/modelreg/<version>/json``), or why there are none.

    One bounded request with a time limit: ``init`` must not hang offline.
    """
    import json
    import urllib.error
    import urllib.request

    url = f"{index.rstrip('/')}/pypi/modelreg/{version}/json"
    try:
        with urllib.request.urlopen(url, timeout=_INDEX_TIMEOUT_S) as response:  # noqa: S310 - https or a configured index
            data = json.loads(response.read(_INDEX_MAX_BYTES + 1)[:_INDEX_MAX_BYTES])
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return [], (
                f"{index} has no modelreg {version}: this is not a published release "
                "(a development or local build), so there is no hash to pin; install a "
                "published release, or set MODELREG_INDEX_URL to the index that has this "
                "one, and run init again for a pin by hash"
            )
        return [], f"{index} answered {e.code} for modelreg {version}"
    except (OSError, ValueError) as e:
        return [], f"{index} could not be asked ({type(e).__name__})"
    files = data.get("urls") if isinstance(data, dict) else None
    hashes = [
        f["digests"]["sha256"]
        for f in files or []
        if isinstance(f, dict)
        and isinstance(f.get("digests"), dict)
        and isinstance(f["digests"].get("sha256"), str)
        and re.fullmatch(r"[0-9a-f]{64}", f["digests"]["sha256"])
    ]
    return hashes, None if hashes else f"{index} lists no file of modelreg {version}"


def write_workflows(
    root: Path, env: Mapping[str, str] | None = None
) -> tuple[list[Path], str | None]:
    """Write the GitHub workflows (``ci pr`` and its review re-check, ``ci release``,
    freshness, rollout waves), the hash locks they install modelreg's dependencies from, and the pin
    of modelreg itself (hashes from the package index), unless present.

    Returns the files that are modelreg's own (written now, or left by an init that
    stopped half-way), for staging, a repository's own file of that name left alone;
    and why modelreg is pinned by version only (None when by hash too, or when the
    repository already had its pin).
    """
    from importlib.metadata import version as installed
    from importlib.resources import files

    from pipelines.authoring.requirements_lock import (
        LOCK_FILES,
        SELF_LOCK_FILE,
        SELF_LOCK_HEADER,
        render_self_lock,
    )

    folder = root / ".github" / "workflows"
    folder.mkdir(parents=True, exist_ok=True)
    templates = files("pipelines").joinpath("templates")
    shipped = [(folder / n, templates.joinpath("workflows", n)) for n in WORKFLOWS]
    shipped += [(root / f, templates.joinpath(Path(f).name)) for f in LOCK_FILES]
    written = []
    for target, template in shipped:
        text = template.read_text("utf-8")
        if target.exists():
            if target.read_text(encoding="utf-8") == text:
                written.append(target)  # ours, from an init that stopped half-way
            continue  # the repository already has its own; never overwrite it
        write_atomic(target, text.encode())
        written.append(target)
    pin = root / SELF_LOCK_FILE
    if pin.exists():
        ours = pin.read_text(encoding="utf-8").startswith(SELF_LOCK_HEADER)
        return [*written, pin] if ours else written, None  # ours: an init stopped half-way
    index = (os.environ if env is None else env).get(INDEX_ENV) or _INDEX_DEFAULT
    version = installed("modelreg")  # the release that writes these workflows
    hashes, why = release_hashes(version, index)
    # A private index URL may carry a token: the file is committed and `why` printed.
    shown = redact(index)
    write_atomic(pin, render_self_lock(version, hashes, shown).encode())
    return [*written, pin], why.replace(index, shown) if why is not None else None


def add_model(
    start: Path,
    name: str,
    *,
    owner: str = "",
    task: str = "",
    description: str = "",
    labels: Mapping[str, str] | None = None,
    targets: Sequence[str] = (),
    order: Sequence[str] = (),
    signature_from: Path | None = None,
) -> Path:
    """Write ``manifests/<name>/model.yaml``.

    Raises:
        ManifestError: the name is invalid, already declared, or the result invalid.
        RepositoryError: not in a repository.
        ArtifactError: ``signature_from`` is not an ONNX model.
    """
    import re

    repo = load_repository(start, jobs=1)
    path = model_file(repo.root / repo.config.manifests, name)
    shown = display_path(path)
    if not re.match(DNS_LABEL_RE, name):
        raise ManifestError.single(
            shown,
            f"{name!r} is not a valid model name (lowercase letters, digits and '-', "
            "at most 63 characters)",
        )
    if path.exists():
        raise ManifestError.single(shown, f"model {name!r} is already declared")
    signature = read_signature(signature_from) if signature_from else None
    owner = owner or _git_email(repo.root)
    text = render_model(
        path, repo.root, name, owner=owner, task=task, description=description,
        labels=labels, signature=signature, targets=targets, order=order,
    )  # fmt: skip
    _check_rendered(text, shown, "RegisteredModel", _MODEL_OPTIONS)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text.encode())
    _stage(repo.root, [path])
    return path


# Where each field of a manifest that `model add` / `version add` write comes from.
_MODEL_OPTIONS: Final = (
    ("metadata.name", "NAME"),
    ("metadata.labels", "--label"),
    ("spec.owner", "--owner"),
    ("spec.task", "--task"),
    ("spec.description", "--description"),
    ("spec.targets", "--target"),
    ("spec.promotion.order", "--channel-order"),
    ("spec.signature", "--signature-from"),
)
_VERSION_OPTIONS: Final = (
    ("metadata.version", "VERSION"),
    ("spec.parent", "--parent"),
    ("spec.description", "--description"),
    ("spec.metrics", "--metric"),
    ("spec.source.run", "--source-run"),
    ("spec.source.datasets", "--dataset"),
    ("spec.goldens", "--golden-inputs"),
    ("spec.targets", "--target"),
    ("spec.signature", "--artifact"),
)


def _check_rendered(text: str, shown: str, kind: str, options: Sequence[tuple[str, str]]) -> None:
    """Validate a manifest about to be written; a problem names the option it came from.

    The file does not exist yet, so ``file:line:col`` would point nowhere: a value the
    user gave is a usage error of its option.

    Raises:
        UsageError: an option's value is invalid.
        ManifestError: the manifest is invalid for a reason no option explains.
    """
    try:
        load_manifest(parse_yaml(text.encode(), shown), kind)
    except ManifestError as e:
        named = []
        for problem in e.problems:
            field_path = problem.field or ""
            option = next(
                (o for prefix, o in options if field_path == prefix or
                 field_path.startswith((prefix + ".", prefix + "["))),
                None,
            )  # fmt: skip
            if option is None:
                raise
            named.append(f"{option}: {problem.message}")
        raise UsageError("; ".join(named)) from None


def _git_email(root: Path) -> str:
    proc = git(root, "config", "user.email", check=False)
    return proc.stdout.strip() if proc.returncode == 0 else ""


@dataclass(frozen=True)
class AddVersionResult:
    """What ``add_version`` wrote."""

    manifest: Path
    artifact: Path
    pointer: Path
    parent: str | None
    signature: Signature
    model_signature_updated: bool
    goldens: list[Path] = field(default_factory=list)
    external_data: list[Path] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    """What a reviewer would ask about, one line each (nothing refused)."""


def _pick_parent(
    repo: Repository, name: str, version: str, parent: str | None, auto: bool
) -> str | None:
    versions = repo.versions.get(name, {})
    if parent is not None:
        if parent not in versions:
            raise ManifestError.single(
                display_path(model_dir(repo.root / repo.config.manifests, name)),
                f"parent {parent} is not declared for model {name!r} "
                f"(declared: {declared(repo, name)})",
            )
        if semver.Version.parse(parent) >= semver.Version.parse(version):
            raise UsageError(f"parent {parent} must be older than {version}")
        return parent
    if not auto:
        return None
    older = [v for v in repo.sorted_versions(name) if v.semver < semver.Version.parse(version)]
    return older[-1].version if older else None


def _signature_problem(model_sig: Signature, version_sig: Signature) -> str | None:
    for side in ("inputs", "outputs"):
        want = {t.name: t for t in getattr(model_sig, side)}
        have = {t.name: t for t in getattr(version_sig, side)}
        if set(want) != set(have):
            return f"{side} are {sorted(have)} but the model declares {sorted(want)}"
        for tname, tensor in have.items():
            w = want[tname]
            if (
                tensor.dtype != w.dtype
                or len(tensor.shape) != len(w.shape)
                or any(
                    isinstance(wd, int) and hd != wd
                    for hd, wd in zip(tensor.shape, w.shape, strict=True)
                )
            ):
                return (
                    f"{side[:-1]} {tname!r} is {tensor.dtype}{tensor.shape} "
                    f"but the model declares {w.dtype}{w.shape}"
                )
    return None


def _model_signature_edit(
    repo: Repository,
    model: ModelEntry,
    signature: Signature,
    artifact: Path,
    *,
    update: bool,
    change: str | None,
) -> str | None:
    """New model.yaml text when the model takes this signature; None to leave it.

    A signature that differs from the model's is accepted in two ways: the version
    declares the change (``change``: it serves its own signature, the model's stays
    what its other versions and their clients rely on), or the model takes it
    (``update``) when every other version fits it too.

    Raises:
        ManifestError: the signature differs and neither way is taken or possible,
            or a change is declared for a signature that does not differ.
        UsageError: both ways are asked for.
    """
    if change is not None and update:
        raise UsageError("--signature-change and --update-model-signature exclude each other")
    model_sig = model.manifest.spec.signature
    if model_sig is None:
        return _with_signature(model, signature)
    reason = _signature_problem(model_sig, signature)
    if reason is None:
        if change is not None:
            raise ManifestError.single(
                str(artifact),
                f"its I/O signature matches model {model.name!r}: --signature-change is "
                "for a version whose inputs or outputs differ",
            )
        return None
    if change is not None:
        return None
    if update:
        broken = []
        for other in repo.sorted_versions(model.name):
            spec = other.manifest.spec
            if spec.signature_change is not None:
                continue  # serves its own signature whatever the model's
            if spec.signature is None:  # takes the model's: the update would change it
                broken.append(f"{other.version} (it declares no signature of its own)")
            elif (why := _signature_problem(signature, spec.signature)) is not None:
                broken.append(f"{other.version} ({why})")
        if not broken:
            return _with_signature(model, signature)
        raise ManifestError.single(
            str(artifact),
            f"--update-model-signature would leave versions of {model.name!r} that no longer "
            f"fit the model: {'; '.join(broken)}; pass --signature-change TEXT instead "
            "(this version serves its own signature), or declare a new model",
        )
    raise ManifestError.single(
        str(artifact),
        f"I/O signature does not match model {model.name!r}: {reason}; if this version "
        "changes the model's inputs or outputs, pass --signature-change TEXT (why: the "
        f"clients of its channels must change too), or declare a new model "
        f"(modelreg model add {model.name}-v2)",
    )


def _with_signature(model: ModelEntry, signature: Signature) -> str:
    text = set_signature(model.path.read_text(encoding="utf-8"), model.file, signature)
    load_manifest(parse_yaml(text.encode(), model.file), "RegisteredModel")
    return text


def _check_targets(model: ModelEntry, targets: Sequence[Mapping[str, Any]], shown: str) -> None:
    """Refuse a target the model does not allow before anything is written."""
    allowed = model.manifest.spec.targets
    for target in targets:
        if allowed and target.get("name") not in allowed:
            raise ManifestError.single(shown, disallowed_target(model, str(target.get("name"))))


def _declared_model(repo: Repository, name: str) -> ModelEntry:
    model = repo.models.get(name)
    if model is not None:
        return model
    if (name, None) in repo.broken:
        raise ManifestError([p for p in repo.problems if f"/{name}/" in f"/{p.file}"])
    raise ManifestError.single(
        display_path(model_file(repo.root / repo.config.manifests, name)),
        f"model {name!r} is not declared; run `modelreg model add {name}` first",
    )


def add_version(
    start: Path,
    name: str,
    version: str,
    artifact: Path,
    *,
    parent: str | None = None,
    auto_parent: bool = True,
    description: str = "",
    metrics: Mapping[str, float] | None = None,
    source: Mapping[str, Any] | None = None,
    golden_inputs: Path | None = None,
    update_model_signature: bool = False,
    signature_change: str | None = None,
    targets: Sequence[Mapping[str, Any]] = (),
) -> AddVersionResult:
    """Declare version ``version`` of ``name`` with ``artifact`` as its ONNX file.

    Copies the artifact to ``<artifacts>/<name>/<version>.onnx``, tracks it with DVC,
    reads the I/O signature from the graph, optionally records golden outputs for
    ``golden_inputs`` with ONNX Runtime, and writes the ModelVersion.  If the model has
    no signature yet it takes this version's.  On any failure nothing is left behind.

    Raises:
        ManifestError: unknown model, existing version, bad parent, signature mismatch.
        ArtifactError: the artifact is not a valid ONNX model, or goldens fail to run.
        ToolError: DVC or git fails.
        UsageError: ``version`` is not SemVer or the parent is not older.
    """
    try:
        semver.Version.parse(version)
    except ValueError:
        raise UsageError(f"{version!r} is not a SemVer version (expected e.g. 1.0.0)") from None
    repo = load_repository(start, jobs=1)
    model = _declared_model(repo, name)
    path = _new_version_path(repo, name, version)
    shown = display_path(path)
    parent = _pick_parent(repo, name, version, parent, auto_parent)
    _check_targets(model, targets, shown)
    if not artifact.is_file():
        raise ManifestError.single(str(artifact), "artifact not found or not a file")
    onnx_model, external = load_onnx_external(artifact, str(artifact))
    signature = signature_from_model(onnx_model, str(artifact))
    model_text = _model_signature_edit(
        repo, model, signature, artifact, update=update_model_signature, change=signature_change
    )
    rel = PurePosixPath(repo.config.artifacts) / name / f"{version}.onnx"
    dest = repo.root / rel
    pointer = dest.with_name(dest.name + ".dvc")
    in_place = dest.resolve() == artifact.resolve()
    # Data files are renamed after the version (their names are in the graph, which is
    # rewritten to match), so two versions exported as model.onnx + model.onnx.data can
    # sit in one folder; a model already in place keeps the names its graph holds.
    renamed = external.files if in_place else _data_names(version, external.files)
    data_sources = [artifact.parent / f for f in external.files]
    data_dests = [dest.parent / f for f in renamed]
    _refuse_overwrites(
        [(artifact, dest), *zip(data_sources, data_dests, strict=True)], f"{name} {version}"
    )
    written: list[Path] = []
    try:
        if not in_place:
            graph = None
            if external.files:
                names = dict(zip(external.files, renamed, strict=True))
                graph = _renamed_locations(onnx_model, names)
            _copy_in(artifact, dest, graph, zip(data_sources, data_dests, strict=True), written)
        goldens_spec, golden_files = _goldens(repo, name, version, dest, golden_inputs)
        written.extend(golden_files)
        text = render_version(
            path, repo.root, name, version, artifact=rel.as_posix(), parent=parent,
            description=description, signature=signature, source=source, metrics=metrics,
            goldens=goldens_spec, targets=targets, signature_change=signature_change,
            external_data=renamed,
        )  # fmt: skip
        _check_rendered(text, shown, "ModelVersion", _VERSION_OPTIONS)
        dvc.add(repo.root, dest, *data_dests)
        data_pointers = [d.with_name(d.name + ".dvc") for d in data_dests]
        written += [pointer, *data_pointers]
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text.encode())
        written.append(path)
        if model_text is not None:
            write_atomic(model.path, model_text.encode())
    except BaseException:
        for p in reversed(written):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
        raise
    staged = (path, pointer, *data_pointers, model.path, *golden_files)
    _stage(repo.root, [p for p in staged if p.exists()])
    return AddVersionResult(
        path, dest, pointer, parent, signature, model_text is not None, golden_files, data_dests,
        _authoring_warnings(repo, name, version, rel.as_posix(), golden_inputs is not None),
    )  # fmt: skip


def _authoring_warnings(
    repo: Repository, name: str, version: str, artifact: str, goldens: bool
) -> list[str]:
    """What a reviewer would ask about a new version (pure reads of the pointers): no
    goldens, or an artifact byte-identical to a version already declared."""
    from registry.dvcfile import check_pointer

    found = []
    if not goldens:
        found.append(
            f"{name} {version} has no goldens: devices will only check that it loads "
            "(record expected outputs with --golden-inputs FILE)"
        )
    md5 = check_pointer(str(repo.root), "", artifact).md5
    for other in repo.all_versions():
        path = other.manifest.spec.artifact.path
        if md5 is not None and check_pointer(str(repo.root), "", path).md5 == md5:
            found.append(
                f"the artifact of {name} {version} is byte-identical to {other.name} "
                f"{other.version}'s ({path}): the same model under a new version"
            )
    return found


def _new_version_path(repo: Repository, name: str, version: str) -> Path:
    """Where version ``version``'s manifest goes, refusing one already declared.

    Raises:
        ManifestError: the version exists, or SemVer ranks it equal to one that does.
    """
    path = version_file(repo.root / repo.config.manifests, name, version)
    shown = display_path(path)
    if path.exists():
        raise ManifestError.single(
            shown, f"version {version} of {name!r} already exists; versions are immutable"
        )
    equal = same_precedence(version, repo.versions.get(name, {}))
    if equal is not None:
        raise ManifestError.single(shown, precedence_message(version, equal))
    return path


def _refuse_overwrites(pairs: Sequence[tuple[Path, Path]], what: str) -> None:
    """Refuse to copy a file onto another one already in the repository.

    Raises:
        ManifestError: a destination exists and is not the file being added.
    """
    for given, target in pairs:
        if target.exists() and target.resolve() != given.resolve():
            raise ManifestError.single(
                display_path(target), f"already exists; not overwriting it for {what}"
            )


def _copy_in(
    artifact: Path,
    dest: Path,
    graph: bytes | None,
    data: Iterable[tuple[Path, Path]],
    written: list[Path],
) -> None:
    """Copy the artifact (or write its rewritten ``graph``) and its data files in,
    streaming (a data file may be many GB), appending each file to ``written``."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if graph is not None:
        write_atomic(dest, graph)
    else:
        with AtomicFile(dest) as out, artifact.open("rb") as src:
            shutil.copyfileobj(src, out.file, 1 << 20)
    written.append(dest)
    for given, target in data:
        with AtomicFile(target) as out, given.open("rb") as src:
            shutil.copyfileobj(src, out.file, 1 << 20)
        written.append(target)


def _data_names(version: str, files: tuple[str, ...]) -> tuple[str, ...]:
    """The names a version's external data files get in the repository (pure)."""
    if len(files) == 1:
        return (f"{version}.onnx.data",)
    return tuple(f"{version}.onnx.data{i}" for i in range(1, len(files) + 1))


def _renamed_locations(model: onnx.ModelProto, names: Mapping[str, str]) -> bytes:
    """``model`` serialized with each external tensor's ``location`` renamed."""
    from onnx import TensorProto

    for tensor in model.graph.initializer:
        if tensor.data_location != TensorProto.EXTERNAL:
            continue
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = names[entry.value]
    return bytes(model.SerializeToString(deterministic=True))


def _goldens(
    repo: Repository, name: str, version: str, model: Path, inputs: Path | None
) -> tuple[dict[str, Any] | None, list[Path]]:
    if inputs is None:
        return None, []
    from pipelines.goldens import record_outputs

    raw_in, raw_out = record_outputs(model, inputs)
    folder = model_dir(repo.root / repo.config.manifests, name) / "goldens" / version
    folder.mkdir(parents=True, exist_ok=True)
    files = [folder / "inputs.npz", folder / "outputs.npz"]
    for target, data in zip(files, (raw_in, raw_out), strict=True):
        write_atomic(target, data)
    rel = [f.relative_to(repo.root).as_posix() for f in files]
    return {"cases": [{"name": "default", "inputs": rel[0], "outputs": rel[1]}]}, files


__all__ = ["AddVersionResult", "InitResult", "add_model", "add_version", "init_repo"]
