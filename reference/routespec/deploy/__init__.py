"""Deployment tooling: the ``routespec`` command, Prometheus metrics and the demo handler."""
