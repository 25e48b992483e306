"""design.toml is read strictly: every refusal is named, none is a traceback.

`write_prereg` (tests/support/design.py) builds a small valid preregistration (with
its own tiny packet) that tests/prereg/test_freeze.py uses too.
"""

from __future__ import annotations

import copy
import hashlib
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.errors import Refusal
from harness.prereg.design import load_design
from tests.support.cli import run_proctor
from tests.support.design import (
    write_prereg,
)

# --------------------------------------------------------------------------
# The valid design


def test_the_fixture_is_valid(tmp_path: Path) -> None:
    folder = write_prereg(tmp_path)
    design = load_design(folder / "design.toml")
    assert design.study_id == "tiny"
    assert [s.slot for s in design.systems] == ["cheap", "strong"]
    assert design.arm("direct").temperature == 0.0 and design.arm("think").temperature is None
    assert design.stage("B").repeats == 2
    assert design.budgets.ceiling_usd == 5.5
    assert design.packet_path == str(tmp_path / "evals" / "tiny" / "packet.jsonl")
    assert design.sha256 == hashlib.sha256((folder / "design.toml").read_bytes()).hexdigest()


def test_unknown_stage_is_named(tmp_path: Path) -> None:
    design = load_design(write_prereg(tmp_path) / "design.toml")
    with pytest.raises(Refusal) as caught:
        design.stage("Z")
    assert caught.value.code == "unknown_stage"


def test_a_design_is_validated_once_per_bytes_and_path_and_changed_bytes_again(tmp_path: Path) -> None:
    path = write_prereg(tmp_path) / "design.toml"
    first = load_design(path)
    assert load_design(path) is first  # the same bytes at the same path: the frozen design already validated
    data = path.read_bytes()
    path.write_bytes(data.replace(b'id = "tiny"', b'id = "tiny2"', 1))
    assert load_design(path).study_id == "tiny2"
    path.write_bytes(data.replace(b'id = "tiny"', b'id = "Tiny Study!"', 1))
    with pytest.raises(Refusal):  # bad bytes are refused each time, never answered from what was read before
        load_design(path)
    path.write_bytes(data)
    assert load_design(path) is first


# --------------------------------------------------------------------------
# Every refusal


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """Set (or with value ... delete) `a.b[0].c` in the design."""

    def apply(doc: dict[str, Any]) -> None:
        node: Any = doc
        parts = path.replace("]", "").replace("[", ".").split(".")
        for part in parts[:-1]:
            node = node[int(part)] if isinstance(node, list) else node[part]
        last = parts[-1]
        if value is ...:
            del node[last]
        elif isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value

    return apply


def _dup(path: str, index: int = 0) -> Callable[[dict[str, Any]], None]:
    def apply(doc: dict[str, Any]) -> None:
        node: Any = doc
        for part in path.split("."):
            node = node[part]
        node.append(copy.deepcopy(node[index]))

    return apply


def _both(*fns: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    def apply(doc: dict[str, Any]) -> None:
        for fn in fns:
            fn(doc)

    return apply


REFUSALS: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    # unknown keys, at every level
    "unknown top-level key": (_set("extra", 1), "unknown keys in the design: extra"),
    "unknown key in study": (_set("study.extra", 1), "unknown keys in study: extra"),
    "unknown key in suite": (_set("suite.extra", "x"), "unknown keys in suite: extra"),
    "unknown key in draw": (_set("draw.extra", 1), "unknown keys in draw: extra"),
    "unknown key in a system": (_set("systems[1].extra", 1), "unknown keys in systems[1]: extra"),
    "unknown key in an arm": (_set("arms[0].top_p", 0.9), "unknown keys in arms[0]: top_p"),
    "unknown key in a stage": (_set("stages[0].extra", 1), "unknown keys in stages[0]: extra"),
    "unknown key in budgets": (_set("budgets.extra", 1), "unknown keys in budgets: extra"),
    "unknown key in run": (_set("run.retries", 1), "unknown keys in run: retries"),
    "unknown key in analysis": (_set("analysis.extra", 1), "unknown keys in analysis: extra"),
    "unknown key in a comparison": (_set("analysis.comparisons[0].extra", 1),
                                    "unknown keys in analysis.comparisons[0]: extra"),
    # missing keys and tables
    "missing table": (_set("budgets", ...), "missing keys in the design: budgets"),
    "missing key": (_set("run.reruns", ...), "missing keys in run: reruns"),
    "missing key in a system": (_set("systems[0].cap_usd", ...), "missing keys in systems[0]: cap_usd"),
    "a table given as a value": (_set("study", "tiny"), "[study] must be a table"),
    "systems as one table": (_set("systems", {"slot": "x"}), "[[systems]] must be a non-empty array"),
    "no systems": (_set("systems", []), "[[systems]] must be a non-empty array"),
    # wrong types, bools as numbers, non-finite numbers, out-of-range integers
    "seed as text": (_set("study.seed", "7"), "study.seed must be an integer"),
    "seed as bool": (_set("study.seed", True), "study.seed must be an integer"),
    "seed as float": (_set("study.seed", 7.0), "study.seed must be an integer"),
    "seed beyond TOML's range": (_set("study.seed", 2**63), "study.seed must be an integer"),
    "negative seed": (_set("study.seed", -1), "study.seed must be an integer"),
    "draw as bool": (_set("draw.items", True), "draw.items must be an integer"),
    "cap as bool": (_set("systems[0].cap_usd", True), "systems[0].cap_usd must be a finite number"),
    "cap as text": (_set("systems[0].cap_usd", "1.0"), "systems[0].cap_usd must be a finite number"),
    "cap inf": (_set("systems[0].cap_usd", math.inf), "systems[0].cap_usd must be a finite number"),
    "cap nan": (_set("systems[0].cap_usd", math.nan), "systems[0].cap_usd must be a finite number"),
    "cap beyond a float": (_set("systems[0].cap_usd", 10**400), "systems[0].cap_usd must be a finite number"),
    "zero cap": (_set("systems[0].cap_usd", 0), "systems[0].cap_usd must be in (0.0"),
    "overall cap -inf": (_set("budgets.overall_cap_usd", -math.inf), "must be a finite number"),
    "deadline inf": (_set("run.attempt_deadline_s", math.inf), "run.attempt_deadline_s must be a finite number"),
    "temperature as bool": (_set("arms[0].temperature", False), "arms[0].temperature must be a finite number"),
    "temperature too high": (_set("arms[0].temperature", 2.5), "arms[0].temperature must be in"),
    "model as number": (_set("systems[0].model", 3), "systems[0].model must be a non-empty string"),
    "blank setting": (_set("systems[0].setting", " "), "systems[0].setting must be a non-empty string"),
    "slot not an identifier": (_set("systems[0].slot", "a b"), "systems[0].slot must be an identifier"),
    "stage systems as text": (_set("stages[0].systems", "cheap"), "stages[0].systems must be a non-empty list"),
    "zero repeats": (_set("stages[0].repeats", 0), "stages[0].repeats must be an integer"),
    "uppercase packet sha": (_set("suite.packet_sha256", "A" * 64), "packet_sha256 must be 64 lowercase hex"),
    "template without prompt": (_set("arms[1].template", "answer"), "arms[1].template must contain {prompt}"),
    "alpha zero": (_set("analysis.alpha", 0.0), "analysis.alpha must be in (0.0, 0.5]"),
    "alpha too big": (_set("analysis.alpha", 0.6), "analysis.alpha must be in (0.0, 0.5]"),
    "power one": (_set("analysis.power", 1.0), "analysis.power must be in (0.5, 1.0)"),
    "power a half": (_set("analysis.power", 0.5), "analysis.power must be in (0.5, 1.0)"),
    "power as bool": (_set("analysis.power", True), "analysis.power must be a finite number"),
    "margin zero": (_set("analysis.comparisons[0].margin", 0.0), "margin must be in (0.0, 1.0]"),
    "expected rate above one": (_set("analysis.comparisons[0].expected_a", 1.5), "expected_a must be in [0.0, 1.0]"),
    "correlation above one": (_set("analysis.comparisons[0].correlation", 1.01), "correlation must be in"),
    "unknown test": (_set("analysis.test", "t_test"), "analysis.test must be one of"),
    "unknown clustering": (_set("analysis.clustering", "system"), "analysis.clustering must be"),
    # dangling references
    "stage names an unknown system": (_set("stages[0].systems", ["cheap", "mid"]), "names unknown ids: mid"),
    "stage names an unknown arm": (_set("stages[1].arms", ["direct", "cot"]), "names unknown ids: cot"),
    "stage names a system twice": (_set("stages[0].systems", ["cheap", "cheap"]), "names something twice"),
    "comparison names an unknown slot": (_set("analysis.comparisons[0].b", "mid"),
                                         "must compare two different registered systems"),
    "comparison of a system with itself": (_set("analysis.comparisons[0].b", "cheap"),
                                           "must compare two different registered systems"),
    "comparison names an unknown arm": (_set("analysis.comparisons[0].arm", "cot"), "arm names an unknown arm"),
    "comparison no stage runs": (_both(_set("stages[0].systems", ["cheap"]), _set("stages[1].systems", ["strong"])),
                                 "no stage runs both cheap and strong on arm direct"),
    # impossible budgets and run rules
    "reserve above a system's cap": (_set("budgets.reserve_per_item_usd", 1.5),
                                     "the reserve per item exceeds system cheap's cap"),
    "spend before at the ceiling": (_set("budgets.spend_before_usd", 5.5), "already reaches the hard ceiling"),
    "spend before above the ceiling": (_set("budgets.spend_before_usd", 9.0), "already reaches the hard ceiling"),
    "negative reserve": (_set("budgets.reserve_per_item_usd", -0.01), "must be in [0.0"),
    "three reruns": (_set("run.reruns", 3), "at most two reruns"),
    "four transport retries": (_set("run.transport_retries", 4), "at most three transport retries"),
    "zero lanes": (_set("run.lanes_per_system", 0), "run.lanes_per_system must be an integer"),
    "stage items above the draw": (_set("stages[1].items", 7), "stages[1].items (7) exceeds the draw (6)"),
    # duplicates
    "duplicate slot": (_dup("systems"), "two systems share a slot"),
    "duplicate arm": (_dup("arms"), "two arms share an id"),
    "duplicate stage": (_dup("stages"), "two stages share an id"),
    "duplicate comparison": (_dup("analysis.comparisons"), "repeats an earlier comparison"),
    "duplicate comparison reversed": (
        _both(_dup("analysis.comparisons"), _set("analysis.comparisons[1].a", "strong"),
              _set("analysis.comparisons[1].b", "cheap")), "repeats an earlier comparison"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_design_refusals(tmp_path: Path, case: str) -> None:
    mutate, fragment = REFUSALS[case]
    folder = write_prereg(tmp_path, mutate)
    with pytest.raises(Refusal) as caught:
        load_design(folder / "design.toml")
    assert caught.value.code == "design_invalid", caught.value
    assert fragment in caught.value.message, caught.value.message
    assert caught.value.path == str(folder / "design.toml")


RAW_REFUSALS: dict[str, tuple[bytes, str]] = {
    "invalid TOML": (b"[study\nid = 1\n", "design_invalid"),
    "duplicate key": (b'[study]\nid = "a"\nid = "b"\n', "design_invalid"),
    "table defined twice": (b"[study]\n[study]\n", "design_invalid"),
    "deep nesting": (b"x = " + b"[" * 50000 + b"\n", "design_invalid"),
    "not UTF-8": ('[study]\ntitle = "caf\u00e9"\n'.encode("latin-1"), "invalid_utf8"),
    "empty file": (b"", "design_invalid"),
    "a byte-order mark": (b"\xef\xbb\xbf[study]\n", "design_invalid"),
}


@pytest.mark.parametrize("case", sorted(RAW_REFUSALS))
def test_raw_design_refusals(tmp_path: Path, case: str) -> None:
    data, code = RAW_REFUSALS[case]
    folder = write_prereg(tmp_path)
    (folder / "design.toml").write_bytes(data)
    with pytest.raises(Refusal) as caught:
        load_design(folder / "design.toml")
    assert caught.value.code == code


@pytest.mark.parametrize("case", ["invalid TOML", "not UTF-8", "deep nesting", "duplicate key"])
def test_raw_refusals_through_the_cli(tmp_path: Path, case: str) -> None:
    data, code = RAW_REFUSALS[case]
    folder = write_prereg(tmp_path)
    (folder / "design.toml").write_bytes(data)
    result = run_proctor("prereg", "check", str(folder))  # asserts one JSON object and no traceback
    assert result.code == 3
    assert result.out["refusal"] == code
    assert result.out["path"] == str(folder / "design.toml")


@pytest.mark.parametrize("case", ["cap inf", "cap beyond a float", "seed as bool", "reserve above a system's cap",
                                  "comparison names an unknown slot", "four transport retries"])
def test_refusals_through_the_cli(tmp_path: Path, case: str) -> None:
    mutate, fragment = REFUSALS[case]
    folder = write_prereg(tmp_path, mutate)
    result = run_proctor("prereg", "check", str(folder))
    assert result.code == 3
    assert result.out["refusal"] == "design_invalid"
    assert fragment in result.out["message"]


def test_a_design_that_is_a_folder_or_missing_is_named(tmp_path: Path) -> None:
    folder = write_prereg(tmp_path)
    with pytest.raises(Refusal) as caught:
        load_design(folder / "nothing.toml")
    assert caught.value.code == "file_missing"
    with pytest.raises(Refusal) as caught:
        load_design(folder)
    assert caught.value.code == "not_a_regular_file"


# --------------------------------------------------------------------------
# An arm's worker (issue 17 item 3): parsed strictly into `ArmWorker`, refused by name


def _with_worker(worker: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(d: dict[str, Any]) -> None:
        d["arms"][1]["worker"] = worker
    return mutate


def test_an_arm_names_its_worker(tmp_path: Path) -> None:
    from harness.workers.arm import ArmWorker

    folder = write_prereg(tmp_path, _with_worker({"kind": "llm-edit", "repair_turns": 2}))
    design = load_design(folder / "design.toml")
    assert design.arm("think").worker == ArmWorker("llm-edit", repair_turns=2)
    assert design.arm("direct").worker is None  # the system's catalog worker, as before
    command = {"kind": "command", "template": ["agent", "--prompt-file", "{prompt_file}", "--base-url", "{base_url}"]}
    other = write_prereg(tmp_path / "b", _with_worker(command))
    assert load_design(other / "design.toml").arm("think").worker == ArmWorker(
        "command", ("agent", "--prompt-file", "{prompt_file}", "--base-url", "{base_url}"))


@pytest.mark.parametrize(("worker", "code"), [
    ("aider", "arm_worker_unknown"),
    ({"kind": "claude"}, "arm_worker_unknown"),
    ({"kind": "llm-edit", "repair_turns": 99}, "repair_turns_invalid"),
    ({"kind": "llm-edit", "repair_turns": True}, "repair_turns_invalid"),
    ({"kind": "llm-edit", "turns": 2}, "arm_worker_invalid"),
    ({"kind": "command", "template": "agent --prompt {prompt_file}"}, "agent_template_shell_string"),
    ({"kind": "command", "template": ["agent", "{prompt_file}", "|", "tee", "log"]}, "agent_template_shell_syntax"),
    ({"kind": "command", "template": ["bash", "-c", "agent {prompt_file}"]}, "agent_template_shell_syntax"),
    ({"kind": "command", "template": ["agent", "{secret}"]}, "agent_template_placeholder_unknown"),
    ({"kind": "command"}, "agent_template_empty"),
    ({"kind": "command", "template": ["agent"], "repair_turns": 1}, "arm_worker_invalid"),
    (3, "arm_worker_invalid"),
])
def test_an_arm_worker_is_refused_by_name(tmp_path: Path, worker: Any, code: str) -> None:
    folder = write_prereg(tmp_path, _with_worker(worker))
    with pytest.raises(Refusal) as caught:
        load_design(folder / "design.toml")
    assert caught.value.code == code and "arms[1].worker" in caught.value.message, caught.value.message


def test_a_worker_on_a_completion_suite_is_refused_before_the_freeze(tmp_path: Path) -> None:
    folder = write_prereg(tmp_path, _with_worker({"kind": "llm-edit", "repair_turns": 1}))
    checked = run_proctor("prereg", "check", str(folder))
    assert checked.code == 3 and checked.out["refusal"] == "arm_worker_not_repo_task", checked.out
    assert "think" in checked.out["message"]
    frozen = run_proctor("prereg", "freeze", str(folder))
    assert frozen.code == 3 and frozen.out["refusal"] == "arm_worker_not_repo_task", frozen.out
    assert not (folder / "FROZEN.json").exists()
