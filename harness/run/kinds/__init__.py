"""Suite kinds: how the runner carries out and scores one attempt, by the suite's `kind` (SUITE.json).

One module per kind, registered here: `completion` (one request, the warm verifier) and `repo_task`
(one run of the gated path). The runner asks `kind_for(suite_dir)` and knows no suite by name.

The manual: docs/run.md ("Suite kinds").
"""

from __future__ import annotations

import os
from typing import Final

from harness.errors import Code, EvalRefusal
from harness.evals.suite import SUITE_KINDS, suite_kind
from harness.run.kinds.base import KindHost, SuiteKind
from harness.run.kinds.completion import CompletionKind
from harness.run.kinds.repo_task import RepoTaskKind

__all__ = ["KINDS", "KindHost", "SuiteKind", "kind_for"]

KINDS: Final[dict[str, type[SuiteKind]]] = {k.name: k for k in (CompletionKind, RepoTaskKind)}
"""Every kind by name; adding a kind is one module and one entry here (and in `SUITE_KINDS`)."""
assert set(KINDS) == set(SUITE_KINDS), "every suite kind has its module"


def kind_for(suite_dir: str) -> SuiteKind:
    """The kind of the suite in `suite_dir`; a packet without a SUITE.json beside it is a completion suite.

    Raises:
        Refusal: `suite_invalid` for a SUITE.json that does not read, `suite_kind_unknown` for an unknown kind.
    """
    if not os.path.lexists(os.path.join(suite_dir, "SUITE.json")):
        return CompletionKind(suite_dir)
    name = suite_kind(suite_dir)
    if name not in KINDS:  # pragma: no cover - suite_kind refuses it first
        raise EvalRefusal(Code.SUITE_INVALID, f"no runner for suite kind {name!r}", suite_dir)
    return KINDS[name](suite_dir)
