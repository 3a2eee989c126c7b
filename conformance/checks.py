"""How a check cites requirements and reports a violation of one."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import pytest

from routespec.testing.target import Capability

F = TypeVar("F", bound=Callable[..., object])


class RequirementViolation(AssertionError):
    """A check observed behaviour that contradicts one requirement."""

    def __init__(self, requirement_id: str, detail: str) -> None:
        self.requirement_id = requirement_id
        super().__init__(f"{requirement_id}: {detail}")


_evidence: set[str] = set()


def take_evidence() -> set[str]:
    """The IDs checked since the last call (the plugin calls this around each check)."""
    taken = set(_evidence)
    _evidence.clear()
    return taken


def exercised(*requirement_ids: str) -> None:
    """Record that the running check observed behaviour governed by these requirements."""
    _evidence.update(requirement_ids)


def require(requirement_id: str, condition: bool, detail: str) -> None:
    """Fail the enclosing check on ``requirement_id`` unless ``condition`` holds.

    Either way the requirement counts as exercised: a check that cites an ID but never
    evaluates it (its steps needed capabilities the adapter lacks) reports SKIP for that ID.
    """
    _evidence.add(requirement_id)
    if not condition:
        raise RequirementViolation(requirement_id, detail)


def covers(*requirement_ids: str) -> Callable[[F], F]:
    """Mark a check with the requirement IDs it tests (string literals: docs read them)."""
    return pytest.mark.covers(*requirement_ids)


def requires(*capabilities: Capability) -> Callable[[F], F]:
    """Mark a check with the adapter capabilities it needs; without them it is SKIP."""
    return pytest.mark.requires(*capabilities)
