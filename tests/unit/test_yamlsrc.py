"""Strict YAML loading: positions, limits, and the constructs manifests refuse."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from registry.errors import ManifestError, Problem
from registry.yamlsrc import Limits, parse_yaml, read_yaml


def one(raw: bytes, limits: Limits | None = None) -> Problem:
    with pytest.raises(ManifestError) as info:
        parse_yaml(raw, "f.yaml", limits or Limits())
    assert len(info.value.problems) == 1
    return info.value.problems[0]


def test_positions_of_keys_and_values() -> None:
    doc = parse_yaml(b"a: 1\nb:\n  - x\n  - {c: true}\n", "f.yaml")
    assert doc.data == {"a": 1, "b": ["x", {"c": True}]}
    assert doc.key_marks[("b",)] == (2, 1)
    assert doc.value_marks[("b", 1, "c")] == (4, 9)
    assert doc.scalar_text[("a",)] == "1"
    assert ("b", 0) not in doc.scalar_text  # strings need no quoting hint
    assert doc.position(("b", 1, "missing")) == (4, 5)  # the parent mapping
    assert doc.position(("b",), key=True) == (2, 1)


@pytest.mark.parametrize(
    ("raw", "line", "col", "message"),
    [
        (b"a: 1\na: 2\n", 2, 1, "duplicate key 'a' (first defined on line 1)"),
        (b"a:\n\tb: 1\n", 2, 1, "tab character; YAML indentation must use spaces"),
        (b"", 1, 1, "empty file; expected a YAML mapping"),
        (b"# only a comment\n", 1, 1, "empty file; expected a YAML mapping"),
        (b"a: &x [1]\nb: *x\n", 1, 4, "anchors ('&x') are not allowed in manifests"),
        (b"a: 1\n---\nb: 2\n", 2, 1, "expected a single YAML document, found several ('---')"),
        (b"1: x\n", 1, 1, "mapping keys must be strings, got '1'"),
        (b"? [a]\n: x\n", 1, 3, "mapping keys must be strings, got 'a collection'"),
        (b"a: !!binary aGk=\n", 1, 4, "YAML tag 'tag:yaml.org,2002:binary' is not allowed in manifests"),
        (b"a: !!python/object:os.system x\n", 1, 4,
         "YAML tag 'tag:yaml.org,2002:python/object:os.system' is not allowed in manifests"),
        (b"<<: {a: 1}\n", 1, 1, "merge keys ('<<') are not allowed in manifests"),
        (b"a: x\xffy\n", 1, 5, "not UTF-8: invalid byte 0xff"),
        (b"a: \xc3\xa9\xff\n", 1, 5, "not UTF-8: invalid byte 0xff"),
        (b"a: \x00\n", 1, 4, "invalid character U+0000: control characters are not allowed"),
        (b"a: [1, 2\n", 1, 4, "invalid YAML: did not find expected ',' or ']' (while parsing a flow sequence)"),
    ],
)  # fmt: skip
def test_refusals_point_at_the_cause(raw: bytes, line: int, col: int, message: str) -> None:
    problem = one(raw)
    assert (problem.line, problem.col, problem.message) == (line, col, message)
    assert problem.file == "f.yaml"


def test_dates_stay_text_and_bom_is_accepted() -> None:
    doc = parse_yaml("\ufeffwhen: 2024-05-01\n".encode(), "f.yaml")
    assert doc.data == {"when": "2024-05-01"}


def test_billion_laughs_is_refused_quickly() -> None:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    start = time.perf_counter()
    problem = one("\n".join(lines).encode())
    assert time.perf_counter() - start < 1
    assert problem.message == "anchors ('&a0') are not allowed in manifests"


@pytest.mark.parametrize("depth", [40, 100_000])
def test_deep_nesting_is_refused(depth: int) -> None:
    problem = one(b"a: " + b"[" * depth + b"]" * depth + b"\n")
    assert problem.line == 1
    assert problem.message in ("nested deeper than 32 levels", "nested too deeply")


def test_block_nesting_limit() -> None:
    text = "".join(f"{'  ' * i}k{i}:\n" for i in range(40)) + "  " * 40 + "v: 1\n"
    problem = one(text.encode())
    assert problem.message == "nested deeper than 32 levels"
    assert problem.line is not None
    assert 30 <= problem.line <= 41


def test_node_limit() -> None:
    problem = one(b"a: [" + b"1," * 200 + b"1]\n", Limits(max_nodes=100))
    assert problem.message == "more than 100 YAML nodes"


def test_size_limit_checked_before_reading(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    with big.open("wb") as fh:
        fh.truncate(50 * 1024 * 1024)  # sparse: the check must not read it
    with pytest.raises(ManifestError) as info:
        read_yaml(big, "big.yaml")
    assert (
        str(info.value) == "big.yaml:1:1: file is 52428800 bytes; manifests are limited to 1048576"
    )


def test_paths_that_are_not_files(tmp_path: Path) -> None:
    (tmp_path / "dir.yaml").mkdir()
    for name, message in [
        ("dir.yaml", "dir.yaml: is a directory; expected a YAML file"),
        ("missing.yaml", "missing.yaml: file not found"),
    ]:
        with pytest.raises(ManifestError) as info:
            read_yaml(tmp_path / name, name)
        assert str(info.value) == message


# --- no reading through links (registry.safe_io, issue 8) ------------------------------------

LINKED = "is a symbolic link; links in a repository are never followed"


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    path = tmp_path / "outside" / "token"
    path.parent.mkdir()
    path.write_text("SECRET-CANARY-1234: x\n")
    return path


def test_read_yaml_refuses_a_linked_file(tmp_path: Path, secret: Path) -> None:
    link = tmp_path / "repo" / "model.yaml"
    link.parent.mkdir()
    link.symlink_to(secret)
    for root in (None, tmp_path / "repo"):
        with pytest.raises(ManifestError) as info:
            read_yaml(link, "model.yaml", root=root)
        assert [str(p) for p in info.value.problems] == [f"model.yaml: {LINKED}"]


def test_read_yaml_refuses_a_linked_folder_below_the_root(tmp_path: Path, secret: Path) -> None:
    root = tmp_path / "repo"
    (root / "manifests").mkdir(parents=True)
    (root / "manifests" / "mlp").symlink_to(secret.parent)
    with pytest.raises(ManifestError) as info:
        read_yaml(root / "manifests/mlp/token", "manifests/mlp/token", root=root)
    assert [str(p) for p in info.value.problems] == [
        f"manifests/mlp/token: folder manifests/mlp {LINKED}"
    ]


def test_a_link_above_the_root_is_not_the_repositorys_doing(tmp_path: Path) -> None:
    real = tmp_path / "real"
    (real / "repo").mkdir(parents=True)
    (real / "repo" / "a.yaml").write_text("a: 1\n")
    (tmp_path / "alias").symlink_to(real)
    root = tmp_path / "alias" / "repo"
    assert read_yaml(root / "a.yaml", "a.yaml", root=root).data == {"a": 1}


def test_read_yaml_refuses_a_fifo_without_blocking(tmp_path: Path) -> None:
    import os

    fifo = tmp_path / "model.yaml"
    os.mkfifo(fifo)
    with pytest.raises(ManifestError) as info:
        read_yaml(fifo, "model.yaml", root=tmp_path)
    assert [str(p) for p in info.value.problems] == ["model.yaml: is not a regular file"]


def test_safe_io_refuses_paths_outside_the_root(tmp_path: Path, secret: Path) -> None:
    from registry.errors import UnsafeFileError
    from registry.safe_io import read_regular

    with pytest.raises(UnsafeFileError, match="outside the repository"):
        read_regular(secret, root=tmp_path / "repo", max_bytes=100)
    with pytest.raises(UnsafeFileError, match="outside the repository"):
        read_regular(tmp_path / "repo/../outside/token", root=tmp_path / "repo", max_bytes=100)


def test_safe_io_caps_are_checked_before_reading(tmp_path: Path) -> None:
    from registry.errors import FileTooLargeError
    from registry.safe_io import read_regular

    big = tmp_path / "big"
    with big.open("wb") as fh:
        fh.truncate(1 << 30)  # sparse: reading it would take a GiB
    with pytest.raises(FileTooLargeError) as info:
        read_regular(big, root=tmp_path, max_bytes=1024)
    assert (info.value.size, info.value.limit) == (1 << 30, 1024)
    (tmp_path / "small").write_bytes(b"x" * 1024)
    assert read_regular(tmp_path / "small", root=tmp_path, max_bytes=1024) == b"x" * 1024


def test_positions_reread_the_file_without_following_a_link(tmp_path: Path, secret: Path) -> None:
    """A document's positions come from a second read: swapped for a link, it is refused."""
    path = tmp_path / "a.yaml"
    path.write_text("a: 1\n")
    doc = read_yaml(path, "a.yaml", root=tmp_path)
    doc._text = None  # as after a trip through a worker process
    path.unlink()
    path.symlink_to(secret)
    with pytest.raises(ManifestError, match="symbolic link"):
        _ = doc.key_marks


def _open_fds() -> int:
    return sum(1 for _ in Path("/proc/self/fd").iterdir())


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts descriptors in /proc")
def test_reusing_folders_refuses_the_same_links_and_closes_what_it_held(
    tmp_path: Path, secret: Path
) -> None:
    """Loading a repository opens each folder once (``reusing_folders``): same refusals."""
    from registry.safe_io import _FOLDERS_HELD, read_regular, reusing_folders

    root = tmp_path / "repo"
    for i in range(_FOLDERS_HELD + 10):
        (root / "manifests" / f"m{i}" / "versions").mkdir(parents=True)
        (root / "manifests" / f"m{i}" / "versions" / "1.0.0.yaml").write_text(f"i: {i}\n")
    (root / "manifests" / "linked").symlink_to(secret.parent)
    (root / "manifests" / "m0" / "versions" / "2.0.0.yaml").symlink_to(secret)
    before = _open_fds()
    with reusing_folders():
        for _ in range(2):  # the second round reads through the descriptors held
            for i in range(_FOLDERS_HELD + 10):
                path = root / "manifests" / f"m{i}" / "versions" / "1.0.0.yaml"
                assert read_yaml(path, "v.yaml", root=root).data == {"i": i}
            assert _open_fds() <= before + _FOLDERS_HELD
            with pytest.raises(ManifestError, match=f"folder manifests/linked {LINKED}"):
                read_yaml(root / "manifests/linked/token", "t", root=root)
            with pytest.raises(ManifestError, match=LINKED):
                read_yaml(root / "manifests/m0/versions/2.0.0.yaml", "v", root=root)
            with pytest.raises(FileNotFoundError):
                read_regular(root / "manifests/none/x.yaml", root=root, max_bytes=10)
        with reusing_folders():  # nested: the outer block's descriptors serve
            assert read_yaml(root / "manifests/m1/versions/1.0.0.yaml", "v", root=root).data
    assert _open_fds() == before


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts descriptors in /proc")
def test_a_folder_reader_refuses_what_read_regular_refuses(tmp_path: Path, secret: Path) -> None:
    """``folder_reader`` (one folder of many files: the fleet's reports) opens the folder
    once and each file as ``read_regular`` does."""
    import os

    from registry.errors import FileTooLargeError, UnsafeFileError
    from registry.safe_io import folder_reader

    folder = tmp_path / "reports"
    folder.mkdir()
    (folder / "a.json").write_text("{}")
    (folder / "big.json").write_text("x" * 11)
    (folder / "link.json").symlink_to(secret)
    (folder / "sub").mkdir()
    os.mkfifo(folder / "fifo.json")
    before = _open_fds()
    with folder_reader(folder, max_bytes=10) as read:
        assert read("a.json") == b"{}"
        with pytest.raises(FileTooLargeError):
            read("big.json")
        with pytest.raises(UnsafeFileError, match=LINKED):
            read("link.json")
        with pytest.raises(UnsafeFileError, match="not a regular file"):
            read("fifo.json")  # never blocks waiting for a writer
        with pytest.raises(IsADirectoryError):
            read("sub")
        for name in ("../outside/token", "", ".."):
            with pytest.raises(UnsafeFileError, match="not a plain name"):
                read(name)
        with pytest.raises(FileNotFoundError):
            read("gone.json")
    assert _open_fds() == before
    with pytest.raises(FileNotFoundError), folder_reader(tmp_path / "none", max_bytes=1):
        pass
