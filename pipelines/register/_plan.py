"""What MLflow should look like, what it looks like, and the way from one to the other.

Private: import from :mod:`pipelines.register._stage`.  Pure data and decisions, no I/O: the
desired state is built from the Git repository by ``register.py``, the observed state is
read from MLflow by ``_store.py``, and :func:`reconcile` compares them into the
drift a reviewer reads and the actions ``register`` takes.  Both come from the same
comparison, so ``register --check`` reports exactly what ``register`` would change (plus
what it cannot change by itself, such as a version nobody declared).
"""

from __future__ import annotations

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
]


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
    """

    semver: str
    tags: Mapping[str, str]
    absent: frozenset[str] = frozenset()
    creation_tags: Mapping[str, str] = field(default_factory=dict)

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
    """

    name: str
    versions: Mapping[str, DesiredVersion]
    aliases: Mapping[str, str]
    unreleased: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class ObservedVersion:
    """One MLflow model version as read back."""

    number: str
    tags: Mapping[str, str]
    run_id: str | None = None
    last_updated: int | None = None

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
class SetAlias:
    """Point ``alias`` at the MLflow version of ``semver`` (resolved when applied)."""

    alias: str
    semver: str


@dataclass(frozen=True, slots=True)
class DeleteAlias:
    """Remove an alias no channel declares."""

    alias: str


Action = CreateModel | CreateVersion | SetTags | DeleteTags | SetAlias | DeleteAlias


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
    numbers = {semver: v.number for semver, v in matched.items()}
    actions.extend(_compare_aliases(desired, observed, numbers, drifts))
    return Reconciliation(tuple(drifts), tuple(actions), numbers)
