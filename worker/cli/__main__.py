"""``python -m worker.cli``: the ``harness`` command."""

from worker.cli.main import main

raise SystemExit(main())
