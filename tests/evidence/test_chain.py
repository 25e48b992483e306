"""Chained append-only JSONL logs: format, problems, refusals, repair, concurrency."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.errors import Refusal
from harness.evidence import chain_read
from harness.evidence.chain import ChainedLog
from harness.evidence.chain_read import (
    PROBLEM_KINDS,
    ChainProblem,
    ChainStatus,
    read_log,
    seed_hash,
    verify_log,
)
from harness.evidence.jsonio import canonical_bytes
from tests.support.paths import REPO

SEED = "study-x/attempts.jsonl"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def lines_of(path: Path) -> list[bytes]:
    data = path.read_bytes()
    assert data.endswith(b"\n")
    return data[:-1].split(b"\n")


def make_log(path: Path, n: int, seed: str = SEED) -> ChainedLog:
    log = ChainedLog(path, seed)
    if n:
        log.append_many([{"i": i, "pad": "x" * (i % 7)} for i in range(n)])
    return log


def write_chain(path: Path, objs: list[dict[str, Any]], seed: str = SEED) -> list[bytes]:
    """Write objects as a correctly chained log by hand (the first gets the seed)."""
    out: list[bytes] = []
    prev = seed_hash(seed)
    for k, obj in enumerate(objs):
        full = dict(obj)
        if k == 0:
            full["seed"] = seed
        full["prev"] = prev
        raw = canonical_bytes(full)
        out.append(raw)
        prev = sha(raw)
    path.write_bytes(b"".join(line + b"\n" for line in out))
    return out


# --------------------------------------------------------------------------
# Basics


def test_seed_hash_is_sha256_of_the_utf8_seed() -> None:
    assert seed_hash("é/log") == sha("é/log".encode())


def test_empty_file_is_an_intact_log_of_no_lines(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_bytes(b"")
    status = verify_log(path)
    assert status.ok and status.lines == 0 and status.seed is None and status.head == ""
    with_seed = verify_log(path, SEED)
    assert with_seed.ok and with_seed.head == seed_hash(SEED) and with_seed.seed == SEED
    assert read_log(path) == []


def test_missing_log_is_refused_by_readers_but_empty_for_its_writer(tmp_path: Path) -> None:
    path = tmp_path / "nope.jsonl"
    with pytest.raises(Refusal) as caught:
        verify_log(path)
    assert caught.value.code == "file_missing"
    with pytest.raises(Refusal):
        read_log(path)
    log = ChainedLog(path, SEED)
    assert log.status() == ChainStatus(str(path), 0, seed_hash(SEED), SEED, None)
    assert log.records() == []
    assert log.repair()["repaired"] is False
    assert not path.exists()


def test_append_and_read_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    log = ChainedLog(path, SEED)
    first = log.append({"event": "start", "n": 1})
    more = log.append_many([{"event": "item", "i": i, "text": 'é\u2028\n"x"'} for i in range(5)])
    assert first["seed"] == SEED and first["prev"] == seed_hash(SEED)
    records = read_log(path, SEED)
    assert records == [first, *more]
    assert log.records() == records
    assert [r.get("i") for r in records[1:]] == list(range(5))
    assert all("seed" not in r for r in records[1:])
    status = verify_log(path)
    assert status.ok and status.lines == 6 and status.seed == SEED
    assert status.head == sha(lines_of(path)[-1])
    assert log.status() == status


def test_first_line_prev_is_seed_hash_and_each_prev_hashes_the_line_before(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    make_log(path, 10)
    raw = lines_of(path)
    objs = [json.loads(line) for line in raw]
    assert objs[0]["prev"] == seed_hash(SEED) and objs[0]["seed"] == SEED
    for before, obj in zip(raw, objs[1:], strict=False):
        assert obj["prev"] == sha(before)
    for line, obj in zip(raw, objs, strict=True):
        assert canonical_bytes(obj) == line


def test_append_returns_records_as_written(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    log = ChainedLog(path, SEED)
    written = log.append_many([{"a": 1}, {"b": [1.5, None]}])
    assert [canonical_bytes(r) for r in written] == lines_of(path)
    assert log.append_many([]) == []


def test_status_to_json(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    make_log(path, 2)
    with path.open("ab") as f:
        f.write(b'{"half')
    out = verify_log(path).to_json()
    assert out["ok"] is False and out["lines"] == 2 and out["seed"] == SEED
    assert out["problem"]["kind"] == "torn_tail" and out["problem"]["line"] == 3
    json.dumps(out)  # JSON-safe


# --------------------------------------------------------------------------
# Seeds and reserved fields


def test_seed_mismatch_is_a_problem_for_readers_and_a_refusal_for_writers(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    make_log(path, 3)
    status = verify_log(path, "other-study/attempts.jsonl")
    assert status.problem == ChainProblem(
        1, "seed_mismatch", status.problem.message if status.problem else ""
    )
    assert status.lines == 0
    with pytest.raises(Refusal) as caught:
        ChainedLog(path, "other-study/attempts.jsonl").append({"x": 1})
    assert caught.value.code == "log_seed_mismatch"
    with pytest.raises(Refusal) as caught:
        read_log(path, "other")
    assert caught.value.code == "log_broken" and caught.value.details["kind"] == "seed_mismatch"


@pytest.mark.parametrize("key", ["prev", "seed"])
def test_a_record_carrying_a_reserved_field_is_refused(tmp_path: Path, key: str) -> None:
    path = tmp_path / "log.jsonl"
    log = make_log(path, 1)
    before = path.read_bytes()
    with pytest.raises(Refusal) as caught:
        log.append({key: "x", "ok": 1})
    assert caught.value.code == "log_record_reserved"
    with pytest.raises(Refusal):
        log.append_many([{"ok": 1}, {key: "x"}])  # nothing of the batch is written
    assert path.read_bytes() == before


@pytest.mark.parametrize(
    "record",
    [
        {"x": float("nan")},
        {"x": float("inf")},
        {"x": object()},
        {"x": "\ud800"},  # a lone surrogate cannot be written as UTF-8
        {1: "a", "1": "b"},  # two keys that collide once written
        {"deep": json.loads("[" * 70 + "]" * 70)},
    ],
    ids=["nan", "inf", "object", "surrogate", "colliding-keys", "too-deep"],
)
def test_a_record_that_would_not_read_back_is_refused(tmp_path: Path, record: Any) -> None:
    path = tmp_path / "log.jsonl"
    log = make_log(path, 1)
    before = path.read_bytes()
    with pytest.raises(Refusal) as caught:
        log.append(record)
    assert caught.value.code == "log_record_invalid"
    assert path.read_bytes() == before
    assert verify_log(path).ok


def test_a_non_mapping_record_is_refused(tmp_path: Path) -> None:
    log = ChainedLog(tmp_path / "log.jsonl", SEED)
    with pytest.raises(Refusal) as caught:
        log.append([("a", 1)])  # type: ignore[arg-type]
    assert caught.value.code == "log_record_invalid"


def test_an_empty_seed_is_refused(tmp_path: Path) -> None:
    with pytest.raises(Refusal) as caught:
        ChainedLog(tmp_path / "log.jsonl", "")
    assert caught.value.code == "log_seed_invalid"


# --------------------------------------------------------------------------
# Every problem kind, planted by hand


def _good(n: int = 4) -> list[dict[str, Any]]:
    return [{"i": i, "s": f"v{i}"} for i in range(n)]


def _plant(path: Path, index: int, replace: bytes) -> list[bytes]:
    """A good chain with line `index` (0-based) replaced by `replace` (later lines re-chained)."""
    raw = write_chain(path, _good())
    raw[index] = replace
    path.write_bytes(b"".join(line + b"\n" for line in raw))
    return raw


def _relinked(path: Path, objs: list[dict[str, Any]], index: int, replace: bytes) -> None:
    """Write lines chained by hand where line `index` is `replace` and later lines link to it."""
    out: list[bytes] = []
    prev = seed_hash(SEED)
    for k, obj in enumerate(objs):
        if k == index:
            raw = replace
        else:
            full = dict(obj)
            if k == 0:
                full["seed"] = SEED
            full["prev"] = prev
            raw = canonical_bytes(full)
        out.append(raw)
        prev = sha(raw)
    path.write_bytes(b"".join(line + b"\n" for line in out))


def _prev_for(path: Path, index: int) -> str:
    raw = write_chain(path, _good())
    return seed_hash(SEED) if index == 0 else sha(raw[index - 1])


PLANTED: list[tuple[str, str, int]] = [
    # (name, kind, 0-based line)
    ("invalid-json", "invalid_json", 2),
    ("invalid-utf8", "invalid_json", 2),
    ("empty-line", "invalid_json", 2),
    ("duplicate-key", "invalid_json", 2),
    ("spaces", "not_canonical", 2),
    ("unsorted", "not_canonical", 2),
    ("escaped-ascii", "not_canonical", 2),
    ("float-form", "not_canonical", 2),
    ("array", "not_object", 2),
    ("string", "not_object", 1),
    ("no-prev", "missing_prev", 2),
    ("wrong-prev", "broken_prev", 2),
    ("prev-not-string", "broken_prev", 2),
    ("first-prev-wrong", "broken_prev", 0),
    ("first-no-seed", "seed_mismatch", 0),
    ("later-seed", "seed_mismatch", 2),
    ("nan", "invalid_json", 2),
    ("too-deep", "invalid_json", 2),
]


def _planted_line(path: Path, name: str, index: int) -> bytes:
    prev = _prev_for(path, index)
    body = {"i": index, "prev": prev, "s": f"v{index}"}
    canon = canonical_bytes(body)
    if name == "invalid-json":
        return canon[:-1]
    if name == "invalid-utf8":
        return canon[:-2] + b'\xff"}'
    if name == "empty-line":
        return b""
    if name == "duplicate-key":
        return canon[:-1] + b',"i":9}'
    if name == "spaces":
        return json.dumps(body, sort_keys=True).encode()
    if name == "unsorted":
        return json.dumps(
            {"s": f"v{index}", "prev": prev, "i": index}, separators=(",", ":")
        ).encode()
    if name == "escaped-ascii":
        return canon.replace(b'"s"', b'"\\u0073"')
    if name == "float-form":
        return canonical_bytes({**body, "f": 1.5}).replace(b"1.5", b"1.50")
    if name == "array":
        return b"[1,2]"
    if name == "string":
        return b'"hello"'
    if name == "no-prev":
        return canonical_bytes({"i": index})
    if name == "wrong-prev":
        return canonical_bytes({**body, "prev": "0" * 64})
    if name == "prev-not-string":
        return canonical_bytes({**body, "prev": 7})
    if name == "first-prev-wrong":
        return canonical_bytes({**body, "prev": "0" * 64, "seed": SEED})
    if name == "first-no-seed":
        return canon
    if name == "later-seed":
        return canonical_bytes({**body, "seed": SEED})
    if name == "nan":
        return canon[:-1] + b',"z":NaN}'
    if name == "too-deep":
        return canon[:-1] + b',"z":' + b"[" * 70 + b"]" * 70 + b"}"
    raise AssertionError(name)


@pytest.mark.parametrize(("name", "kind", "index"), PLANTED, ids=[p[0] for p in PLANTED])
def test_each_problem_kind_is_named_with_its_line(
    tmp_path: Path, name: str, kind: str, index: int
) -> None:
    path = tmp_path / "log.jsonl"
    bad = _planted_line(path, name, index)
    _relinked(path, _good(), index, bad)
    status = verify_log(path)
    assert status.problem is not None, name
    assert (status.problem.kind, status.problem.line) == (kind, index + 1), status.problem
    assert status.lines == index
    assert f"line {index + 1}" in status.problem.message
    with pytest.raises(Refusal) as caught:
        read_log(path)
    assert caught.value.code == "log_broken"
    assert caught.value.details == {"line": index + 1, "kind": kind}
    assert caught.value.path == str(path)


def test_the_problem_kinds_are_the_documented_ones() -> None:
    assert set(PROBLEM_KINDS) == {
        "torn_tail",
        "invalid_json",
        "not_canonical",
        "missing_prev",
        "broken_prev",
        "seed_mismatch",
        "not_object",
    }


@pytest.mark.parametrize("chunk", [7, 64, 1000, 1 << 20])
@pytest.mark.parametrize("where", [1, 2, 500, 1499])
def test_problems_deep_in_a_large_log_across_chunk_sizes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int, where: int
) -> None:
    """The fast batch path hands a bad chunk to the strict reader, which names the line."""
    monkeypatch.setattr(chain_read, "_CHUNK", chunk)
    path = tmp_path / "log.jsonl"
    objs = [{"i": i, "pad": "é" * (i % 50)} for i in range(1500)]
    raw = write_chain(path, objs)
    status = verify_log(path, SEED)
    assert status.ok and status.lines == 1500 and status.head == sha(raw[-1])
    assert len(read_log(path)) == 1500
    raw[where] = raw[where].replace(b'"i":', b'"i": ')
    path.write_bytes(b"".join(line + b"\n" for line in raw))
    status = verify_log(path)
    assert status.problem is not None
    assert (status.problem.kind, status.problem.line, status.lines) == (
        "not_canonical",
        where + 1,
        where,
    )
    assert status.head == sha(raw[where - 1])


def test_lines_that_only_parse_together_are_refused(tmp_path: Path) -> None:
    """Two lines that form valid JSON only when joined must not pass as two records."""
    path = tmp_path / "log.jsonl"
    raw = write_chain(path, _good(3))
    first = raw[0]
    second = b'{"a":[{}'
    third = b'{}]},{"b":1,"prev":"' + sha(second).encode() + b'"}'
    path.write_bytes(first + b"\n" + second + b"\n" + third + b"\n")
    status = verify_log(path)
    assert status.problem is not None and (status.problem.kind, status.problem.line) == (
        "invalid_json",
        2,
    )


# --------------------------------------------------------------------------
# Torn tails and repair


def test_a_torn_tail_is_reported_with_its_line_number(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    make_log(path, 5)
    intact = path.read_bytes()
    with path.open("ab") as f:
        f.write(b'{"event":"half-writ')
    status = verify_log(path, SEED)
    assert status.problem is not None
    assert (status.problem.kind, status.problem.line, status.lines) == ("torn_tail", 6, 5)
    assert status.head == sha(intact[:-1].split(b"\n")[-1])
    with pytest.raises(Refusal) as caught:
        read_log(path)
    assert caught.value.code == "log_torn_tail" and caught.value.details["line"] == 6


def test_a_torn_tail_refusal_says_to_run_ledger_repair_and_that_repairs_it(tmp_path: Path) -> None:
    # issue 13 item 10: every torn-tail refusal names the command that fixes it
    path = tmp_path / "attempts.jsonl"
    log = ChainedLog(path, SEED)
    for i in range(3):
        log.append({"event": "x", "i": i})
    with path.open("ab") as f:
        f.write(b'{"prev": "cut')
    for fn in (lambda: read_log(path, SEED), lambda: ChainedLog(path, SEED).append({"event": "y"})):
        with pytest.raises(Refusal) as caught:
            fn()
        assert caught.value.code == "log_torn_tail" and caught.value.path == str(path)
        assert "proctor ledger repair" in caught.value.message, caught.value.message
    status = verify_log(path, SEED)
    assert status.problem is not None and "proctor ledger repair" in status.problem.message
    done = subprocess.run([sys.executable, "-m", "harness", "ledger", "repair", str(path), "--json"],
                          capture_output=True, text=True, cwd=REPO, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert [r["i"] for r in read_log(path, SEED) if "i" in r] == [0, 1, 2]


def test_a_torn_first_line_is_a_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_bytes(b'{"prev":')
    status = verify_log(path)
    assert status.problem == ChainProblem(
        1, "torn_tail", status.problem.message if status.problem else ""
    )
    log = ChainedLog(path, SEED)
    report = log.repair()
    assert report["repaired"] and report["line"] == 1
    assert (tmp_path / "log.jsonl.quarantine-1").read_bytes() == b'{"prev":'
    records = read_log(path, SEED)
    assert records[0]["event"] == "log_repair" and records[0]["seed"] == SEED


def test_append_is_refused_after_a_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    log = make_log(path, 3)
    with path.open("ab") as f:
        f.write(b'{"x":1}')  # complete JSON, but no newline: still torn
    before = path.read_bytes()
    for writer in (log, ChainedLog(path, SEED)):  # cached and fresh writers alike
        with pytest.raises(Refusal) as caught:
            writer.append({"y": 2})
        assert caught.value.code == "log_torn_tail"
        assert caught.value.details["line"] == 4
        assert caught.value.path == str(path)
    assert path.read_bytes() == before


def test_repair_quarantines_the_exact_torn_bytes_and_the_chain_continues(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    log = make_log(path, 4)
    intact = path.read_bytes()
    torn = b'{"event":"attempt","pad":"' + bytes(range(0x20, 0x7F)) + "é".encode()[:1]
    with path.open("ab") as f:
        f.write(torn)
    report = log.repair()
    quarantine = tmp_path / "log.jsonl.quarantine-1"
    assert report["repaired"] is True
    assert report["quarantine"] == str(quarantine)
    assert quarantine.read_bytes() == torn
    assert report["torn_bytes"] == len(torn) and report["torn_sha256"] == sha(torn)
    assert report["line"] == 5
    data = path.read_bytes()
    assert data.startswith(intact)
    record = json.loads(data[len(intact) :])
    assert record == report["record"]
    assert {k: record[k] for k in ("event", "quarantine", "torn_bytes", "torn_sha256", "line")} == {
        "event": "log_repair",
        "quarantine": "log.jsonl.quarantine-1",
        "torn_bytes": len(torn),
        "torn_sha256": sha(torn),
        "line": 5,
    }
    assert record["prev"] == sha(intact[:-1].split(b"\n")[-1])
    log.append({"after": True})
    ChainedLog(path, SEED).append({"after": 2})
    status = verify_log(path, SEED)
    assert status.ok and status.lines == 7


def test_repair_never_overwrites_an_existing_quarantine_file(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    log = make_log(path, 2)
    (tmp_path / "log.jsonl.quarantine-1").write_bytes(b"someone else's")
    for n, torn in ((2, b'{"first'), (3, b'{"second')):
        with path.open("ab") as f:
            f.write(torn)
        report = log.repair()
        assert report["quarantine"] == str(tmp_path / f"log.jsonl.quarantine-{n}")
        assert (tmp_path / f"log.jsonl.quarantine-{n}").read_bytes() == torn
    assert (tmp_path / "log.jsonl.quarantine-1").read_bytes() == b"someone else's"
    assert verify_log(path).ok and verify_log(path).lines == 4


def test_repair_of_an_intact_log_is_a_no_op(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    log = make_log(path, 3)
    before = path.read_bytes()
    report = log.repair()
    assert report == {
        "path": str(path),
        "repaired": False,
        "lines": 3,
        "head": verify_log(path).head,
    }
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.jsonl"]


def test_repair_refuses_a_problem_that_is_not_a_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    raw = write_chain(path, _good())
    raw[1] = raw[1].replace(b'"s":"v1"', b'"s":"v9"')
    path.write_bytes(b"".join(line + b"\n" for line in raw) + b'{"torn')
    before = path.read_bytes()
    with pytest.raises(Refusal) as caught:
        ChainedLog(path, SEED).repair()
    assert caught.value.code == "log_broken"
    assert caught.value.details == {"line": 3, "kind": "broken_prev"}
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.jsonl"]


def test_a_writer_refuses_an_invalid_last_line(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    log = make_log(path, 3)
    with path.open("ab") as f:
        f.write(b'{"no":"prev"}\n')
    with pytest.raises(Refusal) as caught:
        log.append({"x": 1})
    assert caught.value.code == "log_broken"
    assert caught.value.details == {"line": 4, "kind": "missing_prev"}
    with path.open("ab") as f:
        f.write(b"not json\n")
    with pytest.raises(Refusal) as caught:
        ChainedLog(path, SEED).append({"x": 1})
    assert caught.value.details == {"line": 5, "kind": "invalid_json"}


def test_a_writer_notices_appends_by_another_writer(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    a = ChainedLog(path, SEED)
    b = ChainedLog(path, SEED)
    for i in range(5):
        a.append({"w": "a", "i": i})
        b.append({"w": "b", "i": i})
    status = verify_log(path, SEED)
    assert status.ok and status.lines == 10


def test_a_long_last_line_is_found_by_reading_backwards(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    log = ChainedLog(path, SEED)
    log.append({"big": "y" * 300_000})
    log.append({"big": "z" * 200_000})
    ChainedLog(path, SEED).append({"small": 1})
    assert verify_log(path, SEED).ok and verify_log(path).lines == 3


# --------------------------------------------------------------------------
# What is not a log file


@pytest.mark.timeout(20)
def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "log.jsonl"
    os.mkfifo(fifo)
    log = ChainedLog(fifo, SEED)
    calls: list[Callable[[], object]] = [
        lambda: verify_log(fifo),
        lambda: read_log(fifo),
        lambda: log.append({"x": 1}),
        log.repair,
        log.status,
        log.records,
    ]
    for call in calls:
        with pytest.raises(Refusal) as caught:
            call()
        assert caught.value.code == "not_a_regular_file"


def test_a_dangling_link_is_refused_and_never_created(tmp_path: Path) -> None:
    link = tmp_path / "log.jsonl"
    target = tmp_path / "elsewhere.jsonl"
    link.symlink_to(target)
    with pytest.raises(Refusal) as caught:
        verify_log(link)
    assert caught.value.code == "dangling_link"
    with pytest.raises(Refusal) as caught:
        ChainedLog(link, SEED).append({"x": 1})
    assert caught.value.code == "dangling_link"
    assert not target.exists()


def test_a_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(Refusal) as caught:
        verify_log(tmp_path)
    assert caught.value.code == "not_a_regular_file"
    with pytest.raises(Refusal) as caught:
        ChainedLog(tmp_path, SEED).append({"x": 1})
    assert caught.value.code == "not_a_regular_file"


def test_a_missing_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(Refusal) as caught:
        ChainedLog(tmp_path / "no" / "log.jsonl", SEED).append({"x": 1})
    assert caught.value.code == "folder_missing"


# --------------------------------------------------------------------------
# Properties

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=12,
)
records = st.dictionaries(
    st.text(max_size=8).filter(lambda k: k not in ("prev", "seed")), json_values, max_size=5
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(batch=st.lists(records, min_size=1, max_size=6))
def test_canonical_records_round_trip(
    tmp_path_factory: pytest.TempPathFactory, batch: list[dict[str, Any]]
) -> None:
    path = tmp_path_factory.mktemp("rt") / "log.jsonl"
    log = ChainedLog(path, SEED)
    written = [log.append(batch[0]), *log.append_many(batch[1:])]
    read = read_log(path, SEED)
    assert read == written
    for got, want in zip(read, batch, strict=True):
        assert {k: v for k, v in got.items() if k not in ("prev", "seed")} == json.loads(
            json.dumps(want)
        )
    assert verify_log(path, SEED).lines == len(batch)


_FLIP_BASE: dict[str, bytes] = {}


def _flip_base() -> bytes:
    if "data" not in _FLIP_BASE:
        objs = [{"i": 0, "t": "a"}, {"i": 1, "t": "é"}, {"i": 2, "nested": {"k": [1, 2.5]}}]
        out: list[bytes] = []
        prev = seed_hash("s")
        for k, obj in enumerate(objs):
            full = {**obj, "prev": prev, **({"seed": "s"} if k == 0 else {})}
            raw = canonical_bytes(full)
            out.append(raw)
            prev = sha(raw)
        _FLIP_BASE["data"] = b"".join(line + b"\n" for line in out)
    return _FLIP_BASE["data"]


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_flipping_any_byte_is_detected(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    base = _flip_base()
    position = data.draw(st.integers(min_value=0, max_value=len(base) - 1), label="position")
    value = data.draw(
        st.integers(min_value=0, max_value=255).filter(lambda v: v != base[position]), label="value"
    )
    path = tmp_path_factory.mktemp("flip") / "log.jsonl"
    path.write_bytes(base)
    good = verify_log(path)
    assert good.ok and good.lines == 3
    flipped = bytearray(base)
    flipped[position] = value
    path.write_bytes(bytes(flipped))
    status = verify_log(path)
    assert (not status.ok) or status.head != good.head or status.seed != good.seed


# --------------------------------------------------------------------------
# Concurrency

_WRITER = textwrap.dedent(
    """
    import sys
    from harness.evidence.chain import ChainedLog
    path, seed, who, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    log = ChainedLog(path, seed)
    for i in range(n):
        log.append({"who": who, "i": i, "pad": "p" * (i % 300)})
    """
)


@pytest.mark.timeout(120)
def test_two_processes_appending_interleave_into_one_chain(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(path), SEED, who, "200"], env=env)
        for who in ("a", "b")
    ]
    for proc in procs:
        assert proc.wait(timeout=110) == 0
    status = verify_log(path, SEED)
    assert status.ok and status.lines == 400, status
    records = read_log(path, SEED)
    for who in ("a", "b"):
        assert [r["i"] for r in records if r["who"] == who] == list(range(200))


def test_an_intact_log_is_checked_by_the_fast_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the first line (the seed) goes through the line-by-line reader on an intact log."""
    path = tmp_path / "log.jsonl"
    write_chain(path, [{"i": i} for i in range(2000)])
    slow_lines: list[int] = []
    real = chain_read._slow_lines

    def spy(scan: Any, block: bytes, start: int) -> None:
        slow_lines.append(block[start:].count(b"\n"))
        real(scan, block, start)

    monkeypatch.setattr(chain_read, "_slow_lines", spy)
    assert verify_log(path).lines == 2000
    assert sum(slow_lines) == 1


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    batch=st.lists(records, min_size=1, max_size=8),
    edits=st.lists(st.tuples(st.integers(min_value=0), st.binary(max_size=3)), max_size=2),
)
def test_the_fast_path_agrees_with_the_strict_reader(
    tmp_path_factory: pytest.TempPathFactory,
    batch: list[dict[str, Any]],
    edits: list[tuple[int, bytes]],
) -> None:
    """Whatever the bytes, the batch path and the line-by-line reader report the same status."""
    path = tmp_path_factory.mktemp("agree") / "log.jsonl"
    ChainedLog(path, SEED).append_many(batch)
    data = bytearray(path.read_bytes())
    for position, insert in edits:
        at = position % (len(data) + 1)
        data[at : at + 1] = insert
    path.write_bytes(bytes(data))
    fast = verify_log(path)
    with mock.patch.object(chain_read, "_fast_block", return_value=None):
        slow = verify_log(path)
    assert fast == slow


# --------------------------------------------------------------------------
# Verifying in parallel pieces (a large log): the same status as the serial scan


def _force_pieces(monkeypatch: pytest.MonkeyPatch, cores: int, piece: int = 1) -> None:
    monkeypatch.setattr(chain_read, "_PAR_MIN_BYTES", 0)
    monkeypatch.setattr(chain_read, "_PAR_MIN_PIECE", piece)
    monkeypatch.setattr(chain_read, "_PAR_CORES", cores)
    monkeypatch.setattr(chain_read.threading, "active_count", lambda: 1)  # whatever the runner


def _serial_scan(path: Path, seed: str | None) -> tuple[ChainStatus, int]:
    with (
        mock.patch.object(chain_read, "_PAR_MIN_BYTES", 1 << 62),
        mock.patch.object(chain_read, "_fast_block", return_value=None),
    ):
        scan = chain_read._scan_path(path, seed, keep=False)
    return scan.status(), scan.intact_bytes


def _pieces_scan(path: Path, seed: str | None) -> tuple[ChainStatus, int]:
    scan = chain_read._scan_path(path, seed, keep=False)
    return scan.status(), scan.intact_bytes


def test_a_large_log_is_verified_in_forked_pieces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "log.jsonl"
    raw = write_chain(path, [{"i": i, "pad": "é" * (i % 50)} for i in range(3000)])
    _force_pieces(monkeypatch, cores=4)
    forks: list[tuple[int, int]] = []
    real = chain_read._fork_range

    def spy(fd: int, start: int, end: int) -> tuple[int, int]:
        forks.append((start, end))
        return real(fd, start, end)

    monkeypatch.setattr(chain_read, "_fork_range", spy)
    slow_lines: list[int] = []
    real_slow = chain_read._slow_lines

    def spy_slow(scan: Any, block: bytes, start: int) -> None:
        slow_lines.append(block[start:].count(b"\n"))
        real_slow(scan, block, start)

    monkeypatch.setattr(chain_read, "_slow_lines", spy_slow)
    status = verify_log(path, SEED)
    assert status.ok and status.lines == 3000 and status.head == sha(raw[-1])
    assert len(forks) == 3  # four pieces: one here, three in children
    assert sum(slow_lines) == 1  # only the seed line is read line by line
    assert status == _serial_scan(path, SEED)[0]


def test_pieces_are_not_forked_while_other_threads_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "log.jsonl"
    write_chain(path, [{"i": i} for i in range(500)])
    _force_pieces(monkeypatch, cores=4)
    monkeypatch.setattr(chain_read.threading, "active_count", lambda: 2)
    monkeypatch.setattr(chain_read, "_fork_range", mock.Mock(side_effect=AssertionError))
    assert verify_log(path, SEED).lines == 500


def test_a_failed_fork_falls_back_to_the_serial_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "log.jsonl"
    raw = write_chain(path, [{"i": i} for i in range(500)])
    raw[400] = raw[400].replace(b'"i":', b'"i": ')
    path.write_bytes(b"".join(line + b"\n" for line in raw))
    _force_pieces(monkeypatch, cores=4)
    monkeypatch.setattr(chain_read, "_fork_range", mock.Mock(side_effect=OSError("no fork")))
    status = verify_log(path, SEED)
    assert status.problem is not None
    assert (status.problem.kind, status.problem.line, status.lines) == ("not_canonical", 401, 400)


@pytest.mark.parametrize(("name", "kind", "index"), PLANTED, ids=[p[0] for p in PLANTED])
def test_each_problem_kind_is_named_with_its_line_in_pieces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, kind: str, index: int
) -> None:
    path = tmp_path / "log.jsonl"
    bad = _planted_line(path, name, index)
    _relinked(path, _good(), index, bad)
    _force_pieces(monkeypatch, cores=3)
    status = verify_log(path)
    assert status.problem is not None, name
    assert (status.problem.kind, status.problem.line) == (kind, index + 1), status.problem
    assert (status, chain_read._scan_path(path, None, keep=False).intact_bytes) == _serial_scan(
        path, None
    )


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    batch=st.lists(records, min_size=1, max_size=40),
    edits=st.lists(st.tuples(st.integers(min_value=0), st.binary(max_size=3)), max_size=3),
    cores=st.integers(min_value=2, max_value=8),
    chunk=st.sampled_from([5, 64, 1 << 20]),
    seeded=st.booleans(),
)
def test_pieces_agree_with_the_serial_strict_reader(
    tmp_path_factory: pytest.TempPathFactory,
    batch: list[dict[str, Any]],
    edits: list[tuple[int, bytes]],
    cores: int,
    chunk: int,
    seeded: bool,
) -> None:
    """Valid or corrupted, the pieces report the same status and intact bytes as the strict reader."""
    path = tmp_path_factory.mktemp("pieces") / "log.jsonl"
    ChainedLog(path, SEED).append_many(batch)
    data = bytearray(path.read_bytes())
    for position, insert in edits:
        at = position % (len(data) + 1)
        data[at : at + 1] = insert
    path.write_bytes(bytes(data))
    seed = SEED if seeded else None
    want = _serial_scan(path, seed)
    with (
        mock.patch.object(chain_read, "_PAR_MIN_BYTES", 0),
        mock.patch.object(chain_read, "_PAR_MIN_PIECE", 1),
        mock.patch.object(chain_read, "_PAR_CORES", cores),
        mock.patch.object(chain_read, "_CHUNK", chunk),
        mock.patch.object(chain_read.threading, "active_count", return_value=1),
    ):
        got = _pieces_scan(path, seed)
    assert got == want
