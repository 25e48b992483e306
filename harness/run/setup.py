"""What a stage is, from the frozen preregistration: the set-up the runner and the preflight share.

`setup_stage` checks the preregistration and resolves the stage's plan, models,
prices and base URLs; `pin_plan` pins the folder's plan.jsonl (a stage that ran
under an earlier freeze keeps its plan when the amendments since do not change
what it ran); `requests_from` reads the pinned plan;
`load_stage_ledger` reads the folder's history under the registered rules.

The manual: docs/run.md.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Mapping

from harness.errors import Code, RunRefusal
from harness.evidence.fsutil import atomic_write
from harness.evidence.jsonio import canonical_line, read_bytes
from harness.meter.pricing import BUNDLED_PRICING, Price, load_pricing
from harness.prereg.amended import check_stage_plan
from harness.prereg.design import Design
from harness.prereg.frozen import FrozenPrereg, check_frozen
from harness.prereg.plan import FULL_STAGE, MATRIX_STAGE, plan_study
from harness.providers.catalog import BUNDLED_CATALOG, CatalogModel, load_catalog, resolve_model
from harness.records.plan import PlanCell
from harness.run.attempts import read_plan
from harness.run.layout import stage_folder
from harness.run.ledger import Ledger, load_ledger

__all__ = ["StageSetup", "load_stage_ledger", "pin_plan", "requests_from", "setup_stage", "stage_plan_bytes"]


@dataclasses.dataclass
class StageSetup:
    """A stage resolved: its preregistration, plan bytes and requests, and how each system is called."""

    frozen: FrozenPrereg
    design: Design
    stage: str
    folder: str
    plan_bytes: bytes
    requests: tuple[PlanCell, ...]
    models: dict[str, CatalogModel]  # by system slot
    prices: dict[str, Price | None]  # by system slot
    pricing_path: str
    base_urls: dict[str, str]  # by system slot
    _systems: tuple[tuple[PlanCell, ...], list[str]] | None = dataclasses.field(
        default=None, init=False, repr=False, compare=False)

    @property
    def systems(self) -> list[str]:
        """The systems in plan order; counted once per `requests` (the engine asks after every event)."""
        known = self._systems
        if known is None or known[0] is not self.requests:
            known = self._systems = (self.requests, list(dict.fromkeys(r.system for r in self.requests)))
        return list(known[1])


def stage_plan_bytes(prereg: str, design: Design, stage: str) -> bytes:
    """The stage's plan.jsonl bytes: the plan's header (requests counted for the stage) and its cells."""
    if any(s.id == stage for s in design.stages):
        scope = "pilot"
    elif stage == MATRIX_STAGE:
        scope = "matrix-once"
    elif stage == FULL_STAGE:
        scope = "full"
    else:
        design.stage(stage)  # the refusal naming the registered stages
        raise AssertionError
    plan = plan_study(prereg, scope)
    cells = [c for c in plan.cells if c.stage == stage]
    header = {**plan.header(), "requests": len(cells), "stage": stage}
    return b"".join([canonical_line(header), *(canonical_line(c.to_json()) for c in cells)])


def setup_stage(prereg_dir: str | os.PathLike[str], stage: str, results_dir: str | os.PathLike[str],
                base_urls: Mapping[str, str] | None) -> StageSetup:
    """The stage's set-up (its requests are filled in by `requests_from`)."""
    prereg = os.path.abspath(os.fspath(prereg_dir))
    frozen = check_frozen(prereg)
    design = frozen.design
    plan_bytes = stage_plan_bytes(prereg, design, stage)
    folder = stage_folder(results_dir, design.study_id, stage)
    catalog = load_catalog(BUNDLED_CATALOG if frozen.catalog_sha256 is None else os.path.join(prereg, "catalog.toml"))
    local_pricing = os.path.join(prereg, "pricing.yaml")
    pricing_path = local_pricing if os.path.exists(local_pricing) else str(BUNDLED_PRICING)
    pricing = load_pricing(pricing_path)
    models = {s.slot: resolve_model(catalog, s.model) for s in design.systems}
    urls = {slot: (base_urls or {}).get(m.id) or m.effective_base_url() for slot, m in models.items()}
    return StageSetup(frozen, design, stage, folder, plan_bytes, (), models,
                      {slot: pricing.get(m.pricing_key) for slot, m in models.items()}, pricing_path, urls)


def pin_plan(setup: StageSetup, *, write: bool) -> None:
    """Fill in `setup.requests` from the folder's plan.jsonl (written first when `write` and absent).

    A plan.jsonl that is not the stage's plan under the current freeze is kept (and becomes
    `setup.plan_bytes`) when it ran under an earlier freeze of this preregistration and the
    amendments since do not change what it ran; otherwise the refusal names the stage
    (`amendment_changes_stage`, or `run_plan_changed`).
    """
    path = os.path.join(setup.folder, "plan.jsonl")
    if os.path.lexists(path):
        stored = read_bytes(path)
        if stored != setup.plan_bytes:
            verdict = check_stage_plan(stored, setup.plan_bytes, setup.frozen, setup.stage)
            if not verdict.ok:
                assert verdict.code is not None
                raise RunRefusal(verdict.code, verdict.message, path, stage=setup.stage,
                                 amendments=list(verdict.amendments))
            setup.plan_bytes = stored
    setup.requests = requests_from(setup.folder, setup.plan_bytes, write=write)


def requests_from(folder: str, data: bytes, *, write: bool) -> tuple[PlanCell, ...]:
    """The stage's requests; the folder's plan.jsonl must be `data` (written first when `write`)."""
    path = os.path.join(folder, "plan.jsonl")
    if os.path.lexists(path):
        if read_bytes(path) != data:
            raise RunRefusal(Code.RUN_PLAN_CHANGED, "the stage's plan differs from the one this folder was run with "
                          "(the preregistration, packet or catalog changed)", path)
    elif write:
        atomic_write(path, data, mode=0o644)
    else:  # a dry run (or the preflight) writes nothing: the plan is read from a scratch copy
        with tempfile.TemporaryDirectory() as tmp:
            scratch = os.path.join(tmp, "plan.jsonl")
            with open(scratch, "wb") as fh:  # thrown away at once: no fsync
                fh.write(data)
            return read_plan(scratch).requests
    return read_plan(path).requests


def load_stage_ledger(setup: StageSetup) -> Ledger:
    """The stage folder's ledger under the registered reruns, retries and reserve."""
    d = setup.design
    return load_ledger(setup.folder, d.study_id, setup.stage, setup.requests, reruns=d.run.reruns,
                       transport_retries=d.run.transport_retries, reserve_usd=d.budgets.reserve_per_item_usd)
