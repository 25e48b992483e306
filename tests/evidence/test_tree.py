"""Tree signatures: what changes a signature, what does not, and what is refused."""

from __future__ import annotations

import errno
import hashlib
import os
import socket
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.errors import Refusal
from harness.evidence.jsonio import canonical_bytes, loads_strict
from harness.evidence.tree import DEFAULT_EXCLUDES, scan_tree, tree_signature
from harness.evidence.tree_entry import (
    TREE_FORMAT,
    TreeDiff,
    TreeEntry,
    diff_trees,
    display_path,
    manifest_from_json,
    manifest_to_json,
    signature_of,
)

# A tree spec maps a relative path to: bytes (a file), ("x", bytes) (an executable
# file), ("link", target) or ("dir",) (an empty folder).
Spec = dict[bytes, Any]


def build(root: Path, spec: Spec, order: Callable[[list[bytes]], list[bytes]] = sorted) -> Path:
    """Create `spec` under `root`, visiting paths in `order`."""
    base = os.fsencode(root)
    os.makedirs(base, exist_ok=True)
    for rel in order(list(spec)):
        node = spec[rel]
        full = os.path.join(base, rel)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        if isinstance(node, bytes):
            with open(full, "wb") as f:
                f.write(node)
            os.chmod(full, 0o644)
        elif node[0] == "x":
            with open(full, "wb") as f:
                f.write(node[1])
            os.chmod(full, 0o755)
        elif node[0] == "link":
            os.symlink(node[1], full)
        elif node[0] == "dir":
            os.makedirs(full, exist_ok=True)
        else:  # pragma: no cover - a broken test spec
            raise AssertionError(node)
    return root


BASE: Spec = {
    b"README.md": b"# readme\n",
    b"src/app.py": b"print('hi')\n",
    b"src/run.sh": ("x", b"#!/bin/sh\necho run\n"),
    b"src/link": ("link", b"app.py"),
    b"docs/guide.txt": b"guide\n",
    b"empty": ("dir",),
}


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    return build(tmp_path / "ws", BASE)


def digest(root: Path, excludes: tuple[str, ...] = DEFAULT_EXCLUDES) -> str:
    return tree_signature(root, excludes).digest


# --- what the signature records -------------------------------------------------


def test_records_every_kind_with_fields(ws: Path) -> None:
    entries = scan_tree(ws)
    assert sorted(entries) == [
        b"README.md",
        b"docs",
        b"docs/guide.txt",
        b"empty",
        b"src",
        b"src/app.py",
        b"src/link",
        b"src/run.sh",
    ]
    app = entries[b"src/app.py"]
    assert app == TreeEntry(
        b"src/app.py", "file", False, 12, hashlib.sha256(b"print('hi')\n").hexdigest(), None
    )
    assert entries[b"src/run.sh"].executable is True
    link = entries[b"src/link"]
    assert (link.kind, link.target, link.size) == ("link", b"app.py", 0)
    assert link.digest == hashlib.sha256(b"app.py").hexdigest()
    assert entries[b"empty"] == TreeEntry(b"empty", "dir", False, 0, "", None)
    sig = tree_signature(ws)
    assert (sig.entries, sig.files) == (8, 4)
    assert sig.bytes == sum(e.size for e in entries.values())
    assert sig.to_json() == {
        "format": TREE_FORMAT,
        "digest": sig.digest,
        "entries": 8,
        "files": 4,
        "bytes": sig.bytes,
    }


def test_encoding_matches_the_documented_format(tmp_path: Path) -> None:
    root = build(tmp_path / "w", {b"b": ("x", b"BB"), b"a/l": ("link", b"../b"), b"a/c": b""})
    records = [
        b"dir\x000\x00a\x00\x000\n",
        b"file\x000\x00a/c\x00" + hashlib.sha256(b"").hexdigest().encode() + b"\x000\n",
        b"link\x000\x00a/l\x00" + hashlib.sha256(b"../b").hexdigest().encode() + b"\x000\n",
        b"file\x001\x00b\x00" + hashlib.sha256(b"BB").hexdigest().encode() + b"\x002\n",
    ]
    expected = hashlib.sha256(b"proctor-tree-v1\n" + b"".join(records)).hexdigest()
    assert digest(root) == expected


def test_large_file_hashed_in_chunks(tmp_path: Path) -> None:
    data = os.urandom((3 << 20) + 17)
    root = build(tmp_path / "w", {b"big.bin": data})
    entry = scan_tree(root)[b"big.bin"]
    assert (entry.size, entry.digest) == (len(data), hashlib.sha256(data).hexdigest())


def test_deep_tree_needs_no_recursion(tmp_path: Path) -> None:
    rel = b"/".join([b"d"] * 400) + b"/leaf"
    root = build(tmp_path / "w", {rel: b"x"})
    assert len(scan_tree(root)) == 401


# --- what changes the signature, and what does not ------------------------------


def _write(p: Path, data: bytes) -> None:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)


def _relink(p: Path, target: str) -> None:
    os.remove(p)
    os.symlink(target, p)


CHANGES: dict[str, Callable[[Path], None]] = {
    "content": lambda w: _write(w / "src/app.py", b"print('bye')\n"),
    "same size content": lambda w: _write(w / "src/app.py", b"print('HI')\n"),
    "exec bit set": lambda w: os.chmod(w / "src/app.py", 0o744),
    "exec bit cleared": lambda w: os.chmod(w / "src/run.sh", 0o644),
    "link target": lambda w: _relink(w / "src/link", "run.sh"),
    "file replaced by link": lambda w: _relink(w / "src/app.py", "../README.md"),
    "new empty folder": lambda w: os.mkdir(w / "new"),
    "folder removed": lambda w: os.rmdir(w / "empty"),
    "rename": lambda w: os.rename(w / "docs/guide.txt", w / "docs/guide2.txt"),
    "file removed": lambda w: os.remove(w / "README.md"),
    "new empty file": lambda w: _write(w / "docs/new", b""),
    "change in a nested .git": lambda w: _write(w / "src/.git", b"gitdir: elsewhere\n"),
    "dot file": lambda w: _write(w / ".env", b"x"),
    "pyc-like folder name is still a folder": lambda w: os.mkdir(w / "src/pycache"),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_signature_changes_with(ws: Path, change: str) -> None:
    before_entries = scan_tree(ws)
    before = signature_of(before_entries).digest
    CHANGES[change](ws)
    assert digest(ws) != before
    assert not diff_trees(before_entries, scan_tree(ws)).empty


NON_CHANGES: dict[str, Callable[[Path], None]] = {
    "mtime": lambda w: os.utime(w / "src/app.py", (1, 1)),
    "folder mtime": lambda w: os.utime(w / "src", (1, 1)),
    "under top-level .git": lambda w: _write(w / ".git/objects/ab/cd", b"blob"),
    "__pycache__ at depth": lambda w: _write(w / "src/__pycache__/app.cpython-311.pyc", b"\0"),
    "*.pyc anywhere": lambda w: _write(w / "docs/stale.pyc", b"\0"),
    ".pytest_cache": lambda w: _write(w / ".pytest_cache/v/x", b"1"),
    "non-exec mode 0644->0600": lambda w: os.chmod(w / "src/app.py", 0o600),
    "group/other exec bits": lambda w: os.chmod(w / "src/app.py", 0o655),
    "folder mode": lambda w: os.chmod(w / "docs", 0o700),
    "rewrite with the same bytes": lambda w: _write(w / "README.md", b"# readme\n"),
}


@pytest.mark.parametrize("change", sorted(NON_CHANGES))
def test_signature_does_not_change_with(ws: Path, change: str) -> None:
    (ws / ".git").mkdir()
    _write(ws / ".git" / "HEAD", b"ref: refs/heads/main\n")
    before = digest(ws)
    NON_CHANGES[change](ws)
    assert digest(ws) == before


def test_top_level_git_file_excluded_but_nested_git_folder_recorded(tmp_path: Path) -> None:
    root = build(
        tmp_path / "w",
        {b".git": b"gitdir: /elsewhere\n", b"sub/.git/HEAD": b"ref\n", b"a": b"a"},
    )
    assert sorted(scan_tree(root)) == [b"a", b"sub", b"sub/.git", b"sub/.git/HEAD"]


def test_gitignore_not_honoured(ws: Path) -> None:
    _write(ws / ".gitignore", b"*\n!.gitignore\n")
    _write(ws / "secret.txt", b"one")
    assert b"secret.txt" in scan_tree(ws)
    before = digest(ws)
    _write(ws / "secret.txt", b"two")
    assert digest(ws) != before


# --- exclusions -----------------------------------------------------------------


def test_custom_exclusions(tmp_path: Path) -> None:
    spec: Spec = {
        b"build/out.o": b"1",  # folder pattern, top level
        b"src/build/gen.c": b"2",  # folder pattern, at depth
        b"src/buildfile": b"3",
        b"docs/api.md": b"4",  # path pattern
        b"docs/deep/api.md": b"5",  # fnmatch `*` crosses '/'
        b"api.md": b"6",
        b"top.txt": b"7",  # anchored
        b"src/top.txt": b"8",
        b"logs.log/inner.txt": b"9",  # a folder matching a plain glob goes with its subtree
        b"x.log": b"10",
    }
    root = build(tmp_path / "w", {**spec, b"dist": b"a file named like a folder pattern"})
    kept = scan_tree(root, ("build/", "dist/", "docs/*.md", "/top.txt", "*.log"))
    assert sorted(kept) == [
        b"api.md",
        b"dist",
        b"docs",
        b"docs/deep",
        b"src",
        b"src/buildfile",
        b"src/top.txt",
    ]
    # The default exclusions do not apply once a task names its own.
    assert b"x.pyc" in scan_tree(build(tmp_path / "v", {b"x.pyc": b""}), ())


def test_excluded_folder_is_never_opened(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (ws / "src/__pycache__").mkdir()
    real_open = os.open

    def guarded(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        assert os.fsencode(path) != b"__pycache__", "an excluded folder was opened"
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", guarded)
    scan_tree(ws)


@pytest.mark.parametrize("bad", ["*.pyc", ["", "x"], ["/"], ["//"], [7], ["a\0b"], b"x"])
def test_invalid_exclusions_refused(ws: Path, bad: Any) -> None:
    with pytest.raises(Refusal) as info:
        scan_tree(ws, bad)
    assert info.value.code == "exclusion_invalid"


# --- links, special files, odd names ---------------------------------------------


def test_links_are_recorded_never_followed(tmp_path: Path) -> None:
    root = build(
        tmp_path / "w",
        {
            b"etc": ("link", b"/etc"),
            b"loop_a": ("link", b"loop_b"),
            b"loop_b": ("link", b"loop_a"),
            b"self": ("link", b"."),
            b"dangling": ("link", b"nowhere/at/all"),
            b"real/f": b"f",
            b"to_dir": ("link", b"real"),
        },
    )
    entries = scan_tree(root)
    assert {p: e.kind for p, e in entries.items()} == {
        b"etc": "link",
        b"loop_a": "link",
        b"loop_b": "link",
        b"self": "link",
        b"dangling": "link",
        b"real": "dir",
        b"real/f": "file",
        b"to_dir": "link",
    }
    assert entries[b"etc"].target == b"/etc"


@pytest.mark.timeout(20)
def test_fifo_recorded_without_blocking(ws: Path) -> None:
    os.mkfifo(ws / "src" / "pipe")
    before = scan_tree(ws)
    assert before[b"src/pipe"] == TreeEntry(b"src/pipe", "fifo", False, 0, "", None)


def test_socket_recorded_by_kind(tmp_path: Path) -> None:
    root = tmp_path / "w"
    root.mkdir()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(os.fspath(root / "s"))
        assert scan_tree(root)[b"s"].kind == "socket"


def test_device_recorded_by_kind(tmp_path: Path) -> None:
    root = tmp_path / "w"
    root.mkdir()
    try:
        os.mknod(root / "null", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("mknod not permitted here")
    assert scan_tree(root)[b"null"].kind == "char_device"


def test_non_utf8_names(tmp_path: Path) -> None:
    root = build(
        tmp_path / "w",
        {b"\xff\xfe.txt": b"odd", b"caf\xc3\xa9/x": b"", b"l": ("link", b"\xff")},
    )
    entries = scan_tree(root)
    assert entries[b"\xff\xfe.txt"].digest == hashlib.sha256(b"odd").hexdigest()
    assert display_path(b"\xff\xfe.txt") == "\\xff\\xfe.txt"
    odd = entries[b"\xff\xfe.txt"].to_json()
    assert (odd["path"], odd["path_hex"]) == ("\\xff\\xfe.txt", "fffe2e747874")
    assert "path_hex" not in entries[b"caf\xc3\xa9"].to_json()
    assert entries[b"l"].to_json()["target_hex"] == "ff"
    # A file literally named `\xff\xfe.txt` is a different entry with a different signature.
    other = build(
        tmp_path / "v", {b"\\xff\\xfe.txt": b"odd", b"caf\xc3\xa9/x": b"", b"l": ("link", b"\xff")}
    )
    assert digest(root) != digest(other)


def test_exclusions_match_non_utf8_names(tmp_path: Path) -> None:
    root = build(tmp_path / "w", {b"\xff.pyc": b"", b"\xff/__pycache__/\xfe": b"", b"keep": b""})
    assert sorted(scan_tree(root)) == [b"keep", b"\xff"]


# --- determinism ----------------------------------------------------------------


def test_same_tree_different_dirs_and_orders(tmp_path: Path) -> None:
    spec = {**BASE, b"z/y/x": b"deep", b"a-b": b"sorts before a/b", b"a/b": b"x"}
    one = build(tmp_path / "one", spec, sorted)
    two = build(tmp_path / "second-copy", spec, lambda ps: sorted(ps, reverse=True))
    assert tree_signature(one) == tree_signature(two)


# --- refusals -------------------------------------------------------------------


def test_root_refusals(tmp_path: Path) -> None:
    cases = {
        "workspace_missing": tmp_path / "nope",
        "not_a_directory": tmp_path / "file",
    }
    (tmp_path / "file").write_bytes(b"")
    os.symlink(tmp_path / "nothing", tmp_path / "dangling")
    for code, path in [*cases.items(), ("workspace_missing", tmp_path / "dangling")]:
        with pytest.raises(Refusal) as info:
            scan_tree(path)
        assert info.value.code == code
        assert info.value.path == os.fspath(path)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(Refusal) as info:
        scan_tree(tmp_path / "fifo")
    assert info.value.code == "not_a_directory"


def test_root_through_a_link_and_as_bytes(ws: Path, tmp_path: Path) -> None:
    os.symlink(ws, tmp_path / "alias")
    assert digest(tmp_path / "alias") == digest(ws) == tree_signature(os.fsencode(ws)).digest


def _same_file(fd: int, target: Path) -> bool:
    a, b = os.fstat(fd), os.stat(target)
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def test_unlistable_folder_refused(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.scandir

    def scandir(path: Any) -> Any:
        if isinstance(path, int) and _same_file(path, ws / "docs"):
            raise PermissionError(errno.EACCES, "Permission denied")
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(Refusal) as info:
        scan_tree(ws)
    assert info.value.code == "tree_unreadable"
    assert info.value.path == os.fspath(ws / "docs")


def test_listing_error_midway_is_not_a_short_folder(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.scandir

    class Broken:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def __enter__(self) -> Broken:
            return self

        def __exit__(self, *exc: object) -> None:
            self.inner.close()

        def __iter__(self) -> Iterator[Any]:
            yield next(iter(self.inner))
            raise OSError(errno.EIO, "Input/output error")

    def scandir(path: Any) -> Any:
        it = real(path)
        return Broken(it) if isinstance(path, int) and _same_file(path, ws / "src") else it

    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(Refusal) as info:
        scan_tree(ws)
    assert (info.value.code, info.value.path) == ("tree_unreadable", os.fspath(ws / "src"))


@pytest.mark.parametrize("name", [b"docs", b"app.py"])
def test_unopenable_entry_refused(ws: Path, monkeypatch: pytest.MonkeyPatch, name: bytes) -> None:
    real = os.open

    def fake(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        if os.fsencode(path) == name:
            raise PermissionError(errno.EACCES, "Permission denied")
        return real(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", fake)
    with pytest.raises(Refusal) as info:
        scan_tree(ws)
    assert info.value.code == "tree_unreadable"
    assert info.value.path is not None and info.value.path.endswith(os.fsdecode(name))


def _refusal_code_as(uid: int | None, root: Path) -> str:
    """Scan `root` (as `uid` in a forked child when given) and return the refusal code."""
    if uid is None:
        with pytest.raises(Refusal) as info:
            scan_tree(root)
        return info.value.code
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = b"none"
        try:
            os.setgid(uid)
            os.setuid(uid)
            scan_tree(root)
        except Refusal as exc:
            code = exc.code.encode()
        except BaseException as exc:
            code = repr(exc).encode()
        os.write(write_end, code)
        os._exit(0)
    os.close(write_end)
    os.waitpid(pid, 0)
    with os.fdopen(read_end, "rb") as f:
        return f.read().decode()


@pytest.mark.parametrize("locked", ["docs", "docs/guide.txt"])
def test_unreadable_entry_refused_for_real(locked: str) -> None:
    # chmod does not stop root, so as root the scan runs in a child that drops to nobody.
    uid = 65534 if os.geteuid() == 0 else None
    with tempfile.TemporaryDirectory() as d:
        os.chmod(d, 0o755)
        ws = build(Path(d) / "ws", BASE)
        os.chmod(ws / locked, 0)
        try:
            assert _refusal_code_as(uid, ws) == "tree_unreadable"
        finally:
            os.chmod(ws / locked, 0o755)


def _swap_on_open(monkeypatch: pytest.MonkeyPatch, name: bytes, swap: Callable[[], None]) -> None:
    real = os.open

    def fake(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        if os.fsencode(path) == name:
            swap()
        return real(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", fake)


@pytest.mark.timeout(20)
@pytest.mark.parametrize("into", ["fifo", "link", "other file", "folder"])
def test_file_swapped_during_scan(ws: Path, monkeypatch: pytest.MonkeyPatch, into: str) -> None:
    victim = ws / "src/app.py"

    def swap() -> None:
        if into != "other file":
            os.remove(victim)
        if into == "fifo":
            os.mkfifo(victim)
        elif into == "link":
            os.symlink("/etc/passwd", victim)
        elif into == "folder":
            os.mkdir(victim)
        else:  # same name and bytes, but a new inode (created before the old one is freed)
            (ws / "src/new").write_bytes(b"print('hi')\n")
            os.replace(ws / "src/new", victim)

    _swap_on_open(monkeypatch, b"app.py", swap)
    with pytest.raises(Refusal) as info:
        scan_tree(ws)
    assert (info.value.code, info.value.path) == ("tree_changed_during_scan", os.fspath(victim))


@pytest.mark.parametrize("into", ["link", "other folder", "gone"])
def test_folder_swapped_during_scan(ws: Path, monkeypatch: pytest.MonkeyPatch, into: str) -> None:
    victim = ws / "docs"

    def swap() -> None:
        os.rename(victim, ws / "moved")
        if into == "link":
            os.symlink("/etc", victim)
        elif into == "other folder":
            os.mkdir(victim)

    _swap_on_open(monkeypatch, b"docs", swap)
    with pytest.raises(Refusal) as info:
        scan_tree(ws)
    assert info.value.code == "tree_changed_during_scan"


def test_file_growing_while_read(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.fstat
    victim = ws / "README.md"

    target = os.stat(victim)

    def fstat(fd: int) -> os.stat_result:
        result = real(fd)
        if (result.st_dev, result.st_ino) == (target.st_dev, target.st_ino):
            with open(victim, "ab") as f:
                f.write(b"more")
        return result

    monkeypatch.setattr(os, "fstat", fstat)
    with pytest.raises(Refusal) as info:
        scan_tree(ws)
    assert (info.value.code, info.value.path) == ("tree_changed_during_scan", os.fspath(victim))


# --- diffs and manifests ----------------------------------------------------------


def test_diff_trees(ws: Path) -> None:
    before = scan_tree(ws)
    assert diff_trees(before, scan_tree(ws)).empty
    os.remove(ws / "README.md")
    _write(ws / "src/app.py", b"changed")
    os.mkdir(ws / "new")
    os.chmod(ws / "src/run.sh", 0o644)
    diff = diff_trees(before, scan_tree(ws))
    assert diff == TreeDiff(
        added=(b"new",), removed=(b"README.md",), changed=(b"src/app.py", b"src/run.sh")
    )
    assert not diff.empty
    assert diff.to_json() == {
        "added": ["new"],
        "removed": ["README.md"],
        "changed": ["src/app.py", "src/run.sh"],
    }


def test_manifest_round_trip_through_canonical_json(tmp_path: Path) -> None:
    root = build(
        tmp_path / "w",
        {**BASE, b"\xff\xfe.txt": b"odd", b"odd/\xff": ("link", b"../\xfe"), b"exe": ("x", b"")},
    )
    os.mkfifo(root / "pipe")
    entries = scan_tree(root)
    items = loads_strict(canonical_bytes(manifest_to_json(entries)), expect_object=False)
    again = manifest_from_json(items)
    assert again == entries
    assert signature_of(again) == signature_of(entries)


def _good_items() -> list[dict[str, Any]]:
    spec: Spec = {b"a/f": b"x", b"a/l": ("link", b"f"), b"\xff": b""}
    with tempfile.TemporaryDirectory() as d:
        return manifest_to_json(scan_tree(build(Path(d) / "w", spec)))


def _edit(index: int, **changes: Any) -> Callable[[list[dict[str, Any]]], Any]:
    def apply(items: list[dict[str, Any]]) -> Any:
        for key, value in changes.items():
            if value is _DROP:
                del items[index][key]
            else:
                items[index][key] = value
        return items

    return apply


_DROP = object()
# Item order in _good_items(): 0 "a" dir, 1 "a/f" file, 2 "a/l" link, 3 "\xff" file.
MALFORMED: dict[str, Callable[[list[dict[str, Any]]], Any]] = {
    "not a list": lambda items: {"entries": items},
    "item not an object": lambda items: [*items, "a/g"],
    "unknown kind": _edit(1, kind="symlink"),
    "extra key": _edit(1, mtime=1),
    "missing key": _edit(1, size=_DROP),
    "target on a file": _edit(1, target="x"),
    "path not a string": _edit(1, path=5),
    "absolute path": _edit(0, path="/a"),
    "dot-dot path": _edit(3, path="a/../b"),
    "empty component": _edit(1, path="a//f"),
    "trailing slash": _edit(0, path="a/"),
    "lone surrogate": _edit(3, path="\udcff", path_hex=_DROP),
    "hex for a UTF-8 path": _edit(1, path_hex=b"a/f".hex()),
    "hex does not match path": _edit(3, path="other"),
    "odd hex": _edit(3, path_hex="f"),
    "uppercase digest": lambda items: _edit(1, digest=items[1]["digest"].upper())(items),
    "short digest": _edit(1, digest="ab"),
    "digest on a folder": _edit(0, digest="0" * 64),
    "exec on a folder": _edit(0, executable=True),
    "exec not a bool": _edit(1, executable=1),
    "size on a link": _edit(2, size=3),
    "bool size": _edit(1, size=True),
    "negative size": _edit(1, size=-1),
    "float size": _edit(1, size=1.0),
    "link digest mismatch": _edit(2, target="g"),
    "link without target": _edit(2, target=_DROP),
    "empty link target": _edit(2, target="", digest=hashlib.sha256(b"").hexdigest()),
    "duplicate": lambda items: [*items[:2], items[1], *items[2:]],
    "out of order": lambda items: [items[1], items[0], *items[2:]],
    "missing parent": lambda items: items[1:],
    "parent is a file": lambda items: [{**items[1], "path": "a"}, *items[1:]],
}


def test_good_items_fixture_order() -> None:
    items = _good_items()
    assert [i["path"] for i in items] == ["a", "a/f", "a/l", "\\xff"]
    assert manifest_from_json(items)


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_manifest_from_json_refuses(case: str) -> None:
    items = MALFORMED[case](_good_items())
    with pytest.raises(Refusal) as info:
        manifest_from_json(items)
    assert info.value.code == "manifest_invalid"


def test_signature_of_rejects_mismatched_keys() -> None:
    entry = TreeEntry(b"a", "dir", False, 0, "", None)
    with pytest.raises(ValueError):
        signature_of({b"b": entry})


# --- property: stable under rebuild, sensitive to any single change ---------------

_NAMES = st.sampled_from([b"a", b"b", b"c.txt", b"\xff", b"caf\xc3\xa9", b"x y", b"-", b"a.b"])
_NODES = st.one_of(
    st.binary(max_size=64),
    st.tuples(st.just("x"), st.binary(max_size=64)),
    st.tuples(st.just("link"), st.binary(min_size=1, max_size=12).filter(lambda b: b"\0" not in b)),
)


@st.composite
def trees(draw: st.DrawFn) -> Spec:
    raw = draw(
        st.dictionaries(
            st.lists(_NAMES, min_size=1, max_size=3).map(lambda parts: b"/".join(parts)),
            _NODES,
            min_size=1,
            max_size=8,
        )
    )
    # Drop entries that would need a file to also be a folder.
    return {p: n for p, n in raw.items() if not any(q.startswith(p + b"/") for q in raw)}


def _mutate(node: Any) -> Any:
    if isinstance(node, bytes):
        return node + b"!"
    if node[0] == "x":
        return node[1]  # same bytes, exec bit cleared
    return ("link", node[1] + b"2")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=trees(), data=st.data())
def test_property_stable_and_sensitive(spec: Spec, data: st.DataObject) -> None:
    victim = data.draw(st.sampled_from(sorted(spec)))
    with tempfile.TemporaryDirectory() as d:
        one = build(Path(d) / "one", spec)
        two = build(Path(d) / "two", spec, lambda ps: sorted(ps, reverse=True))
        three = build(Path(d) / "three", {**spec, victim: _mutate(spec[victim])})
        first, second = scan_tree(one), scan_tree(two)
        assert signature_of(first) == signature_of(second)
        assert manifest_from_json(manifest_to_json(first)) == first
        changed = scan_tree(three)
        assert signature_of(changed).digest != signature_of(first).digest
        assert diff_trees(first, changed) == TreeDiff((), (), (victim,))
