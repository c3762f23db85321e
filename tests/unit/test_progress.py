"""registry.progress: lines in CI logs, a rich display on a terminal, nothing otherwise."""

from __future__ import annotations

import io
import re
import time

import pytest
from rich.console import Console

from registry import progress
from registry.errors import UsageError

LINE = re.compile(r"^(?P<label>.+?)(?P<failed> failed)? \((?P<seconds>\d+\.\d\d) s\)$")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_ci_lines_name_each_stage_with_its_time() -> None:
    out = io.StringIO()
    with progress.reporting(progress.LineReporter(out)):
        with progress.stage("build mlp 1.1.0", "fetch"):
            time.sleep(0.05)
        with pytest.raises(RuntimeError), progress.stage("build mlp 1.1.0", "check"):
            raise RuntimeError("boom")
    found = [LINE.match(line) for line in out.getvalue().splitlines()]
    assert [(m["label"], bool(m["failed"])) for m in found if m] == [
        ("build mlp 1.1.0: fetch", False),
        ("build mlp 1.1.0: check", True),
    ]
    assert 0.05 <= float(found[0]["seconds"]) < 5  # type: ignore[index]


def test_lines_redact_secrets_and_control_characters() -> None:
    out = io.StringIO()
    with (
        progress.reporting(progress.LineReporter(out)),
        progress.stage(
            "publish", "upload targets to https://ci:hunter2-secret@store.example/x\x1b[2J"
        ),
    ):
        pass
    assert "hunter2" not in out.getvalue()
    assert "\x1b" not in out.getvalue()
    assert out.getvalue().startswith("publish: upload targets to https://***@store.example/x")


def test_no_reporter_installed_shows_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    with progress.stage("build mlp 1.1.0", "fetch") as running:
        running.advance(10)
    assert running.elapsed >= 0
    assert capsys.readouterr() == ("", "")


def test_rich_display_on_a_terminal() -> None:
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=100, color_system="standard")
    reporter = progress.RichReporter(console, min_seconds=0.05)
    with progress.reporting(reporter):
        with progress.stage("dvc pull", "models/mlp/1.1.0.onnx", total=2048) as running:
            running.advance(1024)
            time.sleep(0.1)
            running.advance(1024)
        with progress.stage("build mlp 1.1.0", "check"):
            pass  # too short to leave a line
    text = screen.getvalue()
    assert "\x1b[" in text  # drawn for a terminal: colours, cursor moves
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
    assert re.search(r"✓ dvc pull: models/mlp/1\.1\.0\.onnx \d+\.\d\d s", plain)
    assert "✓ build mlp 1.1.0: check" not in plain
    assert reporter._progress is None  # the live display stops between stages


def test_rich_marks_a_failed_stage_however_short() -> None:
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=100)
    with (
        progress.reporting(progress.RichReporter(console, min_seconds=60)),
        pytest.raises(OSError, match="disk"),
        progress.stage("publish", "sign"),
    ):
        raise OSError("disk full")
    assert "✗ publish: sign" in re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.getvalue())


@pytest.mark.parametrize(
    ("env", "stream", "kind"),
    [
        ({"CI": "true"}, _Terminal(), progress.LineReporter),
        ({"CI": "true", "MODELREG_PROGRESS": "off"}, _Terminal(), progress.ProgressReporter),
        ({"CI": "false"}, _Terminal(), progress.RichReporter),
        ({}, _Terminal(), progress.RichReporter),
        ({}, io.StringIO(), progress.ProgressReporter),  # piped: quiet
        ({"MODELREG_PROGRESS": "lines"}, io.StringIO(), progress.LineReporter),
    ],
)
def test_reporter_follows_the_environment(
    env: dict[str, str], stream: io.StringIO, kind: type[progress.ProgressReporter]
) -> None:
    assert type(progress.for_environment(env, stream)) is kind


def test_an_unknown_mode_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="MODELREG_PROGRESS='fancy'"):
        progress.for_environment({"MODELREG_PROGRESS": "fancy"}, io.StringIO())


def test_details_show_on_a_terminal_but_not_in_ci_logs() -> None:
    out = io.StringIO()
    with (
        progress.reporting(progress.LineReporter(out)),
        progress.stage("build mlp 1.1.0", "fetch"),
        progress.stage("hash", "1.1.0.onnx", total=4, logged=False) as detail,
    ):
        detail.advance(4)
    assert out.getvalue().splitlines()[0].startswith("build mlp 1.1.0: fetch (")
    assert len(out.getvalue().splitlines()) == 1
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=100)
    with (
        progress.reporting(progress.RichReporter(console, min_seconds=0)),
        progress.stage("hash", "1.1.0.onnx", total=4, logged=False) as detail,
    ):
        detail.advance(4)
    assert "hash: 1.1.0.onnx" in screen.getvalue()


def test_a_stage_of_unknown_size_has_no_bar_and_a_sized_one_counts_bytes() -> None:
    def draw(total: int | None) -> str:
        screen = io.StringIO()
        console = Console(file=screen, force_terminal=True, width=100)
        with (
            progress.reporting(progress.RichReporter(console)),
            progress.stage("dvc push", "storage", total=total) as running,
        ):
            running.advance(total or 0)
        return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.getvalue())

    unknown = draw(None)
    assert "dvc push: storage" in unknown
    assert "?" not in unknown
    assert "━" not in unknown
    assert "/2.0 kB" in draw(2000)  # drawn at the start: 0.0 of 2.0 kB
