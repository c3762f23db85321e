"""Publish stage "description": each version's device-facing description and golden files.

A device reads nothing about a version from the git checkout, an untrusted transport:
what it needs besides the artifact (the I/O signature, the device targets with their
selectors and engine settings, the golden cases with their tolerances) is signed, per
version, as ``versions/<model>/<version>.json`` (a :class:`signing.version_doc.VersionDoc`,
kind ``version``), and each side of each golden case as one ``.npz`` target (kind
``golden``).  Paths come from :mod:`signing.target_names`.

Golden files are read from the work tree through the bounded reader, inline tensors
converted to arrays of their declared dtype, and both written by
:func:`registry.goldens.npz_bytes`: one format for the device, and the same case
always gives the same bytes.

Released files never change.  Once a version's description is signed, neither it nor
its golden files are staged again, even when the manifest's goldens changed since (a
change there needs a new version, as a changed artifact does).  A version released
before descriptions existed gets one (and its golden files) on the next publish:
targets are only added, nothing signed before changes.
"""

from __future__ import annotations

from collections.abc import Callable

from registry.errors import GoldenError, ManifestError, UsageError, quote
from registry.goldens import npz_bytes, tensor_set
from registry.loader import format_loc
from registry.repository import Repository, VersionEntry
from registry.schema import Goldens, TensorSet
from signing.provenance import Provenance
from signing.target_names import (
    GoldenSide,
    artifact_path,
    engine_path,
    external_data_path,
    golden_path,
    version_path,
)
from signing.tuf_facts import TargetFacts, TargetKind
from signing.tuf_repo import TrustRepo
from signing.version_doc import MAX_VERSION_DOC_BYTES, GoldenCaseDoc, VersionDoc

from ._tensors import ObjectSource, tensor_manifest

__all__ = ["describe", "stage_description"]


def describe(
    repo: Repository, entry: VersionEntry, engines: dict[str, str]
) -> tuple[VersionDoc, dict[str, bytes]]:
    """The description of ``entry`` and its golden files.

    Args:
        repo: the repository (golden files are read from its work tree).
        entry: the version.
        engines: prebuilt engine target path by device target name.

    Returns:
        The description, and the canonical ``.npz`` bytes of each golden case side by
        target path (in case order, inputs before outputs).

    Raises:
        ManifestError: a golden file is a link, missing, over a cap or not a readable
            ``.npz``, or an inline tensor does not fit its dtype (positioned in the
            version's manifest).
    """
    spec = entry.manifest.spec
    owner = repo.models.get(entry.name)
    signature = spec.signature or (owner.manifest.spec.signature if owner else None)
    files: dict[str, bytes] = {}
    goldens = spec.goldens
    cases = (
        [_case(repo, entry, goldens, i, files) for i in range(len(goldens.cases))]
        if goldens
        else []
    )
    doc = VersionDoc(
        model=entry.name,
        version=entry.version,
        parent=spec.parent,
        artifact=artifact_path(entry.name, entry.version),
        signature=signature,
        labels=dict(entry.manifest.metadata.labels),
        targets=list(spec.targets),
        engines=engines,
        goldens=cases,
        external_data={
            f: external_data_path(entry.name, entry.version, f) for f in spec.artifact.external_data
        },
    )
    return doc, files


def _case(
    repo: Repository,
    entry: VersionEntry,
    goldens: Goldens,
    index: int,
    files: dict[str, bytes],
) -> GoldenCaseDoc:
    """Case ``index`` as a device runs it; its two ``.npz`` files go into ``files``.

    Raises:
        ManifestError: a side cannot be read or converted (positioned in the manifest).
    """
    case = goldens.cases[index]
    paths: dict[GoldenSide, str] = {}
    sides: tuple[tuple[GoldenSide, TensorSet], ...] = (
        ("inputs", case.inputs),
        ("outputs", case.outputs),
    )
    for side, value in sides:
        try:
            path = golden_path(entry.name, entry.version, case.name, side)
        except UsageError:  # the manifest schema allows '..' or '.x'; a file name may not
            reason = "a case name may not start with '.' (it names the case's golden files)"
            raise _problem(entry, index, case.name, "name", reason) from None
        try:
            files[path] = npz_bytes(tensor_set(value, repo.root))
        except GoldenError as e:
            raise _problem(entry, index, case.name, side, str(e)) from None
        paths[side] = path
    return GoldenCaseDoc(
        name=case.name,
        inputs=paths["inputs"],
        outputs=paths["outputs"],
        rtol=goldens.rtol if case.rtol is None else case.rtol,
        atol=goldens.atol if case.atol is None else case.atol,
    )


def _problem(entry: VersionEntry, index: int, case: str, field: str, reason: str) -> ManifestError:
    """Case ``index`` (named ``case``) of ``entry`` cannot be published, at ``field``."""
    loc = ("spec", "goldens", "cases", index, field)
    line, col = entry.doc.position(loc)
    message = f"golden case {quote(case)} cannot be published: {reason}"
    return ManifestError.single(entry.file, message, line=line, col=col, field=format_loc(loc))


def stage_description(
    repo: Repository,
    trust: TrustRepo,
    entry: VersionEntry,
    facts: Callable[[TargetKind], TargetFacts],
    objects: dict[str, ObjectSource] | None = None,
    *,
    provenance: Provenance | None = None,
) -> list[str]:
    """Stage the description of ``entry`` and its golden files, unless already released.

    Call it after the version's engines are staged: the description names every
    engine of a declared target that is published or staged for it.

    Args:
        repo: the repository.
        trust: the trust metadata being released.
        entry: the version.
        facts: the signed facts of a target of this version, by kind.
        objects: where the objects its tensor manifest names go, by digest, to be
            uploaded before the description (``pipelines.publish._tensors``; None:
            the description gets no manifest).
        provenance: where the version came from (``signing.provenance``), signed in
            the description; None: the description says nothing of it.

    Returns:
        The target paths staged (none when the description is already released).

    Raises:
        ManifestError: a golden case cannot be read (see :func:`describe`).
    """
    doc_path = version_path(entry.name, entry.version)
    if trust.published(doc_path) is not None:
        return []  # released: never re-signed, whatever the manifest says now
    engines = {}
    for target in entry.manifest.spec.targets:
        path = engine_path(entry.name, entry.version, target.name, target.engine)
        if path in trust.targets:
            engines[target.name] = path
    doc, files = describe(repo, entry, engines)
    if provenance is not None:
        doc = doc.model_copy(update={"provenance": provenance})
    spec = entry.manifest.spec
    if objects is not None:

        def signed(path: str) -> str | None:
            target = trust.targets.get(path)
            return target.hashes.get("sha256") if target is not None else None

        artifact = spec.artifact
        data_files = {
            file: (repo.root / rel, signed(external_data_path(entry.name, entry.version, file)))
            for file, rel in zip(artifact.external_data, artifact.files()[1:], strict=True)
        }
        digest = signed(artifact_path(entry.name, entry.version))
        found = tensor_manifest(repo.root / artifact.path, digest, data_files)
        if found is not None:
            manifest, sources = found
            described = doc.model_copy(update={"tensors": manifest})
            # a description every device would refuse gets no manifest: whole files
            if len(described.to_bytes()) <= MAX_VERSION_DOC_BYTES:
                doc = described
                objects.update(sources)
    added = []
    for path, data in files.items():
        # A golden file is only ever signed with its description, but should one be
        # released alone, it stays as it was.
        if trust.published(path) is None:
            trust.add_target(path, data, facts("golden"))
            added.append(path)
    trust.add_target(doc_path, doc.to_bytes(), facts("version"))
    added.append(doc_path)
    return added
