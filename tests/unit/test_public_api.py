"""The public surface of each package, pinned (as httpx pins ``httpx.__all__``).

A name leaving ``__all__`` breaks callers, so the lists are written out here: a change to
them is a reviewed change to this file.  Every module whose docstring calls itself
"stable API" is listed, each name resolves, and no package reaches into another
package's private modules or private names (the packages' own tests may).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

PACKAGES = (
    "modelreg", "pipelines", "registry", "signing", "edge_sync", "fleet", "benchmarks", "scripts",
)  # fmt: skip
"""What ships or runs as code of the project (``tests`` may look inside)."""

PUBLIC: dict[str, set[str]] = {
    "edge_sync.config": {
        "ArtifactsConfig",
        "BatchingConfig",
        "DeviceConfig",
        "EdgeConfig",
        "ModelLimits",
        "ReportConfig",
        "RepositoryConfig",
        "ServeConfig",
        "ServeLimitsConfig",
        "Subscription",
        "TrustAnchorConfig",
        "batching_of",
        "load_edge_config",
        "parse_duration",
        "parse_size",
    },
    "edge_sync.engine.base": {
        "CacheStats",
        "DATATYPES",
        "Engine",
        "EngineHost",
        "LoadRequest",
        "NUMPY_DTYPES",
        "PrepackDecision",
        "SetupHost",
        "TensorLayout",
        "TensorDecl",
    },
    "edge_sync.engine.ort": {
        "CPU_TARGET",
        "OrtEngine",
    },
    "edge_sync.engine.selftest": {
        "GoldenArrays",
        "WARMUP_RUNS",
        "check_goldens",
        "confirm_setups",
        "other_setups",
        "self_test",
    },
    "edge_sync.sync.limits": {
        "TrustLimits",
    },
    "edge_sync.errors": {
        "EngineClosedError",
        "EngineError",
        "GitError",
        "GitStoreError",
        "LockedError",
        "RefusedError",
        "RemoteMetadataError",
        "SelfTestError",
        "SendError",
        "SourceError",
        "StateError",
        "StoppedError",
        "WeightError",
    },
    "edge_sync.state.models": {
        "Attempt",
        "DaemonInfo",
        "DeviceState",
        "FORMAT",
        "GateRecord",
        "Installed",
        "MAX_REJECTED",
        "ModelState",
        "Rejected",
        "SyncInfo",
        "UpdateRecord",
        "reason_text",
    },
    "edge_sync.state.store": {
        "BLOBS_DIR",
        "BlobStore",
        "STATE_FILE",
        "StateDir",
    },
    "edge_sync.sync.trust": {
        "ANCHOR_FILE",
        "DeviceTrust",
        "Freshness",
        "LocalFetcher",
        "RoleState",
        "SignedTarget",
        "TRUST_DIR",
        "TrustLimits",
        "expect_facts",
        "expired_roles",
        "foreign_root",
        "freshness",
        "last_channels",
        "trust_expiries",
        "trusted_role",
        "trusted_targets",
    },
    "fleet.channels": {
        "declared_channels",
    },
    "fleet.enrollment": {
        "EnrollResult",
        "enroll",
        "keys_in_folder",
        "revoke",
    },
    "fleet.reports": {
        "Entry",
        "FleetLimits",
        "LoadedReports",
        "ReportsError",
        "Unreadable",
        "load_reports",
        "read_entry",
    },
    "fleet.trust": {
        "SEEN_FILE",
        "ReportTrust",
        "repository_trust",
    },
    "fleet.summary": {
        "ChannelProgress",
        "ChannelTarget",
        "DEFAULT_STALE_AFTER_S",
        "FleetSummary",
        "StaleDevice",
        "channel_progress",
        "latest",
        "summarize",
    },
    "pipelines.authoring": {
        "AddVersionResult",
        "INDEX_ENV",
        "InitResult",
        "WORKFLOWS",
        "add_model",
        "add_version",
        "init_repo",
        "write_workflows",
    },
    "pipelines.build": {
        "BUILD_DIR",
        "MAX_RECORD_BYTES",
        "ExternalFile",
        "BUILT",
        "BuildError",
        "BuildProblem",
        "BuildRecord",
        "BuildReport",
        "EngineResult",
        "FAILED",
        "ON_DEVICE",
        "RECORD_FILE",
        "STAGES",
        "Stage",
        "build",
        "build_version",
        "changed_versions",
    },
    "pipelines.ci": {
        "CI_DIR",
        "CiReport",
        "approval_problems",
        "ci_pr",
        "ci_release",
        "uncommitted_note",
    },
    "pipelines.diff": {
        "BaseDiff",
        "GoldenDrift",
        "GraphDiff",
        "JSON_FORMAT",
        "MarkdownLimits",
        "MetricDelta",
        "ModelDiff",
        "ModelInfo",
        "ModelInput",
        "NodeChange",
        "OpCount",
        "OpsetChange",
        "OutputDrift",
        "Side",
        "SignatureChange",
        "SignatureKind",
        "SkippedCase",
        "TensorChange",
        "TensorInfo",
        "TensorReshape",
        "Verdict",
        "WeightsDiff",
        "append_step_summary",
        "base_json",
        "base_markdown",
        "changed_versions",
        "compare_tensors",
        "diff_against_base",
        "diff_metrics",
        "diff_models",
        "diff_nodes",
        "diff_opsets",
        "diff_signature",
        "diff_versions",
        "diff_weights",
        "summary",
        "to_json",
        "to_markdown",
    },
    "pipelines.errors": {
        "ArtifactError",
        "BuildError",
        "GitHubError",
        "PipelineError",
        "RegistryMirrorError",
    },
    "pipelines.onnx": {
        "ExternalData",
        "ExternalDataLimits",
        "ExternalTensor",
        "NodeArg",
        "Session",
        "external_data",
        "load_onnx",
        "load_onnx_external",
        "load_session",
        "ort_errors",
        "read_signature",
        "signature_from_model",
    },
    "pipelines.publish": {
        "CiContext",
        "PublishReport",
        "RefreshReport",
        "RELEASE_DIR",
        "TUF_SUBDIR",
        "TargetStore",
        "branch_problems",
        "current_branch",
        "engine_file_name",
        "publish",
        "published_provenance",
        "refresh_metadata",
        "released_changes",
        "released_deprecations",
    },
    "pipelines.register": {
        "Change",
        "DEFAULT_ARTIFACTS",
        "DEFAULT_STORE",
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
    },
    "registry.atomic": {
        "AtomicFile",
        "current_umask",
        "fsync_dir",
        "replace_file",
        "replacement_mode",
        "write_atomic",
    },
    "registry.config": {
        "CONFIG_FILE",
        "ExpiryDays",
        "MlflowConfig",
        "RepoConfig",
        "TrustConfig",
        "find_root",
        "has_trust_metadata",
        "load_config",
    },
    "registry.validation": {"Validation", "validate_repository"},
    "registry.sessions": {
        "OPTIMIZATION_LEVELS",
        "PREPACKED",
        "SHARED",
        "SessionSetup",
        "session_setups",
    },
    "registry.cohort": {
        "cohort_draw",
        "in_cohort",
    },
    "registry.device_report": {
        "DEVICE_ID_RE",
        "DaemonReport",
        "DaemonStatus",
        "DeviceId",
        "DeviceReport",
        "GateReport",
        "InstalledReport",
        "KIND",
        "LIMITS",
        "ModelReport",
        "ProvenanceReport",
        "REPORT_FORMAT",
        "RejectedReport",
        "ReportError",
        "ReportLimits",
        "Role",
        "StatusDocument",
        "SyncReport",
        "TrustReport",
        "UpdateReport",
        "encode_report",
        "parse_report",
    },
    "registry.delta": {
        "BaseMismatchError",
        "CorruptDeltaError",
        "DeltaError",
        "DeltaHeader",
        "DeltaLimits",
        "FORMAT_VERSION",
        "decode",
        "encode",
        "encode_external",
        "read_header",
    },
    "registry.delta.errors": {
        "BaseMismatchError",
        "CorruptDeltaError",
        "DeltaError",
    },
    "registry.errors": {
        "FileTooLargeError",
        "GoldenError",
        "MESSAGE_LIMIT",
        "ManifestError",
        "PolicyError",
        "Problem",
        "QUOTE_LIMIT",
        "RegistryError",
        "RepositoryError",
        "ToolError",
        "UnsafeFileError",
        "UsageError",
        "one_line",
        "printable",
        "quote",
    },
    "registry.goldens": {
        "Comparison",
        "DEFAULT_NPZ_LIMITS",
        "NpyHeader",
        "NpzLimits",
        "array_problem",
        "bfloat16_to_float32",
        "compare",
        "directory_problem",
        "inline_array",
        "npz_bytes",
        "read_npz",
        "tensor_set",
    },
    "registry.layout": {
        "MODEL_FILE",
        "ManifestPath",
        "VERSIONS_DIR",
        "VERSION_SUFFIX",
        "model_dir",
        "model_file",
        "parse_manifest_path",
        "version_file",
        "version_file_name",
        "versions_dir",
    },
    "registry.progress": {
        "LineReporter",
        "ProgressReporter",
        "RichReporter",
        "Stage",
        "for_environment",
        "reporting",
        "stage",
    },
    "registry.redact": {
        "LIMITS",
        "MASK",
        "RedactLimits",
        "is_secret_name",
        "redact",
        "secret_values",
        "secret_words",
    },
    "registry.safe_io": {
        "check_folder",
        "check_regular",
        "folder_reader",
        "open_regular",
        "read_regular",
        "reusing_folders",
    },
    "registry.schema": {
        "API_VERSION",
        "Artifact",
        "Channel",
        "DNS_LABEL_RE",
        "DType",
        "Deprecation",
        "Dim",
        "Duration",
        "GoldenCase",
        "Goldens",
        "INLINE_LIMITS",
        "InlineTensorLimits",
        "KINDS",
        "LABEL_KEY_RE",
        "LabelKey",
        "LabelValue",
        "Labels",
        "MAX_DIM",
        "MAX_RANK",
        "Manifest",
        "ModelMetadata",
        "ModelVersion",
        "ModelVersionSpec",
        "Name",
        "OnnxRuntimeTarget",
        "Percent",
        "Promotion",
        "Reason",
        "RegisteredModel",
        "RegisteredModelSpec",
        "RepoPath",
        "Rollout",
        "RolloutStop",
        "SYMBOL_RE",
        "SemVer",
        "Shadow",
        "ShortText",
        "Signature",
        "Source",
        "Strict",
        "Symbol",
        "Target",
        "Tensor",
        "TensorRTTarget",
        "TensorSet",
        "TensorSpec",
        "Tolerance",
        "VersionMetadata",
        "Wave",
        "file_name_problem",
        "inline_shape_problem",
        "is_semver",
        "repo_path",
    },
    "registry.units": {
        "MAX_DURATION_S",
        "format_duration",
        "parse_duration",
    },
    "signing.errors": {
        "DigestMismatchError",
        "ExpiredError",
        "FileSetError",
        "ForeignRootError",
        "HistoryError",
        "KeyMaterialError",
        "RollbackError",
        "SignatureError",
        "SigningError",
        "StaleKeyError",
        "TargetMismatchError",
        "TrustFetchError",
        "VerificationError",
    },
    "signing.hashing": {
        "DEFAULT_CHUNK",
        "HashSettings",
        "MIN_CHUNK",
        "RING_BUFFERS",
        "SINGLE_FILE",
        "default_workers",
        "hash_file",
        "list_model_files",
        "sha256_file",
        "sha256_files",
    },
    "signing.keys": {
        "KeyFiles",
        "PEM_HEADER",
        "ROLES",
        "SCHEME",
        "env_var",
        "generate",
        "key_value_kind",
        "load_private_key",
        "load_public_key",
        "private_key_from_env",
        "private_pem",
        "public_key_of",
        "public_pem",
        "signer_from_env",
        "write_keypair",
    },
    "signing.target_names": {
        "CHANNELS_PATH",
        "ENGINE_SUFFIXES",
        "GoldenSide",
        "artifact_path",
        "bundle_path",
        "delta_path",
        "deprecation_path",
        "engine_file_name",
        "engine_path",
        "external_data_delta_path",
        "external_data_path",
        "golden_path",
        "object_path",
        "provenance_path",
        "version_path",
    },
    "signing.device_reports": {
        "KEY_SUFFIX",
        "MAX_KEY_BYTES",
        "MAX_SIGNATURES",
        "PAYLOAD_TYPE",
        "Enrolled",
        "Seen",
        "is_envelope",
        "open_envelope",
        "public_key_from_pem",
        "read_enrolled",
        "seal_report",
        "standing",
        "verify_report",
    },
    "signing.provenance": {
        "BUILD_TYPE",
        "LOCAL_BUILDER",
        "PAYLOAD_TYPE",
        "SLSA_PREDICATE",
        "STATEMENT_TYPE",
        "Approval",
        "CiRun",
        "Policy",
        "Provenance",
        "PullRequestFacts",
        "open_envelope",
        "review_of",
        "sign_envelope",
        "slsa_statement",
        "verify_envelope",
    },
    "signing.version_doc": {
        "GoldenCaseDoc",
        "GraphDoc",
        "MAX_TENSORS",
        "MAX_VERSION_DOC_BYTES",
        "TensorDoc",
        "TensorManifest",
        "VersionDoc",
    },
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources(*tops: str) -> list[Path]:
    return sorted(p for top in tops for p in (REPO_ROOT / top).rglob("*.py"))


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_public_names_are_pinned_and_resolve(module: str) -> None:
    mod = importlib.import_module(module)
    assert set(mod.__all__) == PUBLIC[module]
    assert len(mod.__all__) == len(set(mod.__all__)), "a name listed twice"
    missing = [name for name in mod.__all__ if not hasattr(mod, name)]
    assert not missing, f"{module}.__all__ names what it does not define: {missing}"


def test_every_module_that_claims_a_stable_api_is_pinned() -> None:
    claimed = {
        _module_name(path)
        for path in _sources("pipelines", "registry", "signing", "edge_sync", "fleet")
        if "stable API" in (ast.get_docstring(ast.parse(path.read_text())) or "")
    }
    assert claimed <= set(PUBLIC), f"stable API without a pinned surface: {claimed - set(PUBLIC)}"


def _private_reach(importer: str, node: ast.ImportFrom) -> list[str]:
    """The private modules or names ``node`` takes from outside their own package."""
    assert node.module is not None
    parts = node.module.split(".")
    private = [i for i, part in enumerate(parts) if part.startswith("_") and part != "__future__"]
    if private:
        owner = ".".join(parts[: private[0]])
        if importer == owner or importer.startswith(owner + "."):
            return []
        return [node.module]
    # ``from pkg import _name``: only pkg's own modules (or, when pkg is a module, its
    # package's) may take a private name of it.
    package = importlib.util.find_spec(node.module)
    is_package = package is not None and package.submodule_search_locations is not None
    owner = node.module if is_package else node.module.rpartition(".")[0]
    if owner and (importer == owner or importer.startswith(owner + ".")):
        return []
    return [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_")]


def test_no_package_imports_another_ones_private_modules_or_names() -> None:
    ours = set(PACKAGES)
    found: list[str] = []
    for path in _sources(*PACKAGES):
        importer = _module_name(path)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and node.level == 0
                and node.module.split(".")[0] in ours
            ):
                found += [f"{importer}: {name}" for name in _private_reach(importer, node)]
    assert not found, "private names used across packages:\n" + "\n".join(found)


def test_the_private_reach_rule_itself() -> None:
    def reach(importer: str, source: str) -> list[str]:
        node = ast.parse(source).body[0]
        assert isinstance(node, ast.ImportFrom)
        return _private_reach(importer, node)

    assert reach("modelreg.cli.build_cmd", "from pipelines.build._stage import build")
    assert reach("pipelines.ci._release", "from pipelines.build._stage import build")
    assert reach("benchmarks.x", "from edge_sync.daemon import _provision")
    assert not reach("pipelines.build._stage", "from pipelines.build._checks import check_onnx")
    assert not reach("pipelines.dvc", "from pipelines._probe import first_answer")
    assert not reach("pipelines.build._stage", "from pipelines.build import _checks")
    assert not reach("modelreg.cli.build_cmd", "from pipelines.build import build")
    assert reach("pipelines.ci._pr", "from pipelines.build import _checks")
    assert not reach("edge_sync.engine.host", "from edge_sync.daemon import _x")
