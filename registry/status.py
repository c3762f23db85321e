"""The version-state table: one row per model version (pure data and rendering).

Columns: model, version, git commit, MLflow version, CI run, channels, signed,
published.  Facts that a later stage owns (MLflow, CI, signing, publishing) are
``None`` until that stage has recorded them, and print as ``-``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any, Final

from registry.gitinfo import Commit

if TYPE_CHECKING:
    from registry.repository import Repository

COLUMNS: Final = (
    "model",
    "version",
    "commit",
    "mlflow",
    "ci run",
    "channels",
    "signed",
    "published",
)


@dataclass(frozen=True, slots=True)
class VersionStatus:
    """One row of the version-state table."""

    model: str
    version: str
    parent: str | None
    file: str
    commit: str | None
    committed_at: str | None
    dirty: bool
    channels: tuple[str, ...]
    mlflow_version: str | None = None
    ci_run: str | None = None
    signed: bool | None = None
    published: bool | None = None

    def cells(self) -> tuple[str, ...]:
        """The row as printed."""
        commit = self.commit[:8] if self.commit else "-"
        if self.dirty:
            commit = "uncommitted" if not self.commit else f"{commit}+dirty"
        return (
            self.model,
            self.version,
            commit,
            self.mlflow_version or "-",
            # a run URL ends in its id; the table shows the id, --json the whole URL
            (self.ci_run or "-").rstrip("/").rsplit("/", 1)[-1],
            ", ".join(self.channels) or "-",
            _yes_no(self.signed),
            _yes_no(self.published),
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready mapping."""
        out = asdict(self)
        out["channels"] = list(self.channels)
        return out

    @classmethod
    def from_json(cls, data: Any) -> VersionStatus:
        """The row :meth:`to_json` gave (a stored result: checked, never trusted).

        Raises:
            ValueError: ``data`` is not such a mapping.
        """
        if not isinstance(data, dict) or set(data) != _FIELDS:
            raise ValueError("not a status row")
        channels = data["channels"]
        if not (isinstance(channels, list) and all(isinstance(c, str) for c in channels)):
            raise ValueError("not a status row")
        wrong = [name for name, kinds in _TYPES.items() if not isinstance(data[name], kinds)]
        if wrong:
            raise ValueError(f"not a status row: {', '.join(wrong)}")
        return cls(**{**data, "channels": tuple(channels)})


_FIELDS: Final = frozenset(f.name for f in fields(VersionStatus))
_TYPES: Final[dict[str, type | tuple[type, ...]]] = {
    "model": str,
    "version": str,
    "parent": (str, type(None)),
    "file": str,
    "commit": (str, type(None)),
    "committed_at": (str, type(None)),
    "dirty": bool,
    "mlflow_version": (str, type(None)),
    "ci_run": (str, type(None)),
    "signed": (bool, type(None)),
    "published": (bool, type(None)),
}


def _yes_no(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "no")


RowFields = tuple[str, str, str | None, str, str, tuple[str, ...]]
"""What a row needs from the manifests: model, version, parent, file, git-relative path,
channels (plain data: worker processes send it back)."""


def collect_status(
    repo: Repository, commits: Mapping[str, Commit], dirty: set[str], relative: Mapping[str, str]
) -> list[VersionStatus]:
    """Build the rows from a loaded repository and git facts.

    Args:
        repo: the loaded repository.
        commits: last commit per git-relative manifest path.
        dirty: git-relative paths with uncommitted changes.
        relative: display file name -> git-relative path.
    """
    return make_rows(row_fields(repo, relative), commits, dirty)


def row_fields(repo: Repository, relative: Mapping[str, str]) -> list[RowFields]:
    """The manifests' part of each row, in table order (see ``collect_status``)."""
    out: list[RowFields] = []
    for entry in repo.all_versions():
        channels = []
        model = repo.models.get(entry.name)
        if model is not None:
            for channel, assignment in sorted(model.manifest.spec.channels.items()):
                if assignment.version == entry.version:
                    rollout = assignment.rollout
                    share = f" ({rollout.percent:g}%)" if rollout is not None else ""
                    held = " held" if rollout is not None and rollout.hold else ""
                    channels.append(channel + share + held)
        rel = relative.get(entry.file, entry.file)
        out.append(
            (
                entry.name,
                entry.version,
                entry.manifest.spec.parent,
                entry.file,
                rel,
                tuple(channels),
            )
        )
    return out


def make_rows(
    found: Sequence[RowFields], commits: Mapping[str, Commit], dirty: set[str]
) -> list[VersionStatus]:
    """Rows from their manifests' part (``row_fields``) and git's."""
    rows = []
    for model, version, parent, file, rel, channels in found:
        commit = commits.get(rel)
        rows.append(
            VersionStatus(
                model=model,
                version=version,
                parent=parent,
                file=file,
                commit=commit.sha if commit else None,
                committed_at=commit.date if commit else None,
                dirty=rel in dirty,
                channels=channels,
            )
        )
    return rows


def render_table(rows: Sequence[VersionStatus]) -> str:
    """Plain, aligned text table (stable: used in logs and golden files)."""
    cells = [COLUMNS, *(r.cells() for r in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    return "\n".join(lines) + "\n"
