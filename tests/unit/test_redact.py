"""registry.redact: every shape of secret is removed, ordinary text is left alone."""

from __future__ import annotations

import base64
import json

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from hypothesis import given, settings
from hypothesis import strategies as st

from registry.redact import MASK, is_secret_name, redact, secret_values
from signing.keys import private_pem

PEM = private_pem(ec.generate_private_key(ec.SECP256R1())).decode()
BODY = PEM.splitlines()[1]
"""A line of the key's base64 body: it must never survive."""

NO_ENV: dict[str, str] = {}


# --- URLs ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "MLflow at http://user:s3cretpass@127.0.0.1:9/: cannot open the store",
            "MLflow at http://***@127.0.0.1:9/: cannot open the store",
        ),
        (
            "cannot push to https://TOKEN123456@127.0.0.1:9/x: Connection refused",
            "cannot push to https://***@127.0.0.1:9/x: Connection refused",
        ),
        # a raw "@" in a password (invalid, but seen): the userinfo runs to the last "@"
        ("s3://u:p@ss@bucket/key", "s3://***@bucket/key"),
        ("git+ssh://git@github.com/acme/fleet.git", "git+ssh://***@github.com/acme/fleet.git"),
        ("'https://x-access-token:ghs_abc@github.com/a/b'", "'https://***@github.com/a/b'"),
        # a raw "/", "?" or "#" in a password (invalid, but a password is what it is)
        ("https://user:pa/ss@host/x failed", "https://***@host/x failed"),
        ("https://u:p#w?d@h.example/a", "https://***@h.example/a"),
        ('{"uri": "http://u:a/b@h:5000/"}', '{"uri": "http://***@h:5000/"}'),
    ],
)
def test_url_credentials_are_removed(text: str, expected: str) -> None:
    assert redact(text, NO_ENV) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("GET https://h/a?token=abc123", "GET https://h/a?token=***"),
        (
            "https://h/o?x=1&access_token=abc&X-Amz-Signature=dead&X-Amz-Credential=AKIA%2F1#f",
            "https://h/o?x=1&access_token=***&X-Amz-Signature=***&X-Amz-Credential=***#f",
        ),
        (
            "https://acct.blob.core.windows.net/c/b?sv=2020&sig=Zm9v%3D&se=2030",
            "https://acct.blob.core.windows.net/c/b?sv=2020&sig=***&se=2030",
        ),
        (
            "https://h/p?api_key=k1&password=p2 failed",
            "https://h/p?api_key=***&password=*** failed",
        ),
        ("https://h/p?page=2&limit=10", "https://h/p?page=2&limit=10"),
    ],
)
def test_secret_query_parameters_are_removed(text: str, expected: str) -> None:
    assert redact(text, NO_ENV) == expected


def test_authorization_values_and_github_tokens_are_removed() -> None:
    token = "ghp_" + "A1b2C3d4" * 5
    assert redact(f"Authorization: Bearer {token}", NO_ENV) == "Authorization: Bearer ***"
    assert redact("authorization=basic dXNlcjpwYXNz", NO_ENV) == "authorization=basic ***"
    assert redact(f"pushed with {token} to origin", NO_ENV) == "pushed with *** to origin"
    pat = "github_pat_" + "x" * 40
    assert redact(f"token {pat}.", NO_ENV) == "token ***."


# --- keys ------------------------------------------------------------------------------


def test_pem_blocks_are_removed_whole_or_cut() -> None:
    assert redact(f"key:\n{PEM}done", NO_ENV) == f"key:\n{MASK}\ndone"
    # as repr and JSON show it: newlines escaped
    assert BODY not in redact(repr(PEM), NO_ENV)
    as_json = json.dumps({"key": PEM, "other": "kept"})
    assert json.loads(redact(as_json, NO_ENV)) == {"key": f"{MASK}\n", "other": "kept"}
    # a message that quotes a prefix of the key: cut before its END line
    assert redact(f"bad value {PEM[:90]!r}", NO_ENV) == f"bad value '{MASK}'"
    # a legacy encrypted PEM, with its headers
    legacy = (
        "-----BEGIN EC PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\n"
        "DEK-Info: AES-128-CBC,00112233445566778899AABBCCDDEEFF\n\n"
        f"{BODY}\n-----END EC PRIVATE KEY-----"
    )
    assert redact(f"<{legacy}>", NO_ENV) == f"<{MASK}>"


@pytest.mark.parametrize("encode", [base64.b64encode, base64.urlsafe_b64encode])
def test_base64_encoded_pem_is_removed(encode: object) -> None:
    assert callable(encode)
    value = encode(PEM.encode()).decode()
    assert redact(f"/tmp/{value}: File name too long", NO_ENV) == f"/tmp/{MASK}: File name too long"
    assert redact(f"cut {value[:60]}...", NO_ENV) == f"cut {MASK}..."
    wrapped = "\n".join(value[i : i + 76] for i in range(0, len(value), 76))
    assert redact(f"[{wrapped}]", NO_ENV) == f"[{MASK}]"
    indented = encode(b"\n  " + PEM.encode()).decode()
    assert redact(indented, NO_ENV) == MASK


# --- the environment -------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "MODELREG_TIMESTAMP_KEY",
        "MODELREG_TARGETS_KEY_PASSPHRASE",
        "GITHUB_TOKEN",
        "GH_TOKEN",
        "ACTIONS_RUNTIME_TOKEN",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "MLFLOW_TRACKING_PASSWORD",
        "MLFLOW_TRACKING_TOKEN",
        "MY_SERVICE_SECRET",
        "DB_PASSWORD",
        "api_key",
    ],
)
def test_values_of_secret_variables_are_removed_in_every_form(name: str) -> None:
    value = "Xq7-not/a:pattern+9"  # matches none of the shapes above: only the name tells
    env = {name: value, "HOME": "/home/runner"}
    text = (
        f"raw {value}; repr {value!r}; json {json.dumps(value)}; "
        f"b64 {base64.b64encode(value.encode()).decode()}; "
        f"b64url {base64.urlsafe_b64encode(value.encode()).decode().rstrip('=')}"
    )
    out = redact(text, env)
    assert value not in out
    assert base64.b64encode(value.encode()).decode() not in out
    assert out == "raw ***; repr '***'; json \"***\"; b64 ***; b64url ***"
    assert "/home/runner" in redact("in /home/runner", env)


def test_a_multiline_secret_value_is_removed_as_repr_shows_it() -> None:
    env = {"MODELREG_ROOT_KEY": "line one of it\nline two of it"}
    assert redact("got 'line one of it\\nline two of it'", env) == "got '***'"


def test_short_values_and_other_variables_are_left_alone() -> None:
    env = {"GITHUB_TOKEN": "mai", "MODELREG_TRACEBACK": "1", "GITHUB_REF": "refs/heads/main"}
    text = "on refs/heads/main: mai is protected"
    assert redact(text, env) == text
    assert secret_values(env) == []
    assert is_secret_name("modelreg_targets_key")
    assert not is_secret_name("GITHUB_REF")
    assert not is_secret_name("MODELREG_KEYS_DIR")


def test_a_short_secret_is_removed_where_it_stands_alone() -> None:
    """A 7-character password is still a password; as part of a longer word it is
    left, so that it does not blank out ordinary words."""
    env = {"DB_PASSWORD": "hunter2", "GH_TOKEN": "main"}
    text = "login hunter2 failed; user:hunter2@db; hunter22 and maintainer are words"
    assert redact(text, env) == "login *** failed; user:***@db; hunter22 and maintainer are words"


def test_the_default_environment_is_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "hunter2hunter2")
    assert redact("login with hunter2hunter2 failed") == "login with *** failed"


# --- ordinary text ---------------------------------------------------------------------

ORDINARY = [
    "manifests/mlp/versions/1.1.0.yaml:12:5: spec.metrics.accuracy: must be finite",
    "sha256 " + "0123456789abcdef" * 4 + " of models/mlp/1.0.0.onnx",
    "/tmp/pytest-of-runner/pytest-12/test_release0/fleet/models/mlp/1.0.0.onnx: no such file",
    "MLflow at http://127.0.0.1:5000/: mirrored 3 versions",
    "DVC remote: s3://acme-models/fleet (push failed: 403 Forbidden)",
    "dvc push failed: ERROR: failed to push data to the cloud - 1 files failed to upload",
    "git@github.com:acme/fleet.git rejected the push (non-fast-forward)",
    "Model diff: mlp 1.0.0 → 2.0.0; 4 of 16 tensors changed (16.94 % of weight bytes)",
    "key 'token' is not allowed here; the session expired",
    '{"ok": false, "problems": ["x: y"], "published": ["models/mlp/1.0.0.onnx"]}',
    "",
]


@pytest.mark.parametrize("text", ORDINARY)
def test_ordinary_text_is_unchanged(text: str) -> None:
    env = {"GITHUB_REF": "refs/heads/main", "HOME": "/home/runner", "GH_TOKEN": "ghs_" + "z" * 36}
    assert redact(text, env) == text


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8", exclude_characters="@"), max_size=200))
def test_text_without_secret_shapes_is_unchanged(text: str) -> None:
    # No "@" (URL userinfo), "=" after "?"/"&" or PEM header can form from these, and
    # short runs of base64 are never decoded: redaction must not touch the text.
    text = text.replace("?", " ").replace("&", " ").replace("-----", "- - ")
    text = text.replace("gh", "g h").replace("uthorization", "uth").replace("earer", "ear")
    assert redact(text, NO_ENV) == text


def test_redaction_is_idempotent() -> None:
    env = {"MLFLOW_TRACKING_TOKEN": "tok-0123456789"}
    text = (
        f"http://u:p@h/?token=tok-0123456789 {PEM} "
        f"{base64.b64encode(PEM.encode()).decode()} Authorization: token abcdefgh"
    )
    once = redact(text, env)
    assert redact(once, env) == once
    assert "tok-0123456789" not in once
    assert BODY not in once
