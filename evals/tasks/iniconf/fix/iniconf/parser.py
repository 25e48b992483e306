"""Turn tokens into a {section: {key: value}} mapping."""

from iniconf.tokenizer import ConfigError, tokenize

ESCAPES = {"\\": "\\", '"': '"', "n": "\n", "t": "\t"}


def unquote(raw: str, line: int) -> str:
    """Return the value a raw token stands for: quotes removed, escapes decoded."""
    if not raw.startswith('"'):
        return raw
    out = []
    index = 1
    while index < len(raw):
        char = raw[index]
        if char == "\\":
            code = raw[index + 1 : index + 2]
            if not code:
                break
            if code not in ESCAPES:
                raise ConfigError(f"line {line}: unknown escape \\{code}")
            out.append(ESCAPES[code])
            index += 2
        elif char == '"':
            if index != len(raw) - 1:
                raise ConfigError(f"line {line}: text after the closing quote")
            return "".join(out)
        else:
            out.append(char)
            index += 1
    raise ConfigError(f"line {line}: unterminated quoted value")


def parse(text: str) -> dict[str, dict[str, str]]:
    """Parse configuration text; a repeated key keeps its last value."""
    config: dict[str, dict[str, str]] = {}
    section = None
    for token in tokenize(text):
        if token.kind == "section":
            section = config.setdefault(token.name, {})
        elif section is None:
            raise ConfigError(f"line {token.line}: key {token.name!r} before any section")
        else:
            section[token.name] = unquote(token.raw, token.line)
    return config
