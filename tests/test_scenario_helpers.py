"""Helpers the scenario checks share (conformance/scenario.py), run against a stand-in target
whose requests end only after a given number of settles."""

from __future__ import annotations

from typing import cast

import pytest

from routespec.conformance import scenario
from routespec.conformance.checks import RequirementViolation
from routespec.testing.target import Outcome, Target


class EndsAfterSettles:
    """The part of a target ``finished_after_transfer`` uses: a request that ends once the
    system has been let settle ``settles`` times (None: never)."""

    def __init__(self, settles: int | None) -> None:
        self.settles_needed = settles
        self.settled = 0

    def outcome(self, request_id: str) -> Outcome | None:
        if self.settles_needed is None or self.settled < self.settles_needed:
            return None
        return Outcome(items=(request_id,), error=None)

    def advance_time(self, seconds: float) -> None:
        assert seconds == 0.0, "waiting for a transfer must not move mock time"
        self.settled += 1


def test_a_transfer_that_takes_many_settles_is_waited_for() -> None:
    """A loaded machine took 67 settles to deliver 32 MiB between two loopback sockets; a
    transfer needing far more still finishes within the real-time budget."""
    target = EndsAfterSettles(settles=5_000)
    outcome = scenario.finished_after_transfer(
        cast("Target", target), "req-1", "TRN-043", mock_clock=True
    )
    assert outcome.items == ("req-1",)
    assert target.settled == 5_000


def test_a_transfer_that_never_ends_fails_once_the_budget_is_spent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(scenario, "TRANSFER_BUDGET", 0.05)
    target = EndsAfterSettles(settles=None)
    with pytest.raises(RequirementViolation, match=r"TRN-043: req-1 is still open"):
        scenario.finished_after_transfer(
            cast("Target", target), "req-1", "TRN-043", mock_clock=True
        )
    assert target.settled > 0


def test_on_a_real_clock_the_request_is_read_as_it_stands() -> None:
    """A target on real time has no ``advance_time``: the outcome is read once."""
    target = EndsAfterSettles(settles=1)
    with pytest.raises(RequirementViolation, match="still open"):
        scenario.finished_after_transfer(
            cast("Target", target), "req-1", "TRN-043", mock_clock=False
        )
    assert target.settled == 0
