"""Turn YAML documents into typed manifests, with one precise line per problem.

Pydantic reports errors by location (``('spec', 'targets', 0, 'tensorrt', 'precision')``);
this module maps each location back onto the YAML source, drops the union-branch noise
pydantic adds, and rewrites the messages into what a person editing the file needs:
what is wrong, where, and the fix when it is known.
"""

from __future__ import annotations

import difflib
import json
import types
import typing
from collections.abc import Iterable, Sequence
from typing import Any, Final, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from registry.errors import QUOTE_LIMIT, ManifestError, Problem, quote
from registry.schema import API_VERSION, DNS_LABEL_RE, KINDS, LABEL_KEY_RE, SYMBOL_RE
from registry.yamlsrc import Loc, YamlDocument

M = TypeVar("M", bound=BaseModel)

_PATTERN_HELP: Final = {
    DNS_LABEL_RE: "lowercase letters, digits and '-', starting and ending with a "
    "letter or digit, at most 63 characters",
    SYMBOL_RE: "letters, digits and '_', not starting with a digit",
    LABEL_KEY_RE: "an optional DNS prefix and '/', then letters, digits, '-', '_' or '.'",
}
_TYPE_NAMES: Final = {
    "string_type": "a string",
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "true or false",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "list_type": "a list",
    "none_required": "null",
}


def format_loc(loc: Loc) -> str:
    """Render a location as ``spec.targets[0].precision``.

    Keys that are not plain words are written as ``["..."]`` (JSON-escaped), so a key
    holding a newline can't split a problem over two lines or forge a CI annotation.
    """
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif len(part) > QUOTE_LIMIT:
            # A key is a value too: a long one may be content we should not echo.
            out += f"[{json.dumps(part[:QUOTE_LIMIT] + '...')}]"
        elif not part.isprintable() or any(c in part for c in ' "[].') or not part:
            out += f"[{json.dumps(part)}]"
        else:
            out += f".{part}" if out else part
    return out


def _describe(value: Any, raw: str | None) -> str:
    # Quotes at most a prefix of the value: it may be the content of a file that a
    # pull request got us to read, and this line goes into logs and PR comments.
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {raw or value}"
    if isinstance(value, int | float):
        return f"number {_number(raw, value)}"
    if isinstance(value, str):
        return f"string {quote(value)}"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__  # pragma: no cover - YAML yields only the types above


def _number(raw: str | None, value: float) -> str:
    text = raw or str(value)
    return text if len(text) <= QUOTE_LIMIT else f"{text[:QUOTE_LIMIT]}... ({len(text)} digits)"


def _data_loc(data: Any, loc: Sequence[str | int], missing: bool) -> tuple[Loc, bool, bool]:
    """Strip union tags from a pydantic location by walking the actual data.

    Returns:
        (location in the data, whether it names a mapping key, whether pydantic went
        through a union branch on the way).
    """
    out: list[str | int] = []
    node, is_key, via_union = data, False, False
    for i, part in enumerate(loc):
        if part == "[key]":
            is_key = True
            continue
        in_dict = isinstance(node, dict) and isinstance(part, str) and part in node
        in_list = isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        if in_dict or in_list:
            out.append(part)
            node = node[part]
        elif missing and i == len(loc) - 1 and isinstance(part, str):
            out.append(part)  # a missing key: the location names it, the data lacks it
        else:
            via_union = True  # a union branch name ('str', 'tensorrt', ...)
    return tuple(out), is_key, via_union


def _unwrap(tp: Any) -> list[Any]:
    """Candidate pydantic model classes reachable from a field annotation."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(tp)[0])
    if origin in (typing.Union, types.UnionType, list, dict):
        found: list[Any] = []
        for arg in typing.get_args(tp):
            found.extend(_unwrap(arg))
        return found
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    return []


def _allowed_keys(root: type[BaseModel], data: Any, loc: Loc) -> list[str]:
    """Keys the schema accepts in the mapping at ``loc`` (best effort)."""
    models: list[type[BaseModel]] = [root]
    node = data
    for part in loc:
        if isinstance(part, int):
            node = node[part] if isinstance(node, list) and 0 <= part < len(node) else None
            continue
        node = node.get(part) if isinstance(node, dict) else None
        nxt: list[type[BaseModel]] = []
        for model in models:
            for name, info in model.model_fields.items():
                if (info.alias or name) == part:
                    nxt.extend(_unwrap(info.annotation))
        if not nxt:
            # a dict value (e.g. a channel name): keep the value types of the parent field
            nxt = models
        models = nxt
    engine = node.get("engine") if isinstance(node, dict) else None
    keys: list[str] = []
    for model in models:
        fields = model.model_fields
        tag = fields.get("engine")
        if engine and tag is not None and engine not in typing.get_args(tag.annotation):
            continue
        keys.extend(info.alias or name for name, info in fields.items() if info.alias or name)
    return sorted(set(keys))


def _message(  # noqa: PLR0912 - one branch per pydantic error type
    err: ErrorDetails, doc: YamlDocument, loc: Loc, root: type[BaseModel]
) -> str:
    kind = err["type"]
    ctx: dict[str, Any] = dict(err.get("ctx") or {})
    value = err.get("input")
    if kind == "extra_forbidden":
        key = str(loc[-1])
        allowed = _allowed_keys(root, doc.data, loc[:-1])
        hint = difflib.get_close_matches(key, allowed, n=1)
        fix = f"; did you mean {hint[0]!r}?" if hint else ""
        return f"unknown key {quote(key)}{fix} (allowed: {', '.join(allowed)})"
    if kind == "missing":
        return f"missing required key {quote(loc[-1])}"
    if kind in _TYPE_NAMES:
        raw = doc.scalar_text.get(loc)
        msg = f"expected {_TYPE_NAMES[kind]}, got {_describe(value, raw)}"
        if kind == "string_type" and raw is not None and isinstance(value, int | float):
            msg += f'; quote it: "{raw}"' if len(raw) <= QUOTE_LIMIT else "; quote it"
        return msg
    if kind == "literal_error":
        return f"expected one of {ctx.get('expected')}, got {_describe(value, None)}"
    if kind == "union_tag_invalid":
        return (
            f"unknown {ctx.get('discriminator', '').strip(chr(39))} {quote(ctx.get('tag'))} "
            f"(expected {ctx.get('expected_tags')})"
        )
    if kind == "union_tag_not_found":
        return f"missing required key {ctx.get('discriminator', '').strip(chr(39))!r}"
    if kind == "string_pattern_mismatch":
        what = _PATTERN_HELP.get(str(ctx.get("pattern")), f"pattern {ctx.get('pattern')}")
        return f"{quote(value)} is not valid here ({what})"
    if kind in ("greater_than_equal", "less_than_equal", "greater_than", "less_than"):
        op = {"greater_than_equal": ">=", "less_than_equal": "<=", "greater_than": ">"}
        limit = next(iter(ctx.values()))
        if isinstance(limit, float) and limit.is_integer():
            limit = int(limit)
        return f"must be {op.get(kind, '<')} {limit}, got {_describe(value, None)}"
    if kind == "too_short":
        n = ctx.get("min_length", 1)
        return f"needs at least {n} item{'s' if n != 1 else ''}"
    if kind == "too_long":
        return f"holds {ctx.get('actual_length')} items; at most {ctx.get('max_length')} allowed"
    if kind == "string_too_short":
        return "must not be empty"
    if kind == "string_too_long":
        return f"longer than {ctx.get('max_length')} characters"
    if kind == "finite_number":
        return "must be a finite number"
    if kind == "value_error":
        return str(ctx.get("error", err["msg"]))
    return err["msg"]


def _problems(
    doc: YamlDocument, error: ValidationError, root: type[BaseModel]
) -> Iterable[Problem]:
    located: list[tuple[Loc, ErrorDetails, bool, bool]] = []
    for err in error.errors(include_url=False):
        loc, is_key, via_union = _data_loc(doc.data, err["loc"], err["type"] == "missing")
        if err["type"] == "union_tag_invalid" and (*loc, "engine") in doc.value_marks:
            loc = (*loc, "engine")
        located.append((loc, err, is_key or err["type"] == "extra_forbidden", via_union))
    # A union reports why each branch failed.  A branch's "wrong type" is noise when
    # another error says more about the same value or something inside it.
    by_loc: dict[Loc, list[tuple[ErrorDetails, bool]]] = {}
    for loc, err, at_key, via_union in located:
        if via_union and err["type"] in _TYPE_NAMES:
            deeper = any(
                other[: len(loc)] == loc and (other != loc or e["type"] not in _TYPE_NAMES)
                for other, e, _, _ in located
                if e is not err
            )
            if deeper:
                continue
        by_loc.setdefault(loc, []).append((err, at_key))
    for loc, errs in by_loc.items():
        if len(errs) > 1 and all(e["type"] in _TYPE_NAMES for e, _ in errs):
            wanted = " or ".join(dict.fromkeys(_TYPE_NAMES[e["type"]] for e, _ in errs))
            got = _describe(errs[0][0].get("input"), doc.scalar_text.get(loc))
            line, col = doc.position(loc)
            yield Problem(doc.file, f"expected {wanted}, got {got}", line, col, format_loc(loc))
            continue
        seen: set[str] = set()
        for err, at_key in errs:
            message = _message(err, doc, loc, root)
            if message not in seen:
                seen.add(message)
                line, col = doc.position(loc, key=at_key)
                yield Problem(doc.file, message, line, col, format_loc(loc) or None)


def validate_document(doc: YamlDocument, model: type[M]) -> M:
    """Validate a parsed document against ``model``.

    Args:
        doc: the parsed YAML with positions.
        model: the pydantic model class to validate against.

    Returns:
        The typed, frozen model.

    Raises:
        ManifestError: every schema problem, each with file, line, column and field.
    """
    try:
        return model.model_validate(doc.data)
    except ValidationError as e:
        raise ManifestError(_problems(doc, e, model)) from None


def load_manifest(doc: YamlDocument, expected_kind: str | None = None) -> BaseModel:
    """Validate a document as a modelreg manifest of the kind it declares.

    Args:
        doc: the parsed YAML.
        expected_kind: the kind its path requires (``RegisteredModel`` for
            ``model.yaml``, ``ModelVersion`` under ``versions/``), if any.

    Returns:
        A ``RegisteredModel`` or ``ModelVersion``.

    Raises:
        ManifestError: wrong apiVersion or kind, or any schema problem.
    """
    data = doc.data
    if not isinstance(data, dict):
        raise ManifestError.single(
            doc.file,
            f"expected a mapping with apiVersion, kind, metadata and spec, got "
            f"{_describe(data, doc.scalar_text.get(()))}",
            line=1,
            col=1,
        )
    problems: list[Problem] = []
    api = data.get("apiVersion")
    if api != API_VERSION:
        line, col = doc.position(("apiVersion",))
        if api is None:
            text = "missing apiVersion"
        elif isinstance(api, str):
            text = f"unsupported apiVersion {quote(api)}"
        else:
            text = f"apiVersion is {_describe(api, doc.scalar_text.get(('apiVersion',)))}"
        problems.append(
            Problem(doc.file, f"{text}; this modelreg reads {API_VERSION}", line, col, "apiVersion")
        )
    kind = data.get("kind")
    if not isinstance(kind, str) or kind not in KINDS:
        line, col = doc.position(("kind",))
        choices = " or ".join(KINDS)
        if kind is None:
            shown = "missing kind"
        elif isinstance(kind, str):
            shown = f"unknown kind {quote(kind)}"
        else:
            shown = f"kind is {_describe(kind, doc.scalar_text.get(('kind',)))}"
        problems.append(Problem(doc.file, f"{shown}; expected {choices}", line, col, "kind"))
    elif expected_kind is not None and kind != expected_kind:
        line, col = doc.position(("kind",))
        problems.append(
            Problem(
                doc.file,
                f"kind is {kind} but this path holds a {expected_kind}",
                line,
                col,
                "kind",
            )
        )
    if problems or not isinstance(kind, str):
        raise ManifestError(problems)
    return validate_document(doc, KINDS[kind])
