"""The simulator's decisions: pure data and pure functions, no files and no sockets.

The manual: docs/models.md.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Final

from harness.errors import Code, ProviderRefusal, Refusal
from harness.evidence.jsonio import loads_strict

__all__ = [
    "FAILURE_KINDS",
    "GENERIC_ANSWER",
    "MAX_LATENCY_S",
    "TIMEOUT_SLEEP_S",
    "Decision",
    "Failures",
    "Item",
    "Latency",
    "Reply",
    "SimService",
    "SimSystem",
    "decide",
    "error_reply",
    "find_item",
    "merge_items",
    "parse_systems",
    "text_tokens",
    "uniform",
]

GENERIC_ANSWER: Final = "I don't know."
TIMEOUT_SLEEP_S: Final = 30.0
"""How long a planted timeout holds the request (past any sane client timeout; never scaled)."""

MAX_LATENCY_S: Final = 600.0
"""The longest latency a system may declare or draw."""

_FILLER: Final = " I do not have enough information to answer this question."
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")


@dataclass(frozen=True)
class Latency:
    """A latency distribution: `fixed` (value) or `lognormal` (median, sigma), in seconds."""

    dist: str
    median: float
    sigma: float = 0.0

    def draw(self, u: float) -> float:
        """The latency at quantile `u` of the distribution."""
        if self.dist == "fixed" or self.sigma == 0.0:
            return self.median
        z = NormalDist().inv_cdf(min(max(u, 2.0**-53), 1.0 - 2.0**-53))
        return min(self.median * math.exp(self.sigma * z), MAX_LATENCY_S)


@dataclass(frozen=True)
class Failures:
    """Probabilities of planted failures per request (their sum is at most 1)."""

    rate_limited: float = 0.0
    server_error: float = 0.0
    timeout: float = 0.0
    auth: float = 0.0
    quota: float = 0.0
    malformed: float = 0.0
    context_length: float = 0.0


_CONTEXT_WINDOW: Final = 8192
"""The window a planted `context_length` failure names (the simulator holds no real window)."""
FAILURE_KINDS: Final = ("rate_limited", "server_error", "timeout", "auth", "quota", "malformed", "context_length")
"""The planted failure kinds, in the order their probability bands are laid on one draw.

rate_limited: 429 `rate_limit_exceeded`; server_error: 500; timeout: 504 after
TIMEOUT_SLEEP_S; auth: 401 `invalid_api_key` (an operator error); quota: 429
`insufficient_quota` (an operator error); malformed: 200 with a body that is not
a chat completion (no `choices`); context_length: 400 `context_length_exceeded` (the
prompt does not fit the model's window). A new kind goes last, so the old draws stay.
"""


@dataclass(frozen=True)
class SimSystem:
    """One simulated system, named by the request's `model` field."""

    name: str
    skill: float
    latency: Latency
    output_tokens_mean: int
    snapshot: str
    failures: Failures


@dataclass(frozen=True)
class Item:
    """An eval item the simulator knows: found by `match` in the last user message."""

    match: str
    answer: str
    wrong: tuple[str, ...]


@dataclass(frozen=True)
class Decision:
    """What the simulator does with one request.

    `outcome` is one of correct, wrong, generic (no item matched), or a planted
    failure kind (`FAILURE_KINDS`); `content` is None for the failures. `latency_s` is
    unscaled. `request_hash` names the request (ids are derived from it).
    """

    outcome: str
    content: str | None
    latency_s: float
    item_key: str
    n: int
    request_hash: str


def uniform(seed: int, system: str, item_key: str, n: int, stream: str) -> float:
    """A uniform in [0, 1) from sha256 of the canonical JSON of the arguments (53 bits)."""
    data = json.dumps([seed, system, item_key, n, stream], separators=(",", ":"), ensure_ascii=False)
    digest = hashlib.sha256(data.encode("utf-8", "surrogatepass")).digest()
    return (int.from_bytes(digest[:8], "big") >> 11) / float(1 << 53)


def text_tokens(text: str) -> int:
    """The simulator's token count of a text: ceil(UTF-8 bytes / 4)."""
    return -(-len(text.encode("utf-8", "surrogatepass")) // 4)


def decide(system: SimSystem, *, seed: int, item: Item | None, item_key: str, n: int) -> Decision:
    """The outcome of the n-th request (from 0) for `item_key` to `system`: a pure function."""

    def u(stream: str) -> float:
        return uniform(seed, system.name, item_key, n, stream)

    request_hash = hashlib.sha256(f"{seed}\0{system.name}\0{item_key}\0{n}".encode("utf-8", "surrogatepass"))
    ident = request_hash.hexdigest()[:24]
    latency = system.latency.draw(u("latency"))
    f, planted = u("failure"), system.failures
    edge = 0.0
    for outcome in FAILURE_KINDS:
        edge += getattr(planted, outcome)
        if f < edge:
            return Decision(outcome, None, latency, item_key, n, ident)
    if item is None:
        # A generic answer about as long as the system's answers usually are (mean output_tokens).
        tokens = max(1, round(system.output_tokens_mean * (0.5 + u("tokens"))))
        text = GENERIC_ANSWER + _FILLER * (4 * tokens // len(_FILLER) + 1)
        return Decision("generic", text[: max(4 * tokens, len(GENERIC_ANSWER))], latency, item_key, n, ident)
    if u("pass") < system.skill:
        return Decision("correct", item.answer, latency, item_key, n, ident)
    wrong = item.wrong[min(int(u("wrong") * len(item.wrong)), len(item.wrong) - 1)]
    return Decision("wrong", wrong, latency, item_key, n, ident)


def find_item(items: Sequence[Item], text: str) -> Item | None:
    """The item whose `match` occurs in `text`; the longest wins (`items` sorted by merge_items)."""
    for item in items:
        if item.match in text:
            return item
    return None


def merge_items(*groups: Iterable[Item]) -> list[Item]:
    """All items, longest match first (ties by text); a match given twice is refused."""
    seen: dict[str, Item] = {}
    for group in groups:
        for item in group:
            if item.match in seen:
                raise ProviderRefusal(Code.SIM_ANSWERS_DUPLICATE_MATCH, f"match {item.match!r} is given twice")
            seen[item.match] = item
    return sorted(seen.values(), key=lambda it: (-len(it.match), it.match))


# --- the systems file (decoded) --------------------------------------------------


def _number(value: Any, where: str, path: str, *, low: float, high: float, low_open: bool = False) -> float:
    # No math.isfinite on an int: a huge JSON integer would overflow the float conversion.
    ok = isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))
    if ok and not isinstance(value, bool) and (value > low if low_open else value >= low) and value <= high:
        return float(value)
    bound = f"({low}, {high}]" if low_open else f"[{low}, {high}]"
    raise ProviderRefusal(Code.SIM_SYSTEMS_INVALID, f"{where} must be a number in {bound}, got {json.dumps(value)}", path)


def _object(value: Any, where: str, path: str, required: set[str], optional: set[str]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ProviderRefusal(Code.SIM_SYSTEMS_INVALID, f"{where} must be an object", path)
    unknown = sorted(set(value) - required - optional)
    if unknown:
        raise ProviderRefusal(Code.SIM_SYSTEMS_INVALID, f"{where}: unknown keys: {', '.join(unknown)}", path)
    missing = sorted(required - set(value))
    if missing:
        raise ProviderRefusal(Code.SIM_SYSTEMS_INVALID, f"{where}: missing keys: {', '.join(missing)}", path)
    return value


def _latency(value: Any, where: str, path: str) -> Latency:
    dist = value.get("dist") if isinstance(value, dict) else None
    if dist == "fixed":
        doc = _object(value, where, path, {"dist", "value"}, set())
        return Latency("fixed", _number(doc["value"], f"{where}.value", path, low=0, high=MAX_LATENCY_S))
    if dist == "lognormal":
        doc = _object(value, where, path, {"dist", "median", "sigma"}, set())
        median = _number(doc["median"], f"{where}.median", path, low=0, high=MAX_LATENCY_S, low_open=True)
        return Latency("lognormal", median, _number(doc["sigma"], f"{where}.sigma", path, low=0, high=5))
    raise ProviderRefusal(Code.SIM_SYSTEMS_INVALID, f'{where} must be {{"dist": "fixed" | "lognormal", ...}}', path)


def _system(value: Any, where: str, path: str) -> SimSystem:
    optional = {"output_tokens", "snapshot", "failures"}
    doc = _object(value, where, path, {"name", "skill", "latency_s"}, optional)
    name, snapshot = doc["name"], doc.get("snapshot", doc["name"])
    if not isinstance(name, str) or not _NAME.match(name):
        raise ProviderRefusal(Code.SIM_SYSTEMS_INVALID, f"{where}.name must be 1-128 of letters, digits, . _ : / -", path)
    if not isinstance(snapshot, str) or not snapshot:
        raise ProviderRefusal(Code.SIM_SYSTEMS_INVALID, f"{where}.snapshot must be a non-empty string", path)
    tokens = _object(doc.get("output_tokens", {"mean": 200}), f"{where}.output_tokens", path, {"mean"}, set())
    mean = _number(tokens["mean"], f"{where}.output_tokens.mean", path, low=1, high=100_000)
    keys = set(FAILURE_KINDS)
    planted = _object(doc.get("failures", {}), f"{where}.failures", path, set(), keys)
    rates = {k: _number(v, f"{where}.failures.{k}", path, low=0, high=1) for k, v in planted.items()}
    if math.fsum(rates.values()) > 1:
        raise ProviderRefusal(Code.SIM_SYSTEMS_INVALID, f"{where}.failures: probabilities sum to more than 1", path)
    return SimSystem(
        name=name,
        skill=_number(doc["skill"], f"{where}.skill", path, low=0, high=1),
        latency=_latency(doc["latency_s"], f"{where}.latency_s", path),
        output_tokens_mean=round(mean),
        snapshot=snapshot,
        failures=Failures(**rates),
    )


def parse_systems(doc: Any, path: str) -> dict[str, SimSystem]:
    """Validate a decoded systems file `{"systems": [...]}`; every problem a named refusal with `path`."""
    doc = _object(doc, "the file", path, {"systems"}, set())
    if not isinstance(doc["systems"], list) or not doc["systems"]:
        raise ProviderRefusal(Code.SIM_SYSTEMS_INVALID, "systems must be a non-empty list", path)
    out: dict[str, SimSystem] = {}
    for i, value in enumerate(doc["systems"]):
        system = _system(value, f"systems[{i}]", path)
        if system.name in out:
            raise ProviderRefusal(Code.SIM_SYSTEM_DUPLICATE_NAME, f"systems[{i}]: {system.name!r} is given twice", path)
        out[system.name] = system
    return out


# --- one request -----------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    """An HTTP answer before it is written: status, JSON body, extra headers, and how long to wait first."""

    status: int
    payload: dict[str, Any]
    headers: tuple[tuple[str, str], ...] = ()
    delay_s: float = 0.0


def error_reply(status: int, message: str, kind: str = "invalid_request_error", code: str | None = None) -> Reply:
    """An error in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`."""
    return Reply(status, {"error": {"message": message, "type": kind, "param": None, "code": code}})


def _text(content: Any) -> str:
    """A message's text: a string, or the text parts of a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _limit(doc: dict[str, Any]) -> int | Reply | None:
    for key in ("max_completion_tokens", "max_tokens"):
        value = doc.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return error_reply(400, f"Invalid '{key}': expected an integer of at least 1.")
        return value
    return None


class SimService:
    """The systems, items and per-(system, item) request counters behind one server.

    Args:
        systems: the simulated systems by name (the request's `model`).
        items: known items, longest match first (`sim_model.merge_items`).
        seed: the seed every draw is derived from.
        latency_scale: multiplies every drawn latency (0 answers at once).
        clock: the wall clock for `created`.
    """

    def __init__(
        self,
        systems: dict[str, SimSystem],
        items: Sequence[Item],
        *,
        seed: int = 0,
        latency_scale: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.systems = systems
        self.items = list(items)
        self.seed = seed
        self.latency_scale = latency_scale
        self.clock = clock
        self.answered = 0
        self._asked: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    def _next_n(self, system: str, item_key: str) -> int:
        with self._lock:
            self.answered += 1
            n = self._asked.get((system, item_key), 0)
            self._asked[(system, item_key)] = n + 1
            return n

    def models(self) -> dict[str, Any]:
        """The `GET /v1/models` body."""
        data = [{"id": n, "object": "model", "created": 0, "owned_by": "proctor-sim"} for n in self.systems]
        return {"object": "list", "data": data}

    def complete(self, body: bytes) -> Reply:
        """Answer one `POST /v1/chat/completions` body (no I/O; the caller waits `delay_s`)."""
        try:
            doc = loads_strict(body)
        except Refusal as exc:
            return error_reply(400, f"We could not parse the JSON body of your request. ({exc.message})")
        model, messages = doc.get("model"), doc.get("messages")
        if not isinstance(model, str) or not model:
            return error_reply(400, "you must provide a model parameter")
        if not isinstance(messages, list) or not messages:
            return error_reply(400, "Invalid 'messages': expected a non-empty array of message objects.")
        if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
            return error_reply(400, "Invalid 'messages': every message must be an object with a 'role'.")
        if doc.get("stream") is True:
            return error_reply(400, "The simulator does not stream; send 'stream': false or leave it out.")
        limit = _limit(doc)
        if isinstance(limit, Reply):
            return limit
        system = self.systems.get(model)
        if system is None:
            message = f"The model `{model}` does not exist or you do not have access to it."
            return error_reply(404, message, code="model_not_found")
        prompt = "\n".join(_text(m.get("content")) for m in messages)
        last_user = next((_text(m.get("content")) for m in reversed(messages) if m["role"] == "user"), "")
        item = find_item(self.items, last_user)
        item_key = item.match if item is not None else _sha256(prompt)
        n = self._next_n(system.name, item_key)
        decision = decide(system, seed=self.seed, item=item, item_key=item_key, n=n)
        return self._reply(system, decision, text_tokens(prompt), limit)

    def _reply(self, system: SimSystem, decision: Decision, prompt_tokens: int, limit: int | None) -> Reply:
        headers = (("x-request-id", f"req-sim-{decision.request_hash}"),)
        delay = decision.latency_s * self.latency_scale
        if decision.outcome == "rate_limited":
            text = f"Rate limit reached for {system.name} (simulated)."
            return Reply(429, error_reply(429, text, "requests", "rate_limit_exceeded").payload, headers, 0.0)
        if decision.outcome == "server_error":
            text = "The server had an error while processing your request (simulated)."
            return Reply(500, error_reply(500, text, "server_error").payload, headers, delay)
        if decision.outcome == "timeout":
            text = "The simulated upstream timed out."
            return Reply(504, error_reply(504, text, "timeout").payload, headers, TIMEOUT_SLEEP_S)
        if decision.outcome == "auth":
            text = "Incorrect API key provided"
            return Reply(401, error_reply(401, text, "invalid_request_error", "invalid_api_key").payload, headers, 0.0)
        if decision.outcome == "quota":
            text = "You exceeded your current quota (simulated)."
            return Reply(429, error_reply(429, text, "insufficient_quota", "insufficient_quota").payload, headers, 0.0)
        if decision.outcome == "malformed":
            # a 200 that is not a chat completion: no choices, no usage
            body = {"id": f"chatcmpl-sim-{decision.request_hash}", "object": "chat.completion",
                    "model": system.snapshot}
            return Reply(200, body, headers, delay)
        if decision.outcome == "context_length":
            text = (f"This model's maximum context length is {_CONTEXT_WINDOW} tokens. However, you requested "
                    f"{max(prompt_tokens, _CONTEXT_WINDOW + 1)} tokens (simulated).")
            return Reply(400, error_reply(400, text, "invalid_request_error", "context_length_exceeded").payload,
                         headers, 0.0)
        content, finish = decision.content or "", "stop"
        if limit is not None and text_tokens(content) > limit:
            content = content.encode("utf-8")[: 4 * limit].decode("utf-8", "ignore")
            finish = "length"
        completion = text_tokens(content)
        message = {"role": "assistant", "content": content, "refusal": None}
        payload = {
            "id": f"chatcmpl-sim-{decision.request_hash}",
            "object": "chat.completion",
            "created": int(self.clock()),
            "model": system.snapshot,
            "system_fingerprint": "proctor-sim",
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion,
                "total_tokens": prompt_tokens + completion,
                "prompt_tokens_details": {"cached_tokens": 0},
                "completion_tokens_details": {"reasoning_tokens": 0},
            },
        }
        return Reply(200, payload, headers, delay)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
