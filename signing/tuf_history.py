"""Released history: which verified metadata state may follow which (no I/O).

Stable API.  ``signing.tuf_repo`` calls these on load (:func:`check_versioned_files`)
and for CI's comparisons with a reference state: the base branch's metadata
(:func:`check_follows`) and the highest versions its history held (:func:`check_floor`).
Released roots, role versions and targets are never reset, replaced or rewound: a
release that started again at version 1 would sign numbers devices already hold with
other content, and stop every one of them with a RollbackError.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass
from typing import Final

from tuf.api.metadata import TargetFile, Targets

from registry.errors import UsageError
from signing.errors import FileSetError, HistoryError, RollbackError, VerificationError
from signing.tuf_facts import CHANNELS_PATH, TargetFacts
from signing.tuf_roles import ONLINE_ROLES, RECOVER, RESTORE, Online

VERSIONED_ROLES: Final = ("snapshot", "targets")
"""Online roles stored as ``N.<role>.json``; the timestamp chain names the current one."""
_SHOWN: Final = 3  # file names quoted in an error: enough to recognize the set


def check_versioned_files(
    present: Mapping[str, Set[int]], listed: Mapping[str, int] | None, where: str
) -> None:
    """Check the ``N.<role>.json`` files on disk against the versions the timestamp chain lists.

    ``present`` maps ``snapshot`` and ``targets`` to the versions found on disk;
    ``listed`` maps them to the versions the timestamp (and its snapshot) point to,
    or is None when there is no ``timestamp.json``.  A release writes the versioned
    files first and ``timestamp.json`` last, and never deletes one, so versioned files
    without a timestamp mean a deleted timestamp, and a file above the listed version
    a rewound one (or a release or rotation that stopped half-way).  Either would let
    the next release start again at a version devices already hold.

    Raises:
        FileSetError: versioned files exist but ``timestamp.json`` does not.
        RollbackError: a versioned file is above the version the timestamp chain lists.
    """
    if listed is None:
        found = [
            f"{v}.{role}.json" for role in VERSIONED_ROLES for v in sorted(present.get(role, ()))
        ]
        if found:
            shown = ", ".join(found[:_SHOWN]) + (", ..." if len(found) > _SHOWN else "")
            raise FileSetError(
                f"timestamp.json is missing but released metadata exists ({shown}): the "
                f"release history would start again at version 1; {RESTORE}",
                where,
            )
        return
    for role in VERSIONED_ROLES:
        above = sorted(v for v in present.get(role, ()) if v > listed[role])
        if above:
            raise RollbackError(
                f"{above[-1]}.{role}.json is above {role} version {listed[role]} that "
                f"timestamp.json points to: the timestamp was rewound, or a release or key "
                f"rotation stopped before writing it; {RECOVER}",
                where,
            )


@dataclass(frozen=True)
class TrustState:
    """A repository's verified metadata, as the history checks compare it.

    Attributes:
        roots: the bytes of ``1.root.json`` .. ``N.root.json`` as stored.
        online: the current metadata of each published online role.
    """

    roots: tuple[bytes, ...]
    online: Mapping[str, Online]

    def version(self, role: str) -> int:
        """Current version of ``role`` (0 when it was never published).

        Raises:
            ValueError: ``role`` is not a top-level role.
        """
        if role == "root":
            return len(self.roots)
        if role not in ONLINE_ROLES:
            raise UsageError(f"unknown role {role!r}")
        md = self.online.get(role)
        return md.signed.version if md is not None else 0

    def targets(self) -> Mapping[str, TargetFile]:
        """The signed targets (empty when nothing is published)."""
        md = self.online.get("targets")
        return md.signed.targets if md is not None and isinstance(md.signed, Targets) else {}


def check_follows(state: TrustState, base: TrustState) -> None:
    """Check that ``state`` continues ``base``'s released history.

    ``base`` is a state already released (the base branch's metadata): ``state`` must
    hold base's roots byte for byte, no role version below base's, the same content
    for a role at the same version, and every target base released, unchanged.  The
    channels document may change, but its sequence never goes back.

    Raises:
        RollbackError: a root or role version, or the channels sequence, is below base's.
        HistoryError: a root, a role version or a released target differs from base's,
            or a released target is missing.
    """
    for number, released_root in enumerate(base.roots, start=1):
        name = f"{number}.root.json"
        if number > len(state.roots):
            raise RollbackError(
                f"root version {len(state.roots)} is below the base's {len(base.roots)}", name
            )
        if state.roots[number - 1] != released_root:
            raise HistoryError(
                f"differs from the base's root version {number} (released roots are never "
                "replaced)",
                name,
            )
    for role in ONLINE_ROLES:
        mine, theirs = state.version(role), base.version(role)
        if mine < theirs:
            raise RollbackError(f"version {mine} is below the base's {theirs}", role)
        if (
            mine == theirs
            and mine
            and state.online[role].signed_bytes != (base.online[role].signed_bytes)
        ):
            raise HistoryError(
                f"version {mine} differs from the base's version {theirs} (a version is "
                "signed once)",
                role,
            )
    mine_v, theirs_v = state.version("targets"), base.version("targets")
    current = state.targets()
    for path, released in base.targets().items():
        info = current.get(path)
        if info is None:
            raise HistoryError(
                f"released in targets version {theirs_v} of the base, missing from version "
                f"{mine_v}",
                path,
            )
        if path == CHANNELS_PATH:
            _check_channels_follow(info, released, mine_v, theirs_v)
        elif info != released:
            raise HistoryError(
                f"differs from the file released in targets version {theirs_v} of the base "
                f"(targets version {mine_v}); released files are immutable",
                path,
            )


def _sequence(info: TargetFile) -> int:
    try:
        return TargetFacts.from_custom(info.custom).sequence or 0
    except ValueError as e:
        raise VerificationError(f"no channels facts ({e})", CHANNELS_PATH) from None


def _check_channels_follow(
    info: TargetFile, released: TargetFile, mine_v: int, theirs_v: int
) -> None:
    mine, theirs = _sequence(info), _sequence(released)
    if mine < theirs or (mine == theirs and info != released):
        raise RollbackError(
            f"sequence {mine} (targets version {mine_v}) does not follow the base's "
            f"{theirs} (targets version {theirs_v})",
            CHANNELS_PATH,
        )


def check_floor(state: TrustState, floor: Mapping[str, int]) -> None:
    """Check that no role is below the version ``floor`` gives for it.

    ``floor`` holds, per role, the highest version known to have existed (in git
    history, on the remote): a state below it was rewound, and its next release would
    sign a version number devices may already hold with other content.  A state that
    passes is at or above the floor, so its next release writes floor + 1 or more.

    Raises:
        RollbackError: a role's version is below its floor.
        ValueError: ``floor`` names an unknown role or a negative version.
    """
    for role, minimum in sorted(floor.items()):
        if minimum < 0:
            raise UsageError(f"floor of {role}: {minimum} is negative")
        version = state.version(role)
        if version < minimum:
            raise RollbackError(
                f"version {version} is below {minimum}, a version that was released before: "
                f"the metadata was rewound; {RESTORE}",
                role,
            )
