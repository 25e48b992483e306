"""The report's frame of scored attempts: its columns, their dtypes, and the check that a frame is one.

`harness.audit.report.build_report` builds the frame; the analysis (`harness.analysis`)
reads it. The schema lives here, with the report, so the audit never imports the analysis.
"""

from __future__ import annotations

from collections.abc import Mapping

import polars as pl

__all__ = ["ATTEMPT_COLUMNS", "TOKEN_COLUMNS", "validate_attempts"]

_INTEGER = frozenset(
    {pl.Int8, pl.Int16, pl.Int32, pl.Int64, pl.UInt8, pl.UInt16, pl.UInt32, pl.UInt64}
)
_STRING = frozenset({pl.String})
_FLOAT = frozenset({pl.Float32, pl.Float64})

TOKEN_COLUMNS: tuple[str, ...] = (
    "tokens_input",
    "tokens_cached_input",
    "tokens_cache_write",
    "tokens_output",
    "tokens_reasoning",
)

# column -> the dtypes accepted for it; `item` may be a name or a number.
ATTEMPT_COLUMNS: Mapping[str, frozenset[type[pl.DataType]]] = {
    "study": _STRING,
    "stage": _STRING,
    "system": _STRING,
    "arm": _STRING,
    "item": _STRING | _INTEGER,
    "repeat": _INTEGER,
    "run_id": _STRING,
    "passed": frozenset({pl.Boolean}),
    "cost_usd": frozenset({pl.Float64}),
    "latency_s": _FLOAT,
    **{name: _INTEGER for name in TOKEN_COLUMNS},
    "lane": _STRING,
}


def validate_attempts(frame: pl.DataFrame) -> None:
    """Refuse a frame that is not the report's scored-attempts frame.

    Args:
        frame: the scored attempts.

    Raises:
        ValueError: naming every missing column, extra column and column of the wrong
            dtype, or the count of null `passed` values (an attempt is scored or absent).
    """
    schema = frame.schema
    problems: list[str] = []
    missing = [name for name in ATTEMPT_COLUMNS if name not in schema]
    extra = [name for name in schema if name not in ATTEMPT_COLUMNS]
    if missing:
        problems.append(f"missing columns: {', '.join(missing)}")
    if extra:
        problems.append(f"extra columns: {', '.join(extra)}")
    wrong = [
        f"{name} is {schema[name]}, expected one of {', '.join(sorted(str(d) for d in allowed))}"
        for name, allowed in ATTEMPT_COLUMNS.items()
        if name in schema and schema[name].base_type() not in allowed
    ]
    if wrong:
        problems.append("wrong dtypes: " + "; ".join(wrong))
    if not problems:
        nulls = frame.get_column("passed").null_count()
        if nulls:
            problems.append(f"passed has {nulls} null values")
    if problems:
        raise ValueError("not a scored-attempts frame: " + " | ".join(problems))
