"""The manual in docs/ and the README: every refusal code is listed, every link resolves, no machine paths."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from harness.errors import Code
from tests.support.paths import REPO

DOCS = REPO / "docs"

# The pages the manual is made of (docs/refusals.md is generated from harness.errors, and tested there).
PAGES = (
    "index.md", "design.md", "layout.md", "commands.md", "gated-path.md", "sandbox.md", "evidence.md",
    "models.md", "local-model.md", "evals.md", "prereg.md", "running.md", "run.md", "records.md", "audit.md", "oracle.md",
    "analysis.md", "statistics.md", "notebooks.md", "benchmarks.md",
)


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


def _doc_files() -> list[Path]:
    return [REPO / "README.md", *sorted(DOCS.glob("*.md"))]


def test_every_refusal_code_is_listed_in_the_docs() -> None:
    listed: set[str] = set()
    for path in DOCS.glob("*.md"):
        listed |= set(re.findall(r"`([a-z][a-z0-9_]+)`", path.read_text(encoding="utf-8")))
    missing = sorted(package_refusal_codes() - listed)
    assert not missing, f"refusal codes missing from docs/: {missing}"


def test_the_scan_finds_known_codes() -> None:
    codes = package_refusal_codes()
    assert {"task_invalid", "scope_empty", "verifier_argv_not_array", "invocation_locked", "unknown_model"} <= codes


def test_the_manual_has_every_page_and_the_readme_is_short() -> None:
    missing = [page for page in PAGES if not (DOCS / page).is_file()]
    assert not missing, f"pages missing from docs/: {missing}"
    size = (REPO / "README.md").stat().st_size
    assert size < 9000, f"README.md is {size} bytes: the manual belongs in docs/"


_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def test_every_relative_link_resolves() -> None:
    broken: list[str] = []
    for path in _doc_files():
        for target in _LINK.findall(path.read_text(encoding="utf-8")):
            if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # a URL (http:, mailto:) or an anchor on the same page
            if not (path.parent / target.split("#", 1)[0]).exists():
                broken.append(f"{path.relative_to(REPO)}: {target}")
    assert not broken, f"links to files that do not exist: {broken}"


def test_the_link_check_sees_links() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "docs/index.md" in _LINK.findall(readme)


_MACHINE_PATH = re.compile(r"(?<![\w.~])/(?:work|root|home)/|(?<![\w.~])/tmp/(?!\.\.\.)")


def test_no_doc_names_a_path_on_one_machine() -> None:
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in _doc_files()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if _MACHINE_PATH.search(line)
    ]
    assert not found, f"absolute machine paths in the docs: {found}"
    assert _MACHINE_PATH.search("see /work/main/x") and _MACHINE_PATH.search("in /tmp/ci-check")
    assert not _MACHINE_PATH.search("temp paths (``/tmp/...``) and a private `/tmp`")




def test_nothing_points_outside_the_repository_for_the_design() -> None:
    places = [REPO / "README.md", REPO / "Makefile"]
    for folder in ("harness", "tests", "notebooks"):
        places += [p for p in (REPO / folder).rglob("*") if p.suffix in (".py", ".ipynb", ".md", ".toml")]
    pointing = [
        str(p.relative_to(REPO))
        for p in places
        if p.is_file() and p != Path(__file__).resolve() and "DESIGN.md" in p.read_text(encoding="utf-8")
    ]
    assert not pointing, f"files pointing to DESIGN.md instead of docs/design.md: {pointing}"
