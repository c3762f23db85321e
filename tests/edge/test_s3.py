"""A device reading a private ``s3://`` artifact remote (a real moto S3 server on
loopback) with the standard AWS configuration, and resuming a cut download."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.edge.conftest import EdgeRig

pytestmark = pytest.mark.integration


def _upload(endpoint: str, folder: Path, prefix: str) -> None:
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint)
    for path in folder.rglob("*"):
        if path.is_file():
            key = f"{prefix}/{path.relative_to(folder).as_posix()}"
            s3.put_object(Bucket="fleet", Key=key, Body=path.read_bytes())


def test_a_device_installs_from_a_private_s3_remote(
    rig: EdgeRig, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_endpoint)
    _upload(s3_endpoint, rig.remote, "private/modelreg")  # not under the public prefix
    over_s3 = {"artifacts": {"url": "s3://fleet/private/modelreg"}}
    update = rig.sync(**over_s3).updates["mlp"]
    assert (update.result, update.version, update.method) == ("installed", "1.0.0", "full")
    size = (rig.root / "models/mlp/1.0.0.onnx").stat().st_size
    assert size <= update.bytes_fetched < size + 4096
    # a wrong object on the bucket is refused like any remote's
    rig.release_version("1.1.0", "1.0.0")
    _upload(s3_endpoint, rig.remote, "private/modelreg")
    import boto3

    s3 = boto3.client("s3", endpoint_url=s3_endpoint)
    listed = s3.list_objects_v2(Bucket="fleet", Prefix="private/modelreg/targets/deltas/")
    for item in listed.get("Contents", []):
        s3.put_object(Bucket="fleet", Key=item["Key"], Body=b"not a delta")
    update = rig.sync(**over_s3).updates["mlp"]
    # the delta is refused (its digest), the full file decides
    assert (update.result, update.version, update.method) == ("installed", "1.1.0", "full")


def test_without_credentials_an_s3_remote_is_refused_not_crashed(
    rig: EdgeRig, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_endpoint)
    _upload(s3_endpoint, rig.remote, "private/modelreg")
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(rig.tmp / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(rig.tmp / "none"))
    report = rig.sync(artifacts={"url": "s3://fleet/private/modelreg"})
    assert report.result == "failed"
    assert "S3: access denied" in (report.reason or ""), report.reason  # unsigned, refused
