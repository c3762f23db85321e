"""Everyday work, round two (issue 27): what stood in the way of a new user with real
exports, each on a real repository through the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import onnx
import pytest
import yaml
from onnx import TensorProto, helper

from tests.conftest import git

pytestmark = pytest.mark.integration


def _torch_like_export(path: Path) -> Path:
    """A detector head as ``torch.onnx.export`` writes its dimensions: named inputs, and
    outputs whose sizes are expressions of them (``floor(height/2 - 1/2)``), one too
    long to be a name, one written ``-1``."""
    x = helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, "height", "width"])
    pooled = helper.make_tensor_value_info(
        "output0",
        TensorProto.FLOAT,
        [
            "batch",
            3,
            "floor(height/2 - 1/2) + 1",
            "(floor(floor(width/2 - 1/2)/2 - 1/2) + 1)*(floor(floor(width/2 - 1/2)/2 - 1/2) + 1)",
        ],
    )
    pool = helper.make_node("MaxPool", ["images"], ["output0"], kernel_shape=[2, 2], strides=[2, 2])
    model = helper.make_model(
        helper.make_graph([pool], "det", [x], [pooled]),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    model.ir_version = 8
    model.graph.output[0].type.tensor_type.shape.dim[1].dim_value = -1
    onnx.save(model, path)
    return path


def test_a_pytorch_export_with_expression_dims_is_declared(
    repo: Path, tmp_path: Path, cli: Any
) -> None:
    """Bug 1: ``version add`` refused a real export (``output 'output0' cannot be
    declared: Input should be a valid integer``).  Now an expression dimension is
    recorded unnamed, a plain name kept."""
    artifact = _torch_like_export(tmp_path / "det.onnx")
    assert cli("model", "add", "det", cwd=repo).code == 0
    r = cli("version", "add", "det", "1.0.0", "--artifact", str(artifact), cwd=repo)
    assert r.code == 0, r.err
    model = yaml.safe_load((repo / "manifests/det/model.yaml").read_text())
    signature = model["spec"]["signature"]
    assert signature["inputs"][0]["shape"] == ["batch", 3, "height", "width"]
    assert signature["outputs"][0]["shape"] == ["batch", None, None, None]
    git(repo, "add", "-A")
    assert cli("validate", cwd=repo).code == 0


def test_list_exits_1_when_a_manifest_does_not_load(mlp_repo: Path, cli: Any) -> None:
    """Bug 2: ``list`` printed what loaded and exited 0; ``status`` and ``show`` exit 1."""
    assert cli("list", cwd=mlp_repo).code == 0
    version = mlp_repo / "manifests/mlp/versions/1.1.0.yaml"
    version.write_text(version.read_text() + "bogus: 1\n")
    r = cli("list", cwd=mlp_repo)
    assert r.code == 1
    assert "mlp" in r.out  # what loaded is still listed
    assert "manifests/mlp/versions/1.1.0.yaml:" in r.err
    assert "unknown key 'bogus'" in r.err
    assert cli("list", "--json", cwd=mlp_repo).code == 1


def test_waves_from_the_cli_and_a_hold_everyone_sees(mlp_repo: Path, cli: Any) -> None:
    """Point 10: ``promote --waves --stop-failures --min-reports`` stages a rollout in
    waves; ``fleet hold`` / ``fleet resume`` stage a hold and its lifting; the hold
    shows in ``show NAME@C``, ``list``, ``status`` and ``history``."""
    r = cli("promote", "mlp", "1.1.0", "-c", "canary", "--waves", "10:1h,50:4h,100",
            "--stop-failures", "5%", "--min-reports", "3", cwd=mlp_repo)  # fmt: skip
    assert r.code == 0, r.err
    assert "at 10% (wave 1 of 3; modelreg fleet advance takes the next)" in r.out
    model_yaml = mlp_repo / "manifests/mlp/model.yaml"
    canary = yaml.safe_load(model_yaml.read_text())["spec"]["channels"]["canary"]
    assert canary == {
        "version": "1.1.0",
        "rollout": {
            "percent": 10,
            "waves": [
                {"percent": 10, "soak": "1h"},
                {"percent": 50, "soak": "4h"},
                {"percent": 100},
            ],
            "stop": {"failure_share": 0.05, "min_reports": 3},
        },
    }
    assert "manifests/mlp/model.yaml" in git(mlp_repo, "diff", "--cached", "--name-only")
    git(mlp_repo, "commit", "-qm", "canary in waves")
    held = cli(
        "fleet", "hold", "mlp", "-c", "canary", "--reason", "p99 up 3x on cams", cwd=mlp_repo
    )
    assert held.code == 0, held.err
    assert "mlp canary rollout of 1.1.0 held (p99 up 3x on cams)" in held.out
    assert "manifests/mlp/model.yaml" in git(mlp_repo, "diff", "--cached", "--name-only")
    git(mlp_repo, "commit", "-qm", "hold canary")
    shown = cli("show", "mlp", cwd=mlp_repo)
    assert "canary=1.1.0 (10%) [held: p99 up 3x on cams]" in shown.out
    assert "canary=1.1.0 (10%) [held: p99 up 3x on cams]" in cli("list", cwd=mlp_repo).out
    assert "canary (10%) held" in cli("status", cwd=mlp_repo).out
    again = cli(
        "fleet", "hold", "mlp", "-c", "canary", "--reason", "p99 up 3x on cams", cwd=mlp_repo
    )
    assert "already on hold" in again.out
    resumed = cli("fleet", "resume", "mlp", "-c", "canary", cwd=mlp_repo)
    assert resumed.code == 0, resumed.err
    assert "rollout of 1.1.0 resumed" in resumed.out
    git(mlp_repo, "commit", "-qm", "resume canary")
    history = cli("history", "mlp", "-c", "canary", "--json", cwd=mlp_repo)
    kinds = [e["kind"] for e in json.loads(history.out)["events"]]
    assert kinds[:2] == ["hold lifted", "hold"]
    # what is refused, with one line each
    bad = cli("promote", "mlp", "1.1.0", "-c", "canary", "--waves", "ten", cwd=mlp_repo)
    assert bad.code != 0
    assert "--waves: 'ten' is not PERCENT[:SOAK]" in bad.err
    both = cli("promote", "mlp", "1.1.0", "-c", "canary", "--waves", "10,100", "--percent", "5",
               cwd=mlp_repo)  # fmt: skip
    assert "give --percent or --waves, not both" in both.err
    no_waves = cli("fleet", "hold", "mlp", "-c", "production", "--reason", "x", cwd=mlp_repo)
    assert no_waves.code == 1
    assert "no rollout to hold" in no_waves.err or "has no channel" in no_waves.err


def test_promote_declares_a_shadow_comparison_and_waves_that_read_it(
    mlp_repo: Path, cli: Any
) -> None:
    """Issue 29: ``promote --shadow --stop-agreement --stop-drift --stop-p99`` writes the
    channel's shadow and the behaviour stop conditions; the stop conditions without a
    shadow are refused with what to add, and nothing is written."""
    model_yaml = mlp_repo / "manifests/mlp/model.yaml"
    before = model_yaml.read_text()
    alone = cli("promote", "mlp", "1.1.0", "-c", "canary", "--waves", "10:1h,100",
                "--stop-agreement", "95%", cwd=mlp_repo)  # fmt: skip
    assert alone.code == 1
    assert "declare shadow: {sample: 0.05} on the channel" in alone.err
    assert model_yaml.read_text() == before
    r = cli("promote", "mlp", "1.1.0", "-c", "canary", "--waves", "10:1h,100",
            "--shadow", "5%", "--stop-agreement", "95%", "--stop-drift", "0.05",
            "--stop-p99", "1.5", cwd=mlp_repo)  # fmt: skip
    assert r.code == 0, r.err
    canary = yaml.safe_load(model_yaml.read_text())["spec"]["channels"]["canary"]
    assert canary["shadow"] == {"sample": 0.05}
    assert canary["rollout"]["stop"] == {
        "min_agreement": 0.95, "max_output_drift": 0.05, "max_p99_ratio": 1.5,
    }  # fmt: skip
    assert cli("validate", cwd=mlp_repo).code == 0
    # a later promotion keeps the channel's shadow (and its own settings)
    model_yaml.write_text(model_yaml.read_text().replace("{sample: 0.05}",
                                                         "{sample: 0.05, after: 10m}"))  # fmt: skip
    again = cli("promote", "mlp", "1.0.0", "-c", "canary", "--force", cwd=mlp_repo)
    assert again.code == 0, again.err
    kept = yaml.safe_load(model_yaml.read_text())["spec"]["channels"]["canary"]
    assert kept["shadow"] == {"sample": 0.05, "after": "10m"}
    bad = cli("promote", "mlp", "1.1.0", "-c", "canary", "--shadow", "0", cwd=mlp_repo)
    assert bad.code != 0
    assert "--shadow must be a share above 0" in bad.err


def test_authoring_warnings_name_what_a_reviewer_would_ask(
    mlp_repo: Path, tmp_path: Path, cli: Any, example_models: Path
) -> None:
    """Point 13: a version without goldens and an artifact byte-identical to a declared
    version are declared, each with one warning line (exit 0); with goldens and new
    bytes, no warning."""
    same = tmp_path / "same.onnx"
    same.write_bytes((example_models / "mlp/1.1.0.onnx").read_bytes())
    r = cli("version", "add", "mlp", "1.2.0", "--artifact", str(same), cwd=mlp_repo)
    assert r.code == 0, r.err
    warnings = [line for line in r.err.splitlines() if line.startswith("warning: ")]
    assert warnings == [
        (
            "warning: mlp 1.2.0 has no goldens: devices will only check that it loads (record "
            "expected outputs with --golden-inputs FILE)"
        ),
        (
            "warning: the artifact of mlp 1.2.0 is byte-identical to mlp 1.1.0's "
            "(models/mlp/1.1.0.onnx): the same model under a new version"
        ),
    ]
    fresh = cli("version", "add", "mlp", "2.0.0", "--artifact", str(example_models / "mlp/2.0.0.onnx"),
                "--golden-inputs", str(example_models / "mlp/2.0.0.inputs.npz"), "--json", cwd=mlp_repo)  # fmt: skip
    assert fresh.code == 0, fresh.err
    assert json.loads(fresh.out)["warnings"] == []


def test_validate_warns_of_goldens_that_compare_floats_exactly(mlp_repo: Path, cli: Any) -> None:
    """Point 13: a golden case with rtol 0 and atol 0 on float outputs is valid, and
    validate says, at its line, that a device with other kernels can fail it; a stored
    result (the unchanged tree) says it again; a path selection keeps the file's own."""
    path = mlp_repo / "manifests/mlp/versions/1.0.0.yaml"
    text = path.read_text()
    assert "  goldens:\n" in text
    assert "rtol" not in text
    path.write_text(text.replace("  goldens:\n", "  goldens:\n    rtol: 0\n    atol: 0\n"))
    line = 1 + path.read_text().splitlines().index("  goldens:")
    warning = (
        f"manifests/mlp/versions/1.0.0.yaml:{line}:3: spec.goldens: warning: golden case "
        "'default' compares float output probs exactly (rtol 0, atol 0); a device whose "
        "kernels differ (another CPU, weights shared with the previous version, TensorRT) "
        "can fail it and refuse the version: set a tolerance (the default is rtol 1e-4, "
        "atol 1e-5)"
    )
    for _ in range(2):  # computed, then the stored result of the unchanged tree
        r = cli("validate", cwd=mlp_repo)
        assert r.code == 0, r.err
        assert r.out.startswith("valid: ")
        assert r.err.splitlines() == [warning]
    shown = cli("validate", "--json", cwd=mlp_repo)
    assert shown.code == 0
    report = json.loads(shown.out)
    assert report["ok"] is True
    assert [w["text"] for w in report["warnings"]] == [warning]
    assert cli("validate", "manifests/mlp/versions/1.0.0.yaml", cwd=mlp_repo).err.splitlines() == [
        warning
    ]
    assert cli("validate", "manifests/mlp/model.yaml", cwd=mlp_repo).err == ""
    # A tolerance on the case itself mends it; so would any non-zero one.
    path.write_text(path.read_text().replace("    rtol: 0\n", "    rtol: 1.0e-6\n"))
    assert cli("validate", cwd=mlp_repo).err == ""


def test_the_demo_ends_by_saying_how_to_put_modelreg_on_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Point 15: the README's tour runs ``modelreg``; ``make demo`` ran it from .venv."""
    import sys

    from modelreg.demo import path_hint

    bin_dir = Path(sys.executable).parent
    monkeypatch.setenv("PATH", "/nonexistent")
    assert path_hint() == (
        f"To run the README's tour, put modelreg on your PATH: source {bin_dir / 'activate'}"
        f" (or export PATH={bin_dir}:$PATH)"
    )
    monkeypatch.setenv("PATH", str(bin_dir))
    assert path_hint() == "modelreg is on your PATH: the README's tour runs as written"
