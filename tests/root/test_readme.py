"""The README's list of refusal codes is the contract: every code the package can raise is in it."""

from __future__ import annotations

import ast
import re

from harness.errors import Code
from tests.support.paths import REPO


def _codes_in(tree: ast.AST) -> set[str]:
    codes: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Code" and node.attr in Code.__members__:
            codes.add(Code[node.attr].value)  # a typed code, `Code.TASK_INVALID`
        if isinstance(node, ast.Call):
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            if name == "Refusal" and node.args and isinstance(node.args[0], ast.Constant):
                codes.add(str(node.args[0].value))
            if name in ("bad", "_bad") and len(node.args) > 1 and isinstance(node.args[1], ast.Constant):
                codes.add(str(node.args[1].value))
            for kw in node.keywords:
                if kw.arg == "code" and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
                    codes.add(kw.value.value)
        if isinstance(node, ast.FunctionDef):
            names = [a.arg for a in node.args.args]
            defaults = node.args.defaults
            for arg, default in zip(names[len(names) - len(defaults) :], defaults, strict=True):
                if arg == "code" and isinstance(default, ast.Constant) and isinstance(default.value, str):
                    codes.add(default.value)
    return {c for c in codes if re.fullmatch(r"[a-z][a-z0-9_]+", c)}


def package_refusal_codes() -> set[str]:
    codes: set[str] = set()
    for path in (REPO / "harness").rglob("*.py"):
        codes |= _codes_in(ast.parse(path.read_text(encoding="utf-8")))
    return codes


def test_every_refusal_code_is_listed_in_the_readme() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"`([a-z][a-z0-9_]+)`", readme))
    missing = sorted(package_refusal_codes() - listed)
    assert not missing, f"refusal codes missing from README.md: {missing}"


def test_the_scan_finds_known_codes() -> None:
    codes = package_refusal_codes()
    assert {"task_invalid", "scope_empty", "verifier_argv_not_array", "invocation_locked", "unknown_model"} <= codes
