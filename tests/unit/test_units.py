"""Durations as manifests and ``edge.yaml`` write them (``registry.units``)."""

from __future__ import annotations

import pytest

from registry.units import format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("500ms", 0.5), ("30s", 30.0), ("5m", 300.0), ("1h", 3600.0), ("1.5h", 5400.0),
        (" 4h ", 14400.0), ("90", 90.0), (90, 90.0), (2.5, 2.5), ("0", 0.0),
    ],
)  # fmt: skip
def test_parse_duration(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["1d", "h", "-1s", "1 hour", "", True, None, [1], -5, 10**9])
def test_parse_duration_refuses(bad: object) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(bad)


def test_edge_config_keeps_its_name_for_the_parser() -> None:
    from edge_sync.config import parse_duration as edge_parse

    assert edge_parse is parse_duration


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"), (-3, "0s"), (0.25, "250ms"), (1, "1s"), (59.6, "1m"), (61, "1m1s"),
        (3600, "1h"), (5400, "1h30m"), (14400, "4h"), (90061, "25h1m1s"),
    ],
)  # fmt: skip
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
