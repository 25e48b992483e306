"""The public API (`harness.__all__`) is pinned: a name is added or removed on purpose, never by accident.

`harness/__init__.py` imports each name on first use (`_PUBLIC`); these tests
check that every name resolves to the object its module defines, that the
type checker's imports agree with the table, and that `import harness` stays lazy.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import harness

PUBLIC_API = [
    "Code",
    "Refusal",
    "__version__",
    "amend",
    "analyze_results",
    "analyze_study",
    "audit_results",
    "build_report",
    "check_prereg",
    "draft_prereg",
    "freeze",
    "plan_study",
    "preflight",
    "run_batch",
    "run_stage",
]


def test_all_is_pinned() -> None:
    assert harness.__all__ == PUBLIC_API
    assert harness.__all__ == sorted(harness.__all__)


def test_every_public_name_has_a_home() -> None:
    assert set(harness._PUBLIC) | {"__version__"} == set(harness.__all__)


@pytest.mark.parametrize("name", sorted(harness._PUBLIC))
def test_each_name_resolves_to_its_module_object(name: str) -> None:
    module = importlib.import_module(harness._PUBLIC[name])
    assert getattr(harness, name) is getattr(module, name)
    assert name in getattr(module, "__all__", [name])


def test_version_and_dir() -> None:
    from harness._version import __version__

    assert harness.__version__ == __version__
    assert dir(harness) == sorted(PUBLIC_API)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'not_public'"):
        harness.not_public  # noqa: B018


def test_type_checking_imports_match_the_table() -> None:
    tree = ast.parse(Path(harness.__file__).read_text(encoding="utf-8"))
    block = next(node for node in tree.body if isinstance(node, ast.If)
                 and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
    imported = {alias.name: node.module for node in block.body if isinstance(node, ast.ImportFrom)
                for alias in node.names}
    assert imported == harness._PUBLIC


def test_import_harness_stays_lazy() -> None:
    code = "import sys, harness; print(sorted(m for m in sys.modules if m.startswith('harness')))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "['harness', 'harness._version']"
