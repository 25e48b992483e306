import pytest

from iniconf import ConfigError, parse


def value(line: str) -> str:
    return parse("[s]\n" + line + "\n")["s"]["v"]


def test_unquoted_value_and_inline_comments():
    assert value("v = plain value ; a note") == "plain value"
    assert value("v = plain value\t# after a tab") == "plain value"
    assert value("v = http://host/page#frag") == "http://host/page#frag"


def test_quoted_keeps_spaces_hash_and_semicolon():
    assert value('v = "  a ; b # c  "  ; note') == "  a ; b # c  "
    assert value('v = ""') == ""


def test_escaped_quote_does_not_end_the_string():
    assert value(r'v = "say \"hi # there\"" # note') == 'say "hi # there"'


def test_escapes_are_decoded_once_left_to_right():
    assert value(r'v = "a\nb\tc"') == "a\nb\tc"
    assert value(r'v = "x\\ny"') == "x\\ny"
    assert value(r'v = "end\\"') == "end\\"


def test_unknown_escape_is_an_error():
    with pytest.raises(ConfigError, match="line 2"):
        parse("[s]\n" + r'v = "a\qb"' + "\n")


@pytest.mark.parametrize("line", ['v = "abc', r'v = "abc\"', 'v = "abc" junk', 'v = "a"b"'])
def test_bad_quoting_is_an_error(line):
    with pytest.raises(ConfigError):
        parse("[s]\n" + line + "\n")


def test_sections_keys_and_errors():
    text = "; top\n[a]\nx = 1\n\n[b]\nx = 2\nx = 3\n"
    assert parse(text) == {"a": {"x": "1"}, "b": {"x": "3"}}
    with pytest.raises(ConfigError, match="line 1"):
        parse("x = 1\n")
