"""What a pull request may change, judged against its base, and the release history a
release may not go back on.

A pull request is untrusted input to CI, as the network is to a device.  What the
reviewers and the release job trust is the base commit: its ``modelreg.yaml`` says
where the manifests and the trust metadata are, its promotion policies say who must
approve, its signed metadata says what is released.  ``ci pr`` reads those from the
base (:func:`config_at`, :func:`trust_at`) and refuses changes that no review makes
safe (:func:`change_problems`): modelreg's local state (``.modelreg/build``, keys,
caches), DVC's local config, and symbolic links, which modelreg never reads through.

``ci release`` runs after the merge, on a checkout of the promotion branch.  The
signed metadata there verifies (``TrustRepo.load``), but a merged pull request could
still have deleted or rewound it to older signed files.  :func:`history_problems`
compares it with everything the branch's history ever held: no root file rewritten
or removed, no role below the highest version ever released.

The git plumbing here reads whole object batches (``git cat-file --batch``) so a
history of thousands of releases costs a few processes, not thousands.
"""

from __future__ import annotations

import os
import stat
import subprocess
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Final

from registry.config import CONFIG_FILE, RepoConfig
from registry.errors import (
    ManifestError,
    Problem,
    RegistryError,
    RepositoryError,
    ToolError,
    quote,
)
from registry.gitinfo import dirty_paths, git, toplevel
from registry.loader import validate_document
from registry.yamlsrc import parse_yaml

if TYPE_CHECKING:
    from tuf.api.metadata import Metadata, Root

    from registry.repository import Repository
    from signing.tuf_repo import TrustRepo

LOCAL_STATE: Final = ".modelreg/"
"""modelreg's per-checkout state: build records, keys, caches, CI outputs."""
SHARED_STATE: Final = (".modelreg/schemas/",)
"""The part of ``.modelreg/`` that is committed (JSON Schemas for editors)."""
DVC_LOCAL: Final = (".dvc/config.local", ".dvc/tmp/", ".dvc/cache/")
"""DVC's per-checkout files: never committed."""
DVC_SHARED: Final = (".dvc/config", ".dvcignore")
"""DVC's committed configuration: changed on the base branch, never used from a PR."""
_SYMLINK: Final = "120000"
_GITLINK: Final = "160000"
_MAX_BLOB: Final = 64 << 20
"""Largest metadata file read from git history (TUF metadata is kilobytes)."""


@dataclass(frozen=True, slots=True)
class Change:
    """One path that a pull request adds, modifies or deletes.

    Attributes:
        path: POSIX path relative to the modelreg root.
        status: git's letter: ``A`` added, ``M`` modified, ``D`` deleted, ``T`` type
            changed (``?`` for an untracked file of a local run).
        mode: its git mode in the pull request (``100644``, ``120000`` for a link,
            ``000000`` when deleted).
    """

    path: str
    status: str
    mode: str


def pr_changes(root: Path, base: str) -> list[Change]:
    """Every path that differs between commit ``base`` and the work tree (untracked
    files included, ignored ones not), relative to the modelreg root ``root``.

    Raises:
        ToolError: git fails.
    """
    raw = git(root, "diff", "--raw", "-z", "--no-renames", "--relative", base, "--").stdout
    fields = raw.split("\x00")
    changes: list[Change] = []
    for meta, path in zip(fields[0::2], fields[1::2], strict=False):
        parts = meta.lstrip(":").split()
        if len(parts) >= 5 and path:
            changes.append(Change(path, parts[4][:1], parts[1]))
    untracked = git(root, "ls-files", "--others", "--exclude-standard", "-z").stdout
    for path in filter(None, untracked.split("\x00")):
        try:
            mode = os.lstat(root / path).st_mode
        except OSError:
            continue
        changes.append(Change(path, "?", _SYMLINK if stat.S_ISLNK(mode) else "100644"))
    return changes


def _under(path: str, prefixes: Iterable[str]) -> bool:
    return any(path == p.rstrip("/") or path.startswith(p) for p in prefixes)


def change_problems(changes: Iterable[Change]) -> list[Problem]:
    """Changes that no approval makes acceptable in a pull request.

    * a symbolic link or a submodule anywhere: modelreg reads no file through a link
      (one pointing at a key file or a token made ``validate`` print it);
    * modelreg's local state (``.modelreg/`` but its schemas): a committed build
      record or key folder is the runner's input, not the reviewers';
    * DVC's local files (``.dvc/config.local``, its cache and tmp folders).
    """
    problems = []
    for change in changes:
        if change.status == "D":
            continue
        if change.mode == _SYMLINK:
            problems.append(
                Problem(
                    change.path,
                    "is a symbolic link; modelreg reads no file through a link: commit "
                    "the file itself",
                )
            )
        elif change.mode == _GITLINK:
            problems.append(Problem(change.path, "is a submodule; commit the files instead"))
        if _under(change.path, [LOCAL_STATE]) and not _under(change.path, SHARED_STATE):
            problems.append(
                Problem(
                    change.path,
                    "is modelreg's local state (ignored by .gitignore); a pull request "
                    "cannot commit it: remove it (`git rm --cached`)",
                )
            )
        elif _under(change.path, DVC_LOCAL):
            problems.append(
                Problem(
                    change.path,
                    "is DVC's local state; a pull request cannot commit it: remove it "
                    "(`git rm --cached`)",
                )
            )
    return problems


def dvc_config_changed(changes: Iterable[Change]) -> list[str]:
    """The DVC configuration files a pull request changes (``.dvc/config``, ``.dvcignore``).

    CI never runs DVC with a configuration the pull request brought (one moved DVC's
    cache out of the work tree; another could send the runner's credentials to its own
    endpoint), so such a pull request is not built: it changes configuration only.
    """
    return sorted(c.path for c in changes if _under(c.path, DVC_SHARED))


def show(root: Path, commit: str, path: str) -> bytes | None:
    """The bytes of regular file ``path`` (relative to the modelreg root) at ``commit``,
    or None when it is absent there (or is not a regular file).

    Raises:
        ToolError: git fails otherwise.
    """
    listed = git(root, "ls-tree", "-z", commit, "--", path).stdout.split("\x00")[0]
    meta, _, _ = listed.partition("\t")
    parts = meta.split()
    if len(parts) != 3 or parts[0] not in ("100644", "100755") or parts[1] != "blob":
        return None
    return blobs(root, [parts[2]])[parts[2]]


def config_at(root: Path, commit: str) -> RepoConfig | None:
    """``modelreg.yaml`` as it stands at ``commit``; None when it has none.

    Raises:
        ManifestError: it is there and invalid (the base branch is broken).
        ToolError: git fails.
    """
    data = show(root, commit, CONFIG_FILE)
    if data is None:
        return None
    return validate_document(parse_yaml(data, f"{commit[:12]}:{CONFIG_FILE}"), RepoConfig)


@contextmanager
def trust_at(root: Path, commit: str, config: RepoConfig) -> Iterator[TrustRepo | None]:
    """The signed metadata at ``commit`` (loaded and verified), or None when there is
    none; valid inside the ``with`` block.

    Raises:
        VerificationError: the metadata at ``commit`` does not verify.
        ToolError: git fails.
    """
    from signing.errors import VerificationError
    from signing.tuf_repo import TrustRepo
    from signing.workspace import trust_paths

    folder = config.trust.metadata
    listed = git(root, "ls-tree", "-z", commit, "--", f"{folder}/").stdout
    entries: dict[str, str] = {}
    for item in filter(None, listed.split("\x00")):
        meta, _, path = item.partition("\t")
        mode, kind, sha = meta.split()
        name = PurePosixPath(path).name
        if kind == "blob" and mode.startswith("1006") and name.endswith(".json"):
            entries[name] = sha
    if "1.root.json" not in entries:
        yield None
        return
    contents = blobs(root, entries.values())
    with tempfile.TemporaryDirectory(prefix="modelreg-base-") as tmp:
        for name, sha in entries.items():
            (Path(tmp) / name).write_bytes(contents[sha])
        try:
            loaded = TrustRepo.load(Path(tmp), expiry=trust_paths(root, config).expiry)
        except VerificationError as e:  # named as the commit holds it, not the copy
            shown = f"{commit[:12]}:{folder}"
            message = str(e).removeprefix(f"{e.subject}: ")
            raise type(e)(message, e.subject.replace(tmp, shown)) from None
        yield loaded


def tracked_local_state(root: Path) -> list[Problem]:
    """modelreg's and DVC's local state committed to the checkout (``ci release``
    refuses to run on it: a merged pull request could have planted build records,
    keys, caches, or links to the runner's files there).

    Raises:
        ToolError: git fails.
    """
    listed = git(root, "ls-files", "-z", "-s", "--", ".modelreg", ".dvc").stdout
    changes = []
    for item in filter(None, listed.split("\x00")):
        meta, _, path = item.partition("\t")
        changes.append(Change(path, "A", meta.split()[0]))
    return change_problems(changes)  # links and submodules there too


_NAMED: Final = 10
"""Uncommitted files named in ``ci release``'s refusal before it only counts the rest."""
_PATH_LIMIT: Final = 200
"""Characters of each of those names shown (quoted: a name may hold a newline)."""


def refuse_uncommitted(repo: Repository) -> None:
    """Refuse a work tree whose content to release differs from its last commit.

    A release signs and publishes what it finds, and a released version is immutable:
    a manifest, a DVC pointer, a golden file or ``modelreg.yaml`` that differs from
    HEAD (or is not in git at all) would be released without having been reviewed.

    Raises:
        RepositoryError: such files, named (the first few) on one line.
        ToolError: git fails.
    """
    top = toplevel(repo.root)
    if top is None:
        return
    prefix = repo.root.resolve().relative_to(top.resolve()).as_posix()
    prefix = "" if prefix == "." else prefix + "/"
    content = {CONFIG_FILE}
    for entry in repo.all_versions():
        spec = entry.manifest.spec
        for file in spec.artifact.files():  # the .onnx and its external data files
            content.update((file, f"{file}.dvc"))
        for case in spec.goldens.cases if spec.goldens else []:
            content.update(v for v in (case.inputs, case.outputs) if isinstance(v, str))
    manifests = repo.config.manifests.rstrip("/") + "/"
    dirty = sorted(
        path
        for path in (
            p.removeprefix(prefix)
            for p in dirty_paths(repo.root, prefix.rstrip("/") or ".")  # top-relative
            if p.startswith(prefix)
        )
        if path in content or path.startswith(manifests)
    )
    if not dirty:
        return
    named = ", ".join(quote(p, limit=_PATH_LIMIT) for p in dirty[:_NAMED])
    more = f" and {len(dirty) - _NAMED} more" if len(dirty) > _NAMED else ""
    raise RepositoryError(
        f"uncommitted changes would be released: {named}{more}; commit them (or remove "
        "them) first: ci release signs only committed content"
    )


@dataclass(frozen=True, slots=True)
class Committed:
    """One metadata file as some commit of the branch's history held it."""

    path: str
    data: bytes


def history_problems(root: Path, config: RepoConfig, trust: TrustRepo) -> list[Problem]:
    """Ways the checkout's signed metadata goes back on what its history held.

    Reads every version of every metadata file the branch's history ever committed:
    a released root rewritten or removed is a problem; a role below the highest
    version the history released raises (``TrustRepo.check_floor``).

    Raises:
        RollbackError: a role is below a version the branch already released.
        ToolError: git fails.
        VerificationError: the checkout's own root files do not verify.
    """
    folder = config.trust.metadata
    # Every commit, merges against each parent: git's default history simplification
    # follows one parent of a merge whose tree matches it, so a ``merge -s ours`` of
    # the released branch into an old one would hide every release made since.
    log = git(
        root, "log", "--full-history", "--diff-merges=separate", "--format=%x00%H",
        "--name-status", "--no-renames", "--relative", "--", folder,
    ).stdout  # fmt: skip
    names: list[tuple[str, str]] = []
    commit = ""
    for line in log.splitlines():
        if line.startswith("\x00"):
            commit = line[1:]
            continue
        status, _, path = line.partition("\t")
        if status[:1] in ("A", "M", "T") and path.endswith(".json") and commit:
            names.append((path, f"{commit}:./{path}"))
    blobs = _blobs_at(root, [name for _, name in names])
    history = [Committed(path, data) for (path, _), data in zip(names, blobs, strict=True)]
    floor, problems = released_floor(_current_roots(trust), history)
    if not problems:
        trust.check_floor(floor)
    return problems


def _current_roots(trust: TrustRepo) -> list[Metadata[Root]]:
    from signing.tuf_roles import verify_root_chain

    # The bytes the load verified, not the folder again (read once, through no link).
    folder = trust.metadata_dir
    return verify_root_chain(
        [(str(folder / f"{n}.root.json"), data) for n, data in enumerate(trust.state.roots, 1)]
    )


def released_floor(
    roots: list[Metadata[Root]], history: Iterable[Committed]
) -> tuple[dict[str, int], list[Problem]]:
    """The highest version of each role that ``history`` released, and the released
    roots that the current chain (``roots``) rewrote or lost.

    A decision without I/O.  Only history that was genuinely signed counts: a file a
    pull request once committed and a later commit removed must not raise the bar
    for ever (that would stop every release), so a historical role file counts only
    if the keys of some root of the current chain signed it, a root only if it is
    the current first root or the successor of the current root before it.
    """
    from tuf.api.exceptions import RepositoryError as TufRepositoryError
    from tuf.api.metadata import Metadata

    from signing.tuf_roles import ONLINE_ROLES, verifies

    problems: list[Problem] = []
    floor: dict[str, int] = {}
    for item in history:
        try:
            md = Metadata.from_bytes(item.data)
        except (TufRepositoryError, ValueError, TypeError, KeyError):
            continue  # not metadata: never signed, so never released
        role, number = md.signed.type, md.signed.version
        if role == "root":
            previous = roots[number - 2].signed if 2 <= number <= len(roots) + 1 else None
            if number == 1:
                genuine = roots[0].signed_bytes == md.signed_bytes
            else:
                genuine = previous is not None and bool(
                    md.signed.get_root_verification_result(previous, md.signed_bytes, md.signatures)
                )
            current = roots[number - 1] if number <= len(roots) else None
            if genuine and (current is None or current.signed_bytes != md.signed_bytes):
                problems.append(
                    Problem(
                        item.path,
                        f"root version {number} was released and is rewritten or missing "
                        "now; roots are never rewritten: restore it from history",
                    )
                )
            continue
        if role in ONLINE_ROLES and any(verifies(r.signed, md) for r in roots):
            floor[role] = max(floor.get(role, 0), number)
    return floor, problems


def blobs(root: Path, shas: Iterable[str]) -> dict[str, bytes]:
    """The content of each git blob of ``shas``, read in one batch (see :func:`_blobs_at`)."""
    wanted = list(dict.fromkeys(shas))
    return dict(zip(wanted, _blobs_at(root, wanted), strict=True))


def _blobs_at(root: Path, names: list[str]) -> list[bytes]:
    """The contents of git objects ``names`` (``<sha>`` or ``<commit>:<path>``), in order;
    empty bytes for one that is missing, not a file, or over the size cap.

    Sizes are asked first (``--batch-check``): an object over the cap is never read,
    so a pull request that committed a gigabyte as ``timestamp.json`` costs nothing.
    """
    if not names:
        return []
    sized = _cat_file(root, "--batch-check", names).split(b"\n")
    wanted: list[str | None] = []
    for line in sized[: len(names)]:
        parts = line.split()
        ok = len(parts) == 3 and parts[1] == b"blob" and int(parts[2]) <= _MAX_BLOB
        wanted.append(parts[0].decode() if ok else None)
    shas = [sha for sha in dict.fromkeys(wanted) if sha is not None]
    out, pos, found = _cat_file(root, "--batch", shas) if shas else b"", 0, {}
    for sha in shas:
        end = out.index(b"\n", pos)
        size = int(out[pos:end].split()[2])
        pos = end + 1
        found[sha] = out[pos : pos + size]
        pos += size + 1
    return [found[sha] if sha is not None else b"" for sha in wanted]


def _cat_file(root: Path, mode: str, names: list[str]) -> bytes:
    argv = ["git", "-C", str(root), "cat-file", mode]
    try:
        proc = subprocess.run(
            argv, input="".join(f"{n}\n" for n in names).encode(), capture_output=True, check=False
        )
    except FileNotFoundError:
        raise ToolError("git is not installed or not on PATH", argv) from None
    if proc.returncode:
        raise ToolError(f"git cat-file failed: {proc.stderr.decode(errors='replace')[-200:]}")
    return proc.stdout


def load_error(error: RegistryError, where: str) -> list[Problem]:
    """An error met while reading the base as problems of the run."""
    if isinstance(error, ManifestError):
        return list(error.problems)
    return [Problem(where, str(error))]


def trust_folder_moved(before: RepoConfig, now: RepoConfig) -> str:
    """Why the trust metadata folder may not move (devices read it where it was released)."""
    return (
        f"trust.metadata: the released metadata is in {before.trust.metadata}, where "
        f"devices read it; it cannot move to {now.trust.metadata}"
    )
