"""The device report's schema and bounds (``registry.device_report``): what a reader
refuses, each with one line that never quotes the content, and what a device makes fit."""

from __future__ import annotations

import json
from typing import Any

import pytest

from registry.device_report import (
    LIMITS,
    ReportError,
    ReportLimits,
    encode_report,
    parse_report,
)
from tests.fleet_reports import NOW, model, report, stamp


def _bytes(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc).encode()


def test_a_report_as_devices_send_it_is_read() -> None:
    read = parse_report(_bytes(report("cam-1")))
    assert read.device == "cam-1"
    assert read.models["mlp"].serving is not None
    assert read.models["mlp"].serving.version == "1.0.0"
    assert read.reported.tzinfo is not None


@pytest.mark.parametrize("followed", ["ab" * 20, "sha256:" + "cd" * 32])
def test_a_device_following_git_or_the_remote_mirror_is_read(followed: str) -> None:
    doc = _with("sync.commit", followed)
    assert parse_report(_bytes(doc)).sync.commit == followed


def _with(path: str, value: Any) -> dict[str, Any]:
    doc = report("cam-1")
    *parents, last = path.split(".")
    node = doc
    for part in parents:
        node = node[part]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return doc


_DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "says"),
    [
        ("surprise", 1, "surprise: Extra inputs are not permitted"),
        ("device", "../etc/passwd", "device: String should match pattern"),
        ("device", 7, "device: Input should be a valid string"),
        ("reported", "yesterday", "reported:"),
        ("reported", "2025-06-01T12:00:00", "reported: Input should have timezone info"),
        ("kind", "EdgeConfig", "kind: Input should be 'DeviceReport'"),
        ("daemon.version", _DELETE, "daemon.version: Field required"),
        ("models.mlp.channel", "Prod uction", "models.mlp.channel: String should match"),
        ("models.mlp.serving.version", "one", "models.mlp.serving.version:"),
        ("models.mlp.serving.sha256", "ab" * 10, "models.mlp.serving.sha256:"),
        ("models.mlp.last_update.result", "exploded", "models.mlp.last_update.result:"),
        ("models.mlp.last_update.bytes_fetched", -1, "bytes_fetched: Input should be greater"),
        ("models.mlp.last_update.bytes_fetched", "12", "bytes_fetched: Input should be a valid"),
        ("models.mlp.last_update.stages_ms", {"fetch": -1.0}, "stages_ms.fetch: Value error"),
        ("models.mlp.last_update.reason", "\x1b[31mred", "reason: Value error, holds control"),
        ("models.mlp.last_update.reason", "x" * 501, "reason: String should have at most 500"),
        ("labels", {"site": "plant\u202e3"}, "labels: Value error, holds control"),
        ("models", {f"m{i}": model() for i in range(65)}, "models: Dictionary should have at"),
        ("sync.result", "maybe", "sync.result:"),
        ("sync.commit", "sha256:" + "cd" * 20, "sync.commit: String should match"),
        ("sync.commit", "main", "sync.commit: String should match"),
        ("trust.stale", "no", "trust.stale: Input should be a valid boolean"),
        ("trust.expired", ["keys"], "trust.expired.0: Input should be 'root',"),
        ("trust.expired", ["root"] * 5, "trust.expired: List should have at most 4"),
    ],
)
def test_a_report_off_the_schema_is_refused_with_its_field(
    path: str, value: Any, says: str
) -> None:
    with pytest.raises(ReportError) as caught:
        parse_report(_bytes(_with(path, value)))
    assert says in str(caught.value)
    assert "\x1b" not in str(caught.value)
    assert "\u202e" not in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_report_names_the_expired_roles_of_a_stale_device() -> None:
    doc = _with("trust.expired", ["snapshot"])
    doc["trust"]["stale"] = True
    assert parse_report(_bytes(doc)).trust.expired == ["snapshot"]


def test_a_newer_format_says_so() -> None:
    doc = report("cam-1", format=5, added_later={"x": 1})
    with pytest.raises(ReportError, match=r"not a report of format 1 to 4 \(made by a newer"):
        parse_report(_bytes(doc))


def test_a_format_1_report_is_still_read() -> None:
    """Devices not yet upgraded send format 1 (no provenance, no model digest)."""
    doc = report("cam-1", format=1)
    assert parse_report(_bytes(doc)).format == 1


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"", "not a JSON document"),
        (b"{", "not a JSON document"),
        (b"[]", "report: Input should be an object"),
        (b"\xff\xfe", "not a JSON document"),
        (b" " * (LIMITS.max_bytes + 1), f"larger than {LIMITS.max_bytes} bytes"),
    ],
)
def test_what_is_not_a_report_at_all(data: bytes, says: str) -> None:
    with pytest.raises(ReportError, match=says.replace("(", r"\(")):
        parse_report(data)


def test_a_reader_may_narrow_the_limits() -> None:
    doc = _bytes(report("cam-1", {"a": model(), "b": model()}))
    parse_report(doc)
    with pytest.raises(ReportError, match="models: more than 1"):
        parse_report(doc, ReportLimits(max_models=1))
    with pytest.raises(ReportError, match="larger than 100 bytes"):
        parse_report(doc, ReportLimits(max_bytes=100))


def _rejections(n: int) -> list[dict[str, Any]]:
    return [
        {"version": "1.1.0", "sha256": "e" * 64, "reason": f"self-test {i}: " + "x" * 480,
         "at": stamp(NOW)}
        for i in range(n)
    ]  # fmt: skip


def test_a_device_sends_its_newest_rejections_only() -> None:
    doc = report("cam-1", {"mlp": model(rejected=_rejections(32))})
    sent = json.loads(encode_report(doc))
    kept = sent["models"]["mlp"]["rejected"]
    assert len(kept) == LIMITS.max_rejected
    assert kept[-1]["reason"].startswith("self-test 31:")
    assert sent["truncated"] is False


def test_the_largest_status_a_device_can_have_still_fits() -> None:
    # 64 models (edge.yaml's maximum), each with the longest reasons and versions,
    # every rejection kept and every stage timed
    long = "1.0.0-" + "a" * 122

    def heavy() -> dict[str, Any]:
        entry = model(rejected=_rejections(32))
        held = {"version": long, "sha256": "f" * 64, "target": "t" * 63, "kind": "engine"}
        entry.update(serving=held, previous=held, last_known_good=held,
                     gate={"version": long, "opened": stamp(NOW)})  # fmt: skip
        entry["last_update"].update(reason="r" * 500, version=long,
                                    stages_ms={f"stage_{i}": 1.25 for i in range(32)})  # fmt: skip
        # a shadow comparison of 32 outputs with long names and full histograms
        sums = {"rows": 10**9, "top1": 10**9, "topk": 10**9, "k": 5, "values": 10**12,
                "abs_sum": 1.2345678e10, "abs_max": 1.2345678, "ref_sum": 9.87654321e11,
                "rel_sum": 1.2345678e9, "rel_max": 123.45678, "nonfinite": 0,
                "incomparable": 0}  # fmt: skip
        entry["shadow"] = {
            "version": long, "against": long, "compared": 10**9, "dropped": 10**9,
            "new_s": 12345.678, "old_s": 12345.678,
            "new_hist": [[i, 10**9] for i in range(256)],
            "old_hist": [[i, 10**9] for i in range(256)],
            "outputs": {"o" * 250 + f"{i:02d}": sums for i in range(32)}, "open": True,
        }  # fmt: skip
        return entry

    doc = report("cam-1", {f"model-{i:02d}": heavy() for i in range(64)})
    data = encode_report(doc)
    assert len(data) <= LIMITS.max_bytes
    sent = parse_report(data)
    assert sent.truncated is True
    assert len(sent.models) == 64  # every model still says what it serves
    assert all(m.serving is not None and m.serving.version == long for m in sent.models.values())


def test_a_shadow_comparison_is_trimmed_before_what_a_device_serves() -> None:
    comparison = {
        "version": "1.1.0", "against": "1.0.0", "compared": 1000,
        "new_hist": [[i, 5] for i in range(200)], "old_hist": [[i, 5] for i in range(200)],
        "outputs": {
            f"output_{i:02d}_" + "x" * 200: {"rows": 4, "top1": 1 if i == 17 else 3, "topk": 4}
            | ({"values": 10, "abs_sum": 5.0, "ref_sum": 10.0} if i == 23 else {})
            for i in range(32)
        },
    }  # fmt: skip
    doc = report("cam-1", {f"m{i}": model() | {"shadow": comparison} for i in range(8)})
    sent = parse_report(encode_report(doc))
    assert sent.truncated is True
    shadow = sent.models["m0"].shadow
    assert shadow is not None  # the sums a wave is judged on stay
    assert shadow.new_hist == []  # the histograms go first
    # of the outputs, those that make the figures stay: the lowest agreement, the
    # largest drift
    assert sorted(name[:9] for name in shadow.outputs) == ["output_17", "output_23"]
    assert (shadow.compared, shadow.agreement, shadow.drift) == (1000, 0.25, 0.5)


def test_a_device_reports_its_own_comparison_not_a_fleets() -> None:
    comparison = {"version": "1.1.0", "against": "1.0.0", "compared": 10, "devices": 500}
    data = json.dumps(report("cam-1", {"mlp": model() | {"shadow": comparison}})).encode()
    with pytest.raises(ReportError, match=r"models\.mlp\.shadow.*devices must be 1"):
        parse_report(data)


def test_a_device_never_sends_what_a_reader_refuses() -> None:
    with pytest.raises(ReportError, match=r"models\.mlp\.serving\.version"):
        encode_report(_with("models.mlp.serving.version", "not-semver"))


@pytest.mark.parametrize(
    ("sent", "limits", "says"),
    [
        (LIMITS.max_rejected, LIMITS, None),
        (LIMITS.max_rejected + 1, LIMITS, f"models.mlp.rejected: more than {LIMITS.max_rejected}"),
        (3, ReportLimits(max_rejected=2), "models.mlp.rejected: more than 2"),
        (0, ReportLimits(max_rejected=0), None),
    ],
)
def test_a_reader_counts_the_rejections_a_report_carries(
    sent: int, limits: ReportLimits, says: str | None
) -> None:
    # a device keeps more (32) than it sends: the bound is the report's, not the document's
    doc = _bytes(report("cam-1", {"mlp": model(rejected=_rejections(sent))}))
    if says is None:
        assert len(parse_report(doc, limits).models["mlp"].rejected) == sent
    else:
        with pytest.raises(ReportError) as caught:
            parse_report(doc, limits)
        assert str(caught.value) == says
