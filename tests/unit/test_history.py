"""The pure parts of ``history``: log parsing, channel reading, events; release dating."""

from __future__ import annotations

import json
import time
from pathlib import Path

from registry.history import (
    Assignment,
    LogCommit,
    ModelLog,
    Release,
    channel_map,
    derive_events,
    parse_log,
)
from registry.inspect import suggest
from signing.release_log import first_listed

MODEL = "manifests/mlp/model.yaml"


def _model(channels: str) -> bytes:
    return (
        "apiVersion: modelreg/v1\nkind: RegisteredModel\nmetadata:\n  name: mlp\n"
        f"spec:\n  channels:\n{channels}"
    ).encode()


def _log(*commits: tuple[str, str, str, str, list[tuple[str, str]]]) -> str:
    """What ``git log -z --format=<_FORMAT> --name-status`` writes for ``commits``."""
    out = ""
    for sha, date, author, subject, changes in commits:
        # committed an hour after it was authored, as a merge or a rebase does
        committed = date.replace("T0", "T1", 1)
        out += f"\x01{sha}\0{date}\0{committed}\0{author}\0{subject}\0"
        pairs = [f"{st}\0{path}\0" for st, path in changes]
        out += ("\n" if pairs else "") + "".join(pairs)
    return out


def test_parse_log_reads_commits_and_name_status() -> None:
    text = _log(
        ("aaa", "2024-01-02T03:04:05+00:00", "Ada", "Merge pull request #12 from x/y",
         [("M", "manifests/mlp/model.yaml"), ("A", "manifests/mlp/versions/1.1.0.yaml")]),
        ("bbb", "2024-01-01T00:00:00+00:00", "Bo", "Add mlp (#3)",
         [("A", "manifests/mlp/model.yaml")]),
        ("ccc", "2023-12-31T00:00:00+00:00", "Cy", "no files", []),
    )  # fmt: skip
    commits = parse_log(text)
    assert [(c.sha, c.author, c.pr) for c in commits] == [
        ("aaa", "Ada", 12), ("bbb", "Bo", 3), ("ccc", "Cy", None)
    ]  # fmt: skip
    assert commits[0].changes == (
        ("M", "manifests/mlp/model.yaml"),
        ("A", "manifests/mlp/versions/1.1.0.yaml"),
    )
    assert commits[2].changes == ()


def test_text_inside_a_field_is_never_read_as_structure() -> None:
    """An author and a subject are whoever pushed them: separators, newlines, tabs and
    the commit mark inside them neither shift fields nor forge a changed file."""
    author = "Eve\x1f2099-01-01\x1fforged\r\nM\tmanifests/other/model.yaml\n\x01fff"
    subject = "\x01ddd (#99)\nA\tmanifests/x/model.yaml"
    commits = parse_log(_log(
        ("aaa", "2024-01-02T03:04:05+00:00", author, subject, [("M", "manifests/mlp/model.yaml")]),
        ("bbb", "2024-01-01T00:00:00+00:00", "Bo", "ok", [("A", "\x01odd path")]),
    ))  # fmt: skip
    assert [(c.sha, c.date, c.committed, c.author, c.subject) for c in commits] == [
        ("aaa", "2024-01-02T03:04:05+00:00", "2024-01-02T13:04:05+00:00", author, subject),
        ("bbb", "2024-01-01T00:00:00+00:00", "2024-01-01T10:00:00+00:00", "Bo", "ok"),
    ]
    assert commits[0].changes == (("M", "manifests/mlp/model.yaml"),)
    assert commits[1].changes == (("A", "\x01odd path"),)


def test_channel_map_reads_both_forms_and_tolerates_broken_files() -> None:
    raw = _model("    canary: {version: 1.1.0, rollout: {percent: 10}}\n    production: 1.0.0\n")
    assert channel_map(raw, MODEL) == {
        "canary": Assignment("1.1.0", 10.0),
        "production": Assignment("1.0.0"),
    }
    assert channel_map(b"spec: [unclosed", MODEL) == {}
    assert channel_map(_model("    canary: latest\n"), MODEL) == {}
    assert channel_map(None, MODEL) == {}


def test_derive_events_orders_and_classifies() -> None:
    def commit(sha: str, *changes: tuple[str, str], subject: str = "s") -> LogCommit:
        return LogCommit(sha, "a", f"2024-01-0{sha[-1]}", subject, changes)

    newest_first = [
        commit("c4", ("D", MODEL)),
        commit("c3", ("M", MODEL), subject="Merge pull request #9 from x/back"),
        commit("c2", ("M", MODEL), ("A", "trust/metadata/2.targets.json")),
        commit("c1", ("A", MODEL), ("A", "manifests/mlp/versions/1.0.0.yaml")),
    ]
    blobs = {
        f"c1:{MODEL}": _model("    prod: 1.0.0\n"),
        f"c2:{MODEL}": _model("    prod: 1.1.0\n    canary: 1.1.0\n"),
        f"c3:{MODEL}": _model(
            "    prod: 1.0.0\n    canary: {version: 1.1.0, rollout: {percent: 5}}\n"
        ),
    }
    log = ModelLog(
        "manifests/mlp", "trust/metadata", {"1.1.0": Release("trust/metadata/2.targets.json", "7")}
    )
    events = derive_events(newest_first, log, blobs)
    assert [(e.commit, e.kind, e.summary()) for e in events] == [
        ("c4", "channel removed", "channel canary: 1.1.0 (5%) -> -"),
        ("c4", "channel removed", "channel prod: 1.0.0 -> -"),
        ("c3", "rollout", "channel canary: 1.1.0 -> 1.1.0 (5%)"),
        ("c3", "rollback", "channel prod: 1.1.0 -> 1.0.0"),
        ("c2", "promotion", "channel canary: - -> 1.1.0"),
        ("c2", "promotion", "channel prod: 1.0.0 -> 1.1.0"),
        ("c2", "released", "version 1.1.0 released by CI run 7"),
        ("c1", "promotion", "channel prod: - -> 1.0.0"),
        ("c1", "version added", "version 1.0.0 added"),
    ]
    assert events[3].pr == 9


def test_first_listed_finds_the_first_targets_file(tmp_path: Path) -> None:
    for n in range(1, 41):
        targets: dict[str, object] = {f"models/mlp/1.{i}.0.onnx": {} for i in range(n)}
        (tmp_path / f"{n}.targets.json").write_text(json.dumps({"signed": {"targets": targets}}))
    (tmp_path / "timestamp.json").write_text("{}")
    wanted = [f"models/mlp/1.{i}.0.onnx" for i in (0, 17, 39, 40)]
    assert first_listed(tmp_path, wanted) == {wanted[0]: 1, wanted[1]: 18, wanted[2]: 40}
    assert first_listed(tmp_path / "none", wanted) == {}


def test_suggest_names_the_closest_or_lists_the_known() -> None:
    assert str(suggest("prod", ["canary", "production"], "channel")) == (
        "channel 'prod' is not declared; did you mean 'production'?"
    )
    assert (
        str(suggest("mpl", ["mlp"], "model")) == "model 'mpl' is not declared; did you mean 'mlp'?"
    )
    many = [f"m{i}" for i in range(20)]
    assert str(suggest("zzz", many, "model")).endswith(
        "(declared: m0, m1, m2, m3, m4, m5, m6, m7, ...)"
    )
    assert str(suggest("x", [], "model")) == "model 'x' is not declared (declared: none)"


def test_derive_events_is_fast_on_ten_thousand_versions() -> None:
    adds = tuple(("A", f"manifests/mlp/versions/1.{i}.0.yaml") for i in range(10_000))
    commits = [LogCommit(f"c{i}", "a", "d", "s", adds[i : i + 100]) for i in range(0, 10_000, 100)]
    log = ModelLog("manifests/mlp", "trust/metadata")
    start = time.perf_counter()
    events = derive_events(commits, log, {})
    assert len(events) == 10_000
    assert time.perf_counter() - start < 2.0
