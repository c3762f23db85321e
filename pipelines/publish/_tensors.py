"""A version's tensor manifest and the objects it names (docs/reference/tensors.md).

Private to :mod:`pipelines.publish`.  The artifact is cut with ``registry.tensors``; the
manifest is published only when joining the skeleton and the tensors gives the file's
exact bytes again (same length, same SHA-256), so the whole-file digest and the
per-tensor digests a device trusts describe the same bytes.  A file that does not cut
(no graph, no tensor large enough) or does not join back gets no manifest: devices
install it whole, as before.
"""

from __future__ import annotations

import hashlib
import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from registry.atomic import AtomicFile
from registry.safe_io import open_regular
from registry.tensors import (
    STORE_LOCATION,
    TensorCutError,
    external_locations,
    join,
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
    path: Path, signed_sha256: str | None = None
) -> tuple[TensorManifest, dict[str, ObjectSource]] | None:
    """The tensor manifest of the ONNX file ``path`` and its objects by digest (the
    skeleton and each tensor); None when it gets none (see the module doc).

    Args:
        path: the artifact.
        signed_sha256: the digest its target is signed with: the join must give
            exactly those bytes (None: the file's own digest).

    Raises:
        OSError: the file cannot be read.
        UnsafeFileError: it is a link or not a regular file.
    """
    with open_regular(path) as fh:  # never through a link a pull request planted
        size = os.fstat(fh.fileno()).st_size
        if not size:
            return None
        with mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ) as view:
            try:
                cut = split(view)
                layout = joined(cut.skeleton)
                # data files of its own: the whole-file route
                if external_locations(cut.skeleton) != {STORE_LOCATION}:
                    return None
            except TensorCutError:
                return None
            if not cut.pieces or len(cut.pieces) > MAX_TENSORS or layout.length != size:
                return None
            if [(p.name, p.length) for p in layout.pieces] != [
                (p.name, p.length) for p in cut.pieces
            ]:
                return None
            memory = memoryview(view)
            try:
                digests = [
                    hashlib.sha256(memory[p.offset : p.offset + p.length]).hexdigest()
                    for p in cut.pieces
                ]
                again = hashlib.sha256()
                spans = [(p.offset, p.offset + p.length) for p in cut.pieces]
                for chunk in join(layout, lambda i, _piece: memory[spans[i][0] : spans[i][1]]):
                    again.update(chunk)
                if signed_sha256 is None:  # no signed digest to hold it to: the file's
                    signed_sha256 = hashlib.sha256(memory).hexdigest()
            finally:
                memory.release()
    if again.hexdigest() != signed_sha256:
        return None  # the join is not the bytes released under this version
    graph_sha = hashlib.sha256(cut.skeleton).hexdigest()
    try:
        manifest = TensorManifest(
            graph=GraphDoc(sha256=graph_sha, length=len(cut.skeleton)),
            tensors=[
                TensorDoc.model_validate({"name": p.name, "dtype": p.dtype,
                                          "shape": list(p.dims), "length": p.length,
                                          "sha256": d})
                for p, d in zip(cut.pieces, digests, strict=True)
            ],
        )  # fmt: skip
    except ValidationError:  # a name or rank the schema does not take: the whole file
        return None
    objects = {graph_sha: ObjectSource(len(cut.skeleton), data=cut.skeleton)}
    for piece, digest in zip(cut.pieces, digests, strict=True):
        objects.setdefault(digest, ObjectSource(piece.length, path, piece.offset))
    return manifest, objects
