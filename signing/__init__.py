"""Trust for modelreg: keys, OMS signature bundles, TUF metadata.

Depends on ``registry`` only; used by ``pipelines`` (signing in CI) and ``edge_sync``
(verification on devices).
"""
