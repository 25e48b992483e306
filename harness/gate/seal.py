"""Sealing: copies of the verifier's inputs kept outside the workspace, checked and restored.

The manual: docs/gated-path.md.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Mapping, Sequence
from typing import Any

from harness.errors import Code, GateRefusal, TreeRefusal
from harness.evidence.fsutil import atomic_write, ensure_private_dir
from harness.evidence.jsonio import read_bytes, sha256_hex
from harness.evidence.layout import real_parents, remove_entry
from harness.evidence.tree import scan_tree
from harness.evidence.tree_entry import TreeEntry, display_path, signature_of
from harness.gate.task import HiddenInput

__all__ = ["check_copies", "lay_hidden", "restore_sealed", "seal_files", "store_hidden"]


def _write_copy(dest: str, data: bytes, executable: bool) -> None:
    ensure_private_dir(os.path.dirname(dest))
    atomic_write(dest, data, mode=0o700 if executable else 0o600)


def seal_files(
    workspace: str, paths: Sequence[bytes], entries: Mapping[bytes, TreeEntry], sealed_dir: str
) -> list[dict[str, Any]]:
    """Copy each sealed workspace file into `sealed_dir`; returns the sealed manifest."""
    manifest = []
    for rel in paths:
        entry = entries[rel]
        data = read_bytes(os.path.join(os.fsencode(workspace), rel).decode("utf-8", "surrogateescape"))
        digest = sha256_hex(data)
        if digest != entry.digest:
            raise TreeRefusal(Code.TREE_CHANGED_DURING_SCAN, "a sealed file changed while init read it", display_path(rel))
        _write_copy(os.path.join(sealed_dir, os.fsdecode(rel)), data, entry.executable)
        manifest.append({"path": os.fsdecode(rel), "sha256": digest, "executable": entry.executable})
    return manifest


def store_hidden(task_folder: str, workspace: str, hidden: Sequence[HiddenInput], hidden_dir: str) -> list[dict[str, Any]]:
    """Copy each hidden input (a file or a folder outside the workspace) into `hidden_dir`."""
    manifest = []
    for index, item in enumerate(hidden):
        source = os.path.realpath(os.path.join(task_folder, item.source))
        if source == workspace or source.startswith(workspace + os.sep):
            raise GateRefusal(Code.HIDDEN_INPUT_INSIDE_WORKSPACE, "a hidden input must lie outside the workspace", source)
        if not os.path.lexists(source):
            raise GateRefusal(Code.HIDDEN_INPUT_MISSING, "no such hidden input", source)
        stored = os.path.join(hidden_dir, str(index))
        if os.path.isdir(source):
            entries = scan_tree(source, excludes=())
            for rel, entry in sorted(entries.items()):
                if entry.kind == "dir":
                    continue
                if entry.kind != "file":
                    raise GateRefusal(Code.HIDDEN_INPUT_INVALID, "a hidden folder may hold only files and folders", display_path(rel))
                data = read_bytes(os.path.join(source, os.fsdecode(rel)))
                _write_copy(os.path.join(stored, os.fsdecode(rel)), data, entry.executable)
            digest, kind = signature_of(entries).digest, "dir"
        else:
            data = read_bytes(source)
            _write_copy(stored, data, os.access(source, os.X_OK))
            digest, kind = sha256_hex(data), "file"
        manifest.append({"from": item.source, "to": item.to, "kind": kind, "sha256": digest, "stored": str(index)})
    return manifest


def check_copies(state_root: str, sealed: Sequence[Mapping[str, Any]], hidden: Sequence[Mapping[str, Any]]) -> None:
    """Refuse `state_tampered` when a sealed or hidden copy no longer matches the pin."""
    for item in sealed:
        path = os.path.join(state_root, "sealed", item["path"])
        if sha256_hex(read_bytes(path)) != item["sha256"]:
            raise GateRefusal(Code.STATE_TAMPERED, "a sealed copy no longer matches the pin", path)
    for item in hidden:
        path = os.path.join(state_root, "hidden", item["stored"])
        if item["kind"] == "dir":
            digest = signature_of(scan_tree(path, excludes=())).digest
        else:
            digest = sha256_hex(read_bytes(path))
        if digest != item["sha256"]:
            raise GateRefusal(Code.STATE_TAMPERED, "a hidden copy no longer matches the pin", path)


def restore_sealed(
    workspace: str, state_root: str, sealed: Sequence[Mapping[str, Any]], current: Mapping[bytes, TreeEntry]
) -> list[str]:
    """Put back every sealed file whose content, kind or exec bit differs; returns their paths."""
    restored = []
    for item in sealed:
        rel = os.fsencode(item["path"])
        entry = current.get(rel)
        if entry is not None and entry.kind == "file" and entry.digest == item["sha256"] and entry.executable == item["executable"]:
            continue
        target = real_parents(workspace, item["path"])
        remove_entry(target)
        data = read_bytes(os.path.join(state_root, "sealed", item["path"]))
        atomic_write(target, data, mode=0o755 if item["executable"] else 0o644)
        restored.append(item["path"])
    return restored


def lay_hidden(copy_root: str, state_root: str, hidden: Sequence[Mapping[str, Any]]) -> None:
    """Lay the hidden inputs into the verification copy (never into the workspace).

    Every folder on the way is opened beneath the copy's root without following
    a link (`O_NOFOLLOW`, relative to its parent's descriptor), so a chain of
    links the worker planted cannot carry the write anywhere else: a link or a
    file where a folder must be is refused (`unsafe_workspace_entry`).
    """
    root_fd = os.open(copy_root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for item in hidden:
            source = os.path.join(state_root, "hidden", item["stored"])
            *parents, name = [p for p in item["to"].split("/") if p not in ("", ".")]
            folder = _open_folder(root_fd, parents, copy_root)
            try:
                _remove_at(folder, name)
                if item["kind"] == "dir":
                    _copy_folder(source, folder, name)
                else:
                    _copy_file(source, folder, name)
            finally:
                os.close(folder)
    finally:
        os.close(root_fd)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_folder(root_fd: int, parts: Sequence[str], shown_root: str) -> int:
    """A descriptor of the folder `parts` beneath `root_fd`, made where missing, never through a link."""
    fd = os.dup(root_fd)
    for depth, part in enumerate(parts):
        if part == "..":
            os.close(fd)
            raise GateRefusal(Code.UNSAFE_WORKSPACE_ENTRY, "a hidden input's place climbs out of the copy", shown_root)
        try:
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                os.mkdir(part, 0o755, dir_fd=fd)
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
        except OSError as exc:
            os.close(fd)
            where = "/".join(parts[: depth + 1])
            raise GateRefusal(
                Code.UNSAFE_WORKSPACE_ENTRY,
                f"a link or a file stands where a hidden input's folder goes ({exc.strerror}); never followed",
                os.path.join(shown_root, where),
                entries=[{"path": where, "why": "not a real folder"}],
            ) from None
        os.close(fd)
        fd = child
    return fd


def _remove_at(folder: int, name: str) -> None:
    """Remove whatever stands at `name` in `folder`: a link or a file (unlinked), a folder (with its contents)."""
    try:
        st = os.lstat(name, dir_fd=folder)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, dir_fd=folder)
    else:
        os.unlink(name, dir_fd=folder)


def _copy_file(source: str, folder: int, name: str) -> None:
    data = read_bytes(source)
    mode = stat.S_IMODE(os.stat(source).st_mode)
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=folder)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def _copy_folder(source: str, folder: int, name: str) -> None:
    """Copy the stored hidden folder `source` (files and folders only) to `name` in `folder`."""
    os.mkdir(name, stat.S_IMODE(os.stat(source).st_mode), dir_fd=folder)
    fd = os.open(name, _DIR_FLAGS, dir_fd=folder)
    try:
        for entry in sorted(os.scandir(source), key=lambda e: e.name):
            if entry.is_dir(follow_symlinks=False):
                _copy_folder(entry.path, fd, entry.name)
            elif entry.is_file(follow_symlinks=False):
                _copy_file(entry.path, fd, entry.name)
    finally:
        os.close(fd)
