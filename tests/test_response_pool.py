"""The worker's pool of released response connections (TRN-028, TRN-029): what it keeps,
for how long, and how much."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import trio
import trio.testing

from routespec.transport.connection import FramedConnection
from routespec.transport.response_pool import IDLE_SECONDS, ResponsePool

Pair = Callable[[], Awaitable[tuple[FramedConnection, trio.SocketStream]]]


@pytest.fixture
async def pair() -> AsyncIterator[Pair]:
    """Makes connected (worker side, caller side) pairs; closes every socket at the end."""
    opened: list[trio.SocketStream] = []

    async def make() -> tuple[FramedConnection, trio.SocketStream]:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        caller = await trio.open_tcp_stream("127.0.0.1", port)
        worker = await listeners[0].accept()
        await listeners[0].aclose()
        opened.extend((caller, worker))
        return FramedConnection(worker), caller

    yield make
    for stream in opened:
        await trio.aclose_forcefully(stream)


async def test_a_quiet_connection_is_taken_back_most_recent_first(pair: Pair) -> None:
    pool = ResponsePool()
    (first, _), (second, _) = await pair(), await pair()
    pool.put("x:1", first)
    pool.put("x:1", second)
    assert pool.take("x:1") is second
    assert pool.take("x:1") is first
    assert pool.take("x:1") is None
    assert len(pool) == 0


async def test_a_connection_the_caller_closed_is_given_up(pair: Pair) -> None:
    pool = ResponsePool()
    kept, caller = await pair()
    pool.put("x:1", kept)
    await caller.aclose()
    await trio.sleep(0.05)  # the FIN arrives
    assert pool.take("x:1") is None
    assert kept.closed.is_set()


async def test_a_connection_with_bytes_waiting_is_given_up(pair: Pair) -> None:
    pool = ResponsePool()
    kept, caller = await pair()
    pool.put("x:1", kept)
    await caller.send_all(b"late")
    await trio.sleep(0.05)
    assert pool.take("x:1") is None


async def test_an_old_connection_is_given_up(
    pair: Pair, mock_clock: trio.testing.MockClock
) -> None:
    pool = ResponsePool()
    kept, _ = await pair()
    pool.put("x:1", kept)
    mock_clock.jump(IDLE_SECONDS)
    assert pool.take("x:1") is None
    assert kept.closed.is_set()


async def test_the_pool_is_bounded_per_address_and_in_total(pair: Pair) -> None:
    pool = ResponsePool(per_address=2, total=3)
    kept = [(await pair())[0] for _ in range(5)]
    for connection in kept[:3]:
        pool.put("a:1", connection)  # the third pushes out the oldest of "a:1"
    assert len(pool) == 2
    assert kept[0].closed.is_set()
    pool.put("b:1", kept[3])
    pool.put("b:1", kept[4])  # full: the one released longest ago goes
    assert len(pool) == 3
    assert kept[1].closed.is_set()
    pool.close_all()
    assert len(pool) == 0
    assert all(connection.closed.is_set() for connection in kept)


async def test_a_sweep_closes_what_callers_closed_and_keeps_the_rest(pair: Pair) -> None:
    pool = ResponsePool()
    (gone, caller), (kept, _) = await pair(), await pair()
    pool.put("a:1", gone)
    pool.put("b:1", kept)
    await caller.aclose()
    await trio.sleep(0.05)  # the FIN arrives
    pool.sweep()
    assert gone.closed.is_set()
    assert len(pool) == 1
    assert pool.take("b:1") is kept
