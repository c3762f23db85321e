"""``registry.atomic``: one write discipline, and the process umask is never touched.

The umask can only be read by setting it; a daemon thread that creates a file while
another has set it to 0 would make it world-writable.  These tests make ``os.umask``
fail: every writer must still work.
"""

from __future__ import annotations

import ast
import os
import stat
import threading
from pathlib import Path

import pytest

from registry import atomic
from registry.atomic import (
    AtomicFile,
    current_umask,
    replace_file,
    replacement_mode,
    write_atomic,
)
from tests.conftest import REPO_ROOT


@pytest.fixture
def no_umask(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(mask: int) -> int:
        raise AssertionError(f"os.umask({mask:o}) called: it races with other threads")

    monkeypatch.setattr(os, "umask", refuse)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_a_new_file_gets_what_the_umask_gives_without_reading_it(
    tmp_path: Path, no_umask: None
) -> None:
    path = tmp_path / "new.bin"
    write_atomic(path, b"data")
    assert path.read_bytes() == b"data"
    assert _mode(path) == 0o666 & ~current_umask()
    assert replacement_mode(tmp_path / "absent") == 0o666 & ~current_umask()
    assert _leftovers(tmp_path) == []


def test_a_replaced_file_keeps_its_mode_unless_one_is_given(tmp_path: Path, no_umask: None) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(b"old")
    path.chmod(0o640)
    write_atomic(path, b"new")
    assert (path.read_bytes(), _mode(path)) == (b"new", 0o640)
    assert replacement_mode(path) == 0o640
    write_atomic(path, b"key", mode=0o600)
    assert (path.read_bytes(), _mode(path)) == (b"key", 0o600)


def test_current_umask_reads_the_real_value(tmp_path: Path) -> None:
    # Measured the only portable way, in this test's own thread.
    old = os.umask(0o027)
    try:
        assert current_umask() == 0o027 or not Path("/proc/self/status").is_file()
        write_atomic(tmp_path / "f", b"x")
        assert _mode(tmp_path / "f") == 0o640
    finally:
        os.umask(old)


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_bytes(b"old")

    def check_then_fail() -> None:
        with AtomicFile(path) as out:
            out.write(b"half of the new")
            raise RuntimeError("digest mismatch")

    with pytest.raises(RuntimeError, match="digest"):
        check_then_fail()
    assert path.read_bytes() == b"old"
    assert _leftovers(tmp_path) == []
    out = AtomicFile(path)
    out.write(b"new")
    out.abort()
    assert path.read_bytes() == b"old"
    assert _leftovers(tmp_path) == []
    with pytest.raises(ValueError, match="already committed or aborted"):
        out.commit()


def test_a_full_disk_leaves_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "state.json"
    path.write_bytes(b"old")

    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        write_atomic(path, b"new")
    assert path.read_bytes() == b"old"
    assert _leftovers(tmp_path) == []


def test_a_temporary_name_is_never_followed_through_a_link(tmp_path: Path) -> None:
    # A planted link at a predictable name would redirect the write: names are random
    # and created exclusively.
    outside = tmp_path / "outside"
    outside.write_bytes(b"keep")
    folder = tmp_path / "d"
    folder.mkdir()
    (folder / ".f.tmp").symlink_to(outside)
    write_atomic(folder / "f", b"data")
    assert outside.read_bytes() == b"keep"
    assert (folder / "f").read_bytes() == b"data"


def test_replace_file_makes_another_programs_file_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_umask: None
) -> None:
    synced: list[int] = []
    real = os.fsync

    def counted(fd: int) -> None:
        synced.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", counted)
    written = tmp_path / ".engine.tmp"
    written.write_bytes(b"engine")
    assert replace_file(written, tmp_path / "engine", mode=0o644) == tmp_path / "engine"
    assert (tmp_path / "engine").read_bytes() == b"engine"
    assert _mode(tmp_path / "engine") == 0o644
    assert not written.exists()
    assert len(synced) == 2  # the file, then its folder

    def failing(fd: int) -> None:
        raise OSError(5, "I/O error")

    monkeypatch.setattr(os, "fsync", failing)
    written.write_bytes(b"other")
    with pytest.raises(OSError, match="I/O error"):
        replace_file(written, tmp_path / "engine")
    assert (tmp_path / "engine").read_bytes() == b"engine"
    assert not written.exists()


def test_writers_in_threads_never_see_each_others_files(tmp_path: Path, no_umask: None) -> None:
    errors: list[BaseException] = []

    def writer(i: int) -> None:
        try:
            for n in range(20):
                write_atomic(tmp_path / "shared", f"{i}:{n}".encode())
        except BaseException as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert (tmp_path / "shared").read_bytes().split(b":")[1] == b"19"
    assert _mode(tmp_path / "shared") == 0o666 & ~current_umask()
    assert _leftovers(tmp_path) == []


def test_the_umask_is_changed_nowhere_and_temporary_files_come_from_one_place() -> None:
    """``os.umask`` only in ``registry.atomic``'s import-time fallback (no /proc), and no
    ``mkstemp`` (0600 files that then need the umask) in the registry-side packages."""
    found = []
    for package in ("registry", "signing", "pipelines", "modelreg"):
        for path in (REPO_ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Attribute) and node.attr in ("umask", "mkstemp"):
                    where = f"{path.relative_to(REPO_ROOT)}:{node.lineno}: {node.attr}"
                    found.append(where)
    umask_lines = [w for w in found if w.startswith("registry/atomic.py:") and "umask" in w]
    assert len(umask_lines) == 2, found  # the flip and its undo, once, at import
    assert [w for w in found if w not in umask_lines] == []
    assert atomic._umask_from_proc() in (None, current_umask())
