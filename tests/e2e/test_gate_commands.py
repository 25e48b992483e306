"""The gated path through the real CLI: init, dispatch, verify, accept, status, journal.

Every test builds a real git workspace from a bundled task (`task_setup`) and
drives `python -m harness ... --json` in subprocesses (`run_proctor`). Workers
are small scripts written to `tmp_path`; long-running ones wait for a `stop`
file so a test can end them, and are killed by pid in `finally`. They run in
the default bwrap sandbox, where their out folder (named in their argv) is
read-only and their pids are their namespace's; the tests that follow a
worker by its host pid (timeouts, orphans) run with `--sandbox none`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.evidence.tree import tree_signature
from tests.support.cli import run_proctor
from tests.support.paths import REPO, TASKS
from tests.support.tasks import TaskSetup, git_repo

TASK_NAMES = sorted(p.parent.name for p in TASKS.glob("*/task.json"))
PROD_PROMPT = "Also make sure `python -m src.run_all` still starts."

WORKER_SCRIPT = r"""
import json, os, subprocess, sys, time

mode, out = sys.argv[1], sys.argv[2]


def put(name, text):
    tmp = os.path.join(out, name + ".tmp")
    try:
        with open(tmp, "w") as fh:
            fh.write(text)
        os.replace(tmp, os.path.join(out, name))
    except OSError:  # read-only in a sandbox
        pass


if mode == "env":
    print("ENV " + json.dumps({"env": dict(os.environ), "cwd": os.getcwd()}))
    sys.exit(0)
if mode == "beat":
    beat = os.environ["PROCTOR_HEARTBEAT"]
    with open(beat + ".tmp", "w") as fh:
        json.dump({"stage": "editing", "files_done": 1, "files_total": 2, "flag": True, "nested": {}}, fh)
    os.replace(beat + ".tmp", beat)
if mode == "group":
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    put("child", str(child.pid))
put("pid", str(os.getpid()))
deadline = time.time() + 90
while time.time() < deadline and not os.path.exists(os.path.join(out, "stop")):
    time.sleep(0.05)
"""


# --- helpers --------------------------------------------------------------------------------------


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROCTOR_")}
    env.update(extra)
    return env


def snapshot(ws: Path) -> tuple[str, str]:
    """The workspace as verification must leave it: tree signature and `git status --porcelain`."""
    porcelain = subprocess.run(
        ["git", "-C", str(ws), "status", "--porcelain", "--untracked-files=all", "--ignored"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return tree_signature(ws).digest, porcelain


def sha256_file(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def hidden_destinations(setup: TaskSetup) -> list[str]:
    return [h["to"] for h in json.loads(setup.task.read_text())["verifier"]["hidden"]]


def assert_no_hidden(setup: TaskSetup) -> None:
    for rel in hidden_destinations(setup):
        assert not os.path.lexists(setup.workspace / rel), (
            f"hidden input {rel} leaked into the workspace"
        )


def init(setup: TaskSetup, *extra: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    r = run_proctor("init", *setup.words(), *extra, env=env)
    assert r.code == 0, r.out
    return r.out


def status(setup: TaskSetup) -> dict[str, Any]:
    r = run_proctor("status", "--workspace", str(setup.workspace))
    assert r.code == 0, r.out
    return r.out


def events(setup: TaskSetup, tail: int = 1000) -> list[dict[str, Any]]:
    r = run_proctor("journal", "--workspace", str(setup.workspace), "--tail", str(tail))
    assert r.code == 0, r.out
    return list(r.out["events"])


class Worker:
    """The scripted test worker: argv for a mode, and its out folder (pid, child, env, stop)."""

    def __init__(self, root: Path) -> None:
        root.mkdir(exist_ok=True)
        self.script = root / "test_worker.py"
        self.script.write_text(WORKER_SCRIPT)
        self.out = root / "worker-out"
        self.out.mkdir()

    def argv(self, mode: str) -> list[str]:
        return [sys.executable, str(self.script), mode, str(self.out)]

    def pid(self, name: str = "pid") -> int | None:
        path = self.out / name
        return int(path.read_text()) if path.exists() else None

    def stop(self) -> None:
        (self.out / "stop").write_text("")

    def kill(self) -> None:
        self.stop()
        for name in ("pid", "child"):
            pid = self.pid(name)
            if pid is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[Worker]:
    w = Worker(tmp_path)
    try:
        yield w
    finally:
        w.kill()


def start_dispatch(setup: TaskSetup, argv: list[str], sandbox: str = "bwrap") -> subprocess.Popen[str]:
    """`proctor dispatch` in the background (its own process, so it can be killed)."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness",
            "dispatch",
            *setup.words(),
            "--sandbox",
            sandbox,
            "--json",
            "--command",
            "--",
            *argv,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
        cwd=REPO,
    )


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.1)


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie (a zombie is dead, merely unreaped)."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return data[data.rfind(b")") + 2 :].split()[0] != b"Z"


@contextlib.contextmanager
def background(proc: subprocess.Popen[str]) -> Iterator[subprocess.Popen[str]]:
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)


# --- the happy path on every bundled task ---------------------------------------------------------


@pytest.mark.parametrize("name", TASK_NAMES)
def test_happy_path(task_setup: Callable[..., TaskSetup], name: str) -> None:
    setup = task_setup(name)
    ws = setup.workspace
    words = setup.words()
    task_doc = json.loads(setup.task.read_text())
    t0 = time.time()

    lane = run_proctor("lane", "--task", str(setup.task))
    assert lane.code == 0 and lane.out["lane"] in ("flash", "glm", "k3")

    pinned = init(setup)
    state = Path(pinned["state_dir"])
    assert pinned["task_id"] == task_doc["task_id"]
    assert pinned["workspace"] == os.path.realpath(ws)
    assert pinned["sealed"] == task_doc["verifier"]["seal"]
    assert pinned["hidden"] == hidden_destinations(setup)
    assert pinned["lane"] == {k: v for k, v in lane.out.items() if k not in ("ok", "task_id")}
    resolved = [sys.executable if a == "{python}" else a for a in task_doc["verifier"]["argv"]]
    assert pinned["verifier_argv"] == resolved
    baseline = pinned["baseline_tree"]["digest"]
    assert baseline == tree_signature(ws).digest
    # The hidden input is kept in the state folder, never in the workspace.
    hidden_src = setup.task.parent / task_doc["verifier"]["hidden"][0]["from"]
    assert (state / "hidden" / "0").read_bytes() == hidden_src.read_bytes()
    assert_no_hidden(setup)

    # Before any work, the sealed verifier fails, on a copy with the hidden tests laid in.
    before = snapshot(ws)
    failing = run_proctor("verify", *words)
    assert failing.code == 1, failing.out
    assert failing.out["ok"] is False and failing.out["passed"] is False
    assert failing.out["exit_code"] not in (0, None)
    assert failing.out["dispatch_seq"] == 0
    assert failing.out["tree"] == baseline
    assert failing.out["verifier_nondiscriminating"] is False
    assert "test_hidden.py" in Path(failing.out["output_path"]).read_text()
    assert snapshot(ws) == before
    assert_no_hidden(setup)

    dispatched = run_proctor("dispatch", *words, "--command", "--", *setup.worker())
    assert dispatched.code == 0, dispatched.out
    d = dispatched.out
    assert (
        d["ok"] is True and d["exit_code"] == 0 and d["timed_out"] is False and d["signal"] is None
    )
    assert d["seq"] == 1 and d["dispatch_id"].startswith("d001-")
    assert d["detached_pids"] == []
    assert d["lane"] == lane.out["lane"]
    assert d["tree_after"]["digest"] == tree_signature(ws).digest != baseline
    assert Path(d["output_file"]).is_file()
    assert not Path(d["output_file"]).is_relative_to(ws)
    assert_no_hidden(setup)

    middle = snapshot(ws)
    t1 = time.time()
    passing = run_proctor("verify", *words)
    t2 = time.time()
    assert passing.code == 0, passing.out
    v = passing.out
    assert snapshot(ws) == middle
    assert_no_hidden(setup)

    assert v["ok"] is True and v["passed"] is True
    assert v["schema"] == "proctor-receipt.v1"
    assert v["task_id"] == task_doc["task_id"]
    assert v["tree"] == d["tree_after"]["digest"]
    assert v["baseline_tree"] == baseline
    assert v["dispatch_seq"] == 1
    assert v["verifier_argv"] == resolved
    assert v["exit_code"] == 0 and v["signal"] is None and v["timed_out"] is False
    assert v["output_sha256"] == sha256_file(v["output_path"])
    assert v["output_bytes"] == Path(v["output_path"]).stat().st_size
    assert v["tamper_detected"] is False and v["tampered_paths"] == []
    assert v["verifier_nondiscriminating"] is False
    assert v["detached_pids"] == []
    assert t1 - 1 <= v["started"] <= v["ended"] <= t2 + 1
    assert v["duration_s"] == pytest.approx(v["ended"] - v["started"], abs=1e-5)
    assert v["receipt_id"] != failing.out["receipt_id"]
    # The receipt on disk is the one the journal names, and the output is outside the workspace.
    receipt_path = Path(v["receipt_path"])
    assert receipt_path.is_relative_to(state) and not receipt_path.is_relative_to(ws)
    assert sha256_file(receipt_path) == v["receipt_sha256"]
    on_disk = json.loads(receipt_path.read_text())
    assert on_disk == {k: v[k] for k in on_disk}

    accepted = run_proctor("accept", *words)
    assert accepted.code == 0, accepted.out
    a = accepted.out
    assert a["accepted"] is True and a["receipt_id"] == v["receipt_id"]
    assert a["tree"] == v["tree"] and a["dispatches"] == 1 and a["overrides"] == []
    assert snapshot(ws) == middle
    assert_no_hidden(setup)

    report = status(setup)
    assert report["accepted"] is True
    assert (
        report["dispatches"] == 1
        and report["max_dispatches"] == task_doc["budget"]["max_dispatches"]
    )
    assert report["running_dispatch_ids"] == [] and report["orphaned_dispatch_ids"] == []
    assert [e["event"] for e in events(setup)] == [
        "init",
        "verify",
        "dispatch_start",
        "dispatch_end",
        "verify",
        "accept",
    ]
    assert t0 <= events(setup)[0]["t"]


# --- init -----------------------------------------------------------------------------------------


def test_init_state_folder_default_location_and_mode(task_setup: Callable[..., TaskSetup]) -> None:
    setup = task_setup("wordfreq")
    out = init(setup)
    ws = os.path.realpath(setup.workspace)
    digest = hashlib.sha256(os.fsencode(ws)).hexdigest()[:16]
    expected = os.path.join(os.path.dirname(ws), ".runner-state", f"ws-{digest}")
    assert out["state_dir"] == expected
    state = Path(expected)
    assert not state.is_relative_to(ws)
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    for sub in ("sealed", "hidden", "receipts", "dispatches"):
        assert stat.S_IMODE((state / sub).stat().st_mode) == 0o700
    assert (state / "pin.json").is_file() and (state / "journal.jsonl").is_file()
    assert (state / "sealed" / "tests" / "test_visible.py").read_bytes() == (
        setup.workspace / "tests" / "test_visible.py"
    ).read_bytes()
    # Nothing of proctor's lands in the workspace.
    assert (
        subprocess.run(
            ["git", "-C", str(setup.workspace), "status", "--porcelain", "--ignored"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        == ""
    )


def test_init_honours_state_dir_option(task_setup: Callable[..., TaskSetup]) -> None:
    setup = task_setup("wordfreq")
    root = setup.root / "elsewhere"
    out = init(setup, "--state-dir", str(root))
    state = Path(out["state_dir"])
    assert state.parent == root
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    assert not (setup.root / ".runner-state").exists()
    # Other commands find the state only through the same option.
    r = run_proctor("status", "--workspace", str(setup.workspace))
    assert r.code == 3 and r.out["refusal"] == "not_initialized"
    r = run_proctor("status", "--workspace", str(setup.workspace), "--state-dir", str(root))
    assert r.code == 0 and r.out["state_dir"] == str(state)


def test_init_honours_state_dir_environment(task_setup: Callable[..., TaskSetup]) -> None:
    setup = task_setup("wordfreq")
    root = setup.root / "from-env"
    env = {"PROCTOR_STATE_DIR": str(root)}
    out = init(setup, env=env)
    state = Path(out["state_dir"])
    assert state.parent == root
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    assert not (setup.root / ".runner-state").exists()
    r = run_proctor("status", "--workspace", str(setup.workspace), env=env)
    assert r.code == 0 and r.out["state_dir"] == str(state)
    # --state-dir wins over the environment.
    other = setup.root / "option"
    r = run_proctor(
        "status", "--workspace", str(setup.workspace), "--state-dir", str(other), env=env
    )
    assert r.code == 3 and r.out["refusal"] == "not_initialized"


def test_init_refuses_a_state_dir_inside_the_workspace(
    task_setup: Callable[..., TaskSetup],
) -> None:
    setup = task_setup("wordfreq")
    r = run_proctor("init", *setup.words(), "--state-dir", str(setup.workspace / "state"))
    assert r.code == 3 and r.out["refusal"] == "state_dir_inside_workspace" and r.out["path"]
    assert not (setup.workspace / "state").exists()


def test_init_refuses_a_subfolder_of_a_repository(task_setup: Callable[..., TaskSetup]) -> None:
    setup = task_setup("wordfreq")
    sub = setup.workspace / "tests"
    r = run_proctor("init", "--workspace", str(sub), "--task", str(setup.task))
    assert r.code == 3 and r.out["refusal"] == "workspace_is_not_repo_root"
    assert r.out["path"] == os.path.realpath(sub)


def test_init_refuses_a_plain_folder(task_setup: Callable[..., TaskSetup]) -> None:
    setup = task_setup("wordfreq")
    plain = setup.root / "plain"
    plain.mkdir()
    (plain / "a.py").write_text("x = 1\n")
    env = {"GIT_CEILING_DIRECTORIES": str(setup.root)}  # never find a repository above tmp_path
    r = run_proctor("init", "--workspace", str(plain), "--task", str(setup.task), env=env)
    assert r.code == 3 and r.out["refusal"] == "workspace_is_not_repo_root"
    assert r.out["path"] == os.path.realpath(plain)


def test_init_refuses_a_missing_workspace(task_setup: Callable[..., TaskSetup]) -> None:
    setup = task_setup("wordfreq")
    r = run_proctor("init", "--workspace", str(setup.root / "nope"), "--task", str(setup.task))
    assert r.code == 3 and r.out["refusal"] == "workspace_missing" and r.out["path"]


def test_init_twice_is_refused(task_setup: Callable[..., TaskSetup]) -> None:
    setup = task_setup("wordfreq")
    first = init(setup)
    r = run_proctor("init", *setup.words())
    assert r.code == 3 and r.out["refusal"] == "already_initialized"
    assert r.out["path"] == first["state_dir"]
    assert [e["event"] for e in events(setup)] == ["init"]


@pytest.mark.parametrize(
    "seal", [["tests/nope.py"], ["tests/test_visible.py", "tests/*_missing.py"], ["nodir"]]
)
def test_init_refuses_a_seal_that_matches_nothing(
    task_setup: Callable[..., TaskSetup], seal: list[str]
) -> None:
    setup = task_setup("wordfreq")
    setup.edit_task(lambda d: d["verifier"].update(seal=seal))
    r = run_proctor("init", *setup.words())
    assert r.code == 3 and r.out["refusal"] == "seal_target_missing"
    assert r.out["path"] == os.path.realpath(setup.workspace)
    assert seal[-1] in r.out["message"]
    # A refused init leaves the workspace uninitialized, and a corrected task can init.
    r = run_proctor("status", "--workspace", str(setup.workspace))
    assert r.code == 3 and r.out["refusal"] == "not_initialized"
    setup.edit_task(lambda d: d["verifier"].update(seal=["tests/test_visible.py"]))
    init(setup)


def test_init_refuses_a_missing_hidden_input(task_setup: Callable[..., TaskSetup]) -> None:
    setup = task_setup("wordfreq")
    setup.edit_task(lambda d: d["verifier"]["hidden"][0].update({"from": "hidden/absent.py"}))
    r = run_proctor("init", *setup.words())
    assert r.code == 3 and r.out["refusal"] == "hidden_input_missing"
    assert r.out["path"] == os.path.realpath(setup.task.parent / "hidden" / "absent.py")


@pytest.mark.parametrize("source", ["../ws/tests/test_visible.py", "ABS", "../ws"])
def test_init_refuses_a_hidden_input_inside_the_workspace(
    task_setup: Callable[..., TaskSetup], source: str
) -> None:
    setup = task_setup("wordfreq")
    if source == "ABS":
        source = str(setup.workspace / "wordfreq" / "counter.py")
    setup.edit_task(lambda d: d["verifier"]["hidden"][0].update({"from": source}))
    r = run_proctor("init", *setup.words())
    assert r.code == 3 and r.out["refusal"] == "hidden_input_inside_workspace"
    assert r.out["path"].startswith(os.path.realpath(setup.workspace))


def test_init_refuses_a_hidden_link_into_the_workspace(
    task_setup: Callable[..., TaskSetup],
) -> None:
    setup = task_setup("wordfreq")
    link = setup.task.parent / "hidden" / "sneaky.py"
    link.symlink_to(setup.workspace / "tests" / "test_visible.py")
    setup.edit_task(lambda d: d["verifier"]["hidden"][0].update({"from": "hidden/sneaky.py"}))
    r = run_proctor("init", *setup.words())
    assert r.code == 3 and r.out["refusal"] == "hidden_input_inside_workspace"


@pytest.mark.parametrize(
    "command",
    ["dispatch", "verify", "accept", "status", "journal", "ack"],
)
def test_commands_before_init_are_refused(
    task_setup: Callable[..., TaskSetup], command: str
) -> None:
    setup = task_setup("wordfreq")
    ws = ["--workspace", str(setup.workspace)]
    words = {
        "dispatch": ["dispatch", *setup.words(), "--command", "--", sys.executable, "-c", "pass"],
        "verify": ["verify", *setup.words()],
        "accept": ["accept", *setup.words()],
        "status": ["status", *ws],
        "journal": ["journal", *ws],
        "ack": ["journal", *ws, "--ack", "d001-00000000"],
    }[command]
    r = run_proctor(*words)
    assert r.code == 3 and r.out["refusal"] == "not_initialized"
    assert r.out["path"].endswith("pin.json")
    assert not (setup.root / ".runner-state").exists() or not list(
        (setup.root / ".runner-state").rglob("pin.json")
    )


# --- dispatch ----------------------------------------------------------------------------------------


def test_dispatch_budget_is_enforced(task_setup: Callable[..., TaskSetup]) -> None:
    setup = task_setup("wordfreq")
    setup.edit_task(lambda d: d["budget"].update(max_dispatches=2))
    init(setup)
    noop = ["--command", "--", sys.executable, "-c", "pass"]
    for seq in (1, 2):
        r = run_proctor("dispatch", *setup.words(), *noop)
        assert r.code == 0 and r.out["seq"] == seq
    r = run_proctor("dispatch", *setup.words(), *noop)
    assert r.code == 3 and r.out["refusal"] == "dispatch_budget_exhausted"
    assert r.out["path"] == str(setup.task)
    assert "2 of 2" in r.out["message"]
    log = events(setup)
    assert [e["event"] for e in log].count("dispatch_start") == 2
    assert log[-1]["event"] == "refused" and log[-1]["refusal"] == "dispatch_budget_exhausted"


@pytest.mark.parametrize("sandbox", ["bwrap", "none"])
def test_dispatch_worker_environment(task_setup: Callable[..., TaskSetup], worker: Worker, sandbox: str) -> None:
    setup = task_setup("intervals")
    root = setup.root / "state-root"
    env = {"PROCTOR_STATE_DIR": str(root), "PROCTOR_SECRET_TOKEN": "must-not-leak", "CALLER_SETTING": "x"}
    pinned = init(setup, env=env)
    r = run_proctor("dispatch", *setup.words(), "--sandbox", sandbox, "--command", "--", *worker.argv("env"), env=env)
    assert r.code == 0, r.out
    output = Path(r.out["output_file"]).read_text()
    dumped = json.loads(next(line for line in output.splitlines() if line.startswith("ENV "))[4:])
    seen = dumped["env"]
    assert dumped["cwd"] == os.path.realpath(setup.workspace)
    assert seen["PROCTOR_CHILD"] == "1"
    assert seen["PROCTOR_TASK_ID"] == "intervals-touching-merge"
    assert seen["PROCTOR_DISPATCH_ID"] == r.out["dispatch_id"]
    ws = os.path.realpath(setup.workspace)
    folder = Path(r.out["output_file"]).parent
    assert folder.parent.parent == Path(pinned["state_dir"])
    assert (folder / "prompt.md").read_text() == json.loads(setup.task.read_text())["prompt"]
    prompt_file, heartbeat = seen["PROCTOR_PROMPT_FILE"], seen["PROCTOR_HEARTBEAT"]
    if sandbox == "bwrap":  # the worker's view: its files under /run/proctor, only what it is given
        assert (prompt_file, heartbeat) == ("/run/proctor/prompt.md", "/run/proctor/heartbeat/heartbeat.json")
        assert seen["HOME"] == "/tmp" and "CALLER_SETTING" not in seen
        assert r.out["sandbox"]["kind"] == "bwrap" and "CALLER_SETTING" not in r.out["sandbox"]["env"]
    else:
        assert prompt_file == str(folder / "prompt.md") and heartbeat == str(folder / "heartbeat" / "heartbeat.json")
        assert seen["CALLER_SETTING"] == "x"
        assert r.out["sandbox"] == {**r.out["sandbox"], "kind": "none", "guarantee": "weaker", "options": []}
    assert not os.path.realpath(prompt_file).startswith(ws + os.sep)
    assert not os.path.realpath(heartbeat).startswith(ws + os.sep)
    # The caller's own PROCTOR_* settings do not leak into the worker.
    assert "PROCTOR_SECRET_TOKEN" not in seen
    assert "PROCTOR_STATE_DIR" not in seen


def test_nested_proctor_call_from_a_worker_is_refused(task_setup: Callable[..., TaskSetup]) -> None:
    setup = task_setup("wordfreq")
    init(setup)
    r = run_proctor("verify", *setup.words(), env={"PROCTOR_CHILD": "1"})
    assert r.code == 3 and r.out["refusal"] == "nested_call_refused"


def test_dispatch_worker_not_found(task_setup: Callable[..., TaskSetup]) -> None:
    setup = task_setup("wordfreq")
    init(setup)
    missing = str(setup.root / "no-such-agent")
    r = run_proctor("dispatch", *setup.words(), "--command", "--", missing, "--flag")
    assert r.code == 3 and r.out["refusal"] == "worker_spawn_failed"
    assert r.out["path"] == missing
    # The dispatch is closed in the journal: not running, not orphaned.
    report = status(setup)
    assert report["running_dispatch_ids"] == [] and report["orphaned_dispatch_ids"] == []
    kinds = [e["event"] for e in events(setup)]
    assert kinds[-3:] == ["dispatch_start", "dispatch_end", "refused"]


def test_dispatch_without_a_worker_argv(task_setup: Callable[..., TaskSetup]) -> None:
    setup = task_setup("wordfreq")
    init(setup)
    r = run_proctor("dispatch", *setup.words(), "--command", "--")
    assert r.code == 3 and r.out["refusal"] == "worker_command_missing"


def test_dispatch_timeout_kills_the_group(
    task_setup: Callable[..., TaskSetup], worker: Worker
) -> None:
    """Without a sandbox, by host pid (a sandbox at its deadline: tests/workers/test_sandbox.py)."""
    setup = task_setup("wordfreq")
    setup.edit_task(lambda d: d["budget"].update(timeout_s=1))
    init(setup)
    started = time.monotonic()
    r = run_proctor("dispatch", *setup.words(), "--sandbox", "none", "--command", "--", *worker.argv("group"))
    assert time.monotonic() - started < 30
    assert r.code == 1, r.out
    assert r.out["ok"] is False and r.out["timed_out"] is True
    assert r.out["exit_code"] is None and r.out["signal"] in (signal.SIGTERM, signal.SIGKILL)
    assert r.out["duration_s"] >= 1.0
    pid, child = worker.pid("pid"), worker.pid("child")
    assert pid is not None and child is not None
    wait_for(
        lambda: not alive(pid) and not alive(child), "the worker's group to be dead", timeout=10
    )
    end = [e for e in events(setup) if e["event"] == "dispatch_end"][-1]
    assert end["timed_out"] is True


def test_failing_worker_exits_1_and_is_journaled(task_setup: Callable[..., TaskSetup]) -> None:
    setup = task_setup("wordfreq")
    init(setup)
    r = run_proctor(
        "dispatch", *setup.words(), "--command", "--", sys.executable, "-c", "raise SystemExit(7)"
    )
    assert r.code == 1 and r.out["exit_code"] == 7 and r.out["ok"] is False
    end = events(setup)[-1]
    assert end["event"] == "dispatch_end" and end["exit_code"] == 7
    assert end["output_sha256"] == sha256_file(r.out["output_file"])


# --- production rules ----------------------------------------------------------------------------------


def production_task(task_setup: Callable[..., TaskSetup], **fields: Any) -> TaskSetup:
    setup = task_setup("wordfreq")

    def change(d: dict[str, Any]) -> None:
        d["prompt"] = d["prompt"] + "\n\n" + PROD_PROMPT
        d.update(fields)

    setup.edit_task(change)
    init(setup)
    return setup


def noop_dispatch(setup: TaskSetup) -> Any:
    return run_proctor("dispatch", *setup.words(), "--command", "--", sys.executable, "-c", "pass")


def test_lane_reports_production(task_setup: Callable[..., TaskSetup]) -> None:
    setup = task_setup("wordfreq")
    setup.edit_task(lambda d: d.update(prompt=d["prompt"] + " " + PROD_PROMPT))
    r = run_proctor("lane", "--task", str(setup.task))
    assert r.code == 0
    assert r.out["lane"] == "flash" and r.out["production"] is True
    assert r.out["production_entrypoints"] == ["src.run_all"]


def test_production_task_on_implicit_flash_is_refused(task_setup: Callable[..., TaskSetup]) -> None:
    setup = production_task(task_setup)
    r = noop_dispatch(setup)
    assert r.code == 3 and r.out["refusal"] == "flash_lane_refused_for_production"
    assert r.out["path"] == str(setup.task)
    assert "src.run_all" in r.out["message"]
    assert "dispatch_start" not in [e["event"] for e in events(setup)]


def test_production_task_without_preflight_receipts_is_refused(
    task_setup: Callable[..., TaskSetup],
) -> None:
    setup = production_task(task_setup, lane="glm", lane_reason="touches the nightly job")
    r = noop_dispatch(setup)
    assert r.code == 3 and r.out["refusal"] == "preflight_receipt_required"
    assert r.out["path"] == str(setup.task)


def test_production_task_with_a_stale_preflight_receipt_is_refused(
    task_setup: Callable[..., TaskSetup],
) -> None:
    setup = task_setup("wordfreq")
    receipt = setup.task.parent / "preflight.json"
    receipt.write_text('{"doctor": "ok"}\n')
    old = time.time() - 2 * 86400
    os.utime(receipt, (old, old))

    def change(d: dict[str, Any]) -> None:
        d["prompt"] += "\n" + PROD_PROMPT
        d.update(lane="glm", lane_reason="reviewed", preflight_receipts=["preflight.json"])

    setup.edit_task(change)
    init(setup)
    r = noop_dispatch(setup)
    assert r.code == 3 and r.out["refusal"] == "preflight_receipt_stale"
    assert r.out["path"] == str(receipt)


def test_production_task_with_a_missing_preflight_receipt_is_refused(
    task_setup: Callable[..., TaskSetup],
) -> None:
    setup = production_task(
        task_setup, lane="k3", lane_reason="reviewed", preflight_receipts=["not-there.json"]
    )
    r = noop_dispatch(setup)
    assert r.code == 3 and r.out["refusal"] == "file_missing"
    assert r.out["path"] == str(setup.task.parent / "not-there.json")


@pytest.mark.parametrize(
    ("kind", "code"),
    [
        ("fifo", "not_a_regular_file"),
        ("dangling", "dangling_link"),
        ("folder", "not_a_regular_file"),
    ],
)
def test_production_task_with_a_special_preflight_receipt_is_refused(
    task_setup: Callable[..., TaskSetup], kind: str, code: str
) -> None:
    setup = task_setup("wordfreq")
    receipt = setup.task.parent / "preflight.json"
    if kind == "fifo":
        os.mkfifo(receipt)
    elif kind == "dangling":
        receipt.symlink_to(setup.root / "gone.json")
    else:
        receipt.mkdir()

    def change(d: dict[str, Any]) -> None:
        d["prompt"] += "\n" + PROD_PROMPT
        d.update(lane="glm", lane_reason="reviewed", preflight_receipts=["preflight.json"])

    setup.edit_task(change)
    init(setup)
    r = run_proctor(
        "dispatch", *setup.words(), "--command", "--", sys.executable, "-c", "pass", timeout=30
    )
    assert r.code == 3 and r.out["refusal"] == code and r.out["path"] == str(receipt)


def test_production_task_with_a_fresh_preflight_receipt_dispatches(
    task_setup: Callable[..., TaskSetup],
) -> None:
    setup = task_setup("wordfreq")
    receipt = setup.task.parent / "preflight.json"
    receipt.write_text('{"doctor": "ok"}\n')

    def change(d: dict[str, Any]) -> None:
        d["scope"] = [*d["scope"], "src/run_all.py"]  # slashed form, in the scope
        d.update(
            lane="flash",
            lane_reason="one-line fix, reviewed",
            preflight_receipts=["preflight.json"],
        )

    setup.edit_task(change)
    init(setup)
    r = noop_dispatch(setup)
    assert r.code == 0, r.out
    assert r.out["lane"] == "flash"
    start = [e for e in events(setup) if e["event"] == "dispatch_start"][-1]
    assert start["preflight"][0]["path"] == str(receipt)
    assert start["preflight"][0]["sha256"] == sha256_file(receipt)


# --- status, orphans and the invocation lock ---------------------------------------------------------


def test_status_shows_progress_of_a_running_dispatch(
    task_setup: Callable[..., TaskSetup], worker: Worker
) -> None:
    setup = task_setup("wordfreq")
    init(setup)
    with background(start_dispatch(setup, worker.argv("beat"))) as proc:

        def progressing() -> dict[str, Any] | None:
            report = status(setup)
            ids = report["running_dispatch_ids"]
            if ids and report["payload_progress"].get(ids[0], {}).get("stage"):
                return report
            return None

        report = wait_for(progressing, "status to show the running dispatch's heartbeat")
        [dispatch_id] = report["running_dispatch_ids"]
        progress = report["payload_progress"][dispatch_id]
        assert progress["stage"] == "editing"
        assert progress["files_done"] == 1 and progress["files_total"] == 2
        assert progress["state"] == "fresh" and progress["age_s"] >= 0
        assert "flag" not in progress and "nested" not in progress  # only plain numbers and strings
        assert report["orphaned_dispatch_ids"] == []
        assert report["dispatches"] == 1

        # While the dispatch holds the lock, a second invocation is refused.
        for words in (
            ["verify", *setup.words()],
            ["accept", *setup.words()],
            ["dispatch", *setup.words(), "--command", "--", sys.executable, "-c", "pass"],
            ["journal", "--workspace", str(setup.workspace), "--ack", dispatch_id],
        ):
            r = run_proctor(*words)
            assert r.code == 3 and r.out["refusal"] == "invocation_locked", (words, r.out)
            assert r.out["path"].endswith("invocation.lock")

        worker.stop()
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, (out, err)
    assert json.loads(out)["dispatch_id"] == dispatch_id
    after = status(setup)
    assert after["running_dispatch_ids"] == [] and after["orphaned_dispatch_ids"] == []
    assert after["payload_progress"] == {}
    # The lock was free again: nothing refused counts as a dispatch.
    assert after["dispatches"] == 1


def test_status_survives_bad_heartbeat_files(
    task_setup: Callable[..., TaskSetup], worker: Worker
) -> None:
    setup = task_setup("wordfreq")
    init(setup)
    with background(start_dispatch(setup, worker.argv("sleep"))) as proc:
        wait_for(lambda: status(setup)["running_dispatch_ids"], "the dispatch to run")
        start = [e for e in events(setup) if e["event"] == "dispatch_start"][-1]
        dispatch_id, beat = start["dispatch_id"], Path(start["heartbeat"])

        def replace(make: Callable[[Path], Any]) -> None:
            if beat.is_dir() and not beat.is_symlink():
                beat.rmdir()
            elif os.path.lexists(beat):
                beat.unlink()
            make(beat)

        bad: list[Callable[[Path], Any]] = [
            os.mkfifo,
            lambda p: p.mkdir(),
            lambda p: p.symlink_to(p.parent / "gone"),
            lambda p: p.write_bytes(b"[1, 2]"),
            lambda p: p.write_bytes(b'{"stage": NaN}'),
            lambda p: p.write_bytes(b'{"stage": "a", "stage": "b"}'),
            lambda p: p.write_bytes(b"\xff\xfe"),
            lambda p: p.write_bytes(b"[" * 100_000 + b"]" * 100_000),
            lambda p: p.write_bytes(b'{"stage": "' + b"x" * 70_000 + b'"}'),
        ]
        for make in bad:
            replace(make)
            report = status(setup)  # must not block on a FIFO, nor fail
            assert report["payload_progress"][dispatch_id] == {"state": "absent"}, make
        replace(lambda p: p.write_text('{"stage": "testing", "done": 3}'))
        progress = status(setup)["payload_progress"][dispatch_id]
        assert progress["stage"] == "testing" and progress["done"] == 3
        worker.stop()
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and json.loads(out)["dispatch_id"] == dispatch_id


def test_orphaned_dispatch_is_reported_and_acknowledged(
    task_setup: Callable[..., TaskSetup], worker: Worker
) -> None:
    setup = task_setup("wordfreq")
    init(setup)
    proc = start_dispatch(setup, worker.argv("sleep"), sandbox="none")  # the worker outlives its proctor
    with background(proc):

        def running() -> dict[str, Any] | None:
            report = status(setup)
            return report if report["running_dispatch_ids"] and worker.pid() else None

        report = wait_for(running, "status to show the running dispatch")
        [dispatch_id] = report["running_dispatch_ids"]
        # This worker writes no heartbeat.
        assert report["payload_progress"][dispatch_id] == {"state": "absent"}

        proc.send_signal(signal.SIGKILL)  # the proctor, not the worker (its own session)
        proc.wait(timeout=30)
    worker_pid = worker.pid()
    assert worker_pid is not None and alive(worker_pid)

    report = status(setup)
    assert report["orphaned_dispatch_ids"] == [dispatch_id]
    assert report["running_dispatch_ids"] == []
    kinds = [e["event"] for e in events(setup)]
    assert kinds[-1] == "dispatch_start"

    r = run_proctor("journal", "--workspace", str(setup.workspace), "--ack", "d999-nothing")
    assert (
        r.code == 3
        and r.out["refusal"] == "unknown_dispatch_id"
        and r.out["path"].endswith("journal.jsonl")
    )

    r = run_proctor("journal", "--workspace", str(setup.workspace), "--ack", dispatch_id)
    assert r.code == 0 and r.out == {"ok": True, "acknowledged": dispatch_id}
    assert status(setup)["orphaned_dispatch_ids"] == []
    assert events(setup)[-1]["event"] == "ack"

    r = run_proctor("journal", "--workspace", str(setup.workspace), "--ack", dispatch_id)
    assert r.code == 3 and r.out["refusal"] == "already_acknowledged"
    worker.kill()


def test_orphan_stays_orphaned_while_another_dispatch_runs(
    task_setup: Callable[..., TaskSetup], worker: Worker
) -> None:
    setup = task_setup("wordfreq")
    init(setup)
    second = Worker(setup.root / "second")
    try:
        with background(start_dispatch(setup, worker.argv("sleep"), sandbox="none")) as first:
            wait_for(lambda: worker.pid() and status(setup)["running_dispatch_ids"], "dispatch 1")
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=30)
        [orphan] = status(setup)["orphaned_dispatch_ids"]
        with background(start_dispatch(setup, second.argv("sleep"), sandbox="none")):
            wait_for(second.pid, "dispatch 2's worker")
            report = status(setup)
            second.stop()
        # An orphan stays an orphan while another invocation holds the lock.
        assert report["orphaned_dispatch_ids"] == [orphan]
        assert len(report["running_dispatch_ids"]) == 1
        assert orphan not in report["running_dispatch_ids"]
    finally:
        second.kill()


def test_status_after_a_finished_dispatch(task_setup: Callable[..., TaskSetup]) -> None:
    setup = task_setup("intervals")
    init(setup)
    before = status(setup)
    assert before["last_receipt"] is None
    assert before["dispatches"] == 0 and before["journal_lines"] == 1
    assert before["accepted"] is False
    degraded = before["measurement_degraded"]
    assert degraded["degraded"] is True
    assert {"tokens", "cost"} <= set(degraded["components"])

    d = run_proctor("dispatch", *setup.words(), "--command", "--", *setup.worker())
    assert d.code == 0
    v = run_proctor("verify", *setup.words())
    assert v.code == 0

    report = status(setup)
    assert report["task_id"] == "intervals-touching-merge"
    assert report["workspace"] == os.path.realpath(setup.workspace)
    assert report["dispatches"] == 1
    assert report["running_dispatch_ids"] == [] and report["orphaned_dispatch_ids"] == []
    assert report["detached_dispatch_ids"] == []
    assert report["payload_progress"] == {}
    assert report["stall_suspected"] is False
    last = report["last_receipt"]
    assert last["receipt_id"] == v.out["receipt_id"] and last["passed"] is True
    assert last["tree"] == v.out["tree"] and last["tamper_detected"] is False and last["at"]
    assert report["accepted"] is False
    assert {"tokens", "cost"} <= set(report["measurement_degraded"]["components"])

    r = run_proctor("journal", "--workspace", str(setup.workspace), "--ack", d.out["dispatch_id"])
    assert r.code == 3 and r.out["refusal"] == "dispatch_not_orphaned"
    assert run_proctor("accept", *setup.words()).code == 0
    assert status(setup)["accepted"] is True


# --- the journal ---------------------------------------------------------------------------------------


def test_journal_lists_events_and_is_a_verifiable_chain(
    task_setup: Callable[..., TaskSetup],
) -> None:
    setup = task_setup("bizdays")
    pinned = init(setup)
    assert run_proctor("verify", *setup.words()).code == 1
    assert run_proctor("accept", *setup.words()).code == 3
    assert run_proctor("dispatch", *setup.words(), "--command", "--", *setup.worker()).code == 0

    r = run_proctor("journal", "--workspace", str(setup.workspace))
    assert r.code == 0
    journal = Path(pinned["state_dir"]) / "journal.jsonl"
    assert r.out["journal"] == str(journal) and r.out["lines"] == 5
    kinds = [e["event"] for e in r.out["events"]]
    assert kinds == ["init", "verify", "refused", "dispatch_start", "dispatch_end"]
    assert all("t" in e and "at" in e and "prev" in e for e in r.out["events"])
    ts = [e["t"] for e in r.out["events"]]
    assert ts == sorted(ts)
    tail = run_proctor("journal", "--workspace", str(setup.workspace), "--tail", "2")
    assert [e["event"] for e in tail.out["events"]] == ["dispatch_start", "dispatch_end"]

    ok = run_proctor("ledger", "verify", str(journal))
    assert (
        ok.code == 0 and ok.out["ok"] is True and ok.out["lines"] == 5 and ok.out["problem"] is None
    )
    seed = ok.out["seed"]
    assert seed.startswith("proctor-journal:bizdays-inclusive-range:")
    assert run_proctor("ledger", "verify", str(journal), "--seed", seed).code == 0
    wrong = run_proctor("ledger", "verify", str(journal), "--seed", "another-log")
    assert wrong.code == 1 and wrong.out["problem"]["kind"] == "seed_mismatch"

    # Flip one byte of line 2 (inside its prev hash): verify exits 1 naming line 2.
    data = bytearray(journal.read_bytes())
    line2 = data.index(b"\n") + 1
    at = data.index(b'"prev":"', line2) + len(b'"prev":"')
    data[at] ^= 0x01
    journal.write_bytes(bytes(data))
    bad = run_proctor("ledger", "verify", str(journal))
    assert bad.code == 1 and bad.out["ok"] is False
    assert bad.out["problem"]["line"] == 2 and bad.out["lines"] == 1
    assert bad.out["path"] == str(journal)

    # Every command reading the journal now refuses, naming the line.
    r = run_proctor("status", "--workspace", str(setup.workspace))
    assert r.code == 3 and r.out["refusal"] == "log_broken" and r.out["line"] == 2
    assert r.out["path"] == str(journal)
    r = run_proctor("verify", *setup.words())
    assert r.code == 3 and r.out["refusal"] == "log_broken"


def test_changed_task_file_after_init_is_refused(task_setup: Callable[..., TaskSetup]) -> None:
    setup = task_setup("wordfreq")
    init(setup)
    setup.edit_task(lambda d: d["verifier"].update(argv=["{python}", "-c", "pass"]))
    r = run_proctor("verify", *setup.words())
    assert r.code == 3 and r.out["refusal"] == "verifier_changed_since_init"
    setup.edit_task(
        lambda d: d["verifier"].update(
            argv=["{python}", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"]
        )
    )
    setup.edit_task(lambda d: d.update(prompt="something else"))
    r = run_proctor("verify", *setup.words())
    assert r.code == 3 and r.out["refusal"] == "task_changed_since_init"


def test_task_for_another_workspace_is_refused(task_setup: Callable[..., TaskSetup]) -> None:
    setup = task_setup("wordfreq")
    init(setup)
    other = REPO / "evals" / "tasks" / "intervals" / "task.json"
    r = run_proctor("verify", "--workspace", str(setup.workspace), "--task", str(other))
    assert r.code == 3 and r.out["refusal"] == "task_mismatch"


def test_git_repo_helper_makes_a_clean_repository(tmp_path: Path) -> None:
    # The fixture's workspaces start clean: `git status` is empty before anything runs.
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "f.txt").write_text("x")
    repo = git_repo(tmp_path / "r")
    assert snapshot(repo)[1] == ""
