"""What each channel serves, as the model repository declares it (stable API): the
targets ``fleet status`` measures each rollout against."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from fleet.summary import ChannelTarget
from registry.inspect import channels_of
from registry.repository import load_repository

__all__ = ["declared_channels"]


def declared_channels(
    start: Path, models: Collection[str] | None = None
) -> tuple[Path, dict[str, dict[str, ChannelTarget]]]:
    """The repository around ``start`` and, per model, per channel, its target.

    Args:
        start: the repository root or a folder inside it.
        models: read only these models (those the devices report); None reads all.

    Returns:
        The repository root, and the channels of every model that loaded.

    Raises:
        RepositoryError: no ``modelreg.yaml`` at or above ``start``.
        ManifestError: ``modelreg.yaml`` itself is invalid.
    """
    repo = load_repository(start, models=models)
    channels = {
        name: {
            channel: ChannelTarget(declared["version"], declared["percent"], declared["hold"])
            for channel, declared in channels_of(entry).items()
        }
        for name, entry in sorted(repo.models.items())
    }
    return repo.root, channels
