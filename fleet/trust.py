"""Which device reports the fleet counts: signed by an enrolled device, newer than the
last one seen from it (stable API).

The decision is :func:`signing.device_reports.standing`; this module holds what it is
asked against: the repository's enrolled keys (``<devices>/<device-id>.pub``, read by
:func:`signing.device_reports.read_enrolled`) and the newest report counted from each
device, kept in the repository's local state (``.modelreg/fleet/seen.json``) from one
run of ``fleet status`` / ``fleet devices`` / ``fleet advance`` to the next (rollout.yml
keeps it in an Actions cache of the main branch between its scheduled runs).  Where
that file is lost, a replay is still bounded by staleness: an old report is stale, and
stale devices move no wave.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final

from registry.atomic import write_atomic
from registry.config import RepoConfig
from signing.device_reports import Enrolled, Seen, read_enrolled, standing, verify_report
from signing.errors import SignatureError, VerificationError

if TYPE_CHECKING:
    from fleet.reports import Entry

__all__ = ["SEEN_FILE", "ReportTrust", "repository_trust"]

SEEN_FILE: Final = ".modelreg/fleet/seen.json"
"""Where the newest counted report of each device is remembered (repository-local)."""
_MAX_SEEN_BYTES: Final = 256 << 20


@dataclass
class ReportTrust:
    """The enrolled devices, and the newest report counted from each.

    Attributes:
        enrolled: the repository's enrolled device keys (and the key files refused).
        seen: device -> the newest report counted from it.
        path: where ``seen`` is kept (None: not kept between runs).
    """

    enrolled: Enrolled
    seen: dict[str, Seen] = field(default_factory=dict)
    path: Path | None = None
    _changed: bool = False

    @classmethod
    def of_repository(cls, root: Path, config: RepoConfig) -> ReportTrust | None:
        """The trust of the repository at ``root``; None when it enrolls no device (no
        devices folder: reports are not authenticated).

        Raises:
            OSError: the devices folder cannot be read.
        """
        try:
            enrolled = read_enrolled(root / config.devices)
        except FileNotFoundError:
            return None
        path = root / SEEN_FILE
        return cls(enrolled, _read_seen(path), path)

    def judge(self, entry: Entry) -> str | None:
        """Why ``entry`` does not count, or None (and it is remembered as seen)."""
        report = entry.report
        key = self.enrolled.keys.get(report.device)
        verified = False
        if entry.envelope is not None and key is not None:
            try:
                verify_report(entry.envelope, key, report.device)
                verified = True
            except (SignatureError, VerificationError):
                verified = False
        reason = standing(
            device=report.device,
            signed=entry.envelope is not None,
            enrolled=key is not None,
            verified=verified,
            sequence=report.sequence,
            digest=entry.digest,
            seen=self.seen.get(report.device),
        )
        if reason is None and report.sequence is not None:
            mark = Seen(report.sequence, entry.digest)
            if self.seen.get(report.device) != mark:
                self.seen[report.device] = mark
                self._changed = True
        return reason

    def save(self) -> None:
        """Keep what was seen for the next run (best effort: a read-only checkout keeps
        nothing, and says nothing)."""
        if self.path is None or not self._changed:
            return
        data = {d: [s.sequence, s.digest] for d, s in sorted(self.seen.items())}
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, (json.dumps(data, separators=(",", ":")) + "\n").encode())
        self._changed = False


def _read_seen(path: Path) -> dict[str, Seen]:
    """What was seen (nothing when the file is missing or not ours: it is local state,
    and a lost one only forgets)."""
    try:
        with path.open("rb") as fh:
            raw = json.loads(fh.read(_MAX_SEEN_BYTES))
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(raw, dict):
        return {}
    seen: dict[str, Seen] = {}
    for device, mark in raw.items():
        if (
            isinstance(mark, list)
            and len(mark) == 2
            and type(mark[0]) is int
            and isinstance(mark[1], str)
        ):
            seen[str(device)] = Seen(mark[0], mark[1])
    return seen


def repository_trust(start: Path, *, required: bool) -> tuple[Path | None, ReportTrust | None]:
    """The model repository around ``start`` and the trust of its reports (None when it
    enrolls no device).

    Args:
        start: a folder inside the repository.
        required: raise when there is no repository (else: no root, no trust).

    Raises:
        RepositoryError: no repository at or above ``start`` while ``required``.
        ManifestError: its ``modelreg.yaml`` is invalid.
        OSError: its devices folder cannot be read.
    """
    from registry.config import find_root, load_config
    from registry.errors import RepositoryError

    try:
        root = find_root(start)
    except RepositoryError:
        if required:
            raise
        return None, None
    return root, ReportTrust.of_repository(root, load_config(root))
