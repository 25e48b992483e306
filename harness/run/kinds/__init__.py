"""Suite kinds: how the runner carries out and scores one attempt, by the suite's `kind` (SUITE.json).

One module per kind, registered here: `completion` (one request, the warm verifier) and `repo_task`
(one run of the gated path). The runner asks `kind_for(suite_dir)` and knows no suite by name.

The manual: docs/run.md ("Suite kinds").
"""

from __future__ import annotations

import importlib
import os
from typing import Any, Final

from harness.errors import Code, EvalRefusal
from harness.evals.suite import SUITE_KINDS, suite_kind
from harness.run.kinds.base import KindHost, SuiteKind
from harness.run.kinds.completion import CompletionKind

__all__ = ["KINDS", "KindHost", "SuiteKind", "kind_for"]

_MODULES: Final[dict[str, tuple[str, str]]] = {
    "completion": ("harness.run.kinds.completion", "CompletionKind"),
    "repo_task": ("harness.run.kinds.repo_task", "RepoTaskKind"),
}
"""Every kind by name: its module and class; adding a kind is one module and one entry here (and in
`SUITE_KINDS`). A kind's module is imported when a suite of that kind is run (a completion run does
not import the gated path)."""
assert set(_MODULES) == set(SUITE_KINDS), "every suite kind has its module"


def _kind_class(name: str) -> type[SuiteKind]:
    module, attr = _MODULES[name]
    kind: type[SuiteKind] = getattr(importlib.import_module(module), attr)
    return kind


def __getattr__(name: str) -> Any:
    if name == "KINDS":  # every kind's class by name (imports every kind's module)
        return {k: _kind_class(k) for k in _MODULES}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def kind_for(suite_dir: str) -> SuiteKind:
    """The kind of the suite in `suite_dir`; a packet without a SUITE.json beside it is a completion suite.

    Raises:
        Refusal: `suite_invalid` for a SUITE.json that does not read, `suite_kind_unknown` for an unknown kind.
    """
    if not os.path.lexists(os.path.join(suite_dir, "SUITE.json")):
        return CompletionKind(suite_dir)
    name = suite_kind(suite_dir)
    if name not in _MODULES:  # pragma: no cover - suite_kind refuses it first
        raise EvalRefusal(Code.SUITE_INVALID, f"no runner for suite kind {name!r}", suite_dir)
    return _kind_class(name)(suite_dir)
