"""Receipts (harness.records.receipt): the gate's and the warm verifier's, strict and byte-exact."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from harness.errors import Refusal
from harness.evals.verify_humaneval import Extraction, Verdict, verify_receipt
from harness.evidence.jsonio import canonical_bytes
from harness.records.receipt import ITEM_RECEIPT_SCHEMA, RECEIPT_SCHEMA, ItemReceipt, Receipt

H = "a" * 64

RECEIPT: dict[str, Any] = {
    "schema": RECEIPT_SCHEMA, "receipt_id": "r0002", "task_id": "wordfreq-case-fold", "task_sha256": H, "tree": H,
    "tree_entries": 5, "tree_excludes": ["__pycache__/", "*.pyc", ".pytest_cache/"], "baseline_tree": H,
    "dispatch_seq": 2, "verifier_argv": ["python", "-m", "pytest", "tests"], "exit_code": 0, "signal": None,
    "timed_out": False, "passed": True, "output_sha256": H, "output_bytes": 98, "fingerprint": None,
    "tamper_detected": False, "tampered_paths": [], "verifier_nondiscriminating": False, "detached_pids": [],
    "sandbox": {"kind": "none", "guarantee": "weaker"}, "started": 1796160786.7450163, "ended": 1796160792.1079757,
    "duration_s": 5.362959,
}  # fmt: skip


def test_a_receipt_reads_back_to_the_same_bytes_and_key_order() -> None:
    receipt = Receipt.from_json(RECEIPT)
    assert receipt.passed and receipt.dispatch_seq == 2
    assert canonical_bytes(receipt.to_json()) == canonical_bytes(RECEIPT)
    assert list(receipt.to_json()) == list(RECEIPT)  # the order `proctor verify` prints


def test_a_receipt_with_the_journal_mark_reads_back_to_the_same_bytes() -> None:
    marked = {**RECEIPT, "journal_lines": 7, "journal_head": H}
    receipt = Receipt.from_json(marked)
    assert (receipt.journal_lines, receipt.journal_head) == (7, H)
    assert canonical_bytes(receipt.to_json()) == canonical_bytes(marked)
    assert list(receipt.to_json()) == list(marked)


def test_a_receipt_with_the_proctors_report_and_scan_reads_back_strictly() -> None:
    results = {"kind": "pytest-proctor-report", "ok": False, "expected": ["t/test_h.py::test_a"], "reported": 1,
               "not_passed": ["t/test_h.py::test_a"], "failed": [], "ended": False, "tampered": [],
               "problem": "the report has no end"}  # fmt: skip
    flagged = [{"path": "pkg/m.py", "line": 3, "pattern": "os._exit"}]
    doc = {**RECEIPT, "results": results, "suspicious_code": flagged, "visible_output_sha256": H}
    receipt = Receipt.from_json(doc)
    assert receipt.results is not None and receipt.results.not_passed == ("t/test_h.py::test_a",)
    assert receipt.suspicious_code is not None and receipt.suspicious_code[0].line == 3
    assert canonical_bytes(receipt.to_json()) == canonical_bytes(doc)
    for bad in ({**doc, "suspicious_code": [{"path": "x", "line": "3", "pattern": "p"}]},
                {**doc, "results": {**results, "ended": "no"}}):  # fmt: skip
        with pytest.raises(Refusal) as exc:
            Receipt.from_json(bad)
        assert exc.value.code == "receipt_invalid"


def test_a_receipt_made_before_fingerprints_and_sandboxes_were_recorded_still_reads() -> None:
    old = {k: v for k, v in RECEIPT.items() if k not in ("fingerprint", "sandbox")}
    receipt = Receipt.from_json(old)
    assert receipt.fingerprint is None and receipt.sandbox is None


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda r: r.pop("passed"), "missing passed"),
        (lambda r: r.update(extra=1), "unknown field extra"),
        (lambda r: r.update(passed="yes"), "passed 'yes' is not true or false"),
        (lambda r: r.update(dispatch_seq=True), "dispatch_seq True is not an integer"),
        (lambda r: r.update(tampered_paths=[1]), "tampered_paths [1] is not a list, each a string"),
        (lambda r: r.update(schema="proctor-receipt.v0"), "is not 'proctor-receipt.v1'"),
    ],
)
def test_a_receipt_is_read_strictly(change: Any, says: str) -> None:
    bad = copy.deepcopy(RECEIPT)
    change(bad)
    with pytest.raises(Refusal) as caught:
        Receipt.from_json(bad, "r.json")
    assert caught.value.code == "receipt_invalid" and says in caught.value.message and caught.value.path == "r.json"


def test_an_item_receipt_is_built_from_the_record_type_and_reads_back() -> None:
    receipt = verify_receipt(
        suite="humaneval", item="HumanEval/0", response_text="x", extraction=Extraction("def f(): pass", "text-definition"),
        test="def check(f): pass", entry_point="f", verdict=Verdict(True, "passed", "", 0.01), timeout_s=3.0,
        memory_bytes=None, started=1.0, ended=2.0, private_sha256=H, sandbox=None,
    )  # fmt: skip
    assert receipt["schema"] == ITEM_RECEIPT_SCHEMA
    assert ItemReceipt.from_json(receipt).to_json() == receipt
    with pytest.raises(Refusal, match="unknown field run_id"):
        ItemReceipt.from_json({**receipt, "run_id": "x"})
