"""The plan file (`plan.jsonl`): a `plan-header.v1` line, then one `plan-request.v1` line per cell.

`PlanCell` is what the planner writes and what every reader gets back (with the
line it was read from); `read_plan` reads a plan strictly: any problem is
`plan_invalid` naming its line. See docs/records.md.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Final

from harness.errors import Code, PreregRefusal, Refusal
from harness.evidence.jsonio import canonical_bytes, loads_strict, read_bytes, sha256_hex
from harness.records._shape import Fields

__all__ = [
    "ATTEMPTS_SEED_PREFIX", "PLAN_HEADER_KIND", "PLAN_MAX_BYTES", "PLAN_REQUEST_KIND", "PLAN_SCOPES",
    "Plan", "PlanCell", "PlanHeader", "attempts_seed", "read_plan",
]

PLAN_REQUEST_KIND: Final = "plan-request.v1"
PLAN_HEADER_KIND: Final = "plan-header.v1"
PLAN_SCOPES: Final = ("pilot", "matrix-once", "full")
PLAN_MAX_BYTES: Final = 512 * 1024 * 1024
"""Largest plan read (prompts and bodies of every cell; far above any registered study)."""
ATTEMPTS_SEED_PREFIX: Final = "proctor-attempts:"


def attempts_seed(study: str, part: str) -> str:
    """The seed of the attempts log of `study`'s stage (or, for a stageless plan, its scope)."""
    return f"{ATTEMPTS_SEED_PREFIX}{study}:{part}"


@dataclass(frozen=True)
class PlanHeader:
    """Line 1 of a plan: the fields every reader needs, and `more` (whatever else the planner says)."""

    study: str
    scope: str
    seed: int
    design_sha256: str
    requests: int
    more: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"kind": PLAN_HEADER_KIND, **self.more, "study": self.study, "scope": self.scope, "seed": self.seed,
                "design_sha256": self.design_sha256, "requests": self.requests}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], *, path: str, line: int = 1) -> PlanHeader:
        f = Fields(obj, line, path, code=Code.PLAN_INVALID)
        if obj.get("kind") != PLAN_HEADER_KIND:
            raise f.bad(f"the first line must be a {PLAN_HEADER_KIND} header, found kind {obj.get('kind')!r}")
        f.keys(_HEADER_FIELDS, extra_ok=True)  # the plan may say more about itself
        study = f.text("study")
        if obj["scope"] not in PLAN_SCOPES:
            raise f.bad(f"scope must be one of {', '.join(PLAN_SCOPES)}")
        if isinstance(obj["seed"], bool) or not isinstance(obj["seed"], int):
            raise f.bad("seed must be an integer")
        sha = f.sha("design_sha256")
        assert sha is not None
        more = {k: v for k, v in obj.items() if k not in _HEADER_FIELDS}
        return cls(study, obj["scope"], obj["seed"], sha, f.count("requests"), more)


_HEADER_FIELDS: Final = frozenset(("kind", *(name for name in PlanHeader.__dataclass_fields__ if name != "more")))


@dataclass(frozen=True)
class PlanCell:
    """One planned request: where it runs, what it sends, and the hashes that pin both.

    Attributes:
        run_id: derived from (study, stage, system, item, arm, repeat); unique in the plan.
        stage: the registered stage (`matrix` / `full` for those scopes).
        system: the registered system slot; provider/model/api_model/api_shape/setting: how it is called.
        lane, lane_position, arm_position: the interleaving the runner follows.
        prompt: the exact user prompt; request_body: the exact provider body (UTF-8 text).
        line: the 1-based plan line it was read from (0 when planned, not read); not written.
    """

    run_id: str
    study: str
    stage: str | None
    system: str
    provider: str
    model: str
    api_model: str
    api_shape: str
    setting: str
    item: str
    arm: str
    repeat: int
    lane: int
    lane_position: int
    arm_position: int
    prompt: str
    prompt_sha256: str
    request_body: str
    request_sha256: str
    line: int = 0

    @property
    def body(self) -> bytes:
        """The exact request body bytes (their sha256 is `request_sha256`)."""
        return self.request_body.encode("utf-8")

    def to_json(self) -> dict[str, Any]:
        """The plan line (without its newline), as the planner writes it."""
        return {"kind": PLAN_REQUEST_KIND, **{name: getattr(self, name) for name in _CELL_FIELDS}}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], *, path: str, line: int, study: str,
                  api_shapes: Collection[str]) -> PlanCell:
        """A plan line read strictly: every field with its type and nothing else, its hashes checked."""
        f = Fields(obj, line, path, code=Code.PLAN_INVALID)
        if obj.get("kind") != PLAN_REQUEST_KIND:
            raise f.bad(f"expected a {PLAN_REQUEST_KIND} record, found kind {obj.get('kind')!r}")
        f.keys(frozenset(("kind", *_CELL_FIELDS)))
        if f.text("study") != study:
            raise f.bad(f"study {obj['study']!r} is not the header's {study!r}")
        if f.text("api_shape") not in api_shapes:
            raise f.bad(f"unknown api_shape {obj['api_shape']!r}")
        prompt, body = f.string("prompt"), f.string("request_body")
        assert prompt is not None and body is not None
        for key, value in (("prompt", prompt), ("request", body)):
            if sha256_hex(f.utf8(key, value)) != f.sha(f"{key}_sha256"):
                raise f.bad(f"{key}_sha256 is not the sha256 of the {key}'s UTF-8 bytes")
        return cls(
            run_id=f.text("run_id"), study=study, stage=f.string("stage", nullable=True, empty_ok=False),
            system=f.text("system"), provider=f.text("provider"), model=f.text("model"),
            api_model=f.text("api_model"), api_shape=obj["api_shape"], setting=f.text("setting"),
            item=f.text("item"), arm=f.text("arm"), repeat=f.count("repeat"), lane=f.count("lane"),
            lane_position=f.count("lane_position"), arm_position=f.count("arm_position"),
            prompt=prompt, prompt_sha256=obj["prompt_sha256"], request_body=body,
            request_sha256=obj["request_sha256"], line=line,
        )


_CELL_FIELDS: Final = tuple(name for name in PlanCell.__dataclass_fields__ if name != "line")


@dataclass(frozen=True)
class Plan:
    """A plan read strictly: `sha256` is of exactly the bytes read; `header` is line 1 as written."""

    path: str
    sha256: str
    header: Mapping[str, Any]
    requests: tuple[PlanCell, ...]

    @property
    def study(self) -> str:
        return str(self.header["study"])

    @property
    def scope(self) -> str:
        return str(self.header["scope"])

    @cached_property
    def by_run_id(self) -> dict[str, PlanCell]:
        """The requests by run id."""
        return {r.run_id: r for r in self.requests}

    @cached_property
    def stages(self) -> tuple[str | None, ...]:
        """The stages the requests belong to, in plan order of first appearance."""
        return tuple(dict.fromkeys(r.stage for r in self.requests))

    def attempts_seed(self, stage: str | None = None) -> str:
        """The attempts log seed: of `stage`, else of the plan's only stage, else of its scope."""
        if stage is None and len(self.stages) == 1 and self.stages[0] is not None:
            stage = self.stages[0]
        return attempts_seed(self.study, self.scope if stage is None else stage)


def _plan_line(raw: bytes, lineno: int, path: str) -> dict[str, Any]:
    def bad(message: str) -> Refusal:
        return PreregRefusal(Code.PLAN_INVALID, f"line {lineno}: {message}", path, line=lineno)

    try:
        obj = loads_strict(raw, path=path, expect_object=False)
    except Refusal as exc:
        raise bad(f"{exc.code}: {exc.message}") from None
    if not isinstance(obj, dict):
        raise bad(f"a JSON {type(obj).__name__}, not an object")
    try:
        canonical = canonical_bytes(obj)
    except Refusal as exc:
        raise bad(exc.message) from None
    if canonical != raw:
        raise bad("not in canonical form (sorted keys, compact separators, minimal escapes)")
    return obj


def read_plan(path: str | os.PathLike[str], *, api_shapes: Collection[str]) -> Plan:
    """Read a plan file strictly; any problem is the refusal `plan_invalid` naming its line."""
    p = os.fspath(path)
    raw = read_bytes(p, max_bytes=PLAN_MAX_BYTES)
    if not raw:
        raise PreregRefusal(Code.PLAN_INVALID, "line 1: the plan is empty (no header)", p, line=1)
    lines = raw.split(b"\n")
    if lines[-1]:
        n = len(lines)
        raise PreregRefusal(Code.PLAN_INVALID, f"line {n}: the last line has no newline (torn)", p, line=n)
    lines.pop()
    header = _plan_line(lines[0], 1, p)
    head = PlanHeader.from_json(header, path=p)
    requests: list[PlanCell] = []
    first_line: dict[str, int] = {}
    for lineno, line in enumerate(lines[1:], start=2):
        request = PlanCell.from_json(_plan_line(line, lineno, p), path=p, line=lineno, study=head.study,
                                     api_shapes=api_shapes)
        if request.run_id in first_line:
            raise PreregRefusal(
                Code.PLAN_INVALID,
                f"line {lineno}: run id {request.run_id!r} repeats line {first_line[request.run_id]}",
                p, line=lineno,
            )
        first_line[request.run_id] = lineno
        requests.append(request)
    if head.requests != len(requests):
        raise PreregRefusal(
            Code.PLAN_INVALID,
            f"line 1: the header counts {head.requests} requests, the plan holds {len(requests)}",
            p, line=1,
        )
    return Plan(p, sha256_hex(raw), header, tuple(requests))
