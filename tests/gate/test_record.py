"""`proctor record`: the append-only task record, and how each row was metered."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.evidence.chain_read import verify_log
from harness.meter.pricing import BUNDLED_PRICING
from harness.meter.wire import WireLog
from tests.support.cli import run_proctor
from tests.support.paths import REPO
from tests.support.tasks import TaskSetup

SECRET = "sk-planted-record-51f0aa"


def chat_response(model: str, prompt_tokens: int | None, completion_tokens: int) -> bytes:
    body: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    }
    if prompt_tokens is not None:
        body["usage"] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
    return json.dumps(body).encode()


def write_wire(path: Path, exchanges: list[tuple[str, int | None, int]]) -> Path:
    log = WireLog(path, "test")
    for model, prompt_tokens, completion_tokens in exchanges:
        request = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]}).encode()
        log.append_raw(
            "openai_chat", model, "http://127.0.0.1:9/v1/chat/completions", request, 200,
            chat_response(model, prompt_tokens, completion_tokens), 1.0, 2.0,
        )
    return path


def init(setup: TaskSetup) -> None:
    r = run_proctor("init", *setup.words())
    assert r.code == 0, r.out


def fixed_and_accepted(setup: TaskSetup) -> None:
    init(setup)
    assert run_proctor("dispatch", *setup.words(), "--command", "--", *setup.worker()).code == 0
    assert run_proctor("verify", *setup.words()).code == 0
    assert run_proctor("accept", *setup.words()).code == 0


def test_a_dispatched_task_without_a_wire_log_is_a_flat_rate_record(task_setup: Callable[..., TaskSetup]) -> None:
    setup = task_setup("intervals")
    fixed_and_accepted(setup)
    r = run_proctor("record", *setup.words())
    assert r.code == 0, r.out
    row = r.out
    assert row["schema"] == "proctor-task-record.v1" and row["task_id"] == "intervals-touching-merge"
    assert row["metering"] == "flat_rate" and row["cost"] is None and row["cost_status"] == "flat_rate"
    assert "flat-rate" in row["note"] and row["tokens"] is None
    assert row["usage_unknown"] == 0 and row["price_unknown"] == 0
    assert row["lane"] == "flash" and row["lane_switches"] == []
    assert row["dispatches"]["count"] == 1 and row["dispatches"]["models"] == [None]
    assert row["receipt"]["passed"] is True and row["receipt"]["receipt_id"] == "r0001"
    assert len(row["receipt"]["sha256"]) == 64 and len(row["receipt"]["tree"]) == 64
    assert row["accept"]["state"] == "accepted" and row["accept"]["receipt_id"] == "r0001"

    again = run_proctor("record", *setup.words())
    assert again.code == 0 and again.out["line"] == 2 and again.out["record_path"] == row["record_path"]
    state = os.path.basename(os.path.dirname(row["record_path"]))
    status = verify_log(row["record_path"], f"proctor-task-record:intervals-touching-merge:{state}")
    assert status.ok and status.lines == 2
    events = run_proctor("journal", "--workspace", str(setup.workspace)).out["events"]
    assert [e["line"] for e in events if e["event"] == "record"] == [1, 2]


def test_pricing_without_a_wire_log_is_refused(task_setup: Callable[..., TaskSetup]) -> None:
    setup = task_setup("intervals")
    init(setup)
    assert run_proctor("dispatch", *setup.words(), "--command", "--", *setup.worker()).code == 0
    r = run_proctor("record", *setup.words(), "--pricing", str(BUNDLED_PRICING))
    assert r.code == 3 and r.out["refusal"] == "pricing_without_wire", r.out
    assert not os.path.exists(os.path.join(run_proctor("status", "--workspace", str(setup.workspace)).out["state_dir"],
                                           "task-record.jsonl"))


def test_a_task_with_no_dispatch_costs_nothing(task_setup: Callable[..., TaskSetup]) -> None:
    setup = task_setup("intervals")
    init(setup)
    r = run_proctor("record", *setup.words(), "--pricing", str(BUNDLED_PRICING))
    assert r.code == 0, r.out
    assert r.out["metering"] == "none" and r.out["cost"] == 0.0 and r.out["cost_status"] == "no_dispatch"
    assert r.out["receipt"] is None and r.out["accept"]["state"] == "not_accepted"


def test_a_record_metered_from_given_wire_logs(task_setup: Callable[..., TaskSetup], tmp_path: Path) -> None:
    setup = task_setup("intervals")
    init(setup)
    assert run_proctor("dispatch", *setup.words(), "--command", "--", *setup.worker()).code == 0
    wire = write_wire(tmp_path / "wire.jsonl", [("sim-flash", 1000, 500), ("sim-k3", 2000, 100)])
    r = run_proctor("record", *setup.words(), "--wire", str(wire), "--pricing", str(BUNDLED_PRICING))
    assert r.code == 0, r.out
    row = r.out
    assert row["metering"] == "wire" and row["wire_source"] == "flag" and row["cost_status"] == "metered"
    assert row["tokens"] == {"input": 3000, "cached_input": 0, "cache_write": 0, "output": 600, "reasoning": 0}
    expected = 1000 * 0.10 / 1e6 + 500 * 0.40 / 1e6 + 2000 * 3.00 / 1e6 + 100 * 15.00 / 1e6
    assert row["cost"] == pytest.approx(expected, rel=1e-12)
    assert row["usage_unknown"] == 0 and row["price_unknown"] == 0 and row["exchanges"] == 2
    assert row["wire_logs"][0]["lines"] == 2

    unknown = write_wire(tmp_path / "unknown.jsonl", [("sim-flash", None, 0), ("no-such-model", 10, 10)])
    r = run_proctor("record", *setup.words(), "--wire", str(wire), "--wire", str(unknown))
    assert r.code == 0, r.out
    assert r.out["cost"] is None and r.out["cost_status"] == "usage_unknown"
    assert r.out["usage_unknown"] == 1 and r.out["price_unknown"] == 1
    assert r.out["known_cost"] == pytest.approx(expected, rel=1e-12)

    broken = tmp_path / "broken.jsonl"
    broken.write_bytes((tmp_path / "wire.jsonl").read_bytes().replace(b"1000", b"1001", 1))
    r = run_proctor("record", *setup.words(), "--wire", str(broken))
    assert r.code == 3 and r.out["refusal"] in ("wire_log_broken", "wire_record_invalid"), r.out
    r = run_proctor("record", *setup.words(), "--wire", str(tmp_path / "absent.jsonl"))
    assert r.code == 3 and r.out["refusal"] == "file_missing", r.out


# --- the gated path against the simulator, through the metering proxy ------------------------------

# A model worker that calls its model itself: over the metering proxy's Unix socket in a bwrap
# sandbox (PROCTOR_PROXY_SOCKET), else over loopback TCP.
CALLER = r"""
import http.client, json, os, socket, sys
from urllib.parse import urlsplit
base = urlsplit(os.environ["OPENAI_BASE_URL"])
body = json.dumps({"model": sys.argv[1], "messages": [{"role": "user", "content": "Say hello."}]}).encode()
headers = {"Content-Type": "application/json", "Authorization": "Bearer " + os.environ["SIM_KEY"]}
socket_path = os.environ.get("PROCTOR_PROXY_SOCKET")


class UnixConnection(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(socket_path)


conn = UnixConnection("localhost", timeout=30) if socket_path else http.client.HTTPConnection(
    base.hostname, base.port, timeout=30)
conn.request("POST", base.path + "/chat/completions", body, headers)
print(json.loads(conn.getresponse().read())["usage"])
"""


def caller_catalog(tmp_path: Path) -> Path:
    """The bundled catalog with CALLER as every model's worker, and SIM_KEY as the credential it is given."""
    script = tmp_path / "caller.py"
    script.write_text(CALLER)
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(
        (REPO / "harness" / "data" / "catalog.toml").read_text().replace(
            '["{python}", "-m", "harness", "worker", "llm-edit", "--model", "{model}", "--prompt-file", "{prompt_file}"]',
            f'["{{python}}", {json.dumps(str(script))}, "{{model}}"]\nbase_url_var = "OPENAI_BASE_URL"',
        ).replace('credential_env = ""', 'credential_env = "SIM_KEY"')
    )
    return catalog


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[str]:
    """A `proctor sim serve` subprocess with no latency; yields its base URL."""
    ready = tmp_path / "sim-ready.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROCTOR_")}
    env["PROCTOR_SIM_LATENCY_SCALE"] = "0"
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", "sim", "serve", "--port", "0", "--ready-file", str(ready)],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while not ready.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the simulator did not get ready"
            time.sleep(0.02)
        yield str(json.loads(ready.read_text())["url"])
    finally:
        proc.terminate()
        proc.communicate(timeout=10)


def test_dispatch_model_through_the_proxy_is_metered_by_record(
    task_setup: Callable[..., TaskSetup], tmp_path: Path, sim: str
) -> None:
    catalog = caller_catalog(tmp_path)
    setup = task_setup("intervals")
    init(setup)
    env = {"PROCTOR_SIM_URL": sim, "SIM_KEY": SECRET}
    for model in ("sim-flash", "auto"):
        d = run_proctor("dispatch", *setup.words(), "--model", model, "--catalog", str(catalog), env=env)
        assert d.code == 0, (d.out, Path(d.out.get("output_file", "/dev/null")).read_text())
        assert d.out["model"] == "sim-flash"
    r = run_proctor("record", *setup.words(), "--catalog", str(catalog))
    assert r.code == 0, r.out
    row = r.out
    assert row["metering"] == "wire" and row["wire_source"] == "journal"
    assert row["dispatches"]["models"] == ["sim-flash", "sim-flash"]
    assert [w["lines"] for w in row["wire_logs"]] == [1, 1]
    assert row["exchanges"] == 2 and row["cost_status"] == "metered" and row["cost"] > 0
    assert row["tokens"]["input"] > 0 and row["tokens"]["output"] > 0
    assert row["by_model"]["sim-flash"]["requests"] == 2
    status = run_proctor("status", "--workspace", str(setup.workspace)).out
    assert status["measurement_degraded"]["degraded"] is False
    # No credential in anything proctor wrote.
    for path in Path(status["state_dir"]).rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path

    # A wire log changed after its dispatch ended is refused, not metered.
    wire = Path(row["wire_logs"][0]["path"])
    wire.write_bytes(wire.read_bytes() + wire.read_bytes().splitlines(keepends=True)[0])
    r = run_proctor("record", *setup.words(), "--catalog", str(catalog))
    assert r.code == 3 and r.out["refusal"] in ("wire_log_broken", "wire_log_tampered"), r.out


def test_a_mix_of_metered_and_flat_rate_dispatches_is_partial(
    task_setup: Callable[..., TaskSetup], tmp_path: Path, sim: str
) -> None:
    catalog = caller_catalog(tmp_path)
    setup = task_setup("intervals")
    init(setup)
    env = {"PROCTOR_SIM_URL": sim, "SIM_KEY": "x"}
    assert run_proctor("dispatch", *setup.words(), "--model", "sim-glm", "--catalog", str(catalog), env=env).code == 0
    assert run_proctor("dispatch", *setup.words(), "--command", "--", *setup.worker()).code == 0
    r = run_proctor("record", *setup.words(), "--catalog", str(catalog))
    assert r.code == 0, r.out
    assert r.out["metering"] == "wire" and r.out["cost"] is None and r.out["cost_status"] == "partial"
    assert r.out["known_cost"] > 0 and len(r.out["unmetered_dispatch_ids"]) == 1


def test_record_prices_from_the_installed_table_by_default(task_setup: Callable[..., TaskSetup], tmp_path: Path) -> None:
    """Issue 14, class 8: no --pricing: the bundled table, named by its place in the checkout (never a
    machine path, issue 13 item 7), its sha256 in the row."""
    setup = task_setup("intervals")
    init(setup)
    assert run_proctor("dispatch", *setup.words(), "--command", "--", *setup.worker()).code == 0
    wire = write_wire(tmp_path / "wire.jsonl", [("sim-flash", 1000, 500)])
    r = run_proctor("record", *setup.words(), "--wire", str(wire))
    assert r.code == 0, r.out
    assert r.out["pricing"]["path"] == "<repo>/harness/data/pricing.yaml"
    assert (REPO / "harness" / "data" / "pricing.yaml").samefile(BUNDLED_PRICING)
    assert r.out["pricing"]["sha256"] == hashlib.sha256(BUNDLED_PRICING.read_bytes()).hexdigest()
