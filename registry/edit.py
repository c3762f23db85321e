"""Round-trip edits of manifest text that keep comments, quoting and indentation.

Functions here take text and return text (no I/O), so every edit is validated before
anything is written.
"""

from __future__ import annotations

import io
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import yaml
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.scalarstring import DoubleQuotedScalarString
from yaml.nodes import ScalarNode

from registry.errors import ManifestError, UsageError
from registry.schema import Signature


def guess_indent(text: str) -> tuple[int, int]:
    """Mapping indent and sequence dash offset used by a block-style YAML text.

    ruamel's own guess reads the first sequence only and mistakes a sequence's content
    column for the mapping indent, so the two are measured separately here.
    """
    indent: int | None = None
    offset: int | None = None
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    for here, nxt in itertools.pairwise(lines):
        if not here.rstrip().endswith(":") or here.lstrip().startswith("- "):
            continue
        depth = len(here) - len(here.lstrip())
        child = len(nxt) - len(nxt.lstrip())
        if child <= depth and not nxt.lstrip().startswith("- "):
            continue
        if nxt.lstrip().startswith("- "):
            offset = child - depth if offset is None else offset
        elif indent is None:
            indent = child - depth
        if indent is not None and offset is not None:
            break
    return indent or 2, max(offset or 0, 0)


def _yaml_for(text: str) -> tuple[YAML, Any]:
    indent, seq_offset = guess_indent(text)
    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.width = 4096  # never re-wrap long descriptions
    yaml.indent(mapping=indent, sequence=seq_offset + 2, offset=seq_offset)
    return yaml, yaml.load(text)


def _dump(yaml: YAML, data: Any) -> str:
    out = io.StringIO()
    yaml.dump(data, out)
    return out.getvalue()


def _spec(data: Any, file: str) -> CommentedMap:
    spec = data.get("spec") if isinstance(data, CommentedMap) else None
    if not isinstance(spec, CommentedMap):
        raise ManifestError.single(file, "has no spec mapping to edit", line=1, col=1)
    return spec


def _number(percent: float) -> int | float:
    return int(percent) if float(percent).is_integer() else percent


def _key(name: str) -> str:
    """``name`` as a mapping key that reads back as the same string.

    YAML 1.1 reads plain ``on``, ``no``, ``yes`` or ``1e3`` as booleans or numbers,
    so such names are written quoted.
    """
    tag = yaml.resolver.Resolver().resolve(ScalarNode, name, (True, False))  # type: ignore[no-untyped-call]
    return name if tag == "tag:yaml.org,2002:str" else DoubleQuotedScalarString(name)


def set_channel(text: str, file: str, channel: str, version: str, percent: float | None) -> str:
    """Point ``spec.channels[channel]`` at ``version``.

    Without ``percent`` the channel serves the version to all of its devices: a
    rollout whose waves end at 100 % stays, at its last wave (its waves and stop
    conditions are the channel's policy for the next promotion), any other rollout is
    removed (and the short form ``channel: version`` is kept when used); with
    ``percent``, ``rollout.percent`` is set, and the rest of the rollout is kept.  A
    ``rollout.hold`` concerns the version it stopped: it is removed when the channel
    moves to another version.

    Args:
        text: the RegisteredModel YAML.
        file: its name for error messages.
        channel: channel name.
        version: version to serve.
        percent: rollout share 0..100, or None for all devices.

    Returns:
        The edited YAML text.

    Raises:
        ManifestError: the text has no spec mapping to edit.
        ValueError: ``percent`` is outside 0..100 or has more than 3 decimals.
    """
    if percent is not None and not (0 <= percent <= 100 and round(percent, 3) == percent):
        raise UsageError(f"rollout percent must be 0..100 with at most 3 decimals, got {percent!r}")
    yaml, data = _yaml_for(text)
    channels = _channels(_spec(data, file))
    current = channels.get(channel)
    channel = _key(channel) if current is None else channel
    if isinstance(current, CommentedMap):
        moved = current.get("version") != version
        current["version"] = version
        rollout = current.get("rollout")
        if percent is None and isinstance(rollout, CommentedMap) and _waves_end_at_all(rollout):
            rollout["percent"] = 100
            if moved:
                rollout.pop("hold", None)
        elif percent is None:
            current.pop("rollout", None)
        elif isinstance(rollout, CommentedMap):
            rollout["percent"] = _number(percent)
            if moved:
                rollout.pop("hold", None)
        else:
            current["rollout"] = CommentedMap(percent=_number(percent))
    elif percent is None:
        channels[channel] = version
    else:
        entry = CommentedMap(version=version)
        rollout = CommentedMap(percent=_number(percent))
        rollout.fa.set_flow_style()
        entry["rollout"] = rollout
        channels[channel] = entry
    return _dump(yaml, data)


def set_rollout(
    text: str,
    file: str,
    channel: str,
    version: str,
    waves: Sequence[tuple[float, str | None]],
    *,
    stop: Mapping[str, float | int] | None = None,
) -> str:
    """Point ``spec.channels[channel]`` at ``version`` in a staged rollout: at the
    first of ``waves`` (percent, soak such as ``"1h"`` or None), with ``stop``
    conditions when given (else the channel's own are kept); a hold goes.

    Raises:
        ManifestError: the text has no spec mapping to edit.
        UsageError: no waves.
    """
    if not waves:
        raise UsageError("a staged rollout needs at least one wave")
    yaml, data = _yaml_for(text)
    channels = _channels(_spec(data, file))
    current = channels.get(channel)
    old = current.get("rollout") if isinstance(current, CommentedMap) else None
    steps = []
    for percent, soak in waves:
        step = CommentedMap(percent=_number(percent))
        if soak is not None:
            step["soak"] = soak
        step.fa.set_flow_style()
        steps.append(step)
    rollout = CommentedMap(percent=_number(waves[0][0]))
    rollout["waves"] = CommentedSeq(steps)
    kept = old.get("stop") if isinstance(old, CommentedMap) else None
    if stop:
        kept = CommentedMap((k, _number(v) if isinstance(v, float) else v) for k, v in stop.items())
        kept.fa.set_flow_style()
    if kept is not None:
        rollout["stop"] = kept
    entry = current if isinstance(current, CommentedMap) else CommentedMap()
    entry["version"] = version
    entry["rollout"] = rollout
    if current is None:
        channels[_key(channel)] = entry
    elif entry is not current:
        channels[channel] = entry
    return _dump(yaml, data)


def set_shadow(text: str, file: str, channel: str, sample: float) -> str:
    """Declare a shadow comparison of ``sample`` on ``spec.channels[channel]`` (its other
    settings kept when it has one; the short form ``channel: version`` becomes a
    mapping).

    Raises:
        ManifestError: the text has no spec mapping to edit.
        UsageError: the channel is not declared, or ``sample`` is not in (0, 1].
    """
    if not 0 < sample <= 1:
        raise UsageError(f"--shadow must be a share above 0 and at most 100%, got {sample:g}")
    yaml, data = _yaml_for(text)
    channels = _channels(_spec(data, file))
    current = channels.get(channel)
    if current is None:
        raise UsageError(f"channel {channel!r} is not declared")
    entry = current if isinstance(current, CommentedMap) else CommentedMap(version=current)
    shadow = entry.get("shadow")
    if not isinstance(shadow, CommentedMap):
        shadow = CommentedMap()
        shadow.fa.set_flow_style()
        entry["shadow"] = shadow
    shadow["sample"] = _number(sample)
    if entry is not current:
        channels[channel] = entry
    return _dump(yaml, data)


def _channels(spec: CommentedMap) -> CommentedMap:
    """``spec.channels``, made when missing (or not a mapping)."""
    channels = spec.get("channels")
    if not isinstance(channels, CommentedMap):
        channels = CommentedMap()
        spec["channels"] = channels
    return channels


def _waves_end_at_all(rollout: CommentedMap) -> bool:
    waves = rollout.get("waves")
    last = waves[-1] if isinstance(waves, list) and waves else None
    return isinstance(last, dict) and last.get("percent") == 100


def set_hold(text: str, file: str, channel: str, reason: str | None) -> str:
    """Put the rollout of ``spec.channels[channel]`` on hold with ``reason`` (last key
    of the rollout), or take the hold away (``reason`` None).

    Raises:
        ManifestError: the text has no spec mapping, or the channel has no rollout
            mapping to edit.
    """
    yaml, data = _yaml_for(text)
    spec = _spec(data, file)
    channels = spec.get("channels")
    entry = channels.get(channel) if isinstance(channels, CommentedMap) else None
    rollout = entry.get("rollout") if isinstance(entry, CommentedMap) else None
    if not isinstance(rollout, CommentedMap):
        raise ManifestError.single(
            file, f"channel {channel!r} has no rollout mapping to hold", line=1, col=1
        )
    if reason is None:
        rollout.pop("hold", None)
    else:
        rollout["hold"] = reason
    return _dump(yaml, data)


def set_signature(text: str, file: str, signature: Signature) -> str:
    """Replace ``spec.signature`` with ``signature`` (shapes in flow style).

    Raises:
        ManifestError: the text has no spec mapping to edit.
    """
    yaml, data = _yaml_for(text)
    spec = _spec(data, file)
    node = signature_node(signature)
    if "signature" in spec or "channels" not in spec:
        spec["signature"] = node
    else:  # keep the house order: the contract before the channels
        spec.insert(list(spec).index("channels"), "signature", node)
    return _dump(yaml, data)


def set_deprecated(text: str, file: str, reason: str) -> str:
    """Set ``spec.deprecated.reason`` of a ModelVersion (the key goes last in spec).

    Raises:
        ManifestError: the text has no spec mapping to edit.
    """
    yaml, data = _yaml_for(text)
    spec = _spec(data, file)
    spec["deprecated"] = CommentedMap(reason=reason)
    return _dump(yaml, data)


def signature_node(signature: Signature) -> CommentedMap:
    """A ruamel node for a signature, one tensor per item, shapes inline."""
    node = CommentedMap()
    for side in ("inputs", "outputs"):
        items = CommentedSeq()
        for tensor in getattr(signature, side):
            shape = CommentedSeq(tensor.shape)
            shape.fa.set_flow_style()
            items.append(CommentedMap(name=tensor.name, dtype=tensor.dtype, shape=shape))
        node[side] = items
    return node
