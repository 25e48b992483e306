from iniconf import parse

TEXT = r"""
# storage settings
[paths]
data = "C:\\new\\table # 1"   # where the data lives
"""


def test_quoted_windows_path_with_hash():
    assert parse(TEXT) == {"paths": {"data": "C:\\new\\table # 1"}}
