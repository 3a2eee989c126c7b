"""``python -m routespec``: the ``routespec`` command."""

from routespec.cli.main import main

raise SystemExit(main())
