"""The chain reader's block path (parse a block as one array, re-encode, compare) against the line-by-line reader.

The block path is only a shortcut: on any log, intact or corrupted in any of the
ways below, it must report exactly what the strict line-by-line reader reports
(same status, same problem kind and line, same intact bytes). docs/evidence.md.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.errors import Refusal
from harness.evidence import chain_read
from harness.evidence.chain_read import ChainStatus, read_log, seed_hash
from harness.evidence.jsonio import canonical_bytes

SEED = "study-x/finals.jsonl"

CORRUPTIONS = (
    "none",
    "truncated",
    "torn_tail",
    "spacing",
    "key_order",
    "duplicate_key",
    "nan",
    "infinity",
    "overflow",
    "bad_prev",
    "invalid_utf8",
    "escaped_ascii",
    "escaped_unicode",
    "float_form",
    "orjson_small_float",
    "orjson_big_float",
    "orjson_exponent",
    "big_int",
    "minus_zero",
    "python_bool",
    "too_deep",
    "not_object",
    "later_seed",
    "empty_line",
    "carriage_return",
    "two_objects",
    "split_object",
    "trailing_space",
    "leading_space",
    "tab",
    "byte_order_mark",
    "escaped_slash",
    "upper_hex_escape",
    "lone_surrogate",
    "tiny_float",
)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**20), max_value=10**20)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10)
)
values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=8,
)


def _can_write(record: dict[str, Any]) -> bool:
    try:
        canonical_bytes(record)
    except Refusal:  # a lone surrogate: the writer refuses it, so no log holds it
        return False
    return True


records = st.dictionaries(
    st.text(max_size=6).filter(lambda k: k not in ("prev", "seed")), values, max_size=4
).filter(_can_write)


def _corrupt(kind: str, obj: dict[str, Any], canon: bytes) -> bytes:
    """Line `canon` (the canonical form of `obj`) broken in the way `kind` names."""
    if kind == "truncated":
        return canon[:-1]
    if kind == "spacing":
        return json.dumps(obj, sort_keys=True, ensure_ascii=False).encode()
    if kind == "key_order":
        return json.dumps(
            dict(reversed(obj.items())), separators=(",", ":"), ensure_ascii=False
        ).encode()
    if kind == "duplicate_key":
        return canon[:-1] + b',"prev":"' + str(obj["prev"]).encode() + b'"}'
    if kind == "nan":
        return canon[:-1] + b',"~":NaN}'
    if kind == "infinity":
        return canon[:-1] + b',"~":-Infinity}'
    if kind == "overflow":
        return canon[:-1] + b',"~":1e400}'
    if kind == "bad_prev":
        return canonical_bytes({**obj, "prev": _sha(canon)})
    if kind == "invalid_utf8":
        return canon.replace(b'"prev":"', b'"prev":"\xc3')
    if kind == "escaped_ascii":
        return canon.replace(b'"prev"', b'"\\u0070rev"')
    if kind == "escaped_unicode":
        return canonical_bytes({**obj, "~": "é"}).replace("é".encode(), b"\\u00e9")
    if kind == "float_form":
        return canonical_bytes({**obj, "~": 0.5}).replace(b'"~":0.5', b'"~":5e-1')
    if kind == "orjson_small_float":  # orjson's notation for 1e-05
        return canonical_bytes({**obj, "~": 1e-05}).replace(b'"~":1e-05', b'"~":0.00001')
    if kind == "orjson_big_float":  # orjson's notation for 1e+16
        return canonical_bytes({**obj, "~": 1e16}).replace(b'"~":1e+16', b'"~":1e16')
    if kind == "orjson_exponent":  # orjson's notation for 1.5e-07
        return canonical_bytes({**obj, "~": [1.5e-07]}).replace(b"1.5e-07", b"1.5e-7")
    if kind == "big_int":  # canonical: beyond 64 bits, where orjson parses a float
        return canonical_bytes({**obj, "~": 2**64 + 1})
    if kind == "minus_zero":
        return canonical_bytes({**obj, "~": 0}).replace(b'"~":0', b'"~":-0')
    if kind == "python_bool":
        return canonical_bytes({**obj, "~": True}).replace(b'"~":true', b'"~":True')
    if kind == "too_deep":
        return canon[:-1] + b',"~":' + b"[" * 64 + b"]" * 64 + b"}"
    if kind == "not_object":
        return b"[" + canon + b"]"
    if kind == "later_seed":
        return canonical_bytes({**obj, "seed": SEED})
    if kind == "empty_line":
        return b""
    if kind == "carriage_return":
        return canon + b"\r"
    if kind == "two_objects":
        return canon + b"," + canon
    if kind == "split_object":  # this line and the next parse only together
        return canon[:-1] + b',"~":['
    if kind == "trailing_space":
        return canon + b" "
    if kind == "leading_space":
        return b" " + canon
    if kind == "tab":
        return canon.replace(b'"prev":', b'"prev":\t', 1)
    if kind == "byte_order_mark":
        return b"\xef\xbb\xbf" + canon
    if kind == "escaped_slash":
        return canonical_bytes({**obj, "~": "a/b"}).replace(b'"a/b"', b'"a\\/b"')
    if kind == "upper_hex_escape":  # canonical escapes are lower case: \u001f
        return canonical_bytes({**obj, "~": "\x1f"}).replace(b"\\u001f", b"\\u001F")
    if kind == "lone_surrogate":
        return canon[:-1] + b',"~":"\\ud800"}'
    if kind == "tiny_float":  # canonical: Python writes 1e-05, orjson 0.00001
        return canonical_bytes({**obj, "~": [1e-05, 2.5e-07]})
    raise AssertionError(kind)


def _log(objs: list[dict[str, Any]], kind: str, where: int, relink: bool) -> bytes:
    """A chained log of `objs` with line `where` broken as `kind`; later lines link to the broken line when `relink`."""
    out: list[bytes] = []
    prev = seed_hash(SEED)
    intact_prev = prev
    for k, record in enumerate(objs):
        obj = {
            **record,
            "prev": prev if relink else intact_prev,
            **({"seed": SEED} if k == 0 else {}),
        }
        canon = canonical_bytes(obj)
        raw = canon
        if k == where and kind not in ("none", "torn_tail"):
            raw = _corrupt(kind, obj, canon)
            if kind == "split_object" and k + 1 < len(objs):
                out.append(raw)
                raw = b"1]}"
        out.append(raw)
        prev = _sha(raw)
        intact_prev = _sha(canon)
    data = b"".join(line + b"\n" for line in out)
    if kind == "torn_tail":
        data = data[: len(data) - 1 - where % max(1, len(out[-1]))]
    return data


def _scan(
    path: Path,
    seed: str | None,
    *,
    block: bool,
    cores: int | None,
    keep: bool,
    use_orjson: bool = True,
) -> tuple[ChainStatus, int, Any]:
    with ExitStack() as stack:
        if not use_orjson:
            stack.enter_context(mock.patch.object(chain_read, "_orjson", lambda: None))
        stack.enter_context(
            mock.patch.object(chain_read, "_PAR_MIN_BYTES", 0 if cores else 1 << 62)
        )
        if cores:
            stack.enter_context(mock.patch.object(chain_read, "_PAR_MIN_PIECE", 1))
            stack.enter_context(mock.patch.object(chain_read, "_PAR_CORES", cores))
            stack.enter_context(mock.patch("threading.active_count", return_value=1))
        if not block:
            stack.enter_context(mock.patch.object(chain_read, "_fast_block", return_value=None))
        scan = chain_read._scan_path(path, seed, keep=keep)
    return scan.status(), scan.intact_bytes, scan.records


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    objs=st.lists(records, min_size=1, max_size=30),
    kind=st.sampled_from(CORRUPTIONS),
    where=st.integers(min_value=0, max_value=10**6),
    relink=st.booleans(),
    seeded=st.booleans(),
    chunk=st.sampled_from([9, 200, 1 << 20]),
    cores=st.sampled_from([None, 2, 3]),
    use_orjson=st.booleans(),
)
def test_the_block_path_and_the_line_reader_agree_on_every_corruption(
    tmp_path_factory: pytest.TempPathFactory,
    objs: list[dict[str, Any]],
    kind: str,
    where: int,
    relink: bool,
    seeded: bool,
    chunk: int,
    cores: int | None,
    use_orjson: bool,
) -> None:
    """Same status (problem kind and line), intact bytes and records, serially and in forked pieces."""
    path = tmp_path_factory.mktemp("agree") / "log.jsonl"
    path.write_bytes(_log(objs, kind, where % len(objs), relink))
    seed = SEED if seeded else None
    with mock.patch.object(chain_read, "_CHUNK", chunk):
        want = _scan(path, seed, block=False, cores=None, keep=False)
        got = _scan(path, seed, block=True, cores=cores, keep=False, use_orjson=use_orjson)
        assert got == want
        kept = _scan(path, seed, block=True, cores=None, keep=True)
        assert kept[:2] == want[:2]
        assert kept == _scan(path, seed, block=False, cores=None, keep=True)
    if kind == "none":
        assert want[0].ok and want[0].lines == len(objs)
    elif kind in (
        "bad_prev",
        "truncated",
        "spacing",
        "nan",
        "too_deep",
        "not_object",
        "empty_line",
    ) or (kind == "later_seed" and where % len(objs)):
        assert want[0].problem is not None and want[0].problem.line == where % len(objs) + 1


def test_a_corrupted_line_deep_in_many_blocks_is_named_by_the_block_path(tmp_path: Path) -> None:
    """Each corruption, planted in line 2,501 of 4,000: the block path hands that block to the line reader."""
    objs = [{"i": i, "t": "é" * (i % 5), "x": i / 7} for i in range(4000)]
    for kind, use_orjson in itertools.product(CORRUPTIONS, (True, False)):
        path = tmp_path / f"{kind}.jsonl"
        path.write_bytes(_log(objs, kind, 2500, relink=True))
        want = _scan(path, SEED, block=False, cores=None, keep=False)
        got = _scan(path, SEED, block=True, cores=None, keep=False, use_orjson=use_orjson)
        assert got == want, kind
        if kind in ("none", "big_int", "tiny_float"):
            assert got[0].ok and got[0].lines == 4000
        elif kind == "torn_tail":
            assert got[0].problem is not None and got[0].problem.kind == "torn_tail"
        elif kind in (
            "escaped_ascii",
            "escaped_unicode",
            "float_form",
            "orjson_small_float",
            "orjson_big_float",
            "orjson_exponent",
            "minus_zero",
            "spacing",
            "key_order",
            "trailing_space",
            "leading_space",
            "tab",
            "escaped_slash",
            "upper_hex_escape",
            "lone_surrogate",
        ):
            assert got[0].problem is not None and got[0].problem.kind == "not_canonical", kind
            assert got[0].problem.line == 2501
        else:
            assert got[0].problem is not None and got[0].problem.line == 2501, kind


@settings(max_examples=300, deadline=None)
@given(value=values)
def test_the_readers_encoder_is_canonical_bytes(value: Any) -> None:
    """What the reader compares lines with is exactly what the writer writes, or can never match a line."""
    try:
        want = canonical_bytes(value)
    except Refusal:  # a lone surrogate: no decoded line holds one, so no line matches
        got = chain_read._encode(value)
        with pytest.raises(UnicodeEncodeError):
            got.encode("utf-8")
        return
    assert chain_read._encode(value).encode("utf-8") == want


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_the_readers_encoder_refuses_what_the_writer_refuses(bad: float) -> None:
    with pytest.raises(ValueError):
        chain_read._encode({"x": bad})
    with pytest.raises(Refusal):
        canonical_bytes({"x": bad})


def test_a_line_nested_exactly_max_depth_passes_and_one_deeper_is_refused(tmp_path: Path) -> None:
    objs: list[dict[str, Any]] = [{"i": i} for i in range(3000)]
    for extra, ok in ((63, True), (64, False)):
        deep = [dict(o) for o in objs]
        nested: Any = []
        for _ in range(extra - 1):
            nested = [nested]
        deep[2000]["deep"] = nested  # the object, then `extra` levels of arrays
        lines: list[bytes] = []
        prev = seed_hash(SEED)
        for k, obj in enumerate(deep):
            raw = canonical_bytes({**obj, "prev": prev, **({"seed": SEED} if k == 0 else {})})
            lines.append(raw)
            prev = _sha(raw)
        path = tmp_path / f"deep{extra}.jsonl"
        path.write_bytes(b"".join(line + b"\n" for line in lines))
        got = _scan(path, SEED, block=True, cores=None, keep=False)
        assert got == _scan(path, SEED, block=False, cores=None, keep=False)
        if ok:
            assert got[0].ok and len(read_log(path)) == 3000
        else:
            assert got[0].problem is not None
            assert (got[0].problem.kind, got[0].problem.line) == ("invalid_json", 2001)


def test_lines_that_only_parse_together_are_refused_even_with_every_link_in_place(
    tmp_path: Path,
) -> None:
    """Why the block path compares line by line: a block re-encoded as one array can hide a bad line.

    Lines 2 and 3 are one object split in two and line 4 holds two objects; joined with commas the
    four lines re-encode to exactly themselves and every `prev` links, yet lines 2 and 4 are not
    records. The line reader refuses line 2, and the block path must agree.
    """
    first = canonical_bytes({"i": 0, "prev": seed_hash(SEED), "seed": SEED})
    second = b'{"a":[{}'
    third = b'{}],"prev":"' + _sha(first).encode() + b'"}'
    fourth = canonical_bytes({"prev": _sha(second)}) + b"," + canonical_bytes({"prev": _sha(third)})
    joined = b"[" + b",".join([first, second, third, fourth]) + b"]"
    assert canonical_bytes(json.loads(joined)) == joined  # the trap: canonical as one array
    path = tmp_path / "log.jsonl"
    path.write_bytes(b"".join(line + b"\n" for line in [first, second, third, fourth]))
    for cores in (None, 2):
        got = _scan(path, SEED, block=True, cores=cores, keep=False)
        assert got == _scan(path, SEED, block=False, cores=None, keep=False)
        assert got[0].problem is not None
        assert (got[0].problem.kind, got[0].problem.line, got[0].lines) == ("invalid_json", 2, 1)


def test_an_intact_log_is_proved_canonical_by_orjson_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With orjson installed, verifying never falls back to the standard library's proof on an intact log."""
    assert chain_read._orjson() is not None  # a dependency (pyproject.toml)
    objs = [
        {"i": i, "t": "é\n" * (i % 3), "x": i / 7, "n": {"l": [i, 0.5, None]}} for i in range(3000)
    ]
    path = tmp_path / "log.jsonl"
    lines: list[bytes] = []
    prev = seed_hash(SEED)
    for k, obj in enumerate(objs):
        raw = canonical_bytes({**obj, "prev": prev, **({"seed": SEED} if k == 0 else {})})
        lines.append(raw)
        prev = _sha(raw)
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    std = mock.Mock(side_effect=AssertionError("the standard library's proof ran"))
    monkeypatch.setattr(chain_read, "_std_objects", std)
    status = _scan(path, SEED, block=True, cores=None, keep=False)[0]
    assert status.ok and status.lines == 3000 and status.head == prev


def test_orjson_writes_every_character_and_key_order_as_canonical_bytes() -> None:
    """Every code point (surrogates aside) escaped alike, and keys across the planes sorted alike."""
    orjson = chain_read._orjson()
    assert orjson is not None
    chars = [chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    assert orjson.dumps(chars) == canonical_bytes(chars)
    keys = dict.fromkeys([*chars[::97], "\uffff", "\U00010000", "\U0010ffff", "", "a", "ab"], 0)
    assert orjson.dumps(keys, option=orjson.OPT_SORT_KEYS) == canonical_bytes(keys)


@settings(max_examples=300, deadline=None)
@given(record=records, extra=st.floats(allow_nan=False, allow_infinity=False))
def test_the_orjson_proof_accepts_canonical_lines_and_refuses_orjson_notation(
    record: dict[str, Any], extra: float
) -> None:
    """A line passes exactly when it is canonical and orjson writes it byte for byte (floats outside
    1e-4..1e16 are written differently by orjson: those blocks go to the standard library's proof)."""
    orjson = chain_read._orjson()
    assert orjson is not None
    obj = {**record, "~": [extra]}
    line = canonical_bytes(obj)
    try:
        theirs: bytes | None = orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)
    except (
        TypeError
    ):  # an integer beyond 64 bits: orjson parses it as a float, which never round-trips
        theirs = None
    assert (chain_read._orjson_objects(line, 1) is not None) == (theirs == line)
    if theirs is not None:
        assert (chain_read._orjson_objects(theirs, 1) is not None) == (theirs == line)


@settings(max_examples=500, deadline=None)
@given(
    x=st.floats(min_value=1e-4, max_value=1e16, exclude_max=True)
    | st.floats(min_value=-1e16, max_value=-1e-4, exclude_min=True)
    | st.sampled_from([0.0, -0.0])
)
def test_orjson_writes_floats_without_an_exponent_as_python_does(x: float) -> None:
    """The premise of routing only blocks without "e-" and "e+" to orjson's proof."""
    orjson = chain_read._orjson()
    assert orjson is not None
    assert "e" not in repr(x)
    assert orjson.dumps(x) == repr(x).encode()


def test_orjson_is_not_used_when_it_writes_differently(monkeypatch: pytest.MonkeyPatch) -> None:
    orjson = chain_read._orjson()
    assert orjson is not None
    monkeypatch.setattr(orjson, "dumps", lambda obj, option=None: b"{}")
    assert chain_read._load_orjson() is None


def _chain_lines(objs: list[dict[str, Any]]) -> tuple[bytes, str]:
    """A canonical chained log of `objs` (seeded with SEED) and its head."""
    lines: list[bytes] = []
    prev = seed_hash(SEED)
    for k, obj in enumerate(objs):
        raw = canonical_bytes({**obj, "prev": prev, **({"seed": SEED} if k == 0 else {})})
        lines.append(raw)
        prev = _sha(raw)
    return b"".join(line + b"\n" for line in lines), prev


def test_after_a_block_needs_the_standard_proof_only_blocks_without_exponents_try_orjson(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The route: blocks whose floats need an exponent are proved by the standard library without
    a wasted orjson attempt once one block has needed it; blocks without one still use orjson."""
    objs = [{"i": i, "x": 1e-05 if (i // 500) % 2 == 0 else 0.5} for i in range(3000)]
    data, head = _chain_lines(objs)
    path = tmp_path / "log.jsonl"
    path.write_bytes(data)
    tried: list[bool] = []  # per orjson attempt: did the block hold an exponent
    proved: list[bool] = []  # per standard-library proof: the same
    orjson_objects, std_objects = chain_read._orjson_objects, chain_read._std_objects

    def spy_orjson(body: bytes, count: int) -> Any:
        tried.append(b"e-" in body)
        return orjson_objects(body, count)

    def spy_std(block: bytes, count: int) -> Any:
        proved.append(b"e-" in block)
        return std_objects(block, count)

    monkeypatch.setattr(chain_read, "_orjson_objects", spy_orjson)
    monkeypatch.setattr(chain_read, "_std_objects", spy_std)
    monkeypatch.setattr(chain_read, "_CHUNK", 4096)
    for cores in (None, 2):
        tried.clear()
        proved.clear()
        status = _scan(path, SEED, block=True, cores=cores, keep=False)[0]
        assert status.ok and status.lines == 3000 and status.head == head
        assert all(proved) and len(proved) > 10  # only blocks with an exponent needed the standard proof
        pieces = 1 if cores is None else cores
        assert 1 <= tried.count(True) <= pieces  # one wasted orjson attempt per scan or piece
        # the blocks without one are proved by orjson (in pieces, only the parent's piece is counted here)
        assert tried.count(False) > (10 if cores is None else 3)


@settings(max_examples=200, deadline=None)
@given(
    floats=st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=5),
    nested=st.booleans(),
)
def test_the_float_finder_finds_every_float(floats: list[float], nested: bool) -> None:
    """`_floats` over flat and nested records: the same floats (as bit patterns) as a plain walk."""
    obj: dict[str, Any] = {f"k{i}": x for i, x in enumerate(floats)}
    if nested:
        obj = {"a": [obj, {"b": floats[:1]}], "c": 1, "d": "x"}
    want: list[float] = []
    stack: list[Any] = [obj]
    while stack:
        node = stack.pop()
        if type(node) is float:
            want.append(node)
        elif type(node) is dict:
            stack.extend(node.values())
        elif type(node) is list:
            stack.extend(node)
    assert sorted(map(float.hex, chain_read._floats([obj, {"z": 2}]))) == sorted(map(float.hex, want))


@pytest.mark.parametrize(
    ("line", "ok"),
    [
        (b'{"a":0.0,"b":-0.0,"c":[0.5,0.5,-0.0]}', True),
        (b'{"a":-0.0,"b":0.0}', True),
        (b'{"a":0.00001,"b":[0.00001,0.5]}', False),  # orjson's notation of 1e-05, repeated
        (b'{"a":0.5,"b":{"c":[0.5,1e-7]}}', False),  # orjson's 1e-07, deep, beside a repeat
        (b'{"a":1e-05,"b":1e-05}', False),  # canonical, but orjson writes it otherwise: not its proof
    ],
)
def test_the_orjson_proof_checks_each_distinct_float_and_both_zeros(line: bytes, ok: bool) -> None:
    assert (chain_read._orjson_objects(line, 1) is not None) == ok
    assert (chain_read.check_form(line).obj is not None) == (ok or line.startswith(b'{"a":1e-05'))
