"""Benchmark: `tree_signature` against `git add -A && git write-tree` on 10,000 files.

Run: .venv/bin/pytest -q -p no:xdist -o python_files='bench_*.py' tests/bench/bench_tree.py -s
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness.evidence.tree import tree_signature
from tests.support.bench import Row, bench_command, record

REPO = Path(__file__).resolve().parents[2]
FILES = 10_000
LINKS = 25
ROUNDS = 5


def _make_workspace(root: Path, seed: int = 20240601) -> None:
    """10,000 files in nested folders, 100 B to 20 KB each (log-uniform), plus a few links."""
    rng = random.Random(seed)
    paths: list[Path] = []
    for i in range(FILES):
        top, mid, leaf = i % 40, (i // 40) % 8, (i // 320) % 3
        folder = root / f"pkg{top:02d}" / f"mod{mid}" / f"part{leaf}"
        folder.mkdir(parents=True, exist_ok=True)
        size = round(100 * (200 ** rng.random()))  # 100 B .. 20 KB
        path = folder / f"file{i:05d}.py"
        path.write_bytes(rng.randbytes(size))
        if i % 97 == 0:
            path.chmod(0o755)
        paths.append(path)
    for j in range(LINKS):
        target = paths[rng.randrange(FILES)]
        os.symlink(os.path.relpath(target, root), root / f"link{j:02d}")


@pytest.fixture(scope="module")
def workspace() -> Iterator[Path]:
    # On the repo's filesystem, so both tools see the same disk the harness works on.
    base = Path(tempfile.mkdtemp(prefix=".bench-tree-", dir=REPO))
    try:
        root = base / "ws"
        root.mkdir()
        _make_workspace(root)
        subprocess.run(["git", "init", "-q", str(root)], check=True)
        yield root
    finally:
        shutil.rmtree(base)


def _best(rounds: int, fn: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _git_write_tree(root: Path, scratch: Path) -> str:
    """`git add -A && git write-tree` with a fresh temporary index; returns the tree id."""
    index = scratch / f"index-{time.monotonic_ns()}"
    env = {**os.environ, "GIT_INDEX_FILE": str(index)}
    try:
        subprocess.run(["git", "add", "-A"], cwd=root, env=env, check=True)
        out = subprocess.run(
            ["git", "write-tree"], cwd=root, env=env, check=True, capture_output=True, text=True
        )
        return out.stdout.strip()
    finally:
        index.unlink(missing_ok=True)


def test_tree_signature_vs_git_write_tree(workspace: Path, tmp_path: Path) -> None:
    signature = tree_signature(workspace)  # warm the page cache
    assert signature.files == FILES
    assert signature.entries == FILES + LINKS + 40 + 40 * 8 + 40 * 8 * 3

    start = time.perf_counter()
    _git_write_tree(workspace, tmp_path)  # first round also writes every blob object
    git_first = time.perf_counter() - start

    ours = _best(ROUNDS, lambda: tree_signature(workspace))
    git = _best(ROUNDS, lambda: _git_write_tree(workspace, tmp_path))
    print(
        f"\n{FILES} files, {signature.bytes / 1e6:.1f} MB, {signature.entries} entries\n"
        f"tree_signature:                best of {ROUNDS}: {ours * 1000:8.1f} ms\n"
        f"git add -A && git write-tree:  best of {ROUNDS}: {git * 1000:8.1f} ms"
        f"  (fresh index each round; objects already stored)\n"
        f"git first round (also writes objects):        {git_first * 1000:8.1f} ms\n"
        f"ratio git / tree_signature: {git / ours:.2f}x"
    )
    record("tree", [Row(f"tree signature, {FILES:,} files ({signature.bytes / 1e6:.1f} MB), best of {ROUNDS}",
                        f"`tree_signature` {ours * 1000:.0f} ms", "`git add -A && git write-tree`, fresh index",
                        f"{git * 1000:.0f} ms", f"proctor {git / ours:.2f}x faster",
                        bench_command("tests/bench/bench_tree.py"))])
    assert ours < 1.0, f"tree_signature took {ours:.3f}s on {FILES} files"
