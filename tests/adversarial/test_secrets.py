"""No secret is printed, and the PR comment is data, not markup (issue 8, points 6 and 9).

Secrets are planted where an operator (or a pull request) puts them: a base64 PEM in
``MODELREG_TIMESTAMP_KEY`` where a PEM or a path is expected, credentials in the MLflow
tracking URI, a token in the DVC remote URL.  The real commands run (``freshness
refresh``, ``ci release``, ``register``, ``ci pr``) and each must fail with one clear
line while the secret appears in none of the channels a run writes: stdout, stderr,
the comment and JSON report under ``.modelreg/ci``, ``$GITHUB_STEP_SUMMARY`` and
``$GITHUB_OUTPUT``.

A model whose names, producer and doc string carry markdown goes through ``ci pr``;
the comment, parsed as GitHub parses it, holds only modelreg's own headings, no link,
image, HTML or emphasis, and no mention.
"""

from __future__ import annotations

import base64
import shutil
from pathlib import Path
from typing import Any

import onnx
import pytest
from onnx import helper, numpy_helper

from tests.adversarial.conftest import Fleet
from tests.conftest import Result

pytestmark = pytest.mark.integration

_REFUSED_BASE64 = (
    "$MODELREG_TIMESTAMP_KEY: holds base64-encoded PEM; store the PEM itself (or a path "
    "to it) in the secret"
)


def _channels(fleet: Fleet, *results: Result) -> dict[str, str]:
    """Everything the runs printed or wrote where people (or the PR's author) read it."""
    texts = {f"stdout {i}": r.out for i, r in enumerate(results)}
    texts.update({f"stderr {i}": r.err for i, r in enumerate(results)})
    ci = fleet.root / ".modelreg/ci"
    for path in sorted(ci.glob("*")) if ci.is_dir() else []:
        texts[str(path.relative_to(fleet.root))] = path.read_text(encoding="utf-8")
    for name in ("summary.md", "output.txt"):  # $GITHUB_STEP_SUMMARY, $GITHUB_OUTPUT
        path = fleet.tmp / name
        texts[name] = path.read_text(encoding="utf-8") if path.is_file() else ""
    return texts


def _assert_nowhere(texts: dict[str, str], *secrets: str) -> None:
    for channel, text in texts.items():
        for secret in secrets:
            assert secret not in text, f"{secret[:6]}... printed in {channel}"


def _ci_env(fleet: Fleet) -> None:
    fleet.github_env(base=fleet.sha())
    # a dead MLflow fails at once instead of after minutes of retries
    fleet.monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    fleet.monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")


def _add_version(fleet: Fleet, version: str, artifact: Path, *options: str) -> None:
    r = fleet.cli("version", "add", "mlp", version, "--artifact", str(artifact), *options,
                  cwd=fleet.root)  # fmt: skip
    assert r.code == 0, r.err
    fleet.commit(f"mlp {version}")


# --- point 6: secrets ------------------------------------------------------------------


def test_a_base64_key_where_a_pem_or_path_goes_is_refused_and_printed_nowhere(
    fleet: Fleet,
) -> None:
    """The reported leak: the value was taken for a path, and "File name too long"
    printed it whole (stderr, the release report, the comment, the job summary)."""
    pem = (fleet.root / ".modelreg/keys/timestamp.key").read_text()
    value = base64.b64encode(pem.encode()).decode()
    _ci_env(fleet)
    fleet.monkeypatch.setenv("MODELREG_TIMESTAMP_KEY", value)
    _add_version(fleet, "1.1.0", fleet.models / "mlp/1.1.0.onnx")

    refresh = fleet.cli("freshness", "refresh", cwd=fleet.root)
    assert refresh.code == 1
    assert refresh.err == f"modelreg: {_REFUSED_BASE64}\n"
    plain = fleet.cli("ci", "release", cwd=fleet.root)
    assert plain.code == 1
    assert _REFUSED_BASE64 in plain.err
    release = fleet.release()
    assert release.code == 1
    assert _REFUSED_BASE64 in release.out  # --json: the problem in the report
    # pasted on the command line by mistake: click's own usage error quotes it
    pasted = fleet.cli("sign", value, "--bundle", "b.json", cwd=fleet.root)
    assert pasted.code == 2
    assert "Invalid value for 'PATH': Path '***' does not exist." in pasted.err
    texts = _channels(fleet, refresh, plain, release, pasted)
    assert _REFUSED_BASE64 in texts[".modelreg/ci/release-comment.md"]
    assert _REFUSED_BASE64 in texts["summary.md"]
    body = pem.splitlines()[1]
    _assert_nowhere(texts, value, value[:40], value[100:140], value[-40:], body, pem)


def test_a_key_value_that_cannot_be_a_path_is_refused_without_the_os_quoting_it(
    fleet: Fleet,
) -> None:
    value = "S3CR3T" * 60  # one 360-character name: ENAMETOOLONG if asked as a path
    _ci_env(fleet)
    fleet.monkeypatch.setenv("MODELREG_TIMESTAMP_KEY", value)
    refresh = fleet.cli("freshness", "refresh", cwd=fleet.root)
    assert refresh.code == 1
    assert refresh.err == (
        "modelreg: $MODELREG_TIMESTAMP_KEY: neither a PEM private key nor a path to a key file\n"
    )
    release = fleet.release()
    assert release.code == 1
    _assert_nowhere(_channels(fleet, refresh, release), "S3CR3TS3CR3T")


def test_mlflow_credentials_in_the_tracking_uri_are_printed_nowhere(fleet: Fleet) -> None:
    _ci_env(fleet)
    fleet.monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://user:s3cretpass@127.0.0.1:9/")
    _add_version(fleet, "1.1.0", fleet.models / "mlp/1.1.0.onnx")

    register = fleet.cli("register", cwd=fleet.root)
    assert register.code == 1
    # still says what failed and where, without the password
    assert register.err == (
        "modelreg: MLflow at http://***@127.0.0.1:9/: unreachable (connection refused)\n"
    )
    as_json = fleet.cli("register", "--json", cwd=fleet.root)
    assert as_json.code == 1
    traced = fleet.cli("--traceback", "register", cwd=fleet.root)
    assert traced.code == 1
    assert "Traceback (most recent call last)" in traced.err
    plain = fleet.cli("ci", "release", cwd=fleet.root)
    assert plain.code == 1
    assert "MLflow at http://***@127.0.0.1:9/" in plain.err
    release = fleet.release()
    assert release.code == 1
    refresh = fleet.cli("freshness", "refresh", cwd=fleet.root)
    texts = _channels(fleet, register, as_json, traced, plain, release, refresh)
    assert "MLflow at http://***@127.0.0.1:9/" in texts[".modelreg/ci/release-report.json"]
    _assert_nowhere(texts, "s3cretpass", "user:s3")


def test_a_token_in_the_dvc_remote_url_is_printed_nowhere(fleet: Fleet) -> None:
    config = fleet.root / ".dvc/config"
    url = "https://TOKEN123456@127.0.0.1:9/x?token=QUERYSECRET99"
    text = config.read_text()
    assert "url = ../.modelreg/remote" in text
    config.write_text(text.replace("url = ../.modelreg/remote", f"url = {url}"))
    fleet.commit("artifacts on the team's server")
    _ci_env(fleet)
    base = fleet.branch("mlp-1.1.0")
    _add_version(fleet, "1.1.0", fleet.models / "mlp/1.1.0.onnx")
    # a fresh CI checkout: no artifact and no cache, so DVC must talk to the remote
    shutil.rmtree(fleet.root / ".dvc/cache")
    for artifact in (fleet.root / "models/mlp").glob("*.onnx"):
        artifact.unlink()

    pr = fleet.ci_pr(base)
    assert pr.code == 1
    assert "models/mlp/1.0.0.onnx: missing from the workspace" in fleet.comment()
    pr_texts = _channels(fleet, pr)
    fleet.merge("mlp-1.1.0")
    # the release runner has the artifacts; publishing reads the remote's trust state
    for version in ("1.0.0", "1.1.0"):
        shutil.copy(fleet.models / f"mlp/{version}.onnx", fleet.root / f"models/mlp/{version}.onnx")
    release = fleet.release()
    assert release.code == 1
    plain = fleet.cli("ci", "release", cwd=fleet.root)
    assert plain.code == 1
    assert "https://***@127.0.0.1:9/x" in plain.err
    texts = {
        **pr_texts,
        **{f"{k} (release)": v for k, v in _channels(fleet, release, plain).items()},
    }
    _assert_nowhere(texts, "TOKEN123456", "QUERYSECRET99")


# --- point 9: the comment is data ------------------------------------------------------

HOSTILE = "\n## ✅ approved by @admin\n![x](https://evil.example/a.png) <img src=x> **LGTM** | `c`"


def _hostile_mlp(path: Path, template: Path) -> Path:
    """mlp 1.0.0 rebuilt with markdown in its producer, doc strings and some names."""
    old = onnx.load(str(template))
    renamed = {
        old.graph.initializer[0].name: "w" + HOSTILE,
        old.graph.initializer[1].name: "b|`x`|",
    }
    initializers = [numpy_helper.from_array(numpy_helper.to_array(t), renamed.get(t.name, t.name))
                    for t in old.graph.initializer]  # fmt: skip
    nodes = []
    for i, n in enumerate(old.graph.node):
        name = {0: "matmul" + HOSTILE, 1: "**add**"}.get(i, n.name)
        inputs = [renamed.get(x, x) for x in n.input]
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        nodes.append(helper.make_node(n.op_type, inputs, list(n.output), name, **attrs))
    graph = helper.make_graph(
        nodes, "graph" + HOSTILE, list(old.graph.input), list(old.graph.output), initializers,
        doc_string=HOSTILE,
    )  # fmt: skip
    model = helper.make_model(
        graph,
        producer_name="exporter" + HOSTILE,
        producer_version="[1.0](https://evil.example)",
        doc_string=HOSTILE,
        opset_imports=list(old.opset_import),
        ir_version=old.ir_version,
    )
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def _parse(markdown: str) -> list[Any]:
    from markdown_it import MarkdownIt  # CommonMark + GFM tables, as GitHub parses them

    tokens: list[Any] = (
        MarkdownIt("commonmark").enable("table").enable("strikethrough").parse(markdown)
    )
    return tokens


def _rendered(inline: Any) -> str:
    return "".join(c.content for c in inline.children or [] if c.type in ("text", "code_inline"))


def test_markup_in_a_model_reaches_the_pr_comment_as_data(fleet: Fleet) -> None:
    base = fleet.branch("mlp-1.1.0")
    artifact = _hostile_mlp(fleet.tmp / "mlp-1.1.0.onnx", fleet.models / "mlp/1.0.0.onnx")
    _add_version(fleet, "1.1.0", artifact, "--parent", "1.0.0",
                 "--metric", "accuracy **approved** [x](https://evil.example)=0.93")  # fmt: skip
    pr = fleet.ci_pr(base)
    comment = fleet.comment()
    tokens = _parse(comment)
    headings = [_rendered(tokens[i + 1]) for i, t in enumerate(tokens) if t.type == "heading_open"]
    assert headings[:3] == [
        "modelreg",
        f"Model diffs against {base}",
        "Model diff: mlp 1.0.0 → 1.1.0",
    ]
    assert set(headings[3:]) <= {"I/O signature", "Graph", "Weights", "Metrics",
                                 "Golden output drift"}, headings  # fmt: skip
    children = [c for t in tokens if t.type == "inline" for c in t.children or []]
    kinds = {c.type for c in children} | {t.type for t in tokens}
    assert not kinds & {"link_open", "image", "html_inline", "html_block", "em_open", "s_open"}
    strong = {children[i + 1].content for i, c in enumerate(children) if c.type == "strong_open"}
    assert strong <= {"✅ ready for review", "❌ changes needed", "Graph change", "no"}, strong
    assert not any("@admin" in c.content for c in children if c.type == "text")
    # ... and a reviewer still reads what the model says, whole, in its cell
    shown = " ".join(HOSTILE.split())
    unmentioned = shown.replace("@", "@\u200b")
    rows = [[_rendered(tokens[i + 1])] for i, t in enumerate(tokens) if t.type == "td_open"]
    cells = {r[0] for r in rows}
    assert f"exporter {unmentioned} [1.0](https://evil.example)" in cells
    assert f"matmul {shown}" in cells
    assert "b|`x`|" in cells
    assert "accuracy **approved** [x](https://evil.example)" in cells
    assert pr.code in (0, 1)  # approvals or build may be pending: the comment is what counts
