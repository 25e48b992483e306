"""The run oracle: every invariant a stage folder's files must satisfy, checked from the files alone.

`run_problems(results_dir, prereg_dir=None)` returns every `Problem` (file, line,
rule, message) under a stage folder or a results root; an empty list means the
run's files are consistent. It recomputes rather than trusts the runner's
bookkeeping, reusing only the registered rules (`harness.run.rules`), the record
shapes (`harness.records`) and the chain verifier. The rules: docs/oracle.md.
"""

from __future__ import annotations

from harness.audit.oracle.base import Problem
from harness.audit.oracle.check import run_problems

__all__ = ["Problem", "run_problems"]
