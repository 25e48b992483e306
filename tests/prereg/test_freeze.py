"""Freeze, amend and the frozen check: any byte changed anywhere is refused, naming the file."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.errors import Refusal
from harness.evidence.chain import ChainedLog
from harness.evidence.chain_read import read_log
from harness.evidence.jsonio import canonical_line
from harness.prereg import freeze as prereg
from harness.prereg.check import check_prereg
from harness.prereg.freeze import amend, freeze
from harness.prereg.frozen import amendments_seed, check_frozen
from tests.support.cli import run_proctor
from tests.support.design import base_design, manifest, write_prereg
from tests.support.guard import guarded_env
from tests.support.paths import REPO

CATALOG = b"""
[[model]]
id = "sim-flash"
provider = "sim"
api_shape = "openai_chat"
base_url = "http://127.0.0.1:8765/v1"
credential_env = ""
pricing_key = "sim-flash"
lane = "flash"

[[model]]
id = "sim-k3"
provider = "sim"
api_shape = "openai_chat"
base_url = "http://127.0.0.1:8765/v1"
credential_env = ""
pricing_key = "sim-k3"
lane = "k3"
"""


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _refused(code: str, fn: Callable[[], Any]) -> Refusal:
    with pytest.raises(Refusal) as caught:
        fn()
    assert caught.value.code == code, caught.value.to_json()
    return caught.value


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A valid, unfrozen preregistration with a catalog and a notes file."""
    f = write_prereg(tmp_path)
    (f / "catalog.toml").write_bytes(CATALOG)
    (f / "notes.txt").write_bytes(b"pilot notes\n")
    return f


@pytest.fixture
def frozen(folder: Path) -> Path:
    freeze(folder)
    return folder


# --------------------------------------------------------------------------
# Freeze


def test_freeze_records_the_sha256_of_every_file(folder: Path) -> None:
    result = freeze(folder)
    raw = (folder / "FROZEN.json").read_bytes()
    doc = json.loads(raw)
    assert raw == canonical_line(doc)
    assert set(doc) == {"schema", "study", "frozen_at", "files", "amendments", "amendments_head"}
    assert doc["schema"] == "proctor-frozen.v1" and doc["study"] == "tiny" and doc["amendments"] == 0
    assert doc["amendments_head"] is None
    names = {"design.toml", "PREREG.md", "systems.json", "catalog.toml", "notes.txt"}
    assert doc["files"] == {n: _sha((folder / n).read_bytes()) for n in names}
    assert result["frozen"]["sha256"] == _sha(raw)
    assert (os.stat(folder / "FROZEN.json").st_mode & 0o777) == 0o644
    checked = check_frozen(folder)
    assert checked.frozen_sha256 == _sha(raw)
    assert checked.files == doc["files"] and checked.frozen_at == doc["frozen_at"]
    assert checked.design.study_id == "tiny" and checked.amendments == ()
    assert checked.systems == tuple(manifest(base_design("0" * 64))["systems"])
    assert checked.systems_sha256 == _sha((folder / "systems.json").read_bytes())
    assert checked.catalog_sha256 == _sha(CATALOG)


def test_freeze_twice_is_refused(frozen: Path) -> None:
    before = (frozen / "FROZEN.json").read_bytes()
    _refused("prereg_already_frozen", lambda: freeze(frozen))
    assert (frozen / "FROZEN.json").read_bytes() == before


def test_freeze_refuses_when_only_the_amendment_log_is_left(frozen: Path) -> None:
    (frozen / "notes.txt").write_bytes(b"changed\n")
    amend(frozen, "notes")
    (frozen / "FROZEN.json").unlink()
    _refused("prereg_already_frozen", lambda: freeze(frozen))
    _refused("prereg_not_frozen", lambda: check_frozen(frozen))


def test_unfrozen_is_refused_by_the_frozen_check(folder: Path) -> None:
    _refused("prereg_not_frozen", lambda: check_frozen(folder))


def test_missing_folder_and_file_instead_of_folder(tmp_path: Path) -> None:
    _refused("folder_missing", lambda: freeze(tmp_path / "nope"))
    (tmp_path / "file").write_bytes(b"x")
    _refused("not_a_folder", lambda: check_frozen(tmp_path / "file"))


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _socket(path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))


ODD_ENTRIES: dict[str, Callable[[Path], None]] = {
    "link to a file": lambda f: (f / "extra.md").symlink_to(f / "PREREG.md"),
    "dangling link": lambda f: (f / "extra.md").symlink_to(f / "nothing"),
    "link replacing a required file": lambda f: (
        shutil.copy(f / "PREREG.md", f.parent / "outside.md"), (f / "PREREG.md").unlink(),
        (f / "PREREG.md").symlink_to(f.parent / "outside.md")),
    "subfolder": lambda f: (f / "data").mkdir(),
    "hidden file": lambda f: (f / ".draft").write_bytes(b"x"),
    "FIFO": lambda f: _fifo(f / "pipe"),
    "socket": lambda f: _socket(f / "sock"),
    "FROZEN.json as a folder": lambda f: (f / "FROZEN.json").mkdir(),
}


@pytest.mark.parametrize("case", sorted(ODD_ENTRIES))
def test_freeze_refuses_unexpected_entries(folder: Path, case: str) -> None:
    ODD_ENTRIES[case](folder)
    refusal = _refused("prereg_unexpected_entry", lambda: freeze(folder))
    assert refusal.path is not None and refusal.path.startswith(str(folder))
    assert not os.path.isfile(folder / "FROZEN.json")


def test_freeze_refuses_a_name_that_is_not_utf8(folder: Path) -> None:
    with open(os.path.join(os.fsencode(folder), b"caf\xe9.txt"), "wb") as f:
        f.write(b"x")
    refusal = _refused("prereg_unexpected_entry", lambda: freeze(folder))
    assert "not UTF-8" in refusal.message


@pytest.mark.parametrize("name", ["design.toml", "PREREG.md", "systems.json"])
def test_freeze_needs_every_required_file(folder: Path, name: str) -> None:
    (folder / name).unlink()
    refusal = _refused("file_missing", lambda: freeze(folder))
    assert refusal.path == str(folder / name)


def test_freeze_refuses_blank_or_non_utf8_text(folder: Path) -> None:
    (folder / "PREREG.md").write_bytes(b"  \n\t\n")
    _refused("prereg_text_empty", lambda: freeze(folder))
    (folder / "PREREG.md").write_bytes(b"caf\xe9\n")
    _refused("invalid_utf8", lambda: freeze(folder))


def test_freeze_refuses_an_invalid_design(folder: Path) -> None:
    (folder / "design.toml").write_bytes((folder / "design.toml").read_bytes().replace(b"reruns = 2", b"reruns = 5"))
    _refused("design_invalid", lambda: freeze(folder))
    assert not (folder / "FROZEN.json").exists()


def test_freeze_refuses_a_wrong_packet_or_too_small_a_draw(tmp_path: Path) -> None:
    f = write_prereg(tmp_path)
    (tmp_path / "evals" / "tiny" / "packet.jsonl").write_bytes(b'{"item":"x","prompt":"p","entry_point":"f"}\n')
    _refused("packet_sha256_mismatch", lambda: freeze(f))
    f2 = write_prereg(tmp_path / "small", packet_items=5)  # the draw is 6
    _refused("draw_exceeds_packet", lambda: freeze(f2))
    (tmp_path / "evals" / "tiny" / "packet.jsonl").unlink()
    _refused("file_missing", lambda: freeze(f))


# --------------------------------------------------------------------------
# The systems manifest


def _systems(mutate: Callable[[list[dict[str, str]]], None], study: str = "tiny") -> dict[str, Any]:
    body = manifest(base_design("0" * 64))
    body["study"] = study
    mutate(body["systems"])
    return body


def _put(index: int, key: str, value: str) -> Callable[[list[dict[str, str]]], None]:
    def apply(systems: list[dict[str, str]]) -> None:
        systems[index][key] = value

    return apply


MISMATCHES: dict[str, tuple[dict[str, Any], str]] = {
    "model": (_systems(_put(0, "model", "sim-glm")),
              "system cheap: model is 'sim-glm' in systems.json, 'sim-flash' in design.toml"),
    "provider": (_systems(_put(1, "provider", "openai")),
                 "system strong: provider is 'openai' in systems.json, 'sim' in design.toml"),
    "setting": (_systems(_put(1, "setting", "low")),
                "system strong: setting is 'low' in systems.json, 'high' in design.toml"),
    "order": (_systems(lambda s: s.reverse()), "order: systems.json lists strong, cheap; design.toml registers cheap, strong"),
    "missing system": (_systems(lambda s: s.pop()), "missing from systems.json: strong"),
    "extra system": (_systems(lambda s: s.append({"slot": "mid", "provider": "sim", "model": "sim-glm",
                                                  "setting": "default"})), "not in design.toml: mid"),
    "renamed slot": (_systems(_put(0, "slot", "flash")), "missing from systems.json: cheap"),
    "study": (_systems(lambda s: None, study="other"), "systems.json is for study 'other'"),
}


@pytest.mark.parametrize("case", sorted(MISMATCHES))
def test_systems_manifest_mismatch(tmp_path: Path, case: str) -> None:
    body, fragment = MISMATCHES[case]
    f = write_prereg(tmp_path, systems=body)
    refusal = _refused("systems_manifest_mismatch", lambda: freeze(f))
    assert fragment in refusal.message, refusal.message
    assert refusal.path == str(f / "systems.json")
    assert fragment in " ".join(refusal.details["problems"])


@pytest.mark.parametrize("case", ["model", "order", "provider", "setting"])
def test_systems_manifest_mismatch_through_the_cli(tmp_path: Path, case: str) -> None:
    body, fragment = MISMATCHES[case]
    f = write_prereg(tmp_path, systems=body)
    for action in ("check", "freeze"):
        result = run_proctor("prereg", action, str(f))
        assert result.code == 3
        assert result.out["refusal"] == "systems_manifest_mismatch"
        assert fragment in result.out["message"]


@pytest.mark.parametrize("case", ["model", "order", "provider", "setting"])
def test_amending_systems_json_alone_is_a_mismatch(frozen: Path, case: str) -> None:
    body, _ = MISMATCHES[case]
    (frozen / "systems.json").write_text(json.dumps(body), encoding="utf-8")
    _refused("systems_manifest_mismatch", lambda: amend(frozen, "try a new model"))
    _refused("prereg_changed_since_freeze", lambda: check_frozen(frozen))


MALFORMED: dict[str, bytes] = {
    "not an object": b"[]",
    "extra key": json.dumps({**manifest(base_design("0" * 64)), "x": 1}).encode(),
    "empty systems": b'{"study": "tiny", "systems": []}',
    "extra system key": json.dumps(_systems(_put(0, "pricing_key", "sim-flash"))).encode(),
    "number as model": b'{"study":"tiny","systems":[{"slot":"cheap","provider":"sim","model":1,"setting":"d"}]}',
    "duplicate slot": json.dumps(_systems(lambda s: s.append(dict(s[0])))).encode(),
    "duplicate key": b'{"study": "tiny", "study": "tiny", "systems": []}',
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_manifest_is_refused(folder: Path, case: str) -> None:
    (folder / "systems.json").write_bytes(MALFORMED[case])
    with pytest.raises(Refusal) as caught:
        freeze(folder)
    assert caught.value.code in {"systems_manifest_invalid", "json_not_object", "json_duplicate_key"}
    assert caught.value.path == str(folder / "systems.json")


def test_the_catalog_must_hold_every_system(folder: Path) -> None:
    (folder / "catalog.toml").write_bytes(CATALOG.replace(b'pricing_key = "sim-k3"', b'pricing_key = "k3"'))
    refusal = _refused("systems_catalog_mismatch", lambda: freeze(folder))
    assert "pricing key 'sim-k3' in design.toml, 'k3' in catalog.toml" in refusal.message
    (folder / "catalog.toml").write_bytes(CATALOG.replace(b'id = "sim-k3"', b'id = "sim-k4"'))
    refusal = _refused("systems_catalog_mismatch", lambda: freeze(folder))
    assert "model 'sim-k3' is not in catalog.toml" in refusal.message
    (folder / "catalog.toml").write_bytes(b"[[model]]\nid = 3\n")
    _refused("catalog_invalid", lambda: freeze(folder))


def _use_model(model: str, pricing_key: str) -> Callable[[dict[str, Any]], None]:
    def apply(design: dict[str, Any]) -> None:
        design["systems"][1].update(model=model, pricing_key=pricing_key)
    return apply


def _manifest_for(model: str) -> dict[str, Any]:
    return _systems(_put(1, "model", model))


def test_check_and_freeze_refuse_a_model_missing_from_the_bundled_catalog(tmp_path: Path) -> None:
    # Issue 13 item 5: with no catalog.toml, plan resolves the bundled catalog; check and freeze must too.
    f = write_prereg(tmp_path, _use_model("sim-k4", "sim-k3"), systems=_manifest_for("sim-k4"))
    for fn in (lambda: check_prereg(f), lambda: freeze(f)):
        refusal = _refused("unknown_model", fn)
        assert refusal.message.startswith("system strong: no model 'sim-k4' in the catalog")
        assert refusal.path is not None and refusal.path.endswith("catalog.toml")
    assert not (f / "FROZEN.json").exists()
    for action in ("check", "freeze"):
        result = run_proctor("prereg", action, str(f))
        assert (result.code, result.out["refusal"]) == (3, "unknown_model"), result.out
    assert not (f / "FROZEN.json").exists()


def test_check_and_freeze_refuse_a_pricing_key_the_bundled_catalog_disagrees_with(tmp_path: Path) -> None:
    f = write_prereg(tmp_path, _use_model("sim-k3", "sim-glm"))
    for fn in (lambda: check_prereg(f), lambda: freeze(f)):
        refusal = _refused("systems_catalog_mismatch", fn)
        assert "pricing key 'sim-glm' in design.toml, 'sim-k3' in the catalog" in refusal.message
    assert not (f / "FROZEN.json").exists()


def test_check_and_freeze_refuse_an_unpriced_model(folder: Path) -> None:
    # The folder's own catalog lists the model, but no pricing lists its key: run would refuse it.
    (folder / "catalog.toml").write_bytes(CATALOG.replace(b'pricing_key = "sim-k3"', b'pricing_key = "k9"'))
    (folder / "design.toml").write_text((folder / "design.toml").read_text().replace(
        'pricing_key = "sim-k3"', 'pricing_key = "k9"'))
    for fn in (lambda: check_prereg(folder), lambda: freeze(folder)):
        refusal = _refused("system_unpriced", fn)
        assert "system strong: no price for 'k9'" in refusal.message
        assert refusal.path is not None and refusal.path.endswith("harness/data/pricing.yaml")
    result = run_proctor("prereg", "freeze", str(folder))
    assert (result.code, result.out["refusal"]) == (3, "system_unpriced"), result.out
    assert not (folder / "FROZEN.json").exists()


def test_a_folder_pricing_file_is_the_one_resolved(folder: Path) -> None:
    pricing = REPO / "harness" / "data" / "pricing.yaml"
    text = pricing.read_text()
    (folder / "pricing.yaml").write_text(text.replace("sim-k3:", "sim-k3-old:"))
    refusal = _refused("system_unpriced", lambda: freeze(folder))
    assert refusal.path == str(folder / "pricing.yaml")
    (folder / "pricing.yaml").write_text(text)
    report = check_prereg(folder)
    assert report["resolved"]["pricing"] == str(folder / "pricing.yaml")
    assert [s["priced"] for s in report["resolved"]["systems"]] == [True, True]
    freeze(folder)
    (folder / "pricing.yaml").write_text("models: {}\n")
    _refused("pricing_invalid", lambda: amend(folder, "drop every price"))


# --------------------------------------------------------------------------
# Any byte changed in any file is refused


def test_a_jupyter_checkpoints_folder_is_not_a_change(folder: Path) -> None:
    # issue 13 item 10: opening PREREG.md or a notebook in Jupyter leaves .ipynb_checkpoints behind
    checkpoints = folder / ".ipynb_checkpoints"
    checkpoints.mkdir()
    (checkpoints / "PREREG-checkpoint.md").write_text("an autosave\n")
    freeze(folder)
    assert ".ipynb_checkpoints" not in json.dumps(_registered(folder))
    check_frozen(folder)
    assert check_prereg(folder)["frozen"]["state"] == "frozen"
    (checkpoints / "design-checkpoint.toml").write_text("another autosave\n")
    check_frozen(folder)
    _refused("amendment_empty", lambda: amend(folder, "nothing but an autosave"))
    shutil.rmtree(checkpoints)
    check_frozen(folder)
    # only that folder, and only as a folder: a file by that name, or another hidden folder, is still refused
    checkpoints.write_text("not a folder\n")
    _refused("prereg_changed_since_freeze", lambda: check_frozen(folder))
    checkpoints.unlink()
    (folder / ".hidden").mkdir()
    _refused("prereg_changed_since_freeze", lambda: check_frozen(folder))


def _registered(f: Path) -> list[str]:
    return sorted(json.loads((f / "FROZEN.json").read_bytes())["files"])


def _flip(path: Path, position: int, byte: int | None = None) -> bytes:
    data = path.read_bytes()
    i = position % len(data)
    new = data[i] ^ 0x01 if byte is None else byte
    path.write_bytes(data[:i] + bytes([new]) + data[i + 1:])
    return data


def test_every_byte_position_of_every_file_is_covered(frozen: Path) -> None:
    for name in _registered(frozen):
        path = frozen / name
        size = path.stat().st_size
        for position in sorted({0, 1, size // 3, size // 2, size - 2, size - 1}):
            original = _flip(path, position)
            refusal = _refused("prereg_changed_since_freeze", lambda: check_frozen(frozen))
            assert refusal.details["changed"] == [name], (name, position)
            assert name in refusal.message
            path.write_bytes(original)
        for changed in (path.read_bytes() + b"\n", path.read_bytes()[:-1], b""):
            original = path.read_bytes()
            path.write_bytes(changed)
            assert _refused("prereg_changed_since_freeze", lambda: check_frozen(frozen)).details["changed"] == [name]
            path.write_bytes(original)
    check_frozen(frozen)


_SCRATCH: dict[str, Path] = {}


def _scratch_frozen() -> Path:
    """One frozen folder shared by the hypothesis examples (each restores what it changed)."""
    if "folder" not in _SCRATCH:
        root = Path(tempfile.mkdtemp(prefix="prereg-hyp-"))
        f = write_prereg(root)
        (f / "catalog.toml").write_bytes(CATALOG)
        freeze(f)
        _SCRATCH["folder"] = f
    return _SCRATCH["folder"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(which=st.integers(0, 3), position=st.integers(0, 10**6), byte=st.integers(0, 255))
def test_any_byte_changed_in_any_file_is_refused(which: int, position: int, byte: int) -> None:
    f = _scratch_frozen()
    name = _registered(f)[which]
    path = f / name
    data = path.read_bytes()
    i = position % len(data)
    if data[i] == byte:
        byte ^= 0x80
    _flip(path, i, byte)
    try:
        refusal = _refused("prereg_changed_since_freeze", lambda: check_frozen(f))
        assert refusal.details == {"added": [], "changed": [name], "removed": []}
    finally:
        path.write_bytes(data)
    check_frozen(f)


@pytest.fixture(scope="module", autouse=True)
def _clean_scratch() -> Iterator[None]:
    yield
    if "folder" in _SCRATCH:
        shutil.rmtree(_SCRATCH.pop("folder").parent.parent, ignore_errors=True)


AFTER_FREEZE: dict[str, tuple[Callable[[Path], None], str, str]] = {
    "a file added": (lambda f: (f / "late.txt").write_bytes(b"x"), "added", "late.txt"),
    "a file removed": (lambda f: (f / "notes.txt").unlink(), "removed", "notes.txt"),
    "a required file removed": (lambda f: (f / "PREREG.md").unlink(), "removed", "PREREG.md"),
    "a hidden file added": (lambda f: (f / ".x").write_bytes(b""), "added", ".x"),
    "a subfolder added": (lambda f: (f / "sub").mkdir(), "added", "sub"),
    "a FIFO added": (lambda f: _fifo(f / "pipe"), "added", "pipe"),
    "a file replaced by a link to the same bytes": (
        lambda f: (shutil.copy(f / "notes.txt", f.parent / "n.txt"), (f / "notes.txt").unlink(),
                   (f / "notes.txt").symlink_to(f.parent / "n.txt")), "changed", "notes.txt"),
}


@pytest.mark.parametrize("case", sorted(AFTER_FREEZE))
def test_entries_added_or_removed_after_the_freeze(frozen: Path, case: str) -> None:
    change, kind, name = AFTER_FREEZE[case]
    change(frozen)
    refusal = _refused("prereg_changed_since_freeze", lambda: check_frozen(frozen))
    assert refusal.details[kind] == [name]
    assert f"{name} {kind}" in refusal.message


def test_changes_through_the_cli_name_each_file(frozen: Path) -> None:
    (frozen / "design.toml").write_bytes((frozen / "design.toml").read_bytes().replace(b"A tiny", b"A small"))
    (frozen / "notes.txt").unlink()
    (frozen / "extra.csv").write_bytes(b"a,b\n")
    result = run_proctor("prereg", "check", str(frozen))
    assert result.code == 3
    assert result.out["refusal"] == "prereg_changed_since_freeze"
    assert (result.out["added"], result.out["changed"], result.out["removed"]) == (
        ["extra.csv"], ["design.toml"], ["notes.txt"])
    assert result.out["path"] == str(frozen)


def test_frozen_json_itself_cannot_be_edited(frozen: Path) -> None:
    path = frozen / "FROZEN.json"
    original = path.read_bytes()
    doc = json.loads(original)
    path.write_bytes(json.dumps(doc, indent=1).encode())  # same content, not canonical
    _refused("frozen_invalid", lambda: check_frozen(frozen))
    doc["files"]["notes.txt"] = "0" * 64
    path.write_bytes(canonical_line(doc))
    _refused("prereg_changed_since_freeze", lambda: check_frozen(frozen))
    for edit in ({**json.loads(original), "amendments": -1}, {**json.loads(original), "schema": "v0"},
                 {**json.loads(original), "frozen_at": "yesterday"}, {**json.loads(original), "extra": 1},
                 {**json.loads(original), "amendments": True}, {**json.loads(original), "amendments_head": "0" * 64}):
        path.write_bytes(canonical_line(edit))
        _refused("frozen_invalid", lambda: check_frozen(frozen))
    # Any byte of FROZEN.json itself, except the digits of its date: a plausible other date is only as
    # trustworthy as the history the folder is committed to (nothing inside the folder can vouch for it).
    stamp = original.index(doc["frozen_at"].encode())
    dated = range(stamp, stamp + len(doc["frozen_at"]))
    for i in range(len(original)):
        if i in dated and chr(original[i]).isdigit():
            continue
        path.write_bytes(original[:i] + bytes([original[i] ^ 0x01]) + original[i + 1:])
        with pytest.raises(Refusal):
            check_frozen(frozen)
    path.write_bytes(original)
    path.unlink()
    path.symlink_to(frozen.parent / "elsewhere.json")
    (frozen.parent / "elsewhere.json").write_bytes(original)
    _refused("frozen_invalid", lambda: check_frozen(frozen))


# --------------------------------------------------------------------------
# Amend


def test_amend_records_and_refreezes(frozen: Path) -> None:
    first = json.loads((frozen / "FROZEN.json").read_bytes())
    old_design = first["files"]["design.toml"]
    design = (frozen / "design.toml").read_bytes().replace(b"A tiny study", b"A tiny study, amended")
    (frozen / "design.toml").write_bytes(design)
    (frozen / "analysis.md").write_bytes(b"the analysis plan in words\n")
    result = amend(frozen, "clarify the title; add the analysis text")
    assert result["recovered"] is False
    record = result["amendment"]
    assert record["amendment"] == 1 and record["reason"] == "clarify the title; add the analysis text"
    assert record["changed"] == [
        {"path": "analysis.md", "change": "added", "old": None, "new": _sha(b"the analysis plan in words\n")},
        {"path": "design.toml", "change": "changed", "old": old_design, "new": _sha(design)},
    ]
    now = json.loads((frozen / "FROZEN.json").read_bytes())
    assert now["amendments"] == 1 and now["frozen_at"] == first["frozen_at"]
    assert now["amendments_head"] == _sha((frozen / "AMENDMENTS.jsonl").read_bytes().rstrip(b"\n"))
    assert now["files"]["design.toml"] == _sha(design) and "analysis.md" in now["files"]
    (frozen / "notes.txt").unlink()
    second = amend(frozen, "drop the notes")["amendment"]
    assert second["changed"] == [{"path": "notes.txt", "change": "removed", "old": first["files"]["notes.txt"],
                                  "new": None}]
    assert second["at"] >= record["at"] >= first["frozen_at"]
    checked = check_frozen(frozen)
    assert [a.number for a in checked.amendments] == [1, 2]
    assert [a.reason for a in checked.amendments] == ["clarify the title; add the analysis text", "drop the notes"]
    assert checked.design.title == "A tiny study, amended"
    log = read_log(frozen / "AMENDMENTS.jsonl", amendments_seed("tiny"))
    assert [r["amendment"] for r in log] == [1, 2] and log[0]["seed"] == "proctor-amendments:tiny"
    report = check_prereg(frozen)
    assert report["frozen"]["state"] == "frozen"
    assert [a["amendment"] for a in report["frozen"]["amendments"]] == [1, 2]


def test_amend_refusals(folder: Path) -> None:
    _refused("prereg_not_frozen", lambda: amend(folder, "too early"))
    freeze(folder)
    _refused("amendment_empty", lambda: amend(folder, "nothing"))
    (folder / "notes.txt").write_bytes(b"new\n")
    for reason in ("", "   ", "\n"):
        _refused("amendment_reason_empty", lambda r=reason: amend(folder, r))  # type: ignore[misc]
    (folder / "design.toml").write_bytes((folder / "design.toml").read_bytes().replace(b'id = "tiny"', b'id = "tinier"'))
    (folder / "systems.json").write_text(json.dumps({**manifest(base_design("0" * 64)), "study": "tinier"}))
    _refused("amendment_changes_study", lambda: amend(folder, "rename"))
    (folder / "design.toml").write_bytes(b"[study]\n")
    _refused("design_invalid", lambda: amend(folder, "break it"))
    assert json.loads((folder / "FROZEN.json").read_bytes())["amendments"] == 0
    assert not (folder / "AMENDMENTS.jsonl").exists()
    (folder / ".hidden").write_bytes(b"")
    _refused("prereg_unexpected_entry", lambda: amend(folder, "hidden"))


def test_amend_after_an_interrupted_amend_completes_it(frozen: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (frozen / "notes.txt").write_bytes(b"v2\n")
    real = prereg._write_frozen

    def crash(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt("power cut")

    monkeypatch.setattr(prereg, "_write_frozen", crash)
    with pytest.raises(KeyboardInterrupt):
        amend(frozen, "notes v2")
    monkeypatch.setattr(prereg, "_write_frozen", real)
    refusal = _refused("prereg_changed_since_freeze", lambda: check_frozen(frozen))
    assert refusal.details["changed"] == ["notes.txt"]
    result = amend(frozen, "ignored: the logged reason stands")
    assert result["recovered"] is True and result["amendment"]["reason"] == "notes v2"
    assert [a.reason for a in check_frozen(frozen).amendments] == ["notes v2"]


def test_an_interrupted_amend_with_a_folder_changed_since_is_refused(frozen: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    (frozen / "notes.txt").write_bytes(b"v2\n")
    monkeypatch.setattr(prereg, "_write_frozen", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        amend(frozen, "notes v2")
    monkeypatch.undo()
    (frozen / "notes.txt").write_bytes(b"v3\n")
    _refused("amendments_count_mismatch", lambda: amend(frozen, "notes v3"))


def test_the_amendment_log_is_checked(frozen: Path) -> None:
    (frozen / "notes.txt").write_bytes(b"v2\n")
    amend(frozen, "notes v2")
    log = frozen / "AMENDMENTS.jsonl"
    original = log.read_bytes()
    log.write_bytes(original.replace(b"notes v2", b"notes v3"))  # still a valid chain: FROZEN.json's head catches it
    assert "an amendment was edited" in _refused("amendments_invalid", lambda: check_frozen(frozen)).message
    log.write_bytes(original)
    check_frozen(frozen)
    ChainedLog(log, amendments_seed("tiny")).append(
        {"amendment": 2, "at": "2099-01-01T00:00:00.000000Z", "reason": "forged", "changed": [
            {"path": "notes.txt", "change": "changed", "old": _sha(b"v2\n"), "new": _sha(b"v3\n")}]})
    _refused("amendments_count_mismatch", lambda: check_frozen(frozen))
    log.write_bytes(original + b'{"amendment":2}\n')
    _refused("log_broken", lambda: check_frozen(frozen))
    log.write_bytes(original[:-1])
    _refused("log_torn_tail", lambda: check_frozen(frozen))
    log.unlink()
    _refused("amendments_count_mismatch", lambda: check_frozen(frozen))
    record = {k: v for k, v in json.loads(original).items() if k not in ("prev", "seed")}
    ChainedLog(log, amendments_seed("other")).append(record)  # the same record, in another study's log
    _refused("log_broken", lambda: check_frozen(frozen))
    log.unlink()
    ChainedLog(log, amendments_seed("tiny")).append({"amendment": 1, "at": "now", "reason": "x", "changed": []})
    _refused("amendments_invalid", lambda: check_frozen(frozen))


def test_a_hand_refreeze_that_bypasses_amend_is_caught(frozen: Path) -> None:
    (frozen / "notes.txt").write_bytes(b"v2\n")
    amend(frozen, "notes v2")
    (frozen / "notes.txt").write_bytes(b"v3\n")  # then FROZEN.json rewritten by hand to match
    doc = json.loads((frozen / "FROZEN.json").read_bytes())
    doc["files"]["notes.txt"] = _sha(b"v3\n")
    (frozen / "FROZEN.json").write_bytes(canonical_line(doc))
    refusal = _refused("amendments_invalid", lambda: check_frozen(frozen))
    assert "notes.txt" in refusal.message


def test_a_concurrent_freeze_is_refused(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        _refused("prereg_locked", lambda: freeze(folder))
    finally:
        os.close(fd)
    freeze(folder)


# --------------------------------------------------------------------------
# proctor prereg check


def test_check_an_unfrozen_folder(folder: Path) -> None:
    result = run_proctor("prereg", "check", str(folder))
    assert result.code == 0, result.out
    out = result.out
    assert out["ok"] is True and out["study"] == "tiny"
    assert out["frozen"]["state"] == "unfrozen"
    assert set(out["frozen"]["would_record"]["files"]) == {"design.toml", "PREREG.md", "systems.json",
                                                          "catalog.toml", "notes.txt"}
    assert any("not frozen" in w for w in out["warnings"])
    assert out["packet"]["items"] == 8 and out["draw"] == {"items": 6, "packet_items": 8, "seed": 7}
    assert [(s["stage"], s["systems"], s["cells"]) for s in out["stages"]] == [
        ("A", {"cheap": 4, "strong": 4}, 8), ("B", {"cheap": 24, "strong": 24}, 48)]
    assert out["cells_total"] == 56
    budget = out["budget"]
    assert budget["ceiling_usd"] == 5.5 and budget["reserve_needed_usd"] == 1.6 and budget["covered"] is True
    assert [s["reserve_needed_usd"] for s in budget["systems"]] == [0.8, 0.8]
    (power,) = out["power"]
    # issue 15: n comes from the exact power of Tango's TOST (587); the normal approximation gave 579
    assert power["needed"]["n"] == 587 and power["needed"]["achievable"] is True
    assert power["needed"]["n_normal"] == 579 and power["needed"]["method"] == "exact"
    assert [(s["stage"], s["items"], s["reaches"]) for s in power["stages"]] == [("A", 4, False), ("B", 6, False)]
    assert any("needs 587 items" in w for w in out["warnings"])
    assert not (folder / "FROZEN.json").exists()


def test_check_a_frozen_folder_and_human_output(frozen: Path) -> None:
    result = run_proctor("prereg", "check", str(frozen))
    assert result.code == 0
    assert result.out["frozen"]["state"] == "frozen"
    assert result.out["frozen"]["frozen_sha256"] == _sha((frozen / "FROZEN.json").read_bytes())
    assert not any("not frozen" in w for w in result.out["warnings"])
    done = subprocess.run([sys.executable, "-m", "harness", "prereg", "check", str(frozen)], capture_output=True,
                          text=True, cwd=REPO, check=False)
    assert done.returncode == 0 and "cells_total: 56" in done.stdout and "state: frozen" in done.stdout


def test_check_warns_when_caps_cannot_cover_the_stages(tmp_path: Path) -> None:
    def tight(d: dict[str, Any]) -> None:
        d["budgets"]["reserve_per_item_usd"] = 0.1  # cheap: 16 items x 0.1 = 1.6 > cap 1.0
        d["budgets"]["overall_cap_usd"] = 2.0

    f = write_prereg(tmp_path, tight)
    out = check_prereg(f)
    cheap = out["budget"]["systems"][0]
    assert cheap["covered"] is False and [s["covered"] for s in cheap["stages"]] == [True, False]
    assert any("system cheap" in w and "short from stage B" in w for w in out["warnings"])
    assert any(w.startswith("overall:") for w in out["warnings"])


def test_check_shows_the_worst_case_beside_the_expected_and_what_each_cap_covers(tmp_path: Path) -> None:
    # issue 13 item 3: one item can take arms x (reruns+1) x (transport retries+1) attempts, each at the
    # reserve; check called the base design "covered" although reruns and retries can spend 21x the caps
    out = check_prereg(write_prereg(tmp_path))
    b = out["budget"]
    cheap = b["systems"][0]
    assert [(s["stage"], s["worst_attempts_per_item"]) for s in cheap["stages"]] == [("A", 12), ("B", 24)]
    assert cheap["expected_usd"] == pytest.approx(0.8)  # 16 items x 0.05
    assert cheap["worst_usd"] == pytest.approx(16.8)  # (4 x 12 + 12 x 24) attempts x 0.05
    assert cheap["covers"] == "expected" and b["systems"][1]["covers"] == "expected"
    assert b["expected_usd"] == pytest.approx(1.6) and b["worst_usd"] == pytest.approx(33.6)
    assert b["covers"] == {"overall_cap": "expected", "ceiling": "expected", "cheap": "expected",
                           "strong": "expected"}
    assert any("system cheap" in w and "not the worst case ($16.8" in w for w in out["warnings"])
    assert any(w.startswith("ceiling: $5.5 covers expected case") for w in out["warnings"])


def test_check_says_the_caps_cover_the_worst_case_when_they_do(tmp_path: Path) -> None:
    def no_retries(d: dict[str, Any]) -> None:
        d["run"].update(reruns=0, transport_retries=0)
        d["budgets"]["reserve_per_item_usd"] = 0.01  # cheap: (4 + 24) attempts x 0.01 = 0.28 <= 1.0

    out = check_prereg(write_prereg(tmp_path, no_retries))
    b = out["budget"]
    assert b["systems"][0]["worst_usd"] == pytest.approx(0.28)
    assert b["covers"] == {"overall_cap": "worst", "ceiling": "worst", "cheap": "worst", "strong": "worst"}
    assert not any("worst case" in w for w in out["warnings"])


def test_check_says_neither_when_a_cap_misses_even_the_expected_case(tmp_path: Path) -> None:
    def tight(d: dict[str, Any]) -> None:
        d["budgets"]["reserve_per_item_usd"] = 0.1
        d["budgets"]["overall_cap_usd"] = 2.0

    b = check_prereg(write_prereg(tmp_path, tight))["budget"]
    assert b["systems"][0]["covers"] == "neither" and b["systems"][1]["covers"] == "expected"
    assert [s["covers"] for s in b["systems"][0]["stages"]] == ["expected", "neither"]
    assert b["covers"]["overall_cap"] == "neither" and b["covers"]["ceiling"] == "neither"


def test_freeze_output_shows_the_budget_cases(folder: Path) -> None:
    result = run_proctor("prereg", "freeze", str(folder))
    assert result.code == 0
    assert result.out["budget"]["covers"]["cheap"] == "expected"
    assert result.out["budget"]["worst_usd"] == pytest.approx(33.6)
    assert any("not the worst case" in w for w in result.out["warnings"])


def test_check_reports_an_unachievable_comparison(tmp_path: Path) -> None:
    def apart(d: dict[str, Any]) -> None:
        d["analysis"]["comparisons"][0].update(expected_a=0.5, expected_b=0.7)

    out = check_prereg(write_prereg(tmp_path, apart))
    assert out["power"][0]["needed"]["n"] is None
    assert any("not achievable" in w for w in out["warnings"])


def test_check_of_a_reached_power(tmp_path: Path) -> None:
    def generous(d: dict[str, Any]) -> None:
        d["analysis"]["comparisons"][0].update(margin=0.9, expected_a=0.6, expected_b=0.6, correlation=0.9)

    out = check_prereg(write_prereg(tmp_path, generous))
    needed = out["power"][0]["needed"]["n"]
    assert needed is not None and needed <= 4
    assert all(s["reaches"] for s in out["power"][0]["stages"])
    assert not any(w.startswith("comparison") for w in out["warnings"])


# --------------------------------------------------------------------------
# The commands: exit codes, and no network or credential anywhere


def test_freeze_and_amend_through_the_cli(folder: Path) -> None:
    first = run_proctor("prereg", "freeze", str(folder))
    assert first.code == 0 and first.out["frozen"]["amendments"] == 0
    assert run_proctor("prereg", "freeze", str(folder)).out["refusal"] == "prereg_already_frozen"
    assert run_proctor("prereg", "amend", str(folder), "--reason", "none").out["refusal"] == "amendment_empty"
    (folder / "notes.txt").write_bytes(b"v2\n")
    empty = run_proctor("prereg", "amend", str(folder), "--reason", " ")
    assert (empty.code, empty.out["refusal"]) == (3, "amendment_reason_empty")
    missing = run_proctor("prereg", "amend", str(folder))
    assert (missing.code, missing.out["refusal"]) == (2, "usage_error")
    done = run_proctor("prereg", "amend", str(folder), "--reason", "notes v2")
    assert done.code == 0 and done.out["amendment"]["changed"][0]["path"] == "notes.txt"
    check = run_proctor("prereg", "check", str(folder))
    assert check.code == 0 and [a["reason"] for a in check.out["frozen"]["amendments"]] == ["notes v2"]


def test_prereg_commands_open_no_connection_and_show_no_credential(folder: Path, tmp_path: Path) -> None:
    secret = "sk-SECRET-prereg-3b1d"
    env, log = guarded_env(tmp_path, {"OPENAI_API_KEY": secret, "ANTHROPIC_API_KEY": secret})
    probe = subprocess.run([sys.executable, "-c", "import socket; socket.create_connection(('127.0.0.1', 9))"],
                           capture_output=True, text=True, env=env, timeout=60, check=False)
    assert probe.returncode != 0 and "socket guard" in probe.stderr
    log.unlink()
    (folder / "late.md").write_bytes(b"later\n")
    for words in (["check"], ["freeze"], ["check"], ["amend", "--reason", "r"], ["check"]):
        if words == ["freeze"]:
            (folder / "late.md").unlink()
        done = subprocess.run([sys.executable, "-m", "harness", "prereg", words[0], str(folder), *words[1:], "--json"],
                              capture_output=True, text=True, env=env, cwd=REPO, timeout=120, check=False)
        assert "Traceback" not in done.stderr and secret not in done.stdout + done.stderr
        assert done.returncode in (0, 3), (words, done.stdout, done.stderr)
        if words == ["amend", "--reason", "r"]:
            assert json.loads(done.stdout)["refusal"] == "amendment_empty"
    assert not log.exists(), log.read_text(encoding="utf-8")
    for path in folder.iterdir():
        assert secret.encode() not in path.read_bytes()


def test_the_freeze_history_rebuilds_every_earlier_frozen_json(frozen: Path) -> None:
    from harness.prereg.frozen import freeze_history

    seen = [_sha((frozen / "FROZEN.json").read_bytes())]
    (frozen / "analysis.md").write_bytes(b"the analysis plan in words\n")
    amend(frozen, "add the analysis text")
    seen.append(_sha((frozen / "FROZEN.json").read_bytes()))
    amend(frozen, "a deviation with no file change", note=True)
    seen.append(_sha((frozen / "FROZEN.json").read_bytes()))
    (frozen / "analysis.md").unlink()
    (frozen / "PREREG.md").write_bytes(b"# tiny\n\nRewritten.\n")
    amend(frozen, "drop the analysis text, rewrite the text")
    seen.append(_sha((frozen / "FROZEN.json").read_bytes()))
    assert freeze_history(frozen) == tuple(seen) == check_frozen(frozen).freezes()
    assert len(set(seen)) == 4
