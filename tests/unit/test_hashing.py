"""``signing.hashing`` gives exactly hashlib's SHA-256, whatever the threads and chunking."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import pytest

from signing.errors import FileSetError, SigningError
from signing.hashing import (
    DEFAULT_CHUNK,
    MIN_CHUNK,
    SINGLE_FILE,
    HashSettings,
    _hash_pipelined,
    hash_file,
    list_model_files,
    sha256_file,
    sha256_files,
)

CHUNK = 64 * 1024
SIZES = [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 17, 5 * 1024 * 1024 + 3]


def _data(size: int) -> bytes:
    # Not a repeating pattern: a dropped or repeated chunk must change the digest.
    return hashlib.shake_256(str(size).encode()).digest(size) if size else b""


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    folder = tmp_path_factory.mktemp("hashing")
    out = {}
    for size in SIZES:
        path = folder / f"f{size}.bin"
        path.write_bytes(_data(size))
        out[size] = path
    return out


@pytest.mark.parametrize("workers", [1, 2, 3, 4])
@pytest.mark.parametrize("size", SIZES)
def test_same_digest_as_hashlib(files: dict[int, Path], size: int, workers: int) -> None:
    expected = hashlib.sha256(_data(size)).hexdigest()
    assert sha256_file(files[size], workers=workers, chunk=CHUNK) == expected


@pytest.mark.parametrize("workers", [1, 2])
def test_default_chunk_boundaries(tmp_path: Path, workers: int) -> None:
    for size in (DEFAULT_CHUNK - 1, DEFAULT_CHUNK, DEFAULT_CHUNK + 1, 2 * DEFAULT_CHUNK):
        path = tmp_path / f"{size}.bin"
        path.write_bytes(_data(size))
        assert sha256_file(path, workers=workers) == hashlib.sha256(_data(size)).hexdigest()


def test_small_ring_and_minimum_chunk(files: dict[int, Path]) -> None:
    size = 3 * CHUNK + 17
    settings = HashSettings(workers=2, chunk=MIN_CHUNK, ring=2)
    assert hash_file(files[size], settings) == hashlib.sha256(_data(size)).hexdigest()


@pytest.mark.parametrize("workers", [1, 2])
def test_missing_file_raises(tmp_path: Path, workers: int) -> None:
    with pytest.raises(FileNotFoundError):
        sha256_file(tmp_path / "absent.bin", workers=workers)


def test_directory_raises(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError):
        sha256_file(tmp_path, workers=2)


class _Reader:
    """A file object (the ``readinto`` the hashers use) that fails after some reads."""

    def __init__(self, data: bytes, fail_at: int | None = None) -> None:
        self.data, self.pos, self.reads, self.fail_at = data, 0, 0, fail_at

    def readinto(self, buffer: bytearray, /) -> int:
        self.reads += 1
        if self.reads == self.fail_at:
            raise OSError(5, "Input/output error")
        n = min(len(buffer), len(self.data) - self.pos)
        buffer[:n] = self.data[self.pos : self.pos + n]
        self.pos += n
        return n


def test_pipeline_with_short_reads_matches_hashlib() -> None:
    data = _data(10 * MIN_CHUNK + 5)
    assert _hash_pipelined(_Reader(data), MIN_CHUNK, 3) == hashlib.sha256(data).hexdigest()


def test_read_error_in_reader_thread_reaches_caller() -> None:
    """An error in the reader thread is raised in the caller, and no thread is left behind."""
    before = threading.active_count()
    with pytest.raises(OSError, match="Input/output error"):
        _hash_pipelined(_Reader(_data(10 * MIN_CHUNK), fail_at=3), MIN_CHUNK, 2)
    assert threading.active_count() == before


@pytest.mark.parametrize(
    "kwargs", [{"workers": 0}, {"chunk": MIN_CHUNK - 1}, {"workers": -1, "chunk": CHUNK}]
)
def test_bad_settings(files: dict[int, Path], kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="must be"):
        sha256_file(files[1], **kwargs)


def test_ring_needs_two_buffers() -> None:
    with pytest.raises(ValueError, match="ring"):
        HashSettings(workers=2, ring=1)


@pytest.mark.parametrize("workers", [1, 2, 3, 8])
def test_sha256_files(files: dict[int, Path], workers: int) -> None:
    paths = [files[s] for s in SIZES]
    got = sha256_files([*paths, paths[0]], workers=workers, chunk=CHUNK)
    assert list(got) == paths  # input order, duplicates once
    assert got == {files[s]: hashlib.sha256(_data(s)).hexdigest() for s in SIZES}


def test_sha256_files_one_file_many_workers(files: dict[int, Path]) -> None:
    size = SIZES[-1]
    got = sha256_files([files[size]], workers=4)
    assert got == {files[size]: hashlib.sha256(_data(size)).hexdigest()}


def test_sha256_files_empty_and_bad_workers(files: dict[int, Path]) -> None:
    assert sha256_files([], workers=2) == {}
    with pytest.raises(ValueError, match="workers"):
        sha256_files([files[1]], workers=0)


@pytest.mark.parametrize("workers", [1, 4])
def test_sha256_files_missing_raises(files: dict[int, Path], tmp_path: Path, workers: int) -> None:
    with pytest.raises(FileNotFoundError):
        sha256_files([files[1], tmp_path / "absent.bin", files[0]], workers=workers)


def test_sha256_files_error_while_hashing_cancels(files: dict[int, Path], tmp_path: Path) -> None:
    """A file that vanishes after it was listed fails the whole call."""
    doomed = tmp_path / "doomed.bin"
    doomed.write_bytes(b"x")
    paths = [files[s] for s in SIZES] + [doomed]
    real = hash_file

    def vanishing(path: Path, settings: HashSettings) -> str:
        if path == doomed:
            raise FileNotFoundError(2, "gone", str(path))
        return real(path, settings)

    import signing.hashing as module

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(module, "hash_file", vanishing)
        with pytest.raises(FileNotFoundError, match="gone"):
            sha256_files(paths, workers=3)


def test_list_model_files_names_like_oms(tmp_path: Path) -> None:
    model = tmp_path / "m"
    for rel in ("w.bin", "sub/deep/x", "a-b/c", ".hidden", ".git/HEAD", "skip/me", ".gitignore"):
        (model / rel).parent.mkdir(parents=True, exist_ok=True)
        (model / rel).write_bytes(rel.encode())
    (model / "empty").mkdir()
    files = list_model_files(model, {".git", ".gitignore", "skip"})
    assert sorted(files) == [".hidden", "a-b/c", "sub/deep/x", "w.bin"]
    assert files["sub/deep/x"] == model / "sub" / "deep" / "x"
    assert list_model_files(model / "w.bin") == {SINGLE_FILE: model / "w.bin"}


def test_list_model_files_refuses_symlinks_and_specials(tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    (model / "real").write_bytes(b"x")
    (model / "link").symlink_to(model / "real")
    with pytest.raises(FileSetError, match="symbolic links"):
        list_model_files(model)
    with pytest.raises(SigningError, match="symbolic links"):
        list_model_files(model, error=SigningError)
    # ...but not inside an ignored folder, which is never entered.
    assert sorted(list_model_files(model, {"link"})) == ["real"]
    (model / "link").unlink()
    os.mkfifo(model / "pipe")
    with pytest.raises(FileSetError, match="not a regular file"):
        list_model_files(model)


def test_list_model_files_missing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        list_model_files(tmp_path / "absent")
