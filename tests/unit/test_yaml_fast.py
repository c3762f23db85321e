"""The fast reader of plain YAML (``registry._yaml_fast``) against libyaml's path.

Whatever it reads must come out exactly as libyaml and the builders make it (types
included: ``1``, ``1.0`` and ``true`` are not the same value), and whatever libyaml's
path refuses or reports it must leave alone (answer None), so that every problem keeps
its message and file:line:col.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from registry._yaml_fast import read_plain
from registry.errors import ManifestError
from registry.yamlsrc import DEFAULT_LIMITS, Limits, _build_root, _compose, parse_yaml

REPO = Path(__file__).resolve().parents[2]


def typed(value: Any) -> Any:
    """``value`` with every scalar's type made part of it (so ``1 != True != 1.0``)."""
    if isinstance(value, dict):
        return {k: typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [typed(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return ("float", "nan")
    return (type(value).__name__, value)


def libyaml(text: str, limits: Limits = DEFAULT_LIMITS) -> tuple[bool, Any]:
    """(whether libyaml's path accepts ``text``, its data)."""
    try:
        return True, _build_root(limits, _compose(text), text)
    except Exception:  # noqa: BLE001 - any refusal: YAML errors and the builders' own
        return False, None


def agree(text: str, limits: Limits = DEFAULT_LIMITS) -> Any:
    fast = read_plain(text, limits.max_depth, limits.max_nodes)
    ok, slow = libyaml(text, limits)
    if fast is not None:
        assert ok, f"libyaml refuses what the fast reader took:\n{text}"
        assert typed(fast) == typed(slow), text
    return fast


MANIFEST = """\
# a comment line
apiVersion: modelreg/v1
kind: ModelVersion
metadata:
  name: m0001   # trailing comment
  version: 1.0.0
  labels:
    trained-by: vision
    example.com/team: "vision"
spec:
  artifact:
    path: 'models/m0001/1.0.0.onnx'
    format: onnx
  description: It's a "model", see http://x.invalid/a:b
  signature:
    inputs:
      - name: input
        dtype: float32
        shape: [batch, 3, 224, 224]
    outputs:
    - name: logits
      shape: []
  metrics: {accuracy: 0.93, loss: -1.5e-3}
  flags: [yes, no, on, ~, null, 0x1F, 1_000, .nan, 2024-05-01]
  minutes: 1:30
  empty:
  quoted: ''
  single: 'it''s'
  list:
    -
      a: 1
    -
    - x
  tail: end
"""


def test_a_manifest_in_the_plain_corner_is_read_fast_and_the_same() -> None:
    data = agree(MANIFEST)
    assert data is not None
    spec = data["spec"]
    assert spec["signature"]["outputs"] == [{"name": "logits", "shape": []}]
    assert spec["flags"][:7] == [True, False, True, None, None, 31, 1000]
    assert math.isnan(spec["flags"][7])
    assert spec["flags"][8] == "2024-05-01"
    assert spec["minutes"] == 90
    assert spec["single"] == "it's"
    assert spec["list"] == [{"a": 1}, None, "x"]
    assert data["metadata"]["name"] == "m0001"


def test_every_manifest_of_the_repository_is_read_fast() -> None:
    files = sorted(REPO.glob("manifests/*/model.yaml")) + sorted(
        REPO.glob("manifests/*/versions/*.yaml")
    )
    assert files
    for file in files:
        assert agree(file.read_text(encoding="utf-8")) is not None, file


@pytest.mark.parametrize(
    "text",
    [
        "a: 1\na: 2\n",  # duplicate key
        "a:\n\tb: 1\n",  # tab
        "",
        "# only a comment\n",
        "- a\n- b\n",  # not a mapping
        "a: &x [1]\nb: *x\n",
        "a: 1\n---\nb: 2\n",
        "---\na: 1\n",
        "1: x\n",
        "yes: x\n",
        "2024-05-01: x\n",
        "a: {yes: 1}\n",
        "? [a]\n: x\n",
        "a: !!binary aGk=\n",
        "<<: {a: 1}\n",
        "a: =\n",
        "a: \u00e9\n",
        "a: [1, 2\n",
        "a: |\n  text\n",
        "a: >\n  text\n",
        "a: b: c\n",
        "a: b:\n",
        "a: plain\n  continued\n",
        "a:\n  b: 1\n c: 2\n",
        "a:\n  - x\n  b: 1\n",
        "a:\n- x\n  - y\n",
        "a: - x\n",
        "a: [a, ]\n",
        "a: [[1]]\n",
        "a: {b: 1, b: 2}\n",
        'a: "x\\ny"\n',
        'a: "x" y\n',
        "a: 'x\n",
        "a: @x\n",
        "a: %x\n",
        "a: `x`\n",
        "a:\r\n  b: 1\r\n",
        "  a: 1\n",
        "a: 1\n...\n",
        "- - x\n",
        "key:value\n",
    ],
)
def test_what_it_leaves_to_libyaml(text: str) -> None:
    assert agree(text) is None


def test_limits_are_left_to_libyaml_which_reports_them() -> None:
    deep = "".join(f"{'  ' * i}k{i}:\n" for i in range(40)) + "  " * 40 + "v: 1\n"
    assert agree(deep) is None
    many = "a: [" + "1, " * 200 + "1]\n"
    assert agree(many, Limits(max_nodes=100)) is None
    with pytest.raises(ManifestError, match="more than 100 YAML nodes"):
        parse_yaml(many.encode(), "f.yaml", Limits(max_nodes=100))
    assert agree("a: 1\n", Limits(max_depth=1)) is None


def test_positions_are_libyamls_for_a_document_read_fast() -> None:
    text = "a: 1\nb:\n  - x\n  - {c: true}\n"
    assert read_plain(text, 32, 1000) is not None
    doc = parse_yaml(text.encode(), "f.yaml")
    assert doc.value_marks[("b", 1, "c")] == (4, 9)
    assert doc.scalar_text[("a",)] == "1"


_KEYS = st.sampled_from(["a", "b", "name", "x.y/z", "yes", "1", "2024-01-01", "k-1", "_", "a b"])
_VALUES = st.sampled_from(
    [
        "", "1", "1.0.0", "0.93", "-1", "-x", "- x", "-", "yes", "No", "~", "null", "1:30",
        "0x1F", "0o7", "1_0", ".inf", "2024-05-01", "2024-05-01 10:00:00", "x #c", "#c",
        "a: b", "a:b", "x:", "'q''s'", "'q", '"q"', '"a\\tb"', '""', "[a, 1]", "[]", "[a,]",
        "[a, [b]]", "{k: v}", "{}", "{k: 1, k: 2}", "{k:v}", "{yes: 1}", "[a: b]", "[x #y]",
        "|", ">-", "&a x", "*a", "!x y", "?", ": x", ",x", "%x", "@x", "`x", "=", "<<",
        "http://a.b/c", "a  b", "it's", 'say "hi"', "[ a , b ]", "{ k: v }",
    ]
)  # fmt: skip
_LINES = st.one_of(
    st.tuples(st.integers(0, 6), st.booleans(), _KEYS, _VALUES).map(
        lambda t: " " * t[0] + ("- " if t[1] else "") + f"{t[2]}:" + (f" {t[3]}" if t[3] else "")
    ),
    st.tuples(st.integers(0, 6), _VALUES).map(lambda t: " " * t[0] + "- " + t[1]),
    st.tuples(st.integers(0, 6), _VALUES).map(lambda t: " " * t[0] + t[1]),
    st.sampled_from(["", "# c", "  # c", "---", "...", "-", "  -"]),
)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_LINES, min_size=1, max_size=12))
def test_never_disagrees_with_libyaml(lines: list[str]) -> None:
    agree("\n".join(lines) + "\n")


@settings(max_examples=300, deadline=None)
@given(st.lists(_LINES, min_size=1, max_size=12))
def test_parse_yaml_gives_libyamls_data_or_problems(lines: list[str]) -> None:
    text = "\n".join(lines) + "\n"
    assume("&" not in text and "*" not in text)  # parse_yaml's event scan refuses them
    ok, slow = libyaml(text)
    try:
        data = parse_yaml(text.encode(), "f.yaml").data
    except ManifestError:
        assert not ok
        return
    assert ok
    assert typed(data) == typed(slow)


_PLAIN_VALUES = st.sampled_from(
    [
        "", "1", "1.0.0", "0.93", "-1", "-x", "yes", "~", "1:30", "0x1F", "2024-05-01", "x #c",
        "a:b", "'q''s'", '"q"', '""', "[a, 1]", "[]", "{k: v}", "{}", "http://a.b/c", "a  b",
        "it's", "[ a , b ]", "{ k: 1.5, j: x }",
    ]
)  # fmt: skip
_PLAIN_KEYS = st.sampled_from(["a", "b", "name", "x.y/z", "k-1", "_"])
_TREES = st.recursive(
    st.one_of(_PLAIN_VALUES, _PLAIN_VALUES, _PLAIN_VALUES, _VALUES),
    lambda inner: st.one_of(
        st.lists(inner, min_size=1, max_size=4),
        st.dictionaries(st.one_of(_PLAIN_KEYS, _PLAIN_KEYS, _KEYS), inner, min_size=1, max_size=4),
    ),
    max_leaves=12,
)


def _render(node: Any, indent: int, style: st.DataObject) -> list[str]:
    """Block YAML for a tree of raw scalar texts, in styles drawn by hypothesis."""
    pad = " " * indent
    lines: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if isinstance(value, str):
                lines.append(f"{pad}{key}:" + (f" {value}" if value else ""))
                continue
            lines.append(f"{pad}{key}:" + style.draw(st.sampled_from(["", "  # note"])))
            step = (
                0
                if isinstance(value, list) and style.draw(st.booleans())
                else style.draw(st.integers(1, 4))
            )
            lines += _render(value, indent + step, style)
        return lines
    if isinstance(node, list):
        for item in node:
            if isinstance(item, str):
                lines.append(f"{pad}-" + (f" {item}" if item else ""))
            elif isinstance(item, dict) and style.draw(st.booleans()):
                inner = _render(item, indent + 2, style)  # "- key: value" compact form
                lines += [f"{pad}- {inner[0].lstrip(' ')}", *inner[1:]]
            else:
                lines.append(f"{pad}-")
                lines += _render(item, indent + style.draw(st.integers(1, 4)), style)
        return lines
    return [f"{pad}{node}"]  # pragma: no cover - the root is always a mapping


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(_PLAIN_KEYS, _TREES, min_size=1, max_size=5), st.data())
def test_rendered_trees_agree_with_libyaml(tree: dict[str, Any], data: st.DataObject) -> None:
    agree("\n".join(_render(tree, 0, data)) + "\n")


_SCALAR_TEXT = st.one_of(
    st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=12),
    st.from_regex(r"[-+]?[0-9_]{1,6}(\.[0-9_]{0,6})?([eE][-+]?[0-9]{1,3})?", fullmatch=True),
    st.sampled_from(["0", "00", "07", "08", "0.5", "1.", ".5", "1e3", "True", "off", "Null"]),
)


@settings(max_examples=400, deadline=None)
@given(_SCALAR_TEXT)
def test_scalar_types_are_libyamls(text: str) -> None:
    """The reader's shortcuts for strings and plain numbers type a scalar exactly as
    libyaml's resolver and constructors do (or leave it to them)."""
    assume(":" not in text and "#" not in text)
    agree(f"key: {text}\n")
    agree(f"key: [{text}]\n")


@pytest.mark.parametrize("text", ["a: 1{n}\n", "1{n}: x\n", "a: [1{n}]\n", "a: {{k: 1{n}}}\n"])
def test_an_integer_past_pythons_digit_limit_is_libyamls_to_report(text: str) -> None:
    """int() refuses over 4,300 digits: the reader leaves such a scalar to libyaml's
    path, which reports it at its place (never an exception of another kind)."""
    raw = text.format(n="1" * 4400)
    assert read_plain(raw, DEFAULT_LIMITS.max_depth, DEFAULT_LIMITS.max_nodes) is None
    with pytest.raises(ManifestError) as caught:
        parse_yaml(raw.encode(), "f.yaml")
    assert caught.value.problems[0].line == 1
