"""`python -m harness` is the `proctor` command."""

from harness.cli import main

raise SystemExit(main())
