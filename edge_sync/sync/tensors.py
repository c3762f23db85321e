"""A version held as tensors on the device (docs/reference/tensors.md): fetch what is
missing, lay the version out over the blobs that hold its weights, keep that layout.

Private to :mod:`edge_sync.sync.install`.  A version whose signed description carries a
tensor manifest (``signing.version_doc.TensorManifest``) is built from its skeleton and
its tensors (``edge_sync.engine.weights``), never from a whole file:

* installed **as tensors** (plan ``tensors``), each object the device lacks (the skeleton,
  each tensor) is fetched from ``objects/`` on the remote, verified against the digest
  and length the manifest signs, and kept as a blob by that digest; tensors it holds
  stay where they are;
* installed **whole** (``full``, ``delta``, ``cached``), the verified artifact is cut
  (``registry.tensors.split``): its skeleton must hash to the signed one and its
  tensors must be the listed ones (names, types, shapes, lengths, in order); then each
  tensor is a span of the artifact's blob, its digest the signed one.  The artifact's
  own digest covered those bytes; the cut proves the manifest describes them.

The **layout** (each tensor's digest, and the blob and offset of its bytes) is kept in
``layouts/<model>-<version>.json`` beside the kept descriptions, so a restart or a
rollback builds the version with no network; it also tells the blob collector which
blobs a held version's weights live in, and the next update which digests the device
holds.  A layout names blobs by digest only; every blob is verified when it is adopted,
hashed again at start-up, and checked before each build (``BlobStore.checked``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import re
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from edge_sync.decide.plan import Signed, TensorFacts
from edge_sync.engine.base import TensorLayout
from edge_sync.engine.weights import TensorRef
from registry.atomic import AtomicFile, write_atomic
from registry.schema import file_name_problem
from registry.tensors import (
    DTYPES,
    STORE_LOCATION,
    Joined,
    Piece,
    TensorCutError,
    data_files,
    external_locations,
    join,
    join_data,
    joined,
    split,
)
from signing.errors import VerificationError
from signing.target_names import object_path

if TYPE_CHECKING:
    from edge_sync.state.models import Installed
    from edge_sync.state.store import BlobStore
    from edge_sync.sync.trust import DeviceTrust
    from signing.version_doc import TensorManifest

__all__ = [
    "LAYOUTS_DIR",
    "Placed",
    "collect_layouts",
    "export_version",
    "fetch_missing",
    "held_digests",
    "layout_blobs",
    "layout_from_artifact",
    "layout_from_objects",
    "load_layout",
    "save_layout",
    "tensor_facts",
    "tensor_layout",
]

LAYOUTS_DIR: Final = "layouts"
_HEX64: Final = re.compile(r"[0-9a-f]{64}")
Stages = Callable[[str], AbstractContextManager[None]]


@dataclass(frozen=True)
class Placed:
    """One tensor of a version on the device: what it is and where its bytes lie; for
    a model stored with external data, also where they lie in the version's data
    ``file`` (``file_offset``), to write that file again (:func:`export_version`)."""

    name: str
    dtype: str
    dims: tuple[int, ...]
    sha256: str
    blob: str
    offset: int
    length: int
    file: str | None = None
    file_offset: int = 0

    def as_json(self) -> list[Any]:
        row = [self.name, self.dtype, list(self.dims), self.sha256, self.blob, self.offset,
               self.length]  # fmt: skip
        return row if self.file is None else [*row, self.file, self.file_offset]

    @classmethod
    def from_json(cls, row: list[Any]) -> Placed:
        """A row as :meth:`as_json` writes it.

        Raises:
            ValueError: it is not one (a digest that is no digest, a type numpy lacks,
                a negative offset, a data file that is no plain name).
        """
        name, dtype, dims, sha256, blob, offset, length, *rest = row
        file, file_offset = (str(rest[0]), int(rest[1])) if len(rest) == 2 else (None, 0)
        if len(rest) not in (0, 2):
            raise ValueError(f"tensor {name!r}: not a tensor's place")
        placed = cls(str(name), str(dtype), tuple(int(d) for d in dims), str(sha256),
                     str(blob), int(offset), int(length), file, file_offset)  # fmt: skip
        if not (_HEX64.fullmatch(placed.sha256) and _HEX64.fullmatch(placed.blob)):
            raise ValueError(f"tensor {placed.name!r}: not a digest")
        if placed.dtype not in DTYPES.values() or min(placed.offset, placed.length,
                                                      placed.file_offset) < 0:  # fmt: skip
            raise ValueError(f"tensor {placed.name!r}: not a tensor's place")
        if file is not None and file_name_problem(file) is not None:
            raise ValueError(f"tensor {placed.name!r}: data file {file!r} is not a plain name")
        return placed


def _layout_file(root: Path, name: str, version: str) -> Path:
    return root / LAYOUTS_DIR / f"{name}-{version}.json"


def save_layout(root: Path, name: str, version: str, graph: str, placed: list[Placed]) -> None:
    """Keep a version's layout (atomically, before the state names the version)."""
    folder = root / LAYOUTS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    data = {"graph": graph, "tensors": [p.as_json() for p in placed]}
    write_atomic(_layout_file(root, name, version), json.dumps(data).encode(), mode=0o600)


def load_layout(root: Path, name: str, version: str) -> tuple[str, list[Placed]]:
    """A kept layout: the skeleton's digest and the tensors.

    Raises:
        OSError: it is missing or unreadable.
    """
    return _read_layout(_layout_file(root, name, version))


def _read_layout(path: Path) -> tuple[str, list[Placed]]:
    try:
        data = json.loads(path.read_bytes())
        graph, placed = str(data["graph"]), [Placed.from_json(row) for row in data["tensors"]]
    except (ValueError, KeyError, TypeError) as e:
        raise OSError(f"{path}: not a tensor layout ({e})") from None
    if not _HEX64.fullmatch(graph):
        raise OSError(f"{path}: not a tensor layout (its skeleton is not a digest)")
    return graph, placed


def _layout_files(root: Path) -> list[Path]:
    folder = root / LAYOUTS_DIR
    return sorted(folder.glob("*.json")) if folder.is_dir() else []


def _layouts(root: Path) -> Iterable[tuple[str, list[Placed]]]:
    for path in _layout_files(root):
        with contextlib.suppress(OSError):  # unreadable: holds nothing usable
            yield _read_layout(path)


def layout_blobs(root: Path, keep: Callable[[str], bool]) -> set[str]:
    """The blobs the layouts of kept versions (``keep(file stem)``) name: skeletons and
    the blobs their tensors lie in.

    Raises:
        OSError: a kept version's layout cannot be read (collect nothing then).
    """
    found: set[str] = set()
    for path in _layout_files(root):
        if keep(path.stem):
            graph, placed = _read_layout(path)
            found.add(graph)
            found.update(p.blob for p in placed)
    return found


def collect_layouts(root: Path, keep: Callable[[str], bool]) -> None:
    """Remove the layouts of versions no longer kept."""
    for path in _layout_files(root):
        if not keep(path.stem):
            path.unlink(missing_ok=True)


def held_digests(root: Path, blobs: BlobStore) -> dict[str, Placed]:
    """Every tensor digest the device holds, and where: a blob by that digest, or a span
    of a blob a kept layout names (the blob still checked: ``BlobStore.checked``)."""
    found: dict[str, Placed] = {}
    usable: dict[str, bool] = {}
    for _graph, placed in _layouts(root):
        for p in placed:
            if p.sha256 in found:
                continue
            if p.blob not in usable:
                usable[p.blob] = blobs.checked(p.blob)
            if usable[p.blob]:
                found[p.sha256] = p
    return found


def tensor_facts(
    manifest: TensorManifest, root: Path, blobs: BlobStore, whole: int = 0
) -> TensorFacts:
    """The plan's facts about a version's tensors: each object, and which it holds
    (``whole``: see ``TensorFacts``)."""
    held = held_digests(root, blobs)
    wanted = {t.sha256 for t in manifest.tensors} | {manifest.graph.sha256}
    have = {d for d in wanted if d in held or (blobs.has(d) and blobs.checked(d))}
    graph = manifest.graph
    return TensorFacts(
        graph=Signed(object_path(graph.sha256), graph.sha256, graph.length),
        tensors=tuple(Signed(object_path(t.sha256), t.sha256, t.length) for t in manifest.tensors),
        held=frozenset(have),
        whole=whole,
    )


def fetch_missing(  # noqa: PLR0917 - one private call site
    trust: DeviceTrust,
    blobs: BlobStore,
    objects: Iterable[Signed],
    work: Path,
    partials: Path,
    stages: Stages,
) -> None:
    """Fetch each object, verified against its signed digest and length while it
    arrives, and keep it as a blob (written and made durable: only these bytes).

    Raises:
        DigestMismatchError: an object's bytes are not the signed ones.
        TrustFetchError: an object cannot be fetched.
        OSError: it cannot be stored.
    """
    for obj in objects:
        with stages("fetch"):
            fetched = trust.fetch_object(obj.sha256, obj.length, work, partial_dir=partials)
        with stages("verify_bytes"):
            blobs.adopt(fetched, obj.sha256)


def _matches(manifest: TensorManifest, pieces: Iterable[Any]) -> bool:
    """Whether the cut's tensors are the manifest's: names, types, shapes, lengths and,
    for tensors stored as external data, the file and offset, in order."""
    got = [
        (p.name, p.dtype, tuple(p.dims), p.length, p.file, p.offset if p.file else None)
        for p in pieces
    ]
    want = [
        (t.name, t.dtype, tuple(t.shape), t.length, t.file, t.offset if t.file else None)
        for t in manifest.tensors
    ]
    return got == want


def _only_the_store(skeleton: bytes, where: str) -> None:
    """Refuse a skeleton any of whose tensors names an external file other than the
    tensor store's (ONNX Runtime would read it, unverified, in a private session).

    Raises:
        VerificationError: it names one.
        TensorCutError: it does not walk.
    """
    foreign = external_locations(skeleton) - {STORE_LOCATION}
    if foreign:
        names = ", ".join(repr(n) for n in sorted(foreign)[:3])
        raise VerificationError(f"the skeleton names external data files ({names})", where)


def layout_from_objects(
    manifest: TensorManifest, artifact_length: int, root: Path, blobs: BlobStore
) -> list[Placed]:
    """Where each of the version's tensors lies, all held now (after
    :func:`fetch_missing`); the skeleton is checked against the manifest first.

    Raises:
        VerificationError: the skeleton names other tensors than the manifest, or
            skeleton and tensors would not make a file of the artifact's signed length.
        OSError: a tensor is not held (removed since the plan).
    """
    graph = manifest.graph.sha256
    places = manifest.placed()
    try:
        skeleton = blobs.path(graph).read_bytes()
        layout = joined(skeleton, lambda i, _piece: places.get(i))
        _only_the_store(skeleton, object_path(graph))
    except TensorCutError as e:
        raise VerificationError(f"the skeleton does not walk ({e})", object_path(graph)) from None
    if not _matches(manifest, layout.pieces) or layout.length != artifact_length:
        raise VerificationError(
            "the skeleton and the signed tensor manifest disagree", object_path(graph)
        )
    held = held_digests(root, blobs)
    placed = []
    for t in manifest.tensors:
        where = held.get(t.sha256)
        if where is None and blobs.has(t.sha256):
            where = Placed(t.name, t.dtype, tuple(t.shape), t.sha256, t.sha256, 0, t.length)
        if where is None or where.length != t.length:
            raise OSError(f"tensor {t.name!r} ({t.sha256[:12]}) is not held")
        placed.append(Placed(t.name, t.dtype, tuple(t.shape), t.sha256, where.blob,
                             where.offset, t.length, t.file, t.offset or 0))  # fmt: skip
    return placed


def layout_from_artifact(
    manifest: TensorManifest,
    artifact: str,
    blobs: BlobStore,
    work: Path,
    external: dict[str, str] | None = None,
) -> list[Placed]:
    """The version's tensors as spans of its verified artifact blob (and of its
    verified data file blobs, ``external`` naming each by file); its skeleton (which
    must hash to the signed one) kept as a blob.

    Raises:
        VerificationError: the artifact's cut is not what the manifest signs.
        OSError: the blob cannot be read.
    """
    external = external or {}
    path = blobs.path(artifact)
    with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ) as view:
        try:
            cut = split(view, frozenset(external))
        except TensorCutError as e:
            raise VerificationError(f"the artifact does not cut ({e})", str(path)) from None
    graph = manifest.graph.sha256
    if hashlib.sha256(cut.skeleton).hexdigest() != graph or not _matches(manifest, cut.pieces):
        raise VerificationError(
            "the signed tensor manifest does not describe the artifact", object_path(graph)
        )
    try:
        _only_the_store(cut.skeleton, str(path))
    except TensorCutError as e:
        raise VerificationError(f"the artifact does not walk ({e})", str(path)) from None
    if not blobs.has(graph):
        work.mkdir(parents=True, exist_ok=True)
        staged = work / f"{graph}.skeleton"
        staged.write_bytes(cut.skeleton)
        blobs.adopt(staged, graph)
    return [
        Placed(
            t.name,
            t.dtype,
            tuple(t.shape),
            t.sha256,
            artifact if p.file is None else external[p.file],
            p.offset,
            p.length,
            p.file,
            p.offset if p.file is not None else 0,
        )
        for t, p in zip(manifest.tensors, cut.pieces, strict=True)
    ]


def tensor_layout(
    blobs: BlobStore, graph: str, placed: list[Placed], check: Callable[[], None] | None = None
) -> TensorLayout:
    """What the engine is built from: the skeleton's blob and each tensor's span
    (``check``: see ``TensorLayout.check``)."""
    return TensorLayout(
        blobs.path(graph),
        tuple(
            TensorRef(
                p.name, p.dtype, p.dims, p.sha256, blobs.path(p.blob), p.offset, p.length, p.blob
            )
            for p in placed
        ),
        check,
    )


def export_version(root: Path, blobs: BlobStore, name: str, installed: Installed, out: Path) -> int:
    """Write the whole file ``installed`` stands for to ``out`` (its data files beside
    it, under the names its graph uses), each checked against its signed digest while
    it is written: from its blobs, or joined from its skeleton and tensors when it is
    held as tensors.  Nothing is left at a path whose digest differs.

    Returns:
        The bytes written (the ``.onnx``).

    Raises:
        VerificationError: the bytes written do not hash to the signed digest (the
            store was altered), or the skeleton does not walk.
        OSError: a blob is missing, or ``out`` cannot be written.
    """
    files: list[tuple[Path, str, Callable[[Any], None]]] = []
    pieces: tuple[Piece, ...] = ()
    placed: list[Placed] = []
    if installed.graph is not None and not blobs.has(installed.sha256):
        graph, placed = load_layout(root, name, installed.version)
        places = {i: (p.file, p.file_offset) for i, p in enumerate(placed) if p.file is not None}
        try:
            layout = joined(blobs.path(graph).read_bytes(), lambda i, _piece: places.get(i))
        except TensorCutError as e:
            raise VerificationError(f"the skeleton does not walk ({e})", str(out)) from None
        files.append((out, installed.sha256, _joining(blobs, placed, layout.pieces, layout)))
        pieces = layout.pieces
    else:
        files.append((out, installed.sha256, _copier(blobs.path(installed.sha256))))
    try:
        in_files = data_files(pieces)
    except TensorCutError as e:
        raise VerificationError(str(e), str(out)) from None
    for file, digest in sorted(installed.external.items()):
        if blobs.has(digest) or file not in in_files:
            write = _copier(blobs.path(digest))
        else:
            write = _joining(blobs, placed, pieces, in_files[file])
        files.append((out.parent / file, digest, write))
    for path, digest, write in files:
        _write_checked(path, digest, write)
    return out.stat().st_size


def _joining(
    blobs: BlobStore,
    placed: list[Placed],
    pieces: tuple[Piece, ...],
    what: Joined | tuple[int, ...],
) -> Callable[[Any], None]:
    """A writer of a file joined from held tensors: the ``.onnx`` (``what`` its
    layout) or a data file (``what`` its pieces in order: ``registry.tensors.data_files``)."""

    def write(fh: Any) -> None:
        views: dict[str, mmap.mmap] = {}

        def read(i: int, _piece: Piece) -> memoryview:
            return _span(blobs, views, placed[i])

        try:
            chunks = join(what, read) if isinstance(what, Joined) else join_data(pieces, what, read)
            for chunk in chunks:
                fh.write(chunk)
            del chunk, chunks  # no view left: the maps close
        finally:
            for view in views.values():
                view.close()

    return write


def _span(blobs: BlobStore, views: dict[str, mmap.mmap], placed: Placed) -> memoryview:
    view = views.get(placed.blob)
    if view is None:
        with blobs.path(placed.blob).open("rb") as fh:
            view = views[placed.blob] = mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ)
    return memoryview(view)[placed.offset : placed.offset + placed.length]


def _copier(source: Path) -> Callable[[Any], None]:
    def copy(fh: Any) -> None:
        with source.open("rb") as src:
            while chunk := src.read(1 << 20):
                fh.write(chunk)

    return copy


class _Hashing:
    """A file object that hashes what is written through it."""

    def __init__(self, fh: Any) -> None:
        self.fh, self.hasher = fh, hashlib.sha256()

    def write(self, data: Any) -> None:
        self.hasher.update(data)
        self.fh.write(data)


def _write_checked(path: Path, sha256: str, write: Callable[[Any], None]) -> None:
    """``write`` into a temporary file beside ``path``, put in its place only when what
    was written hashes to ``sha256``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with AtomicFile(path, mode=0o644) as out:
        hashing = _Hashing(out.file)
        write(hashing)
        got = hashing.hasher.hexdigest()
        if got != sha256:  # raised inside: nothing replaced
            raise VerificationError(f"sha256 {got} differs from the signed {sha256}", str(path))
