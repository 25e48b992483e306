"""Turn tokens into a {section: {key: value}} mapping."""

from iniconf.tokenizer import ConfigError, tokenize


def unquote(raw: str, line: int) -> str:
    """Return the value a raw token stands for: quotes removed, escapes decoded."""
    if not raw.startswith('"'):
        return raw
    if len(raw) < 2 or not raw.endswith('"'):
        raise ConfigError(f"line {line}: unterminated quoted value")
    inner = raw[1:-1]
    return inner.replace("\\\\", "\\").replace("\\n", "\n").replace("\\t", "\t").replace('\\"', '"')


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
