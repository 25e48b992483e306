"""The `proctor` command: parsing, printing and exit codes over the library (docs/commands.md)."""

from harness.cli.main import main

__all__ = ["main"]
