"""The preregistered design (`prereg/<study>/design.toml`), read strictly.

The manual: docs/prereg.md.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from dataclasses import dataclass
from typing import Any

from harness.errors import Code, InputRefusal, PreregRefusal, Refusal
from harness.evidence.jsonio import read_bytes, sha256_hex
from harness.evidence.memo import ParsedMemo
from harness.workers.arm import ArmWorker

__all__ = [
    "Arm",
    "Budgets",
    "Comparison",
    "Design",
    "RunRules",
    "Stage",
    "System",
    "design_from_bytes",
    "load_design",
    "parse_design",
]

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_SHA = re.compile(r"^[0-9a-f]{64}$")
TESTS = ("paired_tost", "independent_tost")
MAX_DESIGN_BYTES = 1024 * 1024
_INT_MAX = 2**63 - 1  # TOML's integer range; tomllib itself accepts any size


@dataclass(frozen=True)
class System:
    slot: str
    provider: str
    model: str
    setting: str
    pricing_key: str
    cap_usd: float

    def manifest(self) -> dict[str, str]:
        """What systems.json freezes about this system."""
        return {"slot": self.slot, "provider": self.provider, "model": self.model, "setting": self.setting}


@dataclass(frozen=True)
class Arm:
    id: str
    template: str
    temperature: float | None = None
    worker: ArmWorker | None = None
    """The arm's own worker on a `repo_task` suite (None: the system's catalog worker; docs/prereg.md)."""
    cascade: tuple[str, ...] | None = None
    """A live cascade's systems, cheapest first (docs/prereg.md, "Cascade arms"); None: a single-system arm."""
    targeted_repair: bool = False
    """A cascade arm only: after a failed gate, the switch rule's localized defect is repaired by the same system
    before escalating (docs/prereg.md, "Cascade arms"); False: every failed gate escalates (registered before)."""

    def entry(self, slot: str) -> bool:
        """Whether the plan runs this arm under system `slot`: every system for a single-system arm, only the
        cascade's first for a cascade."""
        return self.cascade is None or self.cascade[0] == slot


@dataclass(frozen=True)
class Stage:
    id: str
    systems: tuple[str, ...]
    arms: tuple[str, ...]
    items: int
    repeats: int


@dataclass(frozen=True)
class Budgets:
    reserve_per_item_usd: float
    overall_cap_usd: float
    ceiling_margin_usd: float
    spend_before_usd: float

    @property
    def ceiling_usd(self) -> float:
        """The hard ceiling: overall cap plus the registered margin."""
        return self.overall_cap_usd + self.ceiling_margin_usd


@dataclass(frozen=True)
class RunRules:
    lanes_per_system: int
    attempt_deadline_s: float
    reruns: int
    transport_retries: int
    max_output_tokens: int
    full_repeats: int
    anchor_remote: str | None = None
    """A git remote (URL or path) that each anchor's snapshot is pushed to, without force."""
    anchor_timeout_s: float = 120.0


@dataclass(frozen=True)
class Comparison:
    a: str
    b: str
    arm: str
    margin: float
    expected_a: float
    expected_b: float
    correlation: float


@dataclass(frozen=True)
class Design:
    """A validated design: what was registered, where it lies, the sha256 of its bytes."""

    study_id: str
    seed: int
    title: str
    suite_name: str
    packet_path: str
    packet_sha256: str
    draw_items: int
    systems: tuple[System, ...]
    arms: tuple[Arm, ...]
    stages: tuple[Stage, ...]
    budgets: Budgets
    run: RunRules
    alpha: float
    power: float
    test: str
    clustering: str
    comparisons: tuple[Comparison, ...]
    path: str
    sha256: str

    def system(self, slot: str) -> System:
        return next(s for s in self.systems if s.slot == slot)

    def arm(self, arm_id: str) -> Arm:
        return next(a for a in self.arms if a.id == arm_id)

    def stage(self, stage_id: str) -> Stage:
        found = next((s for s in self.stages if s.id == stage_id), None)
        if found is None:
            raise PreregRefusal(Code.UNKNOWN_STAGE, f"no stage {stage_id!r}; registered: {', '.join(s.id for s in self.stages)}", self.path)
        return found


def load_design(path: str | os.PathLike[str]) -> Design:
    """Read `design.toml` once, hash its bytes and validate it strictly."""
    where = os.path.abspath(os.fspath(path))
    return design_from_bytes(read_bytes(where, max_bytes=MAX_DESIGN_BYTES), where)


def design_from_bytes(raw: bytes, path: str) -> Design:
    """Validate `design.toml` bytes exactly as read (so the sha256 is of what was parsed).

    Args:
        raw: the file's bytes.
        path: the absolute path they were read from (the packet path is relative to it).
    """
    digest = sha256_hex(raw)
    # the same bytes at the same path validate to the same frozen design (docs/prereg.md, design.py)
    return _DESIGNS.get((digest, path), lambda: _parse_bytes(raw, path, digest))


# Designs already validated, by (sha256 of the bytes, path): an audit checks the frozen folder and reads its
# design several times per stage; the bytes are hashed every time, so changed bytes are validated again.
_DESIGNS: ParsedMemo[tuple[str, str], Design] = ParsedMemo()


def _parse_bytes(raw: bytes, path: str, digest: str) -> Design:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputRefusal(Code.INVALID_UTF8, f"not UTF-8 at byte {exc.start}", path) from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PreregRefusal(Code.DESIGN_INVALID, f"not valid TOML: {exc}", path) from None
    except RecursionError:  # tomllib recurses on nested arrays and inline tables
        raise PreregRefusal(Code.DESIGN_INVALID, "not valid TOML: nested too deeply", path) from None
    return parse_design(doc, path=path, sha256=digest)


class _Reader:
    """Typed, strict access to one TOML table; every problem names the key and the file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def bad(self, message: str) -> Refusal:
        return PreregRefusal(Code.DESIGN_INVALID, message, self.path)

    def table(self, doc: dict[str, Any], key: str, allowed: set[str], *, required: set[str]) -> dict[str, Any]:
        value = doc.get(key)
        if not isinstance(value, dict):
            raise self.bad(f"[{key}] must be a table")
        self.keys(value, key, allowed, required)
        return value

    def keys(self, value: dict[str, Any], where: str, allowed: set[str], required: set[str]) -> None:
        unknown = sorted(set(value) - allowed)
        if unknown:
            raise self.bad(f"unknown keys in {where}: {', '.join(unknown)}")
        missing = sorted(required - set(value))
        if missing:
            raise self.bad(f"missing keys in {where}: {', '.join(missing)}")

    def ident(self, value: Any, where: str) -> str:
        if not isinstance(value, str) or not _ID.match(value):
            raise self.bad(f"{where} must be an identifier (letters, digits, '.', '_', '-')")
        return value

    def text(self, value: Any, where: str) -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.bad(f"{where} must be a non-empty string")
        return value

    def integer(self, value: Any, where: str, *, minimum: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= _INT_MAX:
            raise self.bad(f"{where} must be an integer in [{minimum}, 2^63-1]")
        return value

    def number(
        self, value: Any, where: str, *, low: float, high: float = math.inf,
        open_low: bool = False, open_high: bool = False,
    ) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.bad(f"{where} must be a finite number")
        try:
            number = float(value)  # an integer beyond a float's range overflows here
        except OverflowError:
            raise self.bad(f"{where} must be a finite number") from None
        if not math.isfinite(number):
            raise self.bad(f"{where} must be a finite number")
        if number < low or number > high or (open_low and number == low) or (open_high and number == high):
            raise self.bad(f"{where} must be in {'(' if open_low else '['}{low}, {high}{')' if open_high else ']'}")
        return number

    def ids(self, value: Any, where: str, known: set[str]) -> tuple[str, ...]:
        if not isinstance(value, list) or not value:
            raise self.bad(f"{where} must be a non-empty list")
        out = tuple(self.ident(v, where) for v in value)
        if len(set(out)) != len(out):
            raise self.bad(f"{where} names something twice")
        strange = [v for v in out if v not in known]
        if strange:
            raise self.bad(f"{where} names unknown ids: {', '.join(strange)}")
        return out

    def array(self, doc: dict[str, Any], key: str) -> list[dict[str, Any]]:
        value = doc.get(key)
        if not isinstance(value, list) or not value or not all(isinstance(v, dict) for v in value):
            raise self.bad(f"[[{key}]] must be a non-empty array of tables")
        return value


def _worker(doc: Any, where: str, path: str) -> ArmWorker:
    """An arm's worker, strictly (`ArmWorker.from_json`); its refusal keeps its own code and names the key."""
    try:
        return ArmWorker.from_json(doc)
    except Refusal as exc:
        raise Refusal(exc.code, f"{where}: {exc.message}", path) from None


def _cascade(value: Any, where: str, r: _Reader, slots: set[str]) -> tuple[str, ...]:
    """A cascade's systems: at least two different registered slots, cheapest first."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise r.bad(f"{where} must be a list of system slots")
    if len(value) < 2 or len(set(value)) != len(value):
        raise PreregRefusal(Code.CASCADE_TOO_SHORT, f"{where} must name at least two different systems (a cascade "
                            f"of one system is a single-system arm): {value!r}", r.path)
    unknown = [v for v in value if v not in slots]
    if unknown:
        raise PreregRefusal(Code.CASCADE_SYSTEM_UNKNOWN, f"{where} names unknown systems: {', '.join(unknown)} "
                            f"(registered: {', '.join(sorted(slots))})", r.path)
    return tuple(value)


def parse_design(doc: dict[str, Any], *, path: str, sha256: str) -> Design:
    """Validate a decoded design; impossible budgets and dangling references are refused."""
    r = _Reader(path)
    r.keys(doc, "the design", {"study", "suite", "draw", "systems", "arms", "stages", "budgets", "run", "analysis"},
           {"study", "suite", "draw", "systems", "arms", "stages", "budgets", "run", "analysis"})
    study = r.table(doc, "study", {"id", "seed", "title"}, required={"id", "seed", "title"})
    suite = r.table(doc, "suite", {"name", "packet", "packet_sha256"}, required={"name", "packet", "packet_sha256"})
    draw = r.table(doc, "draw", {"items"}, required={"items"})
    if not isinstance(suite["packet_sha256"], str) or not _SHA.match(suite["packet_sha256"]):
        raise r.bad("suite.packet_sha256 must be 64 lowercase hex digits")
    packet = r.text(suite["packet"], "suite.packet")
    packet_path = os.path.normpath(os.path.join(os.path.dirname(path), packet))

    systems: list[System] = []
    for i, entry in enumerate(r.array(doc, "systems")):
        where = f"systems[{i}]"
        r.keys(entry, where, {"slot", "provider", "model", "setting", "pricing_key", "cap_usd"},
               {"slot", "provider", "model", "setting", "pricing_key", "cap_usd"})
        systems.append(System(
            slot=r.ident(entry["slot"], f"{where}.slot"),
            provider=r.ident(entry["provider"], f"{where}.provider"),
            model=r.text(entry["model"], f"{where}.model"),
            setting=r.text(entry["setting"], f"{where}.setting"),
            pricing_key=r.text(entry["pricing_key"], f"{where}.pricing_key"),
            cap_usd=r.number(entry["cap_usd"], f"{where}.cap_usd", low=0.0, open_low=True),
        ))
    slots = [s.slot for s in systems]
    if len(set(slots)) != len(slots):
        raise r.bad("two systems share a slot")

    arms: list[Arm] = []
    for i, entry in enumerate(r.array(doc, "arms")):
        where = f"arms[{i}]"
        r.keys(entry, where, {"id", "template", "temperature", "worker", "cascade", "targeted_repair"}, {"id", "template"})
        repair = entry.get("targeted_repair", False)
        if not isinstance(repair, bool) or (repair and "cascade" not in entry):
            raise r.bad(f"{where}.targeted_repair must be true or false, and true only on a cascade arm")
        template = r.text(entry["template"], f"{where}.template")
        if "{prompt}" not in template:
            raise r.bad(f"{where}.template must contain {{prompt}}")
        temperature = entry.get("temperature")
        arms.append(Arm(
            id=r.ident(entry["id"], f"{where}.id"),
            template=template,
            temperature=None if temperature is None else r.number(temperature, f"{where}.temperature", low=0.0, high=2.0),
            worker=None if "worker" not in entry else _worker(entry["worker"], f"{where}.worker", path),
            cascade=None if "cascade" not in entry else _cascade(entry["cascade"], f"{where}.cascade", r, set(slots)),
            targeted_repair=repair,
        ))
    arm_ids = [a.id for a in arms]
    if len(set(arm_ids)) != len(arm_ids):
        raise r.bad("two arms share an id")

    draw_items = r.integer(draw["items"], "draw.items", minimum=1)
    stages: list[Stage] = []
    for i, entry in enumerate(r.array(doc, "stages")):
        where = f"stages[{i}]"
        r.keys(entry, where, {"id", "systems", "arms", "items", "repeats"}, {"id", "systems", "arms", "items", "repeats"})
        items = r.integer(entry["items"], f"{where}.items", minimum=1)
        if items > draw_items:
            raise r.bad(f"{where}.items ({items}) exceeds the draw ({draw_items})")
        stages.append(Stage(
            id=r.ident(entry["id"], f"{where}.id"),
            systems=r.ids(entry["systems"], f"{where}.systems", set(slots)),
            arms=r.ids(entry["arms"], f"{where}.arms", set(arm_ids)),
            items=items,
            repeats=r.integer(entry["repeats"], f"{where}.repeats", minimum=1),
        ))
    if len({s.id for s in stages}) != len(stages):
        raise r.bad("two stages share an id")
    for st in stages:
        for arm_id in st.arms:
            cascade = next(a for a in arms if a.id == arm_id).cascade
            missing = [] if cascade is None else [slot for slot in cascade if slot not in st.systems]
            if missing:
                raise PreregRefusal(Code.CASCADE_SYSTEM_UNKNOWN, f"stage {st.id} runs cascade arm {arm_id}, but not its "
                                    f"systems {', '.join(missing)} (its cells are planned under the first, and "
                                    "every step counts against its own system's cap)", path)

    b = r.table(doc, "budgets", {"reserve_per_item_usd", "overall_cap_usd", "ceiling_margin_usd", "spend_before_usd"},
                required={"reserve_per_item_usd", "overall_cap_usd", "ceiling_margin_usd", "spend_before_usd"})
    budgets = Budgets(
        reserve_per_item_usd=r.number(b["reserve_per_item_usd"], "budgets.reserve_per_item_usd", low=0.0),
        overall_cap_usd=r.number(b["overall_cap_usd"], "budgets.overall_cap_usd", low=0.0, open_low=True),
        ceiling_margin_usd=r.number(b["ceiling_margin_usd"], "budgets.ceiling_margin_usd", low=0.0),
        spend_before_usd=r.number(b["spend_before_usd"], "budgets.spend_before_usd", low=0.0),
    )
    if budgets.spend_before_usd >= budgets.ceiling_usd:
        raise r.bad("budgets: spend before the stage already reaches the hard ceiling")
    for s in systems:
        if budgets.reserve_per_item_usd > s.cap_usd:
            raise r.bad(f"budgets: the reserve per item exceeds system {s.slot}'s cap: no item could be admitted")

    run_t = r.table(doc, "run", {"lanes_per_system", "attempt_deadline_s", "reruns", "transport_retries",
                                 "max_output_tokens", "full_repeats", "anchor_remote", "anchor_timeout_s"},
                    required={"lanes_per_system", "attempt_deadline_s", "reruns", "transport_retries",
                              "max_output_tokens", "full_repeats"})
    run = RunRules(
        lanes_per_system=r.integer(run_t["lanes_per_system"], "run.lanes_per_system", minimum=1),
        attempt_deadline_s=r.number(run_t["attempt_deadline_s"], "run.attempt_deadline_s", low=0.0, open_low=True),
        reruns=r.integer(run_t["reruns"], "run.reruns", minimum=0),
        transport_retries=r.integer(run_t["transport_retries"], "run.transport_retries", minimum=0),
        max_output_tokens=r.integer(run_t["max_output_tokens"], "run.max_output_tokens", minimum=1),
        full_repeats=r.integer(run_t["full_repeats"], "run.full_repeats", minimum=1),
        anchor_remote=None if "anchor_remote" not in run_t else r.text(run_t["anchor_remote"], "run.anchor_remote"),
        anchor_timeout_s=r.number(run_t.get("anchor_timeout_s", 120.0), "run.anchor_timeout_s", low=0.0, open_low=True),
    )
    if run.reruns > 2:
        raise r.bad("run.reruns: at most two reruns per arm")
    if run.transport_retries > 3:
        raise r.bad("run.transport_retries: at most three transport retries (four attempts)")

    a = r.table(doc, "analysis", {"alpha", "power", "test", "clustering", "comparisons"},
                required={"alpha", "power", "test", "clustering", "comparisons"})
    test = r.text(a["test"], "analysis.test")
    if test not in TESTS:
        raise r.bad(f"analysis.test must be one of {', '.join(TESTS)}")
    clustering = r.text(a["clustering"], "analysis.clustering")
    if clustering not in ("item", "none"):
        raise r.bad("analysis.clustering must be 'item' or 'none'")
    comparisons: list[Comparison] = []
    compared: set[tuple[frozenset[str], str]] = set()
    for i, entry in enumerate(r.array(a, "comparisons")):
        where = f"analysis.comparisons[{i}]"
        keys = {"a", "b", "arm", "margin", "expected_a", "expected_b", "correlation"}
        r.keys(entry, where, keys, keys)
        cmp_a, cmp_b = r.ident(entry["a"], f"{where}.a"), r.ident(entry["b"], f"{where}.b")
        if cmp_a not in slots or cmp_b not in slots or cmp_a == cmp_b:
            raise r.bad(f"{where} must compare two different registered systems")
        arm = r.ident(entry["arm"], f"{where}.arm")
        if arm not in arm_ids:
            raise r.bad(f"{where}.arm names an unknown arm")
        if next(x for x in arms if x.id == arm).cascade is not None:
            raise r.bad(f"{where}.arm {arm} is a cascade: it runs once per item, not once per system (its analysis "
                        "is the live-versus-composed table, docs/analysis.md)")
        pair = (frozenset((cmp_a, cmp_b)), arm)
        if pair in compared:
            raise r.bad(f"{where} repeats an earlier comparison of {cmp_a} and {cmp_b} on arm {arm}")
        compared.add(pair)
        if not any(cmp_a in s.systems and cmp_b in s.systems and arm in s.arms for s in stages):
            raise r.bad(f"{where}: no stage runs both {cmp_a} and {cmp_b} on arm {arm}, so it could never be compared")
        comparisons.append(Comparison(
            a=cmp_a, b=cmp_b, arm=arm,
            margin=r.number(entry["margin"], f"{where}.margin", low=0.0, high=1.0, open_low=True),
            expected_a=r.number(entry["expected_a"], f"{where}.expected_a", low=0.0, high=1.0),
            expected_b=r.number(entry["expected_b"], f"{where}.expected_b", low=0.0, high=1.0),
            correlation=r.number(entry["correlation"], f"{where}.correlation", low=-1.0, high=1.0),
        ))
    return Design(
        study_id=r.ident(study["id"], "study.id"),
        seed=r.integer(study["seed"], "study.seed", minimum=0),
        title=r.text(study["title"], "study.title"),
        suite_name=r.ident(suite["name"], "suite.name"),
        packet_path=packet_path,
        packet_sha256=suite["packet_sha256"],
        draw_items=draw_items,
        systems=tuple(systems),
        arms=tuple(arms),
        stages=tuple(stages),
        budgets=budgets,
        run=run,
        alpha=r.number(a["alpha"], "analysis.alpha", low=0.0, high=0.5, open_low=True),
        power=r.number(a["power"], "analysis.power", low=0.5, high=1.0, open_low=True, open_high=True),
        test=test,
        clustering=clustering,
        comparisons=tuple(comparisons),
        path=path,
        sha256=sha256,
    )
