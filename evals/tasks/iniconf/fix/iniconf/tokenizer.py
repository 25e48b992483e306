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
    """Remove an inline comment (a '#' or ';' after whitespace) and outer spaces.

    A '#' or ';' inside a double-quoted string is part of the value; inside
    quotes a backslash escapes the next character, so \\" does not end them.
    """
    in_quotes = escaped = False
    for index, char in enumerate(value):
        if escaped:
            escaped = False
        elif in_quotes and char == "\\":
            escaped = True
        elif char == '"':
            in_quotes = not in_quotes
        elif not in_quotes and char in "#;" and index > 0 and value[index - 1].isspace():
            return value[:index].strip()
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
