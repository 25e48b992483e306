"""`python -m harness` is the `proctor` command.

The manual: docs/commands.md.
"""

from harness.cli.main import main

raise SystemExit(main())
