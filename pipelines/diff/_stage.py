"""Semantic diff of two model versions: what a pull request comment shows.

:func:`diff_models` compares two ONNX models (and optionally their manifests and
goldens) and returns a :class:`ModelDiff`: opsets and IR version, the I/O signature
(each change classified as breaking or compatible), nodes by op type, initializers
(which tensors changed and by how much), file size, metric deltas and golden output
drift.  :func:`diff_versions` does the same for two declared versions of a workspace,
and :func:`diff_against_base` for every version a branch changed.  Rendering lives in
:mod:`pipelines.diff._report`, the comparisons in :mod:`pipelines.diff._compare`, golden
drift in :mod:`pipelines.diff._drift`; the result types are re-exported from here.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import onnx
from onnx import numpy_helper

from pipelines import changes
from pipelines.context import ReleaseContext, repository
from pipelines.diff._compare import (
    diff_metrics,
    diff_nodes,
    diff_opsets,
    diff_signature,
    diff_weights,
)
from pipelines.diff._drift import golden_drift
from pipelines.diff._types import (
    BaseDiff,
    ModelDiff,
    ModelInfo,
    ModelInput,
)
from pipelines.errors import ArtifactError
from pipelines.onnx import load_onnx, signature_from_model
from registry.errors import ManifestError
from registry.layout import version_file
from registry.repository import (
    Repository,
    VersionEntry,
    display_path,
    parse_version,
)
from registry.schema import Goldens, ModelVersion


def _load(source: ModelInput, shown: str) -> tuple[onnx.ModelProto, bytes]:
    try:
        raw = source.read_bytes() if isinstance(source, Path) else source
    except OSError as e:
        raise ArtifactError(shown, f"cannot read: {e.strerror or e}") from None
    model: onnx.ModelProto = load_onnx(source, shown)
    return model, raw


def _array(init: onnx.TensorProto, shown: str, folder: Path | None = None) -> Any:
    if init.data_location == onnx.TensorProto.EXTERNAL and folder is not None:
        return _mapped(init, shown, folder)
    try:
        return numpy_helper.to_array(init)
    except (ValueError, TypeError, OSError) as e:
        raise ArtifactError(shown, f"initializer {init.name!r} cannot be decoded ({e})") from None


def _mapped(init: onnx.TensorProto, shown: str, folder: Path) -> Any:
    """An external tensor as a read-only memory map of its span: a model over 2 GB is
    compared without its weights ever being read into memory.  ``load_onnx`` checked
    the location, the span and the file (a regular file beside the model) already."""
    import numpy as np
    from onnx.helper import tensor_dtype_to_np_dtype

    entries = {e.key: e.value for e in init.external_data}
    try:
        dtype = np.dtype(tensor_dtype_to_np_dtype(init.data_type))
        return np.memmap(
            folder / entries["location"], dtype=dtype, mode="r",
            offset=int(entries.get("offset", "0")), shape=tuple(int(d) for d in init.dims),
        )  # fmt: skip
    except (KeyError, ValueError, TypeError, OSError) as e:
        raise ArtifactError(shown, f"initializer {init.name!r} cannot be mapped ({e})") from None


def _domain(domain: str) -> str:
    return domain or "ai.onnx"


def _data_bytes(model: onnx.ModelProto, folder: Path | None) -> int:
    """The size of each external data file the graph names, once (``load_onnx``
    checked they are regular files beside the model)."""
    if folder is None:
        return 0
    files = {
        e.value
        for init in model.graph.initializer
        if init.data_location == onnx.TensorProto.EXTERNAL
        for e in init.external_data
        if e.key == "location"
    }
    return sum((folder / name).stat().st_size for name in sorted(files))


def _info(
    model: onnx.ModelProto, raw: bytes, arrays: dict[str, Any], folder: Path | None = None
) -> ModelInfo:
    producer = " ".join(p for p in (model.producer_name, model.producer_version) if p)
    return ModelInfo(
        file_bytes=len(raw),
        sha256=hashlib.sha256(raw).hexdigest(),
        ir_version=int(model.ir_version),
        opsets=tuple(sorted((_domain(o.domain), int(o.version)) for o in model.opset_import)),
        producer=producer,
        nodes=len(model.graph.node),
        initializers=len(model.graph.initializer),
        parameters=sum(int(a.size) for a in arrays.values()),
        weight_bytes=sum(int(a.nbytes) for a in arrays.values()),
        data_bytes=_data_bytes(model, folder),
    )


def diff_models(
    old: ModelInput,
    new: ModelInput,
    *,
    old_manifest: ModelVersion | None = None,
    new_manifest: ModelVersion | None = None,
    goldens: Goldens | None = None,
    golden_root: Path | None = None,
    name: str | None = None,
    labels: tuple[str, str] | None = None,
) -> ModelDiff:
    """Compare two ONNX models.

    Args:
        old: the old model, a file or its bytes.
        new: the new model, a file or its bytes.
        old_manifest: the old version's manifest, for metrics and labels.
        new_manifest: the new version's manifest, for metrics and labels.
        goldens: golden cases to measure output drift on (normally the new version's);
            no drift is measured without them.
        golden_root: folder ``.npz`` golden paths are relative to (the repository root).
        name: model name for reports (default: the manifests' name).
        labels: how the two sides are called in reports (default: the manifests'
            versions, else ``old`` and ``new``).

    Returns:
        The diff; render it with :mod:`pipelines.diff._report`.

    Raises:
        ArtifactError: a model is not readable ONNX, or an initializer cannot be decoded.
    """
    shown = (
        display_path(old) if isinstance(old, Path) else "old model",
        display_path(new) if isinstance(new, Path) else "new model",
    )
    (old_model, old_raw), (new_model, new_raw) = _load(old, shown[0]), _load(new, shown[1])
    folders = tuple(side.parent if isinstance(side, Path) else None for side in (old, new))
    old_arrays = {i.name: _array(i, shown[0], folders[0]) for i in old_model.graph.initializer}
    new_arrays = {i.name: _array(i, shown[1], folders[1]) for i in new_model.graph.initializer}
    old_sig = signature_from_model(old_model, shown[0])
    new_sig = signature_from_model(new_model, shown[1])
    signature = diff_signature(old_sig.inputs, old_sig.outputs, new_sig.inputs, new_sig.outputs)
    drift = None
    if goldens is not None:
        blocked = [f"{c.tensor} {c.detail}" for c in signature if c.side == "input" and c.breaking]
        drift = golden_drift(
            str(old) if isinstance(old, Path) else old,
            str(new) if isinstance(new, Path) else new,
            goldens,
            golden_root,
            blocked=blocked,
        )
    if labels is None:
        labels = (
            old_manifest.metadata.version if old_manifest else "old",
            new_manifest.metadata.version if new_manifest else "new",
        )
    if name is None:
        either = new_manifest or old_manifest
        name = either.metadata.name if either is not None else ""
    old_info = _info(old_model, old_raw, old_arrays, folders[0])
    new_info = _info(new_model, new_raw, new_arrays, folders[1])
    return ModelDiff(
        name=name,
        old_label=labels[0],
        new_label=labels[1],
        old=old_info,
        new=new_info,
        opsets=diff_opsets(old_info.opsets, new_info.opsets),
        signature=signature,
        graph=diff_nodes(old_model.graph.node, new_model.graph.node),
        weights=diff_weights(old_arrays, new_arrays),
        metrics=diff_metrics(old_manifest, new_manifest),
        drift=drift,
    )


def _entry(repo: Repository, name: str, version: str) -> VersionEntry:
    from registry.checks import declared

    entry = repo.versions.get(name, {}).get(version)
    if entry is None:
        raise ManifestError.single(
            display_path(version_file(repo.root / repo.config.manifests, name, version)),
            f"version {version} is not declared for model {name!r} "
            f"(declared: {declared(repo, name)})",
        )
    return entry


def _artifact(repo: Repository, entry: VersionEntry) -> Path:
    """The version's artifact, pulled through DVC when the workspace lacks it (as in a
    fresh CI checkout) and checked against its pointer either way."""
    from pipelines.fetch import fetch_artifact

    first, *data = entry.manifest.spec.artifact.files()
    for rel in data:  # external data files: pulled and verified as the model is
        fetch_artifact(repo.root, rel, repo.display(repo.root / rel))
    return fetch_artifact(repo.root, first, repo.display(repo.root / first)).path


def _diff_entries(repo: Repository, old: VersionEntry, new: VersionEntry) -> ModelDiff:
    return diff_models(
        _artifact(repo, old),
        _artifact(repo, new),
        old_manifest=old.manifest,
        new_manifest=new.manifest,
        goldens=new.manifest.spec.goldens,
        golden_root=repo.root,
        name=new.name,
        labels=(old.version, new.version),
    )


def diff_versions(repo_root: Path | ReleaseContext, name: str, old: str, new: str) -> ModelDiff:
    """Diff two declared versions of ``name`` from the workspace's artifact files.

    Args:
        repo_root: the repository root or a folder inside it, or the run's context.
        name: the model.
        old: the version diffed against (usually the parent).
        new: the version under review; its goldens measure drift.

    Raises:
        RepositoryError: ``repo_root`` is not in a modelreg repository.
        ManifestError: a version is not declared (or its manifest is invalid).
        ArtifactError: an artifact is in neither the workspace nor DVC's cache or
            remote, differs from its pointer, or is not readable ONNX.
        ToolError: DVC is not installed and an artifact must be pulled.
    """
    repo = repository(repo_root, jobs=1)
    return _diff_entries(repo, _entry(repo, name, old), _entry(repo, name, new))


def changed_versions(repo: Repository | ReleaseContext, base: str) -> list[tuple[str, str]]:
    """(model, version) of every version whose inputs differ from git ref ``base``, in
    SemVer order: the versions the build rebuilds (:mod:`pipelines.changes`: its
    manifest, its artifact's DVC pointers, its golden files, or the model signature it
    takes), so that what a pull request builds is also what its comment diffs.

    Raises:
        UsageError: ``base`` does not name a commit.
        ToolError: git fails.
    """
    if isinstance(repo, ReleaseContext):
        changed, repo = repo.changed_since(base), repo.repo
    else:
        changed = changes.changed_versions(repo, base)
    found = [(n, v) for n, v in changed if v in repo.versions.get(n, {})]
    return sorted(found, key=lambda nv: (nv[0], parse_version(nv[1])))


def diff_against_base(repo_root: Path | ReleaseContext, base: str) -> BaseDiff:
    """Diff every version changed against git ref ``base`` with its parent.

    Raises:
        RepositoryError: ``repo_root`` is not in a modelreg repository.
        ToolError: git fails (unknown ref, not a git work tree).
        ManifestError: a parent is not declared.
        ArtifactError: an artifact is in neither the workspace nor DVC's cache or
            remote, differs from its pointer, or is not readable ONNX.
        ToolError: DVC is not installed and an artifact must be pulled.
    """
    repo = repository(repo_root, jobs=1)
    diffs: list[ModelDiff] = []
    orphans: list[tuple[str, str]] = []
    run = repo_root if isinstance(repo_root, ReleaseContext) else repo
    for name, version in changed_versions(run, base):
        entry = repo.versions[name][version]
        parent = entry.manifest.spec.parent
        if parent is None:
            orphans.append((name, version))
        else:
            diffs.append(_diff_entries(repo, _entry(repo, name, parent), entry))
    return BaseDiff(base, tuple(diffs), tuple(orphans))


__all__ = ["changed_versions", "diff_against_base", "diff_models", "diff_versions"]
