"""Durable writes and private folders (DESIGN.md, "State outside the workspace")."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.errors import Refusal
from harness.evidence import fsutil
from harness.evidence.fsutil import atomic_write, ensure_private_dir, fsync_dir


def _umask() -> int:
    # Read without changing it (os.umask would set it, racing other threads).
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    return 0o022


UMASK = _umask()


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _tmp_name(target: Path) -> Path:
    return target.parent / f".{target.name}.tmp-{os.getpid()}"


# --------------------------------------------------------------------------- atomic_write


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o644, 0o700, 0o755])
def test_atomic_write_creates_with_mode(tmp_path: Path, mode: int) -> None:
    target = tmp_path / "f"
    atomic_write(target, b"hello", mode=mode)
    assert target.read_bytes() == b"hello"
    assert _mode(target) == mode & ~UMASK
    assert os.listdir(tmp_path) == ["f"]


def test_atomic_write_default_mode_is_private(tmp_path: Path) -> None:
    target = tmp_path / "f"
    atomic_write(target, b"x")
    assert _mode(target) == 0o600


def test_atomic_write_replaces_content_and_mode(tmp_path: Path) -> None:
    target = tmp_path / "f"
    target.write_bytes(b"old content that is longer")
    target.chmod(0o644)
    old_inode = os.stat(target).st_ino
    atomic_write(target, b"new", mode=0o600)
    assert target.read_bytes() == b"new"
    assert _mode(target) == 0o600
    assert os.stat(target).st_ino != old_inode  # renamed over, not rewritten in place
    assert os.listdir(tmp_path) == ["f"]


def test_atomic_write_accepts_str_path_and_empty_data(tmp_path: Path) -> None:
    target = tmp_path / "f"
    atomic_write(str(target), b"")
    assert target.read_bytes() == b""
    assert os.listdir(tmp_path) == ["f"]


def test_atomic_write_relative_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    atomic_write("rel", b"data")
    assert (tmp_path / "rel").read_bytes() == b"data"
    assert os.listdir(tmp_path) == ["rel"]


def test_atomic_write_replaces_a_link_not_its_target(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_bytes(b"keep me")
    link = tmp_path / "link"
    link.symlink_to(outside)
    atomic_write(link, b"new")
    assert outside.read_bytes() == b"keep me"
    assert not link.is_symlink()
    assert link.read_bytes() == b"new"


def test_atomic_write_handles_short_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = os.write

    def short_write(fd: int, data: Any) -> int:
        return real_write(fd, bytes(data[:3]))

    monkeypatch.setattr(fsutil.os, "write", short_write)
    payload = bytes(range(256)) * 4
    atomic_write(tmp_path / "f", payload)
    monkeypatch.undo()
    assert (tmp_path / "f").read_bytes() == payload


@settings(max_examples=30, deadline=None)
@given(st.binary(max_size=5000))
def test_atomic_write_round_trips_any_bytes(tmp_path_factory: Any, data: bytes) -> None:
    folder = tmp_path_factory.mktemp("aw")
    atomic_write(folder / "f", data)
    assert (folder / "f").read_bytes() == data
    assert os.listdir(folder) == ["f"]


class _Crash(Exception):
    pass


def _crash_on_write(
    monkeypatch: pytest.MonkeyPatch, *, after_calls: int, exc: BaseException
) -> None:
    real_write = os.write
    calls = {"n": 0}

    def write(fd: int, data: Any) -> int:
        calls["n"] += 1
        if calls["n"] > after_calls:
            raise exc
        return real_write(fd, bytes(data[:2]))  # partial progress before the crash

    monkeypatch.setattr(fsutil.os, "write", write)


@pytest.mark.parametrize("after_calls", [0, 1, 3])
@pytest.mark.parametrize(
    "exc", [_Crash("disk on fire"), OSError(28, "No space left"), KeyboardInterrupt()]
)
def test_crash_mid_write_keeps_old_content(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, after_calls: int, exc: BaseException
) -> None:
    target = tmp_path / "f"
    target.write_bytes(b"old")
    target.chmod(0o640)
    _crash_on_write(monkeypatch, after_calls=after_calls, exc=exc)
    with pytest.raises(type(exc)):
        atomic_write(target, b"new content, long enough to need several writes")
    monkeypatch.undo()
    assert target.read_bytes() == b"old"
    assert _mode(target) == 0o640
    assert os.listdir(tmp_path) == ["f"]


def test_crash_on_fsync_keeps_old_content(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "f"
    target.write_bytes(b"old")

    def fail(fd: int) -> None:
        raise OSError(5, "I/O error")

    monkeypatch.setattr(fsutil.os, "fsync", fail)
    with pytest.raises(OSError):
        atomic_write(target, b"new")
    monkeypatch.undo()
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["f"]


def test_crash_on_first_write_of_new_file_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _crash_on_write(monkeypatch, after_calls=0, exc=_Crash())
    with pytest.raises(_Crash):
        atomic_write(tmp_path / "f", b"data")
    monkeypatch.undo()
    assert os.listdir(tmp_path) == []


def test_stale_temp_file_does_not_leak_its_mode(tmp_path: Path) -> None:
    # A crashed process with the same pid (common in containers) left its temp file.
    target = tmp_path / "secret"
    stale = _tmp_name(target)
    stale.write_bytes(b"stale bytes, longer than the new content")
    stale.chmod(0o666)
    atomic_write(target, b"key", mode=0o600)
    assert target.read_bytes() == b"key"
    assert _mode(target) == 0o600
    assert os.listdir(tmp_path) == ["secret"]


def test_stale_temp_link_is_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_bytes(b"keep me")
    target = tmp_path / "d" / "f"
    target.parent.mkdir()
    _tmp_name(target).symlink_to(outside)
    atomic_write(target, b"new")
    assert outside.read_bytes() == b"keep me"
    assert target.read_bytes() == b"new"
    assert not target.is_symlink()
    assert os.listdir(target.parent) == ["f"]


def test_stale_temp_hard_link_is_not_written_through(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_bytes(b"keep me")
    target = tmp_path / "d" / "f"
    target.parent.mkdir()
    os.link(outside, _tmp_name(target))
    atomic_write(target, b"new")
    assert outside.read_bytes() == b"keep me"
    assert target.read_bytes() == b"new"
    assert os.stat(outside).st_nlink == 1


def test_fsync_dir(tmp_path: Path) -> None:
    fsync_dir(tmp_path)
    fsync_dir(str(tmp_path))
    (tmp_path / "f").write_bytes(b"")
    with pytest.raises(NotADirectoryError):
        fsync_dir(tmp_path / "f")


# --------------------------------------------------------------------------- ensure_private_dir


def test_ensure_private_dir_creates_nested_0700(tmp_path: Path) -> None:
    before = _mode(tmp_path)
    target = tmp_path / "a" / "b" / "c"
    assert ensure_private_dir(target) == str(target)
    for folder in (tmp_path / "a", tmp_path / "a" / "b", target):
        assert folder.is_dir()
        assert _mode(folder) == 0o700
    assert _mode(tmp_path) == before  # an existing parent is left alone


def test_ensure_private_dir_is_idempotent(tmp_path: Path) -> None:
    target = tmp_path / "state"
    ensure_private_dir(target)
    (target / "inside").write_bytes(b"kept")
    assert ensure_private_dir(str(target)) == str(target)
    assert (target / "inside").read_bytes() == b"kept"
    assert _mode(target) == 0o700


@pytest.mark.parametrize("wrong", [0o755, 0o777, 0o500, 0o000, 0o1700])
def test_ensure_private_dir_fixes_a_wrong_mode(tmp_path: Path, wrong: int) -> None:
    target = tmp_path / "state"
    target.mkdir()
    os.chmod(target, wrong)
    ensure_private_dir(target)
    assert _mode(target) == 0o700


def test_ensure_private_dir_trailing_slash(tmp_path: Path) -> None:
    target = tmp_path / "x"
    ensure_private_dir(f"{target}/")
    assert target.is_dir()
    assert _mode(target) == 0o700


def _refused(path: Path | str) -> Refusal:
    with pytest.raises(Refusal) as info:
        ensure_private_dir(path)
    assert info.value.code == "state_dir_invalid"
    return info.value


def test_ensure_private_dir_refuses_a_file(tmp_path: Path) -> None:
    f = tmp_path / "state"
    f.write_bytes(b"not a folder")
    assert _refused(f).path == str(f)
    assert f.read_bytes() == b"not a folder"


def test_ensure_private_dir_refuses_a_link_to_a_folder(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o755)
    link = tmp_path / "state"
    link.symlink_to(real)
    assert _refused(link).path == str(link)
    assert _mode(real) == 0o755  # the link's target was not touched


def test_ensure_private_dir_refuses_a_link_given_with_trailing_slash(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o755)
    link = tmp_path / "state"
    link.symlink_to(real)
    _refused(f"{link}/")
    _refused(f"{link}//")
    assert _mode(real) == 0o755


def test_ensure_private_dir_refuses_a_dangling_link(tmp_path: Path) -> None:
    link = tmp_path / "state"
    link.symlink_to(tmp_path / "nowhere")
    _refused(link)
    _refused(f"{link}/")
    assert not (tmp_path / "nowhere").exists()


def test_ensure_private_dir_refuses_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "state"
    os.mkfifo(fifo)
    _refused(fifo)


def test_ensure_private_dir_refuses_a_file_as_parent(tmp_path: Path) -> None:
    parent = tmp_path / "parent"
    parent.write_bytes(b"")
    refusal = _refused(parent / "child")
    assert refusal.path == str(parent)
