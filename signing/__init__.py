"""Trust for modelreg: keys, OMS signature bundles, TUF metadata.

Depends on ``registry`` only; used by ``pipelines`` (signing in CI) and ``edge_sync``
(verification on devices).
"""

import sys as _sys


def _load_signers_without_boto3() -> None:
    # securesystemslib.signer (which tuf.api.metadata imports) imports boto3 whenever
    # it is installed, for an AWS KMS signer modelreg never uses: 0.15 s of every
    # command that reads TUF metadata (`modelreg status`).  Hide boto3 for that one
    # import; it stays importable afterwards (the S3 transports import it themselves).
    if "securesystemslib.signer" in _sys.modules or "boto3" in _sys.modules:
        return
    _sys.modules["boto3"] = None  # type: ignore[assignment]
    try:
        import securesystemslib.signer  # noqa: F401
    finally:
        del _sys.modules["boto3"]


_load_signers_without_boto3()
