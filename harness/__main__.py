"""`python -m harness` is the `proctor` command."""

from harness.cli.main import main

raise SystemExit(main())
