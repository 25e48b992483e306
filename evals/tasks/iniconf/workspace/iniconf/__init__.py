"""A small INI-like configuration reader."""

from iniconf.parser import parse, unquote
from iniconf.tokenizer import ConfigError, Token, tokenize

__all__ = ["ConfigError", "Token", "parse", "tokenize", "unquote"]
