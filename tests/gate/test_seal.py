"""harness.gate.seal.lay_hidden: the hidden inputs go into the verification copy and nowhere else.

Links are planted straight into a copy (as if every check before it had
missed them): laying must never write through one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from harness.errors import Code, GateRefusal
from harness.gate.seal import lay_hidden

HIDDEN = b"def test_hidden():\n    assert 'secret'\n"


def _state(tmp_path: Path) -> tuple[Path, list[dict[str, Any]]]:
    state = tmp_path / "state"
    (state / "hidden" / "1" / "sub").mkdir(parents=True)
    (state / "hidden" / "0").write_bytes(HIDDEN)
    (state / "hidden" / "1" / "sub" / "test_more.py").write_bytes(HIDDEN)
    (state / "hidden" / "1" / "data.txt").write_bytes(b"data\n")
    hidden = [
        {"stored": "0", "kind": "file", "to": "tests/deep/test_hidden.py"},
        {"stored": "1", "kind": "dir", "to": "tests/extra"},
    ]
    return state, hidden


def _copy(tmp_path: Path) -> Path:
    copy = tmp_path / "verify" / "r0001" / "tree"
    (copy / "tests").mkdir(parents=True)
    return copy


def _leaks(tmp_path: Path, copy: Path) -> list[Path]:
    """Files holding hidden content outside the copy and the state folder."""
    found = []
    for path in tmp_path.rglob("*"):
        inside = copy in path.parents or tmp_path / "state" in path.parents
        if not inside and path.is_file() and not path.is_symlink() and path.read_bytes() == HIDDEN:
            found.append(path)
    return found


def test_hidden_inputs_are_laid_into_the_copy(tmp_path: Path) -> None:
    state, hidden = _state(tmp_path)
    copy = _copy(tmp_path)
    lay_hidden(str(copy), str(state), hidden)
    assert (copy / "tests" / "deep" / "test_hidden.py").read_bytes() == HIDDEN
    assert (copy / "tests" / "extra" / "sub" / "test_more.py").read_bytes() == HIDDEN
    assert (copy / "tests" / "extra" / "data.txt").read_bytes() == b"data\n"


@pytest.mark.parametrize("at", ["tests", "tests/deep"])
def test_a_chain_of_links_in_the_copy_is_never_followed(tmp_path: Path, at: str) -> None:
    state, hidden = _state(tmp_path)
    copy = _copy(tmp_path)
    workspace = tmp_path / "ws"
    (workspace / "tests" / "deep").mkdir(parents=True)
    (copy / "x").mkdir()
    os.symlink("..", copy / "x" / "u1")  # tree
    for n in range(2, 5):  # r0001, verify, tmp_path
        os.symlink(f"u{n - 1}/..", copy / "x" / f"u{n}")
    if at == "tests":
        os.rmdir(copy / "tests")
    os.symlink("../" * at.count("/") + f"x/u4/ws/{at}", copy / at)
    assert (copy / at).resolve() == workspace / at  # laid through, it would land in the workspace
    with pytest.raises(GateRefusal) as refused:
        lay_hidden(str(copy), str(state), hidden)
    assert refused.value.code == Code.UNSAFE_WORKSPACE_ENTRY
    assert refused.value.path == str(copy / at)
    assert _leaks(tmp_path, copy) == []
    assert list((workspace / "tests" / "deep").iterdir()) == []


def test_a_link_at_the_hidden_inputs_own_place_is_replaced_not_followed(tmp_path: Path) -> None:
    state, hidden = _state(tmp_path)
    copy = _copy(tmp_path)
    outside = tmp_path / "outside.py"
    outside.write_bytes(b"x = 1\n")
    (copy / "tests" / "deep").mkdir()
    os.symlink(outside, copy / "tests" / "deep" / "test_hidden.py")
    os.symlink(tmp_path, copy / "tests" / "extra")
    lay_hidden(str(copy), str(state), hidden)
    assert outside.read_bytes() == b"x = 1\n"
    assert not (copy / "tests" / "deep" / "test_hidden.py").is_symlink()
    assert (copy / "tests" / "deep" / "test_hidden.py").read_bytes() == HIDDEN
    assert not (copy / "tests" / "extra").is_symlink() and not (tmp_path / "sub").exists()
    assert _leaks(tmp_path, copy) == []


def test_a_file_where_a_folder_goes_is_refused_by_name(tmp_path: Path) -> None:
    state, hidden = _state(tmp_path)
    copy = _copy(tmp_path)
    (copy / "tests" / "deep").write_text("not a folder\n")
    with pytest.raises(GateRefusal) as refused:
        lay_hidden(str(copy), str(state), hidden)
    assert refused.value.code == Code.UNSAFE_WORKSPACE_ENTRY
    assert refused.value.path == str(copy / "tests" / "deep")
