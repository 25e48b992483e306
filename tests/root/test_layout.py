"""The tests mirror the packages: tests/<package>/test_<module>.py, helpers in tests/support/.

No test file lies directly in tests/ (only conftest.py and __init__.py), every
test folder is a package, and no test module imports another test module or
conftest: shared helpers live in tests/support/ and fixtures reach the tests
through conftest's `pytest_plugins`.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.paths import REPO

TESTS = REPO / "tests"
DATA = {"fixtures", "__pycache__"}
"""Folders under tests/ that hold data (hostile workers, recorded responses), not test code."""
EXTRA = {"e2e", "root", "support", "bench"}
"""Test folders that mirror no package: end-to-end runs, the root modules, helpers, benchmarks."""


def _code_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if not DATA & set(p.relative_to(TESTS).parts[:-1]))


def _imported(path: Path) -> list[str]:
    """Every module `path` imports, relative imports resolved against its package."""
    package = ".".join(path.relative_to(REPO).parts[:-1])
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join([*parts[: len(parts) - node.level + 1], *([base] if base else [])])
            out.append(base)
            out += [f"{base}.{alias.name}" for alias in node.names]
    return out


def _is_test_module(name: str) -> bool:
    last = name.rsplit(".", 1)[-1]
    return last.startswith("test_") or last == "conftest"


def test_no_test_file_lies_directly_in_tests() -> None:
    loose = sorted(p.name for p in TESTS.glob("*.py") if p.name not in {"conftest.py", "__init__.py"})
    assert loose == [], f"move these into tests/<package>/ or tests/e2e/: {loose}"


def test_test_folders_mirror_the_packages_and_are_packages() -> None:
    packages = {p.parent.name for p in (REPO / "harness").glob("*/__init__.py")}
    for folder in sorted(p for p in TESTS.iterdir() if p.is_dir() and p.name not in DATA and not p.name.startswith(".")):
        assert folder.name in packages | EXTRA, f"tests/{folder.name}/ mirrors no package of harness/"
        assert (folder / "__init__.py").is_file(), f"tests/{folder.name}/ needs an __init__.py"


def test_no_test_module_imports_another_test_module_or_conftest() -> None:
    found = [
        f"{path.relative_to(REPO)} imports {name}"
        for path in _code_files()
        for name in _imported(path)
        if _is_test_module(name)
    ]
    assert found == [], "\n".join(found)


def test_the_checker_sees_test_module_imports() -> None:
    assert _is_test_module("test_design")
    assert _is_test_module("tests.prereg.test_design")
    assert _is_test_module("conftest")
    assert _is_test_module("tests.conftest")
    assert not _is_test_module("tests.support.design")
    assert not _is_test_module("harness.run.attempts")


def test_tests_sharing_a_module_fixture_are_one_xdist_group_and_an_own_group_is_kept() -> None:
    """tests/support/groups.py, as `make test` collects: read from the collected items' marks."""
    import pytest

    groups: dict[str, str | None] = {}

    class Marks:
        @pytest.hookimpl(trylast=True)
        def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
            for item in items:
                mark = item.get_closest_marker("xdist_group")
                groups[item.nodeid] = None if mark is None else str(mark.args[0])

    files = ["tests/audit/test_audit.py", "tests/run/test_remote.py"]
    code = pytest.main(["--collect-only", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", "--rootdir", str(REPO),
                        *(str(REPO / f) for f in files)], plugins=[Marks()])
    assert code == 0
    audit = {k.split("::")[1].split("[")[0]: v for k, v in groups.items() if k.startswith(files[0])}
    # every test that takes `copy` takes the module-scoped `built` through it: one group, one build
    assert audit["test_with_a_witness_every_flipped_byte_is_a_break"] == "tests.audit.test_audit.module-scope"
    assert audit["test_each_named_edit_is_a_named_break"] == "tests.audit.test_audit.module-scope"
    assert audit["test_anchor_form_names_each_wrong_field"] is None  # no shared set-up: it still spreads
    assert {v for k, v in groups.items() if k.startswith(files[1])} == {"ray-cluster"}


def test_an_xdist_group_runs_on_one_worker_under_make_tests_options(tmp_path: Path) -> None:
    """Real xdist workers (`-n 2 --dist loadgroup`, as `make test`): a group's tests carry `@<group>` in their ids and
    run on one worker. pytest 9 ignores the `item._nodeid` xdist 3.8 sets; tests/support/groups.py sets the id."""
    import os
    import re
    import subprocess
    import sys

    (tmp_path / "test_g.py").write_text("import pytest\n\npytestmark = pytest.mark.xdist_group('g')\n\n"
                                        + "".join(f"def test_{i}() -> None:\n    pass\n\n" for i in range(6)))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider",
                           "-p", "tests.support.groups", "test_g.py"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    ran = re.findall(r"\[(gw\d)\].*PASSED (\S+)", done.stdout)
    assert len(ran) == 6 and all(nodeid.endswith("@g") for _, nodeid in ran), done.stdout
    assert len({worker for worker, _ in ran}) == 1, ran
