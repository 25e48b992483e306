"""The simulator: pure decisions, the systems and answers files, and a real server over HTTP."""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.errors import Refusal
from harness.providers.edit_format import parse_files
from harness.providers.sim import (
    BUNDLED_SYSTEMS,
    build_service,
    load_answers,
    load_systems,
    load_task_answers,
)
from harness.providers.sim_model import (
    GENERIC_ANSWER,
    Failures,
    Item,
    Latency,
    SimService,
    SimSystem,
    decide,
    find_item,
    merge_items,
    text_tokens,
    uniform,
)
from tests.support.cli import run_proctor
from tests.support.paths import REPO, TASKS


def system(skill: float = 0.5, **kw: Any) -> SimSystem:
    return SimSystem(
        name=kw.pop("name", "s"),
        skill=skill,
        latency=kw.pop("latency", Latency("fixed", 0.0)),
        output_tokens_mean=kw.pop("output_tokens_mean", 50),
        snapshot=kw.pop("snapshot", "s-1"),
        failures=kw.pop("failures", Failures()),
    )


ITEM = Item("question 7", "42", ("41", "43", "7"))


# --- pure decisions --------------------------------------------------------------------


def test_uniform_is_a_pure_hash_in_unit_interval() -> None:
    a = uniform(1, "s", "k", 0, "pass")
    assert a == uniform(1, "s", "k", 0, "pass")
    draws = {uniform(1, "s", "k", 0, stream) for stream in ("pass", "latency", "tokens", "wrong", "failure")}
    assert len(draws) == 5
    assert len({uniform(seed, "s", "k", 0, "pass") for seed in range(50)}) == 50
    assert all(0.0 <= uniform(0, "s", f"k{i}", i, "x") < 1.0 for i in range(1000))


def test_decide_is_deterministic() -> None:
    sys_ = system(0.5, latency=Latency("lognormal", 1.0, 0.5))
    first = [decide(sys_, seed=3, item=ITEM, item_key=f"i{i}", n=0) for i in range(200)]
    again = [decide(sys_, seed=3, item=ITEM, item_key=f"i{i}", n=0) for i in range(200)]
    other = [decide(sys_, seed=4, item=ITEM, item_key=f"i{i}", n=0) for i in range(200)]
    assert first == again
    assert [d.outcome for d in first] != [d.outcome for d in other]
    assert len({d.request_hash for d in first}) == 200


@pytest.mark.parametrize("skill", [0.0, 0.1, 0.45, 0.7, 0.92, 1.0])
@pytest.mark.parametrize("seed", [0, 1, 20261130])
def test_pass_frequency_converges_to_skill(skill: float, seed: int) -> None:
    sys_ = system(skill)
    n = 2000
    passes = sum(decide(sys_, seed=seed, item=ITEM, item_key=f"item-{i}", n=0).outcome == "correct" for i in range(n))
    # sd of the frequency is at most 0.0112; 0.04 is 3.5 sd
    assert abs(passes / n - skill) < 0.04
    if skill in (0.0, 1.0):
        assert passes == skill * n


def test_nth_request_changes_outcomes_across_repeats() -> None:
    sys_ = system(0.5)
    items = [f"item-{i}" for i in range(400)]
    first = [decide(sys_, seed=0, item=ITEM, item_key=k, n=0).outcome for k in items]
    second = [decide(sys_, seed=0, item=ITEM, item_key=k, n=1).outcome for k in items]
    changed = sum(a != b for a, b in zip(first, second, strict=True))
    assert 0.35 < changed / len(items) < 0.65  # independent draws at p=0.5 differ half the time
    repeats = [decide(sys_, seed=0, item=ITEM, item_key="one", n=k).outcome for k in range(2000)]
    assert abs(repeats.count("correct") / 2000 - 0.5) < 0.04


def test_wrong_answers_are_drawn_among_wrong() -> None:
    sys_ = system(0.0)
    picked = [decide(sys_, seed=0, item=ITEM, item_key=f"k{i}", n=0).content for i in range(300)]
    assert set(picked) == set(ITEM.wrong)


def test_latency_draws() -> None:
    fixed = system(latency=Latency("fixed", 0.25))
    assert {decide(fixed, seed=0, item=None, item_key=f"k{i}", n=0).latency_s for i in range(50)} == {0.25}
    logn = system(latency=Latency("lognormal", 0.8, 0.4))
    draws = [decide(logn, seed=0, item=None, item_key=f"k{i}", n=0).latency_s for i in range(4001)]
    assert abs(statistics.median(draws) / 0.8 - 1) < 0.05
    assert abs(statistics.stdev([math.log(d) for d in draws]) / 0.4 - 1) < 0.05


def test_generic_answer_length_follows_output_tokens() -> None:
    sys_ = system(output_tokens_mean=200)
    answers = [decide(sys_, seed=0, item=None, item_key=f"k{i}", n=0) for i in range(1000)]
    assert all(a.outcome == "generic" and a.content and a.content.startswith(GENERIC_ANSWER) for a in answers)
    tokens = [text_tokens(a.content or "") for a in answers]
    assert abs(statistics.fmean(tokens) / 200 - 1) < 0.05
    assert min(tokens) >= 100 and max(tokens) <= 300


def test_planted_failure_rates() -> None:
    sys_ = system(1.0, failures=Failures(rate_limited=0.1, server_error=0.2, timeout=0.05))
    outcomes = [decide(sys_, seed=0, item=ITEM, item_key=f"k{i}", n=0).outcome for i in range(4000)]
    for name, p in (
        ("rate_limited", 0.1),
        ("server_error", 0.2),
        ("timeout", 0.05),
        ("correct", 0.65),
    ):
        assert abs(outcomes.count(name) / 4000 - p) < 0.025, name


def test_longest_match_wins() -> None:
    items = merge_items([Item("task_id: foo", "a", ("x",)), Item("task_id: foo-bar", "b", ("y",))])
    found = find_item(items, "please\ntask_id: foo-bar\n")
    assert found is not None and found.answer == "b"
    found = find_item(items, "task_id: foo\n")
    assert found is not None and found.answer == "a"
    assert find_item(items, "nothing") is None
    with pytest.raises(Refusal) as info:
        merge_items(items, [Item("task_id: foo", "c", ("z",))])
    assert info.value.code == "sim_answers_duplicate_match"


# --- files ----------------------------------------------------------------------------


def test_bundled_systems_load() -> None:
    systems = load_systems(BUNDLED_SYSTEMS)
    assert list(systems) == ["sim-flash", "sim-glm", "sim-k3"]
    assert systems["sim-flash"].skill < systems["sim-glm"].skill < systems["sim-k3"].skill
    assert systems["sim-flash"].latency.median < systems["sim-k3"].latency.median


def test_answers_file(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_text('{"match": "Q1", "answer": "4", "wrong": ["5"]}\n{"match": "Q2", "answer": "x"}\n')
    items = load_answers(path)
    assert items[1].wrong == (GENERIC_ANSWER,)
    for text, code, line in (
        (
            '{"match": "Q1", "answer": "4"}\n{"match": "Q1", "answer": "5"}\n',
            "sim_answers_duplicate_match",
            2,
        ),
        (
            '{"match": "Q1", "answer": "4"}\n{"match": "Q2", "answer": "4", "answer": "5"}\n',
            "json_duplicate_key",
            2,
        ),
        ('{"match": "Q1", "answer": "4", "wrong": ["4"]}\n', "sim_answers_invalid", 1),
        ('{"match": "", "answer": "4"}\n', "sim_answers_invalid", 1),
        ('{"match": "Q", "answer": "4", "extra": 1}\n', "sim_answers_invalid", 1),
        ("\n", "invalid_json", 1),
        ('["Q1"]\n', "json_not_object", 1),
    ):
        path.write_text(text)
        with pytest.raises(Refusal) as info:
            load_answers(path)
        assert (info.value.code, info.value.path) == (code, str(path))
        assert info.value.message.startswith(f"line {line}:")


def test_task_answers_are_file_blocks_for_the_scope() -> None:
    items = {item.match: item for item in load_task_answers(TASKS)}
    task = json.loads((TASKS / "iniconf" / "task.json").read_text())
    item = items[f"task_id: {task['task_id']}"]
    answer, wrong = parse_files(item.answer), parse_files(item.wrong[0])
    assert sorted(answer) == sorted(wrong) == sorted(task["scope"])
    for rel in task["scope"]:
        assert answer[rel] == (TASKS / "iniconf" / "fix" / rel).read_text()
        assert wrong[rel] == (TASKS / "iniconf" / "workspace" / rel).read_text()


def test_service_usage_and_truncation() -> None:
    service = SimService({"s": system(1.0)}, [Item("Q1", "x" * 100, ("y",))], clock=lambda: 1234.9)
    prompt = "é" * 5 + " Q1"  # 13 UTF-8 bytes -> 4 tokens
    body = {"model": "s", "messages": [{"role": "user", "content": prompt}]}
    reply = service.complete(json.dumps(body).encode())
    assert reply.status == 200 and reply.payload["created"] == 1234
    assert reply.payload["usage"]["prompt_tokens"] == 4
    assert reply.payload["usage"]["completion_tokens"] == 25
    reply = service.complete(json.dumps({**body, "max_tokens": 10}).encode())
    choice = reply.payload["choices"][0]
    assert (choice["finish_reason"], choice["message"]["content"]) == ("length", "x" * 40)
    assert reply.payload["usage"]["completion_tokens"] == 10


def test_latency_scale_env_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROCTOR_SIM_LATENCY_SCALE", "nan")
    with pytest.raises(Refusal) as info:
        build_service()
    assert info.value.code == "sim_latency_scale_invalid"
    monkeypatch.setenv("PROCTOR_SIM_LATENCY_SCALE", "0.5")
    assert build_service().latency_scale == 0.5


# --- a real server ----------------------------------------------------------------------


class Sim:
    """A `proctor sim serve` subprocess and its base URL."""

    def __init__(self, proc: subprocess.Popen[str], url: str) -> None:
        self.proc, self.url = proc, url

    def chat(self, client: httpx.Client, model: str, content: str, **extra: Any) -> httpx.Response:
        body = {"model": model, "messages": [{"role": "user", "content": content}], **extra}
        return client.post(f"{self.url}/chat/completions", json=body)


def write_systems(path: Path, systems: list[dict[str, Any]]) -> Path:
    path.write_text(json.dumps({"systems": systems}))
    return path


def fixed(name: str, skill: float, latency: float = 0.0, **kw: Any) -> dict[str, Any]:
    return {"name": name, "skill": skill, "latency_s": {"dist": "fixed", "value": latency}, **kw}


@pytest.fixture
def start_sim(tmp_path: Path) -> Iterator[Callable[..., Sim]]:
    procs: list[subprocess.Popen[str]] = []

    def start(*words: str, scale: str = "0") -> Sim:
        ready = tmp_path / f"ready-{len(procs)}.json"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PROCTOR_")}
        env["PROCTOR_SIM_LATENCY_SCALE"] = scale
        argv = [
            sys.executable,
            "-m",
            "harness",
            "sim",
            "serve",
            "--port",
            "0",
            "--ready-file",
            str(ready),
            *words,
        ]
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(proc)
        deadline = time.monotonic() + 20
        while not ready.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the simulator did not get ready"
            time.sleep(0.02)
        info = json.loads(ready.read_text())
        assert info["pid"] == proc.pid
        return Sim(proc, info["url"])

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
        proc.communicate(timeout=10)


def test_server_answers_in_openai_shape(tmp_path: Path, start_sim: Callable[..., Sim]) -> None:
    systems = write_systems(tmp_path / "s.json", [fixed("good", 1.0, snapshot="good-2026"), fixed("bad", 0.0)])
    answers = tmp_path / "a.jsonl"
    answers.write_text('{"match": "What is 6*7?", "answer": "42", "wrong": ["41"]}\n')
    sim = start_sim("--systems", str(systems), "--answers", str(answers))
    with httpx.Client() as client:
        models = client.get(f"{sim.url}/models").json()
        assert [m["id"] for m in models["data"]] == ["good", "bad"]
        prompt = "Answer briefly. What is 6*7?"
        reply = sim.chat(client, "good", prompt)
        assert reply.status_code == 200
        assert reply.headers["x-proctor-provider"] == "sim"
        body = reply.json()
        assert set(body) == {
            "id",
            "object",
            "created",
            "model",
            "system_fingerprint",
            "choices",
            "usage",
        }
        assert body["id"].startswith("chatcmpl-sim-") and reply.headers["x-request-id"]
        assert (body["object"], body["model"], body["system_fingerprint"]) == (
            "chat.completion",
            "good-2026",
            "proctor-sim",
        )
        assert abs(body["created"] - time.time()) < 60
        choice = body["choices"][0]
        assert (choice["message"]["content"], choice["finish_reason"]) == ("42", "stop")
        assert body["usage"] == {
            "prompt_tokens": 7,  # 28 bytes
            "completion_tokens": 1,
            "total_tokens": 8,
            "prompt_tokens_details": {"cached_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0},
        }
        assert sim.chat(client, "bad", prompt).json()["choices"][0]["message"]["content"] == "41"
        unknown = sim.chat(client, "good", "something else").json()
        assert unknown["choices"][0]["message"]["content"].startswith(GENERIC_ANSWER)


def test_server_is_deterministic_from_its_seed(tmp_path: Path, start_sim: Callable[..., Sim]) -> None:
    systems = write_systems(tmp_path / "s.json", [fixed("half", 0.5)])
    answers = tmp_path / "a.jsonl"
    answers.write_text(
        "".join(json.dumps({"match": f"Q{i}.", "answer": "yes", "wrong": ["no"]}) + "\n" for i in range(20))
    )

    def run(seed: str) -> list[tuple[str, str]]:
        sim = start_sim("--systems", str(systems), "--answers", str(answers), "--seed", seed)
        with httpx.Client() as client:
            bodies = [sim.chat(client, "half", f"Q{i % 20}.").json() for i in range(60)]
        return [(b["id"], b["choices"][0]["message"]["content"]) for b in bodies]

    first, again, other = run("5"), run("5"), run("6")
    assert first == again != other
    assert {c for _, c in first} == {"yes", "no"}


def test_server_answers_tasks_with_file_blocks(tmp_path: Path, start_sim: Callable[..., Sim]) -> None:
    systems = write_systems(tmp_path / "s.json", [fixed("good", 1.0), fixed("bad", 0.0)])
    sim = start_sim("--systems", str(systems), "--tasks", str(TASKS))
    task = json.loads((TASKS / "bizdays" / "task.json").read_text())
    prompt = f"task_id: {task['task_id']}\n\n{task['prompt']}"
    with httpx.Client() as client:
        good = parse_files(sim.chat(client, "good", prompt).json()["choices"][0]["message"]["content"])
        bad = parse_files(sim.chat(client, "bad", prompt).json()["choices"][0]["message"]["content"])
    assert sorted(good) == sorted(bad) == task["scope"]
    rel = task["scope"][0]
    assert good[rel] == (TASKS / "bizdays" / "fix" / rel).read_text()
    assert bad[rel] == (TASKS / "bizdays" / "workspace" / rel).read_text()


def test_server_errors_in_openai_shape(tmp_path: Path, start_sim: Callable[..., Sim]) -> None:
    systems = write_systems(
        tmp_path / "s.json",
        [
            fixed("ok", 1.0),
            fixed("busy", 1.0, failures={"rate_limited": 1.0}),
            fixed("down", 1.0, failures={"server_error": 1.0}),
        ],
    )
    sim = start_sim("--systems", str(systems))
    url = f"{sim.url}/chat/completions"
    with httpx.Client() as client:
        reply = sim.chat(client, "gpt-nothing", "hi")
        assert reply.status_code == 404
        assert reply.json()["error"]["code"] == "model_not_found"
        assert reply.json()["error"]["type"] == "invalid_request_error"
        for content in (
            b"{not json",
            b"[1, 2]",
            b'{"model": "ok"}',
            b'{"model": "ok", "messages": []}',
            b'{"model": "ok", "messages": [1]}',
        ):
            reply = client.post(url, content=content, headers={"content-type": "application/json"})
            assert reply.status_code == 400, content
            assert set(reply.json()["error"]) == {"message", "type", "param", "code"}
        assert sim.chat(client, "ok", "hi", stream=True).status_code == 400
        assert sim.chat(client, "ok", "hi", max_tokens=True).status_code == 400
        reply = sim.chat(client, "busy", "hi")
        assert (reply.status_code, reply.json()["error"]["code"]) == (429, "rate_limit_exceeded")
        reply = sim.chat(client, "down", "hi")
        assert (reply.status_code, reply.json()["error"]["type"]) == (500, "server_error")
        assert client.get(f"{sim.url}/nowhere").status_code == 404
        assert sim.chat(client, "ok", "hi").status_code == 200  # the connection survived the errors


def test_planted_timeout_outlasts_the_client(tmp_path: Path, start_sim: Callable[..., Sim]) -> None:
    systems = write_systems(tmp_path / "s.json", [fixed("stuck", 1.0, failures={"timeout": 1.0})])
    sim = start_sim("--systems", str(systems))
    with httpx.Client(timeout=0.3) as client, pytest.raises(httpx.ReadTimeout):
        sim.chat(client, "stuck", "hi")
    started = time.monotonic()
    sim.proc.send_signal(signal.SIGTERM)  # a request still asleep in the server does not hold it up
    _, err = sim.proc.communicate(timeout=10)
    # well before the stuck request's 30 s sleep ends (a bound for a loaded machine, not a timing claim)
    assert (sim.proc.returncode, time.monotonic() - started < 5.0) == (0, True), err


def test_sigterm_stops_the_server_promptly(start_sim: Callable[..., Sim]) -> None:
    sim = start_sim("--json")
    started = time.monotonic()
    sim.proc.send_signal(signal.SIGTERM)
    out, err = sim.proc.communicate(timeout=10)
    assert time.monotonic() - started < 5.0  # no request or poll holds it (a bound for a loaded machine)
    assert sim.proc.returncode == 0, err
    assert "Traceback" not in err
    lines = out.strip().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["url"] == sim.url


def test_concurrent_requests_overlap(tmp_path: Path, start_sim: Callable[..., Sim]) -> None:
    systems = write_systems(tmp_path / "s.json", [fixed("slow", 1.0, latency=0.2)])
    sim = start_sim("--systems", str(systems), scale="1")
    count = 64

    async def drive() -> float:
        limits = httpx.Limits(max_connections=count, max_keepalive_connections=count)
        async with httpx.AsyncClient(limits=limits, timeout=30) as client:
            body = {"model": "slow", "messages": [{"role": "user", "content": "hi"}]}
            started = time.perf_counter()
            replies = await asyncio.gather(
                *(client.post(f"{sim.url}/chat/completions", json=body) for _ in range(count))
            )
            elapsed = time.perf_counter() - started
        assert all(r.status_code == 200 for r in replies)
        return elapsed

    elapsed = asyncio.run(drive())
    assert elapsed < 0.5 * count * 0.2, elapsed


# --- refusals through the CLI ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "code"),
    [
        (None, "file_missing"),
        ('{"systems": [], "systems": []}', "json_duplicate_key"),
        (json.dumps({"systems": [fixed("a", 1.5)]}), "sim_systems_invalid"),
        (json.dumps({"systems": [fixed("a", -0.1)]}), "sim_systems_invalid"),
        (json.dumps({"systems": [fixed("a", True)]}), "sim_systems_invalid"),
        (
            '{"systems": [{"name": "a", "skill": 1' + "0" * 400 + ', "latency_s": {"dist": "fixed", "value": 0}}]}',
            "sim_systems_invalid",
        ),
        (json.dumps({"systems": [fixed("a", "0.5")]}), "sim_systems_invalid"),
        (json.dumps({"systems": [fixed("a", 0.5, colour="red")]}), "sim_systems_invalid"),
        (json.dumps({"systems": [fixed("a", 0.5)], "extra": 1}), "sim_systems_invalid"),
        (json.dumps({"systems": [fixed("a", 0.5), fixed("a", 0.6)]}), "sim_system_duplicate_name"),
        (
            json.dumps({"systems": [{"name": "a", "skill": 0.5, "latency_s": {"dist": "gamma"}}]}),
            "sim_systems_invalid",
        ),
        (
            json.dumps({"systems": [fixed("a", 0.5, failures={"timeout": 0.7, "server_error": 0.7})]}),
            "sim_systems_invalid",
        ),
        (json.dumps({"systems": []}), "sim_systems_invalid"),
        ("[]", "json_not_object"),
    ],
)
def test_systems_file_refusals(tmp_path: Path, text: str | None, code: str) -> None:
    path = tmp_path / "systems.json"
    if text is not None:
        path.write_text(text)
    done = run_proctor("sim", "serve", "--port", "0", "--systems", str(path), timeout=30)
    assert (done.code, done.out["refusal"], done.out["path"]) == (3, code, str(path)), done.out


def test_non_loopback_host_and_bad_tasks_are_refused(tmp_path: Path) -> None:
    done = run_proctor("sim", "serve", "--port", "0", "--host", "0.0.0.0", timeout=30)
    assert (done.code, done.out["refusal"]) == (3, "sim_host_not_loopback")
    done = run_proctor("sim", "serve", "--port", "0", "--tasks", str(tmp_path), timeout=30)
    assert (done.code, done.out["refusal"], done.out["path"]) == (
        3,
        "sim_tasks_empty",
        str(tmp_path),
    )
    done = run_proctor("sim", "serve", "--port", "0", "--answers", str(tmp_path / "none.jsonl"), timeout=30)
    assert (done.code, done.out["refusal"]) == (3, "file_missing")


def test_human_refusal_has_no_traceback(tmp_path: Path) -> None:
    argv = [
        sys.executable,
        "-m",
        "harness",
        "sim",
        "serve",
        "--port",
        "0",
        "--systems",
        str(tmp_path / "x.json"),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=30, check=False)
    assert done.returncode == 3
    assert "refused: file_missing" in done.stderr and "Traceback" not in done.stderr


# --- operator and malformed planted failures (auth, quota, malformed) --------------------


def test_planted_operator_and_malformed_failure_rates() -> None:
    sys_ = system(1.0, failures=Failures(rate_limited=0.1, auth=0.1, quota=0.15, malformed=0.2))
    outcomes = [decide(sys_, seed=0, item=ITEM, item_key=f"k{i}", n=0).outcome for i in range(4000)]
    for name, p in (("rate_limited", 0.1), ("auth", 0.1), ("quota", 0.15), ("malformed", 0.2), ("correct", 0.45)):
        assert abs(outcomes.count(name) / 4000 - p) < 0.025, name
    again = [decide(sys_, seed=0, item=ITEM, item_key=f"k{i}", n=0).outcome for i in range(4000)]
    assert again == outcomes  # hash-derived: the same draws give the same outcomes


def test_new_kinds_leave_the_old_draws_unchanged() -> None:
    old = system(1.0, failures=Failures(rate_limited=0.1, server_error=0.2, timeout=0.05))
    new = system(1.0, failures=Failures(rate_limited=0.1, server_error=0.2, timeout=0.05, auth=0.0, malformed=0.0))
    for i in range(500):
        assert decide(old, seed=3, item=ITEM, item_key=f"k{i}", n=0) == decide(new, seed=3, item=ITEM,
                                                                                item_key=f"k{i}", n=0)


@pytest.mark.parametrize(("kind", "status", "code"), [
    ("auth", 401, "auth"), ("quota", 429, "quota"), ("malformed", 200, "malformed_response"),
    ("context_length", 400, "context_length"),
])
def test_planted_operator_and_malformed_replies_classify(kind: str, status: int, code: str) -> None:
    from harness.providers.openai_chat import OpenAIChat

    service = SimService({"s": system(1.0, failures=Failures(**{kind: 1.0}))}, [ITEM])
    body = json.dumps({"model": "s", "messages": [{"role": "user", "content": "question 7"}]}).encode()
    reply = service.complete(body)
    assert reply.status == status
    if kind == "auth":
        assert reply.payload == {"error": {"message": "Incorrect API key provided", "type": "invalid_request_error",
                                           "param": None, "code": "invalid_api_key"}}
    elif kind == "quota":
        assert (reply.payload["error"]["type"], reply.payload["error"]["code"]) == ("insufficient_quota",) * 2
    elif kind == "context_length":
        assert reply.payload["error"]["code"] == "context_length_exceeded"
        assert "maximum context length" in reply.payload["error"]["message"]
    else:
        assert "choices" not in reply.payload and reply.payload["object"] == "chat.completion"
    parsed = OpenAIChat().parse_response(reply.status, dict(reply.headers), json.dumps(reply.payload).encode())
    assert parsed.error_code == code, parsed


def test_operator_and_malformed_failures_over_http(tmp_path: Path, start_sim: Callable[..., Sim]) -> None:
    systems = write_systems(tmp_path / "s.json", [
        fixed("locked", 1.0, failures={"auth": 1.0}),
        fixed("broke", 1.0, failures={"quota": 1.0}),
        fixed("garbled", 1.0, failures={"malformed": 1.0}),
    ])
    sim = start_sim("--systems", str(systems))
    with httpx.Client() as client:
        reply = sim.chat(client, "locked", "hi")
        assert (reply.status_code, reply.json()["error"]["code"]) == (401, "invalid_api_key")
        reply = sim.chat(client, "broke", "hi")
        assert (reply.status_code, reply.json()["error"]["code"]) == (429, "insufficient_quota")
        reply = sim.chat(client, "garbled", "hi")
        assert reply.status_code == 200 and "choices" not in reply.json()
        assert reply.headers["x-proctor-provider"] == "sim"


@pytest.mark.parametrize("failures", [
    {"auth": 0.6, "malformed": 0.6},
    {"quota": -0.1},
    {"malformed": "0.5"},
    {"billing": 0.1},
])
def test_systems_file_refuses_bad_new_failure_kinds(tmp_path: Path, failures: dict[str, Any]) -> None:
    from harness.providers.sim_model import parse_systems

    with pytest.raises(Refusal) as info:
        parse_systems({"systems": [fixed("a", 0.5, failures=failures)]}, "x.json")
    assert info.value.code == "sim_systems_invalid"
    ok = parse_systems({"systems": [fixed("a", 0.5, failures={"auth": 0.2, "quota": 0.3, "malformed": 0.5})]}, "x")
    assert ok["a"].failures == Failures(auth=0.2, quota=0.3, malformed=0.5)
