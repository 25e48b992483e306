"""Strict reading of saved inputs and canonical JSON (DESIGN.md, "Reading saved inputs")."""

from __future__ import annotations

import hashlib
import math
import os
import socket
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.errors import Refusal
from harness.evidence.jsonio import (
    MAX_DEPTH,
    Loaded,
    canonical_bytes,
    canonical_line,
    loads_strict,
    read_bytes,
    read_json,
    sha256_hex,
)

# --------------------------------------------------------------------------- read_bytes


def _refused(code: str, path: Path | str, **kwargs: Any) -> Refusal:
    with pytest.raises(Refusal) as info:
        read_bytes(path, **kwargs)
    assert info.value.code == code, info.value.to_json()
    assert info.value.path == os.fspath(path)
    return info.value


def test_reads_regular_file(tmp_path: Path) -> None:
    f = tmp_path / "a.json"
    f.write_bytes(b'{"a": 1}\n')
    assert read_bytes(f) == b'{"a": 1}\n'
    assert read_bytes(str(f)) == b'{"a": 1}\n'


def test_reads_empty_file(tmp_path: Path) -> None:
    f = tmp_path / "empty"
    f.write_bytes(b"")
    assert read_bytes(f) == b""


def test_reads_binary_larger_than_one_chunk(tmp_path: Path) -> None:
    data = os.urandom((1 << 20) * 2 + 17)
    f = tmp_path / "big"
    f.write_bytes(data)
    assert read_bytes(f) == data


def test_file_missing(tmp_path: Path) -> None:
    _refused("file_missing", tmp_path / "nope.json")


def test_file_missing_parent_missing(tmp_path: Path) -> None:
    _refused("file_missing", tmp_path / "no" / "such" / "file.json")


def test_dangling_link(tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "gone")
    refusal = _refused("dangling_link", link)
    assert "gone" in refusal.message


def test_dangling_relative_link(tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to("missing-target")
    _refused("dangling_link", link)


def test_link_loop(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.symlink_to(b)
    b.symlink_to(a)
    _refused("link_loop", a)


def test_self_link_loop(tmp_path: Path) -> None:
    a = tmp_path / "self"
    a.symlink_to(a)
    _refused("link_loop", a)


def test_folder_refused(tmp_path: Path) -> None:
    folder = tmp_path / "dir"
    folder.mkdir()
    refusal = _refused("not_a_regular_file", folder)
    assert "folder" in refusal.message


def test_link_to_folder_refused(tmp_path: Path) -> None:
    folder = tmp_path / "dir"
    folder.mkdir()
    link = tmp_path / "link"
    link.symlink_to(folder)
    _refused("not_a_regular_file", link)


def _read_in_thread(path: Path, timeout: float = 5.0) -> BaseException | bytes:
    """Run read_bytes in a daemon thread so a blocking open cannot hang the suite."""
    result: list[BaseException | bytes] = []

    def target() -> None:
        try:
            result.append(read_bytes(path))
        except BaseException as exc:
            result.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        # Unblock a reader stuck in open() by opening the write end, then fail.
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        thread.join(timeout)
        pytest.fail("read_bytes blocked on a FIFO with no writer")
    return result[0]


@pytest.mark.timeout(20)
def test_fifo_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    outcome = _read_in_thread(fifo)
    assert isinstance(outcome, Refusal)
    assert outcome.code == "not_a_regular_file"
    assert outcome.path == str(fifo)
    assert "FIFO" in outcome.message


@pytest.mark.timeout(20)
def test_link_to_fifo_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    link = tmp_path / "link"
    link.symlink_to(fifo)
    outcome = _read_in_thread(link)
    assert isinstance(outcome, Refusal)
    assert outcome.code == "not_a_regular_file"
    assert outcome.path == str(link)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # AF_UNIX paths are limited to ~108 bytes; tmp_path can be longer.
    with tempfile.TemporaryDirectory(prefix="pj", dir="/tmp") as d:
        yield Path(d)


def test_unix_socket_refused(short_dir: Path) -> None:
    path = short_dir / "s"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        sock.listen(1)
        _refused("not_a_regular_file", path)
    finally:
        sock.close()


@pytest.mark.parametrize("device", ["/dev/null", "/dev/zero"])
def test_character_device_refused(device: str) -> None:
    if not os.path.exists(device):
        pytest.skip(f"{device} not present")
    refusal = _refused("not_a_regular_file", device)
    assert "character device" in refusal.message


def test_file_too_large(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"x" * 11)
    _refused("file_too_large", f, max_bytes=10)


def test_file_exactly_max_bytes_accepted(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"x" * 10)
    assert read_bytes(f, max_bytes=10) == b"x" * 10


def test_file_too_large_when_size_is_understated() -> None:
    # /proc files report st_size 0 but have content: the read loop must still stop.
    proc = "/proc/self/status"
    if not os.path.isfile(proc):
        pytest.skip("no /proc")
    _refused("file_too_large", proc, max_bytes=10)


def test_link_to_regular_file_is_followed(tmp_path: Path) -> None:
    f = tmp_path / "real.json"
    f.write_bytes(b"{}")
    link = tmp_path / "link.json"
    link.symlink_to(f)
    chain = tmp_path / "link2.json"
    chain.symlink_to("link.json")
    assert read_bytes(link) == b"{}"
    assert read_bytes(chain) == b"{}"


def test_path_through_a_file_is_refused_by_name(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_bytes(b"")
    with pytest.raises(Refusal) as info:
        read_bytes(f / "child")
    assert info.value.path == str(f / "child")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads anything")
def test_unreadable_file(tmp_path: Path) -> None:
    f = tmp_path / "secret"
    f.write_bytes(b"{}")
    f.chmod(0)
    _refused("file_unreadable", f)


# --------------------------------------------------------------------------- loads_strict


def _loads_refused(code: str, data: bytes, **kwargs: Any) -> Refusal:
    with pytest.raises(Refusal) as info:
        loads_strict(data, **kwargs)
    assert info.value.code == code, info.value.to_json()
    return info.value


def test_loads_plain_object() -> None:
    assert loads_strict(b'{"a": [1, 2.5, "x", null, true, false], "b": {}}') == {
        "a": [1, 2.5, "x", None, True, False],
        "b": {},
    }


@pytest.mark.parametrize(
    "data",
    [
        b'{"a": 1, "a": 2}',
        b'{"a": 1, "a": 1}',
        b'{"a": {"b": 1, "b": 2}}',
        b'{"a": [{"x": 0}, {"y": 1, "y": 1}]}',
        b'{"\\u0061": 1, "a": 2}',  # the same key, once escaped
    ],
)
def test_duplicate_keys_refused(data: bytes) -> None:
    _loads_refused("json_duplicate_key", data)


def test_duplicate_keys_in_top_level_array_refused() -> None:
    _loads_refused("json_duplicate_key", b'[{"k": 1, "k": 2}]', expect_object=False)


def test_keys_differing_in_case_are_distinct() -> None:
    assert loads_strict(b'{"a": 1, "A": 2}') == {"a": 1, "A": 2}


@pytest.mark.parametrize(
    "data",
    [
        b'{"a": NaN}',
        b'{"a": Infinity}',
        b'{"a": -Infinity}',
        b'{"a": [1, {"b": NaN}]}',
    ],
)
def test_non_finite_constants_refused(data: bytes) -> None:
    _loads_refused("json_non_finite", data)


@pytest.mark.parametrize("text", [b"NaN", b"Infinity", b"-Infinity"])
def test_non_finite_top_level_refused(text: bytes) -> None:
    _loads_refused("json_non_finite", text, expect_object=False)


@pytest.mark.parametrize("number", [b"1e400", b"-1e400", b"1E400", b"123456789.0e999"])
def test_float_overflow_refused(number: bytes) -> None:
    _loads_refused("json_non_finite", b'{"a": ' + number + b"}")


def test_float_underflow_is_zero() -> None:
    assert loads_strict(b'{"a": 1e-400}') == {"a": 0.0}


def test_nan_as_string_is_fine() -> None:
    assert loads_strict(b'{"a": "NaN", "b": "Infinity"}') == {"a": "NaN", "b": "Infinity"}


def test_integer_beyond_digit_limit_refused() -> None:
    limit = sys.get_int_max_str_digits()
    if limit == 0:
        pytest.skip("no integer digit limit in this interpreter")
    refusal = _loads_refused("invalid_json", b'{"a": ' + b"9" * (limit + 1) + b"}", path="x.json")
    assert refusal.path == "x.json"
    _loads_refused("invalid_json", b"1" * (limit + 1), expect_object=False)
    # exactly at the limit is a valid integer
    assert loads_strict(b"7" * limit, expect_object=False) == int("7" * limit)


@pytest.mark.parametrize(
    "data",
    [
        b"\xff",
        b'{"a": "\xff"}',
        b'{"a": "\xc0\xaf"}',  # overlong '/'
        b'{"a": "\xe0\x80\xaf"}',  # overlong 3-byte '/'
        b'{"a": "\xed\xa0\x80"}',  # a lone surrogate, UTF-8 encoded
        b'{"a": "\xe2\x82"}',  # truncated sequence
        b'{"\xf5\x80\x80\x80": 1}',  # beyond U+10FFFF, in a key
        b"\xff\xfe{\x00}\x00",  # UTF-16 with BOM
    ],
)
def test_invalid_utf8_refused(data: bytes) -> None:
    _loads_refused("invalid_utf8", data)


def test_bom_refused() -> None:
    _loads_refused("invalid_json", b"\xef\xbb\xbf{}")


def test_non_ascii_utf8_accepted() -> None:
    assert loads_strict('{"clé": "ü€😀"}'.encode()) == {"clé": "ü€😀"}


@pytest.mark.parametrize(
    "data",
    [b"", b" ", b"{", b"{'a': 1}", b'{"a": 1,}', b"{} {}", b'{"a" 1}', b"[1,]", b"01"],
)
def test_invalid_json_refused(data: bytes) -> None:
    _loads_refused("invalid_json", data, expect_object=False)


def _nested_arrays(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def _nested_objects(depth: int) -> bytes:
    return b'{"a":' * (depth - 1) + b"{}" + b"}" * (depth - 1)


@pytest.mark.parametrize("build", [_nested_arrays, _nested_objects])
def test_depth_limit_exact(build: Any) -> None:
    assert loads_strict(build(MAX_DEPTH), expect_object=False) is not None
    _loads_refused("json_too_deep", build(MAX_DEPTH + 1), expect_object=False)


def test_depth_counts_containers_not_scalars() -> None:
    assert loads_strict(b"[[[1]]]", expect_object=False, max_depth=3) == [[[1]]]
    _loads_refused("json_too_deep", b"[[[[]]]]", expect_object=False, max_depth=3)


def test_depth_mixed_arrays_and_objects() -> None:
    ok = b'{"a":[' * (MAX_DEPTH // 2) + b"0" + b"]}" * (MAX_DEPTH // 2)
    assert loads_strict(ok) is not None
    deep = b'{"a":[' * (MAX_DEPTH // 2) + b"{}" + b"]}" * (MAX_DEPTH // 2)
    _loads_refused("json_too_deep", deep)


def test_deep_branch_beside_shallow_ones() -> None:
    data = b'{"x": 1, "y": [[]], "z": ' + _nested_arrays(MAX_DEPTH) + b"}"
    _loads_refused("json_too_deep", data)


@pytest.mark.parametrize(
    "data",
    [
        _nested_arrays(100_000),
        _nested_objects(100_000),
        b"[" * 100_000,  # unclosed as well as deep
    ],
)
def test_very_deep_nesting_refused_without_recursion_error(data: bytes) -> None:
    with pytest.raises(Refusal) as info:
        loads_strict(data, expect_object=False, path="deep.json")
    assert info.value.code in {"json_too_deep", "invalid_json"}
    assert info.value.path == "deep.json"
    if data.endswith(b"]") or data.endswith(b"}"):
        assert info.value.code == "json_too_deep"


@pytest.mark.parametrize("data", [b"[]", b"1", b"null", b'"s"', b"true", b"1.5"])
def test_expect_object(data: bytes) -> None:
    _loads_refused("json_not_object", data)
    _loads_refused("json_not_object", data, expect_object=True)
    assert loads_strict(data, expect_object=False) == __import__("json").loads(data)


def test_expect_object_accepts_object() -> None:
    assert loads_strict(b"{}") == {}
    assert loads_strict(b"{}", expect_object=False) == {}


_BAD_INPUTS = [
    (b'{"a":1,"a":2}', "json_duplicate_key"),
    (b'{"a":NaN}', "json_non_finite"),
    (b'{"a":1e400}', "json_non_finite"),
    (b"\xff", "invalid_utf8"),
    (b"\xef\xbb\xbf{}", "invalid_json"),
    (b"{", "invalid_json"),
    (_nested_arrays(MAX_DEPTH + 1), "json_too_deep"),
    (_nested_arrays(100_000), "json_too_deep"),
    (b"[]", "json_not_object"),
]


@pytest.mark.parametrize(("data", "code"), _BAD_INPUTS)
def test_every_refusal_carries_the_path(data: bytes, code: str, tmp_path: Path) -> None:
    where = tmp_path / "input.json"
    assert _loads_refused(code, data, path=where).path == str(where)
    assert _loads_refused(code, data, path=str(where)).path == str(where)
    assert _loads_refused(code, data).path is None


@pytest.mark.parametrize(("data", "code"), _BAD_INPUTS)
def test_read_json_refusals_carry_the_path(data: bytes, code: str, tmp_path: Path) -> None:
    where = tmp_path / "input.json"
    where.write_bytes(data)
    with pytest.raises(Refusal) as info:
        read_json(where)
    assert info.value.code == code
    assert info.value.path == str(where)


# --------------------------------------------------------------------------- canonical_bytes

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
json_values = st.recursive(
    _scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(), children, max_size=5)
    ),
    max_leaves=25,
)


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def _same(a: Any, b: Any) -> bool:
    """Equality that also tells bool from int from float (1 == 1.0 == True in Python)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    return bool(a == b)


@settings(max_examples=150, deadline=None)
@given(json_values)
def test_canonical_round_trip(value: Any) -> None:
    if _depth(value) > MAX_DEPTH:
        return
    data = canonical_bytes(value)
    decoded = loads_strict(data, expect_object=False)
    assert decoded == value
    assert _same(decoded, value)
    assert canonical_bytes(decoded) == data


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.text(), _scalars, max_size=8), st.randoms(use_true_random=False))
def test_canonical_key_order_does_not_matter(mapping: dict[str, Any], rnd: Any) -> None:
    items = list(mapping.items())
    rnd.shuffle(items)
    shuffled = dict(items)
    assert canonical_bytes(shuffled) == canonical_bytes(mapping)
    nested = {"outer": shuffled, "list": [shuffled]}
    assert canonical_bytes(nested) == canonical_bytes({"list": [mapping], "outer": mapping})


def test_canonical_form_is_compact_sorted_utf8() -> None:
    assert canonical_bytes({"b": 1, "a": [1, 2], "c": {"z": None, "y": True}}) == (
        b'{"a":[1,2],"b":1,"c":{"y":true,"z":null}}'
    )
    assert canonical_bytes({"é": "ü😀"}) == '{"é":"ü😀"}'.encode()
    assert canonical_line({"a": 1}) == b'{"a":1}\n'


@pytest.mark.parametrize(
    "value",
    [math.nan, math.inf, -math.inf, {"a": math.nan}, [1, [math.inf]], {"a": {"b": -math.inf}}],
)
def test_canonical_refuses_non_finite(value: Any) -> None:
    with pytest.raises(Refusal) as info:
        canonical_bytes(value)
    assert info.value.code == "json_non_finite"
    with pytest.raises(Refusal):
        canonical_line(value)


def test_canonical_refuses_lone_surrogate_without_traceback() -> None:
    # A "\\ud800" escape is valid JSON syntax and decodes to a lone surrogate,
    # which cannot be written as UTF-8: a named refusal, not a UnicodeEncodeError.
    value = loads_strict(b'{"a": "\\ud800"}')
    with pytest.raises(Refusal) as info:
        canonical_bytes(value)
    assert info.value.code == "invalid_utf8"


def test_escaped_surrogate_pair_round_trips() -> None:
    value = loads_strict(b'{"a": "\\ud83d\\ude00"}')
    assert value == {"a": "😀"}
    assert canonical_bytes(value) == '{"a":"😀"}'.encode()


# --------------------------------------------------------------------------- read_json


def test_read_json_hashes_exactly_the_bytes_read(tmp_path: Path) -> None:
    raw = '  {"b": 2,\n "a": "é"}\n\n'.encode()
    f = tmp_path / "x.json"
    f.write_bytes(raw)
    loaded = read_json(f)
    assert isinstance(loaded, Loaded)
    assert loaded.raw == raw
    assert loaded.sha256 == hashlib.sha256(raw).hexdigest() == sha256_hex(raw)
    assert loaded.value == {"a": "é", "b": 2}
    # not the hash of the canonical form
    assert loaded.sha256 != sha256_hex(canonical_bytes(loaded.value))


def test_read_json_through_link_hashes_target_bytes(tmp_path: Path) -> None:
    f = tmp_path / "x.json"
    f.write_bytes(b'{"a":1}')
    link = tmp_path / "l.json"
    link.symlink_to(f)
    assert read_json(link).sha256 == sha256_hex(b'{"a":1}')


def test_read_json_reads_the_file_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "x.json"
    f.write_bytes(b'{"a":1}')
    opens: list[str] = []
    real_open = os.open

    def counting_open(path: Any, *args: Any, **kwargs: Any) -> int:
        opens.append(os.fspath(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", counting_open)
    read_json(f)
    assert opens == [str(f)]


def test_read_json_options(tmp_path: Path) -> None:
    f = tmp_path / "x.json"
    f.write_bytes(b"[[1]]")
    with pytest.raises(Refusal) as info:
        read_json(f)
    assert info.value.code == "json_not_object"
    assert read_json(f, expect_object=False).value == [[1]]
    with pytest.raises(Refusal) as info:
        read_json(f, expect_object=False, max_depth=1)
    assert info.value.code == "json_too_deep"
    with pytest.raises(Refusal) as info:
        read_json(f, expect_object=False, max_bytes=4)
    assert info.value.code == "file_too_large"


def test_read_json_missing_file(tmp_path: Path) -> None:
    with pytest.raises(Refusal) as info:
        read_json(tmp_path / "missing.json")
    assert info.value.code == "file_missing"
    assert info.value.path == str(tmp_path / "missing.json")
