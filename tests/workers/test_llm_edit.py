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
