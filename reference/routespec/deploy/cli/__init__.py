"""The ``routespec`` command: workers, callers and the conformance suite for small deployments.

It sits on top of every layer: ``main`` parses arguments and runs one sub-command module
(``worker``, ``calls``, ``instances``, ``conformance``); ``usage`` holds the error that
becomes exit code 2.
"""
