"""Render the benchmark table of docs/benchmarks.md from the benches' results files (build/bench/*.json).

    make bench                            # runs every bench, then this
    .venv/bin/python -m tests.bench.table  # after one or more benches: the rows of those that ran

Benches that have no results file are named and left out. The manual: docs/benchmarks.md.
"""

from __future__ import annotations

import sys

from tests.support.bench import DOC, ORDER, RESULTS, load, render, splice


def main() -> int:
    results = load(RESULTS)
    if not results:
        print(f"no results files in {RESULTS.name}/: run `make bench` (or one bench) first", file=sys.stderr)
        return 1
    missing = [name for name in ORDER if name not in {doc["bench"] for doc in results}]
    DOC.write_text(splice(DOC.read_text(encoding="utf-8"), render(results)), encoding="utf-8")
    rows = sum(len(doc["rows"]) for doc in results)
    print(f"docs/benchmarks.md: {rows} rows from {len(results)} benches"
          + (f"; no results from {', '.join(missing)}" if missing else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
