"""Issue 13 item 9: a paid run waits for the go (`proctor prereg go`), the simulator needs none.

A loopback HTTP server that counts requests stands in for a paid provider (catalog provider
`openai-compatible`); the runner must send it nothing until the stage has a go for the current freeze.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.analysis.study import analyze_study
from harness.audit.report import build_report
from harness.errors import Code, Refusal
from harness.evidence.chain import ChainedLog
from harness.evidence.chain_read import read_log
from harness.prereg.freeze import amend, freeze
from harness.prereg.frozen import check_frozen
from harness.prereg.go import give_go, go_seed
from harness.run.runner import run_stage
from tests.support.cli import run_proctor
from tests.support.design import write_design
from tests.support.paths import HUMANEVAL
from tests.support.provider_server import ProviderServer
from tests.support.study import PACKET_SHA, Sim, prereg, system, urls

CATALOG = """
[[model]]
id = "paid-a"
provider = "openai-compatible"
api_shape = "openai_chat"
base_url = "https://paid.example/v1"
credential_env = ""
pricing_key = "paid-price"
lane = "flash"

[[model]]
id = "paid-b"
provider = "openai-compatible"
api_shape = "openai_chat"
base_url = "https://paid.example/v1"
credential_env = ""
pricing_key = "paid-price"
lane = "flash"
"""

PRICING = """models:
  paid-price:
    input_per_mtok: 0.05
    output_per_mtok: 0.50
    reasoning: billed_as_output
    source: "a test price"
"""

REPLY = {"id": "x", "object": "chat.completion", "created": 1, "model": "paid-a",
         "choices": [{"index": 0, "finish_reason": "stop",
                      "message": {"role": "assistant", "content": "```python\ndef f():\n    return 1\n```"}}],
         "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}

# the stage's budget as `prereg go` shows it: caps, ceiling, and (from `prereg check`'s arithmetic) the
# expected and worst case of this stage (2 items at the reserve 0.01; no reruns or retries registered)
BUDGET = {"stage": "A", "caps_usd": {"a": 1.0, "b": 2.0}, "ceiling_usd": 3.2, "spend_before_usd": 0.0,
          "expected_usd": {"a": 0.02, "b": 0.02}, "worst_usd": {"a": 0.02, "b": 0.02}, "worst_total_usd": 0.04}


def paid_prereg(root: Path) -> Path:
    design = {
        "study": {"id": "paid", "seed": 3, "title": "a paid study"},
        "suite": {"name": "humaneval", "packet": str(HUMANEVAL / "packet.jsonl"), "packet_sha256": PACKET_SHA},
        "draw": {"items": 2},
        "systems": [
            {"slot": "a", "provider": "openai-compatible", "model": "paid-a", "setting": "default",
             "pricing_key": "paid-price", "cap_usd": 1.0},
            {"slot": "b", "provider": "openai-compatible", "model": "paid-b", "setting": "default",
             "pricing_key": "paid-price", "cap_usd": 2.0},
        ],
        "arms": [{"id": "direct", "template": "Complete this function in one ```python block.\n\n{prompt}"}],
        "stages": [{"id": "A", "systems": ["a", "b"], "arms": ["direct"], "items": 2, "repeats": 1}],
        "budgets": {"reserve_per_item_usd": 0.01, "overall_cap_usd": 3.0, "ceiling_margin_usd": 0.2,
                    "spend_before_usd": 0.0},
        "run": {"lanes_per_system": 1, "attempt_deadline_s": 20, "reruns": 0, "transport_retries": 0,
                "max_output_tokens": 64, "full_repeats": 1},
        "analysis": {"alpha": 0.05, "power": 0.8, "test": "paired_tost", "clustering": "item",
                     "comparisons": [{"a": "a", "b": "b", "arm": "direct", "margin": 0.1,
                                      "expected_a": 0.6, "expected_b": 0.65, "correlation": 0.5}]},
    }
    folder = root / "prereg" / "paid"
    folder.mkdir(parents=True)
    write_design(folder, design, "# a paid study\n\nRegistered before running.\n")
    (folder / "catalog.toml").write_text(CATALOG)
    (folder / "pricing.yaml").write_text(PRICING)
    freeze(folder)
    return folder


def test_a_paid_run_is_refused_go_required_with_no_request_sent_then_runs_after_the_go(tmp_path: Path) -> None:
    folder = paid_prereg(tmp_path)
    with ProviderServer() as server:
        server.serve(200, {"Content-Type": "application/json"}, json.dumps(REPLY).encode())
        base = {"paid-a": server.url + "/v1", "paid-b": server.url + "/v1"}
        with pytest.raises(Refusal) as got:
            run_stage(folder, "A", tmp_path / "results", base_urls=base)
        assert got.value.code == Code.GO_REQUIRED
        assert got.value.path == str(folder / "GO.jsonl")
        assert server.received == []
        assert not (tmp_path / "results" / "paid" / "A").exists()  # refused before any write
        pre = run_stage(folder, "A", tmp_path / "results", base_urls=base, preflight=True)
        assert [p for p in pre.problems if p["check"] == "go"], pre.to_json()
        assert server.received == []
        # a dry run sends nothing, so it needs no go
        assert run_stage(folder, "A", tmp_path / "results", base_urls=base, dry_run=True).mode == "dry_run"
        # a go for another stage does not count
        with pytest.raises(Refusal) as unknown:
            give_go(folder, "B", "Ada")
        assert unknown.value.code == Code.UNKNOWN_STAGE
        give_go(folder, "A", "Ada Lovelace", "budget read")
        summary = run_stage(folder, "A", tmp_path / "results", base_urls=base)
        assert len(server.received) >= 4, summary.to_json()  # 2 items x 2 systems
        # the go is listed in the report's summary and the analysis's provenance
        report = build_report(tmp_path / "results" / "paid" / "A", prereg_dir=folder)
        assert [(g["go"], g["by"], g["note"]) for g in report.summary["gos"]] == [(1, "Ada Lovelace", "budget read")]
        provenance = analyze_study(tmp_path / "results", prereg=folder).provenance.to_dicts()
        assert [row["lines"] for row in provenance if row["name"] == "prereg:GO.jsonl"] == [1]
        # an amendment is a new freeze: the go given before it no longer counts
        amend(folder, "a deviation", note=True)
        with pytest.raises(Refusal) as again:
            run_stage(folder, "A", tmp_path / "results2", base_urls=base)
        assert again.value.code == Code.GO_REQUIRED


def test_the_simulator_needs_no_go(tmp_path: Path, sim: Sim) -> None:
    url = sim([system("sim-flash", 1.0), system("sim-glm", 0.0)])
    folder = prereg(tmp_path, items=2)
    summary = run_stage(folder, "A", tmp_path / "results", base_urls=urls(url))
    assert summary.exit_code == 0, summary.to_json()
    assert not (folder / "GO.jsonl").exists()


def test_the_go_is_chained_dated_and_shows_the_budget_first(tmp_path: Path) -> None:
    folder = paid_prereg(tmp_path)
    shown: list[dict[str, object]] = []
    first = give_go(folder, "A", "Ada", show=shown.append)
    assert shown == [BUDGET]
    second = give_go(folder, "A", "Grace", "second look")
    lines = read_log(folder / "GO.jsonl", go_seed("paid"))  # verifies the chain
    assert [line["go"] for line in lines] == [1, 2]
    assert [line["by"] for line in lines] == ["Ada", "Grace"] and lines[1]["note"] == "second look"
    assert lines[0]["frozen_sha256"] == first["go"]["frozen_sha256"] == second["go"]["frozen_sha256"]
    assert lines[0]["at"] <= lines[1]["at"] and lines[0]["caps_usd"] == {"a": 1.0, "b": 2.0}
    # the go log is not part of the freeze: the folder still checks as frozen and unchanged
    assert check_frozen(folder).frozen_sha256 == first["go"]["frozen_sha256"]
    with pytest.raises(Refusal) as nobody:
        give_go(folder, "A", "  ")
    assert nobody.value.code == Code.GO_BY_EMPTY


def test_a_go_is_refused_on_an_unfrozen_prereg(tmp_path: Path) -> None:
    folder = paid_prereg(tmp_path)
    (folder / "FROZEN.json").unlink()
    with pytest.raises(Refusal) as got:
        give_go(folder, "A", "Ada")
    assert got.value.code == Code.PREREG_NOT_FROZEN
    assert not (folder / "GO.jsonl").exists()


def test_an_edited_go_log_is_refused(tmp_path: Path) -> None:
    folder = paid_prereg(tmp_path)
    give_go(folder, "A", "Ada")
    give_go(folder, "A", "Grace")
    path = folder / "GO.jsonl"
    path.write_text(path.read_text().replace("Ada", "Eve"))  # the second line's prev no longer matches
    with ProviderServer() as server:
        with pytest.raises(Refusal) as got:
            run_stage(folder, "A", tmp_path / "results", base_urls={"paid-a": server.url, "paid-b": server.url})
        assert server.received == []
    assert got.value.code == Code.LOG_BROKEN and got.value.path == str(path)


def test_proctor_prereg_go_shows_the_budget_and_records_the_go(tmp_path: Path) -> None:
    folder = paid_prereg(tmp_path)
    got = run_proctor("prereg", "go", str(folder), "--stage", "A", "--by", "Ada", "--note", "read the budget")
    assert got.code == 0, got.stderr
    assert got.out["budget"] == BUDGET
    assert got.out["go"]["go"] == 1 and got.out["go"]["by"] == "Ada"
    refused = run_proctor("prereg", "go", str(folder), "--stage", "nope", "--by", "Ada")
    assert refused.code != 0 and refused.out["refusal"] == Code.UNKNOWN_STAGE
    assert len(read_log(folder / "GO.jsonl", go_seed("paid"))) == 1


def test_a_go_line_that_is_not_a_go_is_refused_go_invalid(tmp_path: Path) -> None:
    folder = paid_prereg(tmp_path)
    first = give_go(folder, "A", "Ada")["go"]
    line = {k: v for k, v in first.items() if k not in ("line_sha256", "by")} | {"go": 2}  # no `by`
    ChainedLog(folder / "GO.jsonl", go_seed("paid")).append(line)
    with pytest.raises(Refusal) as got:
        give_go(folder, "A", "Grace")
    assert got.value.code == Code.GO_INVALID and "line 2" in got.value.message and "by" in got.value.message
