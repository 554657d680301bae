"""``python -m alpineagents``: the command line (see :mod:`alpineagents.cli`)."""

from .cli import main

raise SystemExit(main())
