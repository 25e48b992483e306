"""One xdist worker per module-scoped set-up: tests sharing a module fixture run together, so it is built once.

Under `make test` (`pytest -n 2 --dist loadgroup`) the tests of a module are spread over both workers, and a
module-scoped fixture (a real study run, a built suite, a browser) is built once on each worker that runs one of
its tests. This plugin (loaded by tests/conftest.py) marks every test that uses a module-scoped fixture of its
own module `xdist_group("<module>::module-scope")`: those tests go to one worker and share one build, while the
module's other tests still spread. A test with its own `xdist_group` mark keeps it. docs/layout.md.
"""

from __future__ import annotations

import pytest

__all__ = ["fixture_group"]


def fixture_group(item: pytest.Item) -> str | None:
    """`<module>::module-scope` for a test using any module-scoped fixture defined in its own module, else None.

    One group per module, not per fixture: module fixtures may build on each other, and a test using two of them
    must share both builds with the tests using either."""
    info = getattr(item, "_fixtureinfo", None)
    module = item.nodeid.split("::", 1)[0]
    if info is None:
        return None
    for defs in info.name2fixturedefs.values():
        if defs and defs[-1].scope == "module" and defs[-1].baseid == module:
            return f"{module}::module-scope"
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        group = fixture_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
