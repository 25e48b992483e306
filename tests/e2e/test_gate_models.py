"""The gated path with a model over real HTTP: dispatch --model through the metering proxy to the simulator.

Every test starts a real simulator (`sim_server`) with a systems file whose
skills make the outcome certain (1.0 answers with the task's fix, 0.0 with the
files as given) and points `PROCTOR_SIM_URL` at it; the bundled catalog's
models read their base URL from that variable, and dispatch points the
worker's copy of it at the metering proxy it starts in front of the simulator.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.evidence.chain_read import read_log, verify_log
from harness.evidence.jsonio import sha256_hex
from harness.meter.pricing import load_pricing
from harness.meter.proxy import start_proxy
from harness.meter.wire import WireLog, meter_wire, read_wire
from tests.support.cli import run_proctor
from tests.support.paths import REPO, TASKS
from tests.support.sim import SimServer, sim_systems
from tests.support.tasks import TaskSetup

BUNDLED_CATALOG = REPO / "harness" / "data" / "catalog.toml"
ALL_SKILLED = {"sim-flash": 1.0, "sim-glm": 1.0, "sim-k3": 1.0}
MERGE = "intervals/merge.py"


def events(setup: TaskSetup) -> list[dict[str, Any]]:
    """The task's journal, read and verified directly (`proctor journal` refuses once state was tampered with)."""
    (journal,) = (setup.root / ".runner-state").glob("*/journal.jsonl")
    return read_log(journal)


def start(setup: TaskSetup, sim_server: SimServer, skills: dict[str, float], **budget: int) -> dict[str, str]:
    """Start a simulator with these skills, init the task; the environment for dispatches."""
    url = sim_server(systems=sim_systems(setup.root / "systems.json", skills))
    if budget:
        setup.edit_task(lambda doc: doc["budget"].update(budget))
    r = run_proctor("init", *setup.words())
    assert r.code == 0, r.out
    return {"PROCTOR_SIM_URL": url}


def dispatch(setup: TaskSetup, env: dict[str, str], *words: str) -> dict[str, Any]:
    r = run_proctor("dispatch", *setup.words(), *words, env=env)
    assert r.code == 0, (r.out, Path(r.out.get("output_file", "/dev/null")).read_text())
    return r.out


def metered_directly(starts: list[dict[str, Any]]) -> tuple[float | None, dict[str, int]]:
    """Meter the dispatches' wire logs with the bundled pricing, without proctor record."""
    records = []
    for start_event in starts:
        records.extend(read_wire(start_event["wire_log"], start_event["wire_name"]))
    totals = meter_wire(records, load_pricing(None), {s["api_model"]: s["pricing_key"] for s in starts})
    return totals.cost.total, totals.tokens.to_json()


def test_a_model_dispatch_verifies_accepts_and_records_its_metered_cost(
    task_setup: Callable[..., TaskSetup], sim_server: SimServer
) -> None:
    setup = task_setup("intervals")
    env = start(setup, sim_server, ALL_SKILLED)
    d = dispatch(setup, env, "--model", "sim-k3")
    assert d["model"] == "sim-k3" and d["exit_code"] == 0 and d["lane"] == "flash"
    assert (setup.workspace / MERGE).read_bytes() == (TASKS / "intervals" / "fix" / MERGE).read_bytes()

    v = run_proctor("verify", *setup.words())
    assert v.code == 0 and v.out["passed"] is True, v.out
    a = run_proctor("accept", *setup.words())
    assert a.code == 0 and a.out["receipt_id"] == v.out["receipt_id"], a.out

    r = run_proctor("record", *setup.words())
    assert r.code == 0, r.out
    row = r.out
    assert row["metering"] == "wire" and row["wire_source"] == "journal" and row["cost_status"] == "metered"
    assert row["dispatches"]["models"] == ["sim-k3"] and row["exchanges"] == 1
    assert row["accept"]["state"] == "accepted" and row["receipt"]["passed"] is True
    assert set(row["tokens"]) == {"input", "cached_input", "cache_write", "output", "reasoning"}
    assert row["tokens"]["input"] > 0 and row["tokens"]["output"] > 0
    assert row["pricing"]["notional"] is True
    assert row["by_model"]["sim-k3"]["requests"] == 1

    journal = events(setup)
    starts = [e for e in journal if e["event"] == "dispatch_start"]
    assert starts[0]["metering"] == "proxy" and starts[0]["pricing_key"] == "sim-k3"
    cost, tokens = metered_directly(starts)
    assert cost is not None and cost > 0
    assert row["cost"] == cost and row["tokens"] == tokens
    # What the dispatch recorded is the proxy's own tally, and the file agrees with it.
    wire = next(e for e in journal if e["event"] == "dispatch_end")["wire"]
    assert wire["lines"] == wire["file_lines"] == wire["exchanges"] == 1
    assert wire["head"] == wire["file_head"] and len(wire["head"]) == 64
    assert wire["interleaved"] == 0 and wire["problem"] is None
    records = read_wire(starts[0]["wire_log"], starts[0]["wire_name"])
    assert [(x.via, x.model, x.status, x.model_snapshot) for x in records] == [("proxy", "sim-k3", 200, "sim-k3")]
    assert "task_id: intervals-touching-merge" in json.loads(records[0].request_body)["messages"][-1]["content"]


def test_auto_picks_the_cheapest_model_of_the_task_lane(
    task_setup: Callable[..., TaskSetup], sim_server: SimServer, tmp_path: Path
) -> None:
    # A second flash model, dearer (priced as sim-k3) and listed first: auto must still pick sim-flash.
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(
        """[[model]]
id = "sim-k3-as-flash"
api_model = "sim-k3"
provider = "sim"
api_shape = "openai_chat"
base_url = "http://127.0.0.1:8765/v1"
base_url_env = "PROCTOR_SIM_URL"
credential_env = ""
pricing_key = "sim-k3"
lane = "flash"

[model.worker]
argv = ["{python}", "-m", "harness", "worker", "llm-edit", "--model", "{model}", "--prompt-file", "{prompt_file}"]

"""
        + BUNDLED_CATALOG.read_text()
    )
    setup = task_setup("intervals")
    env = start(setup, sim_server, ALL_SKILLED)
    assert run_proctor("lane", "--task", str(setup.task)).out["lane"] == "flash"
    d = dispatch(setup, env, "--model", "auto", "--catalog", str(catalog))
    assert d["model"] == "sim-flash" and d["lane"] == "flash"
    start_event = next(e for e in events(setup) if e["event"] == "dispatch_start")
    choice = start_event["model_choice"]
    assert choice["mode"] == "auto" and choice["lane"] == "flash" and choice["excluded_providers"] == []
    assert [(c["id"], c["output_per_mtok"]) for c in choice["considered"]] == [
        ("sim-k3-as-flash", 15.0),
        ("sim-flash", 0.4),
    ]
    assert start_event["catalog"]["path"] == str(catalog)
    assert [r.model for r in read_wire(start_event["wire_log"], start_event["wire_name"])] == ["sim-flash"]
    assert run_proctor("verify", *setup.words()).code == 0


def test_stagnation_on_an_unskilled_model_switches_lane_with_evidence_and_the_next_lane_fixes_it(
    task_setup: Callable[..., TaskSetup], sim_server: SimServer
) -> None:
    setup = task_setup("intervals")
    env = start(setup, sim_server, {"sim-flash": 0.0, "sim-glm": 1.0, "sim-k3": 1.0}, max_dispatches=5)
    given = (setup.workspace / MERGE).read_bytes()
    fingerprints = []
    for n in range(3):
        d = dispatch(setup, env, "--model", "auto")
        assert (d["model"], d["lane"], d["lane_switch"]) == ("sim-flash", "flash", None), n
        assert (setup.workspace / MERGE).read_bytes() == given
        v = run_proctor("verify", *setup.words())
        assert v.code == 1 and v.out["passed"] is False, v.out
        fingerprints.append(v.out["fingerprint"])
    assert len(set(fingerprints)) == 1 and fingerprints[0]

    d = dispatch(setup, env, "--model", "auto")
    assert d["model"] == "sim-glm" and d["lane"] == "glm"
    switch = d["lane_switch"]
    assert (switch["from"], switch["to"]) == ("flash", "glm")
    assert switch["fingerprint"] == fingerprints[0] and "stagnation" in switch["reason"]

    journal = events(setup)
    kinds = [e["event"] for e in journal]
    at = kinds.index("lane_switch")
    assert kinds[at + 1] == "dispatch_start" and journal[at + 1]["model"] == "sim-glm"
    assert journal[at + 1]["evidence_file"] == switch["evidence_file"]
    evidence = Path(switch["evidence_file"])
    assert sha256_hex(evidence.read_bytes()) == journal[at]["evidence_sha256"]
    packet = json.loads(evidence.read_text())
    assert packet["schema"] == "proctor-evidence.v1" and packet["switch"] == {"from": "flash", "to": "glm"}
    assert [f["fingerprint"] for f in packet["fingerprints"]] == fingerprints
    # The model in the new lane got the evidence packet in its prompt, over the wire.
    starts = [e for e in journal if e["event"] == "dispatch_start"]
    sent = read_wire(starts[-1]["wire_log"], starts[-1]["wire_name"])[0].request_body
    assert "Evidence from earlier attempts" in json.loads(sent)["messages"][-1]["content"]

    assert (setup.workspace / MERGE).read_bytes() == (TASKS / "intervals" / "fix" / MERGE).read_bytes()
    v = run_proctor("verify", *setup.words())
    assert v.code == 0 and v.out["passed"] is True, v.out
    assert run_proctor("accept", *setup.words()).code == 0
    r = run_proctor("record", *setup.words())
    assert r.code == 0, r.out
    row = r.out
    assert row["lane"] == "glm" and row["initial_lane"] == "flash"
    assert [(s["from"], s["to"]) for s in row["lane_switches"]] == [("flash", "glm")]
    assert row["dispatches"]["models"] == ["sim-flash"] * 3 + ["sim-glm"]
    assert row["dispatches"]["lanes"] == ["flash"] * 3 + ["glm"]
    assert row["cost_status"] == "metered" and row["exchanges"] == 4
    cost, tokens = metered_directly(starts)
    assert row["cost"] == cost and row["tokens"] == tokens
    assert {m: v["requests"] for m, v in row["by_model"].items()} == {"sim-flash": 3, "sim-glm": 1}


# --- a worker that forges its own wire log ----------------------------------------------------------

# The worker calls the model through the metering proxy (PROCTOR_SIM_URL is the proxy), and then,
# by FORGE_MODE, writes correctly chained records of its own into the proxy's wire log, which it
# finds beside its prompt file in the dispatch folder (argv[1]). It runs with --sandbox none: in a
# bwrap sandbox the dispatch folder is not there (tests/e2e/test_sandbox_adversarial.py), and these
# tests are of the proctor's own check of the wire log, all that stands without a sandbox.
FORGER = r"""
import json, os, sys, time, urllib.request
from harness.meter.wire import WireLog

folder = os.path.dirname(sys.argv[1])
wire = os.path.join(folder, "wire.jsonl")
name = os.environ["PROCTOR_TASK_ID"] + "/" + os.environ["PROCTOR_DISPATCH_ID"]
mode = os.environ["FORGE_MODE"]


def call():
    body = json.dumps({"model": "sim-flash", "messages": [{"role": "user", "content": "Say hello."}]}).encode()
    request = urllib.request.Request(os.environ["PROCTOR_SIM_URL"] + "/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        reply.read()


def forge(path):
    now = time.time()
    request = json.dumps({"model": "sim-flash", "messages": [{"role": "user", "content": "hi"}]}).encode()
    response = json.dumps({
        "id": "chatcmpl-forged", "object": "chat.completion", "model": "sim-flash",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }).encode()
    WireLog(path, name).append_raw("openai_chat", "sim-flash", "http://127.0.0.1:9/v1/chat/completions",
                                   request, 200, response, now, now + 0.1)


def rewrite():
    # The same number of lines, every one forged (cheaper), swapped in whole.
    count = len(open(wire, "rb").read().splitlines())
    tmp = wire + ".forged"
    for _ in range(count):
        forge(tmp)
    os.replace(tmp, wire)


if mode == "precreate":
    forge(wire)
    call()
elif mode == "append":
    call()
    forge(wire)
elif mode == "rewrite":
    call()
    rewrite()
elif mode == "interleave":  # the first real line replaced, then a real exchange chained after it
    call()
    rewrite()
    call()
else:
    call()
    call()
print("worker done:", mode)
"""

FORGER_CATALOG = """[[model]]
id = "sim-forger"
api_model = "sim-flash"
provider = "sim"
api_shape = "openai_chat"
base_url = "http://127.0.0.1:8765/v1"
base_url_env = "PROCTOR_SIM_URL"
credential_env = ""
pricing_key = "sim-flash"
lane = "flash"

[model.worker]
argv = ["{python}", SCRIPT, "{prompt_file}"]
"""


def forger(tmp_path: Path) -> Path:
    script = tmp_path / "forger.py"
    script.write_text(FORGER)
    catalog = tmp_path / "forger-catalog.toml"
    catalog.write_text(FORGER_CATALOG.replace("SCRIPT", json.dumps(str(script))))
    return catalog


def test_an_honest_worker_passes_the_wire_check(
    task_setup: Callable[..., TaskSetup], sim_server: SimServer, tmp_path: Path
) -> None:
    catalog = forger(tmp_path)
    setup = task_setup("intervals")
    env = {**start(setup, sim_server, ALL_SKILLED), "FORGE_MODE": "honest"}
    d = dispatch(setup, env, "--model", "sim-forger", "--catalog", str(catalog), "--sandbox", "none")
    wire = next(e for e in events(setup) if e["event"] == "dispatch_end")["wire"]
    assert (wire["lines"], wire["file_lines"], wire["interleaved"]) == (2, 2, 0)
    assert wire["head"] == wire["file_head"]
    r = run_proctor("record", *setup.words(), "--catalog", str(catalog))
    assert r.code == 0 and r.out["exchanges"] == 2 and r.out["cost_status"] == "metered", r.out
    assert r.out["wire_logs"][0]["path"] == d["wire_log"]


@pytest.mark.parametrize("mode", ["append", "rewrite", "interleave", "precreate"])
def test_a_worker_that_forges_its_wire_log_is_refused(
    mode: str, task_setup: Callable[..., TaskSetup], sim_server: SimServer, tmp_path: Path
) -> None:
    catalog = forger(tmp_path)
    setup = task_setup("intervals")
    env = {**start(setup, sim_server, ALL_SKILLED), "FORGE_MODE": mode}
    r = run_proctor("dispatch", *setup.words(), "--model", "sim-forger", "--catalog", str(catalog), "--sandbox", "none",
                    env=env)
    assert r.code == 3 and r.out["refusal"] == "state_tampered", r.out
    journal = events(setup)
    start_event = next(e for e in journal if e["event"] == "dispatch_start")
    wire_log = start_event["wire_log"]
    assert r.out["path"] == wire_log and r.out["paths"] == [wire_log]
    assert wire_log in r.out["message"] and "not what the metering proxy wrote" in r.out["message"]
    end = next(e for e in journal if e["event"] == "dispatch_end")
    assert end["exit_code"] == 0  # the worker itself "succeeded"
    wire = end["wire"]
    proxy_lines = 2 if mode == "interleave" else 1
    assert wire["lines"] == wire["exchanges"] == proxy_lines
    if mode == "interleave":
        # Same line count and the same last line as the proxy's: only the chain between them differs.
        assert (wire["file_lines"], wire["file_head"]) == (wire["lines"], wire["head"])
        assert wire["interleaved"] == 1
    else:
        assert (wire["file_lines"], wire["file_head"]) != (wire["lines"], wire["head"])
    tampered = [e for e in journal if e["event"] == "state_tampered"]
    assert len(tampered) == 1 and tampered[0]["paths"] == [wire_log] and tampered[0]["wire_log"]

    # The forged log is never metered: every later gated command refuses.
    rec = run_proctor("record", *setup.words(), "--catalog", str(catalog))
    assert rec.code == 3 and rec.out["refusal"] == "state_tampered", rec.out
    assert run_proctor("verify", *setup.words()).out["refusal"] == "state_tampered"


def test_a_wire_log_rewritten_after_its_dispatch_is_refused_by_record(
    task_setup: Callable[..., TaskSetup], sim_server: SimServer, tmp_path: Path
) -> None:
    catalog = forger(tmp_path)
    setup = task_setup("intervals")
    env = {**start(setup, sim_server, ALL_SKILLED), "FORGE_MODE": "honest"}
    d = dispatch(setup, env, "--model", "sim-forger", "--catalog", str(catalog), "--sandbox", "none")
    wire_log = Path(d["wire_log"])
    name = next(e for e in events(setup) if e["event"] == "dispatch_start")["wire_name"]
    honest = wire_log.read_bytes()
    # Rewrite the log as a valid chain of the same length, every exchange made cheaper.
    cheap = json.dumps({
        "id": "chatcmpl-forged", "object": "chat.completion", "model": "sim-flash",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }).encode()
    forged = tmp_path / "forged.jsonl"
    log = WireLog(forged, name)
    for x in (json.loads(line) for line in honest.splitlines()):
        log.append_raw(x["api_shape"], x["model"], x["url"], b"{}", 200, cheap, x["started"], x["ended"])
    assert len(forged.read_bytes().splitlines()) == len(honest.splitlines()) == 2
    wire_log.write_bytes(forged.read_bytes())
    r = run_proctor("record", *setup.words(), "--catalog", str(catalog))
    assert r.code == 3 and r.out["refusal"] == "wire_log_tampered", r.out
    assert r.out["path"] == str(wire_log) and r.out["lines"] == 2 and r.out["expected_lines"] == 2
    assert r.out["head"] != r.out["expected_head"]
    wire_log.write_bytes(honest)
    assert run_proctor("record", *setup.words(), "--catalog", str(catalog)).code == 0


def test_the_proxy_keeps_its_own_tally_of_what_it_wrote(sim_server: SimServer, tmp_path: Path) -> None:
    """`ProxyHandle.wire_lines/wire_head/wire_interleaved`: counted in memory, not read back from the file."""
    url = sim_server(systems=sim_systems(tmp_path / "systems.json", ALL_SKILLED))
    out = tmp_path / "wire.jsonl"
    earlier = WireLog(out, "tally")  # a log that already holds a line: the proxy continues it honestly
    cheap = json.dumps({"id": "x", "object": "chat.completion", "model": "sim-flash", "choices": [],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
    earlier.append_raw("openai_chat", "sim-flash", url + "/chat/completions", b"{}", 200, cheap, 1.0, 2.0)
    body = {"model": "sim-flash", "messages": [{"role": "user", "content": "Say hello."}]}
    with start_proxy(url, out, name="tally") as proxy:
        assert (proxy.wire_lines, proxy.wire_head, proxy.wire_interleaved) == (0, None, 0)
        assert httpx.post(proxy.url + "/chat/completions", json=body, timeout=30).status_code == 200
        status = verify_log(out)
        assert (proxy.wire_lines, proxy.wire_head, proxy.wire_interleaved) == (1, status.head, 0)
        earlier.append_raw("openai_chat", "sim-flash", url + "/chat/completions", b"{}", 200, cheap, 3.0, 4.0)
        assert httpx.post(proxy.url + "/chat/completions", json=body, timeout=30).status_code == 200
        status = verify_log(out)
        assert status.ok and status.lines == 4
        assert (proxy.wire_lines, proxy.wire_head, proxy.wire_interleaved) == (2, status.head, 1)
        summary = proxy.summary()
    assert (summary["wire_lines"], summary["wire_head"], summary["wire_interleaved"]) == (2, status.head, 1)
