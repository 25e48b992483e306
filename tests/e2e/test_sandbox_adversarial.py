"""Adversarial workers in the bwrap sandbox, through the real CLI: each fails to cheat, and the evidence holds.

Every case builds a real git workspace from the wordfreq task, runs `proctor
init` and a first (failing) `proctor verify`, so that a pin, a journal, a
receipt, sealed and hidden copies all exist to be attacked, then dispatches a
hostile worker from tests/fixtures/sandbox/ with `--sandbox bwrap`. The worker
prints a REPORT line of what each attempt came to; the test asserts each
outcome exactly (not found, read-only, refused, ignored) and that the
proctor's evidence is intact afterwards: every state file byte for byte, the
journal an unbroken chain that only grew (`proctor ledger verify`).

Where it shows the attack is real, the same worker then runs with `--sandbox
none`, where it gets through to what the sandbox kept from it (and, for the
writes, the proctor's own checks are what catch it).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import CliResult, run_proctor
from tests.support.paths import FIXTURES, REPO
from tests.support.procs import alive_with
from tests.support.sim import SimServer
from tests.support.tasks import TaskSetup

SANDBOX = FIXTURES / "sandbox"
MARKER = "test_casefold_not_just_lower"  # a test name only the wordfreq hidden test holds
EXIT_OK, EXIT_FAILED, EXIT_REFUSED = 0, 1, 3
NOT_FOUND = {"ok": False, "error": "FileNotFoundError", "errno": "ENOENT"}
READ_ONLY = {"ok": False, "error": "OSError", "errno": "EROFS"}

MakeTask = Callable[..., TaskSetup]


def adversary(name: str, **words: str) -> list[str]:
    """The argv of a fixture worker: its script, its folder (for the shared `_report`), key=value words."""
    return [sys.executable, str(SANDBOX / f"{name}.py"), str(SANDBOX), *(f"{k}={v}" for k, v in words.items())]


def report_of(res: CliResult) -> dict[str, Any]:
    lines = Path(res.out["output_file"]).read_text().splitlines()
    found = [line[7:] for line in lines if line.startswith("REPORT ")]
    assert len(found) == 1, "\n".join(lines)
    return dict(json.loads(found[0]))


def dispatch(ts: TaskSetup, argv: list[str], sandbox: str = "bwrap") -> CliResult:
    return run_proctor("dispatch", *ts.words(), "--sandbox", sandbox, "--command", "--", *argv)


def evidence(state: Path) -> tuple[dict[str, bytes], list[bytes]]:
    """Every state file but the journal, the dispatch folders and the lock, by bytes; and the journal's lines."""
    files = {
        str(p.relative_to(state)): p.read_bytes()
        for p in sorted(state.rglob("*"))
        if p.is_file() and p.parts[len(state.parts)] not in ("dispatches", "journal.jsonl", "invocation.lock")
    }
    return files, (state / "journal.jsonl").read_bytes().splitlines()


def assert_intact(state: Path, before: tuple[dict[str, bytes], list[bytes]]) -> None:
    files, lines = evidence(state)
    assert files == before[0], sorted(set(files) ^ set(before[0])) or "a state file changed"
    assert lines[: len(before[1])] == before[1], "the journal was rewritten"
    check = run_proctor("ledger", "verify", str(state / "journal.jsonl"))
    assert check.code == EXIT_OK and check.out["ok"] is True, check.out
    events = [json.loads(line)["event"] for line in lines]
    assert "state_tampered" not in events


def prepared(task_setup: MakeTask) -> tuple[TaskSetup, Path, tuple[dict[str, bytes], list[bytes]]]:
    """An initialized wordfreq workspace with a failing receipt r0001: evidence to attack."""
    ts = task_setup("wordfreq")
    init = run_proctor("init", *ts.words())
    assert init.code == EXIT_OK, init.out
    state = Path(init.out["state_dir"])
    first = run_proctor("verify", *ts.words())
    assert first.code == EXIT_FAILED and first.out["receipt_id"] == "r0001", first.out
    assert first.out["sandbox"]["kind"] == "bwrap"
    return ts, state, evidence(state)


def test_a_worker_searching_the_file_system_finds_no_hidden_test(task_setup: MakeTask) -> None:
    ts, state, before = prepared(task_setup)
    assert MARKER in (ts.root / "task" / "hidden" / "test_hidden.py").read_text()
    places = [
        str(state), str(state / "hidden" / "0"), str(state / "sealed"), str(state / "receipts" / "r0001.output"),
        str(ts.root / "task" / "hidden" / "test_hidden.py"), str(REPO / "evals"),
        str(REPO / "evals" / "tasks" / "wordfreq" / "hidden" / "test_hidden.py"),
        str(REPO / "evals" / "humaneval" / "private"), str(REPO / "results"),
    ]  # fmt: skip
    res = dispatch(ts, adversary("hunt_hidden", marker=MARKER, paths=json.dumps(places)))
    assert res.code == EXIT_OK and res.out["exit_code"] == 0, res.out
    found = report_of(res)
    assert found["found"] == [], found["found"]
    assert found["names"] > 1000 and found["opened"] > 0  # it did walk the file system it can see
    assert found["direct"] == dict.fromkeys(places, NOT_FOUND)
    assert not (ts.workspace / "found").exists()
    assert_intact(state, before)
    assert run_proctor("verify", *ts.words()).code == EXIT_FAILED  # still the unfixed code, nothing gained

    # Without a sandbox the same worker reads the hidden copy straight out of the state folder.
    res = dispatch(ts, adversary("hunt_hidden", marker=MARKER, paths=json.dumps(places), walk="no"), "none")
    leaked = report_of(res)["direct"]
    assert leaked[str(state / "hidden" / "0")]["ok"] is True
    assert leaked[str(ts.root / "task" / "hidden" / "test_hidden.py")]["ok"] is True


def test_a_worker_writing_into_the_state_folder_by_absolute_path(task_setup: MakeTask) -> None:
    ts, state, before = prepared(task_setup)
    readonly = ["/", "/usr", "/etc", str(REPO / "harness"), sys.base_prefix]
    res = dispatch(ts, adversary("write_state", state=str(state), readonly=json.dumps(readonly)))
    assert res.code == EXIT_OK and res.out["exit_code"] == 0, res.out  # nothing changed: nothing to refuse
    found = report_of(res)
    assert found["state_exists"] is False
    tries = found["tries"]
    for name in ("pin", "new_receipt", "sealed_copy", "verify_conftest", "wire_log", "output_log"):
        assert tries[name] == NOT_FOUND, (name, tries[name])
    # Making the folders first works only in the sandbox's own /tmp (the state lies under /tmp here).
    assert tries["planted"] == ({"ok": True, "value": True} if str(state).startswith("/tmp/") else READ_ONLY)
    assert not (state / "planted").exists()
    for place in readonly:
        assert tries["readonly:" + place] == READ_ONLY, place
        assert not os.path.exists(os.path.join(place, "proctor-was-here"))
    assert_intact(state, before)

    # Without a sandbox the writes land, and only the proctor's watch of its state folder catches them.
    res = dispatch(ts, adversary("write_state", state=str(state), readonly="[]"), "none")
    assert res.code == EXIT_REFUSED and res.out["refusal"] == "state_tampered", res.out
    assert str(state / "pin.json") in res.out["paths"]


def test_a_worker_editing_a_receipt_or_the_journal(task_setup: MakeTask) -> None:
    ts, state, before = prepared(task_setup)
    res = dispatch(ts, adversary("edit_evidence", state=str(state)))
    assert res.code == EXIT_OK, res.out
    assert report_of(res) == {"receipt": NOT_FOUND, "journal": NOT_FOUND, "listing": NOT_FOUND}
    assert_intact(state, before)
    refused = run_proctor("accept", *ts.words())
    assert refused.code == EXIT_REFUSED and refused.out["refusal"] == "receipt_not_passing", refused.out

    # Without a sandbox the receipt is rewritten and a chained line appended; the proctor refuses.
    res = dispatch(ts, adversary("edit_evidence", state=str(state)), "none")
    assert res.code == EXIT_REFUSED and res.out["refusal"] == "state_tampered", res.out
    assert res.out["paths"] == [str(state / "journal.jsonl"), str(state / "receipts" / "r0001.json")]
    assert run_proctor("accept", *ts.words()).out["refusal"] == "state_tampered"


def test_a_worker_killing_the_proctor_and_every_process_it_sees(task_setup: MakeTask) -> None:
    ts, state, before = prepared(task_setup)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        res = dispatch(ts, adversary("kill_proctor", host_pid=str(bystander.pid)))
        # The proctor is alive: it answered, journaled the end, and the worker ran to its end.
        assert res.code == EXIT_OK and res.out["exit_code"] == 0, res.out
        found = report_of(res)
        # Its own pid namespace: its parent is the sandbox's init, and /proc holds the two of them only.
        assert found["ppid"] == 1 and found["ancestors"] == [1] and found["proc_pids"] == [1, found["me"]]
        assert found["tries"] == {
            "ancestor:1": {"ok": True, "value": None},  # sent, and dropped by the kernel: init ignores it
            "host": {"ok": False, "error": "ProcessLookupError", "errno": "ESRCH"},
        }
        assert found["alive_after"] is True
        assert bystander.poll() is None
        assert_intact(state, before)
        status = run_proctor("status", "--workspace", str(ts.workspace)).out
        assert status["orphaned_dispatch_ids"] == [] and status["running_dispatch_ids"] == []

        # Without a sandbox the host's processes are in reach: it could signal many (it only probes them
        # with signal 0, and spares its parent, the proctor), and it kills the bystander.
        res = dispatch(ts, adversary("kill_proctor", host_pid=str(bystander.pid), parent="no"), "none")
        tries = report_of(res)["tries"]
        assert sum(1 for k, v in tries.items() if k.startswith("probe:") and v["ok"]) > 3
        assert tries["host"] == {"ok": True, "value": None}
        assert bystander.wait(timeout=10) == -signal.SIGKILL
    finally:
        bystander.kill()
        bystander.wait()


def test_a_worker_opening_network_connections(task_setup: MakeTask, sim_server: SimServer) -> None:
    ts, state, before = prepared(task_setup)
    url = sim_server()
    target = url.split("//", 1)[1].split("/", 1)[0]
    res = dispatch(ts, adversary("network", target=target))
    assert res.code == EXIT_OK, res.out
    found = report_of(res)
    assert found["tcp"] == {"ok": False, "error": "ConnectionRefusedError", "errno": "ECONNREFUSED"}
    assert found["dns"]["ok"] is False and found["dns"]["error"] == "gaierror"
    assert found["interfaces"] == {"ok": True, "value": ["lo"]}  # a loopback of its own, nothing else
    assert_intact(state, before)

    res = dispatch(ts, adversary("network", target=target), "none")
    tcp = report_of(res)["tcp"]
    assert tcp["ok"] is True and tcp["value"].startswith("HTTP/1."), tcp


def test_a_process_trying_to_outlive_the_sandbox_is_killed_with_it(task_setup: MakeTask) -> None:
    ts, state, before = prepared(task_setup)
    token = "token-" + secrets.token_hex(8)
    res = dispatch(ts, adversary("survive", token=token))
    assert res.code == EXIT_OK and res.out["exit_code"] == 0, res.out
    found = report_of(res)
    assert found["survivor"] not in (found["pid"], found["sid"])  # forked twice, out of the worker's session
    assert (ts.workspace / "survivor.pid").exists()  # it ran...
    assert alive_with(token) == []  # ...and died with the sandbox's pid namespace, before the dispatch ended
    assert res.out["detached_pids"] == []  # nothing outlived the sandbox to be found
    assert_intact(state, before)
    status = run_proctor("status", "--workspace", str(ts.workspace)).out
    assert status["detached_dispatch_ids"] == []

    # Without a sandbox it outlives the worker, and the proctor finds it, kills it and flags it.
    (ts.workspace / "survivor.pid").unlink()
    res = dispatch(ts, adversary("survive", token=token), "none")
    assert res.code == EXIT_OK and len(res.out["detached_pids"]) == 1, res.out
    assert alive_with(token) == []


def test_a_link_from_the_workspace_to_the_state_folder(task_setup: MakeTask) -> None:
    ts, state, before = prepared(task_setup)
    res = dispatch(ts, adversary("link_out", state=str(state)))
    assert res.code == EXIT_OK, res.out
    assert report_of(res) == {"read_pin": NOT_FOUND, "list": NOT_FOUND, "append_journal": NOT_FOUND}
    assert os.readlink(ts.workspace / "evidence") == str(state)
    refused = run_proctor("verify", *ts.words())
    assert refused.code == EXIT_REFUSED and refused.out["refusal"] == "unsafe_workspace_entry", refused.out
    assert [e["path"] for e in refused.out["entries"]] == ["evidence", "pin-link"]
    assert_intact(state, before)

    # Without a sandbox the link leads straight to the pin; verify refuses the links all the same.
    for link in ("evidence", "pin-link"):
        (ts.workspace / link).unlink()
    res = dispatch(ts, adversary("link_out", state=str(state), write="no"), "none")
    read = report_of(res)["read_pin"]
    assert read["ok"] is True and read["value"].startswith('{"'), read
    assert run_proctor("verify", *ts.words()).out["refusal"] == "unsafe_workspace_entry"


@pytest.mark.parametrize("name", ["hunt_hidden", "write_state", "edit_evidence", "kill_proctor", "network",
                                  "survive", "link_out"])  # fmt: skip
def test_every_adversary_is_documented(name: str) -> None:
    assert f"`{name}.py`" in (SANDBOX / "README.md").read_text()
