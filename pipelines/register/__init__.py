"""``modelreg register``: mirror what Git released into MLflow's Model Registry (stable API).

:func:`register` plans (:mod:`pipelines.register._plan`, pure: the desired state against
what MLflow holds, see :func:`reconcile`) and applies the plan through one MLflow client
(``_store``, its HTTP bounds in ``_http``); :func:`check_drift` reports the same
differences without changing anything.
"""

from __future__ import annotations

from pipelines.errors import RegistryMirrorError
from pipelines.register._plan import (
    DesiredModel,
    DesiredVersion,
    Drift,
    DriftKind,
    ObservedModel,
    ObservedVersion,
    Reconciliation,
    reconcile,
)
from pipelines.register._stage import (
    DEFAULT_ARTIFACTS,
    DEFAULT_STORE,
    Change,
    RegisterReport,
    ReleaseExtras,
    check_drift,
    drift_json,
    mlflow_versions,
    register,
    resolve_tracking_uri,
)

__all__ = [
    "DEFAULT_ARTIFACTS",
    "DEFAULT_STORE",
    "Change",
    "DesiredModel",
    "DesiredVersion",
    "Drift",
    "DriftKind",
    "ObservedModel",
    "ObservedVersion",
    "Reconciliation",
    "RegisterReport",
    "RegistryMirrorError",
    "ReleaseExtras",
    "check_drift",
    "drift_json",
    "mlflow_versions",
    "reconcile",
    "register",
    "resolve_tracking_uri",
]
