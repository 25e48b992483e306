"""A static scan of changed Python files for known ways to forge a verdict (`suspicious_code`).

A flag is not a verdict: it makes `proctor accept` refuse the receipt unless
`--allow-flagged` is given (a reviewed, counted override). The patterns and
what the scan does not catch: docs/sandbox.md.
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterable, Mapping
from typing import Final

from harness.evidence.jsonio import read_bytes
from harness.evidence.pysource import parse_python
from harness.evidence.tree_entry import TreeEntry, diff_trees, display_path
from harness.records.receipt import SuspiciousLine

__all__ = ["PATTERNS", "scan_changed", "scan_source"]

PATTERNS: Final = {
    "os._exit": "ends the process without running pytest's reporting",
    "atexit": "runs code after the verifier decided, at interpreter exit",
    "sys.modules[...] =": "replaces a module other code imports",
    "writes into a test framework": "changes pytest, _pytest, unittest or builtins",
    "constant __eq__/__ne__/__hash__": "an object equal to everything",
    "sys.settrace/sys.setprofile": "watches or rewrites the running tests",
    "signal handler": "takes over a signal the verifier relies on",
    "unparsable": "the file does not parse as Python: it could not be scanned",
}
"""Each pattern the scan flags, and why it is suspicious."""

_GUARDED: Final = frozenset({"pytest", "_pytest", "unittest", "builtins", "__builtins__", "pluggy", "_pluggy"})
_SCANNED_SUFFIXES: Final = (".py", ".pyw", ".pth")
_SIZE_LIMIT: Final = 4 * 1024 * 1024


def _root(node: ast.expr) -> ast.expr:
    while isinstance(node, ast.Attribute | ast.Subscript | ast.Call):
        node = node.value if not isinstance(node, ast.Call) else node.func
    return node


def _dotted(node: ast.expr) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def _returns_constant(fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> bool:
    if isinstance(fn, ast.Lambda):
        return isinstance(fn.body, ast.Constant)
    body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    return len(body) == 1 and isinstance(body[0], ast.Return) and (
        body[0].value is None or isinstance(body[0].value, ast.Constant)
    )


class _Scanner(ast.NodeVisitor):
    def __init__(self) -> None:
        self.found: list[tuple[int, str]] = []
        self.aliases: dict[str, str] = {}  # local name -> the module (or module.attr) it stands for

    def flag(self, node: ast.AST, pattern: str) -> None:
        self.found.append((getattr(node, "lineno", 0), pattern))

    def _module_of(self, node: ast.expr) -> str | None:
        """The module (as imported) a reference like `x.y` starts from, resolving import aliases."""
        name = _dotted(node)
        if name is None:
            return None
        head, _, rest = name.partition(".")
        full = self.aliases.get(head, head)
        return f"{full}.{rest}" if rest else full

    def _guarded(self, target: ast.expr) -> bool:
        root = _root(target)
        if not isinstance(root, ast.Name):
            return False
        full = self.aliases.get(root.id)
        return root.id in _GUARDED if full is None else full.split(".")[0] in _GUARDED

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            self.aliases[(a.asname or a.name).split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
            if a.name.split(".")[0] == "atexit":
                self.flag(node, "atexit")
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        for a in node.names:
            self.aliases[a.asname or a.name] = f"{module}.{a.name}"
            full = f"{module}.{a.name}"
            if module.split(".")[0] == "atexit":
                self.flag(node, "atexit")
            if full in ("os._exit", "posix._exit"):
                self.flag(node, "os._exit")
            if full in ("sys.settrace", "sys.setprofile", "threading.settrace", "threading.setprofile"):
                self.flag(node, "sys.settrace/sys.setprofile")
            if full in ("signal.signal", "signal.setitimer", "signal.alarm"):
                self.flag(node, "signal handler")
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr == "_exit":
            self.flag(node, "os._exit")
        full = self._module_of(node)
        if full in ("sys.settrace", "sys.setprofile", "threading.settrace", "threading.setprofile"):
            self.flag(node, "sys.settrace/sys.setprofile")
        if full in ("signal.signal", "signal.setitimer", "signal.alarm", "signal.set_wakeup_fd"):
            self.flag(node, "signal handler")
        if full is not None and full.startswith("atexit."):
            self.flag(node, "atexit")
        self.generic_visit(node)

    def _check_targets(self, node: ast.AST, targets: Iterable[ast.expr]) -> None:
        for target in targets:
            if isinstance(target, ast.Subscript) and self._module_of(target.value) == "sys.modules":
                self.flag(node, "sys.modules[...] =")
            elif isinstance(target, ast.Attribute | ast.Subscript) and self._guarded(target):
                self.flag(node, "writes into a test framework")
            elif isinstance(target, ast.Name) and target.id in ("__eq__", "__ne__", "__hash__"):
                value = getattr(node, "value", None)
                if isinstance(value, ast.Lambda) and _returns_constant(value):
                    self.flag(node, "constant __eq__/__ne__/__hash__")

    def visit_Assign(self, node: ast.Assign) -> None:
        self._check_targets(node, node.targets)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._check_targets(node, [node.target])
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._check_targets(node, [node.target])
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        self._check_targets(node, node.targets)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = self._module_of(node.func) if isinstance(node.func, ast.Attribute | ast.Name) else None
        setter = func in ("setattr", "delattr", "builtins.setattr", "builtins.delattr")
        if setter and node.args and self._guarded(node.args[0]):
            self.flag(node, "writes into a test framework")
        owner = node.func.value if isinstance(node.func, ast.Attribute) else None
        mutates = isinstance(node.func, ast.Attribute) and node.func.attr in ("update", "__setitem__", "setdefault")
        if mutates and owner is not None and self._module_of(owner) == "sys.modules":
            self.flag(node, "sys.modules[...] =")
        self.generic_visit(node)

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        if node.name in ("__eq__", "__ne__", "__hash__") and _returns_constant(node):
            self.flag(node, "constant __eq__/__ne__/__hash__")
        self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._function(node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._function(node)


_TEXT_PATTERNS: Final = (
    (re.compile(rb"\b_exit\b"), "os._exit"),
    (re.compile(rb"\batexit\b"), "atexit"),
    (re.compile(rb"\bsettrace\b|\bsetprofile\b"), "sys.settrace/sys.setprofile"),
)


def scan_source(path: str, source: bytes) -> list[SuspiciousLine]:
    """The suspicious lines of one file's source (a `.pth` file is scanned as text)."""
    found: list[tuple[int, str]] = []
    try:
        if path.endswith(".pth"):
            raise SyntaxError("a .pth file")
        tree = parse_python(source, filename=path)
    except (SyntaxError, ValueError):
        for n, line in enumerate(source.split(b"\n"), 1):
            found.extend((n, pattern) for rx, pattern in _TEXT_PATTERNS if rx.search(line))
        if not path.endswith(".pth"):
            found.append((1, "unparsable"))
    else:
        scanner = _Scanner()
        scanner.visit(tree)
        found = scanner.found
    return [SuspiciousLine(path=path, line=n, pattern=p) for n, p in sorted(set(found))]


def scan_changed(workspace: str, baseline: Mapping[bytes, TreeEntry], current: Mapping[bytes, TreeEntry]) -> list[SuspiciousLine]:
    """Scan every Python file added or changed since the baseline (by name: `.py`, `.pyw`, `.pth`)."""
    diff = diff_trees(baseline, current)
    out: list[SuspiciousLine] = []
    for rel in sorted({*diff.added, *diff.changed}):
        entry = current[rel]
        if entry.kind != "file" or not rel.endswith(tuple(s.encode() for s in _SCANNED_SUFFIXES)):
            continue
        name = display_path(rel)
        if entry.size > _SIZE_LIMIT:
            out.append(SuspiciousLine(path=name, line=0, pattern="unparsable"))
            continue
        out.extend(scan_source(name, read_bytes(os.path.join(workspace, os.fsdecode(rel)))))
    return out
