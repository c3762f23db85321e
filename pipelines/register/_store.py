"""The MLflow side of ``register``: read a model's mirror, apply actions to it.

Private: import from :mod:`pipelines.register._stage`.  MLflow is imported inside functions
only, so ``pipelines`` loads without it; every MLflow call runs inside :func:`session`,
which points MLflow at one tracking URI, keeps its logging and warnings away from the
user and turns its exceptions into :class:`RegistryMirrorError`.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from pipelines.errors import RegistryMirrorError
from pipelines.register._http import DEFAULT_LIMITS, MlflowLimits, bounded_client, unreachable
from pipelines.register._plan import (
    TAG_MANAGED,
    DesiredVersion,
    ObservedModel,
    ObservedVersion,
    mirrorable_metric,
)
from registry.schema import Signature

EXPERIMENT_PREFIX: Final = "modelreg/"
"""Each model's runs live in experiment ``modelreg/<model>``."""
EXTRAS_DIR: Final = "modelreg"
"""Run artifact folder of the diff report and the OMS bundle."""
_LOCAL_SCHEMES: Final = frozenset({"", "file", "sqlite"})
_QUIET_LOGGERS: Final = ("mlflow", "alembic", "sqlalchemy", "urllib3")
_QUIET_WARNINGS: Final = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)
# Manifest dtypes MLflow's tensor specs can express (numpy names); others get no
# MLflow signature rather than a wrong one.
_NUMPY_DTYPES: Final = frozenset(
    {"float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16",
     "uint32", "uint64", "bool"}
)  # fmt: skip


def _failures(*also: type[BaseException]) -> tuple[type[BaseException], ...]:
    """What a call that moves artifacts may raise: MLflow's errors, and, where the client
    writes to S3 itself (a server without ``--artifacts-destination``), boto's; and
    ``also``."""
    from mlflow.exceptions import MlflowException

    errors: list[type[BaseException]] = [MlflowException, OSError, *also]
    with contextlib.suppress(ImportError):
        from boto3.exceptions import Boto3Error
        from botocore.exceptions import BotoCoreError, ClientError

        errors += [Boto3Error, BotoCoreError, ClientError]
    return tuple(errors)


def _created_once(create: Callable[[], Any], find: Callable[[], Any | None]) -> Any:
    """Call MLflow's non-idempotent ``create``; ``find`` tells whether it happened anyway.

    MLflow's HTTP client retries every method on a 5xx or a timeout, POST included: a
    version created by a server whose answer was lost (a gateway timeout, a slow
    server past the client's timeout) is created a second time by the retry.  Here
    the create goes out once; after a server-side failure, ``find`` reads MLflow back
    (a GET, which MLflow retries as usual) and only if nothing was made is the create
    sent again, within MLflow's own retry count and backoff (``MLFLOW_HTTP_REQUEST_*``,
    set by :func:`bounded_client` or by the user), so retries are never stacked.
    """
    from mlflow.exceptions import MlflowException

    key = "MLFLOW_HTTP_REQUEST_MAX_RETRIES"
    before = os.environ.get(key)
    retries = int(before or "0")
    backoff = float(os.environ.get("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "0"))
    for attempt in range(retries + 1):
        os.environ[key] = "0"
        try:
            return create()
        except MlflowException as e:
            status: int = e.get_http_status_code()  # type: ignore[no-untyped-call]
            if status < 500 or attempt == retries:
                raise
        finally:
            if before is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = before
        found = find()
        if found is not None:
            return found
        time.sleep(backoff * 2**attempt)
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises


def redact(uri: str) -> str:
    """``uri`` without credentials (user, password, token, secret query values), for
    messages; the one redaction rule, ``registry.redact``, applied to a URI."""
    from registry.redact import redact as redact_text

    return redact_text(uri)


def is_local(uri: str) -> bool:
    """Whether ``uri`` is a store in a local file (sqlite, file), not a server."""
    return urlsplit(uri).scheme in _LOCAL_SCHEMES


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    # MLflow 3 reports usage telemetry unless told not to; never phone home from CI.
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    saved = {name: logging.getLogger(name).level for name in _QUIET_LOGGERS}
    for name in saved:
        # "Creating initial MLflow database tables...", alembic migrations, retries:
        # ours to summarize, not to pass on.
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        # MLflow and its SQLAlchemy store warn about their own internals (deprecated
        # loader strategies, pydantic fields); none of it is actionable by our user.
        with (
            warnings.catch_warnings(),
            contextlib.redirect_stdout(io.StringIO()),
            contextlib.redirect_stderr(io.StringIO()),
        ):
            for category in _QUIET_WARNINGS:
                warnings.simplefilter("ignore", category)
            # e.g. "Any type hint is inferred as AnyType" while MLflow imports its pyfunc types
            warnings.filterwarnings("ignore", category=UserWarning, module=r"mlflow\.")
            yield
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


@contextlib.contextmanager
def _pointed_at(uri: str) -> Iterator[None]:
    # An explicit MlflowClient is not enough: MLflow's SQL registry store looks logged
    # models up through a default client, and log_model uses the fluent API, both
    # reading the process-wide tracking URI.  Set it for the session, then put back
    # whatever the caller had (its module globals and the environment variables that
    # set_tracking_uri also writes).
    import mlflow
    from mlflow.tracking._model_registry import utils as registry_utils
    from mlflow.tracking._tracking_service import utils as tracking_utils

    env = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")}
    saved_tracking: str | None = tracking_utils._tracking_uri
    saved_registry: str | None = registry_utils._registry_uri
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(saved_tracking)  # type: ignore[arg-type]  # None unsets
        mlflow.set_registry_uri(saved_registry)  # type: ignore[arg-type]
        for key, value in env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@dataclass
class Store:
    """An open connection to one MLflow tracking server and model registry.

    Attributes:
        uri: the tracking (and registry) URI.
        artifact_root: where new experiments keep artifacts, for local stores only
            (a server decides for itself).
        client: the ``MlflowClient``.
    """

    uri: str
    artifact_root: Path | None
    client: Any

    def fail(self, message: str, error: BaseException) -> RegistryMirrorError:
        """Wrap an MLflow error for the user: one line, no MLflow internals."""
        detail = getattr(error, "message", None) or str(error) or type(error).__name__
        first = str(detail).strip().splitlines()
        return RegistryMirrorError(redact(self.uri), f"{message}: {first[0] if first else ''}")

    def read_model(self, name: str, *, runs: bool = True) -> ObservedModel:
        """The registered model ``name`` with its versions and aliases.

        Args:
            name: the registered model.
            runs: also read each version's run metrics (one search over the model's
                experiment, then the runs found elsewhere one by one).

        Raises:
            RegistryMirrorError: MLflow fails.
        """
        from mlflow.exceptions import MlflowException

        try:
            try:
                model = self.client.get_registered_model(name)
            except MlflowException as e:
                if getattr(e, "error_code", "") == "RESOURCE_DOES_NOT_EXIST":
                    return ObservedModel(name, exists=False)
                raise
            found: list[Any] = []
            token: str | None = None
            while True:
                page = self.client.search_model_versions(
                    f"name = '{name}'", max_results=1000, page_token=token
                )
                found.extend(page)
                token = page.token
                if not token:
                    break
            metrics = (
                self._run_metrics(name, {mv.run_id for mv in found if mv.run_id}) if runs else {}
            )
        except (MlflowException, OSError) as e:
            raise self.fail(f"cannot read registered model {name!r}", e) from e
        versions = tuple(
            ObservedVersion(
                str(mv.version),
                dict(mv.tags or {}),
                mv.run_id or None,
                mv.last_updated_timestamp,
                mv.description or "",
                metrics.get(mv.run_id) if mv.run_id else None,
            )
            for mv in found
        )
        aliases = {str(a): str(v) for a, v in (model.aliases or {}).items()}
        return ObservedModel(
            name,
            exists=True,
            versions=versions,
            aliases=aliases,
            last_updated=model.last_updated_timestamp,
            description=model.description or "",
        )

    def _run_metrics(self, model: str, run_ids: set[str]) -> dict[str, dict[str, float]]:
        """Latest metric values of ``run_ids``; a run that no longer exists is left out."""
        from mlflow.entities import ViewType
        from mlflow.exceptions import MlflowException

        metrics: dict[str, dict[str, float]] = {}
        if not run_ids:
            return metrics
        experiment = self.client.get_experiment_by_name(EXPERIMENT_PREFIX + model)
        if experiment is not None:
            token: str | None = None
            while True:
                page = self.client.search_runs(
                    [experiment.experiment_id],
                    run_view_type=ViewType.ALL,
                    max_results=1000,
                    page_token=token,
                )
                for run in page:
                    metrics[run.info.run_id] = dict(run.data.metrics)
                token = page.token
                if not token:
                    break
        for run_id in sorted(run_ids - set(metrics)):
            # A version registered by hand from a run in another experiment.
            try:
                metrics[run_id] = dict(self.client.get_run(run_id).data.metrics)
            except MlflowException as e:
                if getattr(e, "error_code", "") != "RESOURCE_DOES_NOT_EXIST":
                    raise
        return {k: v for k, v in metrics.items() if k in run_ids}

    def create_model(self, name: str, description: str) -> None:
        """Create the registered model ``name``, marked as managed by modelreg.

        Raises:
            RegistryMirrorError: MLflow fails.
        """
        from mlflow.exceptions import MlflowException

        def exists() -> bool | None:
            try:
                self.client.get_registered_model(name)
            except MlflowException:
                return None
            return True

        try:
            _created_once(
                lambda: self.client.create_registered_model(
                    name, tags={TAG_MANAGED: "true"}, description=description or None
                ),
                exists,
            )
        except (MlflowException, OSError) as e:
            raise self.fail(f"cannot create registered model {name!r}", e) from e

    def _experiment(self, model: str) -> str:
        name = EXPERIMENT_PREFIX + model
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            if found.lifecycle_stage == "deleted":
                self.client.restore_experiment(found.experiment_id)
            return str(found.experiment_id)
        location = None
        if self.artifact_root is not None:
            # SQL stores default to ./mlruns of whatever folder the command ran in.
            location = (self.artifact_root / model).as_uri()
        return str(self.client.create_experiment(name, artifact_location=location))

    def create_version(
        self,
        model: str,
        want: DesiredVersion,
        artifact: Path,
        signature: Signature | None,
        extras: Mapping[str, Path],
    ) -> str:
        """Log ``artifact`` with the ONNX flavor in a run and register it.

        Args:
            model: the registered model (which exists).
            want: the version and its tags.
            artifact: the ONNX file, whose bytes MLflow gets unchanged.
            signature: the manifest's I/O contract, recorded as MLflow's signature.
            extras: run artifacts to attach (diff report, OMS bundle) by file name.

        Returns:
            The new MLflow version number.

        Raises:
            RegistryMirrorError: MLflow fails.
        """
        import mlflow
        import mlflow.onnx
        import onnx

        from registry.onnx_wire import WireFormatError, external_initializers

        tags = {**want.tags, **want.creation_tags}
        try:
            experiment = self._experiment(model)
            with mlflow.start_run(
                experiment_id=experiment, run_name=f"{model} {want.semver}", tags=tags
            ) as run:
                raw = artifact.read_bytes()
                external = bool(external_initializers(raw))
                info = mlflow.onnx.log_model(
                    # A model with ONNX external data (over 2 GB) cannot be one protobuf
                    # message: loaded from its path (the data files beside it, verified
                    # against their pointers) and saved by the flavor as external data,
                    # which mlflow.onnx.load_model reads back.
                    onnx_model=onnx.load_model(str(artifact))
                    if external
                    else onnx.load_model_from_string(raw),
                    name=model,
                    # One file: byte-for-byte the artifact Git and DVC track.
                    save_as_external_data=external,
                    # Inferring requirements loads the model in a subprocess; the
                    # flavor's defaults are what inference would find anyway.
                    pip_requirements=mlflow.onnx.get_default_pip_requirements(),
                    signature=_mlflow_signature(signature),
                )
                for path in extras.values():
                    mlflow.log_artifact(str(path), EXTRAS_DIR)
                mirrored = {k: v for k, v in want.metrics.items() if mirrorable_metric(k)}
                if mirrored:
                    mlflow.log_metrics(mirrored)
            run_id = run.info.run_id
            version = _created_once(
                lambda: self.client.create_model_version(
                    model,
                    source=f"models:/{info.model_id}",
                    run_id=run_id,
                    tags=tags,
                    description=want.description or None,
                    model_id=info.model_id,
                ),
                lambda: next(iter(self.client.search_model_versions(f"run_id = '{run_id}'")), None),
            )
        except _failures(WireFormatError) as e:
            raise self.fail(f"cannot register {model} {want.semver}", e) from e
        return str(version.version)

    def attach(self, run_id: str, extras: Mapping[str, Path], what: str) -> None:
        """Attach ``extras`` to an existing run (a bundle signed after registration).

        Raises:
            RegistryMirrorError: MLflow fails.
        """
        try:
            for path in extras.values():
                self.client.log_artifact(run_id, str(path), EXTRAS_DIR)
        except _failures() as e:
            raise self.fail(f"cannot attach artifacts to {what}", e) from e

    def set_tags(self, model: str, number: str, tags: Mapping[str, str]) -> None:
        """Set tags on MLflow version ``number``.

        Raises:
            RegistryMirrorError: MLflow fails.
        """
        from mlflow.exceptions import MlflowException

        try:
            for key, value in tags.items():
                self.client.set_model_version_tag(model, number, key, value)
        except MlflowException as e:
            raise self.fail(f"cannot tag {model} version {number}", e) from e

    def delete_tags(self, model: str, number: str, keys: tuple[str, ...]) -> None:
        """Delete tags from MLflow version ``number``.

        Raises:
            RegistryMirrorError: MLflow fails.
        """
        from mlflow.exceptions import MlflowException

        try:
            for key in keys:
                self.client.delete_model_version_tag(model, number, key)
        except MlflowException as e:
            raise self.fail(f"cannot untag {model} version {number}", e) from e

    def set_model_description(self, model: str, description: str) -> None:
        """Set the registered model's description.

        Raises:
            RegistryMirrorError: MLflow fails.
        """
        from mlflow.exceptions import MlflowException

        try:
            self.client.update_registered_model(model, description=description)
        except MlflowException as e:
            raise self.fail(f"cannot describe {model}", e) from e

    def set_version_description(self, model: str, number: str, description: str) -> None:
        """Set MLflow version ``number``'s description.

        Raises:
            RegistryMirrorError: MLflow fails.
        """
        from mlflow.exceptions import MlflowException

        try:
            self.client.update_model_version(model, number, description=description)
        except MlflowException as e:
            raise self.fail(f"cannot describe {model} version {number}", e) from e

    def log_metrics(self, run_id: str, metrics: Mapping[str, float], what: str) -> None:
        """Log ``metrics`` to run ``run_id`` (MLflow shows the latest value of each).

        Raises:
            RegistryMirrorError: MLflow fails (a deleted run, say).
        """
        from mlflow.entities import Metric
        from mlflow.exceptions import MlflowException

        now = int(time.time() * 1000)
        try:
            self.client.log_batch(
                run_id, metrics=[Metric(k, v, now, 0) for k, v in metrics.items()]
            )
        except MlflowException as e:
            raise self.fail(f"cannot log metrics of {what}", e) from e

    def set_alias(self, model: str, alias: str, number: str) -> None:
        """Point ``model@alias`` at MLflow version ``number``.

        Raises:
            RegistryMirrorError: MLflow fails.
        """
        from mlflow.exceptions import MlflowException

        try:
            self.client.set_registered_model_alias(model, alias, number)
        except MlflowException as e:
            raise self.fail(f"cannot set alias {model}@{alias}", e) from e

    def delete_alias(self, model: str, alias: str) -> None:
        """Remove ``model@alias``.

        Raises:
            RegistryMirrorError: MLflow fails.
        """
        from mlflow.exceptions import MlflowException

        try:
            self.client.delete_registered_model_alias(model, alias)
        except MlflowException as e:
            raise self.fail(f"cannot remove alias {model}@{alias}", e) from e


def _mlflow_signature(signature: Signature | None) -> Any:
    if signature is None:
        return None
    tensors = [*signature.inputs, *signature.outputs]
    if any(t.dtype not in _NUMPY_DTYPES for t in tensors):
        return None
    import numpy as np
    from mlflow.models import ModelSignature
    from mlflow.types.schema import Schema, TensorSpec

    def schema(specs: list[Any]) -> Any:
        return Schema(
            [
                TensorSpec(
                    np.dtype(t.dtype),
                    tuple(d if isinstance(d, int) else -1 for d in t.shape),
                    t.name,
                )
                for t in specs
            ]
        )

    return ModelSignature(inputs=schema(signature.inputs), outputs=schema(signature.outputs))


@contextlib.contextmanager
def session(
    uri: str, artifact_root: Path | None, *, limits: MlflowLimits = DEFAULT_LIMITS
) -> Iterator[Store]:
    """Open MLflow at ``uri`` for the duration of the block.

    A tracking server is probed first, and MLflow's client retries within ``limits``
    (see :mod:`pipelines.register._http`): an unreachable server fails in seconds.

    Args:
        uri: tracking and registry URI.
        artifact_root: artifact folder for new experiments of a local store.
        limits: timeouts and retries of the HTTP client.

    Raises:
        RegistryMirrorError: MLflow is not installed, the server is unreachable or the
            store cannot be opened.
    """
    # Before MLflow is even imported (a few seconds): an unreachable server is known
    # at once.
    why = unreachable(uri, limits)
    if why is not None:
        raise RegistryMirrorError(redact(uri), why)
    with _quiet(), bounded_client(limits):
        try:
            import mlflow
            from mlflow.exceptions import MlflowException
        except ImportError:
            raise RegistryMirrorError(
                redact(uri), "MLflow is not installed; install modelreg[ci]"
            ) from None
        if artifact_root is not None:
            artifact_root.mkdir(parents=True, exist_ok=True)
        with _pointed_at(uri):
            try:
                client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
                # Opening a SQL store creates or migrates its tables; do it here so a
                # bad URI fails as "cannot open", not in the middle of a change.
                client.search_experiments(max_results=1)
            except (MlflowException, OSError) as e:
                raise Store(uri, artifact_root, None).fail("cannot open the store", e) from e
            yield Store(uri, artifact_root, client)
