"""What one CI run found, and where it is written: the comment, the JSON report, the
GitHub outputs and step summary."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from pipelines.diff import append_step_summary
from pipelines.github import GitHubEnv
from registry.atomic import write_atomic
from registry.config import find_root
from registry.errors import ManifestError, RegistryError
from registry.redact import redact
from registry.render import md_code, md_code_block, md_cut

CI_DIR: Final = ".modelreg/ci"


@dataclass
class CiReport:
    """Everything one CI run found, for the comment, the JSON report and the exit code."""

    kind: str
    problems: list[str] = field(default_factory=list)
    sections: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Whether the run found nothing wrong."""
        return not self.problems


def write_outputs(root: Path, report: CiReport, env: Mapping[str, str]) -> Path:
    """Write the comment, the JSON report, the step summary and the GitHub outputs.

    Every channel is redacted here, the one place a run's text leaves it: an error
    from DVC, MLflow or a key loader may quote a URL with credentials or a key.
    """
    folder = _output_folder(root)
    comment = folder / f"{report.kind}-comment.md"
    text = redact("\n\n".join(report.sections) + "\n", env)
    note = (
        "*The comment stops here (GitHub's size limit); the whole report is in the job "
        f"summary and in {md_code(f'{CI_DIR}/{report.kind}-report.json')}.*"
    )
    write_atomic(comment, md_cut(text, note).encode())
    payload = {"ok": report.ok, "problems": report.problems, **report.data}
    data = redact(json.dumps(payload, indent=2, default=str) + "\n", env)
    write_atomic(folder / f"{report.kind}-report.json", data.encode())
    append_step_summary(text, env)
    output = GitHubEnv.from_env(env).output
    if output is not None:
        with output.open("a", encoding="utf-8") as fh:
            fh.write(f"comment={comment}\nok={'true' if report.ok else 'false'}\n")
    return comment


def _output_folder(root: Path) -> Path:
    """``.modelreg/ci``, a real folder: a link there (committed by a pull request, to a
    folder on the runner) is removed, never written through.

    Raises:
        UnsafeFileError: it still is not a folder reached through no link.
    """
    from registry.safe_io import check_folder

    folder = root / CI_DIR
    for path in (folder.parent, folder):
        if path.is_symlink():
            path.unlink()
    folder.mkdir(parents=True, exist_ok=True)
    check_folder(folder, root=root)
    return folder


def failed(start: Path, kind: str, error: RegistryError, env: Mapping[str, str]) -> CiReport:
    """A run that stopped on an error still writes its comment, report and outputs."""
    report = CiReport(kind)
    if isinstance(error, ManifestError):
        report.problems.extend(str(p) for p in error.problems)
    else:
        report.problems.append(str(error))
    lines = ["## modelreg", "", "**❌ failed**", "", md_code_block("\n".join(report.problems))]
    report.sections.append("\n".join(lines))
    write_outputs(find_root(start), report, env)
    return report
