"""Caps on what a device accepts from its untrusted transports (stable API).

Re-exported by ``edge_sync.sync.trust``; a frozen value object, so a daemon can pass one
around and tests can shrink every cap at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tuf.ngclient.config import UpdaterConfig

from registry.errors import UsageError

__all__ = [
    "TrustLimits",
]


@dataclass(frozen=True)
class TrustLimits:
    """Caps on untrusted input, in bytes unless named otherwise.

    Metadata whose length is signed (snapshot and targets, listed with length and hash)
    is capped by that length; these caps apply where nothing signed says how long a
    file is (root, timestamp) and to the channels document, which is read into memory.

    Time is capped per file downloaded (each metadata file, each target), counted from
    the request, so that a remote cannot hold the device forever (slow retrieval):

    Attributes:
        read_timeout_s: longest wait for a connection or for any data at all
            (python-tuf's own default).
        min_bytes_per_s: lowest average rate since the request, judged once
            ``rate_grace_s`` has passed; 0 judges no rate.  A trickle of one byte
            every 5 s is cut off at the end of the grace period.
        rate_grace_s: time allowed for connecting and a slow start.
        download_deadline_s: longest any one file may take, however fast it flows
            (an engine of 300 MB needs about 85 kB/s to make it).
        git_store_max_bytes: most bytes the git checkout's ``.git`` may hold, during
            a fetch and after it.  A device keeps one commit and prunes the rest, and
            asks for no blob outside ``trust/metadata``; a host that sends them anyway
            (the blob filter is honoured only if the server wants) fails the sync
            with this reason instead of filling the disk.
    """

    root_max_length: int = 512_000
    timestamp_max_length: int = 16_384
    snapshot_max_length: int = 2_000_000
    targets_max_length: int = 5_000_000
    channels_max_length: int = 1_000_000
    max_root_rotations: int = 256
    chunk_size: int = 1 << 20
    read_timeout_s: float = 30.0
    min_bytes_per_s: int = 1024
    rate_grace_s: float = 10.0
    download_deadline_s: float = 3600.0
    git_store_max_bytes: int = 256 << 20

    def __post_init__(self) -> None:
        """Refuse limits that cannot work.

        Raises:
            ValueError: a time limit that is not positive, a negative rate or grace, a
                cap below 1.
        """
        for name in ("read_timeout_s", "download_deadline_s"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise UsageError(f"TrustLimits.{name} must be a positive number, got {value!r}")
        if not self.min_bytes_per_s >= 0 or not self.rate_grace_s >= 0:
            raise UsageError("TrustLimits.min_bytes_per_s and rate_grace_s must be >= 0")
        if self.git_store_max_bytes < 1:
            raise UsageError(
                f"TrustLimits.git_store_max_bytes must be >= 1, got {self.git_store_max_bytes}"
            )
        if self.chunk_size < 1:
            raise UsageError(f"TrustLimits.chunk_size must be >= 1, got {self.chunk_size}")

    def updater_config(self) -> UpdaterConfig:
        """python-tuf's configuration with these caps."""
        return UpdaterConfig(
            max_root_rotations=self.max_root_rotations,
            root_max_length=self.root_max_length,
            timestamp_max_length=self.timestamp_max_length,
            snapshot_max_length=self.snapshot_max_length,
            targets_max_length=self.targets_max_length,
        )
