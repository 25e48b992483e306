"""Shared test helpers: plain modules imported as `tests.support.<name>`.

The modules that define pytest fixtures (tasks, sim, study) are loaded as
plugins by tests/conftest.py (`pytest_plugins`), so every test can ask for
their fixtures by name; helpers are imported explicitly.
"""
