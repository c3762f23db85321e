"""Render text in the house style: new manifests as YAML, untrusted values as markdown.

Markdown: every value that comes from a model file, a manifest or a pull request
(producer names, doc strings, graph, tensor, node and metric names, opset domains,
versions, refs, tool messages) is data, not markup.  Before it is interpolated into a
PR comment, a job summary or a report it goes through exactly one of

- :func:`md_text`: inline text, every character that could start markup escaped;
- :func:`md_code`: an inline code span with a backtick-safe fence;
- :func:`md_code_block`: a fenced block that the content cannot close;

so that a model cannot write headings, tables, links, images, HTML, math, mentions or
a fake approval into what reviewers read.  All three give one line (blocks: the lines
given), without control or invisible formatting characters (bidi overrides could
reorder what a reviewer sees), and cut values longer than ``MarkdownLimits.value_chars``.
"""

from __future__ import annotations

import io
import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap

from registry.edit import signature_node
from registry.jsonschema import schema_comment
from registry.schema import API_VERSION, Signature


def _dump(data: CommentedMap) -> str:
    yaml = YAML(typ="rt")
    yaml.width = 4096
    yaml.indent(mapping=2, sequence=4, offset=2)
    out = io.StringIO()
    yaml.dump(data, out)
    return out.getvalue()


def _drop_empty(node: CommentedMap) -> CommentedMap:
    for key in [k for k, v in node.items() if v in (None, "", [], {})]:
        del node[key]
    return node


def render_model(
    path: Path,
    root: Path,
    name: str,
    *,
    owner: str = "",
    task: str = "",
    description: str = "",
    labels: Mapping[str, str] | None = None,
    signature: Signature | None = None,
    targets: Sequence[str] = (),
    order: Sequence[str] = (),
) -> str:
    """Text of a new ``RegisteredModel`` manifest to be written at ``path``."""
    spec = _drop_empty(
        CommentedMap(
            description=description,
            owner=owner,
            task=task,
            signature=signature_node(signature) if signature else None,
            channels=CommentedMap(),
            targets=list(targets),
        )
    )
    spec["channels"] = CommentedMap()
    if order:
        spec["promotion"] = CommentedMap(order=list(order))
    doc = CommentedMap(
        apiVersion=API_VERSION,
        kind="RegisteredModel",
        metadata=_drop_empty(CommentedMap(name=name, labels=dict(labels or {}))),
        spec=spec,
    )
    return schema_comment(path, root, "RegisteredModel") + _dump(doc)


def render_version(
    path: Path,
    root: Path,
    name: str,
    version: str,
    *,
    artifact: str,
    parent: str | None = None,
    description: str = "",
    signature: Signature | None = None,
    source: Mapping[str, Any] | None = None,
    metrics: Mapping[str, float] | None = None,
    goldens: Mapping[str, Any] | None = None,
    targets: Sequence[Mapping[str, Any]] = (),
    signature_change: str | None = None,
    external_data: Sequence[str] = (),
) -> str:
    """Text of a new ``ModelVersion`` manifest to be written at ``path``."""
    artifact_node = CommentedMap(path=artifact, format="onnx")
    if external_data:  # a self-contained model's manifest stays as it always was
        artifact_node["external_data"] = list(external_data)
    spec = _drop_empty(
        CommentedMap(
            artifact=artifact_node,
            parent=parent,
            description=description,
            signature=signature_node(signature) if signature else None,
            signature_change=signature_change,
            source=_drop_empty(CommentedMap(source or {})),
            metrics=dict(metrics or {}),
            goldens=goldens,
            targets=[CommentedMap(t) for t in targets],
        )
    )
    doc = CommentedMap(
        apiVersion=API_VERSION,
        kind="ModelVersion",
        metadata=CommentedMap(name=name, version=version),
        spec=spec,
    )
    return schema_comment(path, root, "ModelVersion") + _dump(doc)


# --- markdown --------------------------------------------------------------------------


@dataclass(frozen=True)
class MarkdownLimits:
    """Caps on untrusted values in markdown (GitHub refuses comments over 64 KiB).

    Attributes:
        value_chars: characters of one value before it is cut with an ellipsis.
        comment_chars: characters of a whole comment (GitHub refuses one over 65,536,
            and the review would then get none).
    """

    value_chars: int = 200
    comment_chars: int = 65_000


MARKDOWN_LIMITS: Final = MarkdownLimits()

# Every ASCII character that can open or close inline markup, an entity, an HTML tag,
# a table cell, math ($...$, which GitHub renders), or (at a line start) a heading.
_MD_SPECIAL: Final = re.compile(r"([\\`*_\[\]<>|~#!&$])")
# Should the value ever start a line: a list item, a thematic break ("---") or a
# setext underline; an ordered-list marker only when a space follows ("1.0.0" is none).
_MD_LINE_START: Final = re.compile(r"^(?:([-+=])|(\d{1,9})([.)])(?= |$))")
# Autolinks that need no markup at all (GFM's extended autolinks): break them with an
# escape, which renders as the same character.
_MD_AUTOLINK: Final = re.compile(r"(://|\bwww\.)", re.IGNORECASE)
# A zero-width space after "@" keeps "@someone" from notifying (and looking like) a user.
_MD_MENTION: Final = "@&#8203;"
# An emoji shortcode (":white_check_mark:" renders as a check mark): its first colon
# escaped, so it shows as typed.
_MD_SHORTCODE: Final = re.compile(r":(?=(?:[A-Za-z0-9+\-]|\\_)+:)")  # "_" is escaped by then
_FENCE: Final = re.compile(r"^(`{3,}|~{3,})")


def _printable(value: str) -> str:
    # Control and format characters (bidi overrides, zero-width joiners) are dropped:
    # they can hide or reorder what a reviewer reads.  Whitespace is the caller's.
    return "".join(
        ch
        for ch in value
        if ch.isspace() or unicodedata.category(ch) not in ("Cc", "Cf", "Cs", "Co", "Cn")
    )


def _visible(value: str, limits: MarkdownLimits) -> str:
    # One line: a newline in a value would end the table row or start a block.
    text = " ".join(_printable(value).split())
    if len(text) > limits.value_chars:
        text = text[: limits.value_chars - 1].rstrip() + "…"
    return text


def md_text(value: str, *, limits: MarkdownLimits = MARKDOWN_LIMITS) -> str:
    """``value`` as inline markdown text that renders as exactly these characters.

    Use it for every untrusted value written as text (a table cell, a sentence); names
    that read better as code go through :func:`md_code` instead.

    Args:
        value: any string from a model, a manifest or a tool.
        limits: the length cap.

    Returns:
        One line, markup characters backslash-escaped, mentions and bare links broken.
    """
    text = _MD_SPECIAL.sub(r"\\\1", _visible(value, limits))
    text = _MD_LINE_START.sub(
        lambda m: "\\" + m.group(1) if m.group(1) else f"{m.group(2)}\\{m.group(3)}", text
    )
    text = _MD_AUTOLINK.sub(lambda m: m.group(1).replace("/", "\\/").replace(".", "\\."), text)
    text = _MD_SHORTCODE.sub(r"\\:", text)
    return text.replace("@", _MD_MENTION)


def md_code(value: str, *, limits: MarkdownLimits = MARKDOWN_LIMITS) -> str:
    """``value`` as an inline code span that no character of it can end or leave.

    The fence is one backtick longer than the longest backtick run inside; ``|`` is
    escaped because GFM splits table cells before it finds code spans.

    Args:
        value: any string from a model, a manifest or a tool.
        limits: the length cap.

    Returns:
        One code span on one line.
    """
    text = _visible(value, limits).replace("|", "\\|")
    if not text:
        return "` `"  # an empty span is no span: two backticks could pair with later ones
    runs = [len(r) for r in re.findall(r"`+", text)]
    if not runs:
        return f"`{text}`"
    fence = "`" * (max(runs) + 1)
    return f"{fence} {text} {fence}"


def md_code_block(text: str, *, info: str = "") -> str:
    """``text`` as a fenced code block that no line of it can close.

    Args:
        text: lines of untrusted text (problems, tool output).
        info: the info string (language), trusted.

    Returns:
        The block, from the opening fence to the closing one, without a final newline.
    """
    body = "\n".join(line.rstrip() for line in _printable(text).splitlines())
    runs = [len(r) for r in re.findall(r"`+", body)]
    fence = "`" * max(3, max(runs, default=0) + 1)
    return f"{fence}{info}\n{body}\n{fence}"


def md_cut(text: str, note: str, *, limits: MarkdownLimits = MARKDOWN_LIMITS) -> str:
    """``text`` cut at a line so that, with ``note`` added, it has at most
    ``limits.comment_chars`` characters; a code block left open is closed first.

    Args:
        text: a whole markdown document (a comment).
        note: trusted markdown said where it was cut (where to read the rest).
        limits: the length cap.

    Returns:
        ``text`` itself when it fits, else its head and ``note``.
    """
    if len(text) <= limits.comment_chars:
        return text
    budget = limits.comment_chars - len(note) - 16  # room for a closing fence
    kept: list[str] = []
    size = 0
    fence = ""
    for line in text.splitlines():
        if size + len(line) + 1 > budget:
            break
        kept.append(line)
        size += len(line) + 1
        opened = _FENCE.match(line)
        if opened and not fence:
            fence = opened.group(1)
        elif fence and line.strip() == fence:  # only its own fence closes a block
            fence = ""
    if fence:
        kept.append(fence)
    return "\n".join([*kept, "", note]) + "\n"
