"""Remove secrets from text before it reaches a log, a report or a comment (stable API).

Every channel modelreg writes to can be read by more people than its secrets were
meant for: stderr lands in public CI logs, the PR comment and ``$GITHUB_STEP_SUMMARY``
are visible to the pull request's author, the JSON report is uploaded as an artifact.
Error messages from third-party tools (DVC, MLflow, git, the OS) quote URLs and paths
verbatim, so the remedy cannot be "never format a secret": :func:`redact` runs over
whole messages at the places where they are rendered, and removes

- URL credentials: ``scheme://user:pass@host`` and ``scheme://TOKEN@host`` become
  ``scheme://***@host``;
- secret-looking query parameters (``?token=``, ``access_token=``,
  ``X-Amz-Signature=``, ``sig=``, ``api_key=`` ...): the value becomes ``***``;
- ``Authorization:`` header values and GitHub tokens (``ghp_...``, ``github_pat_...``);
- PEM blocks (``-----BEGIN ...-----`` through ``-----END ...-----``, or to the end of
  the base64 body when the message was cut), also with newlines escaped as ``\\n``;
- long base64 runs that decode to PEM (a key stored base64-encoded in a secret);
- the literal values of secret environment variables (see :func:`is_secret_name`),
  and their base64, ``repr`` and JSON-escaped forms.

Everything else is left as it was, so a user still reads what failed and where.  The
function is idempotent, and it keeps JSON valid when applied to serialized JSON
(nothing it replaces spans a quote).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Final

MASK: Final = "***"
"""What a removed secret is replaced with (what GitHub Actions prints for masked values)."""

SECRET_NAMES: Final = frozenset(
    {
        "GITHUB_TOKEN",
        "GH_TOKEN",
        "ACTIONS_RUNTIME_TOKEN",
        "ACTIONS_ID_TOKEN_REQUEST_TOKEN",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "MLFLOW_TRACKING_PASSWORD",
        "MLFLOW_TRACKING_TOKEN",
    }
)
"""Environment variables that always hold a secret."""

SECRET_SUFFIXES: Final = ("_TOKEN", "_SECRET", "_PASSWORD", "_PASSPHRASE", "_KEY")
"""Name endings of environment variables that hold a secret (``MODELREG_*_KEY`` too)."""


@dataclass(frozen=True)
class RedactLimits:
    """What counts as a secret worth redacting.

    Attributes:
        min_value_chars: environment values at least this long are removed wherever
            they occur.
        min_word_chars: shorter values (down to this length) are removed only where
            they stand as a word of their own, so that a variable holding ``main``
            does not blank out "maintainer"; values shorter still are left alone.
        min_base64_chars: base64 runs shorter than this are not decoded (hashes and
            ids are shorter than any PEM, and decoding every word would cost time).
        max_base64_starts: places in one run where decoding is tried (after each "/",
            "-" or "_", which also separate path names), so a long run costs little.
    """

    min_value_chars: int = 8
    min_word_chars: int = 4
    min_base64_chars: int = 40
    max_base64_starts: int = 32


LIMITS: Final = RedactLimits()

# scheme://userinfo@  -- the userinfo runs to the last "@" before the authority ends
# (a raw "@" in a password is invalid but seen), never across a quote or whitespace.
_URL_USERINFO: Final = re.compile(
    r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^/?#\s\"'<>`@]+(?:@[^/?#\s\"'<>`@]+)*)@"
)
# user:password@ where the password holds a raw "/", "?" or "#" (invalid, but a
# password is what it is): from the "user:" to the last "@" of the word.
_URL_PASSWORD: Final = re.compile(
    r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^/?#\s\"'<>`@:]*:[^\s\"'<>`]*)@"
)
# ?name=value / &name=value where the name looks like it carries a credential.
_QUERY_SECRET: Final = re.compile(
    r"(?P<name>[?&;][A-Za-z0-9_.\-]*"
    r"(?:token|secret|passw|pwd|signature|sig|key|credential|auth|session)"
    r"[A-Za-z0-9_.\-]*=)(?P<value>[^&#\s\"'<>`]+)",
    re.IGNORECASE,
)
_AUTH_HEADER: Final = re.compile(
    r"(?P<name>\bauthorization\s*[:=]\s*(?:(?:bearer|basic|token)\s+)?)(?P<value>[^\s\"'<>`,;]+)",
    re.IGNORECASE,
)
_BEARER: Final = re.compile(r"(?P<name>\bbearer\s+)(?P<value>[A-Za-z0-9._~+/\-]{16,}=*)", re.I)
_GITHUB_TOKEN: Final = re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,})")
# A PEM block: label, then a body of base64, whitespace, escaped newlines ("\n" as two
# characters, how repr and JSON show it) and the "Proc-Type:"/"DEK-Info:" headers of
# legacy encrypted keys; to the END line, or to where the body stops when cut short.
_PEM_BODY: Final = r"(?:[A-Za-z0-9+/=\s:,\-]|\\[nr])"
_PEM: Final = re.compile(
    r"-----BEGIN [A-Z0-9 ]{1,64}-----"
    rf"(?:{_PEM_BODY}*?-----END [A-Z0-9 ]{{1,64}}-----|(?:[A-Za-z0-9+/=\s]|\\[nr])*)"
)
# Base64 (standard or URL-safe), possibly wrapped at 64/76 columns.
_BASE64_RUN: Final = re.compile(
    rf"[A-Za-z0-9+/_\-]{{{LIMITS.min_base64_chars},}}={{0,2}}"
    r"(?:(?:\r?\n|\\n)[A-Za-z0-9+/_\-]{4,}={0,2})*"
)
_PEM_PREFIX: Final = b"-----BEGIN"


def is_secret_name(name: str) -> bool:
    """Whether the environment variable ``name`` holds a secret by its name.

    ``MODELREG_<ROLE>_KEY`` and its ``_PASSPHRASE``, the CI tokens, AWS and MLflow
    credentials, and any ``*_TOKEN``, ``*_SECRET``, ``*_PASSWORD`` or ``*_KEY``.
    """
    upper = name.upper()
    return upper in SECRET_NAMES or upper.endswith(SECRET_SUFFIXES)


def _forms(value: str) -> Iterator[str]:
    # How a secret value shows up inside a message: as is, as Python's repr and JSON
    # write it (newlines escaped), and base64-encoded (a secret passed on encoded).
    yield value
    yield json.dumps(value)[1:-1]
    yield repr(value)[1:-1]
    raw = value.encode("utf-8", "surrogateescape")
    for encoded in (base64.b64encode(raw), base64.urlsafe_b64encode(raw)):
        text = encoded.decode("ascii")
        yield text
        yield text.rstrip("=")


def secret_values(env: Mapping[str, str], limits: RedactLimits = LIMITS) -> list[str]:
    """The strings to remove from messages for the secrets in ``env``, longest first.

    Longest first, so that a value is removed whole before a shorter value that it
    contains could leave pieces of it behind.  Values shorter than
    ``limits.min_value_chars`` are not here (see :func:`secret_words`).
    """
    found: set[str] = set()
    for name, value in env.items():
        if not is_secret_name(name):
            continue
        for candidate in (value, value.strip()):
            if len(candidate) >= limits.min_value_chars:
                found.update(f for f in _forms(candidate) if len(f) >= limits.min_value_chars)
    return sorted(found, key=lambda v: (-len(v), v))


def secret_words(env: Mapping[str, str], limits: RedactLimits = LIMITS) -> list[str]:
    """Short secret values (``min_word_chars`` up to ``min_value_chars``), removed only
    where they stand alone, longest first."""
    found = {
        candidate
        for name, value in env.items()
        if is_secret_name(name)
        for candidate in (value, value.strip())
        if limits.min_word_chars <= len(candidate) < limits.min_value_chars
    }
    return sorted(found, key=lambda v: (-len(v), v))


def decodes_to_pem(run: str) -> bool:
    """Whether ``run`` is base64 (either alphabet, wrapped or not) of PEM text.

    Used here and by ``signing.keys``, which refuses such a key variable by name.
    """
    compact = re.sub(r"\s|\\n", "", run).rstrip("=")
    # The first 64 characters decode to 48 bytes: enough to see past leading
    # whitespace to the PEM header, without decoding a long run whole.
    head = compact[:64]
    head = head[: len(head) - len(head) % 4]
    for alphabet in (b"+/", b"-_"):
        try:
            decoded = base64.b64decode(head, altchars=alphabet, validate=True)
        except (binascii.Error, ValueError):
            continue
        if decoded.lstrip().startswith(_PEM_PREFIX):
            return True
    return False


def _mask_base64_pem(match: re.Match[str]) -> str:
    run = match.group(0)
    # "/" "-" "_" are base64 and path characters alike: the encoded key may start after
    # a folder ("/tmp/LS0t..." in an OS error), so each start after one is tried too.
    starts = [0, *(i + 1 for i, ch in enumerate(run) if ch in "/-_")]
    for start in starts[: LIMITS.max_base64_starts]:
        if len(run) - start >= LIMITS.min_base64_chars and decodes_to_pem(run[start:]):
            return run[:start] + MASK
    return run


def redact(text: str, env: Mapping[str, str] | None = None) -> str:
    """``text`` with every secret it contains replaced by ``***``.

    Args:
        text: a message, a report, a comment or serialized JSON.
        env: the environment whose secret variables' values are removed (default
            ``os.environ``).

    Returns:
        The text with URL credentials, secret query parameters, authorization values,
        GitHub tokens, PEM blocks, base64-encoded PEM and the values of secret
        environment variables replaced; everything else unchanged.
    """
    env = os.environ if env is None else env
    # Literal values first: a value may itself be a URL or a PEM, and removing it whole
    # leaves no fragment for the patterns below to half-match.
    for value in secret_values(env):
        if value in text:
            text = text.replace(value, MASK)
    for word in secret_words(env):
        if word in text:
            text = re.sub(rf"(?<![A-Za-z0-9_]){re.escape(word)}(?![A-Za-z0-9_])", MASK, text)
    text = _PEM.sub(MASK, text)
    text = _BASE64_RUN.sub(_mask_base64_pem, text)
    for url in (_URL_USERINFO, _URL_PASSWORD):
        text = url.sub(lambda m: f"{m.group('scheme')}{MASK}@", text)
    for pattern in (_QUERY_SECRET, _AUTH_HEADER, _BEARER):
        text = pattern.sub(
            lambda m: m.group("name") + (m.group("value") if m.group("value") == MASK else MASK),
            text,
        )
    return _GITHUB_TOKEN.sub(MASK, text)


__all__ = [
    "LIMITS",
    "MASK",
    "RedactLimits",
    "is_secret_name",
    "redact",
    "secret_values",
    "secret_words",
]
