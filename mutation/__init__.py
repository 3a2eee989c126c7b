"""Mutation testing of the reference's specified layers with mutmut, the conformance suite
(both reference adapters) as the test command.

``python -m mutation --help``. The staged tree, mutmut's state and the reports live under
``build/mutation/`` (ignored by git); the docs page is ``docs/mutation.md``.
"""
