"""Strict YAML loading that remembers where every key and value came from.

Manifests are small, hand-written files, so this loader is deliberately narrower than
YAML: one document, string keys, no duplicate keys, no anchors or aliases (which also
rules out "billion laughs" expansion), no custom tags, bounded size, depth and node
count.  Files in the plain corner of YAML that manifests are written in are read by
``registry._yaml_fast`` (each distinct line once per process); every other file, and
every problem, by libyaml (PyYAML's C binding) when available.  Both give the same
data; positions for messages always come from libyaml.

Stable API: ``Limits``, ``YamlDocument``, ``parse_yaml``, ``read_yaml``.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Final

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from registry._yaml_fast import MAP as _MAP
from registry._yaml_fast import SCALARS as _SCALARS
from registry._yaml_fast import SEQ as _SEQ
from registry._yaml_fast import STR as _STR
from registry._yaml_fast import TAG as _TAG
from registry._yaml_fast import read_plain
from registry.errors import (
    QUOTE_LIMIT,
    FileTooLargeError,
    ManifestError,
    UnsafeFileError,
    quote,
)
from registry.safe_io import read_regular

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

# Tags are shown whole up to this length: "tag:yaml.org,2002:python/object:os.system"
# should read as what it is.
_TAG_SHOWN: Final = 64


class YamlDocument:
    """A parsed document; positions of keys and values are computed on demand.

    Valid files (nearly all of them) never need positions, so the first parse builds
    plain data only; the first position lookup parses the kept text again, recording
    where every key and value starts.

    Attributes:
        file: the name used in error messages (usually a repository-relative path).
        data: plain Python data (dict, list, str, int, float, bool, None).
    """

    __slots__ = ("_marks", "_root", "_source", "_text", "data", "file", "limits")

    def __init__(
        self,
        file: str,
        data: Any,
        text: str | None,
        limits: Limits = DEFAULT_LIMITS,
        source: Path | None = None,
        *,
        root: Path | None = None,
    ) -> None:
        if text is None and source is None:
            raise ValueError("YamlDocument needs its text or the file it came from")
        self.file = file
        self.data = data
        self.limits = limits
        self._text = text
        self._source = source
        self._root = root
        self._marks: _Builder | None = None

    def __repr__(self) -> str:
        return f"YamlDocument(file={self.file!r})"

    def __getstate__(self) -> tuple[Any, ...]:
        # Sent between processes without its text when the file can be read again:
        # the text is needed only for positions, which valid files never ask for.
        text = self._text if self._source is None else None
        return (self.file, self.data, text, self.limits, self._source, self._root)

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        self.file, self.data, self._text, self.limits, self._source, self._root = state
        self._marks = None

    def _positions(self) -> _Builder:
        if self._marks is None:
            if self._text is None:
                assert self._source is not None  # noqa: S101 - checked in __init__
                # The same refusals as the first read: no link, no unbounded read.
                raw = _read(self._source, self.file, self.limits, self._root)
                self._text = raw.decode("utf-8", errors="replace").removeprefix("\ufeff")
            builder = _Builder(self.limits, _Lines(self._text))
            node = _compose(self._text)
            if node is not None:  # an empty document has no positions but (1, 1)
                builder.build(node, (), 0)
            self._marks = builder
        return self._marks

    @property
    def key_marks(self) -> dict[Loc, tuple[int, int]]:
        """1-based (line, col) of each mapping key, by location."""
        return self._positions().key_marks

    @property
    def value_marks(self) -> dict[Loc, tuple[int, int]]:
        """1-based (line, col) of each value, by location."""
        return self._positions().value_marks

    @property
    def scalar_text(self) -> dict[Loc, str]:
        """Source text of every non-string scalar, to suggest quoting."""
        return self._positions().scalar_text

    def position(self, loc: Loc, *, key: bool = False) -> tuple[int, int]:
        """Best position for ``loc``: itself, else its closest ancestor that exists.

        Args:
            loc: location inside the document.
            key: prefer the key's position over the value's (for "unknown key").
        """
        key_marks, value_marks = self.key_marks, self.value_marks
        for end in range(len(loc), -1, -1):
            prefix = loc[:end]
            if key and prefix in key_marks:
                return key_marks[prefix]
            if prefix in value_marks:
                return value_marks[prefix]
        return (1, 1)


class _FailError(Exception):
    """A problem at a position, raised inside the builder and turned into a Problem."""

    def __init__(self, line: int, col: int, message: str) -> None:
        self.line, self.col, self.message = line, col, message
        super().__init__(message)


class _Lines:
    """Maps character offsets to 1-based (line, column), counting only ``\\n`` as a break.

    libyaml also breaks lines at U+0085, U+2028 and U+2029, which editors, git and
    CI annotations don't, so its own line numbers would drift after one of them.
    """

    __slots__ = ("starts",)

    def __init__(self, text: str) -> None:
        self.starts = [0]
        self.starts.extend(i + 1 for i, ch in enumerate(text) if ch == "\n")

    def at(self, index: int) -> tuple[int, int]:
        line = bisect.bisect_right(self.starts, index)
        return (line, index - self.starts[line - 1] + 1)

    def of(self, item: Any) -> tuple[int, int]:
        """Position of a node's or event's start."""
        return self.at(item.start_mark.index)


@dataclass
class _Builder:
    limits: Limits
    lines: _Lines
    nodes: int = 0
    key_marks: dict[Loc, tuple[int, int]] = field(default_factory=dict)
    value_marks: dict[Loc, tuple[int, int]] = field(default_factory=dict)
    scalar_text: dict[Loc, str] = field(default_factory=dict)

    def build(self, node: Node, loc: Loc, depth: int) -> Any:
        self.nodes += 1
        if self.nodes > self.limits.max_nodes:
            raise _FailError(*self.lines.of(node), f"more than {self.limits.max_nodes} YAML nodes")
        if depth > self.limits.max_depth:
            raise _FailError(
                *self.lines.of(node), f"nested deeper than {self.limits.max_depth} levels"
            )
        self.value_marks[loc] = self.lines.of(node)
        if isinstance(node, ScalarNode):
            if node.tag == _STR:
                return node.value
            construct = _SCALARS.get(node.tag)
            if construct is None:
                raise _FailError(
                    *self.lines.of(node),
                    f"YAML tag {quote(node.tag, _TAG_SHOWN)} is not allowed in manifests",
                )
            self.scalar_text[loc] = node.value
            try:
                return construct(node)
            except (ValueError, KeyError, IndexError, TypeError):
                shown = node.tag.replace(_TAG, "!!")
                raise _FailError(
                    *self.lines.of(node), f"invalid {shown} value {quote(node.value)}"
                ) from None
        if isinstance(node, SequenceNode):
            if node.tag != _TAG + "seq":
                raise _FailError(
                    *self.lines.of(node),
                    f"YAML tag {quote(node.tag, _TAG_SHOWN)} is not allowed in manifests",
                )
            return [self.build(child, (*loc, i), depth + 1) for i, child in enumerate(node.value)]
        if isinstance(node, MappingNode):
            if node.tag != _TAG + "map":
                raise _FailError(
                    *self.lines.of(node),
                    f"YAML tag {quote(node.tag, _TAG_SHOWN)} is not allowed in manifests",
                )
            return self._mapping(node, loc, depth)
        raise _FailError(*self.lines.of(node), "unsupported YAML node")  # pragma: no cover

    def _mapping(self, node: MappingNode, loc: Loc, depth: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _TAG + "merge":
                raise _FailError(
                    *self.lines.of(key_node), "merge keys ('<<') are not allowed in manifests"
                )
            if not isinstance(key_node, ScalarNode) or key_node.tag != _TAG + "str":
                shown = key_node.value if isinstance(key_node, ScalarNode) else "a collection"
                raise _FailError(
                    *self.lines.of(key_node), f"mapping keys must be strings, got {quote(shown)}"
                )
            key = key_node.value
            if key in out:
                first = next(self.lines.of(k)[0] for k, _ in node.value if k.value == key)
                raise _FailError(
                    *self.lines.of(key_node),
                    f"duplicate key {quote(key)} (first defined on line {first})",
                )
            self.key_marks[(*loc, key)] = self.lines.of(key_node)
            out[key] = self.build(value_node, (*loc, key), depth + 1)
        return out


def _scan_events(text: str, limits: Limits) -> None:
    """Reject anchors, aliases and deep nesting from the event stream.

    The node composer already shares aliased nodes, but that sharing is exactly what a
    "billion laughs" document exploits, and libyaml's composer recurses natively on
    deep flow nesting; the event stream is flat, so it is the safe place to look.
    """
    depth = 0
    lines = _Lines(text)
    for event in yaml.parse(text, Loader=_Loader):
        if isinstance(event, yaml.AliasEvent):
            raise _FailError(
                *lines.of(event),
                f"aliases ('*{str(event.anchor)[:QUOTE_LIMIT]}') are not allowed in manifests",
            )
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            raise _FailError(
                *lines.of(event),
                f"anchors ('&{anchor[:QUOTE_LIMIT]}') are not allowed in manifests",
            )
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > limits.max_depth:
                raise _FailError(*lines.of(event), f"nested deeper than {limits.max_depth} levels")
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
    context_mark = getattr(err, "context_mark", None)
    if mark is not None and context_mark is not None and mark.index >= len(text.rstrip()):
        # Ran off the end: the useful place is where the unclosed thing opened.
        mark = context_mark
    line, col = _Lines(text).at(mark.index) if mark is not None else (1, 1)
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


class _CachedResolverLoader(_Loader):  # type: ignore[valid-type,misc]
    """libyaml's composer calls back into Python to type every scalar.

    For a plain (unquoted) scalar the answer depends on its text alone, and manifests
    repeat the same words (``float32``, ``batch``, ``onnx``) thousands of times, so the
    answers are memoized; this is most of the cost of loading a large repository.
    """

    _tags: ClassVar[dict[str, str]] = {}

    # Path-based resolvers are never registered for manifests; skipping their
    # bookkeeping saves two Python calls per node.
    def descend_resolver(self, current_node: Any, current_index: Any) -> None:
        return None

    def ascend_resolver(self) -> None:
        return None

    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        if kind is MappingNode and implicit:
            return _MAP
        if kind is SequenceNode and implicit:
            return _SEQ
        if kind is ScalarNode and implicit[0]:
            tag = self._tags.get(value)
            if tag is None:
                tag = super().resolve(kind, value, implicit)
                if len(self._tags) < _RESOLVER_CACHE_SIZE:
                    self._tags[value] = tag
            return tag
        return super().resolve(kind, value, implicit)


_RESOLVER_CACHE_SIZE: Final = 1 << 16


def _compose(text: str) -> Node | None:
    loader = _CachedResolverLoader(text)
    try:
        node: Node | None = loader.get_single_node()
        return node
    finally:
        loader.dispose()


class _Plain:
    """Builds plain data with every check of ``_Builder`` but no positions (the fast path)."""

    __slots__ = ("limits", "nodes")

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.nodes = 0

    def build(self, node: Node, depth: int) -> Any:
        self.nodes += 1
        if self.nodes > self.limits.max_nodes or depth > self.limits.max_depth:
            raise _Rebuild
        tag = node.tag
        if tag == _STR and isinstance(node, ScalarNode):
            return node.value
        if tag == _MAP and isinstance(node, MappingNode):
            out: dict[str, Any] = {}
            for key_node, value_node in node.value:
                if key_node.tag != _STR:
                    raise _Rebuild
                key = key_node.value
                if key in out:
                    raise _Rebuild
                out[key] = self.build(value_node, depth + 1)
            return out
        if tag == _SEQ and isinstance(node, SequenceNode):
            return [self.build(child, depth + 1) for child in node.value]
        construct = _SCALARS.get(tag)
        if construct is None or not isinstance(node, ScalarNode):
            raise _Rebuild
        try:
            return construct(node)
        except (ValueError, KeyError, IndexError, TypeError):
            raise _Rebuild from None


class _Rebuild(Exception):  # noqa: N818 - a control-flow signal, not an error
    """The fast path met something to report: redo the file with positions."""


def _build_root(limits: Limits, node: Node | None, text: str) -> Any:
    if node is None:
        raise _FailError(1, 1, "empty file; expected a YAML mapping")
    try:
        return _Plain(limits).build(node, 0)
    except _Rebuild:
        # Same rules with positions: raises the precise _FailError.
        return _Builder(limits, _Lines(text)).build(node, (), 0)


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
            data = _build_root(limits, _compose(text), text)
        else:
            # Most manifests are in the plain corner of YAML that read_plain handles;
            # anything else (and every problem) goes through libyaml and the builders.
            data = read_plain(text, limits.max_depth, limits.max_nodes)
            if data is None:
                data = _build_root(limits, _compose(text), text)
    except _FailError as f:
        raise ManifestError.single(file, f.message, line=f.line, col=f.col) from None
    except yaml.YAMLError as e:
        line, col, message = _yaml_error_message(e, text)
        raise ManifestError.single(file, message, line=line, col=col) from None
    except RecursionError:
        raise ManifestError.single(
            file, f"nested deeper than {limits.max_depth} levels", line=1
        ) from None
    return YamlDocument(file, data, text, limits)


def read_yaml(
    path: Path, file: str, limits: Limits = DEFAULT_LIMITS, *, root: Path | None = None
) -> YamlDocument:
    """Read and parse ``path``, refusing links and oversized files before reading them.

    Args:
        path: file to read.
        file: name shown in error messages.
        limits: bounds on size, depth and node count.
        root: the repository root: no folder between it and ``path`` may be a link
            either (see ``registry.safe_io``).

    Returns:
        The parsed document.

    Raises:
        ManifestError: a link, not a regular file, unreadable, too large, or invalid YAML.
    """
    raw = _read(path, file, limits, root)
    doc = parse_yaml(raw, file, limits)
    doc._source = path  # lets positions re-read the file instead of keeping its text
    doc._root = root
    return doc


def _read(path: Path, file: str, limits: Limits, root: Path | None) -> bytes:
    try:
        return read_regular(path, root=root, max_bytes=limits.max_bytes)
    except FileTooLargeError as e:
        raise ManifestError.single(
            file, f"file is {e.size} bytes; manifests are limited to {e.limit}", line=1
        ) from None
    except UnsafeFileError as e:
        # Refused before reading: the message says why and holds none of the content.
        raise ManifestError.single(file, e.reason) from None
    except IsADirectoryError:
        raise ManifestError.single(file, "is a directory; expected a YAML file") from None
    except FileNotFoundError:
        raise ManifestError.single(file, "file not found") from None
    except PermissionError:
        raise ManifestError.single(file, "cannot read: permission denied") from None
    except OSError as e:
        raise ManifestError.single(file, f"cannot read: {e.strerror or 'I/O error'}") from None
