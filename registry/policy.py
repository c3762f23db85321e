"""Promotion policy decisions (pure functions, no I/O)."""

from __future__ import annotations

import difflib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from registry.repository import parse_version
from registry.schema import RegisteredModel, is_semver


def unknown_channel(name: str, order: Sequence[str], channel: str) -> str:
    """Why ``channel`` is refused when the promotion order does not list it.

    Mostly a typo: the closest listed name is offered.  A new channel is a change to
    the policy itself, so the way to add one is named too (never ``--force``, which
    would write a channel that validation then refuses).
    """
    close = difflib.get_close_matches(channel, order, n=1)
    hint = f"; did you mean {close[0]!r}? To" if close else "; to"
    return (
        f"channel {channel!r} is not in the promotion order of {name!r} ({', '.join(order)})"
        f"{hint} add a channel, list it in spec.promotion.order of the model"
    )


def served_channels(
    order: Sequence[str], channel: str, served: Mapping[str, Collection[str]], version: str
) -> list[str]:
    """The channels, ``channel`` or a later one in ``order``, that served ``version`` before.

    ``served`` maps a channel to every version it ever pointed at (from the git history
    of the model's ``model.yaml``, see ``registry.history.served_versions``).  A
    channel going back to such a version is a rollback: it was reviewed for this
    channel once, so the promotion order does not ask for the earlier steps again.
    """
    later = list(order[order.index(channel) :]) if channel in order else [channel]
    return [c for c in later if version in served.get(c, ())]


def promotion_violations(
    model: RegisteredModel,
    declared: Collection[str],
    version: str,
    channel: str,
    *,
    served: Mapping[str, Collection[str]] | None = None,
    deprecated: Mapping[str, str] | None = None,
    previous: str | None = None,
) -> list[str]:
    """Why promoting ``version`` to ``channel`` breaks the model's policy (empty if it doesn't).

    Rules: the version must be declared and not deprecated; when
    ``spec.promotion.order`` is set, the channel must be listed there, and a version
    may enter a channel only if it already serves the channel just before it in the
    order, or this channel or a later one, or, going back (below ``previous``, what
    the channel serves now), served this channel or a later one before (a rollback,
    see :func:`served_channels`).  Going forward always follows the order: a version
    pulled back from a channel has to pass the channels before it again.

    Args:
        model: the RegisteredModel.
        declared: versions declared for it.
        version: version to promote.
        channel: target channel.
        served: channel -> versions it served before (empty: no history known).
        deprecated: deprecated version -> the reason.
        previous: the version the channel serves now (None: a new channel).

    Returns:
        Human-readable reasons, one per violated rule.
    """
    reasons: list[str] = []
    name = model.metadata.name
    if version not in declared:
        listed = ", ".join(sorted(declared)) or "none"
        reasons.append(f"version {version} is not declared for model {name!r} (declared: {listed})")
    why = (deprecated or {}).get(version)
    if why is not None:
        reasons.append(
            f"version {version} of {name!r} is deprecated ({why}); it cannot be promoted"
        )
    order = model.spec.promotion.order
    if not order:
        return reasons
    if channel not in order:
        reasons.append(unknown_channel(name, order, channel))
        return reasons
    index = order.index(channel)
    if index == 0:
        return reasons
    serving = {c for c, a in model.spec.channels.items() if a.version == version}
    if serving & {order[index - 1], *order[index:]}:
        return reasons
    # An undeclared name that is not SemVer has no place in the order (its own reason
    # above says so); it is never "going back".
    back = (
        previous is not None
        and is_semver(version)
        and is_semver(previous)
        and parse_version(version) < parse_version(previous)
    )
    if back and served_channels(order, channel, served or {}, version):
        return reasons
    before = order[index - 1]
    reasons.append(
        f"version {version} must be promoted to {before!r} before {channel!r} "
        f"(promotion order: {', '.join(order)})"
    )
    return reasons


@dataclass(frozen=True, slots=True)
class ChannelMove:
    """One channel of one model pointed at another version (for a reviewer).

    Attributes:
        kind: ``rollback`` when the new version ranks below the old one, else
            ``promotion`` (a new channel included).
        previous: what the channel served before (None: a new channel).
        served_before: for a rollback, the channels (this one or later in the order)
            that served the version before: why the policy lets it skip the order.
    """

    model: str
    channel: str
    previous: str | None
    version: str
    kind: Literal["promotion", "rollback"]
    served_before: tuple[str, ...] = ()

    def text(self) -> str:
        """``mlp production: 1.2.0 -> 1.1.0 (rollback; it served production before)``."""
        line = f"{self.model} {self.channel}: {self.previous or '-'} -> {self.version}"
        if self.kind == "promotion":
            return line
        if self.served_before:
            return f"{line} (rollback; it served {', '.join(self.served_before)} before)"
        return f"{line} (rollback)"


def channel_move(
    model: RegisteredModel,
    channel: str,
    previous: str | None,
    version: str,
    served: Mapping[str, Collection[str]],
) -> ChannelMove:
    """Classify the change of ``channel`` from ``previous`` to ``version`` (pure)."""
    name = model.metadata.name
    if previous is None or parse_version(version) >= parse_version(previous):
        return ChannelMove(name, channel, previous, version, "promotion")
    order = model.spec.promotion.order
    before = served_channels(order, channel, served, version) if order else []
    if not order and version in served.get(channel, ()):
        before = [channel]
    return ChannelMove(name, channel, previous, version, "rollback", tuple(before))
