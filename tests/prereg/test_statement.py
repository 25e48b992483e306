"""PREREG.md's title, research question and hypotheses (`harness.prereg.statement`), as the analysis shows them."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.errors import Refusal
from harness.notebooks.analyze import statement
from harness.prereg.statement import parse_statement, read_statement
from tests.support.paths import REPO

TEXT = """# A study of caches

Intro.

## Research question:

Does **q8** keep the pass rate?

### Why it matters

Memory.

## Hypotheses

- H1: within 0.05.

```
## Not a heading (a code block)
```

## Budgets

Small.
"""


def test_sections_are_read_by_heading_with_their_subsections() -> None:
    got = parse_statement(TEXT)
    assert got.title == "A study of caches"
    assert got.question == "Does **q8** keep the pass rate?\n\n### Why it matters\n\nMemory."
    assert got.hypotheses == "- H1: within 0.05.\n\n```\n## Not a heading (a code block)\n```"


def test_absent_sections_are_not_stated() -> None:
    got = parse_statement("# Only a title\n\n## Question\n\n\n## Design\n\nx\n")
    assert (got.title, got.question, got.hypotheses) == ("Only a title", None, None)  # an empty section is absent
    shown = statement(got).markdown
    assert shown.count("*not stated in PREREG.md*") == 2 and "**Only a title** (PREREG.md)" in shown
    assert "### Research question" in shown and "### Hypotheses" in shown


def test_the_committed_preregistrations_state_their_question() -> None:
    for name in ("demo", "local-gemma"):
        got = read_statement(REPO / "prereg" / name)
        assert got.question is not None and got.question.startswith(("Does ", "Quantizing")), name
        assert got.hypotheses is None  # both state them as the analysis plan's comparisons (design.toml)


def test_a_missing_or_undecodable_prereg_text_is_a_named_refusal(tmp_path: Path) -> None:
    with pytest.raises(Refusal) as missing:
        read_statement(tmp_path)
    assert missing.value.code == "file_missing" and missing.value.path == str(tmp_path / "PREREG.md")
    (tmp_path / "PREREG.md").write_bytes(b"# x\n\xff\n")
    with pytest.raises(Refusal) as bad:
        read_statement(tmp_path)
    assert bad.value.code == "invalid_utf8" and bad.value.path == str(tmp_path / "PREREG.md")
