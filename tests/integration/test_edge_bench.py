"""The edge update benchmark runs at its quick size and reports what ``make bench``
prints (keeps it honest: it must time real installs, full and by delta)."""

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
    result = edge_update.run(quick=True)
    latency = result["latency_s"]
    assert min(latency["floor"], latency["full"], latency["delta"]) > 0
    assert set(result["stages_ms"]["delta"]) >= {"fetch", "apply_delta", "build", "commit"}
    assert "apply_delta" not in result["stages_ms"]["full"]
    assert result["bytes"]["delta_fetched"] >= result["bytes"]["delta_signed"]
    assert result["idle_poll"]["connections"] == 1
    names = [g["name"] for g in result["goals"]]
    assert names == [
        "full update / floor",
        "delta update / full update",
        "delta bytes fetched / signed delta",
        "idle poll round trips",
        "idle poll KB on the git host",
    ]
    assert all(g["indicative"] for g in result["goals"])
    assert "device update of mlp 1.1.0" in render(result)
