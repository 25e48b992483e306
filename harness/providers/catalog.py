"""The model catalog: which models proctor can dispatch to, how to reach them, how to run their worker.

The manual: docs/models.md.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from harness.errors import Code, ProviderRefusal, Refusal
from harness.evidence.jsonio import read_bytes, sha256_hex
from harness.providers.registry import api_shapes, find_adapter

__all__ = [
    "BUNDLED_CATALOG",
    "CATALOG_ENV",
    "EXAMPLE_CATALOG",
    "LANES",
    "WORKER_NETWORKS",
    "Catalog",
    "CatalogModel",
    "WorkerTemplate",
    "catalog_location",
    "family_of",
    "load_catalog",
    "parse_catalog",
    "resolve_model",
    "worker_env",
]

_DATA: Final = Path(__file__).resolve().parent.parent / "data"
BUNDLED_CATALOG: Final = _DATA / "catalog.toml"
"""The default catalog: the simulator's systems."""
EXAMPLE_CATALOG: Final = _DATA / "catalog.example.toml"
"""A template for hosted models; copy it and point `--catalog` or `PROCTOR_CATALOG` at the copy."""
CATALOG_ENV: Final = "PROCTOR_CATALOG"

LANES: Final = ("flash", "glm", "k3")
"""The same tiers as the task file's lanes (`harness.gate.task.LANES`)."""

_MAX_BYTES: Final = 1024 * 1024
_TOP_KEYS: Final = frozenset({"model"})
_MODEL_REQUIRED: Final = ("id", "provider", "api_shape", "base_url", "credential_env", "pricing_key", "lane")
_MODEL_KEYS: Final = frozenset({*_MODEL_REQUIRED, "api_model", "base_url_env", "worker"})
_WORKER_KEYS: Final = frozenset({"argv", "resume", "base_url_var", "network"})
WORKER_NETWORKS: Final = ("proxy", "none")
"""What a worker's sandbox lets it reach: the metering proxy only, or nothing."""
_ID: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$")
_ENV_NAME: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_PLACEHOLDER: Final = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
ARGV_PLACEHOLDERS: Final = ("model", "workspace", "prompt_file", "python")
RESUME_PLACEHOLDERS: Final = (*ARGV_PLACEHOLDERS, "session")


@dataclass(frozen=True)
class WorkerTemplate:
    """How to run an agent on a model: an argv template, resume arguments, its base-URL variable,
    and what its sandbox lets it reach (`network`: "proxy" or "none")."""

    argv: tuple[str, ...]
    resume: tuple[str, ...] = ()
    base_url_var: str | None = None
    network: str = "proxy"

    @property
    def needs_proxy(self) -> bool:
        """Whether the worker talks to its model (through the metering proxy)."""
        return self.network == "proxy"

    def render(
        self,
        *,
        model: str,
        workspace: str,
        prompt_file: str,
        python: str,
        session: str | None = None,
    ) -> list[str]:
        """The worker's argv with placeholders filled; with `session`, the resume arguments appended."""
        values = {"model": model, "workspace": workspace, "prompt_file": prompt_file, "python": python}
        argv = [_fill(a, values) for a in self.argv]
        if session is not None:
            if not self.resume:
                raise ProviderRefusal(Code.RESUME_UNSUPPORTED, f"the worker of {model!r} has no resume arguments")
            argv += [_fill(a, {**values, "session": session}) for a in self.resume]
        return argv

    def to_json(self) -> dict[str, Any]:
        return {"argv": list(self.argv), "resume": list(self.resume), "base_url_var": self.base_url_var,
                "network": self.network}  # fmt: skip


def _fill(arg: str, values: Mapping[str, str]) -> str:
    # One pass, so a filled value that itself looks like a placeholder is left alone.
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), arg)


@dataclass(frozen=True)
class CatalogModel:
    """One catalog entry. `credential_env` is a variable name; its value is never held here."""

    id: str
    api_model: str
    provider: str
    api_shape: str
    base_url: str
    base_url_env: str | None
    credential_env: str
    pricing_key: str
    lane: str
    worker: WorkerTemplate | None

    def effective_base_url(self, env: Mapping[str, str] | None = None) -> str:
        """`base_url`, or the value of `base_url_env` when that variable is set and not empty."""
        source = os.environ if env is None else env
        if self.base_url_env and source.get(self.base_url_env):
            return source[self.base_url_env]
        return self.base_url

    def credential_set(self, env: Mapping[str, str] | None = None) -> bool | None:
        """Whether the credential variable is set (None when the model needs no credential)."""
        if not self.credential_env:
            return None
        return bool((os.environ if env is None else env).get(self.credential_env))

    @property
    def family(self) -> str:
        """The id's prefix before its first '-' (e.g. `sim` for `sim-flash`)."""
        return self.id.split("-", 1)[0].lower()

    def to_json(self) -> dict[str, Any]:
        """The entry as configured (no credential value: there is none here to show)."""
        return {
            "id": self.id,
            "api_model": self.api_model,
            "provider": self.provider,
            "api_shape": self.api_shape,
            "base_url": self.base_url,
            "base_url_env": self.base_url_env,
            "credential_env": self.credential_env,
            "pricing_key": self.pricing_key,
            "lane": self.lane,
            "worker": None if self.worker is None else self.worker.to_json(),
        }


@dataclass(frozen=True)
class Catalog:
    """A validated catalog, where it came from, and the sha256 of its bytes."""

    models: tuple[CatalogModel, ...]
    path: str
    sha256: str
    source: str
    """How it was found: "flag" (`--catalog`), "env" (`PROCTOR_CATALOG`) or "bundled"."""

    def ids(self) -> list[str]:
        return [m.id for m in self.models]

    def get(self, model_id: str) -> CatalogModel | None:
        return next((m for m in self.models if m.id == model_id), None)

    def in_lane(self, lane: str) -> list[CatalogModel]:
        return [m for m in self.models if m.lane == lane]

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "sha256": self.sha256, "source": self.source, "ids": self.ids()}


def catalog_location(explicit: str | os.PathLike[str] | None = None) -> tuple[str, str]:
    """(path, source) of the catalog to use: `--catalog`, then `PROCTOR_CATALOG`, then the bundled one."""
    if explicit is not None:
        return os.path.abspath(os.fspath(explicit)), "flag"
    from_env = os.environ.get(CATALOG_ENV)
    if from_env:
        return os.path.abspath(from_env), "env"
    return str(BUNDLED_CATALOG), "bundled"


def load_catalog(explicit: str | os.PathLike[str] | None = None) -> Catalog:
    """Find, read (once) and validate the catalog."""
    path, source = catalog_location(explicit)
    data = read_bytes(path, max_bytes=_MAX_BYTES)
    return parse_catalog(data, path, source=source)


def parse_catalog(data: bytes, path: str, *, source: str = "flag") -> Catalog:
    """Validate catalog bytes (exactly as read) into a `Catalog`; every problem is `catalog_invalid`."""

    def bad(message: str, **details: Any) -> Refusal:
        return ProviderRefusal(Code.CATALOG_INVALID, message, path, **details)

    digest = sha256_hex(data)
    try:
        text = data.decode("utf-8", "strict")
    except UnicodeDecodeError as exc:
        raise bad(f"not UTF-8 at byte {exc.start}") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:  # includes duplicate keys and redefined tables
        raise bad(f"not valid TOML: {exc}") from None
    except RecursionError:  # tomllib recurses on nested arrays and inline tables
        raise bad("not valid TOML: nested too deeply") from None
    unknown = sorted(set(doc) - _TOP_KEYS)
    if unknown:
        raise bad(f"unknown top-level keys: {', '.join(unknown)} (expected [[model]] tables)")
    entries = doc.get("model")
    if not isinstance(entries, list) or not entries:
        raise bad("the catalog must hold at least one [[model]] table")
    models: list[CatalogModel] = []
    seen: dict[str, int] = {}
    for index, entry in enumerate(entries):
        model = _model(entry, index, bad)
        if model.id in seen:
            raise bad(f"duplicate id {model.id!r} (model[{seen[model.id]}] and model[{index}])", id=model.id)
        seen[model.id] = index
        models.append(model)
    return Catalog(models=tuple(models), path=path, sha256=digest, source=source)


def _model(entry: Any, index: int, bad: Any) -> CatalogModel:
    where = f"model[{index}]"
    if not isinstance(entry, dict):
        raise bad(f"{where} must be a table")
    unknown = sorted(set(entry) - _MODEL_KEYS)
    if unknown:
        raise bad(f"{where}: unknown keys: {', '.join(unknown)}")
    for key in _MODEL_REQUIRED:
        if key not in entry:
            raise bad(f"{where}: {key} is required")
    model_id = _text(entry, "id", where, bad)
    if not _ID.match(model_id):
        raise bad(f"{where}.id {model_id!r}: 1-128 of letters, digits and ._:/@+- starting with a letter or digit")
    where = f"model {model_id!r}"
    api_model = _text(entry, "api_model", where, bad) if "api_model" in entry else model_id
    provider = _text(entry, "provider", where, bad)
    shape = _text(entry, "api_shape", where, bad)
    if find_adapter(shape) is None:
        raise bad(f"{where}: api_shape {shape!r} is not one of {', '.join(api_shapes())}")
    base_url = _text(entry, "base_url", where, bad)
    if not re.match(r"^https?://[^\s/]+", base_url):
        raise bad(f"{where}: base_url must be an http:// or https:// URL")
    base_url_env = _env_name(entry, "base_url_env", where, bad) if "base_url_env" in entry else None
    credential_env = entry["credential_env"]
    if not isinstance(credential_env, str):
        raise bad(f"{where}: credential_env must be a string (a variable name, or \"\" for none)")
    if credential_env and not _ENV_NAME.match(credential_env):
        # Never echo it: a key pasted here by mistake must not reach a terminal or a log.
        raise bad(f"{where}: credential_env must be the NAME of an environment variable (letters, digits, _), not a key")
    pricing_key = _text(entry, "pricing_key", where, bad)
    lane = _text(entry, "lane", where, bad)
    if lane not in LANES:
        raise bad(f"{where}: lane {lane!r} is not one of {', '.join(LANES)}")
    worker = _worker(entry["worker"], where, bad) if "worker" in entry else None
    return CatalogModel(
        id=model_id,
        api_model=api_model,
        provider=provider,
        api_shape=shape,
        base_url=base_url,
        base_url_env=base_url_env,
        credential_env=credential_env,
        pricing_key=pricing_key,
        lane=lane,
        worker=worker,
    )


def _worker(value: Any, where: str, bad: Any) -> WorkerTemplate:
    where = f"{where}.worker"
    if not isinstance(value, dict):
        raise bad(f"{where} must be a table")
    unknown = sorted(set(value) - _WORKER_KEYS)
    if unknown:
        raise bad(f"{where}: unknown keys: {', '.join(unknown)}")
    if "argv" not in value:
        raise bad(f"{where}: argv is required")
    argv = _argv(value["argv"], f"{where}.argv", ARGV_PLACEHOLDERS, bad, allow_empty=False)
    resume = _argv(value.get("resume", []), f"{where}.resume", RESUME_PLACEHOLDERS, bad, allow_empty=True)
    base_url_var = _env_name(value, "base_url_var", where, bad) if "base_url_var" in value else None
    network = value.get("network", "proxy")
    if network not in WORKER_NETWORKS:
        raise bad(f"{where}: network must be one of {', '.join(WORKER_NETWORKS)}, not {network!r}")
    return WorkerTemplate(argv=argv, resume=resume, base_url_var=base_url_var, network=network)


def _argv(value: Any, where: str, allowed: Sequence[str], bad: Any, *, allow_empty: bool) -> tuple[str, ...]:
    if isinstance(value, str):
        raise bad(f"{where} is a shell string; give an array of strings")
    if not isinstance(value, list) or not all(isinstance(a, str) and a for a in value):
        raise bad(f"{where} must be an array of non-empty strings")
    if not value and not allow_empty:
        raise bad(f"{where} must not be empty")
    for arg in value:
        for name in _PLACEHOLDER.findall(arg):
            if name not in allowed:
                raise bad(f"{where}: unknown placeholder {{{name}}} (known: {', '.join(allowed)})")
    return tuple(value)


def _text(entry: Mapping[str, Any], key: str, where: str, bad: Any) -> str:
    value = entry[key]
    if not isinstance(value, str) or not value.strip():
        raise bad(f"{where}: {key} must be a non-empty string")
    return value


def _env_name(entry: Mapping[str, Any], key: str, where: str, bad: Any) -> str:
    value = entry[key]
    if not isinstance(value, str) or not _ENV_NAME.match(value):
        raise bad(f"{where}: {key} must be an environment variable name (letters, digits, _)")
    return value


def family_of(catalog: Catalog, model_id: str) -> list[str]:
    """Ids of the same family as `model_id`: the same prefix before the first '-', or the same provider.

    An unknown id has no provider of its own; its prefix names one when it
    equals a provider (`openai-...`), and the providers of the ids sharing its
    prefix count as its family too.
    """
    prefix = model_id.split("-", 1)[0].lower()
    providers = {m.provider.lower() for m in catalog.models if m.family == prefix}
    providers.add(prefix)
    known = catalog.get(model_id)
    if known is not None:
        providers.add(known.provider.lower())
    return [m.id for m in catalog.models if m.family == prefix or m.provider.lower() in providers]


def resolve_model(catalog: Catalog, model_id: str) -> CatalogModel:
    """The catalog entry `model_id`; refuses `unknown_model` listing the ids of its family."""
    found = catalog.get(model_id)
    if found is not None:
        return found
    family = family_of(catalog, model_id)
    hint = f"same family: {', '.join(family)}" if family else f"known ids: {', '.join(catalog.ids())}"
    raise ProviderRefusal(
        Code.UNKNOWN_MODEL,
        f"no model {model_id!r} in the catalog ({hint})",
        catalog.path,
        family=family,
        known=catalog.ids(),
    )


def worker_env(model: CatalogModel, catalog: Catalog, base_url: str) -> dict[str, str]:
    """Environment for a worker running `model`: its id, the catalog, and its base URL variables.

    `base_url` (the metering proxy's, or the model's own) goes into the
    worker's `base_url_var` and into the model's `base_url_env`, so a worker
    that resolves the model from `PROCTOR_CATALOG` reaches the same endpoint.
    The credential variable is not set here: the worker inherits it.
    """
    env = {"PROCTOR_MODEL": model.id, CATALOG_ENV: catalog.path}
    if model.base_url_env:
        env[model.base_url_env] = base_url
    if model.worker is not None and model.worker.base_url_var:
        env[model.worker.base_url_var] = base_url
    return env
