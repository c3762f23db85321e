"""A fast reader for the plain shape manifests are written in, beside libyaml.

libyaml builds a node per value and calls back into Python for every scalar; on a
10,000-version repository that is most of a cold ``modelreg validate``.  Manifests,
though, are nearly always written in a small corner of YAML: block mappings and
sequences of ASCII lines, plain or simply quoted scalars, one-line flow sequences and
mappings of plain scalars, comments.  This module reads exactly that corner, and each
distinct line only once per process (a repository repeats ``dtype: float32`` tens of
thousands of times).

It never decides anything libyaml would decide differently: whatever it does not
recognise with certainty (a tab, a non-ASCII character, a block scalar, an anchor, a
tag, a quoted key, a multi-line scalar, a duplicate key, a limit reached, a key that
is not a string...) makes it answer ``None``, and the caller parses the file with
libyaml and the positional builder, which report every problem exactly as before.
Plain scalars are typed by the resolver and constructors that libyaml's path uses, so
``1.0.0``, ``0.93``, ``yes`` and ``2024-05-01`` come out the same.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from itertools import chain
from typing import Any, Final

from yaml.constructor import SafeConstructor
from yaml.nodes import Node, ScalarNode
from yaml.resolver import Resolver

TAG: Final = "tag:yaml.org,2002:"
STR: Final = TAG + "str"
MAP: Final = TAG + "map"
SEQ: Final = TAG + "seq"
_ctor = SafeConstructor()
SCALARS: Final[dict[str, Callable[[Node], Any]]] = {
    TAG + "str": lambda n: n.value,
    TAG + "int": _ctor.construct_yaml_int,  # type: ignore[dict-item]
    TAG + "float": _ctor.construct_yaml_float,  # type: ignore[dict-item]
    TAG + "bool": _ctor.construct_yaml_bool,  # type: ignore[dict-item]
    TAG + "null": lambda n: None,
    # Dates stay the text the author wrote: no field of ours is a date, and turning
    # `trained: 2024-05-01` into a datetime would only produce a confusing type error.
    TAG + "timestamp": lambda n: n.value,
}
"""How each scalar tag a manifest may hold becomes Python data (both paths use it)."""

# Only printable ASCII and newlines: no tab (indentation errors), no carriage return,
# no control or non-ASCII character (libyaml's line breaks and refusals differ there).
_OUTSIDE: Final = re.compile(r"[^\n\x20-\x7e]")
_KEY: Final = re.compile(r"([A-Za-z0-9_][A-Za-z0-9_./-]*):(?: +(.*))?")
# Characters that start something other than a plain scalar (YAML's indicators).
_INDICATORS: Final = frozenset("-?:,[]{}#&*!|>'\"%@`")
_NOT_IN_FLOW: Final = re.compile(r"[\[\]{}\"'#&*!|>%@`?]")
_MEMO_SIZE: Final = 1 << 17

_resolver = Resolver()

# A line's entries: (indent, is "- ", key or None, value kind, value).
_Entry = tuple[int, bool, str | None, int, Any]
_NONE: Final = -1  # no value on the line: a nested block or null follows
_SCALAR: Final = 0
_FLOW_SEQ: Final = 1
_FLOW_MAP: Final = 2

_lines: dict[str, tuple[_Entry, ...]] = {}
_plains: dict[str, tuple[str, Any]] = {}


class _Unhandled(Exception):  # noqa: N818 - a control-flow signal, not an error
    """Not in the corner this reader handles: libyaml's path decides."""


# First characters that no implicit resolver of libyaml's path looks at (only '0'-'9',
# '+-.~<=' and the first letters of the bool and null words have one): a plain scalar
# starting with any other is a string, whatever follows (``models/m1.onnx``, ``runs:/``).
_STRING_FIRST: Final = (
    frozenset(map(chr, range(0x21, 0x7F))) - frozenset(Resolver.yaml_implicit_resolvers)
    if None not in Resolver.yaml_implicit_resolvers and not Resolver.yaml_path_resolvers
    else frozenset()
)
# The two numbers manifests are full of, which the resolver would try float on first
# and the constructors turn into exactly float(text) and int(text).
_DECIMAL: Final = re.compile(r"[0-9]+\.[0-9]+")
_INTEGER: Final = re.compile(r"0|[1-9][0-9]*")
_FLOAT_TAG: Final = TAG + "float"
_INT_TAG: Final = TAG + "int"


def _typed(text: str) -> tuple[str, Any]:
    """(tag, value) of a plain scalar, typed as libyaml's resolver would."""
    hit = _plains.get(text)
    if hit is not None:
        return hit
    if text[0] in _STRING_FIRST:
        hit = (STR, text)
    elif _DECIMAL.fullmatch(text) is not None:
        hit = (_FLOAT_TAG, float(text))
    elif _INTEGER.fullmatch(text) is not None:
        try:
            hit = (_INT_TAG, int(text))
        except ValueError:  # over Python's digit limit: libyaml's path reports it
            raise _Unhandled from None
    if hit is not None:
        if len(_plains) < _MEMO_SIZE:
            _plains[text] = hit
        return hit
    tag = _resolver.resolve(ScalarNode, text, (True, False))  # type: ignore[no-untyped-call]
    construct = SCALARS.get(tag)
    if construct is None:  # '=' (the value tag) or a merge key: refused on the other path
        raise _Unhandled
    try:
        value = construct(ScalarNode(tag, text))
    except (ValueError, KeyError, IndexError, TypeError):
        raise _Unhandled from None
    if len(_plains) < _MEMO_SIZE:
        _plains[text] = (tag, value)
    return tag, value


def _plain(text: str) -> Any:
    return _typed(text)[1]


def _dash_led(text: str) -> bool:
    """``-5``, ``-x``: a plain scalar may start with '-' when no space follows it."""
    return text[0] == "-" and text[1:2] not in ("", " ")


def _plain_ok(text: str, *, flow: bool) -> str:
    if not text or (text[0] in _INDICATORS and not _dash_led(text)):
        raise _Unhandled
    if ": " in text or text.endswith(":") or " #" in text:
        raise _Unhandled
    if flow and (":" in text or _NOT_IN_FLOW.search(text)):
        raise _Unhandled
    return text


def _key(text: str) -> str:
    if _typed(text)[0] != STR:
        raise _Unhandled  # 'yes', '1', 'null', a date ... are not string keys
    return text


def _quoted(raw: str) -> tuple[str, str]:
    """(the string, what follows the closing quote) of a one-line quoted scalar."""
    quote = raw[0]
    if quote == '"':
        end = raw.find('"', 1)
        if end < 0 or "\\" in raw[1:end]:
            raise _Unhandled
        return raw[1:end], raw[end + 1 :]
    i = 1
    while True:
        end = raw.find("'", i)
        if end < 0:
            raise _Unhandled
        if raw[end + 1 : end + 2] == "'":
            i = end + 2
            continue
        return raw[1:end].replace("''", "'"), raw[end + 1 :]


def _value(raw: str) -> tuple[int, Any]:
    first = raw[0]
    if first in "\"'":
        text, rest = _quoted(raw)
        if rest and not (rest[0] == " " and rest.lstrip(" ").startswith("#")):
            raise _Unhandled
        return _SCALAR, text
    if " #" in raw:
        raw = raw[: raw.index(" #")].rstrip(" ")
    if first == "[" and raw.endswith("]"):
        inner = raw[1:-1].strip(" ")
        if not inner:
            return _FLOW_SEQ, ()
        items = [item.strip(" ") for item in inner.split(",")]
        return _FLOW_SEQ, tuple(_plain(_plain_ok(item, flow=True)) for item in items)
    if first == "{" and raw.endswith("}"):
        inner = raw[1:-1].strip(" ")
        if not inner:
            return _FLOW_MAP, ()
        pairs: dict[str, Any] = {}
        for part in inner.split(","):
            key, colon, value = part.partition(": ")
            key, value = key.strip(" "), value.strip(" ")
            if not colon or key in pairs or not _KEY.fullmatch(key + ":"):
                raise _Unhandled
            pairs[_key(key)] = _plain(_plain_ok(value, flow=True))
        return _FLOW_MAP, tuple(pairs.items())
    # _plain_ok(raw, flow=False), inlined: most distinct lines of a repository end here.
    if (first in _INDICATORS and not _dash_led(raw)) or ": " in raw or raw[-1] == ":":
        raise _Unhandled
    return _SCALAR, _typed(raw)[1]


def _keyed(indent: int, text: str) -> _Entry:
    match = _KEY.fullmatch(text)
    if match is None:
        raise _Unhandled
    key, raw = match[1], match[2]
    if _typed(key)[0] != STR:
        raise _Unhandled  # 'yes', '1', 'null', a date ... are not string keys
    if raw is None or raw.startswith("#"):  # nothing but perhaps a comment
        return (indent, False, key, _NONE, None)
    return (indent, False, key, *_value(raw))


def _tokenize(line: str) -> tuple[_Entry, ...]:
    content = line.lstrip(" ")
    if not content or content[0] == "#":
        return ()
    indent = len(line) - len(content)
    content = content.rstrip(" ")
    if indent == 0 and content.startswith(("---", "...")):
        raise _Unhandled  # document markers
    if content[0] != "-" or content[1:2] not in ("", " "):
        return (_keyed(indent, content),)
    rest = content[1:].lstrip(" ")
    if not rest or rest[0] == "#":
        return ((indent, True, None, _NONE, None),)
    if rest[0] == "-" and rest[1:2] in ("", " "):
        raise _Unhandled  # "- - x"
    column = indent + len(content) - len(rest)
    if _KEY.fullmatch(rest) is not None:
        return ((indent, True, None, _NONE, None), _keyed(column, rest))
    return ((indent, True, None, *_value(rest)),)


class _Reader:
    """Builds the data from the entries, by indentation, as libyaml's block rules do."""

    __slots__ = ("at", "entries", "max_depth", "nodes")

    def __init__(self, entries: list[_Entry], max_depth: int) -> None:
        self.entries = entries
        self.at = 0
        self.nodes = 0
        # A flow collection's items lie two levels below the block that holds it:
        # refusing anything that deep is safe (libyaml's path then decides).
        self.max_depth = max_depth - 2

    def block(self, indent: int, depth: int) -> Any:
        if depth > self.max_depth:
            raise _Unhandled
        if self.entries[self.at][1]:
            return self.sequence(indent, depth)
        return self.mapping(indent, depth)

    def nested(self, at: int, indent: int, depth: int, *, same_indent_dash: bool) -> Any:
        """What follows a bare ``key:`` or ``-`` at ``at``: a more indented block, or null."""
        entries = self.entries
        if at < len(entries):
            below, dash = entries[at][:2]
            if below > indent or (same_indent_dash and below == indent and dash):
                self.at = at
                return self.block(below, depth)
        self.nodes += 1
        return None

    def mapping(self, indent: int, depth: int) -> dict[str, Any]:
        entries, at, nodes = self.entries, self.at, 1
        end = len(entries)
        out: dict[str, Any] = {}
        while at < end:
            column, _, key, kind, value = entries[at]
            if column < indent:
                break
            if column > indent or key is None or key in out:
                raise _Unhandled
            at += 1
            if kind == _SCALAR:
                out[key] = value
                nodes += 1
            elif kind == _NONE:
                self.at = at
                out[key] = self.nested(at, indent, depth + 1, same_indent_dash=True)
                at = self.at
            else:
                out[key] = list(value) if kind == _FLOW_SEQ else dict(value)
                nodes += 1 + len(value)
        self.at = at
        self.nodes += nodes
        return out

    def sequence(self, indent: int, depth: int) -> list[Any]:
        entries, at, nodes = self.entries, self.at, 1
        end = len(entries)
        out: list[Any] = []
        while at < end:
            column, dash, _, kind, value = entries[at]
            if column < indent or (column == indent and not dash):
                break  # the end of an indentless sequence: the mapping goes on
            if column > indent:
                raise _Unhandled
            at += 1
            if kind == _SCALAR:
                out.append(value)
                nodes += 1
            elif kind == _NONE:
                self.at = at
                out.append(self.nested(at, indent, depth + 1, same_indent_dash=False))
                at = self.at
            else:
                out.append(list(value) if kind == _FLOW_SEQ else dict(value))
                nodes += 1 + len(value)
        self.at = at
        self.nodes += nodes
        return out


def read_plain(text: str, max_depth: int, max_nodes: int) -> dict[str, Any] | None:
    """The data of ``text`` when it is a mapping in the plain corner of YAML, else None.

    Args:
        text: the document (decoded, without BOM).
        max_depth: deepest nesting accepted (as ``yamlsrc.Limits``).
        max_nodes: most values accepted (as ``yamlsrc.Limits``).

    Returns:
        The same data libyaml's path builds, or None: parse it with libyaml.
    """
    if _OUTSIDE.search(text) is not None or max_depth < 2:
        return None
    lines = text.split("\n")
    found = list(map(_lines.get, lines))
    try:
        if None in found:
            for i, line in enumerate(lines):
                if found[i] is None:
                    found[i] = tokens = _tokenize(line)
                    if len(_lines) < _MEMO_SIZE:
                        _lines[line] = tokens
        entries: list[_Entry] = list(chain.from_iterable(found))  # type: ignore[arg-type]
        if not entries or entries[0][0] != 0 or entries[0][1]:
            return None
        reader = _Reader(entries, max_depth)
        data = reader.mapping(0, 0)
    except _Unhandled:
        return None
    if reader.at != len(entries) or reader.nodes > max_nodes:
        return None
    return data
