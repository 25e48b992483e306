"""The `proctor` command line, in subprocesses: help, version, usage errors, `--json`, bad inputs.

Every reader of a saved input is fed the same set of bad files through the CLI:
a missing file, a folder, a FIFO, a dangling link, invalid UTF-8, duplicate
keys, NaN, 1e999, 100k-deep nesting, a top-level array, a file over the 4 MiB
task limit and a bool where a number belongs. A refusal is exit 3 with a named
code and `path`; `proctor ledger verify` reports problems inside a log as exit
1 naming the first bad line. Nothing ever prints a traceback.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness._version import __version__
from tests.support.cli import run_proctor
from tests.support.paths import REPO
from tests.support.tasks import TaskSetup, git_repo

COMMANDS = ("lane", "init", "dispatch", "verify", "accept", "status", "journal", "ledger")
HEAVY = ("polars", "papermill", "httpx", "numpy", "rich")
PROCTOR_SCRIPT = Path(sys.executable).parent / "proctor"


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROCTOR_")}
    env.update(extra)
    return env


def raw(*words: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run `python -m harness WORDS` exactly as given (no --json added)."""
    done = subprocess.run(
        [sys.executable, "-m", "harness", *words],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=clean_env(),
        cwd=REPO,
        check=False,
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done


def one_json(stdout: str) -> dict[str, Any]:
    """stdout must be exactly one JSON object on one line."""
    assert stdout.endswith("\n") and stdout.count("\n") == 1, repr(stdout)
    value = json.loads(stdout)
    assert isinstance(value, dict)
    return value


# --- help and version ----------------------------------------------------------------


def test_python_m_harness_help_lists_every_command() -> None:
    done = raw("--help")
    assert done.returncode == 0
    for name in COMMANDS:
        assert re.search(rf"\b{name}\b", done.stdout), name
    assert done.stderr == ""


@pytest.mark.skipif(
    not PROCTOR_SCRIPT.exists(), reason="the proctor script is not installed in this venv"
)
def test_proctor_script_help_lists_every_command() -> None:
    done = subprocess.run(
        [str(PROCTOR_SCRIPT), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "usage: proctor" in done.stdout
    for name in COMMANDS:
        assert re.search(rf"\b{name}\b", done.stdout), name


@pytest.mark.parametrize("command", [*COMMANDS[:-1], "ledger verify", "ledger repair"])
def test_every_command_has_help(command: str) -> None:
    done = raw(*command.split(), "--help")
    assert done.returncode == 0
    assert "--json" in done.stdout or command == "ledger"


def test_version() -> None:
    done = raw("--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"proctor {__version__}"


def test_help_imports_no_heavy_module() -> None:
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "harness", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(),
        cwd=REPO,
        check=False,
    )
    assert done.returncode == 0
    modules = set()
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip()
            if name != "package":  # the header line
                modules.add(name.split(".")[0])
    assert "harness" in modules  # the parse worked
    assert not modules & set(HEAVY), sorted(modules & set(HEAVY))


def imported_modules(words: list[str], env: dict[str, str], out: Path) -> set[str]:
    """Every module a whole `proctor WORDS...` process had imported when it exited (any thread's)."""
    code = ("import atexit, runpy, sys\n"
            f"atexit.register(lambda: open({str(out)!r}, 'w').write('\\n'.join(sorted(sys.modules))))\n"
            f"sys.argv = ['proctor', *{words!r}]\n"
            "runpy.run_module('harness', run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env,
                          cwd=REPO, check=False)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-4000:])
    return set(out.read_text().split())


# What a run never needs: the analysis stack, notebooks, the gated path (a completion suite), papermill.
NOT_FOR_A_RUN = ("polars", "scipy", "numpy", "papermill", "pandas", "matplotlib", "harness.analysis",
                 "harness.audit", "harness.notebooks", "harness.gate", "harness.run.kinds.repo_task")


def test_importing_the_command_defers_tls_asyncio_and_every_library() -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import sys, harness.cli.main; print(' '.join(sorted(sys.modules)))"],
        capture_output=True, text=True, timeout=60, env=clean_env(), cwd=REPO, check=False)
    assert done.returncode == 0, done.stderr
    loaded = set(done.stdout.split())
    assert "harness.cli.study" in loaded  # the listing worked
    deferred = ("ssl", "asyncio", "httpx", "h11", "yaml", "tomllib", "harness.run.runner", *NOT_FOR_A_RUN)
    assert not {m for m in loaded if m.split(".")[0] in deferred or m in deferred}, sorted(
        m for m in loaded if m.split(".")[0] in deferred or m in deferred)


def test_a_whole_run_of_a_completion_suite_imports_nothing_it_does_not_need(tmp_path: Path) -> None:
    from tests.support.study import prereg, runner_env, sim_servers, system

    p = prereg(tmp_path, items=2)
    with sim_servers(tmp_path) as start:
        url = start([system("sim-flash", 1.0), system("sim-glm", 0.0)])
        loaded = imported_modules(["run", str(p), "--stage", "A", "--results", str(tmp_path / "results"), "--json"],
                                  runner_env(url), tmp_path / "modules.txt")
    assert {"harness.run.engine", "harness.providers.transport", "harness.evals.verify_pool"} <= loaded  # it ran
    assert not {m for m in loaded for heavy in NOT_FOR_A_RUN if m == heavy or m.startswith(f"{heavy}.")}, sorted(
        m for m in loaded for heavy in NOT_FOR_A_RUN if m == heavy or m.startswith(f"{heavy}."))


# --- usage errors --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "words",
    [
        [],
        ["frobnicate"],
        ["init"],
        ["init", "--workspace", "w"],
        ["lane"],
        ["dispatch", "--workspace", "w", "--task", "t"],
        ["journal", "--workspace", "w", "--tail", "many"],
        ["ledger"],
        ["ledger", "verify"],
        ["ledger", "frob", "x"],
        ["status", "--workspace", "w", "--bogus"],
    ],
)
def test_usage_error_exits_2_with_one_json_refusal(words: list[str]) -> None:
    done = raw(*words, "--json")
    assert done.returncode == 2, (done.stdout, done.stderr)
    out = one_json(done.stdout)
    assert out["ok"] is False and out["refusal"] == "usage_error" and out["message"]


@pytest.mark.parametrize("words", [["frobnicate"], ["init"], []])
def test_usage_error_without_json_goes_to_stderr(words: list[str]) -> None:
    done = raw(*words)
    assert done.returncode == 2
    assert done.stdout == ""
    assert "proctor --help" in done.stderr


def test_unknown_command_exits_2() -> None:
    done = raw("frobnicate")
    assert done.returncode == 2
    assert "frobnicate" in done.stderr


def test_refusal_without_json_is_one_line_on_stderr(tmp_path: Path) -> None:
    done = raw("lane", "--task", str(tmp_path / "nope.json"))
    assert done.returncode == 3
    assert done.stdout == ""
    assert done.stderr.startswith("refused: file_missing:")
    assert str(tmp_path / "nope.json") in done.stderr


def test_worker_argv_after_command_is_not_parsed_as_options(
    task_setup: Callable[..., TaskSetup],
) -> None:
    # `--json` and `--help` after `--command --` belong to the worker, not to proctor.
    setup = task_setup("wordfreq")
    r = run_proctor(
        "dispatch", *setup.words(), "--command", "--", sys.executable, "-c", "pass", "--help"
    )
    assert r.code == 3 and r.out["refusal"] == "not_initialized"


# --- every command prints exactly one JSON line -------------------------------------------


def test_every_command_prints_one_json_line(task_setup: Callable[..., TaskSetup]) -> None:
    setup = task_setup("wordfreq")
    words = setup.words()
    results: dict[str, Any] = {}

    def step(name: str, *argv: str, code: int) -> dict[str, Any]:
        cut = argv.index("--command") if "--command" in argv else len(argv)
        done = raw(*argv[:cut], "--json", *argv[cut:])
        assert done.returncode == code, (name, done.stdout, done.stderr)
        results[name] = one_json(done.stdout)
        return results[name]

    step("lane", "lane", "--task", str(setup.task), code=0)
    step("status-before", "status", "--workspace", str(setup.workspace), code=3)
    init = step("init", "init", *words, code=0)
    step("verify-fail", "verify", *words, code=1)
    step("accept-refused", "accept", *words, code=3)
    step("dispatch", "dispatch", *words, "--command", "--", *setup.worker(), code=0)
    step("verify", "verify", *words, code=0)
    step("accept", "accept", *words, code=0)
    step("status", "status", "--workspace", str(setup.workspace), code=0)
    step("journal", "journal", "--workspace", str(setup.workspace), code=0)
    step("ack", "journal", "--workspace", str(setup.workspace), "--ack", "d999", code=3)
    journal = os.path.join(init["state_dir"], "journal.jsonl")
    step("ledger-verify", "ledger", "verify", journal, code=0)
    step("ledger-repair", "ledger", "repair", journal, code=0)
    assert results["ledger-repair"]["ok"] is True
    step("usage", "lane", code=2)
    for name, out in results.items():
        assert "ok" in out, name


# --- bad task files through every task reader ------------------------------------------------


def _valid_task() -> dict[str, Any]:
    return json.loads((REPO / "evals" / "tasks" / "wordfreq" / "task.json").read_text())


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _bad_missing(tmp: Path) -> Path:
    return tmp / "absent.json"


def _bad_folder(tmp: Path) -> Path:
    folder = tmp / "folder.json"
    folder.mkdir()
    return folder


def _bad_fifo(tmp: Path) -> Path:
    fifo = tmp / "fifo.json"
    os.mkfifo(fifo)
    return fifo


def _bad_dangling(tmp: Path) -> Path:
    link = tmp / "dangling.json"
    link.symlink_to(tmp / "nowhere.json")
    return link


def _bad_utf8(tmp: Path) -> Path:
    body = json.dumps(_valid_task()).encode().replace(b"Bug:", b"Bug\xff\xfe:")
    return _write(tmp / "utf8.json", body)


def _bad_duplicate(tmp: Path) -> Path:
    body = json.dumps(_valid_task())[:-1] + ', "task_id": "again"}'
    return _write(tmp / "dup.json", body.encode())


def _bad_nan(tmp: Path) -> Path:
    body = json.dumps(_valid_task()).replace('"timeout_s": 60', '"timeout_s": NaN')
    assert "NaN" in body
    return _write(tmp / "nan.json", body.encode())


def _bad_huge_float(tmp: Path) -> Path:
    body = json.dumps(_valid_task()).replace('"timeout_s": 60', '"timeout_s": 1e999')
    assert "1e999" in body
    return _write(tmp / "inf.json", body.encode())


def _bad_deep(tmp: Path) -> Path:
    depth = 100_000
    return _write(tmp / "deep.json", b'{"prompt": ' + b"[" * depth + b"]" * depth + b"}")


def _bad_array(tmp: Path) -> Path:
    return _write(tmp / "array.json", json.dumps([_valid_task()]).encode())


def _bad_large(tmp: Path) -> Path:
    task = _valid_task()
    task["prompt"] = "x" * (5 * 1024 * 1024)
    return _write(tmp / "large.json", json.dumps(task).encode())


def _bad_bool_number(tmp: Path) -> Path:
    task = _valid_task()
    task["budget"]["timeout_s"] = True
    return _write(tmp / "bool.json", json.dumps(task).encode())


BAD_TASKS: dict[str, tuple[Callable[[Path], Path], str]] = {
    "missing": (_bad_missing, "file_missing"),
    "folder": (_bad_folder, "not_a_regular_file"),
    "fifo": (_bad_fifo, "not_a_regular_file"),
    "dangling_link": (_bad_dangling, "dangling_link"),
    "invalid_utf8": (_bad_utf8, "invalid_utf8"),
    "duplicate_keys": (_bad_duplicate, "json_duplicate_key"),
    "nan": (_bad_nan, "json_non_finite"),
    "1e999": (_bad_huge_float, "json_non_finite"),
    "deep_nesting": (_bad_deep, "json_too_deep"),
    "top_level_array": (_bad_array, "json_not_object"),
    "five_mib": (_bad_large, "file_too_large"),
    "bool_as_number": (_bad_bool_number, "task_invalid"),
}


@pytest.mark.parametrize("case", sorted(BAD_TASKS))
def test_lane_refuses_a_bad_task_file(tmp_path: Path, case: str) -> None:
    make, code = BAD_TASKS[case]
    path = make(tmp_path)
    r = run_proctor("lane", "--task", str(path), timeout=30)  # a FIFO must not block
    assert r.code == 3, r.out
    assert r.out["refusal"] == code
    assert r.out["path"] == str(path)
    assert r.out["ok"] is False and r.out["message"]


@pytest.mark.parametrize("case", sorted(BAD_TASKS))
def test_init_refuses_a_bad_task_file_and_pins_nothing(tmp_path: Path, case: str) -> None:
    make, code = BAD_TASKS[case]
    bad_dir = tmp_path / "bad"
    bad_dir.mkdir()
    path = make(bad_dir)
    ws = tmp_path / "ws"
    shutil.copytree(REPO / "evals" / "tasks" / "wordfreq" / "workspace", ws)
    git_repo(ws)
    state = tmp_path / "state"
    r = run_proctor(
        "init", "--workspace", str(ws), "--task", str(path), "--state-dir", str(state), timeout=30
    )
    assert r.code == 3, r.out
    assert r.out["refusal"] == code
    assert r.out["path"] == str(path)
    assert not state.exists()  # the task is read before any state is made


@pytest.mark.parametrize("command", ["dispatch", "verify", "accept"])
def test_bad_task_file_passed_to_a_gated_command_is_refused(
    task_setup: Callable[..., TaskSetup], command: str
) -> None:
    setup = task_setup("wordfreq")
    assert run_proctor("init", *setup.words()).code == 0
    worker = ["--command", "--", sys.executable, "-c", "pass"] if command == "dispatch" else []
    for case in ("fifo", "dangling_link", "duplicate_keys", "five_mib", "bool_as_number"):
        make, code = BAD_TASKS[case]
        folder = setup.root / f"bad-{case}"
        folder.mkdir()
        path = make(folder)
        ws = ["--workspace", str(setup.workspace)]
        r = run_proctor(command, *ws, "--task", str(path), *worker, timeout=30)
        assert r.code == 3 and r.out["refusal"] == code and r.out["path"] == str(path), r.out
    # Nothing was dispatched, verified or accepted on a bad task file.
    journal = run_proctor("journal", "--workspace", str(setup.workspace))
    assert [e["event"] for e in journal.out["events"]] == ["init"]


def test_huge_integer_timeout_is_a_refusal_not_an_internal_error(tmp_path: Path) -> None:
    task = _valid_task()
    text = json.dumps(task).replace('"timeout_s": 60', '"timeout_s": 1' + "0" * 400)
    path = _write(tmp_path / "task.json", text.encode())
    r = run_proctor("lane", "--task", str(path))
    assert r.code == 3 and r.out["refusal"] == "task_invalid" and r.out["path"] == str(path)


# --- the same bad files given to `proctor ledger verify` -----------------------------------------

LEDGER_REFUSED = {"missing", "folder", "fifo", "dangling_link"}


@pytest.mark.parametrize("case", sorted(BAD_TASKS))
def test_ledger_verify_on_a_bad_file(tmp_path: Path, case: str) -> None:
    make, code = BAD_TASKS[case]
    path = make(tmp_path)
    if case not in LEDGER_REFUSED:  # a whole line, so the content (not a torn tail) is judged
        with open(path, "ab") as fh:
            fh.write(b"\n")
    r = run_proctor("ledger", "verify", str(path), timeout=30)
    assert r.out["path"] == str(path)
    assert r.out["ok"] is False
    if case in LEDGER_REFUSED:
        assert r.code == 3
        assert r.out["refusal"] == code
    else:
        assert r.code == 1, r.out
        assert r.out["lines"] == 0
        problem = r.out["problem"]
        assert problem["line"] == 1
        assert problem["kind"] in ("invalid_json", "not_object", "not_canonical", "seed_mismatch")
        assert "line 1" in problem["message"]


@pytest.mark.parametrize(
    ("case", "kind"),
    [
        ("invalid_utf8", "invalid_json"),
        ("duplicate_keys", "invalid_json"),
        ("nan", "invalid_json"),
        ("1e999", "invalid_json"),
        ("deep_nesting", "invalid_json"),
        ("top_level_array", "not_object"),
    ],
)
def test_ledger_verify_names_the_kind_of_bad_line(tmp_path: Path, case: str, kind: str) -> None:
    path = BAD_TASKS[case][0](tmp_path)
    with open(path, "ab") as fh:
        fh.write(b"\n")
    r = run_proctor("ledger", "verify", str(path), timeout=30)
    assert r.code == 1
    assert r.out["problem"]["kind"] == kind


def test_ledger_verify_reports_a_torn_tail(tmp_path: Path) -> None:
    path = _write(tmp_path / "log.jsonl", b'{"a":1}')
    r = run_proctor("ledger", "verify", str(path))
    assert r.code == 1
    assert r.out["problem"]["kind"] == "torn_tail" and r.out["problem"]["line"] == 1


def test_ledger_verify_of_an_empty_file_is_intact(tmp_path: Path) -> None:
    path = _write(tmp_path / "log.jsonl", b"")
    r = run_proctor("ledger", "verify", str(path))
    assert r.code == 0 and r.out["ok"] is True and r.out["lines"] == 0


def test_ledger_repair_refuses_a_seedless_empty_log(tmp_path: Path) -> None:
    path = _write(tmp_path / "log.jsonl", b"")
    r = run_proctor("ledger", "repair", str(path))
    assert r.code == 3 and r.out["refusal"] == "log_seed_unknown" and r.out["path"] == str(path)


def test_report_prints_a_readable_table_and_keeps_full_precision_in_json(tmp_path: Path) -> None:
    """Issue 13 item 8: `proctor report` shows an aligned q table, money rounded; --json keeps every digit."""
    from harness.cli.output import text_table
    from tests.support.study import prereg, sim_servers, system, urls

    with sim_servers(tmp_path) as sim:
        url = sim([system("sim-flash", 0.8), system("sim-glm", 0.5)])
        p = prereg(tmp_path)
        from harness.run.runner import run_stage

        folder = run_stage(p, "A", tmp_path / "results", base_urls=urls(url)).folder
    as_json = run_proctor("report", folder, "--prereg", str(p))
    rows = as_json.out["q_table"]
    assert as_json.code == 0 and {r["system"] for r in rows} == {"good", "bad"}
    assert any(len(repr(r["cost_usd"]).split(".")[1]) > 4 for r in rows)  # full precision stays in --json
    done = subprocess.run([sys.executable, "-m", "harness", "report", folder, "--prereg", str(p)], cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split("q_table:")[1].strip("\n ").splitlines()
    header, rule, *body = (line.strip() for line in lines)
    assert header.split() == ["system", "arm", "n", "passes", "pass_rate", "wilson_low", "wilson_high", "cost_usd",
                              "cost_per_pass_usd", "latency_median_s"]
    assert set(rule) <= {"-", " "} and len(body) == 3 and body[-1].startswith("(money in USD, rounded")
    for row in rows:  # each row: aligned under the header, money to 4 decimals, rates to 3
        (line,) = [b for b in body if b.split()[0] == row["system"]]
        assert len(line) == len(header)  # right-aligned numbers end where the header does
        assert f"{row['cost_usd']:.4f}" in line.split() and f"{row['pass_rate']:.3f}" in line.split()
    assert "exhausted_cells: (none)" in done.stdout and "cells_by_system:\n  good: 6\n  bad: 6" in done.stdout

    table = text_table([{"a": "x", "usd": 0.123456789, "tiny": 0.00001234, "n": 3, "none": None},
                        {"a": "long name", "usd": 1.0, "tiny": 0.0, "n": 12, "none": None}],
                       ["a", "usd", "tiny", "n", "none"], {"usd": 4, "tiny": 4})
    assert table.splitlines() == ["a             usd     tiny   n  none",
                                  "---------  ------  -------  --  ----",
                                  "x          0.1235  1.2e-05   3     -",
                                  "long name  1.0000   0.0000  12     -"]
