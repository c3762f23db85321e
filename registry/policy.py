"""Promotion policy decisions (pure functions, no I/O)."""

from __future__ import annotations

import difflib
from collections.abc import Collection, Sequence

from registry.schema import RegisteredModel


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


def promotion_violations(
    model: RegisteredModel, declared: Collection[str], version: str, channel: str
) -> list[str]:
    """Why promoting ``version`` to ``channel`` breaks the model's policy (empty if it doesn't).

    Rules: the version must be declared; when ``spec.promotion.order`` is set, the
    channel must be listed there, and a version may enter a channel only if it already
    serves the channel just before it in the order, or this channel or a later one.

    Args:
        model: the RegisteredModel.
        declared: versions declared for it.
        version: version to promote.
        channel: target channel.

    Returns:
        Human-readable reasons, one per violated rule.
    """
    reasons: list[str] = []
    name = model.metadata.name
    if version not in declared:
        listed = ", ".join(sorted(declared)) or "none"
        reasons.append(f"version {version} is not declared for model {name!r} (declared: {listed})")
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
    if not serving & {order[index - 1], *order[index:]}:
        before = order[index - 1]
        reasons.append(
            f"version {version} must be promoted to {before!r} before {channel!r} "
            f"(promotion order: {', '.join(order)})"
        )
    return reasons
