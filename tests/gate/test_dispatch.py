"""`dispatch` with an arm's worker and an allowance: the worker in its bwrap sandbox, its model reached only
through the metering proxy (a real simulator over loopback), the proxy stopping what would cross the allowance.

The agent command worker is a real script (tests/support/agent_script.py) that calls the proxy's base URL
with httpx over the sandbox's proxy socket and edits files; llm-edit runs its repair loop in the same sandbox.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.errors import Refusal
from harness.evidence.chain_read import read_log
from harness.gate.dispatch import dispatch
from harness.meter.allowance import Allowance
from harness.meter.pricing import load_pricing
from harness.meter.wire import meter_wire, read_wire
from harness.workers.arm import ArmWorker
from tests.support.cli import run_proctor
from tests.support.paths import AGENT, TASKS
from tests.support.sim import SimServer, sim_systems
from tests.support.tasks import TaskSetup

MERGE = "intervals/merge.py"
PRICING = load_pricing(None)


def agent(*extra: str) -> ArmWorker:
    return ArmWorker("command", ("{python}", str(AGENT), "--prompt-file", "{prompt_file}", "--model", "{model}",
                                 "--base-url", "{base_url}", *extra))  # fmt: skip


def ready(setup: TaskSetup, sim_server: SimServer, skill: float, monkeypatch: pytest.MonkeyPatch) -> None:
    url = sim_server(systems=sim_systems(setup.root / "systems.json", {"sim-flash": skill}))
    monkeypatch.setenv("PROCTOR_SIM_URL", url)
    r = run_proctor("init", *setup.words())
    assert r.code == 0, r.out


def journal(setup: TaskSetup) -> list[dict[str, Any]]:
    (path,) = (setup.root / ".runner-state").glob("*/journal.jsonl")
    return read_log(path)


def test_an_agent_command_edits_through_the_proxy_in_its_sandbox(
    task_setup: Callable[..., TaskSetup], sim_server: SimServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    setup = task_setup("intervals")
    ready(setup, sim_server, 1.0, monkeypatch)
    d = dispatch(str(setup.workspace), str(setup.task), model="sim-flash", sandbox="bwrap", worker=agent())
    out = Path(d.output_file).read_text()
    assert d.succeeded and d.budget_stop is False, out
    assert json.loads(out.strip().splitlines()[-1]) == {"budget_stop": False, "requests": 1, "written": [MERGE]}
    assert (setup.workspace / MERGE).read_bytes() == (TASKS / "intervals" / "fix" / MERGE).read_bytes()
    start = next(e for e in journal(setup) if e["event"] == "dispatch_start")
    # The template was filled with the prompt file and the base URL as the worker sees them, in its sandbox.
    assert start["argv"] == [sys.executable, str(AGENT), "--prompt-file", "/run/proctor/prompt.md", "--model",
                             "sim-flash", "--base-url", "http://localhost/v1"]
    assert start["worker"] == agent().to_json() and start["sandbox"]["kind"] == "bwrap"
    assert d.to_json()["worker"]["kind"] == "command"
    (rec,) = read_wire(start["wire_log"], start["wire_name"])
    assert rec.sent and rec.status == 200
    v = run_proctor("verify", *setup.words())
    assert v.code == 0 and v.out["passed"] is True, v.out


def test_an_agent_stopped_by_the_allowance_ends_budget_stop_and_record_meters_it(
    task_setup: Callable[..., TaskSetup], sim_server: SimServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    setup = task_setup("intervals")
    ready(setup, sim_server, 0.0, monkeypatch)
    reserve = 1e-3
    allowance = Allowance(1.5 * reserve, PRICING, reserve)  # one request at the reserve; its cost is far less
    d = dispatch(str(setup.workspace), str(setup.task), model="sim-flash", sandbox="bwrap",
                 worker=agent("--turns", "5"), allowance=allowance)  # fmt: skip
    out = Path(d.output_file).read_text()
    assert d.process.exit_code == 76 and d.budget_stop is True and d.to_json()["budget_stop"] is True, out
    requests = json.loads(out.strip().splitlines()[-1])["requests"]
    start = next(e for e in journal(setup) if e["event"] == "dispatch_start")
    end = next(e for e in journal(setup) if e["event"] == "dispatch_end")
    assert start["allowance"]["limit_usd"] == allowance.limit_usd
    assert end["wire"]["budget_stops"] == 1 and end["wire"]["allowance"]["budget_stops"] == 1
    records = read_wire(start["wire_log"], start["wire_name"])
    assert [r.sent for r in records] == [True] * (requests - 1) + [False]
    totals = meter_wire(records, PRICING)
    assert totals.cost.total is not None and totals.cost.total <= allowance.limit_usd and totals.budget_stops == 1
    assert end["wire"]["allowance"]["spent_usd"] == totals.cost.total
    # proctor record checks the log against the proxy's tally and meters it: the stop is $0.
    r = run_proctor("record", *setup.words())
    assert r.code == 0, r.out


def test_llm_edit_repairs_with_the_visible_tests_inside_its_sandbox(
    task_setup: Callable[..., TaskSetup], sim_server: SimServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    setup = task_setup("wordfreq")
    ready(setup, sim_server, 0.0, monkeypatch)
    d = dispatch(str(setup.workspace), str(setup.task), model="sim-flash", sandbox="bwrap",
                 worker=ArmWorker("llm-edit", repair_turns=1))  # fmt: skip
    out = Path(d.output_file).read_text()
    assert d.succeeded, out
    # llm-edit's outcome, as its text output says it: two turns, the visible tests failing after each.
    assert "turns_used: 2\n" in out and "visible_passed: no\n" in out and out.count("passed: no\n") == 3, out
    start = next(e for e in journal(setup) if e["event"] == "dispatch_start")
    assert start["argv"][-2:] == ["--repair-turns", "1"] and "PROCTOR_TESTS_ARGV" in start["sandbox"]["env"]
    assert len(read_wire(start["wire_log"], start["wire_name"])) == 2
    # The visible tests ran on a copy: verify finds only the scope's file rewritten (no scope violation).
    v = run_proctor("verify", *setup.words())
    assert v.code == 1 and v.out["passed"] is False, v.out


def test_an_arm_worker_or_an_allowance_needs_a_model(task_setup: Callable[..., TaskSetup]) -> None:
    setup = task_setup("intervals")
    assert run_proctor("init", *setup.words()).code == 0
    for kwargs, code in (
        ({"worker": ArmWorker("llm-edit")}, "arm_worker_invalid"),
        ({"allowance": Allowance(1.0, PRICING, 0.1)}, "allowance_invalid"),
    ):
        with pytest.raises(Refusal) as caught:
            dispatch(str(setup.workspace), str(setup.task), [sys.executable, "-c", "pass"], sandbox="none", **kwargs)
        assert caught.value.code == code
