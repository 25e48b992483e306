"""The task file and the lane table, in process.

`parse_task` must turn every malformed task into a named refusal carrying the
task's path; `load_task` reads strictly; `choose_lane` applies the lane table
(k3 over glm over flash, glm by default), honours an explicit lane with its
reason, and finds production entrypoints in the prompt, scope or verifier argv.
"""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.errors import Refusal
from harness.gate.lanes import PRODUCTION_ENTRYPOINTS, choose_lane, production_entrypoints
from harness.gate.task import FEATURES, LANES, Task, load_task, parse_task

PATH = "/tasks/demo/task.json"
SHA = "0" * 64
FLASH = ("localized", "bounded", "known_location", "objective_acceptance")
GLM = ("multi_module", "unfamiliar_repo", "substantial_refactor")
K3 = ("open_ended", "research_engineering", "marathon")

BASE: dict[str, Any] = {
    "task_id": "demo-task_1.0",
    "prompt": "Fix the bug in pkg/mod.py.",
    "features": list(FLASH),
    "scope": ["pkg/mod.py"],
    "verifier": {
        "argv": ["{python}", "-m", "pytest", "-q", "tests"],
        "seal": ["tests/test_visible.py"],
        "hidden": [{"from": "hidden/test_hidden.py", "to": "tests/test_hidden.py"}],
    },
    "budget": {"max_dispatches": 3, "max_stagnant": 2, "timeout_s": 60},
}


def doc(change: Callable[[dict[str, Any]], Any] | None = None) -> dict[str, Any]:
    """A deep copy of the valid base task, changed in place by `change`."""
    out = copy.deepcopy(BASE)
    if change is not None:
        change(out)
    return out


def parse(d: dict[str, Any]) -> Task:
    return parse_task(d, path=PATH, sha256=SHA)


def refused(d: dict[str, Any], code: str = "task_invalid") -> Refusal:
    with pytest.raises(Refusal) as info:
        parse(d)
    assert info.value.code == code, info.value.to_json()
    assert info.value.path == PATH
    body = info.value.to_json()
    assert body["ok"] is False and body["refusal"] == code and body["message"]
    return info.value


def task_with(**fields: Any) -> Task:
    return parse(doc(lambda d: d.update(fields)))


# --- a valid task -----------------------------------------------------------------


def test_base_task_parses_with_defaults() -> None:
    task = parse(doc())
    assert task.task_id == "demo-task_1.0"
    assert task.features == FLASH
    assert task.scope == ("pkg/mod.py",)
    assert task.verifier.seal == ("tests/test_visible.py",)
    assert [(h.source, h.to) for h in task.verifier.hidden] == [
        ("hidden/test_hidden.py", "tests/test_hidden.py")
    ]
    assert task.budget.max_dispatches == 3 and isinstance(task.budget.max_dispatches, int)
    assert task.budget.timeout_s == 60.0 and isinstance(task.budget.timeout_s, float)
    assert task.budget.verify_timeout_s == 600.0
    assert task.budget.max_preflight_age_s == 86400.0
    assert task.lane is None and task.lane_reason is None
    assert task.preflight_receipts == ()
    assert task.path == PATH and task.folder == "/tasks/demo" and task.sha256 == SHA


def test_optional_fields_default_when_absent() -> None:
    def strip(d: dict[str, Any]) -> None:
        del d["features"]
        del d["verifier"]["seal"]
        del d["verifier"]["hidden"]

    task = parse(doc(strip))
    assert task.features == ()
    assert task.verifier.seal == () and task.verifier.hidden == ()


def test_budget_overrides_are_taken() -> None:
    task = parse(
        doc(
            lambda d: d["budget"].update(verify_timeout_s=5, max_preflight_age_s=0.5, timeout_s=1.5)
        )
    )
    assert task.budget.verify_timeout_s == 5.0
    assert task.budget.max_preflight_age_s == 0.5
    assert task.budget.timeout_s == 1.5


def test_python_placeholder_resolves_to_the_running_interpreter() -> None:
    task = parse(
        doc(lambda d: d["verifier"].update(argv=["{python}", "-c", "x", "--py={python}", "plain"]))
    )
    assert task.verifier.argv[0] == "{python}"  # kept as written for the pin
    assert task.verifier.resolved_argv() == [
        sys.executable,
        "-c",
        "x",
        f"--py={sys.executable}",
        "plain",
    ]


def test_verifier_raw_is_the_object_as_written() -> None:
    task = parse(doc())
    assert task.verifier.raw == BASE["verifier"]


# --- load_task: strict reading --------------------------------------------------------


def test_load_task_hashes_the_bytes_read(tmp_path: Path) -> None:
    import hashlib

    path = tmp_path / "task.json"
    data = json.dumps(BASE, indent=1).encode()
    path.write_bytes(data)
    task = load_task(path)
    assert task.sha256 == hashlib.sha256(data).hexdigest()
    assert task.path == str(path)
    assert task.folder == str(tmp_path)


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b'{"task_id": "a", "task_id": "b"}', "json_duplicate_key"),
        (b'{"budget": NaN}', "json_non_finite"),
        (b'{"budget": 1e999}', "json_non_finite"),
        (b"\xff{}", "invalid_utf8"),
        (b"[]", "json_not_object"),
        (b"[" * 1000 + b"]" * 1000, "json_too_deep"),
        (b"{", "invalid_json"),
    ],
)
def test_load_task_refuses_bad_json(tmp_path: Path, raw: bytes, code: str) -> None:
    path = tmp_path / "task.json"
    path.write_bytes(raw)
    with pytest.raises(Refusal) as info:
        load_task(path)
    assert info.value.code == code
    assert info.value.path == str(path)


def test_load_task_refuses_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(Refusal) as info:
        load_task(tmp_path / "nope.json")
    assert info.value.code == "file_missing"


def test_load_task_refuses_over_four_mib(tmp_path: Path) -> None:
    path = tmp_path / "task.json"
    path.write_bytes(b'{"prompt": "' + b"x" * (4 * 1024 * 1024) + b'"}')
    with pytest.raises(Refusal) as info:
        load_task(path)
    assert info.value.code == "file_too_large"


# --- refusals: unknown keys at every level -----------------------------------------------


def test_unknown_top_level_key() -> None:
    err = refused(doc(lambda d: d.update(extra=1)))
    assert "extra" in err.message


def test_unknown_verifier_key() -> None:
    err = refused(doc(lambda d: d["verifier"].update(shell=True)))
    assert "shell" in err.message


def test_unknown_budget_key() -> None:
    err = refused(doc(lambda d: d["budget"].update(max_cost=1)))
    assert "max_cost" in err.message


def test_unknown_key_in_a_hidden_entry() -> None:
    refused(doc(lambda d: d["verifier"]["hidden"][0].update(mode="copy")))


# --- refusals: missing required fields -----------------------------------------------------


@pytest.mark.parametrize("key", ["task_id", "prompt", "scope", "verifier", "budget"])
def test_missing_required_key(key: str) -> None:
    refused(doc(lambda d: d.pop(key)))


@pytest.mark.parametrize("key", ["max_dispatches", "max_stagnant", "timeout_s"])
def test_missing_required_budget_key(key: str) -> None:
    err = refused(doc(lambda d: d["budget"].pop(key)))
    assert key in err.message


def test_missing_verifier_argv() -> None:
    refused(doc(lambda d: d["verifier"].pop("argv")), "verifier_argv_not_array")


@pytest.mark.parametrize("value", ["", "   ", None, 7, ["x"]])
def test_prompt_must_be_a_non_blank_string(value: Any) -> None:
    refused(doc(lambda d: d.update(prompt=value)))


# --- refusals: task_id ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "",
        " ",
        "-leading-dash",
        ".hidden",
        "_under",
        "has space",
        "slash/id",
        "dollar$",
        "a" * 129,
        "é",
        12,
        None,
    ],
)
def test_bad_task_id(value: Any) -> None:
    refused(doc(lambda d: d.update(task_id=value)))


@pytest.mark.parametrize("value", ["a", "A9", "x" * 128, "a.b_c-d", "0lead"])
def test_good_task_id(value: str) -> None:
    assert task_with(task_id=value).task_id == value


# --- refusals: features ----------------------------------------------------------------------


def test_unknown_feature() -> None:
    err = refused(doc(lambda d: d.update(features=["localized", "speedy"])))
    assert "speedy" in err.message


@pytest.mark.parametrize("value", ["localized", [1], [""], None, {"localized": True}])
def test_features_must_be_a_list_of_strings(value: Any) -> None:
    refused(doc(lambda d: d.update(features=value)))


# --- refusals: scope -----------------------------------------------------------------------------


def test_empty_scope() -> None:
    refused(doc(lambda d: d.update(scope=[])), "scope_empty")


@pytest.mark.parametrize(
    "value",
    [
        "/etc/passwd",
        "/abs/pkg/mod.py",
        "../outside.py",
        "pkg/../../x.py",
        "pkg/..",
        "..",
        "a\\..\\b",
        ".git/config",
        "nul\x00.py",
    ],
)
def test_scope_path_must_stay_inside(value: str) -> None:
    err = refused(doc(lambda d: d.update(scope=["pkg/mod.py", value])))
    assert "scope" in err.message


@pytest.mark.parametrize("value", ["pkg/mod.py", [""], [3], None])
def test_scope_must_be_a_list_of_strings(value: Any) -> None:
    refused(doc(lambda d: d.update(scope=value)))


def test_dotdot_inside_a_name_is_fine() -> None:
    assert task_with(scope=["pkg/a..b.py", "..hidden/x.py"]).scope == (
        "pkg/a..b.py",
        "..hidden/x.py",
    )


# --- refusals: verifier ----------------------------------------------------------------------------


@pytest.mark.parametrize("value", [None, [], "pytest -q", 3])
def test_verifier_must_be_an_object(value: Any) -> None:
    refused(doc(lambda d: d.update(verifier=value)))


def test_verifier_argv_as_a_shell_string() -> None:
    err = refused(
        doc(lambda d: d["verifier"].update(argv="python -m pytest -q tests")),
        "verifier_argv_not_array",
    )
    assert "shell" in err.message


@pytest.mark.parametrize(
    "value", [[], [""], ["python", 3], ["python", None], [["python"]], {"0": "python"}, 5]
)
def test_verifier_argv_must_be_non_empty_strings(value: Any) -> None:
    refused(doc(lambda d: d["verifier"].update(argv=value)), "verifier_argv_not_array")


@pytest.mark.parametrize("value", ["tests", [""], ["/abs/t.py"], ["../t.py"], [1]])
def test_bad_seal(value: Any) -> None:
    refused(doc(lambda d: d["verifier"].update(seal=value)))


@pytest.mark.parametrize(
    "entry",
    [
        "hidden/test_hidden.py",
        ["hidden/test_hidden.py", "tests/test_hidden.py"],
        {"from": "hidden/test_hidden.py"},
        {"to": "tests/test_hidden.py"},
        {"from": "", "to": "tests/test_hidden.py"},
        {"from": "hidden/test_hidden.py", "to": ""},
        {"from": 1, "to": "tests/test_hidden.py"},
        {"from": "hidden/test_hidden.py", "to": None},
        {"from": "hidden/test_hidden.py", "to": "/abs/test_hidden.py"},
        {"from": "hidden/test_hidden.py", "to": "../test_hidden.py"},
        {"from": "hidden/test_hidden.py", "to": ".git/hooks/pre-commit"},
        {"from": "h", "to": "t", "extra": 1},
    ],
)
def test_malformed_hidden_entry(entry: Any) -> None:
    refused(doc(lambda d: d["verifier"].update(hidden=[entry])))


def test_hidden_must_be_a_list() -> None:
    refused(doc(lambda d: d["verifier"].update(hidden={"from": "a", "to": "b"})))


def test_hidden_duplicate_destination() -> None:
    entries = [
        {"from": "hidden/a.py", "to": "tests/test_hidden.py"},
        {"from": "hidden/b.py", "to": "tests/test_hidden.py"},
    ]
    err = refused(doc(lambda d: d["verifier"].update(hidden=entries)))
    assert "twice" in err.message


def test_hidden_from_may_be_outside_the_task_folder() -> None:
    entries = [{"from": "/srv/private/tests.py", "to": "tests/test_hidden.py"}]
    task = parse(doc(lambda d: d["verifier"].update(hidden=entries)))
    assert task.verifier.hidden[0].source == "/srv/private/tests.py"


# --- refusals: budget -------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [None, [], 3, "60"])
def test_budget_must_be_an_object(value: Any) -> None:
    refused(doc(lambda d: d.update(budget=value)))


ALL_BUDGET_KEYS = [
    "max_dispatches",
    "max_stagnant",
    "timeout_s",
    "verify_timeout_s",
    "max_preflight_age_s",
]


@pytest.mark.parametrize("key", ALL_BUDGET_KEYS)
@pytest.mark.parametrize("value", [True, False, -1, 0, -0.5, 0.0, "3", "", None, [3], {"v": 3}])
def test_bad_budget_value(key: str, value: Any) -> None:
    err = refused(doc(lambda d: d["budget"].update({key: value})))
    assert f"budget.{key}" in err.message


@pytest.mark.parametrize("key", ["max_dispatches", "max_stagnant"])
@pytest.mark.parametrize("value", [3.0, 2.5, 1e3])
def test_float_for_an_integer_budget_field(key: str, value: float) -> None:
    err = refused(doc(lambda d: d["budget"].update({key: value})))
    assert "integer" in err.message


@pytest.mark.parametrize("key", ["timeout_s", "verify_timeout_s", "max_preflight_age_s"])
def test_integer_too_large_for_a_float_is_refused(key: str) -> None:
    # json.loads gives an int of 400 digits; float() of it would overflow (internal error).
    refused(doc(lambda d: d["budget"].update({key: 10**400})))


@pytest.mark.parametrize("key", ["timeout_s", "verify_timeout_s", "max_preflight_age_s"])
def test_non_finite_float_is_refused(key: str) -> None:
    refused(doc(lambda d: d["budget"].update({key: float("inf")})))
    refused(doc(lambda d: d["budget"].update({key: float("nan")})))


# --- refusals: lane -------------------------------------------------------------------------------------


@pytest.mark.parametrize("lane", ["gpt", "FLASH", "", 1, ["glm"]])
def test_lane_not_in_the_table(lane: Any) -> None:
    refused(doc(lambda d: d.update(lane=lane, lane_reason="because")))


def test_lane_without_reason() -> None:
    err = refused(doc(lambda d: d.update(lane="k3")))
    assert "lane_reason" in err.message


@pytest.mark.parametrize("reason", ["", "   ", 3, None, ["why"]])
def test_lane_with_a_blank_or_non_string_reason(reason: Any) -> None:
    refused(doc(lambda d: d.update(lane="glm", lane_reason=reason)))


def test_lane_reason_without_lane() -> None:
    err = refused(doc(lambda d: d.update(lane_reason="because")))
    assert "lane_reason" in err.message


@pytest.mark.parametrize("value", ["receipt.json", [""], [1], None])
def test_preflight_receipts_must_be_a_list_of_strings(value: Any) -> None:
    refused(doc(lambda d: d.update(preflight_receipts=value)))


# --- the lane table -------------------------------------------------------------------------------------


def test_all_four_flash_features_give_flash() -> None:
    decision = choose_lane(task_with(features=list(FLASH)))
    assert decision.lane == "flash"
    assert decision.explicit is False
    assert decision.production is False and decision.production_entrypoints == ()


@pytest.mark.parametrize("missing", FLASH)
def test_three_flash_features_default_to_glm(missing: str) -> None:
    decision = choose_lane(task_with(features=[f for f in FLASH if f != missing]))
    assert decision.lane == "glm"
    assert missing in decision.reason


def test_no_features_default_to_glm() -> None:
    decision = choose_lane(task_with(features=[]))
    assert decision.lane == "glm" and "default" in decision.reason


@pytest.mark.parametrize("feature", GLM)
def test_any_glm_feature_gives_glm_even_with_all_flash(feature: str) -> None:
    assert choose_lane(task_with(features=[*FLASH, feature])).lane == "glm"
    assert choose_lane(task_with(features=[feature])).lane == "glm"


@pytest.mark.parametrize("feature", K3)
def test_any_k3_feature_gives_k3_and_wins(feature: str) -> None:
    assert choose_lane(task_with(features=[feature])).lane == "k3"
    assert choose_lane(task_with(features=[*FLASH, feature])).lane == "k3"
    assert choose_lane(task_with(features=[*FLASH, *GLM, feature])).lane == "k3"


@pytest.mark.parametrize("lane", LANES)
def test_explicit_lane_overrides_the_table(lane: str) -> None:
    for features in ([], list(FLASH), list(K3), list(GLM)):
        decision = choose_lane(task_with(features=features, lane=lane, lane_reason="known to work"))
        assert decision.lane == lane
        assert decision.explicit is True
        assert "known to work" in decision.reason


def test_decision_to_json() -> None:
    body = choose_lane(task_with(prompt="runs src.run_all nightly")).to_json()
    assert body == {
        "lane": "flash",
        "reason": body["reason"],
        "explicit": False,
        "production": True,
        "production_entrypoints": ["src.run_all"],
    }


# --- production entrypoints ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", PRODUCTION_ENTRYPOINTS)
def test_entrypoint_in_the_prompt(name: str) -> None:
    decision = choose_lane(task_with(prompt=f"Then run {name} to check."))
    assert decision.production_entrypoints == (name,)
    assert decision.production is True


@pytest.mark.parametrize("name", PRODUCTION_ENTRYPOINTS)
def test_entrypoint_in_the_scope(name: str) -> None:
    task = task_with(scope=["pkg/mod.py", f"{name}"])
    assert production_entrypoints(task) == (name,)


@pytest.mark.parametrize("name", PRODUCTION_ENTRYPOINTS)
def test_entrypoint_in_the_verifier_argv(name: str) -> None:
    task = parse(doc(lambda d: d["verifier"].update(argv=["{python}", "-m", name])))
    assert production_entrypoints(task) == (name,)


def test_all_five_named_expected_entrypoints() -> None:
    assert set(PRODUCTION_ENTRYPOINTS) == {
        "run_week.ps1",
        "src.run_all",
        "src.run_weekly",
        "run_readiness_doctor",
        "morning_battery",
    }


@pytest.mark.parametrize("where", ["prompt", "scope", "argv"])
def test_slashed_form_src_run_all_py(where: str) -> None:
    def put(d: dict[str, Any]) -> None:
        if where == "prompt":
            d["prompt"] = "Edit src/run_all.py so the nightly job works."
        elif where == "scope":
            d["scope"] = ["src/run_all.py"]
        else:
            d["verifier"]["argv"] = ["{python}", "src/run_all.py", "--dry-run"]

    task = parse(doc(put))
    assert production_entrypoints(task) == ("src.run_all",)


def test_slashed_src_run_weekly_and_several_at_once() -> None:
    task = task_with(prompt="src/run_weekly.py calls morning_battery and run_week.ps1")
    assert set(production_entrypoints(task)) == {
        "src.run_weekly",
        "morning_battery",
        "run_week.ps1",
    }


def test_no_entrypoint_in_an_ordinary_task() -> None:
    task = task_with(prompt="Fix src.run (not the whole thing) and run_weeks.ps")
    assert production_entrypoints(task) == ()


def test_production_flag_survives_an_explicit_lane() -> None:
    decision = choose_lane(task_with(prompt="src.run_all", lane="k3", lane_reason="reviewed"))
    assert decision.lane == "k3" and decision.explicit
    assert decision.production_entrypoints == ("src.run_all",)


# --- property: the table's precedence over any subset of features -------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.sets(st.sampled_from(sorted(FEATURES))))
def test_lane_table_precedence(features: set[str]) -> None:
    decision = choose_lane(task_with(features=sorted(features)))
    assert decision.lane in LANES
    assert decision.explicit is False
    if features & set(K3):
        assert decision.lane == "k3"
    elif features & set(GLM):
        assert decision.lane == "glm"
    elif features >= set(FLASH):
        assert decision.lane == "flash"
    else:
        assert decision.lane == "glm"


@settings(max_examples=100, deadline=None)
@given(st.sets(st.sampled_from(sorted(FEATURES))), st.sampled_from(LANES))
def test_explicit_lane_always_wins(features: set[str], lane: str) -> None:
    decision = choose_lane(task_with(features=sorted(features), lane=lane, lane_reason="r"))
    assert decision.lane == lane and decision.explicit is True
