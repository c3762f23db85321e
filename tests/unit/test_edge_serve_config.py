"""``edge.yaml``'s ``serve.prepack`` and ``serve.onnxruntime_log`` as an operator
writes them (YAML, not JSON): ``prepack: off`` unquoted, as the README wrote it, is a
YAML boolean and made the daemon exit; it now means what it says."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from edge_sync.config import load_edge_config
from registry.errors import ManifestError
from tests.conftest import REPO_ROOT

CONFIG = """\
apiVersion: modelreg/v1
kind: EdgeConfig
device: {{id: cam-0042}}
repository: {{url: fleet.git}}
trust: {{root: 1.root.json}}
artifacts: {{url: remote}}
models: [{{name: mlp, channel: production}}]
state_dir: state
serve:
  listen: 127.0.0.1:0
  {line}
"""


def _load(tmp_path: Path, line: str) -> object:
    path = tmp_path / "edge.yaml"
    path.write_text(CONFIG.format(line=line))
    return load_edge_config(path).serve


@pytest.mark.parametrize(
    ("written", "meant"),
    [
        ("prepack: off", "off"), ('prepack: "off"', "off"), ("prepack: 'off'", "off"),
        ("prepack: on", "on"), ('prepack: "on"', "on"),
        ("prepack: no", "off"), ("prepack: yes", "on"),
        ("prepack: false", "off"), ("prepack: true", "on"), ("prepack: False", "off"),
        ("prepack: auto", "auto"), ("threads: 1", "auto"),
    ],
)  # fmt: skip
def test_prepack_quoted_or_not_means_the_word(tmp_path: Path, written: str, meant: str) -> None:
    assert getattr(_load(tmp_path, written), "prepack") == meant  # noqa: B009


@pytest.mark.parametrize(
    ("written", "says"),
    [
        ("prepack: sometimes", "edge.yaml:11:12: serve.prepack: "),
        ("prepack: 1", "edge.yaml:11:12: serve.prepack: "),
        ("onnxruntime_log: loud", "edge.yaml:11:20: serve.onnxruntime_log: "),
        ("onnxruntime_log: off", "edge.yaml:11:20: serve.onnxruntime_log: "),
    ],
)
def test_a_bad_value_is_one_line_with_its_position(tmp_path: Path, written: str, says: str) -> None:
    with pytest.raises(ManifestError) as caught:
        _load(tmp_path, written)
    message = str(caught.value)
    assert len(message.splitlines()) == 1, message
    assert says in message, message


def test_onnxruntime_log_levels(tmp_path: Path) -> None:
    assert getattr(_load(tmp_path, "threads: 1"), "onnxruntime_log") == "warning"  # noqa: B009
    for level in ("verbose", "info", "warning", "error", "fatal"):
        serve = _load(tmp_path, f"onnxruntime_log: {level}")
        assert getattr(serve, "onnxruntime_log") == level  # noqa: B009


def test_the_device_guide_config_loads_with_prepack_written_either_way(tmp_path: Path) -> None:
    readme = (REPO_ROOT / "docs/guide/device.md").read_text()
    start = readme.index("   ```yaml\n   apiVersion: modelreg/v1\n   kind: EdgeConfig\n")
    block = readme[start:].split("\n", 1)[1].split("   ```\n", 1)[0]
    text = textwrap.dedent(block)
    assert "prepack: auto" in text
    path = tmp_path / "edge.yaml"
    for written, meant in (("auto", "auto"), ("off", "off"), ('"off"', "off"), ("on", "on")):
        path.write_text(text.replace("prepack: auto", f"prepack: {written}"))
        assert load_edge_config(path).serve.prepack == meant
