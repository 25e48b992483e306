"""The test suite's one conftest: the hypothesis profile and the shared fixtures.

Fixtures live in plain modules under tests/support/ and are loaded here as
plugins: `task_setup` (support/tasks.py), `sim_server` (support/sim.py) and
`sim` (support/study.py). Helpers are imported from `tests.support.<module>`;
no test imports this file or another test module (tests/root/test_layout.py).
"""

from __future__ import annotations

import os

from hypothesis import settings

pytest_plugins = ["tests.support.tasks", "tests.support.sim", "tests.support.study", "tests.support.groups"]

# CI replays the same examples every run (a red CI must be reproducible); a developer's run explores. No
# per-example deadline: one scheduler stall on a busy machine is not a failure of the property.
settings.register_profile("ci", derandomize=True, print_blob=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")
