"""`python -m supervisor` is the same as the `hunter` command."""

from supervisor.cli import main

raise SystemExit(main())
