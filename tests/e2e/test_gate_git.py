"""The workspace's git is data, never code (issue 14, class 2), through the real CLI.

A worker that writes `.git` (fsmonitor, hooks, a promisor remote with an
`uploadpack` command and a missing HEAD object, pager, external diff, filter
drivers, aliases, an ssh command: tests/support/hostile_git.py)
must get nothing run: under bwrap `.git` is read-only; under `--sandbox none`
the dispatch is refused `git_dir_changed`, accept refuses, and proctor's own
git (every command, the evidence packet at a lane switch) runs none of it.
"""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.evidence.git import git_dir_snapshot, snapshot_changes
from tests.support.cli import CliResult, run_proctor
from tests.support.hostile_git import KEYS
from tests.support.paths import REPO
from tests.support.tasks import TaskSetup

SCOPE = "wordfreq/counter.py"
PLANTED = KEYS  # every attack at once; ssh_command last, so a lazy fetch would go through its ssh command

# Leaves the task unfixed (the same failure each time) and, in mode "plant", writes the attacks into
# the workspace's .git with the test suite's own planting code; in mode "try", tries to write .git
# by hand and prints what happened.
WORKER = """
import json, os, sys
from pathlib import Path
sys.path.insert(0, {repo!r})
mode, markers = sys.argv[1], Path(sys.argv[2])
with open({scope!r}, "a", encoding="utf-8") as fh:
    fh.write("# still stuck\\n")
if mode == "plant":
    from tests.support.hostile_git import plant
    for key in {planted!r}:
        plant(Path("."), key, markers, path={scope!r})
elif mode == "try":
    tried = {{}}
    def attempt(name, action):
        try:
            action()
            tried[name] = "done"
        except OSError as exc:
            tried[name] = exc.strerror
    attempt("config", lambda: open(".git/config", "a").write("[core]\\n\\tfsmonitor = /bin/sh\\n"))
    attempt("hook", lambda: open(".git/hooks/post-checkout", "w").write("#!/bin/sh\\n"))
    attempt("attributes", lambda: os.makedirs(".git/info", exist_ok=True) or open(".git/info/attributes", "w").write("* filter=x\\n"))
    attempt("rename", lambda: os.rename(".git", "git-moved"))
    attempt("remove_object", lambda: os.unlink(sorted(Path(".git/objects").glob("??/*"))[0]))
    print("TRIED " + json.dumps(tried))
"""


def _setup(task_setup: Callable[..., TaskSetup]) -> tuple[TaskSetup, list[str], Path]:
    ts = task_setup("wordfreq")
    ts.edit_task(lambda doc: doc["budget"].update(max_dispatches=6, max_stagnant=1))
    script = ts.root / "git_worker.py"
    script.write_text(textwrap.dedent(WORKER.format(repo=str(REPO), scope=SCOPE, planted=PLANTED)))
    markers = ts.root / "markers"
    markers.mkdir()
    assert run_proctor("init", *ts.words()).code == 0
    return ts, [sys.executable, str(script)], markers


def _dispatch(ts: TaskSetup, worker: list[str], mode: str, markers: Path, sandbox: str) -> CliResult:
    return run_proctor("dispatch", *ts.words(), "--sandbox", sandbox, "--command", "--", *worker, mode, str(markers))


def _events(ts: TaskSetup) -> list[dict[str, Any]]:
    r = run_proctor("journal", "--workspace", str(ts.workspace), "--tail", "1000")
    assert r.code == 0, r.out
    return list(r.out["events"])


def test_a_worker_planting_git_config_without_a_sandbox_is_refused_and_nothing_it_planted_runs(
    task_setup: Callable[..., TaskSetup],
) -> None:
    ts, worker, markers = _setup(task_setup)
    planted = _dispatch(ts, worker, "plant", markers, "none")
    assert planted.code == 3 and planted.out["refusal"] == "git_dir_changed", planted.out
    assert str(ts.workspace / ".git" / "config") in planted.out["paths"]
    assert planted.out["path"].startswith(str(ts.workspace / ".git"))
    config = (ts.workspace / ".git" / "config").read_text()
    assert "fsmonitor" in config and "uploadpack" in config and "partialclone" in config.lower()  # planted ...
    events = _events(ts)
    assert [e["event"] for e in events[-2:]] == ["dispatch_end", "refused"]  # journaled, with its end
    assert events[-1]["refusal"] == "git_dir_changed" and events[-1]["action"] == "dispatch"

    # Two more identical failures, then the lane switch: its evidence packet reads HEAD's
    # contents of the changed file, whose object the worker deleted behind a promisor remote.
    for _ in range(3):
        verified = run_proctor("verify", *ts.words())
        assert verified.code == 1, verified.out
        if len([e for e in _events(ts) if e["event"] == "verify"]) < 3:
            again = _dispatch(ts, worker, "stuck", markers, "none")
            assert again.code == 0, again.out
    switched = _dispatch(ts, worker, "stuck", markers, "none")
    assert switched.code == 0, switched.out
    assert switched.out["lane_switch"] is not None, switched.out
    packet = json.loads(Path(switched.out["lane_switch"]["evidence_file"]).read_text())
    assert packet["diff"]["changed"] == [SCOPE]
    assert f"# {SCOPE}: changed (its baseline content is not in git HEAD)" in packet["diff"]["unified"]
    assert run_proctor("status", "--workspace", str(ts.workspace)).code == 0

    refused = run_proctor("accept", *ts.words())
    assert refused.code == 3 and refused.out["refusal"] == "git_dir_changed", refused.out
    assert sorted(p.name for p in markers.iterdir()) == []  # ... and none of them ever ran


def test_a_sandboxed_worker_cannot_change_git(task_setup: Callable[..., TaskSetup]) -> None:
    ts, worker, markers = _setup(task_setup)
    copy = ts.root / "git-before"
    shutil.copytree(ts.workspace / ".git", copy, symlinks=True)
    before = git_dir_snapshot(str(ts.workspace))
    tried = _dispatch(ts, worker, "try", markers, "bwrap")
    assert tried.code == 0, tried.out
    line = next(x for x in Path(tried.out["output_file"]).read_text().splitlines() if x.startswith("TRIED "))
    outcomes = json.loads(line[6:])
    assert set(outcomes) == {"config", "hook", "attributes", "rename", "remove_object"}
    assert "done" not in outcomes.values(), outcomes
    assert snapshot_changes(before, git_dir_snapshot(str(ts.workspace))) == []
    for path in sorted(copy.rglob("*")):
        twin = ts.workspace / ".git" / path.relative_to(copy)
        assert path.is_dir() == twin.is_dir() and (path.is_dir() or path.read_bytes() == twin.read_bytes())
    assert not (ts.workspace / "git-moved").exists()
    options, ws = tried.out["sandbox"]["options"], str(ts.workspace.resolve())
    at = options.index(ws) - 1
    assert options[at : at + 6] == ["--bind", ws, ws, "--ro-bind", f"{ws}/.git", f"{ws}/.git"]  # over the workspace
    assert list(markers.iterdir()) == []
