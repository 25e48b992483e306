"""An arm's worker (`ArmWorker`): llm-edit with repair turns, or an agent command template, refused by name."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from harness.errors import Refusal
from harness.workers.arm import MAX_REPAIR_TURNS, ArmWorker


def refusal_of(doc: Any) -> str:
    with pytest.raises(Refusal) as caught:
        ArmWorker.from_json(doc)
    return str(caught.value.code)


def test_llm_edit_renders_its_own_argv_with_the_repair_turns() -> None:
    worker = ArmWorker.from_json({"kind": "llm-edit", "repair_turns": 2})
    assert worker == ArmWorker("llm-edit", (), 2) and ArmWorker.from_json("llm-edit") == ArmWorker("llm-edit")
    argv = worker.render(model="sim-flash", prompt_file="/run/proctor/prompt.md", base_url="http://localhost/v1",
                         python=sys.executable, workspace="/ws")
    assert argv == [sys.executable, "-m", "harness", "worker", "llm-edit", "--model", "sim-flash", "--prompt-file",
                    "/run/proctor/prompt.md", "--workspace", "/ws", "--repair-turns", "2"]
    assert ArmWorker.from_json(worker.to_json()) == worker


def test_a_command_template_fills_every_placeholder_once() -> None:
    worker = ArmWorker.from_json({"kind": "command", "template": [
        "{python}", "agent.py", "--prompt-file={prompt_file}", "--model", "{model}", "--base-url", "{base_url}",
        "--in", "{workspace}"]})
    argv = worker.render(model="{base_url}", prompt_file="p.md", base_url="http://localhost/v1", python="py",
                         workspace="/ws")
    # A filled value that looks like a placeholder is left alone (one pass).
    assert argv == ["py", "agent.py", "--prompt-file=p.md", "--model", "{base_url}", "--base-url",
                    "http://localhost/v1", "--in", "/ws"]
    assert ArmWorker.from_json(worker.to_json()) == worker


@pytest.mark.parametrize(("doc", "code"), [
    ({"kind": "command", "template": "python agent.py {prompt_file}"}, "agent_template_shell_string"),
    ({"kind": "command", "template": ["python agent.py", "{prompt_file}"]}, "agent_template_shell_string"),
    ({"kind": "command", "template": ["agent", "{prompt_file}", "|", "tee", "log.txt"]}, "agent_template_shell_syntax"),
    ({"kind": "command", "template": ["agent", "{prompt_file}", "&&", "echo", "done"]}, "agent_template_shell_syntax"),
    ({"kind": "command", "template": ["agent", "{prompt_file}", ">", "out.txt"]}, "agent_template_shell_syntax"),
    ({"kind": "command", "template": ["agent", "{prompt_file}", "2>&1"]}, "agent_template_shell_syntax"),
    ({"kind": "command", "template": ["agent", "{prompt_file}", ";", "rm", "x"]}, "agent_template_shell_syntax"),
    ({"kind": "command", "template": ["agent", "--key=$OPENAI_API_KEY"]}, "agent_template_shell_syntax"),
    ({"kind": "command", "template": ["agent", "--in", "$(pwd)"]}, "agent_template_shell_syntax"),
    ({"kind": "command", "template": ["agent", "--home", "${HOME}/x"]}, "agent_template_shell_syntax"),
    ({"kind": "command", "template": ["agent", "--in", "`pwd`"]}, "agent_template_shell_syntax"),
    ({"kind": "command", "template": ["sh", "-c", "agent {prompt_file}"]}, "agent_template_shell_syntax"),
    ({"kind": "command", "template": ["/bin/bash", "-lc", "agent {prompt_file}"]}, "agent_template_shell_syntax"),
    ({"kind": "command", "template": []}, "agent_template_empty"),
    ({"kind": "command"}, "agent_template_empty"),
    ({"kind": "command", "template": ["agent", "{prompt}"]}, "agent_template_placeholder_unknown"),
    ({"kind": "command", "template": ["agent", "{ model }"]}, "agent_template_placeholder_unknown"),
    ({"kind": "command", "template": ["agent", "{}"]}, "agent_template_placeholder_unknown"),
    ({"kind": "command", "template": ["agent", 3]}, "agent_template_invalid"),
    ({"kind": "command", "template": ["agent", ""]}, "agent_template_invalid"),
    ({"kind": "command", "template": ["agent"], "repair_turns": 1}, "arm_worker_invalid"),
    ({"kind": "aider"}, "arm_worker_unknown"),
    ("claude-code", "arm_worker_unknown"),
    ("command", "arm_worker_unknown"),
    ({"kind": "llm-edit", "template": ["x"]}, "arm_worker_invalid"),
    ({"kind": "llm-edit", "turns": 1}, "arm_worker_invalid"),
    ({"template": ["agent"]}, "arm_worker_invalid"),
    ({"kind": "llm-edit", "repair_turns": -1}, "repair_turns_invalid"),
    ({"kind": "llm-edit", "repair_turns": MAX_REPAIR_TURNS + 1}, "repair_turns_invalid"),
    ({"kind": "llm-edit", "repair_turns": True}, "repair_turns_invalid"),
    ({"kind": "llm-edit", "repair_turns": 1.0}, "repair_turns_invalid"),
    (["llm-edit"], "arm_worker_invalid"),
])
def test_bad_workers_are_refused_by_name(doc: Any, code: str) -> None:
    assert refusal_of(doc) == code


def test_arguments_that_only_look_like_shell_syntax_are_kept() -> None:
    # Inside one argument these are data (a URL's query, a regex, a price), not shell syntax.
    template = ["agent", "--url", "http://h/v1?a=1&b=2", "--re", "a|b$", "--note", "costs $5 (approx.)", "{model}"]
    assert ArmWorker.from_json({"kind": "command", "template": template}).template == tuple(template)
    assert ArmWorker.from_json({"kind": "command", "template": ["sh", "run_agent.sh", "{prompt_file}"]}).template


def test_the_constructor_refuses_as_strictly_as_from_json() -> None:
    with pytest.raises(Refusal) as caught:
        ArmWorker("command", ("sh -c", "x"))
    assert caught.value.code == "agent_template_shell_string"
    with pytest.raises(Refusal) as caught:
        ArmWorker("command", "agent {model}")  # type: ignore[arg-type]
    assert caught.value.code == "agent_template_shell_string"
