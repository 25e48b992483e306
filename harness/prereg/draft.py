"""A preregistration folder written from parameters (`notebooks/new_study.ipynb`), checked, never frozen.

The manual: docs/prereg.md (`harness/prereg/draft.py`).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from harness.errors import Code, PreregRefusal, Refusal
from harness.evidence.jsonio import loads_strict, read_bytes
from harness.evidence.paths import repo_root
from harness.prereg.design import Design, design_from_bytes
from harness.prereg.folder import CATALOG_NAME, prepare, resolve_packet
from harness.prereg.resolve import PRICING_NAME, resolve_systems
from harness.providers.catalog import BUNDLED_CATALOG, load_catalog, resolve_model

__all__ = ["RUN_DEFAULTS", "Drafted", "draft_prereg"]

RUN_DEFAULTS: Final[Mapping[str, Any]] = {
    "lanes_per_system": 2, "attempt_deadline_s": 120, "reruns": 2, "transport_retries": 3,
    "max_output_tokens": 1024, "full_repeats": 3,
}
"""The `[run]` rules a draft registers unless `run` names others."""

_BUDGET_KEYS: Final = ("reserve_per_item_usd", "overall_cap_usd", "ceiling_margin_usd", "spend_before_usd")
_RUN_KEYS: Final = (*RUN_DEFAULTS, "anchor_remote", "anchor_timeout_s")
_STAGE_KEYS: Final = ("id", "systems", "arms", "items", "repeats")
_COMPARISON_KEYS: Final = ("a", "b", "arm", "margin", "expected_a", "expected_b", "correlation")
_SYSTEM_KEYS: Final = ("model", "cap_usd", "setting")
_MAX_SUITE_BYTES: Final = 1024 * 1024


@dataclass(frozen=True)
class Drafted:
    """What `draft_prereg` wrote: the folder, its files (names, in writing order) and the validated design."""

    folder: str
    files: tuple[str, ...]
    design: Design


def _bad(field: str, message: str) -> Refusal:
    return PreregRefusal(Code.DRAFT_INVALID, f"{field}: {message}", None, field=field)


def _mapping(value: Any, field: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping) or not value or not all(isinstance(k, str) for k in value):
        raise _bad(field, "must be a non-empty mapping with string keys")
    return value


def _records(value: Any, field: str) -> list[Mapping[str, Any]]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not value:
        raise _bad(field, "must be a non-empty list")
    for i, entry in enumerate(value):
        if not isinstance(entry, Mapping):
            raise _bad(f"{field}[{i}]", "must be a mapping")
    return list(value)


def _keys(entry: Mapping[str, Any], field: str, allowed: Sequence[str], required: Sequence[str]) -> None:
    unknown = sorted(set(entry) - set(allowed))
    if unknown:
        raise _bad(field, f"unknown keys {', '.join(unknown)} (allowed: {', '.join(allowed)})")
    missing = [k for k in required if k not in entry]
    if missing:
        raise _bad(field, f"missing keys {', '.join(missing)}")


def _text(value: Any, field: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _bad(field, "must be a non-empty string")
    return value


# --------------------------------------------------------------------------
# TOML, written for the few shapes a design has (read back by tomllib before anything is written)


def _toml_string(text: str) -> str:
    out = json.dumps(text, ensure_ascii=False)  # JSON's escapes are TOML basic-string escapes
    return out.replace("\x7f", "\\u007f")  # DEL: TOML forbids it raw, JSON leaves it


def _toml_value(value: Any, field: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _bad(field, "must be a finite number")
        return repr(value)
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v, field) for v in value) + "]"
    raise _bad(field, f"must be a string, a number, a bool or a list of them, not {type(value).__name__}")


def _toml_table(header: str, values: Mapping[str, Any], field: str) -> list[str]:
    return [header, *(f"{k} = {_toml_value(v, f'{field}.{k}')}" for k, v in values.items()), ""]


# --------------------------------------------------------------------------


def _suite_packet(root: str, suite: str) -> tuple[str, str]:
    """(the packet's path, its registered sha256) from `evals/<suite>/SUITE.json` under `root`."""
    folder = os.path.join(root, "evals", suite)
    path = os.path.join(folder, "SUITE.json")
    if os.sep in suite or suite in ("", ".", "..") or not os.path.isfile(path):
        known = sorted(n for n in os.listdir(os.path.join(root, "evals"))
                       if os.path.isfile(os.path.join(root, "evals", n, "SUITE.json"))) \
            if os.path.isdir(os.path.join(root, "evals")) else []
        raise PreregRefusal(Code.DRAFT_UNKNOWN_SUITE, f"no suite {suite!r} (evals/<suite>/SUITE.json); "
                            f"known: {', '.join(known) or 'none'}", os.path.join(root, "evals"), known=known)
    record = loads_strict(read_bytes(path, max_bytes=_MAX_SUITE_BYTES), path=path)
    sha = record.get("packet_sha256") if isinstance(record, dict) else None
    if not isinstance(sha, str):
        raise PreregRefusal(Code.DRAFT_UNKNOWN_SUITE, "SUITE.json names no packet_sha256", path)
    return os.path.join(folder, "packet.jsonl"), sha


def _prereg_md(title: str, question: str, design: Mapping[str, Any]) -> str:
    lines = [f"# Preregistration: {title}", "", "**Status:** a draft written by notebooks/new_study.ipynb; "
             "edit this text, then freeze it (`proctor prereg freeze`).", "", "## Question", "", question.strip(),
             "", "## Design", ""]
    lines.append(f"- Suite: {design['suite']['name']} (the packet's sha256 is pinned in design.toml); "
                 f"{design['draw']['items']} items drawn in the order of the study seed's hash of their ids.")
    for s in design["systems"]:
        lines.append(f"- System `{s['slot']}`: {s['model']} ({s['provider']}, setting {s['setting']}), "
                     f"cap ${s['cap_usd']:g}.")
    for a in design["arms"]:
        lines.append(f"- Arm `{a['id']}`: template {json.dumps(a['template'], ensure_ascii=False)}.")
    for st in design["stages"]:
        lines.append(f"- Stage {st['id']}: the first {st['items']} drawn items on {', '.join(st['systems'])}, "
                     f"arms {', '.join(st['arms'])}, {st['repeats']} repeat(s).")
    a = design["analysis"]
    lines += ["", "## Analysis", "", f"{a['test']} at alpha {a['alpha']:g}, power {a['power']:g}, "
              f"clustered by {a['clustering']}:", ""]
    for c in a["comparisons"]:
        lines.append(f"- `{c['a']}` vs `{c['b']}` on arm `{c['arm']}`: equivalent within {c['margin']:g} "
                     f"(expected {c['expected_a']:g} and {c['expected_b']:g}, correlation {c['correlation']:g}).")
    return "\n".join(lines) + "\n"


def draft_prereg(
    folder: str | os.PathLike[str],
    *,
    study: str,
    title: str,
    question: str,
    seed: int,
    suite: str,
    draw: int,
    systems: Mapping[str, Mapping[str, Any]],
    arms: Mapping[str, str],
    stages: Sequence[Mapping[str, Any]],
    comparisons: Sequence[Mapping[str, Any]],
    budgets: Mapping[str, Any],
    run: Mapping[str, Any] | None = None,
    alpha: float = 0.05,
    power: float = 0.8,
    test: str = "paired_tost",
    clustering: str = "item",
    catalog: str | os.PathLike[str] | None = None,
    pricing: str | os.PathLike[str] | None = None,
    root: str | os.PathLike[str] | None = None,
) -> Drafted:
    """Write `folder` (design.toml, PREREG.md, systems.json) from parameters; nothing is frozen.

    Each system is `{"model": catalog id, "cap_usd": x, "setting": "default"}`; its provider and
    pricing key come from the catalog (`catalog`, copied in as catalog.toml, else the bundled one).
    The folder is built beside `folder` and checked as `prereg check` would (design, packet,
    systems resolved against catalog and pricing), then moved into place whole. Refuses
    `draft_folder_exists`, `draft_invalid` (naming the field), `draft_unknown_suite`, and the
    design's and resolution's own refusals; on any refusal nothing is written. docs/prereg.md.
    """
    target = os.path.abspath(os.fspath(folder))
    if os.path.lexists(target) and not (os.path.isdir(target) and not os.path.islink(target)
                                        and not os.listdir(target)):
        raise PreregRefusal(Code.DRAFT_FOLDER_EXISTS, "the folder exists and is not empty: a draft never "
                            "writes over a registration", target)
    base = os.path.abspath(os.fspath(root)) if root is not None else str(repo_root())
    packet_path, packet_sha = _suite_packet(base, _text(suite, "suite"))
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise _bad("seed", "must be an integer")
    if isinstance(draw, bool) or not isinstance(draw, int):
        raise _bad("draw", "must be an integer")
    catalog_path = os.path.abspath(os.fspath(catalog)) if catalog is not None else str(BUNDLED_CATALOG)
    used = load_catalog(catalog_path)

    system_rows: list[dict[str, Any]] = []
    for slot, entry in _mapping(systems, "systems").items():
        where = f"systems.{slot}"
        _keys(_mapping(entry, where), where, _SYSTEM_KEYS, ("model", "cap_usd"))
        model = resolve_model(used, _text(entry["model"], f"{where}.model"))
        system_rows.append({"slot": slot, "provider": model.provider, "model": model.id,
                            "setting": _text(entry.get("setting", "default"), f"{where}.setting"),
                            "pricing_key": model.pricing_key, "cap_usd": entry["cap_usd"]})
    arm_rows = [{"id": arm_id, "template": _text(t, f"arms.{arm_id}")}
                for arm_id, t in _mapping(arms, "arms").items()]
    stage_rows: list[dict[str, Any]] = []
    for i, entry in enumerate(_records(stages, "stages")):
        _keys(entry, f"stages[{i}]", _STAGE_KEYS, ("id", "systems", "arms", "items"))
        stage_rows.append({k: entry.get(k, 1) for k in _STAGE_KEYS})
    comparison_rows: list[dict[str, Any]] = []
    for i, entry in enumerate(_records(comparisons, "comparisons")):
        _keys(entry, f"comparisons[{i}]", _COMPARISON_KEYS, _COMPARISON_KEYS)
        comparison_rows.append({k: entry[k] for k in _COMPARISON_KEYS})
    _keys(_mapping(budgets, "budgets"), "budgets", _BUDGET_KEYS, _BUDGET_KEYS[:3])
    budget_row = {"spend_before_usd": 0.0, **budgets}
    run_row = {**RUN_DEFAULTS, **(_mapping(run, "run") if run is not None else {})}
    _keys(run_row, "run", _RUN_KEYS, ())

    design: dict[str, Any] = {
        "study": {"id": study, "seed": seed, "title": _text(title, "title")},
        "suite": {"name": suite, "packet": os.path.relpath(packet_path, target), "packet_sha256": packet_sha},
        "draw": {"items": draw}, "systems": system_rows, "arms": arm_rows, "stages": stage_rows,
        "budgets": {k: budget_row[k] for k in _BUDGET_KEYS},
        "run": run_row,
        "analysis": {"alpha": alpha, "power": power, "test": test, "clustering": clustering,
                     "comparisons": comparison_rows},
    }
    lines = ["# Written by harness.prereg.draft (notebooks/new_study.ipynb); docs/prereg.md lists every key.", ""]
    for name in ("study", "suite", "draw"):
        lines += _toml_table(f"[{name}]", design[name], name)
    for name, rows in (("systems", system_rows), ("arms", arm_rows), ("stages", stage_rows)):
        for i, row in enumerate(rows):
            lines += _toml_table(f"[[{name}]]", row, f"{name}[{i}]")
    lines += _toml_table("[budgets]", design["budgets"], "budgets")
    lines += _toml_table("[run]", run_row, "run")
    lines += _toml_table("[analysis]", {k: v for k, v in design["analysis"].items() if k != "comparisons"},
                         "analysis")
    for i, row in enumerate(comparison_rows):
        lines += _toml_table("[[analysis.comparisons]]", row, f"comparisons[{i}]")
    design_bytes = "\n".join(lines).encode("utf-8")
    checked = design_from_bytes(design_bytes, os.path.join(target, "design.toml"))  # the design's own refusals
    manifest = {"study": checked.study_id, "systems": [s.manifest() for s in checked.systems]}
    files: dict[str, bytes] = {
        "design.toml": design_bytes,
        "PREREG.md": _prereg_md(title, _text(question, "question"), design).encode("utf-8"),
        "systems.json": (json.dumps(manifest, indent=2, ensure_ascii=False) + "\n").encode("utf-8"),
    }
    if catalog is not None:
        files[CATALOG_NAME] = read_bytes(catalog_path)
    if pricing is not None:
        files[PRICING_NAME] = read_bytes(os.path.abspath(os.fspath(pricing)))

    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    building = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.draft-", dir=parent)
    try:
        for name, data in files.items():
            with open(os.path.join(building, name), "xb") as fh:
                fh.write(data)
        prepared = prepare(building)  # as freeze validates it: the folder's entries, manifest, catalog
        resolve_packet(prepared.design)  # as prereg check does: the packet's sha256, the draw within it
        resolve_systems(building, prepared.design, prepared.catalog, prepared.files)
        if os.path.isdir(target):
            os.rmdir(target)  # empty (checked above); a file appearing since makes this fail loudly
        os.rename(building, target)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return Drafted(target, tuple(files), design_from_bytes(design_bytes, os.path.join(target, "design.toml")))
