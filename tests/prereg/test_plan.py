"""`proctor plan`: deterministic, interleaved, exact request bodies; never reads answers, credentials or the network.

Every fixture is built under tmp_path: a tiny suite (12 items with a sealed
private part holding marked canonical solutions) and a preregistration naming
the bundled simulator's catalog ids, frozen with `harness.prereg.freeze.freeze`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.errors import Code, Refusal
from harness.evidence.jsonio import canonical_line
from harness.prereg import freeze as prereg
from harness.prereg import plan as plan_module
from harness.prereg.frozen import check_frozen
from harness.prereg.order import draw, permutation
from harness.prereg.plan import SCOPES, apply_template, plan_study, run_id, write_plan
from harness.providers.base import GenerationSettings, ProviderRequest
from harness.providers.catalog import BUNDLED_CATALOG
from harness.providers.common import make_request
from harness.records.plan import PlanCell
from harness.run.attempts import read_plan
from tests.support.cli import run_proctor
from tests.support.guard import guarded_env
from tests.support.paths import REPO

SEED = 20261130
SYSTEMS = (  # slot, provider, model, setting, pricing key
    ("cheap", "sim", "sim-flash", "default", "sim-flash"),
    ("mid", "sim", "sim-glm", "low", "sim-glm"),
    ("strong", "sim", "sim-k3", "default", "sim-k3"),
)
CAREFUL = "Complete the function. Keep {braces} and {other} as they are.\\n\\n{prompt}\\n\\nReturn only code."
SECRET = "sk-SECRET-do-not-leak-7f3a9c"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def packet_records(n: int) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        # Braces, a literal {prompt} and non-ASCII text: the template must be applied as plain text.
        prompt = f'def f{i}(x: dict) -> dict:\n    """Return {{"k{i}": x}}; café {{prompt}} {{0}}."""\n'
        out.append({"entry_point": f"f{i}", "item": f"T/{i:02d}", "metadata": {"source_index": i}, "prompt": prompt})
    return out


def solution(i: int) -> str:
    return f"    return {{'SOLUTION_MARKER_{i:02d}': x}}\n"


def canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


@dataclass
class Study:
    root: Path
    prereg: Path
    packet: Path
    suite: Path


def design_toml(packet_sha: str, *, draw_items: int, lanes: int) -> str:
    systems = "".join(
        f'[[systems]]\nslot = "{slot}"\nprovider = "{prov}"\nmodel = "{model}"\nsetting = "{setting}"\n'
        f'pricing_key = "{key}"\ncap_usd = 1.0\n\n'
        for slot, prov, model, setting, key in SYSTEMS
    )
    return f"""[study]
id = "tiny"
seed = {SEED}
title = "A tiny study for the planner's tests"

[suite]
name = "tiny"
packet = "../../evals/tiny/packet.jsonl"
packet_sha256 = "{packet_sha}"

[draw]
items = {draw_items}

{systems}[[arms]]
id = "direct"
template = "{{prompt}}"

[[arms]]
id = "careful"
template = "{CAREFUL}"
temperature = 0.2

[[stages]]
id = "A"
systems = ["strong", "cheap"]
arms = ["direct", "careful"]
items = 6
repeats = 2

[[stages]]
id = "B"
systems = ["mid"]
arms = ["direct"]
items = 8
repeats = 1

[budgets]
reserve_per_item_usd = 0.01
overall_cap_usd = 5.0
ceiling_margin_usd = 0.5
spend_before_usd = 0.0

[run]
lanes_per_system = {lanes}
attempt_deadline_s = 60
reruns = 1
transport_retries = 3
max_output_tokens = 512
full_repeats = 3

[analysis]
alpha = 0.05
power = 0.8
test = "paired_tost"
clustering = "item"

[[analysis.comparisons]]
a = "cheap"
b = "strong"
arm = "direct"
margin = 0.10
expected_a = 0.60
expected_b = 0.65
correlation = 0.5
"""


def make_study(
    root: Path,
    *,
    items: int = 12,
    draw_items: int = 10,
    lanes: int = 2,
    packet_bytes: bytes | None = None,
    catalog: str | None = None,
    frozen: bool = True,
    monkeypatch: pytest.MonkeyPatch | None = None,
) -> Study:
    """Write evals/tiny (packet + private) and prereg/tiny under `root`, and freeze it.

    With `monkeypatch`, freeze skips its own packet check, so a bad packet can be
    frozen and the planner's own refusals tested.
    """
    suite = root / "evals" / "tiny"
    (suite / "private").mkdir(parents=True)
    packet = suite / "packet.jsonl"
    data = packet_bytes if packet_bytes is not None else b"".join(canonical(r) for r in packet_records(items))
    packet.write_bytes(data)
    private = [
        {
            "canonical_solution": solution(i), "entry_point": f"f{i}", "item": f"T/{i:02d}",
            "test": f"def check(c):\n    assert c({{}}) == {{'SOLUTION_MARKER_{i:02d}': {{}}}}\n",
        }
        for i in range(items)
    ]
    (suite / "private" / "items.jsonl").write_bytes(b"".join(canonical(r) for r in private))
    folder = root / "prereg" / "tiny"
    folder.mkdir(parents=True)
    (folder / "design.toml").write_text(design_toml(sha(data), draw_items=draw_items, lanes=lanes), encoding="utf-8")
    (folder / "PREREG.md").write_text("# Tiny\n\nA preregistration for tests.\n", encoding="utf-8")
    manifest = {"study": "tiny", "systems": [
        {"slot": s, "provider": p, "model": m, "setting": st} for s, p, m, st, _ in SYSTEMS
    ]}
    (folder / "systems.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    if catalog is not None:
        (folder / "catalog.toml").write_text(catalog, encoding="utf-8")
    if frozen:
        if monkeypatch is not None:
            with monkeypatch.context() as m:
                m.setattr(prereg, "resolve_packet", lambda design: (0, ""))
                prereg.freeze(folder)
        else:
            prereg.freeze(folder)
    return Study(root, folder, packet, suite)


@pytest.fixture
def study(tmp_path: Path) -> Study:
    return make_study(tmp_path / "one")


def plan_cli(study: Study, scope: str, out: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    done = run_proctor("plan", str(study.prereg), "--scope", scope, "--out", str(out), env=env)
    assert done.code == 0, done.out
    return done.out


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_bytes().splitlines()]


# --- determinism ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("scope", SCOPES)
def test_plans_are_byte_identical_across_processes_hash_seeds_and_folders(
    study: Study, tmp_path: Path, scope: str
) -> None:
    outs = []
    for i, hash_seed in enumerate(("0", "1", "random")):
        out = tmp_path / f"plan-{i}.jsonl"
        result = plan_cli(study, scope, out, env={"PYTHONHASHSEED": hash_seed})
        assert result["sha256"] == sha(out.read_bytes())
        outs.append(out.read_bytes())
    copy_root = tmp_path / "elsewhere" / "deeper" / "copy"
    shutil.copytree(study.root, copy_root)
    suite = copy_root / "evals" / "tiny"
    copy = Study(copy_root, copy_root / "prereg" / "tiny", suite / "packet.jsonl", suite)
    out = tmp_path / "plan-copy.jsonl"
    plan_cli(copy, scope, out, env={"PYTHONHASHSEED": "12345"})
    outs.append(out.read_bytes())
    assert len(set(outs)) == 1
    assert str(tmp_path).encode() not in outs[0]  # no absolute path in a plan
    in_process = plan_study(study.prereg, scope).to_bytes()
    assert in_process == outs[0]


def test_the_environment_cannot_steer_the_catalog(study: Study, tmp_path: Path) -> None:
    plain, steered = tmp_path / "plain.jsonl", tmp_path / "steered.jsonl"
    plan_cli(study, "pilot", plain)
    bogus = tmp_path / "bogus.toml"
    bogus.write_text("not a catalog", encoding="utf-8")
    env = {"PROCTOR_CATALOG": str(bogus), "PROCTOR_SIM_URL": "http://10.0.0.1:1/v1"}
    plan_cli(study, "pilot", steered, env=env)
    assert plain.read_bytes() == steered.read_bytes()


# --- header and records ---------------------------------------------------------------------------------


def test_header_records_every_input_hash_and_the_draw(study: Study, tmp_path: Path) -> None:
    out = tmp_path / "plan.jsonl"
    plan_cli(study, "pilot", out)
    header, *requests = lines(out)
    ids = [r["item"] for r in packet_records(12)]
    assert header == {
        "kind": "plan-header.v1", "study": "tiny", "scope": "pilot", "seed": SEED,
        "design_sha256": sha((study.prereg / "design.toml").read_bytes()),
        "frozen_sha256": sha((study.prereg / "FROZEN.json").read_bytes()),
        "systems_sha256": sha((study.prereg / "systems.json").read_bytes()),
        "packet_sha256": sha(study.packet.read_bytes()),
        "catalog_sha256": sha(BUNDLED_CATALOG.read_bytes()),
        "amendments": [], "requests": len(requests), "draw": draw(SEED, ids, 10),
    }
    assert all(r["kind"] == "plan-request.v1" for r in requests)
    raw = out.read_bytes().splitlines(keepends=True)
    assert all(line == canonical(json.loads(line)) for line in raw)  # canonical lines, not a chained log
    assert not any("prev" in r for r in [header, *requests])


def test_the_attempts_reader_accepts_every_scope(study: Study, tmp_path: Path) -> None:
    for scope in SCOPES:
        out = tmp_path / f"{scope}.jsonl"
        write_plan(study.prereg, scope, out)
        read = read_plan(out)
        assert read.scope == scope and len(read.requests) == read.header["requests"]


@pytest.mark.parametrize(
    ("scope", "expected"),
    [
        # A: 2 systems x 2 arms x 6 items x 2 repeats; B: 1 system x 1 arm x 8 items x 1 repeat
        ("pilot", {"A": {"cheap": 24, "strong": 24}, "B": {"mid": 8}}),
        ("matrix-once", {"matrix": {"cheap": 20, "mid": 20, "strong": 20}}),
        ("full", {"full": {"cheap": 60, "mid": 60, "strong": 60}}),
    ],
)
def test_each_scope_counts(study: Study, scope: str, expected: dict[str, dict[str, int]]) -> None:
    plan = plan_study(study.prereg, scope)
    counts = plan.counts()
    totals = {stage: {slot: sum(lanes) for slot, lanes in by.items()} for stage, by in counts.items()}
    assert totals == expected
    assert len(plan.cells) == sum(sum(v.values()) for v in expected.values())
    drawn = list(plan.draw)
    for cell in plan.cells:
        if scope == "pilot":
            stage = {"A": (6, 2), "B": (8, 1)}[cell.stage]
            assert cell.item in drawn[: stage[0]] and 1 <= cell.repeat <= stage[1]
        elif scope == "matrix-once":
            assert cell.repeat == 1
        else:
            assert 1 <= cell.repeat <= 3
    if scope == "matrix-once":
        every = {(c.system, c.item, c.arm) for c in plan.cells}
        assert len(every) == len(plan.cells) == 3 * 10 * 2


def test_execution_order_is_stage_system_lane_position_arm_repeat(study: Study) -> None:
    slots = [s[0] for s in SYSTEMS]
    for scope in SCOPES:
        cells = list(plan_study(study.prereg, scope).cells)
        stages = list(dict.fromkeys(c.stage for c in cells))
        keys = [
            (stages.index(c.stage), slots.index(c.system), c.lane, c.lane_position, c.arm_position, c.repeat)
            for c in cells
        ]
        assert keys == sorted(keys) and len(set(keys)) == len(keys)
    pilot = plan_study(study.prereg, "pilot").cells
    # Stage A lists "strong" first; the registered order (cheap, mid, strong) wins.
    assert list(dict.fromkeys(c.system for c in pilot if c.stage == "A")) == ["cheap", "strong"]


@pytest.mark.parametrize("lanes", [1, 2, 3, 4])
def test_lanes_hold_the_permutation_alternately(tmp_path: Path, lanes: int) -> None:
    s = make_study(tmp_path, lanes=lanes)
    for scope in SCOPES:
        plan = plan_study(s.prereg, scope)
        per: dict[tuple[str, str], dict[int, dict[int, str]]] = defaultdict(lambda: defaultdict(dict))
        for c in plan.cells:
            seen = per[(c.stage, c.system)][c.lane].setdefault(c.lane_position, c.item)
            assert seen == c.item  # one item per lane position
        for (stage, slot), by_lane in per.items():
            items = sorted({c.item for c in plan.cells if c.stage == stage and c.system == slot})
            order = permutation(SEED, f"items:{stage}:{slot}", items)
            for lane in range(lanes):
                in_lane = [by_lane[lane][p] for p in sorted(by_lane.get(lane, {}))]
                assert in_lane == order[lane::lanes]  # in the permutation's order, alternating
                assert sorted(by_lane.get(lane, {})) == list(range(len(in_lane)))
            assert set(by_lane) <= set(range(lanes))


def test_arm_orders_come_from_the_item_permutation_and_repeats_follow_arms(study: Study) -> None:
    plan = plan_study(study.prereg, "pilot")
    a_cells = [c for c in plan.cells if c.stage == "A" and c.system == "cheap"]
    by_item: dict[str, list[PlanCell]] = defaultdict(list)
    for c in a_cells:
        by_item[c.item].append(c)
    orders = set()
    for item, cells in by_item.items():
        arms = permutation(SEED, f"arms:A:cheap:{item}", ["direct", "careful"])
        assert [(c.arm, c.repeat) for c in cells] == [(a, r) for a in arms for r in (1, 2)]
        assert all(c.arm_position == arms.index(c.arm) for c in cells)
        orders.add(tuple(arms))
    assert len(orders) == 2  # six items under one seed do not all share an order


def test_run_ids_are_unique_and_derived(study: Study) -> None:
    seen: set[str] = set()
    for scope in SCOPES:
        ids = [c.run_id for c in plan_study(study.prereg, scope).cells]
        assert len(ids) == len(set(ids))
        assert not seen & set(ids)  # the stage is part of the id: scopes never share one
        seen |= set(ids)
    c = plan_study(study.prereg, "pilot").cells[0]
    digest = sha(json.dumps([c.study, c.stage, c.system, c.item, c.arm, c.repeat], separators=(",", ":")).encode())
    assert c.run_id == run_id(c.study, c.stage, c.system, c.item, c.arm, c.repeat) == "r-" + digest[:20]


def test_prompts_and_bodies_are_exact(study: Study) -> None:
    packet = {r["item"]: r["prompt"] for r in packet_records(12)}
    templates = {"direct": "{prompt}", "careful": CAREFUL.replace("\\n", "\n")}
    settings = {slot: setting for slot, _, _, setting, _ in SYSTEMS}
    for scope in SCOPES:
        for c in plan_study(study.prereg, scope).cells:
            assert c.prompt == templates[c.arm].replace("{prompt}", packet[c.item])
            assert c.prompt_sha256 == sha(c.prompt.encode("utf-8"))
            assert c.request_sha256 == sha(c.request_body.encode("utf-8"))
            body = json.loads(c.request_body)
            want: dict[str, Any] = {
                "model": c.api_model, "max_tokens": 512, "messages": [{"role": "user", "content": c.prompt}],
            }
            if c.arm == "careful":
                want["temperature"] = 0.2
            if settings[c.system] != "default":
                want["reasoning_effort"] = settings[c.system]
            assert body == want  # no system prompt, no tools, no sampling beyond what is registered
            assert c.request_body.encode("utf-8") == canonical(body)[:-1]
            assert (c.api_shape, c.provider, c.setting) == ("openai_chat", "sim", settings[c.system])
    careful = next(c for c in plan_study(study.prereg, "pilot").cells if c.arm == "careful")
    assert "{braces} and {other}" in careful.prompt and "{prompt} {0}" in careful.prompt and "café" in careful.prompt


def test_apply_template_is_plain_text_replacement() -> None:
    assert apply_template("a {prompt} b {x} {0}", "{prompt}{}") == "a {prompt}{} b {x} {0}"


def test_a_preregistered_catalog_is_used_and_its_base_url_never_reaches_the_plan(tmp_path: Path) -> None:
    text = BUNDLED_CATALOG.read_text(encoding="utf-8")
    text = text.replace('id = "sim-flash"\n', 'id = "sim-flash"\napi_model = "vendor/flash-2025"\n')
    text = text.replace("http://127.0.0.1:8765/v1", "https://api.example.invalid/v9")
    s = make_study(tmp_path, catalog=text)
    plan = plan_study(s.prereg, "matrix-once")
    cheap = [c for c in plan.cells if c.system == "cheap"]
    assert {c.api_model for c in cheap} == {"vendor/flash-2025"} and {c.model for c in cheap} == {"sim-flash"}
    assert all(json.loads(c.request_body)["model"] == "vendor/flash-2025" for c in cheap)
    assert plan.catalog_sha256 == sha((s.prereg / "catalog.toml").read_bytes())
    data = plan.to_bytes()
    assert b"example.invalid" not in data and b"127.0.0.1" not in data and b"plan.invalid" not in data


def test_a_body_that_depends_on_the_base_url_is_an_internal_error(
    study: Study, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Leaky:
        API_SHAPE = "openai_chat"

        @staticmethod
        def build_request(
            model: str, prompt: str, settings: GenerationSettings, base_url: str
        ) -> ProviderRequest:
            body = {"model": model, "url": base_url}
            return make_request("openai_chat", model, base_url, body, (), "Authorization")

    monkeypatch.setattr(plan_module, "adapter_for", lambda shape: Leaky)
    with pytest.raises(RuntimeError, match="base URL"):
        plan_study(study.prereg, "pilot")


def test_amendments_are_listed_in_the_header(study: Study) -> None:
    (study.prereg / "PREREG.md").write_text("# Tiny\n\nClarified the text.\n", encoding="utf-8")
    prereg.amend(study.prereg, "clarify the text")
    plan = plan_study(study.prereg, "pilot")
    header = json.loads(plan.to_bytes().splitlines()[0])
    assert [a["reason"] for a in header["amendments"]] == ["clarify the text"]
    assert header["amendments"][0]["changed"][0]["path"] == "PREREG.md"


# --- answers never enter ----------------------------------------------------------------------------------


def test_the_plan_holds_no_answer_and_needs_no_private_part(study: Study, tmp_path: Path) -> None:
    with_private = tmp_path / "with.jsonl"
    plan_cli(study, "full", with_private)
    data = with_private.read_bytes()
    for i in range(12):
        assert f"SOLUTION_MARKER_{i:02d}".encode() not in data
        assert solution(i).encode() not in data
    assert b"def check" not in data and b"canonical_solution" not in data
    shutil.rmtree(study.suite / "private")
    without = tmp_path / "without.jsonl"
    plan_cli(study, "full", without)
    assert without.read_bytes() == data


HUMANEVAL = REPO / "evals" / "humaneval"


@pytest.mark.skipif(not (HUMANEVAL / "private" / "items.jsonl").exists(), reason="the HumanEval suite is not built")
def test_a_humaneval_plan_holds_none_of_its_canonical_solutions(tmp_path: Path) -> None:
    s = make_study(tmp_path, packet_bytes=(HUMANEVAL / "packet.jsonl").read_bytes(), draw_items=40)
    plan = plan_study(s.prereg, "full")
    data = plan.to_bytes()
    private = [json.loads(line) for line in (HUMANEVAL / "private" / "items.jsonl").read_bytes().splitlines()]
    drawn = [r for r in private if r["item"] in set(plan.draw)]
    assert len(drawn) == 40
    for record in drawn:
        body = record["canonical_solution"].strip()
        for form in (body, json.dumps(body)[1:-1], json.dumps(json.dumps(body)[1:-1])[1:-1]):
            assert form.encode() not in data, record["item"]
        assert json.dumps(record["test"].strip())[1:-1].encode() not in data
    assert {c.item for c in plan.cells} == set(plan.draw)


AUDIT = """
import atexit, os, sys
_opened = []
def _hook(event, args):
    if event == "open" and args and isinstance(args[0], (str, bytes)):
        _opened.append(os.fsdecode(args[0]))
    elif event == "os.listdir" and args:
        _opened.append(os.fsdecode(args[0]) if args[0] is not None else ".")
sys.addaudithook(_hook)
def _dump():
    with open(os.environ["OPEN_LOG"], "w", encoding="utf-8") as fh:
        fh.write("\\n".join(_opened))
atexit.register(_dump)
"""


def test_the_planner_opens_nothing_under_the_private_part(study: Study, tmp_path: Path) -> None:
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(AUDIT, encoding="utf-8")
    log = tmp_path / "opened.txt"
    env = {**os.environ, "PYTHONPATH": str(hooks), "OPEN_LOG": str(log)}
    env = {k: v for k, v in env.items() if not k.startswith("PROCTOR_")}
    out = tmp_path / "plan.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "harness", "plan", str(study.prereg), "--scope", "pilot", "--out", str(out), "--json"],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr
    opened = log.read_text(encoding="utf-8").splitlines()
    assert str(study.packet) in opened and str(study.prereg / "design.toml") in opened  # the hook saw the reads
    assert not [p for p in opened if "private" in p.split(os.sep)], opened
    assert not [p for p in opened if str(study.suite) in p and p != str(study.packet)]


# --- no network, no credentials ----------------------------------------------------------------------------


CREDENTIALS = {
    "OPENAI_API_KEY": SECRET, "ANTHROPIC_API_KEY": SECRET + "-a", "GEMINI_API_KEY": SECRET + "-g",
    "GOOGLE_API_KEY": SECRET + "-G", "PROCTOR_SIM_URL": "http://127.0.0.1:9/v1",
}


def test_the_socket_guard_works(tmp_path: Path) -> None:
    env, log = guarded_env(tmp_path, CREDENTIALS)
    done = subprocess.run(
        [sys.executable, "-c", "import socket; socket.create_connection(('127.0.0.1', 9))"],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )
    assert done.returncode != 0 and "socket guard" in done.stderr
    assert log.read_text(encoding="utf-8")


def test_plan_and_prereg_check_open_no_connection_and_leak_no_credential(study: Study, tmp_path: Path) -> None:
    env, log = guarded_env(tmp_path, CREDENTIALS)
    out = tmp_path / "plan.jsonl"
    for words in (
        ["plan", str(study.prereg), "--scope", "full", "--out", str(out)],
        ["plan", str(study.prereg), "--scope", "pilot", "--out", str(tmp_path / "human.jsonl")],
        ["prereg", "check", str(study.prereg), "--json"],
    ):
        done = subprocess.run(
            [sys.executable, "-m", "harness", *words, *(["--json"] if words[0] == "plan" and "full" in words else [])],
            capture_output=True, text=True, env=env, cwd=REPO, timeout=120, check=False,
        )
        assert done.returncode == 0, (words, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr
        assert SECRET not in done.stdout + done.stderr
    assert not log.exists(), log.read_text(encoding="utf-8")  # nothing even tried to connect
    for path in (out, tmp_path / "human.jsonl"):
        data = path.read_bytes()
        assert SECRET.encode() not in data and b"sk-" not in data and b"127.0.0.1" not in data


# --- the command --------------------------------------------------------------------------------------------


def test_json_output_reports_counts_and_the_plan_sha256(study: Study, tmp_path: Path) -> None:
    out = tmp_path / "plan.jsonl"
    result = plan_cli(study, "pilot", out)
    # issue 13 item 10: the scope is given by its name, and the counts are labelled
    assert result == {
        "ok": True, "study": "tiny", "scope": "@stages", "scope_means": "every registered stage, as registered",
        "scope_recorded": "pilot", "plan": str(out), "sha256": sha(out.read_bytes()),
        "requests": 56, "draw_items": 10, "warnings": [],
        "requests_by_stage": {
            "A": {"requests": 48, "systems": {"cheap": {"requests": 24, "requests_per_lane": [12, 12]},
                                              "strong": {"requests": 24, "requests_per_lane": [12, 12]}}},
            "B": {"requests": 8, "systems": {"mid": {"requests": 8, "requests_per_lane": [4, 4]}}},
        },
    }


def test_scopes_are_named_apart_from_stage_ids_and_the_old_spellings_are_aliases(tmp_path: Path) -> None:
    # A stage may be called "pilot"; the scope of every registered stage is "@stages", which no stage id can be.
    s = make_study(tmp_path, frozen=False)
    design = s.prereg / "design.toml"
    design.write_text(design.read_text().replace('id = "A"', 'id = "pilot"').replace('"A"', '"pilot"'))
    prereg.freeze(s.prereg)
    named, alias = tmp_path / "named.jsonl", tmp_path / "alias.jsonl"
    by_name = plan_cli(s, "@stages", named)
    by_alias = plan_cli(s, "pilot", alias)
    assert named.read_bytes() == alias.read_bytes()  # the same plan, recorded as before
    assert lines(named)[0]["scope"] == "pilot"
    assert by_name["scope"] == by_alias["scope"] == "@stages"
    assert set(by_name["requests_by_stage"]) == {"pilot", "B"}  # every stage, not the stage 'pilot'
    assert by_name["warnings"] == []
    assert by_alias["warnings"] == ["--scope pilot is the old spelling of @stages (every registered stage, as "
                                    "registered), not the stage 'pilot'"]
    for name, old in (("@matrix-once", "matrix-once"), ("@full", "full")):
        assert plan_study(s.prereg, name).to_bytes() == plan_study(s.prereg, old).to_bytes()
    done = run_proctor("plan", str(s.prereg), "--scope", "A", "--out", str(tmp_path / "x.jsonl"))
    assert done.code == 2 and "@stages" in done.out["message"]


def test_human_output_shows_the_counts(study: Study, tmp_path: Path) -> None:
    out = tmp_path / "plan.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "harness", "plan", str(study.prereg), "--scope", "matrix-once", "--out", str(out)],
        capture_output=True, text=True, cwd=REPO, timeout=120, check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith("PROCTOR_")},
    )
    assert done.returncode == 0, done.stderr
    assert "requests: 60" in done.stdout and "matrix:" in done.stdout and "cheap:" in done.stdout
    assert sha(out.read_bytes()) in done.stdout


def test_the_plan_replaces_its_file_atomically(study: Study, tmp_path: Path) -> None:
    out = tmp_path / "plan.jsonl"
    out.write_text("an older plan\n", encoding="utf-8")
    plan_cli(study, "pilot", out)
    assert out.read_bytes() == plan_study(study.prereg, "pilot").to_bytes()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".plan")] == []


# --- refusals through the CLI: exit 3, named, with the path, no traceback ----------------------------------------


def refused(study: Study, tmp_path: Path, scope: str = "pilot") -> dict[str, Any]:
    out = tmp_path / "refused.jsonl"
    done = run_proctor("plan", str(study.prereg), "--scope", scope, "--out", str(out))
    assert done.code == 3, done.out
    assert done.out["ok"] is False and "path" in done.out
    assert not out.exists()
    human = subprocess.run(
        [sys.executable, "-m", "harness", "plan", str(study.prereg), "--scope", scope, "--out", str(out)],
        capture_output=True, text=True, cwd=REPO, timeout=120, check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith("PROCTOR_")},
    )
    assert human.returncode == 3 and human.stdout == ""
    assert human.stderr.startswith(f"refused: {done.out['refusal']}:") and "Traceback" not in human.stderr
    return done.out


def test_refuses_an_unfrozen_preregistration(tmp_path: Path) -> None:
    s = make_study(tmp_path, frozen=False)
    out = refused(s, tmp_path)
    assert out["refusal"] == "prereg_not_frozen" and out["path"] == str(s.prereg)


def test_refuses_a_preregistration_changed_since_its_freeze(study: Study, tmp_path: Path) -> None:
    design = study.prereg / "design.toml"
    design.write_text(design.read_text(encoding="utf-8").replace("repeats = 2", "repeats = 3"), encoding="utf-8")
    out = refused(study, tmp_path)
    assert out["refusal"] == "prereg_changed_since_freeze" and out["changed"] == ["design.toml"]
    assert "design.toml" in out["message"] and out["path"] == str(study.prereg)


def test_refuses_a_packet_whose_sha256_is_not_the_registered_one(study: Study, tmp_path: Path) -> None:
    with study.packet.open("ab") as fh:
        fh.write(canonical({"entry_point": "g", "item": "T/99", "metadata": {}, "prompt": "def g(): pass\n"}))
    out = refused(study, tmp_path)
    assert out["refusal"] == "packet_sha256_mismatch" and out["path"] == str(study.packet)


def test_refuses_a_packet_with_a_forbidden_key_naming_the_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = packet_records(12)
    records[4]["metadata"] = {"canonical_solution": solution(4)}
    data = b"".join(canonical(r) for r in records)
    s = make_study(tmp_path, packet_bytes=data, monkeypatch=monkeypatch)
    out = refused(s, tmp_path)
    assert out["refusal"] == "packet_forbidden_key" and out["line"] == 5 and "line 5" in out["message"]
    assert out["path"] == str(s.packet)


@pytest.mark.parametrize(
    ("mangle", "code", "line"),
    [
        (lambda rs: [*rs, rs[3]], "packet_duplicate_item", 13),
        (lambda rs: [*rs[:2], {}, *rs[2:]], "packet_blank_record", 3),
        (  # a private item record pasted in
            lambda rs: [*rs[:6], {"item": "T/06", "canonical_solution": "x", "test": "y"}, *rs[7:]],
            "packet_forbidden_key",
            7,
        ),
    ],
)
def test_refuses_other_bad_packets_naming_the_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mangle: Any, code: str, line: int
) -> None:
    data = b"".join(canonical(r) for r in mangle(packet_records(12)))
    s = make_study(tmp_path, packet_bytes=data, monkeypatch=monkeypatch)
    out = refused(s, tmp_path)
    assert out["refusal"] == code and out["line"] == line and out["path"] == str(s.packet)


def test_refuses_a_draw_larger_than_the_packet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = make_study(tmp_path, draw_items=13, monkeypatch=monkeypatch)
    out = refused(s, tmp_path)
    assert out["refusal"] == "draw_exceeds_packet" and out["path"] == str(s.packet)
    assert "13" in out["message"] and "12" in out["message"]


def test_refuses_a_catalog_that_disagrees_with_the_design(
    study: Study, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    text = BUNDLED_CATALOG.read_text(encoding="utf-8").replace('pricing_key = "sim-glm"', 'pricing_key = "other"')
    other = tmp_path / "other-catalog.toml"
    other.write_text(text, encoding="utf-8")
    monkeypatch.setattr(plan_module, "BUNDLED_CATALOG", other)
    with pytest.raises(Refusal) as caught:
        plan_study(study.prereg, "pilot")
    assert caught.value.code == "systems_catalog_mismatch" and "mid" in caught.value.message


def test_refuses_a_missing_output_folder(study: Study, tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    done = run_proctor("plan", str(study.prereg), "--scope", "pilot", "--out", str(missing / "plan.jsonl"))
    assert done.code == 3 and done.out["refusal"] == "folder_missing" and done.out["path"] == str(missing)


def test_refuses_to_write_the_plan_into_the_preregistration(study: Study) -> None:
    target = study.prereg / "plan.jsonl"
    done = run_proctor("plan", str(study.prereg), "--scope", "pilot", "--out", str(target))
    assert done.code == 3 and done.out["refusal"] == "plan_out_forbidden" and done.out["path"] == str(target)
    assert not target.exists()
    check_frozen(study.prereg)  # still frozen


@pytest.mark.parametrize("words", [
    ["--scope", "everything"],
    [],
    ["--scope", "pilot"],
])
def test_usage_errors_exit_2(study: Study, tmp_path: Path, words: list[str]) -> None:
    extra = ["--out", str(tmp_path / "p.jsonl")] if words != ["--scope", "pilot"] else []
    done = run_proctor("plan", str(study.prereg), *words, *extra)
    assert done.code == 2 and done.out["refusal"] == "usage_error"
    assert not (tmp_path / "p.jsonl").exists()


# --------------------------------------------------------------------------
# Each arm's worker in the header (issue 17)


_WORKER_ARMS: list[dict[str, Any]] = [
    {"id": "single", "template": "{prompt}"},
    {"id": "feedback", "template": "{prompt}", "worker": {"kind": "llm-edit", "repair_turns": 2}}]


def test_the_header_records_each_arms_worker_when_any_arm_names_one(tmp_path: Path) -> None:
    from tests.support.repo_study import repo_prereg

    with_workers = plan_study(repo_prereg(tmp_path / "w", arms=_WORKER_ARMS), "pilot").header()
    assert with_workers["arms"] == [
        {"id": "single", "worker": None},
        {"id": "feedback", "worker": {"kind": "llm-edit", "template": [], "repair_turns": 2}}]
    # no arm names a worker: the header is as before (plans already run keep their bytes)
    assert "arms" not in plan_study(repo_prereg(tmp_path / "n"), "pilot").header()


def test_a_plan_whose_worker_differs_from_the_design_is_refused(tmp_path: Path) -> None:
    from harness.audit.report import build_report
    from harness.run.runner import run_stage
    from harness.run.setup import stage_plan_bytes
    from tests.support.repo_study import repo_prereg

    prereg = repo_prereg(tmp_path, arms=_WORKER_ARMS)
    fresh = stage_plan_bytes(str(prereg), check_frozen(prereg).design, "A")
    header, rest = fresh.split(b"\n", 1)
    doc = json.loads(header)
    doc["arms"][1]["worker"]["repair_turns"] = 0  # the plan says single shot; the design says two repair turns
    forged = canonical_line(doc) + rest
    folder = tmp_path / "results" / "rt" / "A"
    folder.mkdir(parents=True)
    (folder / "plan.jsonl").write_bytes(forged)
    with pytest.raises(Refusal) as caught:
        run_stage(prereg, "A", tmp_path / "results", base_urls={"sim-flash": "http://127.0.0.1:9",
                                                                  "sim-k3": "http://127.0.0.1:9"})
    assert caught.value.code == Code.RUN_PLAN_CHANGED and "arms" in caught.value.message
    assert not any((folder / f"{log}.jsonl").exists() for log in ("run", "attempts", "finals"))  # nothing ran
    assert (folder / "plan.jsonl").read_bytes() == forged  # and the plan is kept as found
    with pytest.raises(Refusal) as report:
        build_report(folder, prereg_dir=prereg)
    problems = report.value.details["problems"]
    assert any(p["rule"] == "plan_changed" and "arms" in p["message"] for p in problems), problems
