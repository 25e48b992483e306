"""The deterministic request plan: `proctor plan DIR --scope {@stages,@matrix-once,@full} --out FILE`.

A scope's name starts with `@`, which no stage id can (`design.py`), so a
scope is never taken for a stage. The old spellings stay as aliases
(`pilot`, `matrix-once`, `full`), and the plan's header still records the
scope by them, so a plan made before is byte-identical.

The manual: docs/prereg.md.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

from harness.errors import Code, InputRefusal, LogRefusal, PreregRefusal
from harness.evals.suite import Packet, PacketItem, load_packet
from harness.evidence.fsutil import atomic_write
from harness.evidence.jsonio import canonical_bytes, canonical_line, sha256_hex
from harness.prereg.design import Design, System
from harness.prereg.folder import catalog_mismatches
from harness.prereg.frozen import check_frozen
from harness.prereg.order import draw, permutation
from harness.providers.base import GenerationSettings
from harness.providers.catalog import (
    BUNDLED_CATALOG,
    Catalog,
    CatalogModel,
    load_catalog,
    resolve_model,
)
from harness.providers.registry import adapter_for
from harness.records.plan import PLAN_HEADER_KIND, PLAN_REQUEST_KIND, PlanCell, PlanHeader

__all__ = [
    "FULL_STAGE",
    "HEADER_KIND",
    "MATRIX_STAGE",
    "PLACEHOLDER_BASE_URLS",
    "REQUEST_KIND",
    "SCOPES",
    "SCOPE_NAMES",
    "Plan",
    "PlanCell",
    "apply_template",
    "arm_workers",
    "build_plan",
    "plan_study",
    "run_id",
    "scope_key",
    "scope_name",
    "write_plan",
]

SCOPES: Final = ("pilot", "matrix-once", "full")
"""The scopes as a plan's header records them (the old spellings, kept as aliases)."""
SCOPE_NAMES: Final = {"@stages": "pilot", "@matrix-once": "matrix-once", "@full": "full"}
"""Each scope's name (what `--scope` takes; a stage id cannot start with `@`) -> the key a plan records."""


def scope_key(scope: str) -> str:
    """The recorded key of `scope`, given by its name (`@stages`) or its old spelling (`pilot`)."""
    if scope in SCOPE_NAMES:
        return SCOPE_NAMES[scope]
    if scope in SCOPES:
        return scope
    raise ValueError(f"unknown scope {scope!r}; expected one of {', '.join(SCOPE_NAMES)} "
                     f"(or the old spellings {', '.join(SCOPES)})")


def scope_name(scope: str) -> str:
    """The name (`@stages`, `@matrix-once`, `@full`) of a scope given either way."""
    key = scope_key(scope)
    return next(name for name, k in SCOPE_NAMES.items() if k == key)
HEADER_KIND: Final = PLAN_HEADER_KIND
REQUEST_KIND: Final = PLAN_REQUEST_KIND
PLACEHOLDER_BASE_URLS: Final = ("http://plan.invalid/v1", "https://placeholder.invalid/elsewhere/v2")
"""Two base URLs a request body is built against: a body that differs between them is an internal error."""
MATRIX_STAGE: Final = "matrix"
FULL_STAGE: Final = "full"


def run_id(study: str, stage: str, slot: str, item: str, arm: str, repeat: int) -> str:
    """The run id of one cell: `r-` and 20 hex digits of sha256(canonical [study, stage, slot, item, arm, repeat])."""
    return "r-" + sha256_hex(canonical_bytes([study, stage, slot, item, arm, repeat]))[:20]


def apply_template(template: str, prompt: str) -> str:
    """The user prompt: `template` with `{prompt}` replaced as plain text (braces in code stay as they are)."""
    return template.replace("{prompt}", prompt)


@dataclass(frozen=True)
class Plan:
    """A whole plan: the header fields and the cells in execution order."""

    study: str
    scope: str
    seed: int
    design_sha256: str
    frozen_sha256: str
    systems_sha256: str
    packet_sha256: str
    catalog_sha256: str
    amendments: tuple[Any, ...]
    draw: tuple[str, ...]
    cells: tuple[PlanCell, ...]
    arms: tuple[dict[str, Any], ...] = ()
    """Each arm's worker (`arm_workers`): recorded in the header when any arm names one, else left out."""

    def header(self) -> dict[str, Any]:
        more: dict[str, Any] = {"frozen_sha256": self.frozen_sha256, "systems_sha256": self.systems_sha256,
                                "packet_sha256": self.packet_sha256, "catalog_sha256": self.catalog_sha256,
                                "amendments": list(self.amendments), "draw": list(self.draw)}
        if self.arms:
            more["arms"] = [dict(a) for a in self.arms]
        return PlanHeader(
            study=self.study, scope=self.scope, seed=self.seed, design_sha256=self.design_sha256,
            requests=len(self.cells), more=more,
        ).to_json()

    def to_bytes(self) -> bytes:
        """The plan file's exact bytes: the header line, then one line per cell."""
        return b"".join([canonical_line(self.header()), *(canonical_line(c.to_json()) for c in self.cells)])

    def counts(self) -> dict[str, dict[str, list[int]]]:
        """Requests per stage, system and lane (a list indexed by lane)."""
        out: dict[str, dict[str, list[int]]] = {}
        for cell in self.cells:
            lanes = out.setdefault(cell.stage or "", {}).setdefault(cell.system, [])
            lanes.extend([0] * (cell.lane + 1 - len(lanes)))
            lanes[cell.lane] += 1
        return out


@dataclass(frozen=True)
class _Block:
    """A stage as the scope expands it: which systems, arms and items, how many repeats."""

    stage: str
    systems: tuple[str, ...]
    arms: tuple[str, ...]
    items: tuple[str, ...]
    repeats: int


def _blocks(design: Design, drawn: Sequence[str], scope: str) -> list[_Block]:
    every_system = tuple(s.slot for s in design.systems)
    every_arm = tuple(a.id for a in design.arms)
    if scope == "pilot":
        return [
            _Block(
                stage=stage.id,
                # Systems run in registered order (systems.json), whatever order the stage lists them in.
                systems=tuple(slot for slot in every_system if slot in stage.systems),
                arms=stage.arms,
                items=tuple(drawn[: stage.items]),
                repeats=stage.repeats,
            )
            for stage in design.stages
        ]
    if scope == "matrix-once":
        return [_Block(MATRIX_STAGE, every_system, every_arm, tuple(drawn), 1)]
    if scope == "full":
        return [_Block(FULL_STAGE, every_system, every_arm, tuple(drawn), design.run.full_repeats)]
    raise ValueError(f"unknown scope {scope!r}; expected one of {', '.join(SCOPES)}")


def _lanes(order: Sequence[str], lanes: int) -> Iterator[tuple[int, int, str]]:
    """(lane, position, item) in execution order: the k-th item goes to lane k % L at position k // L."""
    for lane in range(lanes):
        for position, item in enumerate(order[lane::lanes]):
            yield lane, position, item


class _Bodies:
    """Exact request bodies, built once per (system, arm, item) and checked not to depend on the base URL."""

    def __init__(self, design: Design, catalog: Catalog) -> None:
        self.design = design
        self.models: dict[str, CatalogModel] = {}
        problems: list[str] = []
        for system in design.systems:
            model = resolve_model(catalog, system.model)
            # The same rule freeze applies to a folder's own catalog.toml, here for the bundled one too.
            problems += catalog_mismatches(system, model, "the catalog")
            self.models[system.slot] = model
        if problems:
            raise PreregRefusal(Code.SYSTEMS_CATALOG_MISMATCH, "; ".join(problems), catalog.path, problems=problems)
        self.cache: dict[tuple[str, str, str], tuple[str, str]] = {}

    def settings(self, system: System, arm_id: str) -> GenerationSettings:
        # Only what the design registers: no system prompt, no tools, no top_p or seed.
        return GenerationSettings(
            max_output_tokens=self.design.run.max_output_tokens,
            temperature=self.design.arm(arm_id).temperature,
            reasoning_effort=None if system.setting == "default" else system.setting,
        )

    def body(self, system: System, arm_id: str, prompt: str, item: str) -> tuple[str, str]:
        """(the body as UTF-8 text, its sha256)."""
        key = (system.slot, arm_id, item)
        if key not in self.cache:
            model = self.models[system.slot]
            adapter = adapter_for(model.api_shape)
            settings = self.settings(system, arm_id)
            built = [adapter.build_request(model.api_model, prompt, settings, url) for url in PLACEHOLDER_BASE_URLS]
            if len({r.body for r in built}) != 1:
                raise RuntimeError(f"the {model.api_shape} body depends on the base URL; a plan cannot pin it")
            body = built[0].body
            if built[0].body_sha256 != sha256_hex(body):
                raise RuntimeError(f"the {model.api_shape} adapter reported a sha256 that is not its body's")
            self.cache[key] = (body.decode("utf-8"), sha256_hex(body))
        return self.cache[key]


def arm_workers(design: Design) -> tuple[dict[str, Any], ...]:
    """The plan header's `arms`: every arm's id and worker (null: the system's catalog worker), in design
    order; empty when no arm names a worker, so a plan without arm workers keeps its bytes (docs/prereg.md)."""
    if all(a.worker is None for a in design.arms):
        return ()
    return tuple({"id": a.id, "worker": None if a.worker is None else a.worker.to_json()} for a in design.arms)


def build_plan(
    design: Design,
    packet: Packet,
    catalog: Catalog,
    scope: str,
    *,
    frozen_sha256: str,
    systems_sha256: str,
    amendments: Sequence[Any] = (),
) -> Plan:
    """Expand a validated design over a loaded packet into the plan for `scope` (no I/O).

    Args:
        design: the frozen design.
        packet: the suite's answer-stripped packet, already checked against `design.packet_sha256`.
        catalog: where each system's model is reached (its API shape and API model name).
        scope: `@stages` (alias `pilot`), `@matrix-once` (`matrix-once`) or `@full` (`full`).
        frozen_sha256: the sha256 of the preregistration's `FROZEN.json`, recorded in the header.
        systems_sha256: the sha256 of `systems.json`, recorded in the header.
        amendments: the preregistration's amendment records, recorded in the header.
    """
    scope = scope_key(scope)
    items: dict[str, PacketItem] = {it.item: it for it in packet.items}
    if design.draw_items > len(items):
        raise PreregRefusal(
            Code.DRAW_EXCEEDS_PACKET,
            f"the design draws {design.draw_items} items; the packet holds {len(items)}",
            design.packet_path,
        )
    drawn = draw(design.seed, list(items), design.draw_items)
    bodies = _Bodies(design, catalog)
    seed, study = design.seed, design.study_id
    cells: list[PlanCell] = []
    for block in _blocks(design, drawn, scope):
        for slot in block.systems:
            system = design.system(slot)
            model = bodies.models[slot]
            order = permutation(seed, f"items:{block.stage}:{slot}", block.items)
            for lane, position, item in _lanes(order, design.run.lanes_per_system):
                # A cascade arm runs once per item, under its first system (docs/prereg.md, "Cascade arms").
                arms = permutation(seed, f"arms:{block.stage}:{slot}:{item}",
                                   tuple(a for a in block.arms if design.arm(a).entry(slot)))
                for arm_position, arm_id in enumerate(arms):
                    prompt = apply_template(design.arm(arm_id).template, items[item].prompt)
                    body, body_sha = bodies.body(system, arm_id, prompt, item)
                    for repeat in range(1, block.repeats + 1):
                        cells.append(PlanCell(
                            run_id=run_id(study, block.stage, slot, item, arm_id, repeat),
                            study=study, stage=block.stage, system=slot, provider=system.provider,
                            model=model.id, api_model=model.api_model, api_shape=model.api_shape,
                            setting=system.setting, item=item, arm=arm_id, repeat=repeat,
                            lane=lane, lane_position=position, arm_position=arm_position,
                            prompt=prompt, prompt_sha256=sha256_hex(prompt.encode("utf-8")),
                            request_body=body, request_sha256=body_sha,
                        ))
    return Plan(
        study=study, scope=scope, seed=seed, design_sha256=design.sha256, frozen_sha256=frozen_sha256,
        systems_sha256=systems_sha256, packet_sha256=packet.sha256, catalog_sha256=catalog.sha256,
        amendments=tuple(amendments), draw=tuple(drawn), cells=tuple(cells), arms=arm_workers(design),
    )


def plan_study(prereg_dir: str | os.PathLike[str], scope: str) -> Plan:
    """Plan a frozen preregistration: check the freeze, load the packet and the catalog, expand `scope`."""
    scope = scope_key(scope)
    folder = os.path.abspath(os.fspath(prereg_dir))
    frozen = check_frozen(folder)
    design = frozen.design
    packet = load_packet(design.packet_path, design.packet_sha256)
    local = os.path.join(folder, "catalog.toml")
    if frozen.catalog_sha256 is None:
        catalog = load_catalog(BUNDLED_CATALOG)  # never $PROCTOR_CATALOG: the environment cannot steer a plan
    else:
        catalog = load_catalog(local)
        if catalog.sha256 != frozen.catalog_sha256:  # changed between the freeze check and this read
            raise PreregRefusal(Code.PREREG_CHANGED_SINCE_FREEZE, "changed since its freeze: catalog.toml changed",
                          folder, added=[], changed=["catalog.toml"], removed=[])
    return build_plan(
        design, packet, catalog, scope,
        frozen_sha256=frozen.frozen_sha256,
        systems_sha256=frozen.systems_sha256,
        amendments=[a.to_json() for a in frozen.amendments],
    )


def write_plan(
    prereg_dir: str | os.PathLike[str], scope: str, out: str | os.PathLike[str]
) -> dict[str, Any]:
    """`proctor plan`: plan, write the file atomically, and report its sha256 and the counts.

    The file is replaced if it exists (the same inputs give the same bytes). It
    may not be written inside the preregistration folder: a new file there
    would unfreeze it.
    """
    target = os.path.abspath(os.fspath(out))
    folder = os.path.dirname(target)
    if os.path.isdir(folder) and os.path.isdir(prereg_dir) and os.path.samefile(folder, prereg_dir):
        raise PreregRefusal(Code.PLAN_OUT_FORBIDDEN, "a plan written into the preregistration folder would change "
                      "what was frozen; write it elsewhere (e.g. results/)", target)
    plan = plan_study(prereg_dir, scope)
    data = plan.to_bytes()
    if not os.path.isdir(folder):
        raise InputRefusal(Code.FOLDER_MISSING, "the plan's folder does not exist", folder)
    try:
        atomic_write(target, data, mode=0o644)
    except OSError as exc:
        raise LogRefusal(Code.FILE_UNWRITABLE, exc.strerror or str(exc), target) from None
    design = check_frozen(prereg_dir).design
    warnings = []
    if scope in SCOPES and any(stage.id == scope for stage in design.stages):
        warnings.append(f"--scope {scope} is the old spelling of {scope_name(scope)} "
                        f"({SCOPE_MEANING[scope_key(scope)]}), not the stage {scope!r}")
    return {
        "ok": True,
        "study": plan.study,
        "scope": scope_name(plan.scope),
        "scope_means": SCOPE_MEANING[plan.scope],
        "scope_recorded": plan.scope,
        "plan": target,
        "sha256": sha256_hex(data),
        "requests": len(plan.cells),
        "draw_items": len(plan.draw),
        "requests_by_stage": _labelled_counts(plan),
        "warnings": warnings,
    }


SCOPE_MEANING: Final = {
    "pilot": "every registered stage, as registered",
    "matrix-once": "every drawn item once per system and arm (stage 'matrix')",
    "full": "every drawn item, system and arm with the registered full repeats (stage 'full')",
}


def _labelled_counts(plan: Plan) -> dict[str, Any]:
    """Requests by stage, then by system, then by lane, each level labelled."""
    out: dict[str, Any] = {}
    for stage, systems in plan.counts().items():
        out[stage] = {"requests": sum(sum(lanes) for lanes in systems.values()),
                      "systems": {slot: {"requests": sum(lanes), "requests_per_lane": lanes}
                                  for slot, lanes in systems.items()}}
    return out
