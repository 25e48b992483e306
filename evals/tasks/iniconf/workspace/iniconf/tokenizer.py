"""Split INI-like text into section and key/value tokens."""

from dataclasses import dataclass


class ConfigError(ValueError):
    """The text is not valid configuration; the message names the line."""


@dataclass(frozen=True)
class Token:
    """One meaningful line: a section header or a key/value pair."""

    kind: str  # "section" or "pair"
    line: int  # 1-based line number
    name: str  # the section name or the key
    raw: str = ""  # the value as written: quotes and escapes kept, comment removed


def strip_comment(value: str) -> str:
    """Remove an inline comment (a '#' or ';' after whitespace) and outer spaces."""
    for marker in (" #", " ;"):
        cut = value.find(marker)
        if cut != -1:
            value = value[:cut]
    return value.strip()


def tokenize(text: str) -> list[Token]:
    """Return the tokens of ``text``; blank and comment lines give none."""
    tokens = []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped[0] in "#;":
            continue
        if stripped.startswith("["):
            if not stripped.endswith("]"):
                raise ConfigError(f"line {number}: unclosed section header")
            tokens.append(Token("section", number, stripped[1:-1].strip()))
            continue
        key, sep, value = stripped.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"line {number}: expected 'key = value'")
        tokens.append(Token("pair", number, key.strip(), strip_comment(value)))
    return tokens
