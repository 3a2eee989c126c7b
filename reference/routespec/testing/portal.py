"""Drive one long-lived trio run from synchronous code, such as a Hypothesis state machine.

Hypothesis has no async rules, so a target built on trio runs ``trio.run`` in a background
thread for the whole test case. Each synchronous call enters that run with
``trio.from_thread.run`` and returns once every task has settled
(``trio.testing.wait_all_tasks_blocked``), so the caller observes a quiescent system. Time
is a ``MockClock`` that moves only when asked (:meth:`TrioPortal.advance`).
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

import trio
import trio.testing

T = TypeVar("T")


class TrioPortal:
    """A trio run in a thread, with a nursery for background tasks and a mock clock."""

    def __init__(self, *, mock_clock: bool = True) -> None:
        """``mock_clock=False`` runs on real time, for targets that talk to other processes
        whose clocks the suite cannot move."""
        self.clock: trio.testing.MockClock | None = trio.testing.MockClock() if mock_clock else None
        self._ready = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._stop: trio.Event | None = None
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="trio-portal", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._failure is not None:
            raise self._failure

    def _main(self) -> None:
        try:
            trio.run(self._serve, clock=self.clock)
        except BaseException as failure:  # surfaced to the caller by close()
            self._failure = failure
        finally:
            self._ready.set()

    async def _serve(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._ready.set()
            await self._stop.wait()
            nursery.cancel_scope.cancel()

    def call(self, fn: Callable[[], Awaitable[T]]) -> T:
        """Run ``fn()`` inside the trio run and wait until all tasks are blocked."""

        async def settled() -> T:
            result = await fn()
            await trio.testing.wait_all_tasks_blocked()
            return result

        return trio.from_thread.run(settled, trio_token=self._token)

    def call_sync(self, fn: Callable[[], object]) -> None:
        """Run a synchronous state change inside the trio run, then let every task settle."""

        async def run() -> None:
            fn()

        self.call(run)

    @property
    def nursery(self) -> trio.Nursery:
        """The run's nursery, for long-lived background tasks (servers)."""
        assert self._nursery is not None
        return self._nursery

    def start_soon(self, fn: Callable[[], Awaitable[None]]) -> None:
        """Start a background task in the run's nursery and let it settle."""

        async def spawn() -> None:
            self.nursery.start_soon(fn)

        self.call(spawn)

    def advance(self, seconds: float) -> None:
        """Move mock time forward; timers that fall due run before this returns."""

        async def jump() -> None:
            assert self.clock is not None, "advance() needs the mock clock"
            self.clock.jump(seconds)

        self.call(jump)

    def close(self) -> None:
        """End the run; re-raise anything that crashed it."""
        if self._thread.is_alive():
            trio.from_thread.run_sync(self._signal_stop, trio_token=self._token)
            self._thread.join()
        if self._failure is not None:
            raise self._failure

    def _signal_stop(self) -> None:
        assert self._stop is not None
        self._stop.set()
