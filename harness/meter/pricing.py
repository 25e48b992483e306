"""Pricing tables: $ per million tokens by model, loaded strictly from YAML.

The manual: docs/models.md.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode

from harness.errors import Code, InputRefusal, MeterRefusal, Refusal
from harness.evidence.jsonio import read_bytes, sha256_hex
from harness.evidence.memo import ParsedMemo
from harness.evidence.money import parse_cost

__all__ = [
    "BUNDLED_PRICING",
    "EXAMPLE_PRICING",
    "Price",
    "PricingTable",
    "Tier",
    "load_pricing",
    "parse_pricing",
]

_DATA: Final = Path(__file__).resolve().parent.parent / "data"
BUNDLED_PRICING: Final = _DATA / "pricing.yaml"
"""The bundled table: the simulator's systems at notional prices."""
EXAMPLE_PRICING: Final = _DATA / "pricing.example.yaml"
"""A template for hosted models; its blanks are refused until the user fills them."""

BILLED_AS_OUTPUT: Final = "billed_as_output"
_MAX_BYTES: Final = 4 * 1024 * 1024
_PRICE_KEYS: Final = ("input_per_mtok", "output_per_mtok", "cached_input_per_mtok", "cache_write_per_mtok")
_MODEL_KEYS: Final = frozenset({*_PRICE_KEYS, "reasoning", "tiers", "notional", "source"})
_TIER_KEYS: Final = frozenset({"above_prompt_tokens", *_PRICE_KEYS})
_REQUIRED: Final = ("input_per_mtok", "output_per_mtok")


@dataclass(frozen=True)
class Tier:
    """Prices that apply to a whole request whose prompt exceeds `above_prompt_tokens`."""

    above_prompt_tokens: int
    input_per_mtok: float
    output_per_mtok: float
    cached_input_per_mtok: float | None = None
    cache_write_per_mtok: float | None = None


@dataclass(frozen=True)
class Price:
    """One model's prices in $ per million tokens.

    Attributes:
        key: the pricing key it was listed under.
        reasoning_per_mtok: None means reasoning tokens are billed at the
            output price (of the tier in force); a number applies at every tier.
        tiers: context-size tiers, thresholds strictly ascending.
        notional: True for made-up prices (the simulator's): never evidence about cost.
    """

    key: str
    input_per_mtok: float
    output_per_mtok: float
    cached_input_per_mtok: float | None = None
    cache_write_per_mtok: float | None = None
    reasoning_per_mtok: float | None = None
    tiers: tuple[Tier, ...] = ()
    notional: bool = False
    source: str | None = None


@dataclass(frozen=True)
class PricingTable:
    """A validated pricing table and the sha256 of the exact bytes it was read from."""

    models: Mapping[str, Price]
    sha256: str
    path: str | None = None
    notional: bool = field(default=False)

    def get(self, key: str | None) -> Price | None:
        """The price listed under `key`, or None (an unknown price)."""
        return None if key is None else self.models.get(key)

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "sha256": self.sha256, "models": sorted(self.models), "notional": self.notional}


# --- the strict YAML loader ------------------------------------------------------------


_MAX_DEPTH = 64
"""How deep a price list may nest (it needs 4); deeper is `pricing_yaml_invalid`, never a RecursionError."""


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader without the YAML features a price list never needs and a reviewer must not miss."""

    refuse_path: str | None = None
    depth: int = 0

    def _refuse(self, code: Code, message: str, mark: Any) -> Refusal:
        line = None if mark is None else int(mark.line) + 1
        where = "" if line is None else f" at line {line}"
        extra = {} if line is None else {"line": line}
        return Refusal(code, f"{message}{where}", self.refuse_path, **extra)

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        event: Any = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent):
            raise self._refuse(Code.PRICING_YAML_FORBIDDEN, f"alias *{event.anchor} is refused", event.start_mark)
        if getattr(event, "anchor", None) is not None:
            raise self._refuse(Code.PRICING_YAML_FORBIDDEN, f"anchor &{event.anchor} is refused", event.start_mark)
        if getattr(event, "tag", None) is not None:
            raise self._refuse(Code.PRICING_YAML_FORBIDDEN, f"explicit tag {event.tag!r} is refused", event.start_mark)
        self.depth += 1
        try:
            if self.depth > _MAX_DEPTH:  # the composer recurses: refuse before Python's stack runs out
                raise self._refuse(Code.PRICING_YAML_INVALID, f"nested more than {_MAX_DEPTH} deep", event.start_mark)
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_mapping(self, node: Node, deep: bool = False) -> dict[Any, Any]:
        if not isinstance(node, MappingNode):
            raise self._refuse(Code.PRICING_YAML_INVALID, "expected a mapping", node.start_mark)
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, ScalarNode):
                raise self._refuse(Code.PRICING_YAML_FORBIDDEN, "a non-scalar mapping key is refused", key_node.start_mark)
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise self._refuse(Code.PRICING_YAML_FORBIDDEN, "merge keys (<<) are refused", key_node.start_mark)
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                raise self._refuse(Code.PRICING_INVALID, f"key {key!r} is not a string", key_node.start_mark)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise MeterRefusal(
                    Code.PRICING_DUPLICATE_KEY,
                    f"duplicate key {key!r} at line {line} (first at line {seen[key]})",
                    self.refuse_path,
                    key=key,
                    line=line,
                )
            seen[key] = line
        return super().construct_mapping(node, deep=True)


def _parse_yaml(text: str, path: str | None) -> Any:
    loader = _StrictLoader(text)
    loader.refuse_path = path
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = None if mark is None else mark.line + 1
        where = "" if line is None else f" at line {line}"
        raise MeterRefusal(Code.PRICING_YAML_INVALID, f"{exc.problem or exc.context}{where}", path) from None
    except yaml.YAMLError as exc:
        raise MeterRefusal(Code.PRICING_YAML_INVALID, str(exc), path) from None
    except RecursionError:
        raise MeterRefusal(Code.PRICING_YAML_INVALID, "nested too deeply", path) from None
    finally:
        loader.dispose()


# --- validation ------------------------------------------------------------------------------


def _price(value: Any, where: str, path: str | None) -> float:
    try:
        return parse_cost(value, field=where)
    except Refusal as exc:
        raise MeterRefusal(Code.PRICING_INVALID, exc.message, path, field=where, cause=exc.code) from None


def _mapping(value: Any, where: str, allowed: frozenset[str], path: str | None) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise MeterRefusal(Code.PRICING_INVALID, f"{where} must be a mapping, found {type(value).__name__}", path, field=where)
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise MeterRefusal(Code.PRICING_INVALID, f"{where}: unknown key {unknown[0]!r}", path, field=f"{where}.{unknown[0]}")
    return value


def _prices(doc: Mapping[str, Any], where: str, path: str | None) -> dict[str, float | None]:
    for key in _REQUIRED:
        if key not in doc:
            raise MeterRefusal(Code.PRICING_INVALID, f"{where}: {key} is required", path, field=f"{where}.{key}")
    return {k: _price(doc[k], f"{where}.{k}", path) if k in doc else None for k in _PRICE_KEYS}


def _tier(value: Any, where: str, path: str | None) -> Tier:
    doc = _mapping(value, where, _TIER_KEYS, path)
    above = doc.get("above_prompt_tokens")
    if isinstance(above, bool) or not isinstance(above, int) or above < 0:
        raise MeterRefusal(
            Code.PRICING_INVALID, f"{where}.above_prompt_tokens must be a non-negative integer", path,
            field=f"{where}.above_prompt_tokens",
        )
    p = _prices(doc, where, path)
    assert p["input_per_mtok"] is not None and p["output_per_mtok"] is not None
    return Tier(above, p["input_per_mtok"], p["output_per_mtok"], p["cached_input_per_mtok"], p["cache_write_per_mtok"])


def _model(key: Any, value: Any, path: str | None) -> Price:
    if not isinstance(key, str) or not key.strip():
        raise MeterRefusal(Code.PRICING_INVALID, f"pricing key {key!r} must be a non-empty string", path)
    where = f"models.{key}"
    doc = _mapping(value, where, _MODEL_KEYS, path)
    p = _prices(doc, where, path)
    if "reasoning" not in doc:
        raise MeterRefusal(
            Code.PRICING_INVALID, f"{where}: reasoning is required ({BILLED_AS_OUTPUT!r} or a price)", path,
            field=f"{where}.reasoning",
        )
    reasoning_raw = doc["reasoning"]
    reasoning = None if reasoning_raw == BILLED_AS_OUTPUT else _price(reasoning_raw, f"{where}.reasoning", path)
    raw_tiers = doc.get("tiers", [])
    if not isinstance(raw_tiers, list):
        raise MeterRefusal(Code.PRICING_INVALID, f"{where}.tiers must be a list", path, field=f"{where}.tiers")
    tiers = tuple(_tier(t, f"{where}.tiers[{i}]", path) for i, t in enumerate(raw_tiers))
    for i in range(1, len(tiers)):
        if tiers[i].above_prompt_tokens <= tiers[i - 1].above_prompt_tokens:
            raise MeterRefusal(
                Code.PRICING_INVALID, f"{where}.tiers must be strictly ascending by above_prompt_tokens", path,
                field=f"{where}.tiers[{i}]",
            )
    notional = doc.get("notional", False)
    if not isinstance(notional, bool):
        raise MeterRefusal(Code.PRICING_INVALID, f"{where}.notional must be true or false", path, field=f"{where}.notional")
    source = doc.get("source")
    if source is not None and not isinstance(source, str):
        raise MeterRefusal(Code.PRICING_INVALID, f"{where}.source must be a string", path, field=f"{where}.source")
    assert p["input_per_mtok"] is not None and p["output_per_mtok"] is not None
    return Price(
        key, p["input_per_mtok"], p["output_per_mtok"], p["cached_input_per_mtok"], p["cache_write_per_mtok"],
        reasoning, tiers, notional, source,
    )


def parse_pricing(data: bytes, path: str | os.PathLike[str] | None = None) -> PricingTable:
    """Validate pricing YAML `data` (the bytes exactly as read) into a `PricingTable`."""
    where = None if path is None else os.fspath(path)
    digest = sha256_hex(data)
    # the same bytes from the same path validate to the same table (docs/models.md, "The catalog")
    return _TABLES.get((digest, where), lambda: _parse_table(data, digest, where))


# Tables already validated, by (sha256 of the bytes, path): an audit prices each stage's work from the same file;
# the bytes are hashed every time, so changed bytes are parsed again. A table is frozen (its models a read-only view).
_TABLES: ParsedMemo[tuple[str, str | None], PricingTable] = ParsedMemo()


def _parse_table(data: bytes, digest: str, where: str | None) -> PricingTable:
    try:
        text = data.decode("utf-8", "strict")
    except UnicodeDecodeError as exc:
        raise InputRefusal(Code.INVALID_UTF8, f"not UTF-8 at byte {exc.start}", where) from None
    doc = _parse_yaml(text, where)
    top = _mapping(doc, "the pricing file", frozenset({"models"}), where)
    models = top.get("models")
    if not isinstance(models, dict) or not models:
        raise MeterRefusal(Code.PRICING_INVALID, "models must be a non-empty mapping of pricing keys", where, field="models")
    prices = {key: _model(key, value, where) for key, value in models.items()}
    return PricingTable(
        MappingProxyType(prices), digest, where, notional=all(p.notional for p in prices.values())
    )


def load_pricing(path: str | os.PathLike[str] | None = None) -> PricingTable:
    """Read and validate a pricing file (default: the bundled `pricing.yaml`)."""
    target = BUNDLED_PRICING if path is None else path
    return parse_pricing(read_bytes(target, max_bytes=_MAX_BYTES), target)
