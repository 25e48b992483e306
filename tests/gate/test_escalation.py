"""Escalation on evidence: failure fingerprints, stagnation, lateral lane switches, the evidence packet.

The end-to-end tests drive the real CLI (`run_proctor`) on a bundled task
(`task_setup`) with a scripted worker written to `tmp_path`: it records what
it was given (environment, prompt, evidence packet) and prints a marker to its
own transcript, which must never reach the next worker.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from harness.gate.escalation import (
    LATERAL,
    STAGNATION_RUN,
    escalation_state,
    fingerprint,
    normalize_output,
)
from tests.support.cli import run_proctor
from tests.support.tasks import TaskSetup, git_repo

MARKER = "WORKER-TRANSCRIPT-MARKER-5b1e0c"

# A worker that leaves the wordfreq task unfixed: it prints what it was given (a SEEN line on its
# own transcript, the one place a sandboxed worker can leave it) and a marker, and adds a harmless
# comment at the end of the file in scope (the tree changes, the failure does not). Its attempt
# number is its dispatch's sequence number (d001-..., d002-...).
WORKER = r"""
import json, os, sys

out, mode = sys.argv[1], sys.argv[2]
n = int(os.environ["PROCTOR_DISPATCH_ID"][1:4])
evidence_file = os.environ.get("PROCTOR_EVIDENCE_FILE")
seen = {
    "env": {k: v for k, v in os.environ.items() if k.startswith("PROCTOR_")},
    "prompt": open(os.environ["PROCTOR_PROMPT_FILE"], encoding="utf-8").read(),
    "evidence": open(evidence_file, encoding="utf-8").read() if evidence_file else None,
}
print("SEEN " + json.dumps(seen))
print("%s attempt %d: I am sure this fixes it" % (sys.argv[3], n))
with open(os.path.join("wordfreq", "counter.py"), "a", encoding="utf-8") as fh:
    fh.write("# attempt %d\n" % n)
with open(os.path.join("wordfreq", "notes.txt"), "w", encoding="utf-8") as fh:
    fh.write("case folding?\n")
"""


# --- fingerprints ---------------------------------------------------------------------------------

TEMPLATE = """\
FFF.                                                                     [{pct}%]
=================================== FAILURES ===================================
____________________________ test_case_fold ____________________________
    def test_case_fold():
>       assert count_words("{message}") == {{"the": 3}}
E       AssertionError: {message} <Counter object at {addr}>
{path}/tests/test_visible.py:5: AssertionError
worker pid {pid} at {stamp} ({clock})
=========================== short test summary info ============================
FAILED tests/test_visible.py::test_case_fold - AssertionError: {message}
{failed} failed, {passed} passed, {warnings} warnings in {duration}s
"""

hexes = st.text("0123456789abcdef", min_size=6, max_size=14).map(lambda h: "0x" + h)
segments = st.text("abcdefghijklmnopqrstuvwxyz0123456789_-.", min_size=1, max_size=12).filter(
    lambda s: s not in (".", "..")
)
temp_paths = st.lists(segments, min_size=1, max_size=4).map(lambda parts: "/tmp/" + "/".join(parts))
noise = st.fixed_dictionaries(
    {
        "pct": st.integers(0, 100),
        "addr": hexes,
        "path": temp_paths,
        "pid": st.integers(1, 4_000_000),
        "stamp": st.datetimes().map(lambda d: d.isoformat(timespec="milliseconds") + "Z"),
        "clock": st.times().map(lambda t: t.isoformat(timespec="seconds")),
        "failed": st.integers(0, 500),
        "passed": st.integers(0, 500),
        "warnings": st.integers(0, 50),
        "duration": st.floats(0, 10_000, allow_nan=False).map(lambda f: f"{f:.2f}"),
    }
)
messages = st.text("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ _=!'", min_size=1, max_size=40).filter(
    lambda m: m.strip() != ""
)


@settings(max_examples=150, deadline=None)
@given(message=messages, first=noise, second=noise)
def test_fingerprint_ignores_times_addresses_paths_pids_and_counts(
    message: str, first: dict[str, Any], second: dict[str, Any]
) -> None:
    a = TEMPLATE.format(message=message, **first)
    b = TEMPLATE.format(message=message, **second)
    assert fingerprint(a) == fingerprint(b), (normalize_output(a), normalize_output(b))


@settings(max_examples=300, deadline=None)
@given(
    one=messages,
    other=messages,
    numbers=st.tuples(st.integers(0, 99999), st.integers(0, 99999)),
    shared=noise,
)
def test_fingerprint_differs_for_different_assertion_messages(
    one: str, other: str, numbers: tuple[int, int], shared: dict[str, Any]
) -> None:
    # Digits only where no noise rule can take them (no unit, no "pid", no count word after them).
    left = f"{one}: expected 42 got {numbers[0]}"
    right = f"{other}: expected 42 got {numbers[1]}"
    if left.rstrip() == right.rstrip():
        return
    a = TEMPLATE.format(message=left, **shared)
    b = TEMPLATE.format(message=right, **shared)
    assert fingerprint(a) != fingerprint(b)


def test_normalization_strips_exactly_the_documented_noise() -> None:
    text = (
        "\x1b[31mFAILED\x1b[0m t.py::test_x - assert 41 == 42  \r\n"
        "<obj at 0x7f3a2c1b9e80> 0x1f stays; /tmp/pytest-of-u/pytest-7/t0/x.py:3: /var/tmp/a, /home/u/tmp/keep\n"
        "pid=4242 process 17 2024-05-01T12:00:00.123+02:00 2024-05-01 12:00:00 0:01:07\n"
        "took 0.45s, 12ms, 3 seconds, 2 min [ 40%] collected 12 items; Ran 3 tests\n"
        "1 failed, 4 passed, 2 warnings, 1 error, 3 skipped, 1 xfailed in 0.12s\n"
        "/state/verify/r0004/tree/tests/test_a.py:9\n"
    )
    assert normalize_output(text, ["/state/verify/r0004/tree"]) == (
        "FAILED t.py::test_x - assert 41 == 42\n"
        "<obj at <addr>> 0x1f stays; <tmp>:3: <tmp>, /home/u/tmp/keep\n"
        "pid=<pid> process <pid> <time> <time> <time>\n"
        "took <dur>, <dur>, <dur>, <dur> [<pct>] collected <n> items; Ran <n> tests\n"
        "<n> failed, <n> passed, <n> warnings, <n> error, <n> skipped, <n> xfailed in <dur>\n"
        "<copy>/tests/test_a.py:9"
    )


# --- the journal-derived state ------------------------------------------------------------------


def _run(*kinds: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    seq = 0
    for kind, fields in kinds:
        if kind == "dispatch":
            seq += 1
            events.append({"event": "dispatch_start", "dispatch_id": f"d{seq}", "seq": seq, **fields})
            events.append({"event": "dispatch_end", "dispatch_id": f"d{seq}", "seq": seq, "exit_code": 0,
                           "timed_out": False, **fields.get("end", {})})
        elif kind == "verify":
            events.append({"event": "verify", "receipt_id": f"r{len(events)}", **fields})
        else:
            events.append({"event": kind, **fields})
    return events


def fail(fp: str = "A") -> tuple[str, dict[str, Any]]:
    return ("verify", {"passed": False, "fingerprint": fp})


D = ("dispatch", {})


def test_three_identical_failures_after_dispatches_are_stagnation() -> None:
    state = escalation_state("flash", _run(fail(), D, fail(), D, fail(), D, fail()))
    assert state.stagnant_count == STAGNATION_RUN and state.stagnant
    assert state.fingerprints == ("A", "A", "A")  # the baseline verify before any dispatch does not count
    assert state.lane == "flash"


def test_reverifying_the_same_dispatch_counts_once_and_a_pass_or_new_failure_breaks_the_run() -> None:
    assert escalation_state("flash", _run(D, fail(), fail(), fail(), D, fail())).stagnant_count == 2
    assert escalation_state("flash", _run(D, fail(), D, ("verify", {"passed": True, "fingerprint": None}),
                                          D, fail())).stagnant_count == 1
    assert escalation_state("flash", _run(D, fail(), D, fail(), D, fail("B"))).stagnant_count == 1


def test_a_lane_switch_resets_the_run_and_moves_the_lane() -> None:
    events = _run(D, fail(), D, fail(), D, fail(), ("lane_switch", {"from": "flash", "to": "glm", "reason": "x"}),
                  D, fail())
    state = escalation_state("flash", events)
    assert state.lane == "glm" and len(state.switches) == 1
    assert state.fingerprints == ("A",) and state.stagnant_count == 1
    assert LATERAL == {"flash": "glm", "glm": "k3", "k3": "glm"}


def test_provider_failures_do_not_count_and_exclude_the_provider_in_that_lane() -> None:
    timeout = ("dispatch", {"lane": "flash", "provider": "p1", "end": {"timed_out": True, "exit_code": None}})
    exit75 = ("dispatch", {"lane": "flash", "provider": "p2", "end": {"exit_code": 75}})
    state = escalation_state("flash", _run(D, fail(), timeout, fail(), exit75, fail(), D, fail()))
    assert state.stagnant_count == 2  # the failures after provider failures are not evidence about the model
    assert state.excluded_providers("flash") == ("p1", "p2")
    assert state.excluded_providers("glm") == ()
    assert [f["why"] for f in state.provider_failures] == ["timed out", "exit 75"]


# --- through the CLI ------------------------------------------------------------------------------

# A small task with a fast verifier (no pytest), for the tests that need many rounds. Its output
# carries run-to-run noise (a duration, the copy's path) and the value the code returns.
CHECK = """\
import os, sys, time
t0 = time.perf_counter()
from calc import answer
got = answer()
print("checked in %.6fs at %s" % (time.perf_counter() - t0, os.getcwd()))
if got != 42:
    print("AssertionError: expected 42, got %r" % (got,))
    sys.exit(1)
"""
STUCK = r"""
import os, sys
out, mode = sys.argv[1], sys.argv[2]
n = int(os.environ["PROCTOR_DISPATCH_ID"][1:4])
print("%s attempt %d" % (sys.argv[3], n))
if mode == "fail75":
    sys.exit(75)
value = 41 if mode == "same" else 100 + n
with open("calc.py", "w") as fh:
    fh.write("# attempt %d\ndef answer():\n    return %d\n" % (n, value))
"""


def _mini(tmp_path: Path, **budget: int) -> tuple[TaskSetup, list[str]]:
    ws = tmp_path / "mini-ws"
    ws.mkdir()
    (ws / "calc.py").write_text("def answer():\n    return 0\n")
    (ws / "check.py").write_text(CHECK)
    git_repo(ws)
    task = tmp_path / "mini-task.json"
    task.write_text(json.dumps({
        "task_id": "mini-answer",
        "prompt": "answer() must return 42.",
        "features": ["localized", "bounded", "known_location", "objective_acceptance"],
        "scope": ["calc.py"],
        "verifier": {"argv": ["{python}", "check.py"], "seal": ["check.py"]},
        "budget": {"max_dispatches": 10, "max_stagnant": 3, "timeout_s": 30, **budget},
    }))
    setup = TaskSetup(root=tmp_path, task=task, workspace=ws)
    script = tmp_path / "mini_worker.py"
    script.write_text(STUCK)
    out = tmp_path / "mini-out"
    out.mkdir()
    assert run_proctor("init", *setup.words()).code == 0
    return setup, [sys.executable, str(script), str(out)]


def _setup(task_setup: Callable[..., TaskSetup], **budget: int) -> tuple[TaskSetup, list[str], Path]:
    setup = task_setup("wordfreq")
    setup.edit_task(lambda doc: doc["budget"].update(budget))
    # WORKER also writes wordfreq/notes.txt (an untracked file in the packet's diff): in scope
    setup.edit_task(lambda doc: doc["scope"].append("wordfreq/notes.txt"))
    script = setup.root / "stuck_worker.py"
    script.write_text(WORKER)
    out = setup.root / "worker-out"
    out.mkdir()
    r = run_proctor("init", *setup.words())
    assert r.code == 0, r.out
    return setup, [sys.executable, str(script), str(out)], out


def _attempt(setup: TaskSetup, worker: list[str], mode: str) -> tuple[dict[str, Any], dict[str, Any]]:
    d = run_proctor("dispatch", *setup.words(), "--command", "--", *worker, mode, MARKER)
    assert d.code == 0, d.out
    v = run_proctor("verify", *setup.words())
    assert v.code == 1 and v.out["passed"] is False, v.out
    return d.out, v.out


def _seen(dispatched: dict[str, Any]) -> dict[str, Any]:
    """What WORKER printed about what it was given, from its dispatch's output file."""
    lines = Path(dispatched["output_file"]).read_text(encoding="utf-8").splitlines()
    return dict(json.loads(next(line for line in lines if line.startswith("SEEN "))[5:]))


def _events(setup: TaskSetup) -> list[dict[str, Any]]:
    r = run_proctor("journal", "--workspace", str(setup.workspace), "--tail", "1000")
    assert r.code == 0, r.out
    return list(r.out["events"])


def test_three_identical_failures_switch_the_lane_with_an_evidence_packet(
    task_setup: Callable[..., TaskSetup],
) -> None:
    setup, worker, _ = _setup(task_setup, max_dispatches=6, max_stagnant=1)
    attempts = [_attempt(setup, worker, "same") for _ in range(3)]
    verifies = [v for _, v in attempts]
    prints = {v["fingerprint"] for v in verifies}
    assert len(prints) == 1 and None not in prints  # different trees, times and copies; the same failure

    status = run_proctor("status", "--workspace", str(setup.workspace)).out
    assert status["lane"] == "flash" and status["stagnant_count"] == 3
    assert status["fingerprints"] == [v["fingerprint"] for v in verifies]

    d = run_proctor("dispatch", *setup.words(), "--command", "--", *worker, "same", MARKER)
    assert d.code == 0, d.out
    assert d.out["lane"] == "glm"
    switch = d.out["lane_switch"]
    assert (switch["from"], switch["to"]) == ("flash", "glm")
    assert "stagnation" in switch["reason"] and switch["fingerprint"] in prints
    assert switch["receipt_ids"] == [v["receipt_id"] for v in verifies]

    events = _events(setup)
    kinds = [e["event"] for e in events]
    at = kinds.index("lane_switch")
    assert kinds[at + 1] == "dispatch_start" and events[at + 1]["lane"] == "glm"
    assert events[at]["reason"] == switch["reason"] and events[at]["switch_class"] == "stagnation"
    assert all(e["fingerprint"] for e in events if e["event"] == "verify" and not e["passed"])

    seen = _seen(d.out)
    earlier = _seen(attempts[-1][0])
    assert "PROCTOR_EVIDENCE_FILE" not in earlier["env"] and earlier["evidence"] is None
    evidence_file = seen["env"]["PROCTOR_EVIDENCE_FILE"]
    assert not evidence_file.startswith(str(setup.workspace) + os.sep)
    packet = json.loads(seen["evidence"])
    assert packet["schema"] == "proctor-evidence.v1"
    assert packet["switch"] == {"from": "flash", "to": "glm"} and packet["reason"] == switch["reason"]
    assert packet["objective"] == json.loads(setup.task.read_text())["prompt"]
    acceptance = packet["acceptance"]
    assert acceptance["verifier_argv"][1:] == ["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"]
    assert acceptance["sealed"] == ["tests/test_visible.py"]
    assert acceptance["hidden_inputs"] == ["tests/test_hidden.py"]
    assert "tests/test_hidden.py::test_casefold_not_just_lower" in acceptance["hidden_tests"]
    assert packet["diff"]["changed"] == ["wordfreq/counter.py"]
    assert packet["diff"]["untracked"] == ["wordfreq/notes.txt"] and packet["diff"]["removed"] == []
    assert "+++ b/wordfreq/notes.txt" in packet["diff"]["unified"] and "+case folding?" in packet["diff"]["unified"]
    assert "+# attempt 1" in packet["diff"]["unified"] and "+# attempt 3" in packet["diff"]["unified"]
    assert packet["verified_output"]["receipt_id"] == verifies[-1]["receipt_id"]
    assert "AssertionError" in packet["verified_output"]["text"]
    assert [f["fingerprint"] for f in packet["fingerprints"]] == [v["fingerprint"] for v in verifies]
    # Hidden tests reach the worker by name only; the output shown is that of a run without them
    # (issue 14, class 3: it was the hidden run's output with quoted lines withheld).
    hidden_source = (setup.root / "task" / "hidden" / "test_hidden.py").read_text()
    assert 'assert count_words("Straße STRASSE strasse")' in hidden_source
    assert 'count_words("Straße STRASSE strasse")' not in packet["verified_output"]["text"]
    assert packet["verified_output"]["output"] == "without_hidden"
    assert "tests/test_hidden.py::test_casefold_not_just_lower" in packet["verified_output"]["hidden_failing"]
    assert "test_hidden.py" not in packet["verified_output"]["text"]
    # The failed workers' own transcripts never reach the next worker.
    assert MARKER not in seen["evidence"] and MARKER not in seen["prompt"]
    assert MARKER in (Path(d.out["output_file"]).read_text())
    assert seen["prompt"].startswith(packet["objective"])
    assert "Evidence from earlier attempts" in seen["prompt"] and packet["reason"] in seen["prompt"]


# Code under test that prints every line of the hidden test file whenever it is called, prefixed,
# reversed, base64- and hex-encoded and split in two, each on a line of its own (issue 14, class 3).
LEAK = r"""
def _leak():
    import base64, os
    path = os.path.join("tests", "test_hidden.py")
    if not os.path.exists(path):
        return
    for line in open(path, encoding="utf-8").read().splitlines():
        half = len(line) // 2
        for form in (line, line[::-1], base64.b64encode(line.encode()).decode(), line.encode().hex(),
                     line[:half], line[half:]):
            print("LEAK>> " + form)
"""

LEAKER = r"""
import json, os, sys

out = sys.argv[1]
n = int(os.environ["PROCTOR_DISPATCH_ID"][1:4])
evidence_file = os.environ.get("PROCTOR_EVIDENCE_FILE")
seen = {
    "prompt": open(os.environ["PROCTOR_PROMPT_FILE"], encoding="utf-8").read(),
    "evidence": open(evidence_file, encoding="utf-8").read() if evidence_file else None,
}
print("SEEN " + json.dumps(seen))
path = os.path.join("wordfreq", "counter.py")
source = open(path, encoding="utf-8").read()
if "_leak" not in source:
    source = source.replace('    return dict(Counter(words(text)))', '    _leak()\n    return dict(Counter(words(text)))')
    source += sys.argv[2]
open(path, "w", encoding="utf-8").write(source + "# attempt %d\n" % n)
"""


def _hidden_forms(hidden: str, visible: str) -> dict[str, str]:
    """Each form LEAK prints of each hidden line that the visible material does not hold anyway."""
    import base64

    forms: dict[str, str] = {}
    for line in hidden.splitlines():
        if len(line.strip()) < 12 or line.strip() in visible:
            continue
        half = len(line) // 2
        candidates = {"line": line, "reversed": line[::-1], "base64": base64.b64encode(line.encode()).decode(),
                      "hex": line.encode().hex(), "head": line[:half], "tail": line[half:]}  # fmt: skip
        forms.update({f"{kind} of {line.strip()!r}": text for kind, text in candidates.items()
                      if len(text.strip()) >= 8 and text.strip() not in visible})  # fmt: skip
    return forms


def test_hidden_tests_never_reach_the_next_worker_in_any_form(task_setup: Callable[..., TaskSetup]) -> None:
    setup = task_setup("wordfreq")
    setup.edit_task(lambda doc: doc["budget"].update(max_dispatches=6, max_stagnant=1))
    script = setup.root / "leaker.py"
    script.write_text(LEAKER)
    out = setup.root / "leaker-out"
    out.mkdir()
    assert run_proctor("init", *setup.words()).code == 0
    argv = [sys.executable, str(script), str(out), LEAK]
    outputs = []
    for _ in range(3):
        assert run_proctor("dispatch", *setup.words(), "--command", "--", *argv).code == 0
        v = run_proctor("verify", *setup.words())
        assert v.code == 1, v.out
        outputs.append(Path(v.out["output_path"]).read_text(encoding="utf-8"))
    assert "LEAK>> " in outputs[-1]  # the attack works: the run with the hidden tests printed them
    d = run_proctor("dispatch", *setup.words(), "--command", "--", *argv)
    assert d.code == 0 and d.out["lane_switch"] is not None, d.out
    seen = _seen(d.out)
    shown = seen["evidence"] + seen["prompt"]
    packet = json.loads(seen["evidence"])
    assert "tests/test_hidden.py::test_casefold_not_just_lower" in packet["verified_output"]["hidden_failing"]
    visible = "\n".join(p.read_text(encoding="utf-8") for p in (setup.workspace / "tests").glob("*.py"))
    visible += "\n" + (setup.workspace / "wordfreq" / "counter.py").read_text(encoding="utf-8") + LEAK
    hidden = (setup.root / "task" / "hidden" / "test_hidden.py").read_text(encoding="utf-8")
    forms = _hidden_forms(hidden, visible)
    assert len(forms) > 20 and any(f in outputs[-1] for f in forms.values())
    leaked = [kind for kind, text in forms.items() if text in shown]
    assert not leaked, leaked[:5]


def test_failures_that_differ_each_time_do_not_switch(tmp_path: Path) -> None:
    setup, worker = _mini(tmp_path, max_stagnant=1)
    verifies = [_attempt(setup, worker, "vary")[1] for _ in range(3)]
    assert len({v["fingerprint"] for v in verifies}) == 3
    d = run_proctor("dispatch", *setup.words(), "--command", "--", *worker, "vary", MARKER)
    assert d.code == 0 and d.out["lane"] == "flash" and d.out["lane_switch"] is None
    assert "lane_switch" not in [e["event"] for e in _events(setup)]
    status = run_proctor("status", "--workspace", str(setup.workspace)).out
    assert status["stagnant_count"] == 1 and len(status["fingerprints"]) == 3


def test_the_same_failure_with_noisy_output_still_switches(tmp_path: Path) -> None:
    setup, worker = _mini(tmp_path, max_stagnant=1)
    verifies = [_attempt(setup, worker, "same")[1] for _ in range(3)]
    assert len({v["fingerprint"] for v in verifies}) == 1
    d = run_proctor("dispatch", *setup.words(), "--command", "--", *worker, "same", MARKER)
    assert d.code == 0 and d.out["lane_switch"]["to"] == "glm"


def test_max_stagnant_caps_lane_switches(tmp_path: Path) -> None:
    setup, worker = _mini(tmp_path, max_stagnant=1)
    for _ in range(6):  # three to switch flash -> glm, three more to stagnate in glm
        _attempt(setup, worker, "same")
    r = run_proctor("dispatch", *setup.words(), "--command", "--", *worker, "same", MARKER)
    assert r.code == 3 and r.out["refusal"] == "stagnation_limit_reached", r.out
    assert r.out["lane"] == "glm"
    events = _events(setup)
    assert [e["event"] for e in events].count("lane_switch") == 1
    assert events[-1]["event"] == "refused" and events[-1]["refusal"] == "stagnation_limit_reached"
    assert sum(e["event"] == "dispatch_start" for e in events) == 6


def test_a_provider_failure_is_journaled_and_not_stagnation(tmp_path: Path) -> None:
    setup, worker = _mini(tmp_path, max_stagnant=1)
    for _ in range(3):
        d = run_proctor("dispatch", *setup.words(), "--command", "--", *worker, "fail75", MARKER)
        assert d.code == 1 and d.out["provider_failure"] is True and d.out["exit_code"] == 75
        assert run_proctor("verify", *setup.words()).code == 1
    d = run_proctor("dispatch", *setup.words(), "--command", "--", *worker, "same", MARKER)
    assert d.out["lane"] == "flash" and d.out["lane_switch"] is None
    ends = [e for e in _events(setup) if e["event"] == "dispatch_end"]
    assert [e["provider_failure"] for e in ends] == [True, True, True, False]


# Fails (75, the provider failed) for the models listed in the file named by its argument.
FLAKY = r"""
import os, sys
print("model", os.environ["PROCTOR_MODEL"])
sys.exit(75 if os.environ["PROCTOR_MODEL"] in open(sys.argv[1]).read().split(",") else 0)
"""


def test_a_provider_failure_switches_provider_not_lane(tmp_path: Path) -> None:
    setup, _ = _mini(tmp_path)
    script = tmp_path / "flaky.py"
    script.write_text(FLAKY)
    failing = tmp_path / "failing-models.txt"
    entry = """
[[model]]
id = "{id}"
provider = "{provider}"
api_shape = "openai_chat"
base_url = "http://127.0.0.1:9/v1"
credential_env = ""
pricing_key = "{id}"
lane = "flash"
[model.worker]
argv = ["{{python}}", {script}, {failing}]
"""
    catalog = tmp_path / "catalog.toml"  # two providers in flash; a third model in another lane
    catalog.write_text("".join(
        entry.format(id=i, provider=p, script=json.dumps(str(script)), failing=json.dumps(str(failing)))
        .replace('"flash"', json.dumps(lane))
        for i, p, lane in (("cheap-a", "pa", "flash"), ("dear-b", "pb", "flash"), ("glm-c", "pc", "glm"))
    ))
    pricing = tmp_path / "pricing.yaml"
    pricing.write_text(
        "models:\n"
        "  cheap-a: {input_per_mtok: 1, output_per_mtok: 1, reasoning: billed_as_output}\n"
        "  dear-b: {input_per_mtok: 1, output_per_mtok: 9, reasoning: billed_as_output}\n"
    )
    words = [*setup.words(), "--model", "auto", "--catalog", str(catalog), "--pricing", str(pricing)]
    failing.write_text("cheap-a")
    first = run_proctor("dispatch", *words)
    assert first.code == 1 and first.out["model"] == "cheap-a" and first.out["provider_failure"] is True
    second = run_proctor("dispatch", *words)
    assert second.code == 0, second.out
    assert second.out["model"] == "dear-b" and second.out["lane"] == "flash" and second.out["lane_switch"] is None
    events = _events(setup)
    switch = next(e for e in events if e["event"] == "provider_switch")
    assert (switch["from_provider"], switch["to_provider"], switch["lane"]) == ("pa", "pb", "flash")
    assert switch["switch_class"] == "provider_failure"
    assert first.out["dispatch_id"] in switch["reason"]
    start = [e for e in events if e["event"] == "dispatch_start"][-1]
    assert start["model_choice"]["excluded_providers"] == ["pa"]
    status = run_proctor("status", "--workspace", str(setup.workspace)).out
    assert status["failed_providers"] == {"flash": ["pa"]}

    failing.write_text("cheap-a,dear-b")
    third = run_proctor("dispatch", *words)
    assert third.code == 1 and third.out["model"] == "dear-b"
    r = run_proctor("dispatch", *words)
    assert r.code == 3 and r.out["refusal"] == "no_model_for_lane", r.out
    assert r.out["excluded_providers"] == ["pa", "pb"] and r.out["lane"] == "flash"
