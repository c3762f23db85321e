"""The edge update benchmark runs at its quick size and reports what ``make bench``
prints (keeps it honest: it must time real installs, whole and by tensors)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def test_the_edge_update_benchmark_times_real_installs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from benchmarks import edge_update
    from benchmarks.__main__ import render

    monkeypatch.setattr(edge_update, "BENCH_DIR", tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text(
        "[user]\n\tname = bench\n\temail = bench@example.invalid\n[init]\n\tdefaultBranch = main\n"
    )
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(home / ".gitconfig"))
    monkeypatch.setattr(edge_update, "RESULTS", tmp_path / "results")
    result = edge_update.run(quick=True)
    mlp, one = result["mlp"], result["one_tensor"]
    # the fine-tune comes as tensors: only what changed is fetched, nothing is rebuilt
    assert mlp["path"] == {"full": "full", "tensors": "tensors", "tensors, prepack on": "tensors"}
    assert "layout" in mlp["stages_ms"]["tensors"]
    assert "apply_delta" not in mlp["stages_ms"]["tensors"]
    assert mlp["bytes_fetched"]["tensors"] < mlp["bytes_fetched"]["full"] / 2
    assert (
        one["changed_bytes"] <= one["bytes_fetched"]["tensors"] < 1.1 * one["changed_bytes"] + 65536
    )
    assert min(mlp["latency_s"].values()) > 0
    # timed, not compared: at the quick size the two floors are within this machine's noise
    assert min(mlp["floor_s"].values()) > 0
    # the sweep: every size and share, both paths; a whole new model takes the file
    points = {(p["size"], p["version"]) for p in result["sweep"]}
    assert len(points) == len(result["sweep"]) >= 6
    assert all(p["tensors_path"] == "full" for p in result["sweep"] if p["changed_share"] == 1.0)
    assert (tmp_path / "results/edge_update_sweep.quick.svg").read_text().startswith("<?xml")
    assert result["idle_poll"]["connections"] == 1
    assert len(result["goals"]) == 8
    assert all(g["indicative"] for g in result["goals"])
    assert "whole and by tensors" in render(result)
