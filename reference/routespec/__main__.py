"""``python -m routespec``: the ``routespec`` command."""

from routespec.deploy.cli.main import main

raise SystemExit(main())
