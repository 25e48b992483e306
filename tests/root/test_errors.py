"""Refusals: the JSON shape every command prints under --json (DESIGN.md, Commands)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness import errors
from harness.errors import Refusal


def test_exit_codes() -> None:
    codes = [
        errors.EXIT_OK,
        errors.EXIT_FAILED,
        errors.EXIT_USAGE,
        errors.EXIT_REFUSED,
        errors.EXIT_INTERNAL,
    ]
    assert codes == [0, 1, 2, 3, 4]


def test_refusal_is_an_exception() -> None:
    refusal = Refusal("file_missing", "no such file", "a.json")
    assert isinstance(refusal, Exception)
    assert str(refusal) == "file_missing: no such file"
    assert refusal.code == "file_missing"
    assert refusal.message == "no such file"
    assert refusal.path == "a.json"
    assert refusal.details == {}
    with pytest.raises(Refusal):
        raise refusal


def test_to_json_without_path() -> None:
    out = Refusal("json_not_object", "expected an object").to_json()
    assert out == {"ok": False, "refusal": "json_not_object", "message": "expected an object"}
    assert "path" not in out
    assert list(out) == ["ok", "refusal", "message"]


def test_to_json_with_path() -> None:
    out = Refusal("file_missing", "no such file", "/x/a.json").to_json()
    assert out == {
        "ok": False,
        "refusal": "file_missing",
        "message": "no such file",
        "path": "/x/a.json",
    }


def test_empty_path_is_kept() -> None:
    assert Refusal("c", "m", "").to_json()["path"] == ""


def test_to_json_merges_details() -> None:
    out = Refusal(
        "torn_tail", "last line has no newline", "log.jsonl", line=7, problems=["a", "b"]
    ).to_json()
    assert out == {
        "ok": False,
        "refusal": "torn_tail",
        "message": "last line has no newline",
        "path": "log.jsonl",
        "line": 7,
        "problems": ["a", "b"],
    }
    assert Refusal("c", "m", count=0).to_json() == {
        "ok": False,
        "refusal": "c",
        "message": "m",
        "count": 0,
    }


def test_to_json_is_fresh_each_time() -> None:
    refusal = Refusal("c", "m", "p", n=1)
    first = refusal.to_json()
    first["n"] = 2
    assert refusal.to_json()["n"] == 1


def test_pathlike_paths(tmp_path: Path) -> None:
    assert Refusal("c", "m", tmp_path / "a.json").path == str(tmp_path / "a.json")


class _BytesPathLike:
    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    def __fspath__(self) -> bytes:
        return self.raw


@pytest.mark.parametrize(
    ("path", "text"),
    [
        (b"/tmp/a.json", "/tmp/a.json"),
        ("/tmp/café".encode(), "/tmp/café"),
        (b"/tmp/\xff.json", "/tmp/\\xff.json"),
        (b"/tmp/\xc0\xaf", "/tmp/\\xc0\\xaf"),
        (_BytesPathLike(b"/tmp/\xfe"), "/tmp/\\xfe"),
        (os.fsdecode(b"/tmp/\xff.json"), "/tmp/\\xff.json"),  # surrogate escapes from the OS
        ("/tmp/café", "/tmp/café"),
        ("/tmp/\ud800", "/tmp/\\ud800"),  # a lone surrogate, e.g. decoded from a JSON escape
    ],
)
def test_paths_become_printable_text(path: object, text: str) -> None:
    refusal = Refusal("c", "m", path)  # type: ignore[arg-type]
    assert refusal.path == text
    _assert_printable(refusal)


def _assert_printable(refusal: Refusal) -> None:
    out = refusal.to_json()
    assert isinstance(out["path"], str)
    out["path"].encode("utf-8")  # strict: no surrogates left
    line = json.dumps(out, ensure_ascii=False).encode("utf-8")
    assert json.loads(line) == out


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=40))
def test_any_bytes_path_is_printable(raw: bytes) -> None:
    refusal = Refusal("c", "m", raw)
    _assert_printable(refusal)
    try:
        expected = raw.decode("utf-8")
    except UnicodeDecodeError:
        return
    assert refusal.path == expected


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=40))
def test_os_decoded_path_matches_bytes_path(raw: bytes) -> None:
    # A path the OS gave as str (surrogateescape) reads the same as its bytes.
    assert Refusal("c", "m", os.fsdecode(raw)).path == Refusal("c", "m", raw).path


@settings(max_examples=200, deadline=None)
@given(st.text(st.characters() | st.integers(0xD800, 0xDFFF).map(chr), max_size=30))
def test_any_str_path_is_printable(text: str) -> None:
    # st.characters() leaves out surrogates; add them, both escaped-byte and lone ones.
    refusal = Refusal("c", "m", text)
    _assert_printable(refusal)
    if not any(0xD800 <= ord(c) <= 0xDFFF for c in text):
        assert refusal.path == text
