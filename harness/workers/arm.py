"""An arm's worker: the built-in `llm-edit` (with its repair turns) or an agent command template.

The manual: docs/gated-path.md, "Agent arms".
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from harness.errors import Code, WorkerRefusal

__all__ = ["MAX_REPAIR_TURNS", "SHELLS", "SHELL_OPERATORS", "TEMPLATE_PLACEHOLDERS", "WORKER_KINDS", "ArmWorker"]

WORKER_KINDS: Final = ("llm-edit", "command")
TEMPLATE_PLACEHOLDERS: Final = ("prompt_file", "model", "base_url", "workspace", "python")
"""What an agent command template may name: the dispatch's prompt file, the system's model id, the
metering proxy's base URL, the workspace and the interpreter running proctor."""
MAX_REPAIR_TURNS: Final = 20
_KEYS: Final = frozenset({"kind", "template", "repair_turns"})
_PLACEHOLDER: Final = re.compile(r"\{([^{}]*)\}")
_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SHELL_OPERATORS: Final = frozenset({"|", "||", "&", "&&", ";", ";;", ">", ">>", "<", "<<", "<<<", "|&", "&>", "2>",
                                    "2>>", "2>&1", ">&2", "1>&2", "(", ")", "{", "}", "!"})  # fmt: skip
"""Arguments that only a shell reads as syntax (a pipe, a list, a redirection, a group)."""
SHELLS: Final = frozenset({"sh", "bash", "dash", "zsh", "ksh", "fish", "csh", "tcsh"})
_EXPANSION: Final = re.compile(r"\$\(|`|\$\{|\$[A-Za-z_]")


def _shell_syntax(template: list[str] | tuple[str, ...]) -> str | None:
    """Why an argv is meant for a shell (it would be passed literally, never interpreted), or None."""
    if os.path.basename(template[0]) in SHELLS and any(a == "-c" or (a.startswith("-") and "c" in a[1:]
                                                                     and not a.startswith("--"))
                                                       for a in template[1:]):  # fmt: skip
        return f"{template[0]} -c runs a shell command line; give the agent's own argv"
    for arg in template:
        if arg in SHELL_OPERATORS:
            return f"{arg!r} is shell syntax (a pipe, list, redirection or group); no shell runs the template"
        if _EXPANSION.search(arg):
            return f"{arg!r} asks a shell to expand it ($VAR, ${{...}}, $(...) or backquotes); nothing would"
    return None


def _check_template(template: Any) -> tuple[str, ...]:
    if isinstance(template, (str, bytes)):
        raise WorkerRefusal(Code.AGENT_TEMPLATE_SHELL_STRING,
                            f"an agent template is an argv array, not a shell string: {template!r}")  # fmt: skip
    if not isinstance(template, (list, tuple)) or not all(isinstance(a, str) for a in template):
        raise WorkerRefusal(Code.AGENT_TEMPLATE_INVALID, "an agent template must be an array of strings")
    if not template:
        raise WorkerRefusal(Code.AGENT_TEMPLATE_EMPTY, "an agent template needs at least its program")
    if any(not a or "\0" in a for a in template):
        raise WorkerRefusal(Code.AGENT_TEMPLATE_INVALID, "every argument must be a non-empty string without NUL")
    if any(c.isspace() for c in template[0]):
        raise WorkerRefusal(Code.AGENT_TEMPLATE_SHELL_STRING,
                            f"the program {template[0]!r} holds whitespace: a shell command line, not an argv")  # fmt: skip
    why = _shell_syntax(template)
    if why is not None:
        raise WorkerRefusal(Code.AGENT_TEMPLATE_SHELL_SYNTAX, why)
    for arg in template:
        for name in _PLACEHOLDER.findall(arg):
            if not _NAME.fullmatch(name) or name not in TEMPLATE_PLACEHOLDERS:
                raise WorkerRefusal(Code.AGENT_TEMPLATE_PLACEHOLDER_UNKNOWN,
                                    f"unknown placeholder {{{name}}} in {arg!r} "
                                    f"(known: {', '.join(TEMPLATE_PLACEHOLDERS)})")  # fmt: skip
    return tuple(template)


@dataclass(frozen=True)
class ArmWorker:
    """Which worker an arm runs on its system's model.

    Attributes:
        kind: "llm-edit" (the built-in worker) or "command" (an agent command template).
        template: the command's argv with placeholders (`TEMPLATE_PLACEHOLDERS`); empty for llm-edit.
        repair_turns: llm-edit's bounded repair loop (0: single shot); 0 for a command.
    """

    kind: str
    template: tuple[str, ...] = ()
    repair_turns: int = 0

    def __post_init__(self) -> None:
        if self.kind not in WORKER_KINDS:
            raise WorkerRefusal(Code.ARM_WORKER_UNKNOWN,
                                f"unknown worker {self.kind!r} (known: {', '.join(WORKER_KINDS)})")  # fmt: skip
        turns = self.repair_turns
        if isinstance(turns, bool) or not isinstance(turns, int) or not 0 <= turns <= MAX_REPAIR_TURNS:
            raise WorkerRefusal(Code.REPAIR_TURNS_INVALID, f"repair_turns must be an integer in 0..{MAX_REPAIR_TURNS}, "
                                                           f"not {turns!r}")  # fmt: skip
        if self.kind == "llm-edit":
            if self.template:
                raise WorkerRefusal(Code.ARM_WORKER_INVALID, "llm-edit takes no template (it is built in)")
            return
        object.__setattr__(self, "template", _check_template(self.template))
        if turns:
            raise WorkerRefusal(Code.ARM_WORKER_INVALID, "repair_turns belongs to llm-edit; an agent command "
                                                         "runs its own loop")  # fmt: skip

    @classmethod
    def from_json(cls, doc: Any) -> ArmWorker:
        """A worker from its JSON or TOML form: `{"kind", "template"?, "repair_turns"?}`, strictly."""
        if isinstance(doc, str):
            if doc in WORKER_KINDS and doc != "command":
                return cls(doc)
            raise WorkerRefusal(Code.ARM_WORKER_UNKNOWN, f"unknown worker {doc!r} (give llm-edit, or a table with "
                                                         "kind = \"command\" and its template)")  # fmt: skip
        if not isinstance(doc, Mapping):
            raise WorkerRefusal(Code.ARM_WORKER_INVALID, "a worker is a name or a table")
        unknown = sorted(set(doc) - _KEYS)
        if unknown:
            raise WorkerRefusal(Code.ARM_WORKER_INVALID, f"unknown worker keys: {', '.join(map(str, unknown))}")
        if "kind" not in doc:
            raise WorkerRefusal(Code.ARM_WORKER_INVALID, "a worker needs its kind")
        template = doc.get("template", [])
        if doc["kind"] == "command" and "template" not in doc:
            raise WorkerRefusal(Code.AGENT_TEMPLATE_EMPTY, "a command worker needs its template")
        if doc["kind"] == "command":
            template = _check_template(template)
        elif not isinstance(template, (list, tuple)):
            raise WorkerRefusal(Code.ARM_WORKER_INVALID, "llm-edit takes no template (it is built in)")
        return cls(doc["kind"], tuple(template), doc.get("repair_turns", 0))

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "template": list(self.template), "repair_turns": self.repair_turns}

    def render(self, *, model: str, prompt_file: str, base_url: str, python: str, workspace: str) -> list[str]:
        """The argv this worker runs: llm-edit's own, or the template with every placeholder filled (one pass)."""
        if self.kind == "llm-edit":
            return [python, "-m", "harness", "worker", "llm-edit", "--model", model, "--prompt-file", prompt_file,
                    "--workspace", workspace, "--repair-turns", str(self.repair_turns)]  # fmt: skip
        values = {"prompt_file": prompt_file, "model": model, "base_url": base_url, "python": python,
                  "workspace": workspace}  # fmt: skip
        return [_PLACEHOLDER.sub(lambda m: values[m.group(1)], arg) for arg in self.template]
