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
finds every file it names.  Versioned files are uploaded once (their names change with
their content); ``timestamp.json`` only when its bytes differ, so that an idle device's
conditional request (ETag, ``If-Modified-Since``, a file's mtime) stays "not modified".

:func:`plan_mirror` decides, with no I/O; :class:`MirrorFolder` implementations read
and write the remote.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
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


def _signed_version(data: bytes) -> int | None:
    """The version a timestamp file claims (unverified: only compared), or None."""
    try:
        version = json.loads(data)["signed"]["version"]
    except (ValueError, KeyError, TypeError):
        return None
    return version if isinstance(version, int) and not isinstance(version, bool) else None


def plan_mirror(
    files: Sequence[tuple[str, bytes]],
    present: Mapping[str, int],
    remote_timestamp: bytes | None,
) -> list[str]:
    """What to upload, in upload order, to make the mirror hold ``files``.

    Args:
        files: the signed files in upload order (``TrustRepo.mirror_files``).
        present: name -> size of what the remote holds.
        remote_timestamp: the remote's ``timestamp.json``, when it has one (ours is
            uploaded only when the bytes differ).

    Raises:
        RollbackError: the remote holds a timestamp of a higher version than ours:
            the repository's metadata is behind what was mirrored (a release whose
            metadata commit was never pushed); uploading would roll devices back.
    """
    upload = []
    for name, data in files:
        if name != TIMESTAMP:
            # A versioned name is signed once: the same name is the same bytes, unless
            # a copy was cut short or replaced, which its size mostly tells.
            if present.get(name) != len(data):
                upload.append(name)
            continue
        if name not in present:
            upload.append(name)
            continue
        if remote_timestamp == data:
            continue
        ours = _signed_version(data)
        theirs = _signed_version(remote_timestamp or b"")
        if ours is not None and theirs is not None and theirs > ours:
            raise RollbackError(
                f"the remote's metadata mirror holds timestamp version {theirs}, above the "
                f"{ours} signed here: the repository's metadata is behind what was mirrored "
                "(was a release's metadata commit not pushed?)",
                TIMESTAMP,
            )
        upload.append(name)
    return upload


def mirror(folder: MirrorFolder, files: Sequence[tuple[str, bytes]]) -> list[str]:
    """Upload what the remote lacks of ``files``, in their order; returns the names.

    Raises:
        RollbackError: see :func:`plan_mirror`.
        ToolError: the remote cannot be read or written.
    """
    present = folder.sizes()
    data = dict(files)
    remote_timestamp = None
    if TIMESTAMP in data and TIMESTAMP in present:
        remote_timestamp = folder.read(TIMESTAMP, _MAX_TIMESTAMP_BYTES)
    names = plan_mirror(files, present, remote_timestamp)
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
