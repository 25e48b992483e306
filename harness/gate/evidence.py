"""The evidence packet (`proctor-evidence.v1`) a worker gets after a lane switch.

The manual: docs/models.md.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Final

from harness.evidence.git import head_blobs
from harness.evidence.jsonio import read_bytes
from harness.evidence.tree import scan_tree
from harness.evidence.tree_entry import diff_trees, display_path
from harness.gate.baseline import baseline_entries
from harness.gate.decision import SwitchDecision
from harness.gate.escalation import EscalationState
from harness.gate.receipts import load_receipt
from harness.gate.workspace import Gate
from harness.records.receipt import Receipt

__all__ = [
    "DIFF_LIMIT",
    "EVIDENCE_SCHEMA",
    "OUTPUT_LIMIT",
    "REPAIR_SCHEMA",
    "evidence_packet",
    "failing_test_evidence",
    "failure_sections",
    "render_evidence",
    "render_repair",
    "repair_packet",
]

EVIDENCE_SCHEMA: Final = "proctor-evidence.v1"
REPAIR_SCHEMA: Final = "proctor-repair.v1"
OUTPUT_LIMIT: Final = 20_000
"""Bytes of the last verified test output in a packet (its head and its tail when longer)."""
DIFF_LIMIT: Final = 100_000
"""Characters of unified diff in a packet."""
_FILE_LIMIT: Final = 1024 * 1024
_TEST_NAME: Final = re.compile(r"^\s*(?:async\s+)?def\s+(test\w*)\s*\(", re.MULTILINE)


def _git_blobs(workspace: str, wanted: Mapping[bytes, str]) -> dict[bytes, bytes]:
    """Baseline contents from the workspace's git HEAD, kept only when they hash as the baseline says.

    Read by `harness.evidence.git.head_blobs`: no key of the workspace's
    (worker-writable) git config is read, so no hook, filter, fsmonitor or
    lazy fetch runs; content that does not match the baseline manifest (a
    moved HEAD) is left out.
    """
    blobs = head_blobs(workspace, sorted(wanted))
    return {p: body for p, body in blobs.items() if hashlib.sha256(body).hexdigest() == wanted[p]}


def _text_of(data: bytes | None) -> str | None:
    if data is None or b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _workspace_diff(gate: Gate) -> dict[str, Any]:
    """The workspace against the baseline tree: paths by change, and a unified diff of text files."""
    baseline = baseline_entries(gate)
    current = scan_tree(gate.workspace, tuple(gate.pin["excludes"]))
    diff = diff_trees(baseline, current)
    blobs = _git_blobs(
        gate.workspace,
        {p: baseline[p].digest for p in (*diff.changed, *diff.removed) if baseline[p].kind == "file"},
    )
    parts: list[str] = []
    for path in sorted({*diff.added, *diff.removed, *diff.changed}):
        before, after = baseline.get(path), current.get(path)
        name = display_path(path)
        kinds = [e.kind for e in (before, after) if e is not None]
        if any(k != "file" for k in kinds):
            if "dir" not in kinds or len(kinds) == 2:
                parts.append(f"# {name}: {before.kind if before else 'absent'} -> {after.kind if after else 'absent'}\n")
            continue
        old: str | None = ""
        if before is not None:
            old = _text_of(blobs.get(path))
            if path not in blobs:
                parts.append(f"# {name}: changed (its baseline content is not in git HEAD)\n")
                continue
        new: str | None = ""
        if after is not None:
            if after.size > _FILE_LIMIT:
                parts.append(f"# {name}: changed ({after.size} bytes, too large to show)\n")
                continue
            new = _text_of(read_bytes(os.path.join(gate.workspace, os.fsdecode(path))))
        if old is None or new is None:
            parts.append(f"# {name}: binary file changed\n")
            continue
        lines = difflib.unified_diff(
            old.splitlines(keepends=True),
            new.splitlines(keepends=True),
            fromfile=f"a/{name}" if before is not None else "/dev/null",
            tofile=f"b/{name}" if after is not None else "/dev/null",
        )
        parts.append("".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines))
    text = "".join(parts)
    return {
        "against": "the baseline tree recorded at init",
        "changed": [display_path(p) for p in diff.changed],
        "untracked": [display_path(p) for p in diff.added],
        "removed": [display_path(p) for p in diff.removed],
        "unified": text[:DIFF_LIMIT],
        "unified_truncated": len(text) > DIFF_LIMIT,
    }


def _hidden_texts(gate: Gate) -> list[tuple[str, str]]:
    """(shown path, text) of every hidden input file (the stored copies, checked at each verify)."""
    texts: list[tuple[str, str]] = []
    for item in gate.pin["hidden"]:
        stored = gate.state.path("hidden", item["stored"])
        files = [(item["to"], stored)]
        if item["kind"] == "dir":
            files = [
                (f"{item['to']}/{os.fsdecode(rel)}", os.path.join(stored, os.fsdecode(rel)))
                for rel, entry in sorted(scan_tree(stored, excludes=()).items())
                if entry.kind == "file"
            ]
        texts.extend((shown, read_bytes(path).decode("utf-8", "replace")) for shown, path in files)
    return texts


def _hidden_test_names(hidden: Sequence[tuple[str, str]]) -> list[str]:
    """`<path>::<test name>` for each test function in the hidden inputs (names only, never contents)."""
    return [f"{shown}::{name}" for shown, text in hidden if shown.endswith(".py") for name in _TEST_NAME.findall(text)]


def _withhold_hidden(output: str, hidden: Sequence[tuple[str, str]]) -> tuple[str, int]:
    """The output with every line that quotes a hidden file's source withheld; and how many were.

    pytest prints the failing test's source (`>       assert ...`); for a
    hidden test that would hand its contents to the next worker. A line
    counts as quoted when, stripped of blanks and a leading `>`, it equals a
    stripped hidden line of 8 characters or more. Failure messages (`E ...`)
    and test names stay.
    """
    quoted = {line.strip() for _, text in hidden for line in text.splitlines() if len(line.strip()) >= 8}
    kept, withheld = [], 0
    for line in output.split("\n"):
        if line.lstrip().lstrip(">").strip() in quoted:
            kept.append("[a line of hidden test source withheld]")
            withheld += 1
        else:
            kept.append(line)
    return "\n".join(kept), withheld


def _hidden_failing(receipt: Receipt, hidden: Sequence[tuple[str, str]]) -> list[str] | None:
    """The ids of the hidden tests that did not pass (names only), or None without a per-test report."""
    if receipt.results is None:
        return None
    files = {shown for shown, _ in hidden}
    return [t for t in receipt.results.not_passed if t.split("::", 1)[0] in files]


def _verified_output(gate: Gate, receipt_id: str, hidden: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """What a worker may see of a failing verification: the names of the hidden tests that failed and
    the output of a run without the hidden inputs (never the output of the run with them: code under
    test may print the hidden tests in any form), checked against the receipt, head and tail within
    `OUTPUT_LIMIT`, with quoted hidden test source withheld as well."""
    event = next(e for e in reversed(gate.events) if e["event"] == "verify" and e["receipt_id"] == receipt_id)
    receipt = load_receipt(gate.state.path("receipts", f"{receipt_id}.json"), event["receipt_sha256"])
    shown: dict[str, Any] = {
        "receipt_id": receipt_id,
        "receipt_sha256": event["receipt_sha256"],
        "hidden_failing": _hidden_failing(receipt, hidden),
    }
    if gate.pin["hidden"] and receipt.visible_output_sha256 is None:
        return {**shown, "output": "none", "output_sha256": None, "bytes": 0, "text": None, "truncated": False,
                "problem": "the output of the run with the hidden tests is never shown"}  # fmt: skip
    if gate.pin["hidden"]:
        output, digest = "without_hidden", receipt.visible_output_sha256
        data = read_bytes(gate.state.path("receipts", f"{receipt_id}.visible.output"))
    else:
        output, digest = "verified", receipt.output_sha256
        data = read_bytes(gate.state.path("receipts", f"{receipt_id}.output"))
    shown.update(output=output, output_sha256=digest, bytes=len(data))
    if hashlib.sha256(data).hexdigest() != digest:
        return {**shown, "text": None, "truncated": False, "problem": "the output file differs from the receipt"}
    truncated = len(data) > OUTPUT_LIMIT
    if truncated:
        head, tail = data[: OUTPUT_LIMIT // 4], data[-(OUTPUT_LIMIT - OUTPUT_LIMIT // 4) :]
        cut = len(data) - len(head) - len(tail)
        data = head + f"\n[... {cut} bytes left out ...]\n".encode() + tail
    text, withheld = _withhold_hidden(data.decode("utf-8", "replace"), hidden)
    return {**shown, "text": text, "truncated": truncated, "hidden_lines_withheld": withheld}


def evidence_packet(gate: Gate, state: EscalationState, to_lane: str, reason: str, dispatch_id: str) -> dict[str, Any]:
    """What the worker after a lane switch is given. Never a failed worker's own transcript."""
    failing = [c for c in state.counted if not c["passed"]]
    hidden = _hidden_texts(gate)
    return {
        "schema": EVIDENCE_SCHEMA,
        "task_id": gate.task.task_id,
        "dispatch_id": dispatch_id,
        "switch": {"from": state.lane, "to": to_lane},
        "reason": reason,
        "objective": gate.task.prompt,
        "acceptance": {
            "rule": "the sealed verifier, run by the proctor on a fresh copy of the workspace with the "
            "hidden tests laid in, must exit 0; sealed files are restored if changed",
            "verifier_argv": gate.pin["verifier_argv"],
            "sealed": [s["path"] for s in gate.pin["sealed"]],
            "hidden_inputs": [h["to"] for h in gate.pin["hidden"]],
            "hidden_tests": _hidden_test_names(hidden),
            "scope": list(gate.task.scope),
        },
        "diff": _workspace_diff(gate),
        "verified_output": _verified_output(gate, failing[-1]["receipt_id"], hidden),
        "fingerprints": [
            {"receipt_id": c["receipt_id"], "dispatch_seq": c["dispatch_seq"], "fingerprint": c["fingerprint"]}
            for c in failing
        ],
        "not_included": "the failed workers' own transcripts",
    }


def _fenced(text: str, lang: str = "") -> str:
    fence = "`" * max(3, 1 + max((len(m) for m in re.findall(r"`+", text)), default=0))
    return f"{fence}{lang}\n{text.rstrip()}\n{fence}\n"


def render_evidence(packet: Mapping[str, Any], path: str) -> str:
    """The packet as a prompt section (appended to the prompt file)."""
    acc, diff, out = packet["acceptance"], packet["diff"], packet["verified_output"]
    lines = [
        "",
        "---",
        "## Evidence from earlier attempts (written by the proctor)",
        "",
        f"Lane switch {packet['switch']['from']} -> {packet['switch']['to']}: {packet['reason']}",
        f"The same evidence as JSON: {path} (also named by $PROCTOR_EVIDENCE_FILE).",
        "",
        "### Acceptance",
        f"- {acc['rule']}",
        f"- verifier: `{' '.join(acc['verifier_argv'])}`",
        f"- sealed: {', '.join(acc['sealed']) or 'none'}",
        f"- hidden tests: {', '.join(acc['hidden_tests'] or acc['hidden_inputs']) or 'none'}",
        f"- scope: {', '.join(acc['scope'])}",
        "",
        "### Current changes against the baseline",
        f"changed: {', '.join(diff['changed']) or 'none'}; untracked: {', '.join(diff['untracked']) or 'none'}; "
        f"removed: {', '.join(diff['removed']) or 'none'}",
        "",
        _fenced(diff["unified"], "diff") if diff["unified"] else "(no text changes)\n",
        f"### Last verification (receipt {out['receipt_id']})",
        "",
        "Hidden tests that did not pass: "
        + (", ".join(out["hidden_failing"]) or "none" if out.get("hidden_failing") is not None else "not reported"),
        "",
        "Test output" + (" of a run without the hidden tests:" if out.get("output") == "without_hidden" else ":"),
        "",
        _fenced(out["text"] or out.get("problem", "")),
        "### Failure fingerprints since the last lane switch",
        *[f"- {f['receipt_id']} (dispatch {f['dispatch_seq']}): {f['fingerprint']}" for f in packet["fingerprints"]],
        "",
    ]
    return "\n".join(lines)


_SECTION: Final = re.compile(r"^_{3,} (.+?) _{3,}$")


def failure_sections(output: str) -> dict[str, str]:
    """pytest's failure sections (`____ test_x ____` up to the next header or `===` line), by title."""
    sections: dict[str, list[str]] = {}
    title: str | None = None
    for line in output.split("\n"):
        head = _SECTION.match(line.strip())
        if head:
            title = head.group(1).strip()
            sections[title] = [line]
        elif line.startswith("==="):
            title = None
        elif title is not None:
            sections[title].append(line)
    return {k: "\n".join(v) for k, v in sections.items()}


def _section_title(test_id: str) -> str:
    """pytest's section title for an id: `Class.name` for a method, else the function's name."""
    return ".".join(test_id.split("::")[1:]) or test_id


def failing_test_evidence(output: str, failing_tests: Sequence[str],
                          hidden_files: Collection[str] = ()) -> list[dict[str, Any]]:
    """Each failing test's evidence for a targeted repair: its id and its pytest failure section in `output`
    (a test in `hidden_files`: its name only). The gated path's packet and a cascade's repair use it."""
    sections = failure_sections(output)
    tests = []
    for test in failing_tests:
        is_hidden = test.split("::", 1)[0] in hidden_files
        text = None if is_hidden else sections.get(_section_title(test))
        tests.append({"id": test, "hidden": is_hidden, "failure": text,
                      "note": "a hidden test: its name only" if is_hidden
                      else None if text is not None else "no failure section for it in the output shown"})  # fmt: skip
    return tests


def repair_packet(gate: Gate, decision: SwitchDecision, dispatch_id: str) -> dict[str, Any]:
    """What the worker of a targeted repair is given: only the failing tests' evidence (docs/models.md)."""
    hidden = _hidden_texts(gate)
    assert decision.receipt_id is not None
    shown = _verified_output(gate, decision.receipt_id, hidden)
    tests = failing_test_evidence(shown["text"] or "", decision.failing_tests, {shown for shown, _ in hidden})
    return {
        "schema": REPAIR_SCHEMA,
        "task_id": gate.task.task_id,
        "dispatch_id": dispatch_id,
        "switch_class": decision.switch_class,
        "reason": decision.reason,
        "lane": decision.lane,
        "model": decision.model,
        "receipt_id": decision.receipt_id,
        "receipt_sha256": shown["receipt_sha256"],
        "output": shown.get("output"),
        "tests_expected": decision.tests_expected,
        "failing_tests": tests,
        "repair": decision.targeted_repairs,
        "not_included": "the passing tests, the whole output, the diff, earlier fingerprints and the failed "
        "workers' own transcripts",
    }


def render_repair(packet: Mapping[str, Any], path: str | None) -> str:
    """The targeted-repair packet as a prompt section (appended to the prompt file); `path`: where the worker
    finds it as JSON (None: nowhere, a cascade's repair)."""
    n = len(packet["failing_tests"])
    lines = [
        "",
        "---",
        "## Targeted repair (written by the proctor)",
        "",
        f"Your last change made most tests pass: {packet['tests_expected'] - n} of {packet['tests_expected']}. "
        f"{n} still fail{'s' if n == 1 else ''}; fix only that, keep the rest.",
        *([f"The same evidence as JSON: {path} (also named by $PROCTOR_EVIDENCE_FILE)."] if path else []),
        "",
    ]
    for test in packet["failing_tests"]:
        lines += [f"### {test['id']}" + (" (hidden: name only)" if test["hidden"] else ""), ""]
        lines.append(_fenced(test["failure"]) if test["failure"] else f"({test['note']})\n")
    return "\n".join(lines)
