"""The switch decision (the third failure class, issue 17 item 9): localized defect after broad success.

The pure rule (`decide_next`) on typed histories, its agreement with the journal-derived
stagnation state, and real gated-path runs (the CLI on a bundled task and on a small
pytest task in a git workspace) with scripted workers that leave a localized defect,
a broad failure, or a new localized defect each time.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from harness.gate.decision import (
    BROAD_SUCCESS_MIN_FRACTION,
    BROAD_SUCCESS_MIN_TESTS,
    LOCALIZED_MAX_FAILING,
    MAX_TARGETED_REPAIRS,
    DispatchOutcome,
    Verification,
    decide_next,
    dispatch_history,
    localized_defect,
)
from harness.gate.escalation import STAGNATION_RUN, escalation_state
from harness.gate.evidence import failure_sections
from tests.support.cli import run_proctor
from tests.support.tasks import TaskSetup, git_repo

# --- the pure rule ----------------------------------------------------------------------------------


def v(fp: str | None = "A", expected: int | None = 8, failing: tuple[str, ...] | None = ("t::x",),
      passed: bool = False) -> Verification:  # fmt: skip
    return Verification(receipt_id=f"r-{fp}", passed=passed, fingerprint=None if passed else fp,
                        tests_expected=expected, tests_failing=failing)  # fmt: skip


def d(verification: Verification | None, cls: str = "continue", lane: str = "flash", **kw: Any) -> DispatchOutcome:
    return DispatchOutcome(lane=lane, switch_class=cls, verification=verification, **kw)


def test_the_thresholds_are_the_documented_numbers() -> None:
    assert (BROAD_SUCCESS_MIN_TESTS, BROAD_SUCCESS_MIN_FRACTION, LOCALIZED_MAX_FAILING, MAX_TARGETED_REPAIRS) == (
        4, 0.75, 2, 2)  # fmt: skip
    assert STAGNATION_RUN == 3


def test_localized_means_one_or_two_failing_of_enough_tests_most_passing() -> None:
    assert localized_defect(v(expected=4, failing=("a",)))  # 3 of 4 pass: exactly the fraction
    assert localized_defect(v(expected=8, failing=("a", "b")))  # 6 of 8
    assert not localized_defect(v(expected=7, failing=("a", "b")))  # 5 of 7 < 0.75
    assert not localized_defect(v(expected=3, failing=("a",)))  # too few tests to call it broad
    assert not localized_defect(v(expected=20, failing=("a", "b", "c")))  # three failing: not localized
    assert not localized_defect(v(expected=8, failing=()))  # failed with every test passing: not a test defect
    assert not localized_defect(v(expected=None, failing=None))  # no per-test report
    assert not localized_defect(v(passed=True, failing=()))
    assert not localized_defect(v(fp=None))


def test_a_new_localized_defect_is_repaired_by_the_same_lane_and_model() -> None:
    decision = decide_next("flash", [d(v("A", 8, ("tests/t.py::test_a",)), "first", model="m1", provider="p")], 3)
    assert decision.switch_class == "localized_defect"
    assert (decision.lane, decision.model) == ("flash", "m1")
    assert decision.failing_tests == ("tests/t.py::test_a",) and decision.tests_expected == 8
    assert decision.targeted_repairs == 1 and decision.receipt_id == "r-A"


def test_a_seen_fingerprint_broad_failure_or_spent_repairs_fall_back_to_the_stagnation_rule() -> None:
    seen = [d(v("A")), d(v("B", 8, tuple(f"t{i}" for i in range(6)))), d(v("A"))]
    assert decide_next("flash", seen, 3).switch_class == "continue"
    broad = [d(v("B", 8, tuple(f"t{i}" for i in range(6))))]
    assert decide_next("flash", broad, 3).switch_class == "continue"
    repaired = [d(v("A")), d(v("B"), "localized_defect"), d(v("C"), "localized_defect")]
    spent = decide_next("flash", repaired, 3)
    assert spent.switch_class == "continue" and spent.targeted_repairs == MAX_TARGETED_REPAIRS
    assert "targeted repairs" in spent.reason
    # A lane switch starts the count again (and the fingerprints seen).
    after = [*repaired, d(v("C"), "stagnation", lane="glm")]
    assert decide_next("flash", after, 3).switch_class == "localized_defect"


def test_stagnation_comes_first_then_provider_failure() -> None:
    stuck = [d(v("A")), d(v("A")), d(v("A"))]
    decision = decide_next("flash", stuck, 3)
    assert (decision.switch_class, decision.lane, decision.from_lane) == ("stagnation", "glm", "flash")
    assert decision.stagnant_count == 3
    assert decide_next("flash", stuck, 0).switch_class == "stagnation_limit"
    failed = [d(v("A"), provider="p1"), d(None, provider="p2", provider_failure=True)]
    decision = decide_next("flash", failed, 3)
    assert decision.switch_class == "provider_failure" and decision.excluded_providers == ("p2",)
    assert decide_next("flash", [], 3).switch_class == "first"


# Journal-shaped histories: the pure rule's stagnation agrees with the gate's escalation state.
steps = st.lists(
    st.one_of(
        st.tuples(st.just("dispatch"), st.booleans()),
        st.tuples(st.just("verify"), st.sampled_from(["A", "B", None])),
        st.tuples(st.just("switch"), st.just(None)),
    ),
    max_size=14,
)


@settings(max_examples=300, deadline=None)
@given(steps=steps)
def test_the_rule_and_the_journal_state_agree_on_stagnation(steps: list[tuple[str, Any]]) -> None:
    events: list[dict[str, Any]] = []
    lane, seq = "flash", 0
    pending_switch = False
    for kind, arg in steps:
        if kind == "dispatch":
            seq += 1
            if pending_switch:
                lane = {"flash": "glm", "glm": "k3", "k3": "glm"}[lane]
                events.append({"event": "lane_switch", "from": "x", "to": lane, "dispatch_id": f"d{seq}"})
                pending_switch = False
            events.append({"event": "dispatch_start", "dispatch_id": f"d{seq}", "seq": seq, "lane": lane})
            events.append({"event": "dispatch_end", "dispatch_id": f"d{seq}", "seq": seq,
                           "exit_code": 75 if arg else 0, "timed_out": False})  # fmt: skip
        elif kind == "verify":
            events.append({"event": "verify", "receipt_id": f"r{len(events)}", "dispatch_seq": seq,
                           "passed": arg is None, "fingerprint": arg})  # fmt: skip
        elif seq:
            pending_switch = True
    state = escalation_state("flash", events)
    decision = decide_next("flash", dispatch_history(events), 99)
    assert (decision.switch_class == "stagnation") == state.stagnant, (events, decision)
    if state.stagnant:
        assert decision.stagnant_count == state.stagnant_count and decision.from_lane == state.lane


def test_failure_sections_are_cut_at_the_next_header() -> None:
    out = ("F.\n==== FAILURES ====\n____ test_a ____\n\n    def test_a():\n>       assert 1 == 2\nE   assert 1 == 2\n"
           "____ TestK.test_b ____\nE   boom\n==== short test summary info ====\nFAILED t.py::test_a\n")  # fmt: skip
    sections = failure_sections(out)
    assert set(sections) == {"test_a", "TestK.test_b"}
    assert "assert 1 == 2" in sections["test_a"] and "boom" not in sections["test_a"]
    assert "FAILED" not in sections["TestK.test_b"]


# --- real gated-path runs -----------------------------------------------------------------------------

# A worker for the wordfreq task (8 expected tests: 1 visible, 7 hidden). It records the prompt and
# evidence it was given, then: "lower" fixes all but case folding (only the hidden
# test_casefold_not_just_lower fails), "fix" fixes it (and does so whenever it is given a targeted
# repair), "none" leaves it broken (every test fails).
WORDFREQ_WORKER = r"""
import json, os, sys
mode = sys.argv[1]
prompt = open(os.environ["PROCTOR_PROMPT_FILE"], encoding="utf-8").read()
evidence_file = os.environ.get("PROCTOR_EVIDENCE_FILE")
evidence = open(evidence_file, encoding="utf-8").read() if evidence_file else None
print("SEEN " + json.dumps({"prompt": prompt, "evidence": evidence}))
if "## Targeted repair" in prompt:
    mode = "fix"
path = os.path.join("wordfreq", "counter.py")
source = open(path, encoding="utf-8").read()
n = os.environ["PROCTOR_DISPATCH_ID"][:4]
if mode in ("lower", "fix"):
    fold = ".casefold()" if mode == "fix" else ".lower()"
    body = ("def words(text):\n    import string\n    return [w for w in (p.strip(string.punctuation)%s"
            " for p in text.split()) if w]\n" % fold)
    source = source.split("def words")[0] + body + "\n\ndef count_words" + source.split("def count_words")[1]
open(path, "w", encoding="utf-8").write(source + "# %s\n" % n)
"""


def _seen(dispatched: dict[str, Any]) -> dict[str, Any]:
    lines = Path(dispatched["output_file"]).read_text(encoding="utf-8").splitlines()
    return dict(json.loads(next(line for line in lines if line.startswith("SEEN "))[5:]))


def _journal(setup: TaskSetup) -> list[dict[str, Any]]:
    r = run_proctor("journal", "--workspace", str(setup.workspace), "--tail", "1000")
    assert r.code == 0, r.out
    return list(r.out["events"])


def _wordfreq(task_setup: Callable[..., TaskSetup], **budget: int) -> tuple[TaskSetup, list[str]]:
    setup = task_setup("wordfreq")
    setup.edit_task(lambda doc: doc["budget"].update(max_dispatches=8, **budget))
    script = setup.root / "wordfreq_worker.py"
    script.write_text(WORDFREQ_WORKER)
    assert run_proctor("init", *setup.words()).code == 0
    return setup, [sys.executable, str(script)]


def _dispatch(setup: TaskSetup, worker: list[str], mode: str) -> dict[str, Any]:
    r = run_proctor("dispatch", *setup.words(), "--command", "--", *worker, mode)
    assert r.code == 0, r.out
    return dict(r.out)


def test_a_localized_defect_gets_a_targeted_repair_with_only_the_failing_tests_evidence(
    task_setup: Callable[..., TaskSetup],
) -> None:
    setup, worker = _wordfreq(task_setup)
    first = _dispatch(setup, worker, "lower")
    v1 = run_proctor("verify", *setup.words())
    assert v1.code == 1, v1.out
    results = v1.out["receipt"]["results"] if "receipt" in v1.out else None
    journal = _journal(setup)
    verify = [e for e in journal if e["event"] == "verify"][-1]
    assert verify["tests_expected"] == 8
    assert verify["tests_failing"] == ["tests/test_hidden.py::test_casefold_not_just_lower"], results

    second = _dispatch(setup, worker, "none")  # the worker is told to repair, and does
    assert second["lane"] == first["lane"] == "flash" and second["lane_switch"] is None
    repair = second["targeted_repair"]
    assert repair["switch_class"] == "localized_defect" and repair["repair"] == 1
    assert repair["failing_tests"] == ["tests/test_hidden.py::test_casefold_not_just_lower"]
    assert repair["receipt_id"] == verify["receipt_id"] and repair["fingerprint"] == verify["fingerprint"]
    journal = _journal(setup)
    kinds = [e["event"] for e in journal]
    at = kinds.index("targeted_repair")
    assert kinds[at + 1] == "dispatch_start" and journal[at + 1]["lane"] == "flash"
    assert journal[at + 1]["evidence_file"] == repair["evidence_file"]
    assert journal[at]["switch_class"] == "localized_defect"

    seen = _seen(second)
    assert "## Targeted repair" in seen["prompt"] and "Evidence from earlier attempts" not in seen["prompt"]
    assert "tests/test_hidden.py::test_casefold_not_just_lower (hidden: name only)" in seen["prompt"]
    packet = json.loads(seen["evidence"])
    assert packet["schema"] == "proctor-repair.v1" and packet["tests_expected"] == 8
    assert packet["failing_tests"] == [{"id": "tests/test_hidden.py::test_casefold_not_just_lower", "hidden": True,
                                        "failure": None, "note": "a hidden test: its name only"}]  # fmt: skip
    assert "diff" not in packet and "fingerprints" not in packet  # only the failing tests' evidence
    hidden_source = (setup.root / "task" / "hidden" / "test_hidden.py").read_text()
    assert 'count_words("Straße STRASSE strasse")' in hidden_source
    assert "STRASSE strasse" in hidden_source  # from the hidden test's source, not the prompt
    assert "STRASSE strasse" not in seen["prompt"] and "STRASSE strasse" not in json.dumps(packet, ensure_ascii=False)
    assert _seen(first)["evidence"] is None

    v2 = run_proctor("verify", *setup.words())
    assert v2.code == 0 and v2.out["passed"] is True, v2.out
    assert run_proctor("accept", *setup.words()).code == 0


def test_broad_failures_still_follow_the_stagnation_rule_and_the_switch_names_its_class(
    task_setup: Callable[..., TaskSetup],
) -> None:
    setup, worker = _wordfreq(task_setup, max_stagnant=1)
    for _ in range(STAGNATION_RUN):
        out = _dispatch(setup, worker, "none")
        assert out["targeted_repair"] is None and out["lane_switch"] is None
        assert run_proctor("verify", *setup.words()).code == 1
    verify = [e for e in _journal(setup) if e["event"] == "verify"][-1]
    assert verify["tests_expected"] == 8 and len(verify["tests_failing"]) > LOCALIZED_MAX_FAILING
    out = _dispatch(setup, worker, "none")
    assert out["lane"] == "glm" and out["targeted_repair"] is None
    assert out["lane_switch"]["switch_class"] == "stagnation"
    journal = _journal(setup)
    assert [e["switch_class"] for e in journal if e["event"] in ("lane_switch", "targeted_repair")] == ["stagnation"]


# A small pytest task: five visible tests, each on its own function of calc.py. The worker fixes all
# but the one named by its dispatch number (a new localized defect, a new fingerprint, each time).
CALC_TESTS = "".join(
    f"from calc import f{i}\n\n\ndef test_f{i}():\n    assert f{i}() == {i}, 'f{i} is wrong'\n\n\n" for i in range(5)
).replace("\nfrom calc", "\nfrom calc")
CALC_WORKER = r"""
import os
n = int(os.environ["PROCTOR_DISPATCH_ID"][1:4])
prompt = open(os.environ["PROCTOR_PROMPT_FILE"], encoding="utf-8").read()
print("SEEN-REPAIR" if "## Targeted repair" in prompt else "SEEN-PLAIN")
print("PROMPT " + prompt.replace("\n", "\\n"))
broken = n % 5
with open("calc.py", "w") as fh:
    for i in range(5):
        fh.write("def f%d():\n    return %d\n" % (i, i + 100 if i == broken else i))
"""


def _calc(tmp_path: Path) -> tuple[TaskSetup, list[str]]:
    ws = tmp_path / "calc-ws"
    (ws / "tests").mkdir(parents=True)
    (ws / "calc.py").write_text("".join(f"def f{i}():\n    return -1\n" for i in range(5)))
    (ws / "tests" / "test_calc.py").write_text(CALC_TESTS)
    git_repo(ws)
    task = tmp_path / "calc-task.json"
    task.write_text(json.dumps({
        "task_id": "calc-five",
        "prompt": "Each f<i>() in calc.py must return i.",
        "features": ["localized", "bounded", "known_location", "objective_acceptance"],
        "scope": ["calc.py"],
        "verifier": {"argv": ["{python}", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
                     "seal": ["tests/test_calc.py"]},
        "budget": {"max_dispatches": 8, "max_stagnant": 3, "timeout_s": 60},
    }))  # fmt: skip
    script = tmp_path / "calc_worker.py"
    script.write_text(CALC_WORKER)
    setup = TaskSetup(root=tmp_path, task=task, workspace=ws)
    assert run_proctor("init", *setup.words()).code == 0
    return setup, [sys.executable, str(script)]


def test_targeted_repairs_are_bounded_and_carry_the_visible_failure(tmp_path: Path) -> None:
    setup, worker = _calc(tmp_path)
    classes = []
    for n in range(1, MAX_TARGETED_REPAIRS + 3):
        r = run_proctor("dispatch", *setup.words(), "--command", "--", *worker)
        assert r.code == 0, r.out
        classes.append(None if r.out["targeted_repair"] is None else r.out["targeted_repair"]["switch_class"])
        output = Path(r.out["output_file"]).read_text()
        assert ("SEEN-REPAIR" in output) == (classes[-1] == "localized_defect")
        if n == 2:  # the repair of dispatch 1's defect: f1 failed; its failure section, nothing else
            packet = json.loads(Path(r.out["targeted_repair"]["evidence_file"]).read_text())
            (test,) = packet["failing_tests"]
            assert test["id"] == "tests/test_calc.py::test_f1" and test["hidden"] is False
            assert "f1 is wrong" in test["failure"] and "test_f2" not in test["failure"]
            assert packet["output"] == "verified" and packet["tests_expected"] == 5
            assert "f1 is wrong" in output
        v = run_proctor("verify", *setup.words())
        assert v.code == 1, v.out
    # dispatch 1 is the first; 2 and 3 are the two targeted repairs; then the stagnation rule alone
    assert classes == [None, "localized_defect", "localized_defect", None]
    journal = _journal(setup)
    repairs = [e for e in journal if e["event"] == "targeted_repair"]
    assert [e["repair"] for e in repairs] == [1, 2] and {e["switch_class"] for e in repairs} == {"localized_defect"}
    assert {e["lane"] for e in journal if e["event"] == "dispatch_start"} == {"flash"}


MODELS = """[[model]]
id = "dear-flash"
api_model = "sim-k3"
provider = "sim"
api_shape = "openai_chat"
base_url = "http://127.0.0.1:9/v1"
credential_env = ""
pricing_key = "sim-k3"
lane = "flash"

[model.worker]
argv = ["{python}", SCRIPT, "lower"]
network = "none"

[[model]]
id = "cheap-flash"
api_model = "sim-flash"
provider = "sim"
api_shape = "openai_chat"
base_url = "http://127.0.0.1:9/v1"
credential_env = ""
pricing_key = "sim-flash"
lane = "flash"

[model.worker]
argv = ["{python}", SCRIPT, "none"]
network = "none"
"""


def test_under_auto_the_targeted_repair_runs_the_same_model_not_the_lanes_cheapest(
    task_setup: Callable[..., TaskSetup],
) -> None:
    setup, worker = _wordfreq(task_setup)
    catalog = setup.root / "catalog.toml"
    catalog.write_text(MODELS.replace("SCRIPT", json.dumps(worker[1])))
    r = run_proctor("dispatch", *setup.words(), "--model", "dear-flash", "--catalog", str(catalog))
    assert r.code == 0, r.out
    assert run_proctor("verify", *setup.words()).code == 1
    r = run_proctor("dispatch", *setup.words(), "--model", "auto", "--catalog", str(catalog))
    assert r.code == 0, r.out
    assert (r.out["model"], r.out["lane"]) == ("dear-flash", "flash")  # auto alone would pick cheap-flash
    assert r.out["targeted_repair"]["model"] == "dear-flash"
    starts = [e for e in _journal(setup) if e["event"] == "dispatch_start"]
    assert starts[-1]["model_choice"] == {"mode": "targeted_repair", "lane": "flash", "model_lane": "flash"}
    v = run_proctor("verify", *setup.words())
    assert v.code == 0 and v.out["passed"] is True, v.out
    # With the defect repaired nothing is localized any more: auto is the lane's cheapest again.
    r = run_proctor("dispatch", *setup.words(), "--model", "auto", "--catalog", str(catalog))
    assert r.code == 0 and r.out["model"] == "cheap-flash" and r.out["targeted_repair"] is None, r.out
