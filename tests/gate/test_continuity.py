"""The journal's mark in each receipt and task-record row (issue 14, class 8: a journal cut off its
end or rewritten with a recomputed chain still verified on its own).

Real git workspaces, the real CLI and real bwrap sandboxes; the journal is cut
or rewritten the way someone with write access to the state folder would.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.evidence.chain_read import seed_hash, verify_log
from harness.evidence.jsonio import canonical_bytes, sha256_hex
from tests.support.cli import CliResult, run_proctor
from tests.support.tasks import TaskSetup

EXIT_OK, EXIT_FAILED, EXIT_REFUSED = 0, 1, 3
CLI_TIMEOUT = 60.0

MakeTask = Callable[..., TaskSetup]


def run(*words: str) -> CliResult:
    return run_proctor(*words, timeout=CLI_TIMEOUT)


def state_dir(ts: TaskSetup) -> Path:
    return Path(run("init", *ts.words()).out["state_dir"])


def fixed_and_verified(ts: TaskSetup, state: Path | None = None) -> Path:
    state = state or state_dir(ts)
    assert run("dispatch", *ts.words(), "--command", "--", *ts.worker()).code == EXIT_OK
    assert run("verify", *ts.words()).code == EXIT_OK
    return state


def lines(journal: Path) -> list[bytes]:
    return journal.read_bytes().splitlines()


def rewrite_chain(journal: Path, keep: Callable[[dict[str, Any]], bool]) -> None:
    """Drop the events `keep` rejects and recompute every `prev`: the chain verifies again."""
    events = [json.loads(raw) for raw in lines(journal)]
    seed = events[0]["seed"]
    out: list[bytes] = []
    for event in (e for e in events if keep(e)):
        body = {k: v for k, v in event.items() if k not in ("prev", "seed")}
        body["prev"] = sha256_hex(out[-1]) if out else seed_hash(seed)
        if not out:
            body["seed"] = seed
        out.append(canonical_bytes(body))
    journal.write_bytes(b"".join(line + b"\n" for line in out))
    assert verify_log(journal, seed).ok


def assert_refused(res: CliResult, code: str) -> dict[str, Any]:
    assert res.code == EXIT_REFUSED, res.out
    assert res.out["refusal"] == code, res.out
    return res.out


def test_receipt_and_row_carry_the_journal_mark(task_setup: MakeTask) -> None:
    ts = task_setup()
    state = fixed_and_verified(ts)
    journal = state / "journal.jsonl"
    receipt = json.loads((state / "receipts" / "r0001.json").read_text())
    raw = lines(journal)
    at = receipt["journal_lines"]
    assert json.loads(raw[at])["event"] == "verify"  # its verify event is the next line
    assert receipt["journal_head"] == sha256_hex(raw[at - 1])
    row = run("record", *ts.words()).out
    raw = lines(journal)
    assert json.loads(raw[row["journal_lines"]])["event"] == "record"
    assert row["journal_head"] == sha256_hex(raw[row["journal_lines"] - 1])


def test_journal_cut_off_before_a_later_receipt_is_refused(task_setup: MakeTask, tmp_path: Path) -> None:
    """A passing receipt, then a dispatch and a receipt flagged `tamper_detected`; cutting those lines
    off the journal's end leaves a chain that verifies and made accept take the old receipt (on main)."""
    ts = task_setup()
    state = fixed_and_verified(ts)
    journal = state / "journal.jsonl"
    before = journal.read_bytes()
    breaker = tmp_path / "noop.py"
    breaker.write_text("pass\n")
    assert run("dispatch", *ts.words(), "--command", "--", sys.executable, str(breaker)).code == EXIT_OK
    (ts.workspace / "tests" / "test_visible.py").write_text("def test_x():\n    pass\n")  # tampered
    flagged = run("verify", *ts.words())
    assert flagged.out["tamper_detected"] is True, flagged.out  # restored, and accept would refuse it
    journal.write_bytes(before)  # cut off at its end: the chain still verifies
    out = assert_refused(run("accept", *ts.words()), "journal_shortened")
    assert "receipt r0002" in out["message"]
    assert_refused(run("record", *ts.words()), "journal_shortened")


def test_journal_cut_off_after_a_record_is_refused(task_setup: MakeTask) -> None:
    ts = task_setup()
    state = fixed_and_verified(ts)
    journal = state / "journal.jsonl"
    before = journal.read_bytes()
    assert run("accept", *ts.words()).code == EXIT_OK
    assert run("record", *ts.words()).code == EXIT_OK
    journal.write_bytes(before)  # the accept and the record are gone
    out = assert_refused(run("record", *ts.words()), "journal_shortened")
    assert "task record line 1" in out["message"]
    assert_refused(run("accept", *ts.words()), "journal_shortened")


def test_journal_rewritten_with_a_recomputed_chain_is_refused(task_setup: MakeTask) -> None:
    """A refusal is dropped from the journal's middle and the chain recomputed: it verifies, and on
    main accept accepted; the receipt's mark no longer matches."""
    ts = task_setup()
    state = state_dir(ts)
    assert_refused(run("accept", *ts.words()), "receipt_missing")  # a refused event
    fixed_and_verified(ts, state)
    journal = state / "journal.jsonl"
    rewrite_chain(journal, lambda e: e["event"] != "refused")
    out = assert_refused(run("accept", *ts.words()), "journal_rewritten")
    assert "receipt r0001" in out["message"]


def test_untouched_journal_accepts_and_records(task_setup: MakeTask) -> None:
    ts = task_setup()
    fixed_and_verified(ts)
    assert run("record", *ts.words()).code == EXIT_OK
    assert run("accept", *ts.words()).code == EXIT_OK
    assert run("record", *ts.words()).code == EXIT_OK
    assert run("accept", *ts.words()).code == EXIT_OK
