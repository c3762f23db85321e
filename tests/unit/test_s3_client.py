"""The one S3 client factory (``registry.s3client``) that the device's artifact remote,
its report sink and the fleet's report reader share: one row per rule (endpoint,
region, credentials and unsigned access, network settings, when a client is made
again), each naming the exact client it must give.  No request is sent: a client is
only made and looked at."""

from __future__ import annotations

import builtins
from pathlib import Path
from typing import Any

import pytest
from botocore import UNSIGNED

from registry import s3client
from registry.s3client import S3Network, S3UnavailableError, endpoint_url, s3_client

_AWS_ENV = (
    "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_REGION", "AWS_REGION", "AWS_RETRY_MODE",
    "AWS_MAX_ATTEMPTS",
)  # fmt: skip
KEYS = {"aws_access_key_id": "AKIDEVICE", "aws_secret_access_key": "device-secret"}


@pytest.fixture(autouse=True)
def no_aws_setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No AWS configuration but what a row sets: no ~/.aws, no instance role, no cache."""
    for name in _AWS_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setattr(s3client, "_CLIENTS", {})


def _set(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)


# --- endpoint --------------------------------------------------------------------------

S3_ONLY = "http://127.0.0.1:9000"
ANY_SERVICE = "http://127.0.0.1:9999"


@pytest.mark.parametrize(
    ("env", "endpoint"),
    [
        ({}, None),
        ({"AWS_ENDPOINT_URL": ANY_SERVICE}, ANY_SERVICE),
        ({"AWS_ENDPOINT_URL_S3": S3_ONLY}, S3_ONLY),
        ({"AWS_ENDPOINT_URL_S3": S3_ONLY, "AWS_ENDPOINT_URL": ANY_SERVICE}, S3_ONLY),
        ({"AWS_ENDPOINT_URL_S3": "", "AWS_ENDPOINT_URL": ANY_SERVICE}, ANY_SERVICE),
    ],
)
def test_the_endpoint_is_the_s3_one_then_the_general_one(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], endpoint: str | None
) -> None:
    assert endpoint_url(env) == endpoint
    _set(monkeypatch, env)
    made = s3_client(region="eu-west-1").meta.endpoint_url
    assert made == (endpoint or "https://s3.eu-west-1.amazonaws.com")


# --- region ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "given", "region"),
    [
        ({}, None, "us-east-1"),  # botocore's default for S3
        ({"AWS_DEFAULT_REGION": "eu-central-1"}, None, "eu-central-1"),
        ({"AWS_DEFAULT_REGION": "eu-central-1"}, "ap-south-1", "ap-south-1"),
        ({}, "ap-south-1", "ap-south-1"),
    ],
)
def test_the_region_is_the_callers_then_the_aws_configurations(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], given: str | None, region: str
) -> None:
    _set(monkeypatch, env)
    assert s3_client(region=given).meta.region_name == region


# --- credentials and unsigned access ---------------------------------------------------


@pytest.mark.parametrize(
    ("env", "keys", "access_key"),
    [
        ({}, None, None),  # nothing found: unsigned
        ({"AWS_ACCESS_KEY_ID": "AKIENV", "AWS_SECRET_ACCESS_KEY": "env-secret"}, None, "AKIENV"),
        ({}, KEYS, "AKIDEVICE"),
        ({"AWS_ACCESS_KEY_ID": "AKIENV", "AWS_SECRET_ACCESS_KEY": "env-secret"}, KEYS, "AKIDEVICE"),
    ],
)
def test_given_keys_then_the_standard_chain_else_unsigned(
    monkeypatch: pytest.MonkeyPatch,
    env: dict[str, str],
    keys: dict[str, str] | None,
    access_key: str | None,
) -> None:
    _set(monkeypatch, env)
    client = s3_client(keys=keys)
    signing = client.meta.config.signature_version
    if access_key is None:
        assert signing is UNSIGNED
        url = client.generate_presigned_url("get_object", Params={"Bucket": "b", "Key": "k"})
        assert "Signature" not in url
        assert "X-Amz-Credential" not in url
    else:
        assert signing == "s3v4"
        url = client.generate_presigned_url("get_object", Params={"Bucket": "b", "Key": "k"})
        assert f"X-Amz-Credential={access_key}%2F" in url


# --- network settings ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("network", "timeouts", "retries", "pool"),
    [
        (S3Network(), (60, 60), None, 10),  # botocore's defaults: a client that only signs
        (S3Network(timeout_s=5, retries=1), (5, 5),
         {"total_max_attempts": 2, "mode": "standard"}, 10),  # the report sink
        (S3Network(timeout_s=10, retries=2, pool=16), (10, 10),
         {"total_max_attempts": 3, "mode": "standard"}, 16),  # the fleet's reader
    ],
)  # fmt: skip
def test_a_callers_network_settings_reach_the_client(
    network: S3Network, timeouts: tuple[float, float], retries: dict[str, Any] | None, pool: int
) -> None:
    config = s3_client(network=network).meta.config
    assert (config.connect_timeout, config.read_timeout) == timeouts
    if retries is None:  # botocore's own, whatever its version says
        assert "total_max_attempts" not in (config.retries or {})
    else:
        assert config.retries == retries
    assert config.max_pool_connections == pool


# --- when a client is made again ------------------------------------------------------


def test_a_client_is_kept_until_an_input_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    first = s3_client()
    assert s3_client() is first
    assert s3_client(network=S3Network()) is first
    assert s3_client(region="eu-west-1") is not first
    assert s3_client(keys=KEYS) is not first
    rotated = {**KEYS, "aws_secret_access_key": "rotated"}
    assert s3_client(keys=rotated) is not s3_client(keys=KEYS)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", S3_ONLY)
    moved = s3_client()
    assert moved is not first
    assert moved.meta.endpoint_url == S3_ONLY
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
    signed = s3_client()
    assert signed is not moved
    assert signed.meta.config.signature_version == "s3v4"


def test_without_boto3_the_factory_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    real = builtins.__import__

    def no_boto3(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "boto3" or name.startswith(("boto3.", "botocore")):
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_boto3)
    with pytest.raises(S3UnavailableError, match="boto3 is not installed"):
        s3_client()


def test_rotated_credentials_replace_the_client_they_came_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A report sink re-reads its credentials before each send: an hourly rotation must
    not keep a client (about 12 MB each) and the old secret for every hour."""
    network = S3Network(timeout_s=5.0, retries=1)
    for hour in range(5):
        s3_client(keys={**KEYS, "aws_session_token": f"token-{hour}"}, network=network)
    s3_client(region="eu-west-1")
    assert len(s3client._CLIENTS) == 2  # one per use: the sink's, and the regional one
    held = repr(s3client._CLIENTS)
    assert "token-4" in held
    assert not any(f"token-{hour}" in held for hour in range(4))
