"""Laying hidden inputs never follows a link (issue 14, class 4), through the real CLI.

Each link of the worker's chain stays inside the workspace on its own
(`x/u1 -> ..`, `x/u2 -> u1/..`, ...), but resolved link by link from the
verification copy (`<ws parent>/.runner-state/<ws>-<hash>/verify/r0001/tree`)
the chain climbs to the workspace's parent, so `tests/hidden` leads back into
the real workspace: laying the hidden test through it would write the hidden
test where the next worker reads it.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

from tests.support.cli import run_proctor
from tests.support.tasks import TaskSetup

HOPS = 6  # tree -> r0001 -> verify -> <ws>-<hash> -> .runner-state -> the workspace's parent

WORKER = """
import os
os.mkdir("x")
os.symlink("..", "x/u1")
for n in range(2, {hops} + 1):
    os.symlink("u%d/.." % (n - 1), "x/u%d" % n)
os.mkdir("planted")
os.symlink("../x/u{hops}/{ws}/planted", "tests/hidden")
"""


def test_a_link_chain_out_of_the_copy_is_refused_and_the_hidden_test_never_reaches_the_workspace(
    task_setup: Callable[..., TaskSetup],
) -> None:
    ts = task_setup("wordfreq")

    def change(doc: dict[str, object]) -> None:
        doc["verifier"]["hidden"][0]["to"] = "tests/hidden/test_hidden.py"  # type: ignore[index]
        doc["scope"] = ["wordfreq/counter.py", "x", "planted", "tests/hidden"]  # every path it touches is in scope

    ts.edit_task(change)
    assert run_proctor("init", *ts.words()).code == 0
    script = ts.root / "chain_worker.py"
    script.write_text(textwrap.dedent(WORKER.format(hops=HOPS, ws=ts.workspace.name)))
    done = run_proctor("dispatch", *ts.words(), "--command", "--", sys.executable, str(script))
    assert done.code == 0, done.out
    for n in range(1, HOPS + 1):  # each link on its own stays inside
        target = (ts.workspace / "x" / f"u{n}").readlink()
        assert not str(target).startswith("/") and len(Path("x", target).parts) <= 3

    refused = run_proctor("verify", *ts.words())
    assert refused.code == 3 and refused.out["refusal"] == "unsafe_workspace_entry", refused.out
    flagged = {e["path"] for e in refused.out["entries"]}
    assert "tests/hidden" in flagged and {f"x/u{n}" for n in range(2, HOPS + 1)} <= flagged
    assert "x/u1" not in flagged  # `..` from x/ is the workspace itself
    assert "through links" in refused.out["message"]
    assert list((ts.workspace / "planted").iterdir()) == []
    hidden_source = (ts.root / "task" / "hidden" / "test_hidden.py").read_bytes()
    leaked = [p for p in ts.workspace.rglob("*") if p.is_file() and not p.is_symlink() and p.read_bytes() == hidden_source]
    assert leaked == []
    assert run_proctor("accept", *ts.words()).code == 3
