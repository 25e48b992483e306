"""`proctor worker llm-edit` through the real CLI: against the real simulator, and a canned provider.

The simulator (`sim_server`, with the bundled task folders) answers a prompt
that names `task_id: <id>` with the task's `fix/` files (skill 1.0) or the
files as given (skill 0.0). The canned loopback server (`ProviderServer`)
returns exactly the body a test chooses and keeps the bytes it received.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.providers.edit_format import render_files
from tests.support.cli import CliResult, run_proctor
from tests.support.paths import TASKS
from tests.support.provider_server import ProviderServer
from tests.support.sim import SimServer, sim_systems
from tests.support.tasks import TaskSetup

TASK_NAMES = ("bizdays", "iniconf", "intervals", "wordfreq")
MERGE = "intervals/merge.py"


def task_doc(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((TASKS / name / "task.json").read_text())
    return doc


def llm_edit(
    setup: TaskSetup, name: str, env: dict[str, str], *extra: str, model: str = "sim-flash", scope: bool = True
) -> CliResult:
    """Run the worker on a copy of task `name` (prompt file written beside the workspace)."""
    doc = task_doc(name)
    prompt = setup.root / "prompt.md"
    prompt.write_text(doc["prompt"])
    words = ["worker", "llm-edit", "--model", model, "--prompt-file", str(prompt),
             "--workspace", str(setup.workspace), "--task-id", doc["task_id"]]
    if scope:
        words += ["--scope", *doc["scope"]]
    return run_proctor(*words, *extra, env=env)


def chat_body(content: str) -> bytes:
    return json.dumps({
        "id": "chatcmpl-canned-1",
        "object": "chat.completion",
        "created": 0,
        "model": "canned-2026",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150},
    }).encode()


def canned(server: ProviderServer) -> dict[str, str]:
    """Point the bundled catalog's sim models (base_url_env PROCTOR_SIM_URL) at the canned server."""
    return {"PROCTOR_SIM_URL": server.url + "/v1"}


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and ".git" not in p.parts}


# --- against the simulator ----------------------------------------------------------------------


@pytest.mark.parametrize("name", TASK_NAMES)
def test_a_skilled_model_writes_the_fix(
    name: str, task_setup: Callable[..., TaskSetup], sim_server: SimServer, tmp_path: Path
) -> None:
    url = sim_server(systems=sim_systems(tmp_path / "skilled.json", {"sim-flash": 1.0}))
    setup = task_setup(name)
    r = llm_edit(setup, name, {"PROCTOR_SIM_URL": url})
    assert r.code == 0, r.out
    scope = task_doc(name)["scope"]
    assert r.out == {
        "ok": True,
        "exit_code": 0,
        "written": sorted(scope),
        "ignored_out_of_scope": [],
        "error_code": None,
        "model_snapshot": "sim-flash",
        "request_sha256": r.out["request_sha256"],
    }
    assert len(r.out["request_sha256"]) == 64
    for rel in scope:
        assert (setup.workspace / rel).read_bytes() == (TASKS / name / "fix" / rel).read_bytes(), rel


def test_an_unskilled_model_leaves_the_files_as_they_were(
    task_setup: Callable[..., TaskSetup], sim_server: SimServer, tmp_path: Path
) -> None:
    url = sim_server(systems=sim_systems(tmp_path / "unskilled.json", {"sim-flash": 0.0}))
    setup = task_setup("iniconf")
    before = snapshot(setup.workspace)
    r = llm_edit(setup, "iniconf", {"PROCTOR_SIM_URL": url})
    # The wrong answer is the files as given: written back whole, so nothing changes.
    assert r.code == 0 and r.out["written"] == ["iniconf/parser.py", "iniconf/tokenizer.py"], r.out
    assert snapshot(setup.workspace) == before
    for rel in task_doc("iniconf")["scope"]:
        assert (setup.workspace / rel).read_bytes() != (TASKS / "iniconf" / "fix" / rel).read_bytes()


def test_the_exec_bit_of_an_existing_file_is_kept(
    task_setup: Callable[..., TaskSetup], sim_server: SimServer, tmp_path: Path
) -> None:
    url = sim_server(systems=sim_systems(tmp_path / "skilled.json", {"sim-flash": 1.0}))
    setup = task_setup("intervals")
    target = setup.workspace / "intervals" / "merge.py"
    target.chmod(0o755)
    r = llm_edit(setup, "intervals", {"PROCTOR_SIM_URL": url})
    assert r.code == 0, r.out
    assert target.read_bytes() == (TASKS / "intervals" / "fix" / "intervals" / "merge.py").read_bytes()
    assert target.stat().st_mode & 0o777 == 0o755


# --- against a canned provider ------------------------------------------------------------------


def test_only_files_in_scope_are_written(task_setup: Callable[..., TaskSetup]) -> None:
    setup = task_setup("intervals")
    before = snapshot(setup.workspace)
    answer = "Here is the fix.\n" + render_files({
        "evil.py": "print('outside the scope')\n",
        "../outside.py": "escaped\n",
        ".git/hooks/pre-commit": "#!/bin/sh\nexit 0\n",
        "tests/test_visible.py": "def test_nothing():\n    pass\n",
        "intervals/merge.py": "def merge(intervals):\n    return []\n",
    })
    with ProviderServer() as server:
        server.serve(200, {"Content-Type": "application/json"}, chat_body(answer))
        r = llm_edit(setup, "intervals", canned(server))
    assert r.code == 0, r.out
    assert r.out["written"] == ["intervals/merge.py"]
    assert r.out["ignored_out_of_scope"] == sorted(
        [".git/hooks/pre-commit", "../outside.py", "evil.py", "tests/test_visible.py"]
    )
    assert r.out["model_snapshot"] == "canned-2026"
    after = snapshot(setup.workspace)
    assert after.pop("intervals/merge.py") == b"def merge(intervals):\n    return []\n"
    before.pop("intervals/merge.py")
    assert after == before
    assert not (setup.root / "outside.py").exists() and not (setup.workspace / ".git" / "hooks" / "pre-commit").exists()


def test_an_answer_without_a_file_in_scope_exits_1(task_setup: Callable[..., TaskSetup]) -> None:
    setup = task_setup("intervals")
    with ProviderServer() as server:
        server.serve(200, {"Content-Type": "application/json"}, chat_body("I would rather not."))
        r = llm_edit(setup, "intervals", canned(server))
    assert r.code == 1 and r.out["ok"] is False and r.out["written"] == [] and r.out["error_code"] is None, r.out


def test_the_prompt_holds_the_task_id_the_prompt_and_every_file_in_scope(
    task_setup: Callable[..., TaskSetup],
) -> None:
    setup = task_setup("iniconf")
    doc = task_doc("iniconf")
    with ProviderServer() as server:
        server.serve(200, {"Content-Type": "application/json"}, chat_body("nothing"))
        r = llm_edit(setup, "iniconf", canned(server))
        received = list(server.received)
    assert r.code == 1, r.out
    assert len(received) == 1
    request = received[0]
    assert request.method == "POST" and request.path == "/v1/chat/completions"
    body = json.loads(request.body)
    assert body["model"] == "sim-flash"
    text = body["messages"][-1]["content"]
    assert text.startswith(f"task_id: {doc['task_id']}\n")
    assert doc["prompt"].strip() in text
    for rel in doc["scope"]:
        content = (setup.workspace / rel).read_text()
        assert f"<<<FILE {rel}\n{content}>>>END\n" in text, rel
    assert "Files in scope that do not exist yet" not in text
    # The worker reports the sha256 of exactly the bytes that went out.
    assert r.out["request_sha256"] == hashlib.sha256(request.body).hexdigest()


def test_a_file_in_scope_that_does_not_exist_is_named_and_can_be_created(
    task_setup: Callable[..., TaskSetup],
) -> None:
    setup = task_setup("intervals")
    answer = render_files({"intervals/new_module.py": "VALUE = 1\n"})
    with ProviderServer() as server:
        server.serve(200, {"Content-Type": "application/json"}, chat_body(answer))
        r = llm_edit(setup, "intervals", canned(server), "--scope", "intervals/merge.py", "intervals/new_module.py")
        text = json.loads(server.received[0].body)["messages"][-1]["content"]
    assert r.code == 0 and r.out["written"] == ["intervals/new_module.py"], r.out
    assert "Files in scope that do not exist yet: intervals/new_module.py" in text
    assert (setup.workspace / "intervals" / "new_module.py").read_text() == "VALUE = 1\n"


def test_a_provider_error_exits_75_with_its_error_code(task_setup: Callable[..., TaskSetup]) -> None:
    setup = task_setup("intervals")
    before = snapshot(setup.workspace)
    error = json.dumps({"error": {"message": "The server had an error", "type": "server_error", "code": None}})
    with ProviderServer() as server:
        server.serve(500, {"Content-Type": "application/json"}, error.encode())
        r = llm_edit(setup, "intervals", canned(server))
    assert r.code == 75, r.out
    assert r.out["ok"] is False and r.out["exit_code"] == 75 and r.out["error_code"] == "server_error"
    assert r.out["written"] == [] and snapshot(setup.workspace) == before


def test_an_unreachable_provider_exits_75_with_transport(task_setup: Callable[..., TaskSetup]) -> None:
    setup = task_setup("intervals")
    before = snapshot(setup.workspace)
    with socket.socket() as sock:  # a port that was free a moment ago and now has no listener
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    r = llm_edit(setup, "intervals", {"PROCTOR_SIM_URL": f"http://127.0.0.1:{port}/v1"})
    assert r.code == 75, r.out
    assert r.out["error_code"] == "transport" and r.out["written"] == []
    assert snapshot(setup.workspace) == before


def test_a_malformed_answer_exits_75(task_setup: Callable[..., TaskSetup]) -> None:
    setup = task_setup("intervals")
    with ProviderServer() as server:
        server.serve(200, {"Content-Type": "application/json"}, b"<html>not json</html>")
        r = llm_edit(setup, "intervals", canned(server))
    assert r.code == 75 and r.out["error_code"] == "malformed_response", r.out


# --- refusals -----------------------------------------------------------------------------------


def test_refusals_exit_3_without_a_request(task_setup: Callable[..., TaskSetup]) -> None:
    setup = task_setup("intervals")
    with ProviderServer() as server:
        env = canned(server)
        no_prompt = run_proctor("worker", "llm-edit", "--model", "sim-flash", "--workspace", str(setup.workspace),
                                "--scope", "intervals/merge.py", env=env)
        no_scope = llm_edit(setup, "intervals", env, scope=False)
        unknown = llm_edit(setup, "intervals", env, model="sim-flsah")
        missing_file = run_proctor("worker", "llm-edit", "--model", "sim-flash", "--prompt-file",
                                   str(setup.root / "absent.md"), "--workspace", str(setup.workspace),
                                   "--scope", "intervals/merge.py", env=env)
        assert server.received == []
    assert no_prompt.code == 3 and no_prompt.out["refusal"] == "prompt_file_missing", no_prompt.out
    assert no_scope.code == 3 and no_scope.out["refusal"] == "scope_empty", no_scope.out
    assert unknown.code == 3 and unknown.out["refusal"] == "unknown_model", unknown.out
    assert "sim-flash" in unknown.out["message"] and "sim-flash" in unknown.out["family"]
    assert missing_file.code == 3 and missing_file.out["refusal"] == "file_missing", missing_file.out
    for r in (no_prompt, no_scope, unknown, missing_file):
        assert r.out["ok"] is False and "Traceback" not in r.stderr and "Traceback" not in r.stdout


def test_scope_and_prompt_come_from_the_dispatch_environment(
    task_setup: Callable[..., TaskSetup], sim_server: SimServer, tmp_path: Path
) -> None:
    url = sim_server(systems=sim_systems(tmp_path / "skilled.json", {"sim-flash": 1.0}))
    setup = task_setup("wordfreq")
    doc = task_doc("wordfreq")
    prompt = setup.root / "prompt.md"
    prompt.write_text(doc["prompt"])
    env = {
        "PROCTOR_SIM_URL": url,
        "PROCTOR_PROMPT_FILE": str(prompt),
        "PROCTOR_SCOPE": json.dumps(doc["scope"]),
        "PROCTOR_TASK_ID": doc["task_id"],
    }
    r = run_proctor("worker", "llm-edit", "--model", "sim-flash", "--workspace", str(setup.workspace), env=env)
    assert r.code == 0 and r.out["written"] == doc["scope"], r.out
    rel = doc["scope"][0]
    assert (setup.workspace / rel).read_bytes() == (TASKS / "wordfreq" / "fix" / rel).read_bytes()
    bad = run_proctor("worker", "llm-edit", "--model", "sim-flash", "--workspace", str(setup.workspace),
                      env={**env, "PROCTOR_SCOPE": '{"not": "a list"}'})
    assert bad.code == 3 and bad.out["refusal"] == "scope_invalid", bad.out
    assert os.path.exists(prompt)


# --- the repair loop ----------------------------------------------------------------------------


def visible_argv(name: str) -> str:
    """The task's verifier argv as --tests-argv (`{python}` is llm-edit's own interpreter)."""
    return json.dumps(task_doc(name)["verifier"]["argv"])


def wrong_then_right(item: str, skill: float = 0.5) -> int:
    """A simulator seed at which `sim-flash` answers `item` wrongly first and rightly second."""
    from harness.providers.sim_model import uniform

    for seed in range(1000):
        first, second = (uniform(seed, "sim-flash", item, n, "pass") for n in (0, 1))
        if first >= skill > second:
            return seed
    raise AssertionError("no such seed")


def proxied_requests(tmp_path: Path, url: str) -> tuple[Any, dict[str, str]]:
    """A metering proxy in front of the simulator (no allowance): its handle and the worker's environment."""
    from harness.meter.proxy import start_proxy

    proxy = start_proxy(url, tmp_path / "wire.jsonl", name="repair")
    return proxy, {"PROCTOR_SIM_URL": proxy.url}


def test_repair_turns_show_the_failures_until_the_tests_pass(
    task_setup: Callable[..., TaskSetup], sim_server: SimServer, tmp_path: Path
) -> None:
    from harness.meter.wire import read_wire

    item = f"task_id: {task_doc('intervals')['task_id']}"
    url = sim_server(systems=sim_systems(tmp_path / "half.json", {"sim-flash": 0.5}), seed=wrong_then_right(item))
    setup = task_setup("intervals")
    proxy, env = proxied_requests(tmp_path, url)
    with proxy:
        r = llm_edit(setup, "intervals", env, "--repair-turns", "3", "--tests-argv", visible_argv("intervals"))
    assert r.code == 0, r.out
    assert r.out["repair_turns"] == 3 and r.out["turns_used"] == 2 and r.out["visible_passed"] is True
    visible = [t["visible"] for t in r.out["turns"]]
    assert [v["passed"] for v in visible] == [False, True] and visible[0]["exit_code"] != 0
    assert all(len(v["output_sha256"]) == 64 for v in visible)
    assert (setup.workspace / MERGE).read_bytes() == (TASKS / "intervals" / "fix" / MERGE).read_bytes()
    # The tests ran on a copy: the workspace holds no bytecode, caches or anything else they wrote.
    assert not any(p.name in ("__pycache__", ".pytest_cache") for p in setup.workspace.rglob("*"))
    first, second = (json.loads(rec.request_body)["messages"][-1]["content"] for rec in read_wire(tmp_path / "wire.jsonl"))
    assert "<<<OUTPUT" not in first
    assert f"After your answer of turn 1 the visible tests exited {visible[0]['exit_code']}" in second
    assert "<<<OUTPUT\n" in second and "failed" in second.split("<<<OUTPUT", 1)[1]
    assert second.startswith(f"{item}\n")  # the task id again, the files as they are now
    assert [t["request_sha256"] for t in r.out["turns"]] == [
        hashlib.sha256(rec.request_body).hexdigest() for rec in read_wire(tmp_path / "wire.jsonl")]


def test_repair_turns_are_bounded_and_the_failure_shown_is_bounded(
    task_setup: Callable[..., TaskSetup], sim_server: SimServer, tmp_path: Path
) -> None:
    from harness.meter.wire import read_wire
    from harness.workers.llm_edit import MAX_FAILURE_BYTES

    url = sim_server(systems=sim_systems(tmp_path / "unskilled.json", {"sim-flash": 0.0}))
    setup = task_setup("intervals")
    proxy, env = proxied_requests(tmp_path, url)
    with proxy:
        r = llm_edit(setup, "intervals", env, "--repair-turns", "2", "--tests-argv", visible_argv("intervals"))
    assert r.code == 0 and r.out["turns_used"] == 3 and r.out["visible_passed"] is False, r.out
    assert [t["visible"]["passed"] for t in r.out["turns"]] == [False, False, False]
    records = read_wire(tmp_path / "wire.jsonl")
    assert len(records) == 3
    for rec in records[1:]:
        shown = json.loads(rec.request_body)["messages"][-1]["content"].split("<<<OUTPUT\n", 1)[1]
        assert len(shown.split("\n>>>OUTPUT", 1)[0].encode()) <= MAX_FAILURE_BYTES


def test_a_skilled_model_stops_after_the_first_turn(
    task_setup: Callable[..., TaskSetup], sim_server: SimServer, tmp_path: Path
) -> None:
    url = sim_server(systems=sim_systems(tmp_path / "skilled.json", {"sim-flash": 1.0}))
    setup = task_setup("wordfreq")
    r = llm_edit(setup, "wordfreq", {"PROCTOR_SIM_URL": url}, "--repair-turns", "4", "--tests-argv",
                 visible_argv("wordfreq"))
    assert r.code == 0 and r.out["turns_used"] == 1 and r.out["turns"][0]["visible"]["passed"] is True, r.out


@pytest.mark.parametrize("k", [1, 2, 3])
def test_a_run_that_hits_the_allowance_on_turn_k_sent_k_minus_1_requests(
    k: int, task_setup: Callable[..., TaskSetup], sim_server: SimServer, tmp_path: Path
) -> None:
    """The proxy holds the reserve for each request and settles at its metered cost; turn k's would cross."""
    from harness.meter.allowance import Allowance
    from harness.meter.pricing import load_pricing
    from harness.meter.proxy import start_proxy
    from harness.meter.wire import meter_wire, read_wire

    pricing = load_pricing(None)
    url = sim_server(systems=sim_systems(tmp_path / "unskilled.json", {"sim-flash": 0.0}))
    # The cost of each turn, measured through an unlimited proxy on a first copy of the task.
    calibration = tmp_path / "calibration"
    calibration.mkdir()
    first = task_setup("intervals")
    assert first.root == tmp_path
    with start_proxy(url, calibration / "wire.jsonl", name="cal", allowance=Allowance(10.0, pricing, 1.0)) as proxy:
        r = llm_edit(first, "intervals", {"PROCTOR_SIM_URL": proxy.url}, "--repair-turns", "3", "--tests-argv",
                     visible_argv("intervals"))
    assert r.code == 0 and r.out["turns_used"] == 4, r.out
    costs = [c for rec in read_wire(calibration / "wire.jsonl") if (c := meter_wire([rec], pricing).cost.total)]
    assert len(costs) == 4
    reserve = 1e-3
    # Turn j is sent when the turns before it and one reserve fit: room for turns 1..k-1, and half of
    # turn k-1's cost to spare (a later run's test output may differ by a token); for k = 1 not even one reserve.
    limit = reserve / 2 if k == 1 else reserve + sum(costs[: k - 2]) + costs[k - 2] / 2

    run = tmp_path / "run"
    run.mkdir()
    for made in ("task", "ws"):
        shutil.rmtree(tmp_path / made)
    setup = task_setup("intervals")
    with start_proxy(url, run / "wire.jsonl", name="run", allowance=Allowance(limit, pricing, reserve)) as proxy:
        r = llm_edit(setup, "intervals", {"PROCTOR_SIM_URL": proxy.url}, "--repair-turns", "3", "--tests-argv",
                     visible_argv("intervals"))
        summary = proxy.summary()
    assert r.code == 76 and r.out["error_code"] == "budget_stop" and r.out["ok"] is False, r.out
    assert r.out["turns_used"] == k and r.out["turns"][-1]["error_code"] == "budget_stop"
    assert r.out["turns"][-1]["visible"] is None
    records = read_wire(run / "wire.jsonl", "run")
    assert [rec.sent for rec in records] == [True] * (k - 1) + [False]
    assert records[-1].status == 402 and records[-1].error_code == "budget_stop"
    totals = meter_wire(records, pricing)
    assert totals.metered == k - 1 and totals.budget_stops == 1
    assert totals.cost.total is not None and totals.cost.total <= limit
    assert summary["budget_stops"] == 1 and summary["allowance"]["spent_usd"] == pytest.approx(totals.cost.total)


def test_repair_turns_refusals_exit_3_without_a_request(task_setup: Callable[..., TaskSetup]) -> None:
    setup = task_setup("intervals")
    with ProviderServer() as server:
        env = canned(server)
        no_tests = llm_edit(setup, "intervals", env, "--repair-turns", "1")
        shell = llm_edit(setup, "intervals", env, "--repair-turns", "1", "--tests-argv", '"pytest -q tests"')
        empty = llm_edit(setup, "intervals", env, "--repair-turns", "1", "--tests-argv", "[]")
        not_json = llm_edit(setup, "intervals", env, "--repair-turns", "1", "--tests-argv", "[pytest")
        negative = llm_edit(setup, "intervals", env, "--repair-turns", "-1", "--tests-argv", visible_argv("intervals"))
        too_many = llm_edit(setup, "intervals", env, "--repair-turns", "99", "--tests-argv", visible_argv("intervals"))
        assert server.received == []
    for r in (no_tests, shell, empty, not_json):
        assert r.code == 3 and r.out["refusal"] == "tests_argv_invalid", r.out
    for r in (negative, too_many):
        assert r.code == 3 and r.out["refusal"] == "repair_turns_invalid", r.out
