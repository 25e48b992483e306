"""Escalation on evidence: failure fingerprints, stagnation, lateral lane switches, provider failures.

The manual: docs/models.md.
"""

from __future__ import annotations

import hashlib
import re
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = [
    "LATERAL",
    "PROVIDER_FAILURE_EXIT",
    "STAGNATION_RUN",
    "EscalationState",
    "escalation_state",
    "fingerprint",
    "is_provider_failure",
    "normalize_output",
]

STAGNATION_RUN: Final = 3
"""Identical failing fingerprints in a row that count as stagnation."""
LATERAL: Final = {"flash": "glm", "glm": "k3", "k3": "glm"}
"""Where a stagnant lane moves."""
PROVIDER_FAILURE_EXIT: Final = 75
"""A worker's exit code for "the provider failed" (EX_TEMPFAIL)."""

_ANSI: Final = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_PATH_END: Final = r"[^\s'\":,;()\[\]<>]*"
_TIMESTAMP: Final = re.compile(
    r"\b\d{4}-\d{2}-\d{2}[T ]\d{1,2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?"
)
_CLOCK: Final = re.compile(r"\b\d{1,2}:\d{2}:\d{2}(?:[.,]\d+)?\b")
_HEX: Final = re.compile(r"\b0x[0-9a-fA-F]{6,}\b")
_PID: Final = re.compile(r"\b(pid|PID|process|Process)([ =:#]+)\d+\b")
_DURATION: Final = re.compile(
    r"\b\d+(?:\.\d+)?\s?(?:ms|us|µs|ns|secs?|seconds?|mins?|minutes?|s|h)(?![A-Za-z0-9_])"
)
_PROGRESS: Final = re.compile(r"\[\s*\d{1,3}%\]")
_COUNTS: Final = re.compile(
    r"\b\d+ (passed|failed|errors?|skipped|xfailed|xpassed|warnings?|deselected|selected|rerun)\b"
)
_COLLECTED: Final = re.compile(r"\bcollected \d+ items?\b")
_RAN: Final = re.compile(r"\bRan \d+ tests?\b")


def _temp_roots() -> list[str]:
    roots = ["/tmp", "/var/tmp", "/var/folders"]
    extra = tempfile.gettempdir().rstrip("/")
    if extra and extra not in roots:
        roots.append(extra)
    return roots


def normalize_output(output: str, paths: Sequence[str] = ()) -> str:
    """The verifier output with the run-to-run noise replaced (see the module docstring)."""
    text = _ANSI.sub("", output).replace("\r\n", "\n").replace("\r", "\n")
    text = "\n".join(line.rstrip() for line in text.split("\n")).strip("\n")
    for path in sorted({p.rstrip("/") for p in paths if p and p.strip("/")}, key=len, reverse=True):
        text = text.replace(path, "<copy>")
    roots = "|".join(re.escape(r) for r in sorted(_temp_roots(), key=len, reverse=True))
    text = re.sub(rf"(?<![\w./-])(?:/private)?(?:{roots})(?![\w.-])(?:/{_PATH_END})?", "<tmp>", text)
    text = _TIMESTAMP.sub("<time>", text)
    text = _CLOCK.sub("<time>", text)
    text = _HEX.sub("<addr>", text)
    text = _PID.sub(r"\1\2<pid>", text)
    text = _DURATION.sub("<dur>", text)
    text = _PROGRESS.sub("[<pct>]", text)
    text = _COUNTS.sub(r"<n> \1", text)
    text = _COLLECTED.sub("collected <n> items", text)
    return _RAN.sub("Ran <n> tests", text)


def fingerprint(output: str, paths: Sequence[str] = ()) -> str:
    """The sha256 hex of the normalized verifier output: equal for the same failure."""
    return hashlib.sha256(normalize_output(output, paths).encode("utf-8", "surrogatepass")).hexdigest()


def is_provider_failure(end: Mapping[str, Any]) -> bool:
    """A dispatch that timed out or whose worker reported a provider failure (exit 75)."""
    return bool(end.get("timed_out")) or end.get("exit_code") == PROVIDER_FAILURE_EXIT


@dataclass(frozen=True)
class EscalationState:
    """The escalation facts derived from a journal.

    Attributes:
        lane: the current lane (the pinned lane, then each `lane_switch`).
        initial_lane: the lane pinned at init.
        switches: the `lane_switch` events, in order.
        counted: the verifications that count since the last switch, as
            {receipt_id, dispatch_seq, passed, fingerprint}.
        fingerprints: the fingerprints of the failing ones among them, in order.
        stagnant_count: length of the trailing run of identical failing fingerprints.
        failed_providers: lane -> providers with a provider failure in that lane.
        provider_failures: every provider-failed dispatch, as {dispatch_id, lane, provider, model, why}.
    """

    lane: str
    initial_lane: str
    switches: tuple[dict[str, Any], ...]
    counted: tuple[dict[str, Any], ...]
    fingerprints: tuple[str, ...]
    stagnant_count: int
    failed_providers: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    provider_failures: tuple[dict[str, Any], ...] = ()

    @property
    def stagnant(self) -> bool:
        return self.stagnant_count >= STAGNATION_RUN

    @property
    def stagnant_fingerprint(self) -> str | None:
        return self.fingerprints[-1] if self.stagnant_count else None

    def excluded_providers(self, lane: str) -> tuple[str, ...]:
        return self.failed_providers.get(lane, ())

    def to_json(self) -> dict[str, Any]:
        return {
            "lane": self.lane,
            "initial_lane": self.initial_lane,
            "lane_switches": len(self.switches),
            "fingerprints": list(self.fingerprints),
            "stagnant_count": self.stagnant_count,
            "stagnant": self.stagnant,
            "failed_providers": {k: list(v) for k, v in sorted(self.failed_providers.items())},
        }


def escalation_state(initial_lane: str, events: Iterable[Mapping[str, Any]]) -> EscalationState:
    """Derive the current lane, the counted fingerprints and provider failures from journal events."""
    lane = initial_lane
    switches: list[dict[str, Any]] = []
    counted: dict[int, dict[str, Any]] = {}  # dispatch seq -> its last verification (insertion order)
    starts: dict[str, Mapping[str, Any]] = {}
    provider_failed_seqs: set[int] = set()
    failures: list[dict[str, Any]] = []
    failed: dict[str, list[str]] = {}
    seq = 0
    for event in events:
        kind = event.get("event")
        if kind == "lane_switch":
            lane = str(event["to"])
            switches.append(dict(event))
            counted = {}
        elif kind == "dispatch_start":
            seq = int(event["seq"])
            starts[str(event["dispatch_id"])] = event
        elif kind == "dispatch_end" and is_provider_failure(event):
            start = starts.get(str(event["dispatch_id"]), {})
            provider_failed_seqs.add(int(event["seq"]))
            provider = start.get("provider")
            start_lane = str(start.get("lane", lane))
            failures.append(
                {
                    "dispatch_id": event["dispatch_id"],
                    "lane": start_lane,
                    "provider": provider,
                    "model": start.get("model"),
                    "why": "timed out" if event.get("timed_out") else f"exit {PROVIDER_FAILURE_EXIT}",
                }
            )
            if isinstance(provider, str) and provider not in failed.setdefault(start_lane, []):
                failed[start_lane].append(provider)
        elif kind == "verify":
            at = int(event.get("dispatch_seq", seq))
            if at == 0 or at in provider_failed_seqs:
                continue
            counted.pop(at, None)
            counted[at] = {
                "receipt_id": event.get("receipt_id"),
                "dispatch_seq": at,
                "passed": bool(event.get("passed")),
                "fingerprint": event.get("fingerprint"),
            }
    items = tuple(counted.values())
    prints = tuple(str(v["fingerprint"]) for v in items if not v["passed"] and v["fingerprint"])
    run = 0
    for item in reversed(items):
        if item["passed"] or not item["fingerprint"] or item["fingerprint"] != items[-1]["fingerprint"]:
            break
        run += 1
    return EscalationState(
        lane=lane,
        initial_lane=initial_lane,
        switches=tuple(switches),
        counted=items,
        fingerprints=prints,
        stagnant_count=run,
        failed_providers={k: tuple(v) for k, v in failed.items()},
        provider_failures=tuple(failures),
    )
