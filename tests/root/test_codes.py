"""Typed refusal codes: no bare string code in harness/, every `Code` raised, docs/refusals.md generated."""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import errors
from harness.errors import AREAS, Code, Refusal
from tests.support.paths import REPO

HARNESS = REPO / "harness"

REFUSAL_CLASSES = {name for name in errors.__all__ if name.endswith("Refusal")}

NOT_CODES: dict[tuple[str, str], str] = {
    # (file, value): why a str literal equal to a code value there is not a refusal code; a file
    # split into a package (oracle.py -> oracle/) covers its modules
    ("harness/gate/status.py", "tamper_detected"): "a receipt's field name",
    ("harness/gate/workspace.py", "state_tampered"): "a journal event name",
    ("harness/gate/dispatch.py", "state_tampered"): "a journal event name",
    ("harness/records/journal.py", "state_tampered"): "a journal event name (the event's KIND)",
    ("harness/evidence/chain.py", "invalid_json"): "a chain problem kind",
    ("harness/providers/errors.py", "internal_error"): "a provider's error type",
    ("harness/audit/oracle.py", "attempt_invalid"): "an oracle rule name",
}

DOCUMENTED_ONLY: dict[Code, str] = {}
"""Codes that no `Code.NAME` in harness/ raises, with the reason they are in the enum."""


def _modules() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(HARNESS.rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel != "harness/errors.py":
            yield rel, ast.parse(path.read_text(encoding="utf-8"))


def _name(func: ast.expr) -> str | None:
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _is_str(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _code_takers() -> dict[str, int]:
    """The refusal classes and the functions of harness/ with a parameter typed `Code`: name -> its position.

    (A `code: str` parameter is some other code, e.g. a provider's error code; mypy refuses to pass
    a str where a refusal needs a `Code`.)
    """
    takers: dict[str, int] = {name: 0 for name in REFUSAL_CLASSES}
    for _, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                params = [*node.args.posonlyargs, *node.args.args]
                if params and params[0].arg in ("self", "cls"):
                    params = params[1:]
                for at, param in enumerate(params):
                    if param.arg == "code" and param.annotation is not None and "Code" in ast.unparse(param.annotation):
                        takers.setdefault(node.name, at)
    return takers


def bare_codes() -> list[str]:
    """Every place in harness/ that spells a refusal code as a str: `file:line: what`."""
    takers = _code_takers()
    values = {c.value for c in Code}
    found: list[str] = []
    for rel, tree in _modules():
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and (name := _name(node.func)) in takers:
                at = takers[name]
                arg = node.args[at] if len(node.args) > at else None
                arg = next((k.value for k in node.keywords if k.arg == "code"), arg)
                if _is_str(arg):
                    found.append(f"{rel}:{node.lineno}: {name}() given the code {ast.unparse(arg)} as a str")
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                args = [*node.args.posonlyargs, *node.args.args]
                defaults = zip(args[len(args) - len(node.args.defaults):], node.args.defaults, strict=True)
                kw = zip(node.args.kwonlyargs, node.args.kw_defaults, strict=True)
                for param, default in [*defaults, *kw]:
                    if param.annotation is not None and "Code" in ast.unparse(param.annotation) and _is_str(default):
                        found.append(f"{rel}:{node.lineno}: {node.name}({param.arg}=...) defaults to a str")
            if isinstance(node, ast.Constant) and node.value in values and isinstance(node.value, str):
                parent = parents.get(node)
                if isinstance(parent, ast.Expr | ast.JoinedStr):  # a docstring, a piece of an f-string
                    continue
                if isinstance(parent, ast.Dict) and any(k is node for k in parent.keys):
                    continue  # a record's field name
                if isinstance(parent, ast.Subscript) and parent.slice is node:
                    continue
                if any(rel.startswith(f.removesuffix(".py")) and v == node.value for f, v in NOT_CODES):
                    continue
                found.append(f"{rel}:{node.lineno}: {node.value!r} spelt as a str; use Code.{Code(node.value).name}")
    return sorted(set(found))


def test_no_bare_string_codes_in_harness() -> None:
    found = bare_codes()
    assert not found, "refusal codes spelt as strings:\n" + "\n".join(found)


def test_the_scan_finds_bare_codes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "harness"
    fake.mkdir()
    (fake / "x.py").write_text(
        "from harness.errors import Refusal\n"
        "def bad(message: str, code: Code = 'a_code'):\n    return Refusal(code, message)\n"
        "raise Refusal('brand_new_code', 'm')\n"
        "raise bad('m', 'another_code')\n"
        "x = 'log_broken' if True else None\n"
        "y = {'log_broken': 1}['log_broken']\n",
        encoding="utf-8",
    )
    monkeypatch.setitem(globals(), "HARNESS", fake)
    monkeypatch.setitem(globals(), "REPO", tmp_path)
    assert bare_codes() == [
        "harness/x.py:2: bad(code=...) defaults to a str",
        "harness/x.py:4: Refusal() given the code 'brand_new_code' as a str",
        "harness/x.py:5: bad() given the code 'another_code' as a str",
        "harness/x.py:6: 'log_broken' spelt as a str; use Code.LOG_BROKEN",
    ]


def _raised_codes() -> set[Code]:
    used: set[Code] = set()
    for _, tree in _modules():
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Code"
                    and node.attr in Code.__members__):
                used.add(Code[node.attr])
    return used


def test_every_code_is_raised_somewhere_or_documented_only() -> None:
    unused = sorted(c.value for c in set(Code) - _raised_codes() - set(DOCUMENTED_ONLY))
    assert not unused, f"codes no module of harness/ uses (remove them or list them in DOCUMENTED_ONLY): {unused}"


def test_documented_only_codes_are_not_raised() -> None:
    assert not set(DOCUMENTED_ONLY) & _raised_codes()


def test_each_code_belongs_to_exactly_one_area() -> None:
    owners: dict[Code, list[str]] = {c: [] for c in Code}
    for area in AREAS:
        for code in area.codes:
            owners[code].append(area.title)
    bad = {c.value: titles for c, titles in owners.items() if len(titles) != 1}
    assert not bad, f"codes in no area or in several: {bad}"


def test_areas_follow_the_enum_body_and_cross_reference_other_areas() -> None:
    assert [c for area in AREAS for c in area.codes] == list(Code)
    for area in AREAS:
        assert area.codes, area.title
        assert not set(area.also) & set(area.codes), area.title
        assert issubclass(area.refusal, Refusal)
    assert len({a.title for a in AREAS}) == len(AREAS)


def test_codes_are_their_strings() -> None:
    for code in Code:
        assert code == code.value and str(code) == code.value and f"{code}" == code.value
        assert json.dumps(code) == json.dumps(code.value)
        assert code.value == code.name.lower()
    assert len({c.value for c in Code}) == len(Code)


@pytest.mark.parametrize("area", AREAS, ids=lambda a: a.title)
def test_a_refusal_is_an_instance_of_its_areas_class(area: errors.Area) -> None:
    for code in area.codes:
        plain = Refusal(code, "m", "p", line=3)
        typed = area.refusal(code, "m", "p", line=3)
        by_str = Refusal(code.value, "m", "p", line=3)  # type: ignore[arg-type]
        for refusal in (plain, typed, by_str):
            assert type(refusal) is area.refusal
            assert type(refusal).__name__ == "Refusal"  # as printed into run logs and notebooks before
            assert refusal.code is code
            assert refusal.to_json() == {"ok": False, "refusal": code.value, "message": "m", "path": "p", "line": 3}
            assert type(refusal.to_json()["refusal"]) is str
            assert str(refusal) == f"{code.value}: m"


def test_an_areas_class_refuses_another_areas_code() -> None:
    with pytest.raises(TypeError, match="log_broken belongs to LogRefusal, not TreeRefusal"):
        errors.TreeRefusal(Code.LOG_BROKEN, "m")


def test_an_unknown_code_stays_a_plain_refusal() -> None:
    refusal = Refusal("made_up", "m")  # type: ignore[arg-type]
    assert type(refusal) is Refusal and refusal.code == "made_up"
    assert errors.as_code("made_up") == "made_up" and errors.as_code("log_broken") is Code.LOG_BROKEN


def test_direct_calls_of_an_areas_class_name_its_own_codes() -> None:
    wrong = []
    for rel, tree in _modules():
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in REFUSAL_CLASSES
                    and node.func.id != "Refusal" and node.args and isinstance(node.args[0], ast.Attribute)
                    and isinstance(node.args[0].value, ast.Name) and node.args[0].value.id == "Code"):
                code = Code[node.args[0].attr]
                area = next(a for a in AREAS if code in a.codes)
                if area.refusal.__qualname__ != node.func.id:
                    wrong.append(f"{rel}:{node.lineno}: {node.func.id}({code.value}), a {area.refusal.__qualname__}")
    assert not wrong, "\n".join(wrong)


def test_docs_refusals_md_is_generated_from_the_enum() -> None:
    committed = (REPO / "docs" / "refusals.md").read_text(encoding="utf-8")
    assert committed == errors.refusals_markdown(), "run: .venv/bin/python -m harness.errors > docs/refusals.md"


def test_docs_list_every_code_once_as_its_own() -> None:
    text = errors.refusals_markdown()
    for code in Code:
        assert f"`{code.value}`" in text
    assert text.startswith("# Refusal codes and exit codes\n")
    for exit_code in range(5):
        assert f"\n| {exit_code} | " in text
