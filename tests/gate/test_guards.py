"""harness.gate.guards.escaping_entries: links are resolved link by link through the tree, as the kernel would."""

from __future__ import annotations

import os
from pathlib import Path

from harness.evidence.tree import scan_tree
from harness.gate.guards import escaping_entries


def _flagged(before: Path, after: Path) -> list[str]:
    return [e["path"] for e in escaping_entries(scan_tree(before, ()), scan_tree(after, ()))]


def _links(root: Path, links: dict[str, str]) -> Path:
    root.mkdir()
    (root / "x").mkdir()
    (root / "tests").mkdir()
    for name, target in links.items():
        os.symlink(target, root / name)
    return root


def test_each_link_inside_on_its_own_but_the_chain_out_is_flagged(tmp_path: Path) -> None:
    base = _links(tmp_path / "base", {})
    now = _links(tmp_path / "now", {"x/u1": "..", "x/u2": "u1/..", "tests/hidden": "../x/u2/now/tests"})
    assert _flagged(base, now) == ["tests/hidden", "x/u2"]


def test_links_that_stay_inside_are_not_flagged(tmp_path: Path) -> None:
    base = _links(tmp_path / "base", {})
    now = _links(tmp_path / "now", {"x/u1": "..", "x/t": "u1/tests", "tests/loop": "loop", "tests/up": "../x/t/.."})
    assert _flagged(base, now) == []


def test_an_absolute_link_reached_through_a_chain_is_flagged(tmp_path: Path) -> None:
    base = _links(tmp_path / "base", {})
    now = _links(tmp_path / "now", {"x/abs": "/etc", "tests/via": "../x/abs"})
    assert _flagged(base, now) == ["tests/via", "x/abs"]


def test_a_baseline_link_that_a_changed_link_sends_out_is_flagged(tmp_path: Path) -> None:
    base = _links(tmp_path / "base", {"x/u1": "tests", "tests/t": "../x/u1/.."})
    now = _links(tmp_path / "now", {"x/u1": "..", "tests/t": "../x/u1/.."})
    assert _flagged(base, now) == ["tests/t"]  # tests/t is unchanged; x/u1 -> .. alone stays inside


def test_a_link_out_already_in_the_baseline_is_the_projects_own(tmp_path: Path) -> None:
    links = {"x/u1": "..", "x/u2": "u1/.."}
    assert _flagged(_links(tmp_path / "base", links), _links(tmp_path / "now", links)) == []
