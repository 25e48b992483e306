"""`proctor delegate`: one-shot consults outside the gated path, read-only unless --write."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.evidence.tree import tree_signature
from tests.support.cli import CliResult, run_proctor

# The catalog worker. Its argv comes from the catalog template; what to do comes from the file
# named by its first argument (visible, read-only, in its sandbox): [mode, a folder outside the
# workspace]. Mode "edit" edits, adds and deletes files, flips an exec bit, swaps folders for a link
# out of the workspace and for a file; "quiet" only reports what it was given (a SEEN line on its
# output). Both print a session id.
WORKER = r"""
import json, os, shutil, sys
mode, outside = json.load(open(sys.argv[1]))
print("SEEN " + json.dumps({"argv": sys.argv, "cwd": os.getcwd(),
                            "prompt": open(os.environ["PROCTOR_PROMPT_FILE"]).read(),
                            "env": {k: v for k, v in os.environ.items() if k.startswith("PROCTOR_")}}))
print("thinking about it")
print("SESSION: sess-42")
if mode == "edit":
    with open("app.py", "a") as fh:
        fh.write("broken = True\n")
    with open("notes.txt", "w") as fh:
        fh.write("new\n")
    os.makedirs("made/deeper")
    with open("made/deeper/x.py", "w") as fh:
        fh.write("x = 1\n")
    os.remove("pkg/mod.py")
    os.chmod("run.sh", 0o644)
    shutil.rmtree("data")
    os.symlink(outside, "data")              # a folder swapped for a link out of the workspace
    os.remove("link")
    os.symlink("elsewhere", "link")
    os.rmdir("empty")
    with open("empty", "w") as fh:           # a folder swapped for a file
        fh.write("")
    with open(".git/config", "a") as fh:     # .git is not restored
        fh.write("# touched\n")
"""


def make_workspace(root: Path) -> Path:
    ws = root / "ws"
    (ws / "pkg").mkdir(parents=True)
    (ws / "app.py").write_text("def main():\n    return 1\n")
    (ws / "pkg" / "__init__.py").write_text("")
    (ws / "pkg" / "mod.py").write_text("VALUE = 2\n")
    (ws / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (ws / "run.sh").chmod(0o755)
    (ws / "secret.cfg").write_text("mode 600\n")
    (ws / "secret.cfg").chmod(0o600)
    (ws / "data").mkdir()
    (ws / "data" / "rows.csv").write_text("a,b\n1,2\n")
    (ws / "link").symlink_to("app.py")
    (ws / "empty").mkdir()
    (ws / ".git").mkdir()
    (ws / ".git" / "config").write_text("[core]\n")
    return ws


def catalog(tmp_path: Path, resume: bool = True) -> Path:
    script = tmp_path / "delegate_worker.py"
    script.write_text(WORKER)
    args = tmp_path / "delegate_args.json"
    path = tmp_path / "catalog.toml"
    path.write_text(
        f"""
[[model]]
id = "local-helper"
provider = "local"
api_shape = "openai_chat"
base_url = "http://127.0.0.1:9/v1"
credential_env = ""
pricing_key = "local-helper"
lane = "flash"

[model.worker]
argv = ["{{python}}", {json.dumps(str(script))}, {json.dumps(str(args))}, "{{prompt_file}}"]
{'resume = ["--session", "{session}"]' if resume else ""}
"""
    )
    return path


def modes(ws: Path) -> dict[str, int]:
    return {
        str(p.relative_to(ws)): stat.S_IMODE(p.lstat().st_mode)
        for p in ws.rglob("*")
        if ".git" not in p.parts and not p.is_symlink()
    }


class Run:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.ws = make_workspace(tmp_path)
        self.outside = tmp_path / "outside"
        self.outside.mkdir()
        self.catalog = catalog(tmp_path)
        self.last: CliResult | None = None

    def args(self, mode: str) -> None:
        (self.tmp / "delegate_args.json").write_text(json.dumps([mode, str(self.outside)]))

    def model(
        self, mode: str, *extra: str, env: dict[str, str] | None = None, task: str = "Look at app.py"
    ) -> CliResult:
        self.args(mode)
        self.last = run_proctor(
            "delegate", "--workspace", str(self.ws), "--model", "local-helper", "--catalog", str(self.catalog),
            "--task", task, *extra, env=env,
        )
        return self.last

    def seen_json(self) -> dict[str, Any] | None:
        """What the worker of the last call said it was given (None when it did not run)."""
        lines = (self.last.out.get("output") or "").splitlines() if self.last is not None else []
        seen = next((line[5:] for line in lines if line.startswith("SEEN ")), None)
        return None if seen is None else dict(json.loads(seen))


@pytest.fixture
def run(tmp_path: Path) -> Run:
    return Run(tmp_path)


def test_read_only_delegate_restores_every_change_exactly(run: Run) -> None:
    before = tree_signature(run.ws, excludes=()).digest
    before_modes = modes(run.ws)
    r = run.model("edit")
    assert r.code == 0, r.out
    assert tree_signature(run.ws, excludes=()).digest == before
    assert modes(run.ws) == before_modes  # full modes, not only the exec bit
    assert sorted(r.out["restored"]) == sorted(
        ["app.py", "notes.txt", "made", "made/deeper", "made/deeper/x.py", "pkg/mod.py", "run.sh", "data",
         "data/rows.csv", "link", "empty"]
    )
    assert r.out["tree_after"] == r.out["tree_before"] == before
    assert list(run.outside.iterdir()) == []  # nothing was restored through the planted link
    assert (run.ws / "data").is_dir() and not (run.ws / "data").is_symlink()
    assert os.readlink(run.ws / "link") == "app.py"
    assert "# touched" in (run.ws / ".git" / "config").read_text()  # documented: .git is not restored
    assert r.out["session"] == "sess-42" and "thinking about it" in r.out["output"]
    assert r.out["mode"] == "model" and r.out["model"] == "local-helper" and r.out["exit_code"] == 0
    seen = run.seen_json()
    assert seen is not None and seen["cwd"] == os.path.realpath(run.ws)
    assert seen["prompt"] == "Look at app.py"
    assert seen["env"]["PROCTOR_CHILD"] == "1" and seen["env"]["PROCTOR_DELEGATE"] == "1"
    assert seen["env"]["PROCTOR_MODEL"] == "local-helper"
    assert not seen["env"]["PROCTOR_PROMPT_FILE"].startswith(os.path.realpath(run.ws))


def test_write_keeps_the_changes_and_reports_them(run: Run) -> None:
    r = run.model("edit", "--write")
    assert r.code == 0, r.out
    assert r.out["restored"] == []
    changes = r.out["changes"]
    assert "notes.txt" in changes["added"] and "pkg/mod.py" in changes["removed"]
    assert {"app.py", "run.sh", "data", "link", "empty"} <= set(changes["changed"])
    assert (run.ws / "notes.txt").read_text() == "new\n" and not (run.ws / "pkg" / "mod.py").exists()
    assert r.out["tree_after"] != r.out["tree_before"]


def test_an_untouched_workspace_reports_nothing(run: Run) -> None:
    r = run.model("quiet")
    assert r.code == 0 and r.out["restored"] == [] and r.out["changes"] == {"added": [], "removed": [], "changed": []}


def test_task_file_and_resume_from(run: Run, tmp_path: Path) -> None:
    task = tmp_path / "task.md"
    task.write_text("Explain pkg/mod.py\n")
    run.args("quiet")
    r = run.last = run_proctor(
        "delegate", "--workspace", str(run.ws), "--model", "local-helper", "--catalog", str(run.catalog),
        "--task-file", str(task), "--resume-from", "sess-42",
    )
    assert r.code == 0, r.out
    assert r.out["argv"][-2:] == ["--session", "sess-42"]
    assert (run.seen_json() or {})["prompt"] == "Explain pkg/mod.py\n"
    (tmp_path / "other").mkdir()
    no_resume = catalog(tmp_path / "other", resume=False)
    r = run_proctor(
        "delegate", "--workspace", str(run.ws), "--model", "local-helper", "--catalog", str(no_resume),
        "--task", "x", "--resume-from", "s",
    )
    assert r.code == 3 and r.out["refusal"] == "resume_unsupported"


def test_nested_delegate_with_a_model_or_write_is_refused(run: Run) -> None:
    r = run.model("quiet", env={"PROCTOR_CHILD": "1"})
    assert r.code == 3 and r.out["refusal"] == "nested_call_refused"
    script = [sys.executable, "-c", "print('consulted')"]
    r = run_proctor("delegate", "--workspace", str(run.ws), "--task", "x", "--write", "--command", "--", *script,
                    env={"PROCTOR_CHILD": "1"})
    assert r.code == 3 and r.out["refusal"] == "nested_call_refused"
    r = run_proctor("delegate", "--workspace", str(run.ws), "--task", "x", "--command", "--", *script,
                    env={"PROCTOR_CHILD": "1"})
    assert r.code == 0 and r.out["mode"] == "command" and "consulted" in r.out["output"]
    assert "SEEN" not in r.out["output"]


@pytest.mark.parametrize("text", ["Then run python -m src.run_all", "check src/run_weekly.py", "run_week.ps1 fails"])
def test_a_production_task_is_refused_in_model_mode(run: Run, text: str) -> None:
    r = run.model("edit", task=text)
    assert r.code == 3 and r.out["refusal"] == "production_task_in_model_mode", r.out
    assert run.seen_json() is None
    command = run_proctor("delegate", "--workspace", str(run.ws), "--task", text, "--command", "--", "true")
    assert command.code == 0, command.out


def test_delegate_refusals(run: Run) -> None:
    r = run_proctor("delegate", "--workspace", str(run.ws), "--model", "sim-flsh", "--task", "x")
    assert r.code == 3 and r.out["refusal"] == "unknown_model" and r.out["family"] == ["sim-flash", "sim-glm", "sim-k3"]
    r = run_proctor("delegate", "--workspace", str(run.tmp / "absent"), "--task", "x", "--command", "--", "true")
    assert r.code == 3 and r.out["refusal"] == "workspace_missing"
    assert run_proctor("delegate", "--workspace", str(run.ws), "--task", "x").code == 2
    r = run_proctor("delegate", "--workspace", str(run.ws), "--task", "  ", "--command", "--", "true")
    assert r.code == 3 and r.out["refusal"] == "delegate_task_empty"
