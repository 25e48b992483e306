"""proctor: a notebook-first harness for preregistered evaluations of AI models and coding agents.

This module is the public API a notebook or a script uses; each name is imported
on first use, so that `import harness` (and `proctor --help`) stays fast.
The manual is in docs/ (start at docs/index.md).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from harness._version import __version__

if TYPE_CHECKING:
    from harness.analysis.study import analyze_study
    from harness.audit.audit import audit_results
    from harness.audit.report import build_report
    from harness.errors import Code, Refusal
    from harness.notebooks.analyze import analyze_results
    from harness.notebooks.batch import run_batch
    from harness.prereg.check import check_prereg
    from harness.prereg.draft import draft_prereg
    from harness.prereg.freeze import amend, freeze
    from harness.prereg.plan import plan_study
    from harness.run.preflight import preflight
    from harness.run.runner import run_stage

# Where each public name lives: the one table `__getattr__` reads.
_PUBLIC: dict[str, str] = {
    "Code": "harness.errors",
    "Refusal": "harness.errors",
    "amend": "harness.prereg.freeze",
    "analyze_results": "harness.notebooks.analyze",
    "analyze_study": "harness.analysis.study",
    "audit_results": "harness.audit.audit",
    "build_report": "harness.audit.report",
    "check_prereg": "harness.prereg.check",
    "draft_prereg": "harness.prereg.draft",
    "freeze": "harness.prereg.freeze",
    "plan_study": "harness.prereg.plan",
    "preflight": "harness.run.preflight",
    "run_batch": "harness.notebooks.batch",
    "run_stage": "harness.run.runner",
}

__all__ = [
    "Code",
    "Refusal",
    "__version__",
    "amend",
    "analyze_results",
    "analyze_study",
    "audit_results",
    "build_report",
    "check_prereg",
    "draft_prereg",
    "freeze",
    "plan_study",
    "preflight",
    "run_batch",
    "run_stage",
]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'harness' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
