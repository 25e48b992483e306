"""One xdist worker per module-scoped set-up: tests sharing a module fixture run together, so it is built once.

Under `make test` (`pytest -n 2 --dist loadgroup`) the tests of a module are spread over both workers, and a
module-scoped fixture (a real study run, a built suite, a browser) is built once on each worker that runs one of
its tests. This plugin (loaded by tests/conftest.py) marks every test that uses a module-scoped fixture of its
own module `xdist_group("tests.<package>.<module>.module-scope")`: those tests go to one worker and share one build, while the
module's other tests still spread. A test with its own `xdist_group` mark keeps it. docs/layout.md.
"""

from __future__ import annotations

import pytest

__all__ = ["fixture_group"]


def _group_names(item: pytest.Item) -> list[str]:
    return sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                   for m in item.iter_markers("xdist_group")})


def fixture_group(item: pytest.Item) -> str | None:
    """`<module, dotted>.module-scope` for a test using any module-scoped fixture defined in its own module, else None.

    One group per module, not per fixture: module fixtures may build on each other, and a test using two of them
    must share both builds with the tests using either."""
    info = getattr(item, "_fixtureinfo", None)
    module = item.nodeid.split("::", 1)[0]
    if info is None:
        return None
    for defs in info.name2fixturedefs.values():
        if defs and defs[-1].scope == "module" and defs[-1].baseid == module:
            return module.replace("/", ".").removesuffix(".py") + ".module-scope"
    return None


def pytest_itemcollected(item: pytest.Item) -> None:
    """Marked as each test is collected: xdist's worker reads the marks in its own collection_modifyitems."""
    if item.get_closest_marker("xdist_group") is None:
        group = fixture_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker under `--dist loadgroup`, suffix each grouped test's id with `@<group>`.

    pytest-xdist (3.8) does this by setting `item._nodeid`, which pytest 9 no longer reads (a node's id is
    `item._id`): its groups were silently ignored, every test spread like `--dist load`. Setting the id here
    restores the grouping; where xdist's own suffix took effect, the id already holds `@` and is left alone.
    """
    if not hasattr(config, "workerinput") or not config.getvalue("loadgroup"):
        return
    for item in items:
        names = _group_names(item)
        node_id = getattr(item, "_id", None)
        if names and node_id is not None and "@" not in item.nodeid:
            item._id = type(node_id).parse(f"{item.nodeid}@{'_'.join(names)}")  # type: ignore[attr-defined]
