"""Strict YAML loading that remembers where every key and value came from.

Manifests are small, hand-written files, so this loader is deliberately narrower than
YAML: one document, string keys, no duplicate keys, no anchors or aliases (which also
rules out "billion laughs" expansion), no custom tags, bounded size, depth and node
count.  Parsing is done by libyaml (PyYAML's C binding) when available, which keeps a
10,000-file repository well under a second of parse time.

Stable API: ``Limits``, ``YamlDocument``, ``parse_yaml``, ``read_yaml``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from registry.errors import ManifestError

Loc = tuple[str | int, ...]
"""Path of a value inside a document: mapping keys and sequence indices."""

try:  # libyaml is an optional build of PyYAML; the pure-Python parser is a fallback.
    _Loader: type[yaml.CSafeLoader | yaml.SafeLoader] = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - depends on how PyYAML was built
    _Loader = yaml.SafeLoader


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds on untrusted YAML input.

    Attributes:
        max_bytes: largest file accepted, checked before reading it.
        max_depth: deepest nesting of mappings and sequences.
        max_nodes: most scalars, mappings and sequences in one document.
    """

    max_bytes: int = 1 << 20
    max_depth: int = 32
    max_nodes: int = 50_000


DEFAULT_LIMITS: Final = Limits()

# Event-level scanning costs a second parse, so it only runs when a file could hold
# what the node-level pass can't see safely (anchors, very deep flow nesting).
_SCAN_IF_BRACKETS_OVER: Final = 256
_SCAN_IF_BYTES_OVER: Final = 64 * 1024

_TAG = "tag:yaml.org,2002:"
_ctor = SafeConstructor()
_SCALARS: Final[dict[str, Callable[[Node], Any]]] = {
    _TAG + "str": lambda n: n.value,
    _TAG + "int": _ctor.construct_yaml_int,  # type: ignore[dict-item]
    _TAG + "float": _ctor.construct_yaml_float,  # type: ignore[dict-item]
    _TAG + "bool": _ctor.construct_yaml_bool,  # type: ignore[dict-item]
    _TAG + "null": lambda n: None,
    # Dates stay the text the author wrote: no field of ours is a date, and turning
    # `trained: 2024-05-01` into a datetime would only produce a confusing type error.
    _TAG + "timestamp": lambda n: n.value,
}


@dataclass(frozen=True)
class YamlDocument:
    """A parsed document plus the position of every key and value.

    Attributes:
        file: the name used in error messages (usually a repository-relative path).
        data: plain Python data (dict, list, str, int, float, bool, None).
        key_marks: 1-based (line, col) of each mapping key, by location.
        value_marks: 1-based (line, col) of each value, by location.
        scalar_text: source text of every non-string scalar, to suggest quoting.
    """

    file: str
    data: Any
    key_marks: dict[Loc, tuple[int, int]] = field(repr=False)
    value_marks: dict[Loc, tuple[int, int]] = field(repr=False)
    scalar_text: dict[Loc, str] = field(repr=False)

    def position(self, loc: Loc, *, key: bool = False) -> tuple[int, int]:
        """Best position for ``loc``: itself, else its closest ancestor that exists.

        Args:
            loc: location inside the document.
            key: prefer the key's position over the value's (for "unknown key").
        """
        for end in range(len(loc), -1, -1):
            prefix = loc[:end]
            if key and prefix in self.key_marks:
                return self.key_marks[prefix]
            if prefix in self.value_marks:
                return self.value_marks[prefix]
        return (1, 1)


class _FailError(Exception):
    """A problem at a position, raised inside the builder and turned into a Problem."""

    def __init__(self, line: int, col: int, message: str) -> None:
        self.line, self.col, self.message = line, col, message
        super().__init__(message)


def _mark(node: Node | Any) -> tuple[int, int]:
    mark = node.start_mark
    return (mark.line + 1, mark.column + 1)


@dataclass
class _Builder:
    limits: Limits
    nodes: int = 0
    key_marks: dict[Loc, tuple[int, int]] = field(default_factory=dict)
    value_marks: dict[Loc, tuple[int, int]] = field(default_factory=dict)
    scalar_text: dict[Loc, str] = field(default_factory=dict)

    def build(self, node: Node, loc: Loc, depth: int) -> Any:
        self.nodes += 1
        if self.nodes > self.limits.max_nodes:
            raise _FailError(*_mark(node), f"more than {self.limits.max_nodes} YAML nodes")
        if depth > self.limits.max_depth:
            raise _FailError(*_mark(node), f"nested deeper than {self.limits.max_depth} levels")
        self.value_marks[loc] = _mark(node)
        if isinstance(node, ScalarNode):
            construct = _SCALARS.get(node.tag)
            if construct is None:
                raise _FailError(*_mark(node), f"YAML tag {node.tag!r} is not allowed in manifests")
            value = construct(node)
            if not isinstance(value, str):
                self.scalar_text[loc] = node.value
            return value
        if isinstance(node, SequenceNode):
            if node.tag != _TAG + "seq":
                raise _FailError(*_mark(node), f"YAML tag {node.tag!r} is not allowed in manifests")
            return [self.build(child, (*loc, i), depth + 1) for i, child in enumerate(node.value)]
        if isinstance(node, MappingNode):
            if node.tag != _TAG + "map":
                raise _FailError(*_mark(node), f"YAML tag {node.tag!r} is not allowed in manifests")
            return self._mapping(node, loc, depth)
        raise _FailError(*_mark(node), "unsupported YAML node")  # pragma: no cover

    def _mapping(self, node: MappingNode, loc: Loc, depth: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _TAG + "merge":
                raise _FailError(*_mark(key_node), "merge keys ('<<') are not allowed in manifests")
            if not isinstance(key_node, ScalarNode) or key_node.tag != _TAG + "str":
                shown = key_node.value if isinstance(key_node, ScalarNode) else "a collection"
                raise _FailError(*_mark(key_node), f"mapping keys must be strings, got {shown!r}")
            key = key_node.value
            if key in out:
                first = self.key_marks[(*loc, key)][0]
                raise _FailError(
                    *_mark(key_node), f"duplicate key {key!r} (first defined on line {first})"
                )
            self.key_marks[(*loc, key)] = _mark(key_node)
            out[key] = self.build(value_node, (*loc, key), depth + 1)
        return out


def _scan_events(text: str, limits: Limits) -> None:
    """Reject anchors, aliases and deep nesting from the event stream.

    The node composer already shares aliased nodes, but that sharing is exactly what a
    "billion laughs" document exploits, and libyaml's composer recurses natively on
    deep flow nesting; the event stream is flat, so it is the safe place to look.
    """
    depth = 0
    for event in yaml.parse(text, Loader=_Loader):
        if isinstance(event, yaml.AliasEvent):
            raise _FailError(
                *_mark(event), f"aliases ('*{event.anchor}') are not allowed in manifests"
            )
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            raise _FailError(*_mark(event), f"anchors ('&{anchor}') are not allowed in manifests")
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > limits.max_depth:
                raise _FailError(*_mark(event), f"nested deeper than {limits.max_depth} levels")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _position_of(raw: bytes, offset: int) -> tuple[int, int]:
    line_start = raw.rfind(b"\n", 0, offset) + 1
    col = len(raw[line_start:offset].decode("utf-8", errors="replace")) + 1
    return (raw.count(b"\n", 0, offset) + 1, col)


def _yaml_error_message(err: yaml.YAMLError, text: str) -> tuple[int, int, str]:
    if isinstance(err, yaml.reader.ReaderError):
        before = text[: err.position]
        line = before.count("\n") + 1
        col = err.position - (before.rfind("\n") + 1) + 1
        char = err.character if isinstance(err.character, int) else ord(err.character)
        return line, col, f"invalid character U+{char:04X}: {err.reason}"
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    line, col = (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)
    problem = getattr(err, "problem", None) or str(err)
    if mark is not None and text[mark.index : mark.index + 1] == "\t":
        return line, col, "tab character; YAML indentation must use spaces"
    if "maximum nesting depth" in problem:
        return line, col, "nested too deeply"
    context = getattr(err, "context", None)
    detail = f"{problem} ({context})" if context and context != problem else problem
    if "expected a single document" in detail:
        return line, col, "expected a single YAML document, found several ('---')"
    return line, col, f"invalid YAML: {detail}"


def _build_root(builder: _Builder, node: Node | None) -> Any:
    if node is None:
        raise _FailError(1, 1, "empty file; expected a YAML mapping")
    return builder.build(node, (), 0)


def parse_yaml(raw: bytes, file: str, limits: Limits = DEFAULT_LIMITS) -> YamlDocument:
    """Parse one strict YAML document from bytes.

    Args:
        raw: file content (UTF-8, optional BOM).
        file: name shown in error messages.
        limits: bounds on size, depth and node count.

    Returns:
        The document with positions.

    Raises:
        ManifestError: the bytes are not one valid, strict YAML document within limits.
    """
    if len(raw) > limits.max_bytes:
        raise ManifestError.single(
            file, f"file is {len(raw)} bytes; manifests are limited to {limits.max_bytes}", line=1
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line, col = _position_of(raw, e.start)
        bad = raw[e.start : e.start + 1].hex()
        raise ManifestError.single(
            file, f"not UTF-8: invalid byte 0x{bad}", line=line, col=col
        ) from None
    text = text.removeprefix("\ufeff")
    try:
        if (
            "&" in text
            or "*" in text
            or len(text) > _SCAN_IF_BYTES_OVER
            or text.count("[") + text.count("{") > _SCAN_IF_BRACKETS_OVER
        ):
            _scan_events(text, limits)
        loader = _Loader(text)
        try:
            node = loader.get_single_node()
        finally:
            loader.dispose()
        builder = _Builder(limits)
        data = _build_root(builder, node)
    except _FailError as f:
        raise ManifestError.single(file, f.message, line=f.line, col=f.col) from None
    except yaml.YAMLError as e:
        line, col, message = _yaml_error_message(e, text)
        raise ManifestError.single(file, message, line=line, col=col) from None
    except RecursionError:
        raise ManifestError.single(
            file, f"nested deeper than {limits.max_depth} levels", line=1
        ) from None
    return YamlDocument(file, data, builder.key_marks, builder.value_marks, builder.scalar_text)


def read_yaml(path: Path, file: str, limits: Limits = DEFAULT_LIMITS) -> YamlDocument:
    """Read and parse ``path``, refusing oversized files before reading them.

    Args:
        path: file to read.
        file: name shown in error messages.
        limits: bounds on size, depth and node count.

    Returns:
        The parsed document.

    Raises:
        ManifestError: unreadable, not a file, too large, or invalid YAML.
    """
    try:
        with path.open("rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size > limits.max_bytes:
                raise ManifestError.single(
                    file,
                    f"file is {size} bytes; manifests are limited to {limits.max_bytes}",
                    line=1,
                )
            raw = fh.read(limits.max_bytes + 1)
    except IsADirectoryError:
        raise ManifestError.single(file, "is a directory; expected a YAML file") from None
    except FileNotFoundError:
        raise ManifestError.single(file, "file not found") from None
    except PermissionError:
        raise ManifestError.single(file, "cannot read: permission denied") from None
    except OSError as e:
        raise ManifestError.single(file, f"cannot read: {e.strerror or e}") from None
    return parse_yaml(raw, file, limits)
