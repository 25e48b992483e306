"""Scope is enforced, and the accepted tree is the verified tree (issue 14, classes 1 and 5).

The attacks run the real CLI on a real git workspace of the bundled wordfreq
task, with hostile worker scripts dispatched in the default bwrap sandbox.
A change outside the task's scope (`wordfreq/counter.py`) is refused
`scope_violation` naming the paths; a bytecode cache the worker leaves is
removed before the tree is signed and journaled (`purge`), so the accepted
workspace runs the verified source.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.errors import Code, GateRefusal
from harness.evidence.tree_entry import TreeEntry
from harness.gate.scope import in_scope, out_of_scope_changes
from tests.support.cli import CliResult, run_proctor
from tests.support.tasks import TaskSetup, git_repo

EXIT_OK, EXIT_FAILED, EXIT_REFUSED = 0, 1, 3
SCOPE = "wordfreq/counter.py"
CLI_TIMEOUT = 60.0

MakeTask = Callable[..., TaskSetup]


# --- which paths a scope names ---------------------------------------------------------


@pytest.mark.parametrize(
    ("scope", "path", "inside"),
    [
        (["pkg/mod.py"], b"pkg/mod.py", True),
        (["pkg/mod.py"], b"pkg/mod.pyx", False),
        (["pkg/mod.py"], b"pkg/other.py", False),
        (["pkg/mod.py"], b"pkg", False),
        (["pkg"], b"pkg/sub/mod.py", True),
        (["pkg/"], b"pkg/mod.py", True),
        (["pkg"], b"pkgx/mod.py", False),
        (["pkg/*.py"], b"pkg/mod.py", True),
        (["pkg/*.py"], b"pkg/sub/mod.py", True),  # `*` crosses `/`, as in seal patterns
        (["pkg/*.py"], b"pkg/data.txt", False),
        (["pkg/sub*"], b"pkg/subdir/x.txt", True),  # a glob naming a folder covers its contents
        (["tests/test_?.py"], b"tests/test_a.py", True),
        (["a.py", "b/"], b"b/c.py", True),
        (["./pkg//mod.py"], b"pkg/mod.py", True),
        (["."], b"anything/at/all", True),
    ],
)
def test_in_scope_reads_files_folders_and_globs(scope: list[str], path: bytes, inside: bool) -> None:
    assert in_scope(path, scope) is inside


def _file(path: bytes, digest: str = "a", executable: bool = False) -> TreeEntry:
    return TreeEntry(path, "file", executable, 1, digest, None)


def _dir(path: bytes) -> TreeEntry:
    return TreeEntry(path, "dir", False, 0, "", None)


def _link(path: bytes, target: bytes) -> TreeEntry:
    return TreeEntry(path, "link", False, 0, "t", target)


def test_out_of_scope_changes_names_added_changed_removed_mode_and_link() -> None:
    base = {
        b"pkg": _dir(b"pkg"),
        b"pkg/mod.py": _file(b"pkg/mod.py"),
        b"pkg/__init__.py": _file(b"pkg/__init__.py"),
        b"README": _file(b"README"),
        b"run.sh": _file(b"run.sh"),
        b"tests": _dir(b"tests"),
        b"tests/test_a.py": _file(b"tests/test_a.py"),
    }
    now = {
        **base,
        b"pkg/mod.py": _file(b"pkg/mod.py", "b"),  # in scope: allowed
        b"pkg/__init__.py": _file(b"pkg/__init__.py", "b"),  # changed
        b"run.sh": _file(b"run.sh", executable=True),  # mode only
        b"tests/test_aaa.py": _file(b"tests/test_aaa.py"),  # added
        b"tests/helper.py": _link(b"tests/helper.py", b"../pkg/mod.py"),  # a link
    }
    del now[b"README"]  # removed
    assert out_of_scope_changes(base, now, ["pkg/mod.py"]) == [
        "README", "pkg/__init__.py", "run.sh", "tests/helper.py", "tests/test_aaa.py",
    ]  # fmt: skip
    assert out_of_scope_changes(base, base, ["pkg/mod.py"]) == []


def test_new_folders_for_a_new_in_scope_file_are_allowed_but_not_empty_ones() -> None:
    base = {b"pkg": _dir(b"pkg")}
    made = {**base, b"pkg/new": _dir(b"pkg/new"), b"pkg/new/mod.py": _file(b"pkg/new/mod.py")}
    assert out_of_scope_changes(base, made, ["pkg/new/mod.py"]) == []
    assert out_of_scope_changes(base, made, ["pkg/new/*.py"]) == []
    held = {b"pkg": _dir(b"pkg"), b"pkg/sub": _dir(b"pkg/sub"), b"pkg/sub/a.py": _file(b"pkg/sub/a.py")}
    assert out_of_scope_changes(held, base, ["pkg/sub/*.py"]) == []  # emptied and removed with its files
    stray = {**base, b"ns": _dir(b"ns")}  # an empty folder is a namespace package to import
    assert out_of_scope_changes(base, stray, ["pkg/new/mod.py"]) == ["ns"]


# --- attacks through the CLI --------------------------------------------------------------


def worker(tmp_path: Path, body: str, name: str = "worker.py") -> list[str]:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return [sys.executable, str(path)]


def init(ts: TaskSetup) -> None:
    res = run_proctor("init", *ts.words(), timeout=CLI_TIMEOUT)
    assert res.code == EXIT_OK, res.out


def dispatched_ok(ts: TaskSetup, argv: list[str]) -> None:
    res = run_proctor("dispatch", *ts.words(), "--sandbox", "bwrap", "--command", "--", *argv, timeout=CLI_TIMEOUT)
    assert res.code == EXIT_OK and res.out["exit_code"] == 0, res.out


def verify(ts: TaskSetup) -> CliResult:
    return run_proctor("verify", *ts.words(), timeout=CLI_TIMEOUT)


def accept(ts: TaskSetup) -> CliResult:
    return run_proctor("accept", *ts.words(), timeout=CLI_TIMEOUT)


def journal_events(ts: TaskSetup) -> list[dict[str, Any]]:
    res = run_proctor("journal", "--workspace", str(ts.workspace), "--tail", "1000", timeout=CLI_TIMEOUT)
    assert res.code == EXIT_OK, res.out
    return res.out["events"]  # type: ignore[no-any-return]


def fix_text(ts: TaskSetup) -> str:
    return (ts.root / "task" / "fix" / SCOPE).read_text()


FORCE_PASS_PLUGIN = """\
import pytest

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        report.outcome = "passed"
"""


@pytest.mark.parametrize(
    "files",
    [
        {"tests/test_aaa.py": "import os\nos._exit(0)\n"},
        {"tests/__init__.py": "import os\nos._exit(0)\n"},
        {"tests/test_aaa.py": "pytest_plugins = ['forcepass']\n", "forcepass.py": FORCE_PASS_PLUGIN},
    ],
    ids=["test-module-exits-0", "tests-init-exits-0", "pytest_plugins-force-pass"],
)
def test_out_of_scope_file_that_forces_a_pass_is_refused(
    task_setup: MakeTask, tmp_path: Path, files: dict[str, str]
) -> None:
    """The bug stays; a new out-of-scope file would make the verifier pass (an accept on main)."""
    ts = task_setup()
    init(ts)
    dispatched_ok(ts, worker(tmp_path, "".join(f"open({p!r}, 'w').write({t!r})\n" for p, t in files.items())))
    res = verify(ts)
    assert res.code == EXIT_REFUSED, res.out
    assert res.out["refusal"] == "scope_violation"
    assert res.out["paths"] == sorted(files)
    assert all(p in res.out["message"] for p in files)
    assert res.out["scope"] == [SCOPE]
    refused = accept(ts)
    assert refused.code == EXIT_REFUSED and refused.out["refusal"] == "receipt_missing", refused.out


def test_fix_with_out_of_scope_removal_mode_and_link_is_refused(task_setup: MakeTask, tmp_path: Path) -> None:
    """An honest fix does not excuse changes elsewhere: removed, chmod-ed and linked entries are named."""
    ts = task_setup()
    (ts.workspace / "README.md").write_text("the project\n")
    git_repo(ts.workspace)
    init(ts)
    body = f"""\
    import os
    open({SCOPE!r}, "w").write({fix_text(ts)!r})
    os.chmod("wordfreq/__init__.py", 0o755)
    os.symlink("counter.py", "wordfreq/alias.py")
    os.mkdir("stray")
    os.remove("README.md")
    """
    dispatched_ok(ts, worker(tmp_path, body))
    res = verify(ts)
    assert res.code == EXIT_REFUSED and res.out["refusal"] == "scope_violation", res.out
    assert res.out["paths"] == ["README.md", "stray", "wordfreq/__init__.py", "wordfreq/alias.py"]


def test_in_scope_fix_is_still_accepted(task_setup: MakeTask, tmp_path: Path) -> None:
    ts = task_setup()
    init(ts)
    dispatched_ok(ts, worker(tmp_path, f"open({SCOPE!r}, 'w').write({fix_text(ts)!r})\n"))
    assert verify(ts).code == EXIT_OK
    res = accept(ts)
    assert res.code == EXIT_OK and res.out["accepted"] is True, res.out


def test_accept_refuses_a_receipt_for_an_out_of_scope_tree(
    task_setup: MakeTask, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """accept checks scope itself: a passing receipt for an out-of-scope tree (one an older proctor
    wrote, simulated by verifying without the check) is refused."""
    from harness.gate import verify as verify_module
    from harness.gate.accept import accept as accept_api
    from harness.gate.verify import verify as verify_api

    ts = task_setup()
    init(ts)
    dispatched_ok(ts, worker(tmp_path, "open('tests/test_aaa.py', 'w').write('import os\\nos._exit(0)\\n')\n"))
    monkeypatch.setattr(verify_module, "check_scope", lambda *a, **k: None)
    monkeypatch.setattr(verify_module, "pytest_position", lambda argv: None)  # nor the proctor's report (class 6)
    assert verify_api(str(ts.workspace), str(ts.task), sandbox="bwrap").passed  # the forced pass
    with pytest.raises(GateRefusal) as caught:
        accept_api(str(ts.workspace), str(ts.task))
    assert caught.value.code == Code.SCOPE_VIOLATION
    assert caught.value.details["paths"] == ["tests/test_aaa.py"]


# --- the accepted tree is the verified tree ------------------------------------------------


PAYLOAD = """\
import os
open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "PWNED"), "w").write("ran")

def words(text):
    return ["planted"]

def count_words(text):
    return {"planted": 1}

def top_words(text, n):
    return [("planted", 1)]
"""

PROBE = "import wordfreq.counter as c; print(sorted(c.count_words('The the, cat.').items()))"


def test_planted_unchecked_hash_pyc_does_not_outlive_accept(task_setup: MakeTask, tmp_path: Path) -> None:
    """An honest fix plus an unchecked-hash `.pyc` of other code: on main the accepted workspace
    ran the `.pyc`. Now verify removes it (journaled) and the workspace behaves as the verified tree."""
    ts = task_setup()
    init(ts)
    cached = importlib.util.cache_from_source(SCOPE)
    body = f"""\
    import os, py_compile
    open({SCOPE!r}, "w").write({fix_text(ts)!r})
    open("/tmp/payload.py", "w").write({PAYLOAD!r})
    os.makedirs(os.path.dirname({cached!r}), exist_ok=True)
    py_compile.compile("/tmp/payload.py", cfile={cached!r}, dfile={SCOPE!r},
                       invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH, doraise=True)
    """
    dispatched_ok(ts, worker(tmp_path, body))
    assert (ts.workspace / cached).is_file()
    res = verify(ts)
    assert res.code == EXIT_OK and res.out["passed"] is True, res.out
    assert not (ts.workspace / cached).exists()
    purges = [e for e in journal_events(ts) if e["event"] == "purge"]
    assert purges and purges[0]["action"] == "verify" and "wordfreq/__pycache__" in purges[0]["paths"]
    assert accept(ts).code == EXIT_OK

    # the verified tree: the signed files alone, in a fresh folder
    verified = tmp_path / "verified"
    shutil.copytree(ts.workspace, verified, ignore=shutil.ignore_patterns(".git", "__pycache__", "*.pyc"))
    expect = subprocess.run([sys.executable, "-c", PROBE], cwd=verified, capture_output=True, text=True, check=True)
    got = subprocess.run([sys.executable, "-c", PROBE], cwd=ts.workspace, capture_output=True, text=True, check=True)
    assert got.stdout == expect.stdout and "planted" not in got.stdout
    assert not (ts.workspace / "PWNED").exists()


def test_a_cache_planted_after_verify_is_removed_by_accept(task_setup: MakeTask, tmp_path: Path) -> None:
    ts = task_setup()
    init(ts)
    dispatched_ok(ts, worker(tmp_path, f"open({SCOPE!r}, 'w').write({fix_text(ts)!r})\n"))
    assert verify(ts).code == EXIT_OK
    cached = ts.workspace / importlib.util.cache_from_source(SCOPE)
    cached.parent.mkdir(exist_ok=True)
    cached.write_bytes(b"planted")
    (ts.workspace / "stray.pyc").write_bytes(b"planted")
    assert accept(ts).code == EXIT_OK
    assert not cached.exists() and not (ts.workspace / "stray.pyc").exists()
    purges = [e for e in journal_events(ts) if e["event"] == "purge" and e["action"] == "accept"]
    assert purges and purges[0]["paths"] == ["stray.pyc", "wordfreq/__pycache__"]
