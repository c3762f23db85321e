"""A version's tensor manifest and the objects it names (docs/reference/tensors.md).

Private to :mod:`pipelines.publish`.  The artifact is cut with ``registry.tensors``; the
manifest is published only when joining the skeleton and the tensors gives the file's
exact bytes again (same length, same SHA-256), so the whole-file digest and the
per-tensor digests a device trusts describe the same bytes.  A model stored with external
data is cut with its data files: the join must give the ``.onnx`` and every data file
back (each its tensors in offset order, zeros between, nothing after).  A file that does
not cut (no graph, no tensor large enough) or does not join back gets no manifest:
devices install it whole, as before.
"""

from __future__ import annotations

import hashlib
import mmap
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from registry.atomic import AtomicFile
from registry.safe_io import open_regular
from registry.tensors import (
    STORE_LOCATION,
    Piece,
    Split,
    TensorCutError,
    data_files,
    external_locations,
    join,
    join_data,
    joined,
    split,
)
from signing.version_doc import MAX_TENSORS, GraphDoc, TensorDoc, TensorManifest

__all__ = ["ObjectSource", "tensor_manifest"]


@dataclass(frozen=True)
class ObjectSource:
    """Where one object's bytes are: ``data``, or ``length`` bytes of ``path`` from
    ``offset``."""

    length: int
    path: Path | None = None
    offset: int = 0
    data: bytes | None = None

    def read(self) -> bytes:
        """The object's bytes (a small one: tests, the skeleton)."""
        return b"".join(self.chunks())

    def chunks(self, size: int = 1 << 24) -> Iterator[bytes]:
        """The object's bytes, ``size`` at a time (a tensor may be gigabytes)."""
        if self.data is not None:
            yield self.data
            return
        assert self.path is not None  # noqa: S101 - one of the two is set
        with self.path.open("rb") as fh:
            fh.seek(self.offset)
            left = self.length
            while left > 0:
                chunk = fh.read(min(size, left))
                if not chunk:
                    raise OSError(f"{self.path}: ends {left} bytes early")
                left -= len(chunk)
                yield chunk

    def copy_to(self, dest: Path, sha256: str) -> None:
        """Write the object to ``dest`` atomically, checked against its digest as it
        is written (a source changed since it was cut is never published).

        Raises:
            OSError: the source cannot be read, differs from ``sha256``, or ``dest``
                cannot be written.
        """
        dest.parent.mkdir(parents=True, exist_ok=True)
        with AtomicFile(dest, mode=0o644) as out:
            hasher = hashlib.sha256()
            for chunk in self.chunks():
                hasher.update(chunk)
                out.write(chunk)
            if hasher.hexdigest() != sha256:  # raised inside: nothing replaced
                raise OSError(f"{self.path}: changed since it was cut (sha256 differs)")


def tensor_manifest(
    path: Path,
    signed_sha256: str | None = None,
    data: Mapping[str, tuple[Path, str | None]] | None = None,
) -> tuple[TensorManifest, dict[str, ObjectSource]] | None:
    """The tensor manifest of the ONNX file ``path`` and its objects by digest (the
    skeleton and each tensor); None when it gets none (see the module doc).

    Args:
        path: the artifact.
        signed_sha256: the digest its target is signed with: the join must give
            exactly those bytes (None: the file's own digest).
        data: a model stored with external data: each data file's path and signed
            digest (None: its own) by the name its graph uses; the joins must give
            each file's bytes too.

    Raises:
        OSError: a file cannot be read.
        UnsafeFileError: it is a link or not a regular file.
    """
    data = data or {}
    with open_regular(path) as fh:  # never through a link a pull request planted
        size = os.fstat(fh.fileno()).st_size
        if not size:
            return None
        with mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ) as view:
            found = _cut(view, size, signed_sha256, frozenset(data))
    if found is None:
        return None
    cut, digests = found
    try:
        orders = data_files(cut.pieces)
    except TensorCutError:  # two tensors over the same bytes: not a file this describes
        return None
    if set(orders) != set(data):
        return None  # a data file no tensor lies in: not described by its tensors
    for file, (data_path, signed) in sorted(data.items()):
        if not _data_joins(data_path, signed, cut.pieces, orders[file], digests):
            return None
    graph_sha = hashlib.sha256(cut.skeleton).hexdigest()
    try:
        manifest = TensorManifest(
            graph=GraphDoc(sha256=graph_sha, length=len(cut.skeleton)),
            tensors=[
                TensorDoc.model_validate({"name": p.name, "dtype": p.dtype,
                                          "shape": list(p.dims), "length": p.length,
                                          "sha256": digests[i], "file": p.file,
                                          "offset": p.offset if p.file else None})
                for i, p in enumerate(cut.pieces)
            ],
        )  # fmt: skip
    except ValidationError:  # a name or rank the schema does not take: the whole file
        return None
    objects = {graph_sha: ObjectSource(len(cut.skeleton), data=cut.skeleton)}
    for i, piece in enumerate(cut.pieces):
        where = data[piece.file][0] if piece.file is not None else path
        objects.setdefault(digests[i], ObjectSource(piece.length, where, piece.offset))
    return manifest, objects


def _cut(
    view: mmap.mmap, size: int, signed_sha256: str | None, files: frozenset[str]
) -> tuple[Split, dict[int, str]] | None:
    """The model file cut, and the digests of the tensors in it by index, when the
    join gives its exact bytes back (tensors in data files hashed by
    :func:`_data_joins`)."""
    try:
        cut = split(view, files)
        if external_locations(cut.skeleton) != {STORE_LOCATION}:
            return None  # a tensor in a file the version does not name, or left uncut
        placed = {i: (p.file, p.offset) for i, p in enumerate(cut.pieces) if p.file is not None}
        layout = joined(cut.skeleton, lambda i, _p: placed.get(i))
    except TensorCutError:
        return None
    if not cut.pieces or len(cut.pieces) > MAX_TENSORS or layout.length != size:
        return None
    if [(p.name, p.length, p.file) for p in layout.pieces] != [
        (p.name, p.length, p.file) for p in cut.pieces
    ]:
        return None
    memory = memoryview(view)
    try:
        digests = {
            i: hashlib.sha256(memory[p.offset : p.offset + p.length]).hexdigest()
            for i, p in enumerate(cut.pieces)
            if p.file is None
        }
        again = _hashed(join(layout, lambda i, p: memory[cut.pieces[i].offset :][: p.length]))
        if signed_sha256 is None:  # no signed digest to hold it to: the file's
            signed_sha256 = hashlib.sha256(memory).hexdigest()
    finally:
        memory.release()
    if again != signed_sha256:
        return None  # the join is not the bytes released under this version
    return cut, digests


def _data_joins(
    path: Path,
    signed_sha256: str | None,
    pieces: tuple[Piece, ...],
    order: tuple[int, ...],
    digests: dict[int, str],
) -> bool:
    """Whether the data file at ``path`` is its tensors in offset order with zeros
    between them and nothing after (then each tensor's digest is added to
    ``digests``)."""
    with open_regular(path) as fh:
        size = os.fstat(fh.fileno()).st_size
        last = pieces[order[-1]]
        if size != last.offset + last.length:
            return False
        with mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ) as view:
            memory = memoryview(view)
            try:
                for i in order:
                    p = pieces[i]
                    digests[i] = hashlib.sha256(memory[p.offset : p.offset + p.length]).hexdigest()
                again = _hashed(
                    join_data(pieces, order, lambda _i, p: memory[p.offset :][: p.length])
                )
                if signed_sha256 is None:
                    signed_sha256 = hashlib.sha256(memory).hexdigest()
            finally:
                memory.release()
    return again == signed_sha256


def _hashed(chunks: Iterator[Any]) -> str:
    """The SHA-256 of the chunks (views over a map: none is referenced once this
    returns, so the map can close)."""
    hasher = hashlib.sha256()
    for chunk in chunks:
        hasher.update(chunk)
    return hasher.hexdigest()
