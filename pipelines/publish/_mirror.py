"""The signed metadata, mirrored to the artifact remote beside the targets.

``<DVC remote>/modelreg/metadata/`` holds the exact bytes of the files a TUF client
fetches (:meth:`signing.tuf_repo.TrustRepo.mirror_files`): every ``N.root.json``, the
current ``N.targets.json`` and ``N.snapshot.json``, and ``timestamp.json``.  A device
may follow the metadata there instead of the git repository (``edge.yaml``:
``repository: {source: artifacts}``); it trusts the mirror no more than git, since
every file is verified against the root it was provisioned with.

The upload order is what keeps a reader safe: the targets are uploaded first (by
``publish``, before anything is signed), then the roots oldest first, then targets and
snapshot metadata, and ``timestamp.json`` last, so a device that sees the new timestamp
finds every file it names.  Roots are uploaded once; the current targets, snapshot and
timestamp when the mirror lacks them or holds other bytes, so that an idle device's
conditional request (ETag, ``If-Modified-Since``, a file's mtime) stays "not modified".

The repository's git history is what signs; the mirror may have seen more of it, when
a run mirrored metadata whose commit never reached git (a lost push).  Devices may hold
that timestamp, so the next run signs its timestamp above it (:func:`timestamp_floor`,
read from the mirror before signing), and a timestamp is never replaced by a lower
one this repository signed (``RollbackError``).

:func:`read_state`, :func:`timestamp_floor` and :func:`plan_mirror` decide, with no I/O
of their own; :class:`MirrorFolder` implementations read and write the remote.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

from registry.atomic import write_atomic
from registry.errors import ToolError
from signing.errors import RollbackError

TIMESTAMP: Final = "timestamp.json"
_MAX_TIMESTAMP_BYTES: Final = 1 << 20
"""Most bytes read of the remote's own ``timestamp.json`` (it is compared, not trusted)."""


class MirrorFolder(Protocol):
    """The remote's metadata folder, as the mirror needs it."""

    def sizes(self) -> dict[str, int]:
        """Name -> size of every file in the folder (empty when it does not exist).

        Raises:
            ToolError: the remote cannot be read.
        """

    def read(self, name: str, limit: int) -> bytes:
        """At most ``limit`` + 1 bytes of ``name``.

        Raises:
            ToolError: the remote cannot be read.
        """

    def write(self, name: str, data: bytes) -> None:
        """Replace ``name`` with ``data`` (readers see the old or the new bytes).

        Raises:
            ToolError: the remote cannot be written.
        """


def _is_root(name: str) -> bool:
    return name.endswith(".root.json")


@dataclass(frozen=True)
class MirrorState:
    """What the remote's metadata folder holds, as far as the mirror needs to know.

    Attributes:
        sizes: name -> size of every file there.
        held: the bytes of the files compared byte for byte: ``timestamp.json``, and
            the current targets and snapshot metadata where their size is ours (a
            name held with other bytes was mirrored from a run whose metadata never
            reached the repository; the repository's own replaces it).
    """

    sizes: Mapping[str, int]
    held: Mapping[str, bytes]


def read_state(folder: MirrorFolder, files: Sequence[tuple[str, bytes]]) -> MirrorState:
    """Read what the mirror holds of ``files`` (one listing, and at most three reads).

    Raises:
        ToolError: the remote cannot be read.
    """
    sizes = folder.sizes()
    held = {}
    for name, data in files:
        if _is_root(name) or name not in sizes:
            continue
        if name == TIMESTAMP:
            held[name] = folder.read(name, _MAX_TIMESTAMP_BYTES)
        elif sizes[name] == len(data):
            held[name] = folder.read(name, len(data))
    return MirrorState(sizes, held)


def timestamp_floor(
    ours: bytes | None, state: MirrorState, verified: Callable[[bytes], int | None]
) -> dict[str, int]:
    """The timestamp version to sign above, when the mirror holds another timestamp
    this repository signed (``verified`` says its version) at or above ours: one from
    a run whose metadata commit was lost, which devices may hold.  Empty otherwise.
    """
    theirs = state.held.get(TIMESTAMP)
    if ours is None or theirs is None or theirs == ours:
        return {}
    version, current = verified(theirs), verified(ours)
    if version is None or current is None or version < current:
        return {}
    return {"timestamp": version}


def plan_mirror(
    files: Sequence[tuple[str, bytes]],
    state: MirrorState,
    verified: Callable[[bytes], int | None],
) -> list[str]:
    """What to upload, in upload order, to make the mirror hold ``files``.

    Args:
        files: the signed files in upload order (``TrustRepo.mirror_files``).
        state: what the mirror holds (:func:`read_state`).
        verified: the version of timestamp bytes signed by this repository's keys,
            None for anything else (``TrustRepo.mirrored_timestamp``).

    Raises:
        RollbackError: the mirror holds a timestamp this repository signed with a
            higher version than ours (sign above it first: :func:`timestamp_floor`);
            uploading would roll devices back.
    """
    upload = []
    for name, data in files:
        if name not in state.sizes:
            upload.append(name)
        elif _is_root(name):
            # A root is signed once and never changes: the same name is the same bytes,
            # unless a copy was cut short, which its size tells.
            if state.sizes[name] != len(data):
                upload.append(name)
        elif state.held.get(name) != data:
            if name == TIMESTAMP:
                theirs = verified(state.held.get(name, b""))
                ours = verified(data)
                if theirs is not None and ours is not None and theirs > ours:
                    raise RollbackError(
                        f"the remote's metadata mirror holds timestamp version {theirs}, "
                        f"above the {ours} signed here: the repository's metadata is "
                        "behind what was mirrored (was a metadata commit not pushed?)",
                        TIMESTAMP,
                    )
            upload.append(name)
    return upload


def mirror(
    folder: MirrorFolder,
    files: Sequence[tuple[str, bytes]],
    verified: Callable[[bytes], int | None],
    state: MirrorState | None = None,
) -> list[str]:
    """Upload what the mirror lacks of ``files``, in their order; returns the names.

    Args:
        folder: the remote's metadata folder.
        files: the signed files in upload order.
        verified: see :func:`plan_mirror`.
        state: what the folder holds, when already read.

    Raises:
        RollbackError: see :func:`plan_mirror`.
        ToolError: the remote cannot be read or written.
    """
    state = state or read_state(folder, files)
    names = plan_mirror(files, state, verified)
    data = dict(files)
    for name in names:
        folder.write(name, data[name])
    return names


class LocalMirror:
    """A mirror in a local folder (the embedded default remote, a mounted share)."""

    def __init__(self, folder: Path) -> None:
        """Mirror into ``folder`` (created on the first write)."""
        self.folder = folder

    def sizes(self) -> dict[str, int]:
        """See :class:`MirrorFolder`."""
        try:
            with os.scandir(self.folder) as entries:
                return {e.name: e.stat().st_size for e in entries if e.is_file()}
        except FileNotFoundError:
            return {}
        except OSError as e:
            raise ToolError(f"cannot list {self.folder}: {e.strerror or e}") from None

    def read(self, name: str, limit: int) -> bytes:
        """See :class:`MirrorFolder`."""
        try:
            with (self.folder / name).open("rb") as fh:
                return fh.read(limit + 1)
        except OSError as e:
            raise ToolError(f"cannot read {self.folder / name}: {e.strerror or e}") from None

    def write(self, name: str, data: bytes) -> None:
        """See :class:`MirrorFolder`."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            # 0644 whatever the umask: remotes are shared (as the targets are).
            write_atomic(self.folder / name, data, mode=0o644)
        except OSError as e:
            raise ToolError(f"cannot write {self.folder / name}: {e.strerror or e}") from None


class FsMirror:
    """A mirror on any remote DVC reaches, through its fsspec file system (S3, ...)."""

    def __init__(self, fs: Any, base: str, shown: str) -> None:
        """Mirror into ``base`` on ``fs``; ``shown`` names the remote in errors."""
        self._fs = fs
        self._base = base
        self._shown = shown

    def _call(self, what: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as e:  # fsspec backends raise anything; report it in one line
            raise ToolError(f"cannot {what} {self._shown}: {e}") from e

    def sizes(self) -> dict[str, int]:
        """See :class:`MirrorFolder`."""

        def listing() -> Any:
            try:
                return self._fs.ls(self._base, detail=True)
            except FileNotFoundError:
                return []  # nothing mirrored yet

        sizes = {}
        listed = self._call("list", listing)
        for entry in listed:
            if entry.get("type") == "file":
                name = str(entry["name"]).rstrip("/").rsplit("/", 1)[-1]
                sizes[name] = int(entry.get("size") or 0)
        return sizes

    def read(self, name: str, limit: int) -> bytes:
        """See :class:`MirrorFolder`."""

        def head() -> bytes:
            with self._fs.open(self._fs.join(self._base, name), "rb") as fh:
                data: bytes = fh.read(limit + 1)
                return data

        data: bytes = self._call("read", head)
        return data

    def write(self, name: str, data: bytes) -> None:
        """See :class:`MirrorFolder`."""
        self._call("upload", self._fs.pipe_file, self._fs.join(self._base, name), data)
