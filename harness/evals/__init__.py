"""Eval suites: answer-stripped packets, sealed private parts, and the HumanEval verifier.

The suite layout and its strict reader live in `harness.evals.suite`; the
builders in `harness.evals.humaneval`, `harness.evals.tasks` and `harness.evals.mutants`
(which also makes an item's workspace: `materialize`); verifying a
HumanEval answer (extraction, the warm verifier, item receipts) in
`harness.evals.verify_humaneval`; the runner's shared warm verifiers in `harness.evals.verify_pool`.

The manual: docs/evals.md.
"""

from harness.evals.suite import (
    FORBIDDEN_KEYS,
    Packet,
    PacketItem,
    PrivateItem,
    Suite,
    load_packet,
    load_private,
    load_suite,
)

__all__ = [
    "FORBIDDEN_KEYS",
    "Packet",
    "PacketItem",
    "PrivateItem",
    "Suite",
    "load_packet",
    "load_private",
    "load_suite",
]
