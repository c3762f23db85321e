"""What MLflow should look like, what it looks like, and the way from one to the other.

Private: import from :mod:`pipelines.register._stage`.  Pure data and decisions, no I/O: the
desired state is built from the Git repository by ``register.py``, the observed state is
read from MLflow by ``_store.py``, and :func:`reconcile` compares them into the
drift a reviewer reads and the actions ``register`` takes.  Both come from the same
comparison, so ``register --check`` reports exactly what ``register`` would change (plus
what it cannot change by itself, such as a version nobody declared).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

TAG_PREFIX: Final = "modelreg."
TAG_GIT_COMMIT: Final = "modelreg.git_commit"
TAG_SEMVER: Final = "modelreg.semver"
TAG_SHA256: Final = "modelreg.sha256"
TAG_DVC_MD5: Final = "modelreg.dvc_md5"
TAG_BUNDLE_DIGEST: Final = "modelreg.bundle_digest"
TAG_CI_RUN_ID: Final = "modelreg.ci_run_id"
TAG_CI_RUN_URL: Final = "modelreg.ci_run_url"
TAG_PARENT: Final = "modelreg.parent"
TAG_DEPRECATED: Final = "modelreg.deprecated"
TAG_DIFF_SUMMARY: Final = "modelreg.diff_summary"
TAG_OWNER: Final = "modelreg.owner"
"""The model's owner (``spec.owner`` of model.yaml), on each of its versions."""
TAG_MANAGED: Final = "modelreg.managed"
"""On the registered model: modelreg owns its versions and aliases."""

DriftKind = Literal[
    "model-missing",
    "version-missing",
    "version-duplicate",
    "version-unknown",
    "tag-missing",
    "tag-differs",
    "tag-unexpected",
    "alias-missing",
    "alias-moved",
    "alias-extra",
    "alias-unreleased",
    "description-differs",
    "metric-missing",
    "metric-differs",
    "metric-unexpected",
    "metric-unmirrorable",
]

# MLflow's rule for metric names (POSIX): these characters, and a name that stays
# itself as a path.  A manifest may use others; such a metric is reported, not sent.
_METRIC_NAME: Final = re.compile(r"[/\w.\- :]*")
_SHOWN: Final = 60


@dataclass(frozen=True, slots=True)
class Drift:
    """One difference between the Git repository and its MLflow mirror.

    Attributes:
        kind: what differs (``alias-moved``, ``tag-differs``, ...).
        model: the registered model.
        subject: what differs within it: ``@alias``, `` 1.0.0`` (a version), or
            `` MLflow version 3`` (a version no manifest declares); empty for the model.
        message: what was found and what Git says, on one line.
        fixable: whether ``modelreg register`` repairs it (it never deletes versions).
    """

    kind: DriftKind
    model: str
    subject: str
    message: str
    fixable: bool = True

    def __str__(self) -> str:
        return f"{self.model}{self.subject}: {self.message}"


@dataclass(frozen=True, slots=True)
class DesiredVersion:
    """One released ModelVersion as MLflow should hold it.

    Attributes:
        semver: the version.
        tags: tags that must have exactly these values.
        absent: managed tags that must not exist (``modelreg.parent`` of a root version).
        creation_tags: tags written only when the version is created: the CI run
            that registered it stays its CI run, whichever run looks again later.
        description: the MLflow version's description (the manifest's).
        metrics: metrics of the version's MLflow run (the manifest's ``spec.metrics``).
    """

    semver: str
    tags: Mapping[str, str]
    absent: frozenset[str] = frozenset()
    creation_tags: Mapping[str, str] = field(default_factory=dict)
    description: str = ""
    metrics: Mapping[str, float] = field(default_factory=dict)

    @property
    def sha256(self) -> str:
        """SHA-256 of the artifact."""
        return self.tags[TAG_SHA256]


@dataclass(frozen=True, slots=True)
class DesiredModel:
    """One RegisteredModel as MLflow should hold it.

    Attributes:
        name: the model.
        versions: released versions by SemVer, oldest first.
        aliases: channel -> SemVer it serves.
        unreleased: versions declared but not released (manifest not committed).
        description: the registered model's description (model.yaml's).
    """

    name: str
    versions: Mapping[str, DesiredVersion]
    aliases: Mapping[str, str]
    unreleased: frozenset[str] = frozenset()
    description: str = ""


@dataclass(frozen=True, slots=True)
class ObservedVersion:
    """One MLflow model version as read back.

    ``metrics`` are its run's latest values, None when it has no run to read (registered
    by hand without one, or the run is gone) or the runs were not read.
    """

    number: str
    tags: Mapping[str, str]
    run_id: str | None = None
    last_updated: int | None = None
    description: str = ""
    metrics: Mapping[str, float] | None = None

    @property
    def semver(self) -> str | None:
        """Its ``modelreg.semver`` tag, if any."""
        return self.tags.get(TAG_SEMVER)


@dataclass(frozen=True, slots=True)
class ObservedModel:
    """One MLflow registered model as read back (``exists`` False when absent)."""

    name: str
    exists: bool
    versions: tuple[ObservedVersion, ...] = ()
    aliases: Mapping[str, str] = field(default_factory=dict)
    """Alias -> MLflow version number."""
    last_updated: int | None = None
    description: str = ""


@dataclass(frozen=True, slots=True)
class CreateModel:
    """Create the registered model."""


@dataclass(frozen=True, slots=True)
class CreateVersion:
    """Log the artifact and register it as a new MLflow version."""

    semver: str


@dataclass(frozen=True, slots=True)
class SetTags:
    """Set (add or overwrite) tags on an existing MLflow version."""

    semver: str
    number: str
    tags: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class DeleteTags:
    """Delete managed tags that Git says must not exist."""

    semver: str
    number: str
    keys: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SetModelDescription:
    """Set the registered model's description."""

    description: str


@dataclass(frozen=True, slots=True)
class SetVersionDescription:
    """Set an existing MLflow version's description."""

    semver: str
    number: str
    description: str


@dataclass(frozen=True, slots=True)
class LogMetrics:
    """Log metric values to an existing version's run (the latest value is MLflow's)."""

    semver: str
    number: str
    run_id: str
    metrics: Mapping[str, float]


@dataclass(frozen=True, slots=True)
class SetAlias:
    """Point ``alias`` at the MLflow version of ``semver`` (resolved when applied)."""

    alias: str
    semver: str


@dataclass(frozen=True, slots=True)
class DeleteAlias:
    """Remove an alias no channel declares."""

    alias: str


Action = (
    CreateModel
    | SetModelDescription
    | CreateVersion
    | SetTags
    | DeleteTags
    | SetVersionDescription
    | LogMetrics
    | SetAlias
    | DeleteAlias
)


def mirrorable_metric(name: str) -> bool:
    """Whether MLflow accepts ``name`` as a metric name (its characters, a plain path)."""
    if _METRIC_NAME.fullmatch(name) is None:
        return False
    norm = posixpath.normpath(name)
    return norm == name and norm != "." and not norm.startswith(("..", "/"))


def _shown(text: str) -> str:
    """A description on one line, cut for a message."""
    flat = " ".join(text.split())
    return repr(flat if len(flat) <= _SHOWN else flat[: _SHOWN - 1] + "…")


@dataclass(frozen=True, slots=True)
class Reconciliation:
    """The outcome of comparing one model.

    Attributes:
        drifts: every difference, in a stable order.
        actions: what ``register`` does, in order (model, versions, tags, aliases).
        numbers: SemVer -> MLflow version number, for versions that exist already.
    """

    drifts: tuple[Drift, ...]
    actions: tuple[Action, ...]
    numbers: Mapping[str, str]


def _match(
    desired: DesiredModel, observed: ObservedModel, drifts: list[Drift]
) -> dict[str, ObservedVersion]:
    """Pair declared versions with MLflow versions: by SemVer tag, then by SHA-256."""
    by_semver: dict[str, list[ObservedVersion]] = {}
    for version in observed.versions:
        semver = version.semver
        if semver is not None and semver in desired.versions:
            by_semver.setdefault(semver, []).append(version)
    matched: dict[str, ObservedVersion] = {}
    for semver, found in by_semver.items():
        found.sort(key=lambda v: _number_key(v.number))
        matched[semver] = found[0]
        if len(found) > 1:
            drifts.append(
                Drift(
                    "version-duplicate",
                    desired.name,
                    f" {semver}",
                    f"registered {len(found)} times in MLflow (versions "
                    f"{', '.join(v.number for v in found)}); modelreg keeps version "
                    f"{found[0].number}, delete the others by hand",
                    fixable=False,
                )
            )
    taken = {v.number for found in by_semver.values() for v in found}
    # A SemVer tag edited by hand still leaves the artifact's digest: pair on it when
    # that is unambiguous, so the drift reads "semver tag is X" instead of an unknown
    # version plus a missing one.
    loose = [v for v in observed.versions if v.number not in taken]
    for semver, want in desired.versions.items():
        if semver in matched:
            continue
        same = [v for v in loose if v.tags.get(TAG_SHA256) == want.sha256]
        claimants = [s for s, d in desired.versions.items() if d.sha256 == want.sha256]
        if len(same) == 1 and len(claimants) == 1:
            matched[semver] = same[0]
            loose.remove(same[0])
    for version in loose:
        tag = version.semver
        why = f"modelreg.semver is {tag!r}" if tag is not None else "no modelreg.semver tag"
        drifts.append(
            Drift(
                "version-unknown",
                desired.name,
                f" MLflow version {version.number}",
                f"no manifest declares it ({why})",
                fixable=False,
            )
        )
    return matched


def _number_key(number: str) -> tuple[int, str]:
    return (int(number), "") if number.isdigit() else (1 << 62, number)


def _compare_tags(
    name: str, want: DesiredVersion, have: ObservedVersion, drifts: list[Drift]
) -> list[Action]:
    where = f" {want.semver}"
    label = f"MLflow version {have.number}: "
    changed: dict[str, str] = {}
    for key, value in want.tags.items():
        current = have.tags.get(key)
        if current == value:
            continue
        changed[key] = value
        if current is None:
            drifts.append(
                Drift(
                    "tag-missing", name, where, f"{label}tag {key} is missing, Git says {value!r}"
                )
            )
        else:
            drifts.append(
                Drift(
                    "tag-differs",
                    name,
                    where,
                    f"{label}tag {key} is {current!r}, Git says {value!r}",
                )
            )
    extra = tuple(sorted(k for k in want.absent if k in have.tags))
    drifts.extend(
        Drift(
            "tag-unexpected",
            name,
            where,
            f"{label}tag {key} is {have.tags[key]!r}, Git says it has none",
        )
        for key in extra
    )
    actions: list[Action] = []
    if changed:
        actions.append(SetTags(want.semver, have.number, changed))
    if extra:
        actions.append(DeleteTags(want.semver, have.number, extra))
    return actions


def _compare_description(
    name: str, want: DesiredVersion, have: ObservedVersion, drifts: list[Drift]
) -> list[Action]:
    if have.description == want.description:
        return []
    drifts.append(
        Drift(
            "description-differs",
            name,
            f" {want.semver}",
            f"MLflow version {have.number}: description is {_shown(have.description)}, "
            f"Git says {_shown(want.description)}",
        )
    )
    return [SetVersionDescription(want.semver, have.number, want.description)]


def _compare_metrics(
    name: str, want: DesiredVersion, have: ObservedVersion, drifts: list[Drift]
) -> list[Action]:
    where = f" {want.semver}"
    label = f"MLflow version {have.number}: "
    wanted = {k: v for k, v in want.metrics.items() if mirrorable_metric(k)}
    drifts.extend(
        Drift(
            "metric-unmirrorable",
            name,
            where,
            f"metric {key!r} cannot be an MLflow metric name (MLflow allows letters, "
            "digits, _ - . / : and spaces); rename it in the manifest",
            fixable=False,
        )
        for key in sorted(set(want.metrics) - set(wanted))
    )
    if have.metrics is None or have.run_id is None:
        if wanted:
            drifts.append(
                Drift(
                    "metric-missing",
                    name,
                    where,
                    f"{label}has no run to hold its metrics ({', '.join(sorted(wanted))}); "
                    "delete the version in MLflow and register again",
                    fixable=False,
                )
            )
        return []
    changed: dict[str, float] = {}
    for key, value in sorted(wanted.items()):
        current = have.metrics.get(key)
        if current == value:
            continue
        changed[key] = value
        if current is None:
            message = f"{label}metric {key} is missing, Git says {value!r}"
            drifts.append(Drift("metric-missing", name, where, message))
        else:
            message = f"{label}metric {key} is {current!r}, Git says {value!r}"
            drifts.append(Drift("metric-differs", name, where, message))
    drifts.extend(
        Drift(
            "metric-unexpected",
            name,
            where,
            f"{label}run {have.run_id} has metric {key} = {have.metrics[key]!r}, Git "
            "declares none (MLflow cannot delete a run's metric: declare it in the "
            f"manifest, or delete MLflow version {have.number} and register again)",
            fixable=False,
        )
        for key in sorted(set(have.metrics) - set(want.metrics))
    )
    return [LogMetrics(want.semver, have.number, have.run_id, changed)] if changed else []


def _describe(number: str, by_number: Mapping[str, str]) -> str:
    semver = by_number.get(number)
    return f"MLflow version {number} ({semver})" if semver else f"MLflow version {number}"


def _compare_aliases(
    desired: DesiredModel,
    observed: ObservedModel,
    numbers: Mapping[str, str],
    drifts: list[Drift],
) -> list[Action]:
    name = desired.name
    by_number = {n: s for s, n in numbers.items()}
    for version in observed.versions:
        if version.number not in by_number and version.semver is not None:
            by_number[version.number] = f"tagged {version.semver}"
    actions: list[Action] = []
    for alias, semver in sorted(desired.aliases.items()):
        where = f"@{alias}"
        current = observed.aliases.get(alias)
        if semver not in desired.versions:
            state = "not committed" if semver in desired.unreleased else "not declared"
            drifts.append(
                Drift(
                    "alias-unreleased",
                    name,
                    where,
                    f"channel {alias!r} serves {semver}, whose manifest is {state}; "
                    "commit it, then register",
                    fixable=False,
                )
            )
            continue
        target = numbers.get(semver)
        want = f"MLflow version {target} ({semver})" if target else f"{semver} (to be registered)"
        if current is None:
            drifts.append(Drift("alias-missing", name, where, f"alias is missing; Git says {want}"))
        elif current != target:
            drifts.append(
                Drift(
                    "alias-moved",
                    name,
                    where,
                    f"alias points at {_describe(current, by_number)}; Git says {want}",
                )
            )
        else:
            continue
        actions.append(SetAlias(alias, semver))
    for alias in sorted(set(observed.aliases) - set(desired.aliases)):
        drifts.append(
            Drift(
                "alias-extra",
                name,
                f"@{alias}",
                f"alias points at {_describe(observed.aliases[alias], by_number)}; "
                f"Git declares no channel {alias!r}",
            )
        )
        actions.append(DeleteAlias(alias))
    return actions


def reconcile(desired: DesiredModel, observed: ObservedModel) -> Reconciliation:
    """Compare one model's Git state with its MLflow mirror.

    Args:
        desired: what Git declares.
        observed: what MLflow holds (``exists=False`` for a model not registered yet).

    Returns:
        The drift, the actions that repair what can be repaired, and the MLflow
        version number of each declared version that exists already.
    """
    drifts: list[Drift] = []
    actions: list[Action] = []
    if not observed.exists:
        drifts.append(
            Drift("model-missing", desired.name, "", "registered model is missing in MLflow")
        )
        actions.append(CreateModel())
    elif observed.description != desired.description:
        drifts.append(
            Drift(
                "description-differs",
                desired.name,
                "",
                f"description is {_shown(observed.description)}, "
                f"Git says {_shown(desired.description)}",
            )
        )
        actions.append(SetModelDescription(desired.description))
    matched = _match(desired, observed, drifts)
    for semver, want in desired.versions.items():
        have = matched.get(semver)
        if have is None:
            drifts.append(
                Drift("version-missing", desired.name, f" {semver}", "not registered in MLflow")
            )
            actions.append(CreateVersion(semver))
        else:
            actions.extend(_compare_tags(desired.name, want, have, drifts))
            actions.extend(_compare_description(desired.name, want, have, drifts))
            actions.extend(_compare_metrics(desired.name, want, have, drifts))
    numbers = {semver: v.number for semver, v in matched.items()}
    actions.extend(_compare_aliases(desired, observed, numbers, drifts))
    return Reconciliation(tuple(drifts), tuple(actions), numbers)
