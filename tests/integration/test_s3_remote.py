"""An S3-compatible artifact remote (a real moto S3 server on loopback), end to end.

A developer pushes artifacts to ``s3://`` through DVC; a release job on a fresh checkout
pulls them from there, builds, publishes the TUF targets to the same bucket through
DVC's S3 filesystem and mirrors MLflow; a device reads the targets over plain HTTP from
the bucket (path-style URLs), as it would from S3 behind a CDN, and another reads them
as ``s3://`` with its own credentials.  The bucket's credentials live only in the
environment: nothing written to the repository or its history holds them.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from edge_sync.sync.trust import DeviceTrust
from tests.conftest import CREDENTIALS, REPO_ROOT, git, run_modelreg

pytestmark = pytest.mark.integration
SECRET = "s3-secret-of-the-release-job"  # noqa: S105 - a test value; moto accepts any key


def test_release_from_a_fresh_checkout_with_an_s3_remote(
    tmp_path: Path, cli, example_models: Path, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    origin = tmp_path / "origin.git"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(origin)], check=True)
    dev = tmp_path / "dev"
    assert cli("init", str(dev), "--remote", "s3://fleet/store", cwd=tmp_path).code == 0
    dvc = str(REPO_ROOT / ".venv/bin/dvc")
    subprocess.run([dvc, "remote", "modify", "storage", "endpointurl", s3_endpoint],
                   cwd=dev, check=True)  # fmt: skip
    assert cli("model", "add", "mlp", "--channel-order", "canary,production", cwd=dev).code == 0
    for version in ("1.0.0", "1.1.0"):
        r = cli("version", "add", "mlp", version, "--artifact",
                str(example_models / f"mlp/{version}.onnx"), cwd=dev)  # fmt: skip
        assert r.code == 0, r.err
    assert cli("promote", "mlp", "1.1.0", "-c", "canary", cwd=dev).code == 0
    git(dev, "add", "-A")
    git(dev, "commit", "-qm", "mlp 1.0.0 and 1.1.0")
    subprocess.run([dvc, "push", "-q"], cwd=dev, check=True)
    git(dev, "remote", "add", "origin", str(origin))
    git(dev, "push", "-q", "origin", "main")

    job = tmp_path / "job"  # a fresh checkout: no artifacts, no DVC cache, no keys
    subprocess.run(["git", "clone", "-q", str(origin), str(job)], check=True)
    keys = dev / ".modelreg/keys"
    env = {f"MODELREG_{r.upper()}_KEY": (keys / f"{r}.key").read_text()
           for r in ("targets", "snapshot", "timestamp")}  # fmt: skip
    env |= {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}", **CREDENTIALS,
            "AWS_SECRET_ACCESS_KEY": SECRET}  # fmt: skip
    env = {k: v for k, v in {**os.environ, **env}.items() if not k.startswith("GITHUB_")}
    r = run_modelreg("ci", "release", "--json", cwd=job, env=env)
    assert r.code == 0, r.err
    report = json.loads(r.out)
    assert "deltas/mlp/1.1.0.from-1.0.0.delta" in report["published"]
    assert report["mlflow"]["changes"] > 0

    # the device reads the targets from the bucket over HTTP (path-style)
    DeviceTrust.provision(tmp_path / "device", (job / "trust/metadata/1.root.json").read_bytes())
    device = DeviceTrust(tmp_path / "device", job, f"{s3_endpoint}/fleet/store/modelreg")
    device.refresh()
    assert device.channels().models["mlp"]["canary"].version == "1.1.0"
    got = device.fetch("models/mlp/1.1.0.onnx", tmp_path / "got", model="mlp", version="1.1.0")
    assert got.read_bytes() == (example_models / "mlp/1.1.0.onnx").read_bytes()
    md5 = hashlib.md5(got.read_bytes(), usedforsecurity=False).hexdigest()
    stored = f"{s3_endpoint}/fleet/store/files/md5/{md5[:2]}/{md5[2:]}"
    with pytest.raises(urllib.error.HTTPError, match="403"):  # the DVC store is not public
        urllib.request.urlopen(stored, timeout=10)  # noqa: S310
    import boto3

    head = boto3.client("s3", endpoint_url=s3_endpoint).head_object(
        Bucket="fleet", Key=f"store/files/md5/{md5[:2]}/{md5[2:]}"
    )  # though it is there
    assert head["ContentLength"] == got.stat().st_size
    again = run_modelreg("ci", "release", "--json", cwd=job, env=env)
    assert again.code == 0, again.err
    assert json.loads(again.out)["published"] == []
    for result in (r, again):
        assert SECRET not in result.out + result.err

    # a device with the bucket's credentials reads the same targets as s3:// (boto3)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_endpoint)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    DeviceTrust.provision(tmp_path / "s3-device", (job / "trust/metadata/1.root.json").read_bytes())
    over_s3 = DeviceTrust(tmp_path / "s3-device", job, "s3://fleet/store/modelreg")
    over_s3.refresh()
    got = over_s3.fetch("models/mlp/1.1.0.onnx", tmp_path / "got-s3", model="mlp", version="1.1.0")
    assert got.read_bytes() == (example_models / "mlp/1.1.0.onnx").read_bytes()

    # the credentials were in the environment only: not in a file, not in the history
    for checkout in (dev, job):
        history = git(checkout, "log", "-p", "--all")
        assert SECRET not in history
        for path in checkout.rglob("*"):
            if path.is_file() and ".git" not in path.parts and path.stat().st_size < 1 << 20:
                assert SECRET.encode() not in path.read_bytes(), path
