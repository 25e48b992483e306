"""Suite kinds (harness/run/kinds/): the registry by SUITE.json's `kind`, the repo_task kind's diff and
set-up refusal, and the attempt record's `work` (strict; a completion record is unchanged)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from harness.errors import Code, Refusal
from harness.evals.suite import load_packet
from harness.records.attempt import Attempt, validate_attempt
from harness.records.plan import PlanCell
from harness.run.kinds import KINDS, kind_for
from harness.run.kinds.completion import CompletionKind
from harness.run.kinds.repo_task import RepoTaskKind, WorkOrder, carry_out, tree_diff, work_folder
from harness.run.rules import Room
from tests.support.paths import HUMANEVAL, REPO

TASKS_SUITE = REPO / "evals" / "tasks-suite"


def test_the_kind_comes_from_suite_json_and_no_suite_is_named() -> None:
    assert set(KINDS) == {"completion", "repo_task"}
    assert isinstance(kind_for(str(HUMANEVAL)), CompletionKind)  # written before kinds: no `kind`
    assert isinstance(kind_for(str(TASKS_SUITE)), RepoTaskKind)
    assert json.loads((TASKS_SUITE / "SUITE.json").read_text())["kind"] == "repo_task"


def test_a_packet_without_a_manifest_is_a_completion_suite_and_an_unknown_kind_is_refused(tmp_path: Path) -> None:
    assert isinstance(kind_for(str(tmp_path)), CompletionKind)
    suite = tmp_path / "suite"
    shutil.copytree(TASKS_SUITE, suite)
    manifest = json.loads((suite / "SUITE.json").read_text())
    (suite / "SUITE.json").write_text(json.dumps({**manifest, "kind": "essay"}))
    with pytest.raises(Refusal) as caught:
        kind_for(str(suite))
    assert caught.value.code == Code.SUITE_KIND_UNKNOWN and caught.value.details["kind"] == "essay"


def test_tree_diff_shows_changed_added_and_removed_files_and_nothing_for_an_unchanged_tree(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for root in (a, b):
        (root / "pkg").mkdir(parents=True)
        (root / "pkg" / "same.py").write_text("x = 1\n")
        (root / ".git").mkdir()
        (root / ".git" / "HEAD").write_text(root.name)  # never part of the diff
    assert tree_diff(str(a), str(b)) == b""
    (a / "pkg" / "mod.py").write_text("def f():\n    return 1\n")
    (b / "pkg" / "mod.py").write_text("def f():\n    return 2\n")
    (b / "pkg" / "new.py").write_text("y = 2")
    (a / "gone.txt").write_text("bye\n")
    (b / "blob.bin").write_bytes(b"\xff\x00")
    (b / "pkg" / "__pycache__").mkdir()
    (b / "pkg" / "__pycache__" / "mod.cpython-312.pyc").write_bytes(b"\x00")
    diff = tree_diff(str(a), str(b)).decode()
    assert "--- a/pkg/mod.py\n+++ b/pkg/mod.py\n" in diff and "-    return 1\n+    return 2\n" in diff
    assert "--- /dev/null\n+++ b/pkg/new.py\n" in diff and "\\ No newline at end of file" in diff
    assert "--- a/gone.txt\n+++ /dev/null\n" in diff and "-bye\n" in diff
    assert "Binary files a/blob.bin and b/blob.bin differ" in diff
    assert "__pycache__" not in diff and ".git" not in diff and "same.py" not in diff


def _cell() -> PlanCell:
    item = load_packet(TASKS_SUITE / "packet.jsonl").items[0]
    return PlanCell(run_id="r-00000000000000000001", study="rt", stage="A", system="cheap", provider="sim",
                    model="sim-flash", api_model="sim-flash", api_shape="openai_chat", setting="default",
                    item=item.item, arm="edit", repeat=1, lane=0, lane_position=0, arm_position=0,
                    prompt=item.prompt, prompt_sha256="0" * 64, request_body="{}", request_sha256="1" * 64)


def test_a_snapshot_that_is_not_the_packets_tree_is_a_harness_error_before_any_worker(tmp_path: Path) -> None:
    item = load_packet(TASKS_SUITE / "packet.jsonl").items[0]
    snapshot = tmp_path / "snapshot"
    shutil.copytree(REPO / str(item.workspace), snapshot)
    (snapshot / "planted.py").write_text("import os\n")  # the item's snapshot changed after the suite was sealed
    private = json.loads((TASKS_SUITE / "private" / "items.jsonl").read_text().splitlines()[0])
    order = WorkOrder(cell=_cell(), rerun=0, attempt=1, started=1.0, task_path=str(REPO / private["task"]),
                      snapshot=str(snapshot), snapshot_tree=str(item.metadata["workspace_tree"]),
                      catalog_path="unused", upstream="http://127.0.0.1:9/v1", price=None, deadline_s=5.0,
                      stage_folder=str(tmp_path / "stage"))
    record = carry_out(order)
    assert record["outcome"] == "error" and record["error_code"] == "harness_error"
    assert "not the packet's tree" in record["error_message"]
    assert record["cost_usd"] == 0 and record["work"]["exchanges"] == 0 and record["work"]["files"] == {}
    assert record["work"]["folder"] == work_folder("r-00000000000000000001", 0, 1)
    validate_attempt({k: v for k, v in record.items() if k != "rerun"}, None)


def _work_record(**change: Any) -> dict[str, Any]:
    work = {"kind": "repo-task-work.v1", "folder": "work/r-1.r0.a1", "dispatch_id": "d001-00000000", "exit_code": 0,
            "timed_out": False, "provider_failure": False, "exchanges": 1, "files": {"diff.patch": "a" * 64},
            "passed": True, "refusal": None, "queued_s": 0.0}
    record = Attempt(run_id="r-1", attempt=1, request_sha256="1" * 64, outcome="delivered", started=1.0, ended=2.0,
                     latency_s=1.0, http_status=None, response_raw=None, response_sha256=None,
                     provider_request_id=None, model_snapshot=None, finish_reason=None,
                     tokens={"input": 1, "cached_input": 0, "cache_write": 0, "output": 1, "reasoning": 0},
                     usage_unknown=False, cost_usd=0.001, cost_status="metered", text=None, work=work).to_json()
    for key, value in change.items():
        if key.startswith("work."):
            record["work"][key[5:]] = value
        else:
            record[key] = value
    return record


def test_a_work_attempt_is_read_strictly_and_a_completion_attempt_has_no_work() -> None:
    validate_attempt(_work_record(), None)
    bads: tuple[dict[str, Any], ...] = ({"http_status": 200}, {"work.files": {"notes.txt": "a" * 64}}, {"work.folder": "../elsewhere"},
                                         {"work.exchanges": "one"}, {"work.extra": 1}, {"work": []})
    for bad in bads:
        with pytest.raises(Refusal) as caught:
            validate_attempt(_work_record(**bad), 1)
        assert caught.value.code == Code.ATTEMPT_INVALID, bad
    # without work a delivered record still needs its HTTP response, as before kinds
    plain = _work_record()
    del plain["work"]
    with pytest.raises(Refusal, match="2xx"):
        validate_attempt(plain, 1)
    completion = Attempt(run_id="r-1", attempt=1, request_sha256="1" * 64, outcome="delivered", started=1.0,
                         ended=2.0, latency_s=1.0, http_status=200, response_raw="{}", response_sha256=None,
                         provider_request_id=None, model_snapshot=None, finish_reason=None, tokens=None,
                         usage_unknown=True, cost_usd="unknown", cost_status="usage_unknown", text="x").to_json()
    assert "work" not in completion


def test_each_kind_says_what_keeps_it_from_judging(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert CompletionKind(str(HUMANEVAL)).preflight() == []  # the warm verifier starts and judges
    if shutil.which("bwrap") is not None:
        assert RepoTaskKind(str(TASKS_SUITE)).preflight() == []
    monkeypatch.setenv("PROCTOR_SANDBOX", "jail")
    shutil.copytree(REPO / "evals" / "tasks", tmp_path / "evals" / "tasks", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(TASKS_SUITE, tmp_path / "evals" / "tasks-suite")
    (tmp_path / "evals" / "tasks" / "intervals" / "workspace" / "planted.py").write_text("x = 1\n")
    problems = dict(RepoTaskKind(str(tmp_path / "evals" / "tasks-suite")).preflight())
    assert problems["suite"].startswith("suite_item_changed: item 'intervals-touching-merge'")
    assert problems["verifier"].startswith("the gated path's sandbox cannot run: sandbox_invalid")


def _two_attempts(lanes: int, systems: int, together: bool) -> tuple[list[float], list[float], float]:
    """Two repo_task attempts of one system, each spending 0.7 when its allowance lets it (cap 1.0, reserve
    0.1), run at once or one after the other: (their allowances, their spends, the cap)."""
    import asyncio
    from types import SimpleNamespace

    import harness.run.kinds.repo_task as repo_task

    cap, reserve, spends = 1.0, 0.1, [0.7, 0.7]
    spent: list[float] = []
    rooms: list[float] = []

    class Host:
        rules = SimpleNamespace(lanes_per_system=lanes)
        s = SimpleNamespace(design=SimpleNamespace(budgets=SimpleNamespace(reserve_per_item_usd=reserve)),
                            systems=tuple(f"s{i}" for i in range(systems)))

        async def begin_attempt(self, r: Any, rerun: int, number: int, lane: int) -> tuple[float, float]:
            return 0.0, cap - reserve  # the room at admission: the other attempt holds its reserve

        def room_now(self, system: str) -> Room:
            return Room(cap=cap - sum(spent) - reserve * (1 - len(spent)), ceiling=1e9)

        async def end_attempt(self, r: Any, lane: int, record: dict[str, Any]) -> None:
            spent.append(record["cost_usd"])

    kind = RepoTaskKind(str(TASKS_SUITE))

    def order(host: Any, r: Any, rerun: int, number: int, started: float, room: float, *, queued_s: float) -> Any:
        rooms.append(room)
        return min(room, spends[len(rooms) - 1])  # the worker spends what its allowance lets it

    class Cell:
        system, run_id = "cheap", "r"

    class State:
        request, rerun = Cell(), 0

        def __init__(self, number: int) -> None:
            self.number = number

        def next_attempt(self) -> int:
            return self.number

    async def run() -> None:
        if together:
            await asyncio.gather(kind.attempt(Host(), State(1), 0), kind.attempt(Host(), State(2), 1))  # type: ignore[arg-type]
        else:
            await kind.attempt(Host(), State(1), 0)  # type: ignore[arg-type]
            await kind.attempt(Host(), State(2), 0)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kind, "order", order)
        mp.setattr(repo_task, "carry_out", lambda allowed: {"cost_usd": allowed})
        asyncio.run(run())
    assert kind._claims == {}  # every claim released with its record
    return rooms, spent, cap


def test_an_attempt_s_allowance_is_the_room_left_when_its_turn_comes() -> None:
    """One after the other (one lane, one system): the second's allowance counts what the first really spent
    (more than its reserve), not the room at its admission, so the two together stay within the cap."""
    rooms, spent, cap = _two_attempts(lanes=1, systems=1, together=False)
    assert rooms == pytest.approx([cap - 0.1, cap - 0.7])  # the second's room after the first's real spend
    assert sum(spent) <= cap


@pytest.mark.parametrize(("lanes", "systems"), [(1, 1), (2, 1), (4, 3)])
def test_attempts_running_at_once_share_the_room_and_stay_within_the_cap(lanes: int, systems: int) -> None:
    """At once: the second's allowance is the room less what the first holds above its reserve, so their
    allowances together (and so their spends) never cross the cap; each is the room shared among the lanes."""
    rooms, spent, cap = _two_attempts(lanes=lanes, systems=systems, together=True)
    k = lanes * systems
    first = min(cap - 0.1, max(0.1, (cap - 0.1) / k))
    assert rooms[0] == pytest.approx(first)
    assert rooms[1] == pytest.approx(min(cap - 0.1 - max(0.0, first - 0.1),
                                         max(0.1, (cap - 0.1 - max(0.0, first - 0.1)) / k)))
    assert sum(rooms) <= cap and sum(spent) <= cap


def test_a_node_s_cascade_order_fixes_each_later_allowance_at_the_worst_case(tmp_path: Path) -> None:
    """The ray engine's order (docs/ray.md, "Cascade arms on a cluster"): no callback; each later system's
    allowance is its room asked with the earlier steps' whole allowances as spent, and the attempt's claim is
    the sum of its allowances (that the order reaches a node and is used there: tests/run/test_remote.py)."""
    import dataclasses
    from types import SimpleNamespace

    from harness.meter.allowance import Allowance
    from harness.meter.pricing import BUNDLED_PRICING, load_pricing
    from harness.run.kinds.repo_task import CascadeSystem

    asked: list[tuple[str, float]] = []
    model = SimpleNamespace(api_model="m", id="m", pricing_key="sim-flash")

    class Host:
        rules = SimpleNamespace(lanes_per_system=1)
        s = SimpleNamespace(design=SimpleNamespace(budgets=SimpleNamespace(reserve_per_item_usd=0.1)),
                            systems=("a",), models={"a": model, "b": model, "c": model})

        def escalation_room(self, system: str, spent: float) -> Room:
            asked.append((system, spent))
            return Room(cap={"b": 0.5, "c": 2.0}[system], ceiling=1e9)

    kind = RepoTaskKind(str(TASKS_SUITE))
    kind._pricing = pricing = load_pricing(str(BUNDLED_PRICING))
    cascade = tuple(CascadeSystem(s, "m", "http://127.0.0.1:9/v1", None) for s in ("a", "b", "c"))
    order = WorkOrder(cell=_cell(), rerun=0, attempt=1, started=1.0, task_path=None, snapshot="s", snapshot_tree="",
                      catalog_path="unused", upstream="http://127.0.0.1:9/v1", price=None, deadline_s=5.0,
                      stage_folder=str(tmp_path), cascade=cascade,
                      allowance=Allowance(limit_usd=0.3, pricing=pricing, reserve_usd=0.1),
                      escalate=lambda system, spent: None)
    key = ("r-00000000000000000001", 0, 1)
    fixed = kind.fixed_escalations(Host(), order, key)  # type: ignore[arg-type]
    assert asked == [("b", pytest.approx(0.3)), ("c", pytest.approx(0.8))]  # worst case: each earlier limit spent
    assert fixed.escalate is None and [a.limit_usd for a in fixed.escalations] == pytest.approx([0.5, 2.0])
    assert kind._claims[key] == [("b", pytest.approx(0.5)), ("c", pytest.approx(2.0))]  # held beside the first
    single = dataclasses.replace(order, cascade=())
    assert kind.fixed_escalations(Host(), single, key).escalations == ()  # type: ignore[arg-type]


def test_what_another_system_s_attempt_holds_counts_against_the_ceiling_not_this_system_s_cap() -> None:
    """Three systems with a cap each and a wide ceiling: a cheap attempt (a cascade escalated to strong) holding
    much of its allowance never shrinks middle's room under middle's cap; strong's part does shrink strong's,
    and every part shrinks the ceiling's (the agents demo's strong lane was starved to $0 by the others' holds)."""
    from types import SimpleNamespace

    reserve = 0.05

    class Host:
        rules = SimpleNamespace(lanes_per_system=1)
        s = SimpleNamespace(design=SimpleNamespace(budgets=SimpleNamespace(reserve_per_item_usd=reserve)),
                            systems=("cheap", "middle", "strong"))

        def __init__(self, ceiling: float) -> None:
            self.ceiling = ceiling

        def room_now(self, system: str) -> Room:
            return Room(cap=1.0, ceiling=self.ceiling)

    kind = RepoTaskKind(str(TASKS_SUITE))
    kind._claims[("r-cascade", 0, 1)] = [("cheap", 0.6), ("strong", 0.9)]  # a cascade under way, escalated
    wide = Host(ceiling=100.0)
    assert kind.claim(wide, "middle", ("r-middle", 0, 1)) == pytest.approx(1.0 / 3)  # its cap's share, untouched
    kind._claims.pop(("r-middle", 0, 1))
    assert kind.claim(wide, "strong", ("r-strong", 0, 1)) == pytest.approx(max(reserve, (1.0 - 0.9) / 3))
    kind._claims.pop(("r-strong", 0, 1))
    tight = Host(ceiling=1.0)  # every part held counts against the ceiling: 0.55 beyond the reserve, and 0.9
    assert kind.claim(tight, "middle", ("r-middle", 0, 1)) == pytest.approx(0.0)
