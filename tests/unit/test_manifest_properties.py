"""Property tests of manifest loading and editing.

* Any mutation of a valid manifest either still loads or fails with ``ManifestError``
  problems that name the file and point inside it: no other exception escapes.
* ``registry.edit.set_channel`` output always loads, serves what was asked, and leaves
  every line outside the ``channels`` block untouched.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from registry.edit import set_channel
from registry.errors import ManifestError
from registry.loader import load_manifest
from registry.render import render_model
from registry.schema import DNS_LABEL_RE, RegisteredModel
from registry.yamlsrc import parse_yaml

MODEL_FILE = "manifests/mlp/model.yaml"
VERSION_FILE = "manifests/mlp/versions/1.1.0.yaml"

MODEL_YAML = """\
# The example classifier.
apiVersion: modelreg/v1
kind: RegisteredModel
metadata:
  name: mlp
  labels:
    team: vision
spec:
  description: A small classifier.
  owner: ml@example.com
  task: classification
  signature:
    inputs:
      - name: input
        dtype: float32
        shape: [batch, 16]
    outputs:
      - name: probs
        dtype: float32
        shape: [batch, 4]
  channels:
    canary:
      version: 1.1.0
      rollout: {percent: 10}
    production: 1.0.0  # promoted after the canary soaked
  targets:
    - cpu
    - jetson
  promotion:
    order: [canary, production]
    branch: main
    approvals: 1
"""

VERSION_YAML = """\
apiVersion: modelreg/v1
kind: ModelVersion
metadata:
  name: mlp
  version: 1.1.0
spec:
  artifact:
    path: models/mlp/1.1.0.onnx
    format: onnx
  parent: 1.0.0
  description: "Fine-tuned head."
  source:
    run: runs/42
    datasets:
      - s3://data/train
  metrics:
    accuracy: 0.93
  goldens:
    rtol: 0.0001
    cases:
      - name: smoke
        inputs:
          input:
            dtype: float32
            shape: [1, 2]
            data: [0.5, 1.0]
        outputs: goldens/mlp/1.1.0.outputs.npz
  targets:
    - name: cpu
      engine: onnxruntime
      providers: [CPUExecutionProvider]
    - name: jetson
      selector:
        arch: arm64
      engine: tensorrt
      precision: fp16
"""

# Explaining a failure reruns it many times; the shrunk example says enough.
NO_EXPLAIN = tuple(p for p in Phase if p is not Phase.explain)

BASES = {
    "model": (MODEL_YAML, MODEL_FILE, "RegisteredModel"),
    "version": (VERSION_YAML, VERSION_FILE, "ModelVersion"),
}

# Characters and fragments that YAML gives a meaning to, plus text a hand edit or a
# broken editor can leave behind (tabs, a BOM, non-ASCII, line separators).
TOKENS = st.sampled_from(
    [
        *"\t :[]{}'\"#&*!|>-,?%@`\\\n",
        *("é", "日本", "\u2028", "\x85", "\ufeff", "\x00", "\r\n"),
        *("0", "1.0", "-1", "150", "1e3", ".nan", "null", "~", "yes", "on"),
        *("!!int ", "!!bool ", "!!float ", "!!str ", "!!python/object ", "&a ", "*a", "<<: "),
        *("{a: 1}", "[1, 2]", "- ", "---", "..."),
    ]
)
RANDOM_TEXT = st.lists(TOKENS | st.characters(codec="utf-8"), max_size=6).map("".join)
KEYS = ["foo", "versio", "rollout", "percent", "name", "spec", "channels", "- x", "kind"]
OPS = ["delete", "duplicate", "swap", "scalar", "insert", "indent", "truncate", "key"]
MUTATION = st.tuples(st.sampled_from(OPS), st.integers(0, 1000), st.integers(0, 1000), RANDOM_TEXT)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def mutate(text: str, ops: list[tuple[str, int, int, str]]) -> str:
    """Apply line-level mutations; indices are taken modulo the current size."""
    lines = text.split("\n")
    for op, a, b, fragment in ops:
        lines = lines or [""]
        i, j = a % len(lines), b % len(lines)
        line = lines[i]
        if op == "delete":
            del lines[i]
        elif op == "duplicate":
            lines.insert(i, line)
        elif op == "swap":
            lines[i], lines[j] = lines[j], line
        elif op == "scalar":
            head, colon, _ = line.partition(":")
            if colon:
                lines[i] = f"{head}: {fragment}"
            elif line.lstrip().startswith("- "):
                lines[i] = " " * _indent(line) + "- " + fragment
            else:
                lines[i] = " " * _indent(line) + fragment
        elif op == "insert":
            at = b % (len(line) + 1)
            lines[i] = line[:at] + fragment + line[at:]
        elif op == "indent":
            lines[i] = " " * (b % 9) + line.lstrip(" ")
        elif op == "truncate":
            joined = "\n".join(lines)
            lines = joined[: a * len(joined) // 1000].split("\n")
        else:  # key
            key = KEYS[b % len(KEYS)]
            lines.insert(i, " " * _indent(line) + f"{key}: {fragment}")
    return "\n".join(lines)


def _line_count(text: str) -> int:
    """Lines as git and editors count them: separated by LF only."""
    return text.count("\n") + (1 if text and not text.endswith("\n") else 0)


def assert_loads_or_fails_cleanly(text: str, file: str, kind: str) -> None:
    """The loader's contract on arbitrary text: a manifest, or located ManifestError."""
    try:
        manifest = load_manifest(parse_yaml(text.encode("utf-8"), file), kind)
    except ManifestError as e:
        problems = e.problems
    else:
        assert manifest.kind == kind  # type: ignore[attr-defined]
        return
    bound = max(1, _line_count(text) + 1)
    for problem in problems:
        assert problem.file == file
        printed = str(problem)
        assert "\n" not in printed, f"problem spans lines: {printed!r}"
        assert "\r" not in printed, f"problem spans lines: {printed!r}"
        if problem.line is not None:
            assert 1 <= problem.line <= bound, f"{printed!r}: line outside 1..{bound}"
            assert problem.col is None or problem.col >= 1, printed


@pytest.mark.parametrize("base", sorted(BASES))
def test_bases_are_valid(base: str) -> None:
    text, file, kind = BASES[base]
    manifest = load_manifest(parse_yaml(text.encode(), file), kind)
    assert manifest.kind == kind  # type: ignore[attr-defined]


@settings(max_examples=300, deadline=None, phases=NO_EXPLAIN)
@given(base=st.sampled_from(sorted(BASES)), ops=st.lists(MUTATION, min_size=1, max_size=4))
def test_mutated_manifests_load_or_fail_cleanly(
    base: str, ops: list[tuple[str, int, int, str]]
) -> None:
    text, file, kind = BASES[base]
    assert_loads_or_fails_cleanly(mutate(text, ops), file, kind)


@pytest.mark.parametrize(
    ("base", "find", "replace"),
    [
        pytest.param("model", "approvals: 1", "approvals: !!int one", id="int-tag"),
        pytest.param("model", "approvals: 1", "approvals: !!int", id="empty-int-tag"),
        pytest.param("version", "accuracy: 0.93", "accuracy: !!float high", id="float-tag"),
        pytest.param("model", "branch: main", "branch: !!bool maybe", id="bool-tag"),
        pytest.param("model", "kind: RegisteredModel", "kind: {a: b}", id="kind-mapping"),
        pytest.param("version", "kind: ModelVersion", "kind: [ModelVersion]", id="kind-list"),
        pytest.param(
            "version", "  parent: 1.0.0", '  "notes\\n::error::injected": x', id="newline-key"
        ),
        pytest.param("model", "    team: vision", '    "team\\r": vision', id="cr-key"),
        pytest.param("model", "  owner: ml@example.com", "  owner: [ml", id="eof-flow"),
        pytest.param("version", "  run: runs/42", '  run: "runs/42', id="eof-quote"),
        pytest.param(
            "version", '"Fine-tuned head."', '"Fine\u2028tuned\u2028head."', id="line-separator"
        ),
        pytest.param(
            "version", "precision: fp16", "precision: \u20280", id="line-separator-at-eof"
        ),
        pytest.param(
            "version",
            "shape: [1, 2]",
            "shape: [0, 100000000000000000000000]",
            id="inline-shape-1e23",
        ),
        pytest.param("version", "accuracy: 0.93", "accuracy: .nan", id="nan-metric"),
        pytest.param("version", "accuracy: 0.93", "accuracy: -.inf", id="inf-metric"),
    ],
)
def test_found_inputs_load_or_fail_cleanly(base: str, find: str, replace: str) -> None:
    """Inputs the property found (kept so that they always run, whatever the seed)."""
    text, file, kind = BASES[base]
    assert find in text
    assert_loads_or_fails_cleanly(text.replace(find, replace), file, kind)


# --- set_channel round trips ---------------------------------------------------------------

RENDERED_YAML = render_model(
    Path("/repo/manifests/mlp/model.yaml"),
    Path("/repo"),
    "mlp",
    owner="ml@example.com",
    targets=["cpu"],
    order=["canary", "production"],
)
EDIT_BASES = {"hand-written": MODEL_YAML, "rendered": RENDERED_YAML}

CHANNEL_NAMES = st.sampled_from(
    ["canary", "production", "beta", "on", "off", "yes", "no", "null", "true", "y", "123", "e5"]
) | st.from_regex(DNS_LABEL_RE, fullmatch=True)
SEMVERS = st.builds(
    lambda a, b, c, pre: f"{a}.{b}.{c}{pre}",
    st.integers(0, 30),
    st.integers(0, 30),
    st.integers(0, 30),
    st.sampled_from(["", "-rc.1", "-alpha", "+build.5", "-rc.2+sha.abc123"]),
)
# The schema allows 3 decimals (1 device in 100,000); finer shares are refused.
PERCENTS = (
    st.none() | st.integers(0, 100) | st.floats(0, 100, allow_nan=False).map(lambda p: round(p, 3))
)


def outside_channels(text: str) -> tuple[list[str], list[str]]:
    """The lines before ``  channels:`` and after its block."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("  channels:"))
    end = start + 1
    while end < len(lines) and (not lines[end].strip() or _indent(lines[end]) > 2):
        end += 1
    return lines[:start], lines[end:]


def _served(model: RegisteredModel) -> dict[str, tuple[str, float | None]]:
    return {
        name: (ch.version, ch.rollout.percent if ch.rollout else None)
        for name, ch in model.spec.channels.items()
    }


def _edit_and_check(base: str, edits: list[tuple[str, str, float | None]]) -> None:
    text = EDIT_BASES[base]
    model = load_manifest(parse_yaml(text.encode(), MODEL_FILE), "RegisteredModel")
    assert isinstance(model, RegisteredModel)
    want = _served(model)
    for channel, version, percent in edits:
        text = set_channel(text, MODEL_FILE, channel, version, percent)
        want[channel] = (version, None if percent is None else float(percent))
    try:
        edited = load_manifest(parse_yaml(text.encode(), MODEL_FILE), "RegisteredModel")
    except ManifestError as e:
        pytest.fail(f"set_channel wrote a manifest that does not load: {e}\n{text}")
    assert isinstance(edited, RegisteredModel)
    assert _served(edited) == want
    assert outside_channels(text) == outside_channels(EDIT_BASES[base])


@settings(max_examples=150, deadline=None, phases=NO_EXPLAIN)
@given(
    base=st.sampled_from(sorted(EDIT_BASES)),
    edits=st.lists(
        st.tuples(CHANNEL_NAMES, SEMVERS, st.none() | st.integers(0, 100)),
        min_size=1,
        max_size=4,
    ),
)
def test_set_channel_round_trips_channel_maps(
    base: str, edits: list[tuple[str, str, float | None]]
) -> None:
    _edit_and_check(base, edits)


@settings(max_examples=150, deadline=None, phases=NO_EXPLAIN)
@given(
    base=st.sampled_from(sorted(EDIT_BASES)),
    channel=st.sampled_from(["canary", "production", "beta"]),
    version=SEMVERS,
    percent=PERCENTS,
)
def test_set_channel_round_trips_rollout_percents(
    base: str, channel: str, version: str, percent: float | None
) -> None:
    _edit_and_check(base, [(channel, version, percent)])


@pytest.mark.parametrize(
    ("channel", "percent"),
    [
        pytest.param("on", None, id="channel-on"),
        pytest.param("no", 50, id="channel-no"),
        pytest.param("canary", 0.001, id="percent-finest"),
    ],
)
def test_set_channel_found_inputs(channel: str, percent: float | None) -> None:
    """Inputs the properties found (kept so that they always run, whatever the seed)."""
    _edit_and_check("hand-written", [(channel, "1.2.0", percent)])


@pytest.mark.parametrize("percent", [1e-05, 5e-324, 12.3456, -1.0, 100.5, float("nan")])
def test_set_channel_refuses_percents_the_schema_cannot_hold(percent: float) -> None:
    # 1e-05 once came back from YAML as the string '1e-05'; such shares are refused up front.
    with pytest.raises(ValueError, match="percent"):
        set_channel(MODEL_YAML, MODEL_FILE, "canary", "1.2.0", percent)


# --- caps and value quoting (issue 8) ------------------------------------------------------


def _version_problems(find: str, replace: str) -> list[str]:
    assert find in VERSION_YAML
    with pytest.raises(ManifestError) as info:
        load_manifest(parse_yaml(VERSION_YAML.replace(find, replace).encode(), VERSION_FILE))
    return [str(p) for p in info.value.problems]


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf", ".NaN"])
def test_metrics_must_be_finite(value: str) -> None:
    assert _version_problems("accuracy: 0.93", f"accuracy: {value}") == [
        f"{VERSION_FILE}:17:15: spec.metrics.accuracy: must be a finite number"
    ]


@pytest.mark.parametrize(
    ("shape", "data", "message"),
    [
        ("[0, 100000000000000000000000]", "[]",
         "dimension 1 is 100000000000000000000000; inline tensors hold at most 65536 values"),
        ("[0, 65537]", "[]", "dimension 1 is 65537; inline tensors hold at most 65536 values"),
        ("[300, 300]", "[]", "shape holds 90000 values; inline tensors hold at most 65536"),
    ],
)  # fmt: skip
def test_inline_golden_shapes_are_capped(shape: str, data: str, message: str) -> None:
    (problem,) = _version_problems("shape: [1, 2]\n            data: [0.5, 1.0]",
                                   f"shape: {shape}\n            data: {data}")  # fmt: skip
    assert problem.startswith(f"{VERSION_FILE}:24:13: spec.goldens.cases[0].inputs.input: ")
    assert message in problem


def test_inline_shape_problem_is_pure_and_uses_its_limits() -> None:
    from registry.schema import INLINE_LIMITS, InlineTensorLimits, inline_shape_problem

    assert inline_shape_problem([0, INLINE_LIMITS.max_elements]) is None
    assert inline_shape_problem([2, 32_768]) is None
    assert inline_shape_problem([2, 32_769]) is not None
    small = InlineTensorLimits(max_elements=4)
    assert inline_shape_problem([2, 2], small) is None
    assert inline_shape_problem([0, 5], small) == (
        "dimension 1 is 5; inline tensors hold at most 4 values (use an .npz file)"
    )


def test_a_long_bad_value_is_quoted_as_a_short_prefix() -> None:
    """A file that is not a manifest (a key, a token) is named, its content is not echoed."""
    secret = "-----BEGIN PRIVATE KEY----- " + "SECRET-CANARY-1234 " * 20
    with pytest.raises(ManifestError) as info:
        load_manifest(parse_yaml(secret.encode(), MODEL_FILE), "RegisteredModel")
    (problem,) = info.value.problems
    assert "SECRET-CANARY-1234" not in str(problem)
    assert str(problem).startswith(f"{MODEL_FILE}:1:1: expected a mapping")
    assert f"({len(secret.strip())} characters)" in str(problem)


@pytest.mark.parametrize(
    ("find", "replace"),
    [
        ("version: 1.1.0", "version: 1.1.0." + "x" * 40 + "SECRET-CANARY-1234"),
        ("path: models/mlp/1.1.0.onnx", "path: /x/" + "y" * 40 + "SECRET-CANARY-1234"),
        ("kind: ModelVersion", "kind: Model" + "y" * 40 + "SECRET-CANARY-1234"),
        ("  parent: 1.0.0", "  " + "k" * 40 + "SECRET-CANARY-1234: 1"),
    ],
)
def test_no_message_echoes_more_than_a_prefix(find: str, replace: str) -> None:
    for line in _version_problems(find, replace):
        assert "SECRET-CANARY-1234" not in line, line
