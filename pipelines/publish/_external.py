"""Publishing a version stored with ONNX external data (every model over 2 GB): the parts
of :mod:`pipelines.publish._stage` that only such a version needs.

* its OMS bundle covers the ``.onnx`` and each data file by name (:func:`sign_version`),
  so ``model_signing verify key`` accepts it for a folder holding exactly those files;
* each data file is a signed target (kind ``external_data``, with its DVC md5, so a
  released file can be proven unchanged without hashing: :func:`data_changed`);
* each data file gets a delta from the parent's file at the same place in its sorted
  list, tensor-aware and streamed (:func:`stage_data_deltas`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from pipelines.errors import ArtifactError
from pipelines.model_bundle import sign_onnx
from registry.errors import RegistryError
from registry.repository import Repository, VersionEntry
from signing.oms import ModelFacts
from signing.target_names import external_data_delta_path, external_data_path
from signing.tuf_facts import TargetFacts
from signing.tuf_repo import TrustRepo

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric import ec

__all__ = ["data_changed", "data_rel", "md5_of", "sign_version", "stage_data_deltas"]

MAX_GRAPH_BYTES: Final = 2**31
"""Largest ``.onnx`` read whole to find external tensors (protobuf's own 2 GB cap)."""


def sign_version(
    artifact: Path, entry: VersionEntry, key: ec.EllipticCurvePrivateKey, facts: ModelFacts
) -> dict[str, Any]:
    """The OMS bundle of a version: over its one file, or over the ``.onnx`` and its
    external data files by their names (what ``model_signing`` signs for a folder that
    holds exactly them).

    Raises:
        SigningError: the artifact is a link or not a regular file.
        OSError: a file cannot be read.
    """
    name = f"{entry.name}-{entry.version}"
    external = entry.manifest.spec.artifact.external_data
    return sign_onnx(artifact, external, key, model_name=name, facts=facts)


def stage_data_deltas(
    repo: Repository,
    trust: TrustRepo,
    entry: VersionEntry,
    parent: str,
    *,
    fetch: Callable[[Repository, VersionEntry], Path],
    facts: Callable[..., TargetFacts],
    out_dir: Path,
) -> list[str]:
    """A delta per external data file from the parent's file at the same place in its
    sorted list (a model keeps its layout across fine-tunes; another count of files
    gets no data deltas and devices fetch those files in full).  The tensors come from
    each version's graph, so the delta is tensor-aware; it is encoded streaming.

    Raises:
        ArtifactError: a graph is a link, too large, or does not parse.
        UsageError: a graph's spans overlap (build refuses such a graph first).
        OSError: a file cannot be read or the delta cannot be written.
    """
    from registry.delta import encode_external
    from registry.onnx_wire import WireFormatError, external_initializers
    from registry.safe_io import read_regular
    from signing.hashing import sha256_file

    base_entry = repo.versions.get(entry.name, {}).get(parent)
    new_files = sorted(entry.manifest.spec.artifact.external_data)
    if base_entry is None or not new_files:
        return []
    base_files = sorted(base_entry.manifest.spec.artifact.external_data)
    if len(base_files) != len(new_files):
        return []
    todo = [
        (old, new, external_data_delta_path(entry.name, entry.version, parent, new))
        for old, new in zip(base_files, new_files, strict=True)
    ]
    todo = [t for t in todo if trust.published(t[2]) is None]
    if not todo:
        return []
    base_onnx, new_onnx = fetch(repo, base_entry), fetch(repo, entry)
    spans = {}
    for side, onnx_path in (("base", base_onnx), ("new", new_onnx)):
        shown = repo.display(onnx_path)
        try:
            graph = read_regular(onnx_path, root=repo.root, max_bytes=MAX_GRAPH_BYTES)
            spans[side] = external_initializers(graph)
        except (RegistryError, WireFormatError) as e:
            raise ArtifactError(shown, f"cannot read its external tensors ({e})") from None
    added = []
    for old, new, target in todo:
        base_tensors = [s.tensor for s in spans["base"] if s.location == old]
        new_tensors = [s.tensor for s in spans["new"] if s.location == new]
        out = out_dir / target
        out.parent.mkdir(parents=True, exist_ok=True)
        base_file = base_onnx.parent / old
        encode_external(base_file, new_onnx.parent / new, out, base_tensors, new_tensors)
        signed = facts("delta", base=parent, base_sha256=sha256_file(base_file), file=new)
        trust.add_target(target, out, signed)
        added.append(target)
    return added


def md5_of(repo: Repository, path: str) -> str | None:
    """The md5 the DVC pointer of ``path`` records (checked while loading, else now)."""
    from registry.dvcfile import check_pointer

    check = repo.pointers.get(path) or check_pointer(str(repo.root), "", path)
    return check.md5


def data_rel(entry: VersionEntry, name: str) -> str:
    """The repository path of external data file ``name`` (beside the ``.onnx``)."""
    artifact = entry.manifest.spec.artifact
    return artifact.files()[1 + artifact.external_data.index(name)]


def data_changed(repo: Repository, trust: TrustRepo, entry: VersionEntry) -> bool:
    """Whether a released external data file's DVC pointer names other bytes now."""
    for name in entry.manifest.spec.artifact.external_data:
        info = trust.published(external_data_path(entry.name, entry.version, name))
        if info is None:
            continue
        signed = TargetFacts.from_custom(info.custom).dvc_md5
        if signed is not None and md5_of(repo, data_rel(entry, name)) not in (None, signed):
            return True
    return False
