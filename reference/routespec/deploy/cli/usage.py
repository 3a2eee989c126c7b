"""The command-line error: a bad argument, reported in one line naming it, exit code 2."""

from __future__ import annotations


class UsageError(Exception):
    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")
