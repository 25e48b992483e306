"""The task file (`task.json`): what the worker is asked, where it may write, how it is judged."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any

from harness.errors import Code, Refusal
from harness.evidence.jsonio import read_json

__all__ = [
    "FEATURES",
    "LANES",
    "Budget",
    "HiddenInput",
    "Task",
    "Verifier",
    "load_task",
    "parse_task",
]

LANES = ("flash", "glm", "k3")
FEATURES = frozenset(
    {
        "localized",
        "bounded",
        "known_location",
        "objective_acceptance",
        "multi_module",
        "unfamiliar_repo",
        "substantial_refactor",
        "open_ended",
        "research_engineering",
        "marathon",
    }
)
_TASK_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_TASK_KEYS = {
    "task_id",
    "prompt",
    "features",
    "scope",
    "verifier",
    "budget",
    "lane",
    "lane_reason",
    "preflight_receipts",
}
_VERIFIER_KEYS = {"argv", "seal", "hidden"}
_BUDGET_KEYS = {"max_dispatches", "max_stagnant", "timeout_s", "verify_timeout_s", "max_preflight_age_s"}


@dataclass(frozen=True)
class HiddenInput:
    """A private input: `source` lies outside the workspace, `to` is its place in the verification copy."""

    source: str
    to: str


@dataclass(frozen=True)
class Verifier:
    """The verifier as written in the task: argv (with `{python}`), sealed paths/globs, hidden inputs."""

    argv: tuple[str, ...]
    seal: tuple[str, ...]
    hidden: tuple[HiddenInput, ...]
    raw: dict[str, Any] = field(compare=False, repr=False)

    def resolved_argv(self) -> list[str]:
        """The argv with `{python}` replaced by the interpreter running proctor."""
        return [sys.executable if a == "{python}" else a.replace("{python}", sys.executable) for a in self.argv]


@dataclass(frozen=True)
class Budget:
    """Limits on the worker and the verifier."""

    max_dispatches: int
    max_stagnant: int
    timeout_s: float
    verify_timeout_s: float = 600.0
    max_preflight_age_s: float = 86400.0


@dataclass(frozen=True)
class Task:
    """A parsed, validated task file."""

    task_id: str
    prompt: str
    features: tuple[str, ...]
    scope: tuple[str, ...]
    verifier: Verifier
    budget: Budget
    lane: str | None
    lane_reason: str | None
    preflight_receipts: tuple[str, ...]
    path: str
    folder: str
    sha256: str


def load_task(path: str | os.PathLike[str]) -> Task:
    """Read and validate a task file strictly (one read, hashed bytes)."""
    loaded = read_json(path, max_bytes=4 * 1024 * 1024)
    return parse_task(loaded.value, path=os.path.abspath(os.fspath(path)), sha256=loaded.sha256)


def parse_task(doc: dict[str, Any], *, path: str, sha256: str) -> Task:
    """Validate a decoded task object; every problem is a named refusal with the path."""

    def bad(message: str, code: Code = Code.TASK_INVALID) -> Refusal:
        return Refusal(code, message, path)

    unknown = sorted(set(doc) - _TASK_KEYS)
    if unknown:
        raise bad(f"unknown keys: {', '.join(unknown)}")
    task_id = _string(doc, "task_id", bad)
    if not _TASK_ID.match(task_id):
        raise bad("task_id must be 1-128 of letters, digits, '.', '_', '-' and start with a letter or digit")
    prompt = _string(doc, "prompt", bad)
    features = _string_list(doc.get("features", []), "features", bad)
    strange = sorted(set(features) - FEATURES)
    if strange:
        raise bad(f"unknown features: {', '.join(strange)} (known: {', '.join(sorted(FEATURES))})")
    if "scope" not in doc:
        raise bad("missing key: scope")
    scope = _string_list(doc["scope"], "scope", bad)
    if not scope:
        raise bad("scope must name at least one path the worker may change", Code.SCOPE_EMPTY)
    for item in scope:
        _relative_path(item, "scope", bad)
    verifier = _verifier(doc.get("verifier"), bad)
    budget = _budget(doc.get("budget"), bad)
    lane = doc.get("lane")
    lane_reason = doc.get("lane_reason")
    if lane is not None and lane not in LANES:
        raise bad(f"lane must be one of {', '.join(LANES)}")
    if lane is not None and (not isinstance(lane_reason, str) or not lane_reason.strip()):
        raise bad("an explicit lane needs a lane_reason")
    if lane is None and lane_reason is not None:
        raise bad("lane_reason without a lane")
    preflight = _string_list(doc.get("preflight_receipts", []), "preflight_receipts", bad)
    folder = os.path.dirname(path)
    return Task(
        task_id=task_id,
        prompt=prompt,
        features=tuple(features),
        scope=tuple(scope),
        verifier=verifier,
        budget=budget,
        lane=lane,
        lane_reason=lane_reason,
        preflight_receipts=tuple(preflight),
        path=path,
        folder=folder,
        sha256=sha256,
    )


def _string(doc: dict[str, Any], key: str, bad: Any) -> str:
    value = doc.get(key)
    if not isinstance(value, str) or not value.strip():
        raise bad(f"{key} must be a non-empty string")
    return value


def _string_list(value: Any, key: str, bad: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise bad(f"{key} must be a list of non-empty strings")
    return list(value)


def _relative_path(value: str, key: str, bad: Any) -> str:
    parts = value.replace("\\", "/").split("/")
    if value.startswith("/") or ".." in parts or "\x00" in value:
        raise bad(f"{key}: {value!r} must be a relative path inside the workspace")
    if parts[0] == ".git":
        raise bad(f"{key}: {value!r} lies in .git")
    return value


def _verifier(value: Any, bad: Any) -> Verifier:
    if not isinstance(value, dict):
        raise bad("verifier must be an object with argv")
    unknown = sorted(set(value) - _VERIFIER_KEYS)
    if unknown:
        raise bad(f"unknown verifier keys: {', '.join(unknown)}")
    argv = value.get("argv")
    if isinstance(argv, str):
        raise bad("verifier.argv is a shell string; give an array of strings", Code.VERIFIER_ARGV_NOT_ARRAY)
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) and a for a in argv):
        raise bad("verifier.argv must be a non-empty array of non-empty strings", Code.VERIFIER_ARGV_NOT_ARRAY)
    seal = _string_list(value.get("seal", []), "verifier.seal", bad)
    for item in seal:
        _relative_path(item, "verifier.seal", bad)
    hidden_raw = value.get("hidden", [])
    if not isinstance(hidden_raw, list):
        raise bad("verifier.hidden must be a list of {from, to}")
    hidden: list[HiddenInput] = []
    for entry in hidden_raw:
        if not isinstance(entry, dict) or set(entry) != {"from", "to"}:
            raise bad("each verifier.hidden entry must be exactly {\"from\": ..., \"to\": ...}")
        source, to = entry["from"], entry["to"]
        if not isinstance(source, str) or not source or not isinstance(to, str) or not to:
            raise bad("verifier.hidden from/to must be non-empty strings")
        hidden.append(HiddenInput(source=source, to=_relative_path(to, "verifier.hidden.to", bad)))
    tos = [h.to for h in hidden]
    if len(set(tos)) != len(tos):
        raise bad("verifier.hidden names the same destination twice")
    return Verifier(argv=tuple(argv), seal=tuple(seal), hidden=tuple(hidden), raw=value)


def _budget(value: Any, bad: Any) -> Budget:
    if not isinstance(value, dict):
        raise bad("budget must be an object")
    unknown = sorted(set(value) - _BUDGET_KEYS)
    if unknown:
        raise bad(f"unknown budget keys: {', '.join(unknown)}")
    for key in ("max_dispatches", "max_stagnant", "timeout_s"):
        if key not in value:
            raise bad(f"budget.{key} is required")
    numbers: dict[str, Any] = {}
    for key, v in value.items():
        integral = key in ("max_dispatches", "max_stagnant")
        if isinstance(v, bool) or not isinstance(v, int if integral else (int, float)):
            raise bad(f"budget.{key} must be {'an integer' if integral else 'a number'}")
        # An integer too large for a float (e.g. 1 followed by 400 zeros) overflows in float().
        if not v > 0 or v != v or v == float("inf") or (not integral and v > sys.float_info.max):
            raise bad(f"budget.{key} must be positive and finite")
        numbers[key] = v if integral else float(v)
    return Budget(**numbers)
