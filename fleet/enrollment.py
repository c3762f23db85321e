"""Enrolling devices: their public keys in the model repository, one file per device
(stable API).

``modelreg fleet enroll DEVICE --public-key FILE`` writes ``<devices>/<DEVICE>.pub`` and
stages it, as ``promote`` stages its edit: commit it and open a pull request, reviewed
like any other change (``ci pr`` asks the approvals of the strictest policy for it).
``--from FOLDER`` enrolls every ``<device-id>.pub`` of a folder at once (a factory line
collects them: docs/guide/fleet.md); ``fleet revoke DEVICE`` removes the file.  Nothing
is written unless every key given is a valid device key under a valid device id.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from registry.atomic import write_atomic
from registry.config import find_root, load_config
from registry.device_report import DEVICE_ID_RE
from registry.errors import UsageError
from registry.gitinfo import git, stage, toplevel
from registry.safe_io import read_regular
from signing.device_reports import KEY_SUFFIX, MAX_KEY_BYTES, public_key_from_pem
from signing.errors import KeyMaterialError

__all__ = ["EnrollResult", "enroll", "keys_in_folder", "revoke"]

_DEVICE_ID = re.compile(DEVICE_ID_RE)


@dataclass(frozen=True)
class EnrollResult:
    """What an enrollment changed.

    Attributes:
        added: devices enrolled now.
        replaced: devices whose key was replaced (``replace``).
        unchanged: devices already enrolled with the same key.
        files: the key files written (staged).
    """

    added: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)


def _device(device: str) -> str:
    if not _DEVICE_ID.match(device):
        raise UsageError(
            f"{device!r} is not a device id (letters, digits, '.', '_', ':' and '-', "
            "at most 128, as edge.yaml's device.id)"
        )
    return device


def keys_in_folder(folder: Path) -> dict[str, bytes]:
    """Every ``<device-id>.pub`` of ``folder`` (a factory line's collection), by device.

    Raises:
        UsageError: the folder does not exist, or holds no key file.
        KeyMaterialError: a key file cannot be read (a link, too large).
    """
    try:
        names = sorted(e.name for e in os.scandir(folder) if e.name.endswith(KEY_SUFFIX))
    except OSError as e:
        raise UsageError(f"{folder}: cannot list it ({e.strerror or e})") from None
    if not names:
        raise UsageError(f"{folder}: no <device-id>{KEY_SUFFIX} files to enroll")
    found = {}
    for name in names:
        try:
            found[name.removesuffix(KEY_SUFFIX)] = read_regular(
                folder / name, root=folder, max_bytes=MAX_KEY_BYTES
            )
        except (OSError, ValueError) as e:
            raise KeyMaterialError(f"{folder / name}: cannot read it ({e})") from None
    return found


def enroll(start: Path, keys: Mapping[str, bytes], *, replace: bool = False) -> EnrollResult:
    """Enroll each device of ``keys`` (device id -> its public key, PEM).

    Raises:
        UsageError: a device id is not one, or a device is enrolled with another key
            and ``replace`` is not set (nothing is written).
        KeyMaterialError: a key is not an Ed25519 or ECDSA P-256 public key (nothing
            is written).
        RepositoryError: not inside a model repository.
        ToolError: git fails to stage the files.
    """
    root = find_root(start)
    folder = root / load_config(root).devices
    result = EnrollResult()
    writes: list[tuple[Path, bytes]] = []
    for device, pem in sorted(keys.items()):
        _device(device)
        public_key_from_pem(pem, f"the key of {device}")
        path = folder / f"{device}{KEY_SUFFIX}"
        held = path.read_bytes() if path.is_file() else None
        if held is not None and held.strip() == pem.strip():
            result.unchanged.append(device)
            continue
        if held is not None and not replace:
            raise UsageError(
                f"{device} is enrolled with another key ({path}); a device that made a new "
                "key is enrolled again with --replace, after a review of why"
            )
        (result.replaced if held is not None else result.added).append(device)
        writes.append((path, pem.strip() + b"\n"))
    for path, data in writes:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, data)
        result.files.append(path)
    stage(root, result.files)
    return result


def revoke(start: Path, device: str) -> Path:
    """Remove ``device``'s key: its reports no longer count.

    Raises:
        UsageError: the device id is not one, or the device is not enrolled.
        RepositoryError: not inside a model repository.
        ToolError: git fails to stage the removal.
    """
    root = find_root(start)
    path = root / load_config(root).devices / f"{_device(device)}{KEY_SUFFIX}"
    if not path.is_file():
        raise UsageError(f"{device} is not enrolled (no {path})")
    tracked = (
        toplevel(root) is not None
        and not git(root, "ls-files", "--error-unmatch", "--", str(path), check=False).returncode
    )
    if tracked:
        git(root, "rm", "-q", "--", str(path))  # removed and staged
    else:
        path.unlink()
    return path
