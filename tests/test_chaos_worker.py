"""Chaos at a worker's request-plane port (issue 14; spec: TRN-012, TRN-022 … TRN-027).

Real ``routespec worker`` processes on 127.0.0.1, each under an open-file limit of
``FD_LIMIT``, face hostile peers: requests with unusable field values drawn with Hypothesis
from the control message's schema (the conformance kit's ``CONTROL_SCHEMA``), floods of idle
connections, and slow senders of large messages. Well-formed requests run alongside. Every
case asserts that the worker did not die, that every well-formed request ended with exactly
its items or a typed error within ``CALL_BOUND`` seconds, and that the worker's RSS and open
file descriptors (``/proc/PID/status``, ``/proc/PID/fd``) came back near their baseline.

Waits are bounded: each read has a deadline, and resource figures are polled (every
``POLL`` s, at most ``SETTLE_BOUND`` s) until they settle, since a worker frees what a peer
held only after it has read that peer's end of stream.
"""

from __future__ import annotations

import contextlib
import os
import queue
import resource
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path

import attrs
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from routespec.conformance.test_transport import (
    MARKER,
    NO_ENDPOINT,
    Unusable,
    every_unusable_kind,
    request_message,
    unusable_requests,
)
from routespec.discovery.instances import Instance
from routespec.errors import RoutingError
from routespec.routing.streaming import Request
from routespec.transport.codecs import decode_json
from routespec.transport.connection import (
    CONNECTION_ERRORS,
    ByteBudget,
    FramedConnection,
    OverBudget,
)
from routespec.transport.frames import (
    MAX_CONTROL_BYTES,
    U16,
    U32,
    RequestMessage,
    TwoPart,
    WireProtocolError,
)
from routespec.transport.tcp_dispatch import TcpDispatch

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

FD_LIMIT = 256  # the worker's open-file limit: its default connection cap is a quarter
CONNECTION_CAP = FD_LIMIT // 4  # TRN-024's default under that limit
BUDGET = 64 * 1024 * 1024  # TRN-026's default
ENDPOINT = "chaos.tokens.generate"
START_BOUND = 20.0  # a loaded CI machine starts Python slowly
CALL_BOUND = 10.0  # a well-formed request ends within this, with its items or a typed error
ANSWER_BOUND = 5.0  # an unusable request's typed error comes within this
SETTLE_BOUND = 10.0
POLL = 0.02
FD_SLACK = 6
RSS_SLACK_KIB = 24 * 1024
PROMPT = [1, 2, 3]
REFUSED = (WireProtocolError, *CONNECTION_ERRORS)
NO_SHRINKING = (Phase.explicit, Phase.reuse, Phase.generate)  # a real process per case: report
# the failing case as drawn  # a connection closed instead of answered


def expected_items(max_tokens: int) -> list[object]:
    """What ``routespec.deploy.demo:tokens`` yields for ``PROMPT`` and ``max_tokens``."""
    items: list[object] = [{"token_ids": [len(PROMPT) + k]} for k in range(max_tokens)]
    if items:
        assert isinstance(items[-1], dict)
        items[-1]["finish_reason"] = "length"
    return items


def _low_fd_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


@attrs.define
class Worker:
    """A ``routespec worker`` process and where it serves."""

    process: subprocess.Popen[str]
    instance_id: int
    address: str  # host:port/path
    log: Path

    @property
    def host_port(self) -> tuple[str, int]:
        host, _, port = self.address.partition("/")[0].rpartition(":")
        return host, int(port)

    @property
    def path(self) -> str:
        return self.address.partition("/")[2]

    def alive(self) -> bool:
        return self.process.poll() is None

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.process.pid}/fd"))

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")

    def instance(self) -> Instance:
        return Instance(self.instance_id, ENDPOINT, self.address)


@contextlib.contextmanager
def running_worker(
    tmp_path: Path, *extra: str, env: Mapping[str, str] | None = None
) -> Iterator[Worker]:
    """A demo worker under ``FD_LIMIT`` open files, killed at the end of the block."""
    log = tmp_path / f"worker-{time.monotonic_ns()}.log"
    argv = [sys.executable, "-m", "routespec", "worker", "--endpoint", ENDPOINT]
    argv += ["--handler", "routespec.deploy.demo:tokens", "--discovery", f"file:{tmp_path}/kv"]
    with open(log, "wb") as errors:
        process = subprocess.Popen(
            [*argv, *extra],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            preexec_fn=_low_fd_limit,
        )
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line)
        lines.put(None)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        try:
            ready = lines.get(timeout=START_BOUND)
        except queue.Empty:
            ready = None
        if ready is None or not ready.startswith("ready "):
            raise AssertionError(f"the worker did not start: {ready!r}\n{log.read_text()}")
        fields = dict(part.split("=", 1) for part in ready.split()[1:])
        yield Worker(process, int(fields["instance"], 16), fields["address"], log)
    finally:
        process.kill()
        process.wait(timeout=START_BOUND)
        reader.join(timeout=START_BOUND)
        assert process.stdout is not None
        process.stdout.close()


# --- well-formed requests, through the reference's own caller ---


@attrs.frozen
class Ended:
    """How a well-formed request ended: its items, its typed error, the seconds it took."""

    items: list[object]
    error: RoutingError | None
    seconds: float

    def exact(self, max_tokens: int) -> bool:
        """Exactly its items, or a prefix of them and then a typed error."""
        want = expected_items(max_tokens)
        if self.error is None:
            return self.items == want and self.seconds < CALL_BOUND
        return (
            self.error.error_type is not None
            and self.items == want[: len(self.items)]
            and self.seconds < CALL_BOUND
        )


async def call(dispatch: TcpDispatch, worker: Worker, tag: str, max_tokens: int = 3) -> Ended:
    started = trio.current_time()
    items: list[object] = []
    error: RoutingError | None = None
    request = Request(tag, {"token_ids": PROMPT, "max_tokens": max_tokens})
    with trio.move_on_after(CALL_BOUND):
        try:
            stream = await dispatch.generate(worker.instance(), request)
            async for item in stream:
                if item.error is not None:
                    error = item.error
                    break
                items.append(item.data)
        except RoutingError as failure:
            error = failure
    return Ended(items, error, trio.current_time() - started)


async def calls(dispatch: TcpDispatch, worker: Worker, count: int, tag: str) -> list[Ended]:
    ended: list[Ended] = []

    async def one(n: int) -> None:
        ended.append(await call(dispatch, worker, f"{tag}-{n}"))

    async with trio.open_nursery() as nursery:
        for n in range(count):
            nursery.start_soon(one, n)
    return ended


# --- hostile requests, on raw connections ---

DialBacks = trio.MemoryReceiveChannel[tuple[object, object]]  # (subject, prologue) of each


@attrs.frozen
class Answer:
    """What a worker said to one request: the ACK text (None: the connection closed first),
    the prologue of a dial-back (None: none came), and the seconds until the answer."""

    ack: str | None
    prologue: object
    dialled_first: int  # dial-backs that came before the answer's own (must be none)
    seconds: float


@contextlib.asynccontextmanager
async def dial_back_server() -> AsyncIterator[tuple[int, DialBacks]]:
    """A response-stream server on 127.0.0.1: the port, and each dial-back's
    ``(subject, prologue)``."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    send, receive = trio.open_memory_channel[tuple[object, object]](1000)

    async def handle(stream: trio.SocketStream) -> None:
        connection = FramedConnection(stream)
        async with stream:
            with trio.move_on_after(ANSWER_BOUND), contextlib.suppress(*REFUSED):
                handshake = await connection.read_two_part(MAX_CONTROL_BYTES)
                prologue = await connection.read_two_part(MAX_CONTROL_BYTES)
                subject = _json(handshake.header).get("subject") if handshake else None
                await send.send((subject, _json(prologue.header) if prologue else None))

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, handle, listeners)
        yield listeners[0].socket.getsockname()[1], receive
        nursery.cancel_scope.cancel()


def _json(data: bytes) -> dict[str, object]:
    try:
        value = decode_json(data, "frame")
    except WireProtocolError:
        return {}
    return value if isinstance(value, dict) else {}


async def ask(worker: Worker, unusable: Unusable, port: int, dials: DialBacks) -> Answer:
    """Send ``unusable`` and then ``MARKER`` on one raw connection; read both ACKs and the
    dial-backs up to the one that answers (the marker's, when ``unusable`` is refused at the
    ACK: a dial-back before it would have been for the refused request)."""
    started = trio.current_time()
    expected = "marker" if unusable.at_ack else "unusable"
    messages = [request_message(NO_ENDPOINT, unusable.control(port, "unusable"))]
    if unusable.at_ack:
        messages.append(request_message(NO_ENDPOINT, MARKER.control(port, "marker")))
    ack: str | None = None
    prologue: object = None
    first = 0
    with trio.move_on_after(ANSWER_BOUND):
        stream = await trio.open_tcp_stream(*worker.host_port)
        async with stream:
            connection = FramedConnection(stream)
            await connection.send(b"".join(messages))
            with contextlib.suppress(*REFUSED):
                ack = await connection.read_ack()
                if unusable.at_ack:
                    await connection.read_ack()
            while True:
                subject, prologue = await dials.receive()
                if subject == expected:
                    break
                first += 1
    return Answer(ack, prologue, first, trio.current_time() - started)


def _names(prologue: object, field: str) -> bool:
    if not isinstance(prologue, dict):
        return False
    typed = prologue.get("typed_error")
    return (
        isinstance(typed, dict)
        and typed.get("error_type") == "InvalidArgument"
        and field in str(prologue.get("error"))
    )


def typed_answer(unusable: Unusable, answer: Answer) -> str | None:
    """Why ``answer`` is not the typed error TRN-022 asks for ``unusable`` (None: it is)."""
    if answer.seconds >= ANSWER_BOUND:
        return f"no answer within {ANSWER_BOUND} s: {answer}"
    if answer.dialled_first:
        return f"{answer.dialled_first} dial-back(s) before the answer: {answer}"
    if unusable.at_ack:
        ack = answer.ack or ""
        if not (ack.startswith("Server unavailable: unusable request:") and unusable.field in ack):
            return f"expected a refusal at the ACK naming {unusable.field}: {answer}"
        if not _names(answer.prologue, MARKER.field):
            return f"the marker request after it was not answered: {answer}"
        return None
    if answer.ack != "" or not _names(answer.prologue, unusable.field):
        return f"expected an ACK and an InvalidArgument prologue naming {unusable.field}: {answer}"
    return None


# --- resources ---


@attrs.frozen
class Figures:
    rss_kib: int
    fds: int

    @classmethod
    def of(cls, worker: Worker) -> Figures:
        return cls(worker.rss_kib(), worker.fds())


def settled(worker: Worker, near: Callable[[Figures], bool]) -> Figures:
    """Poll the worker's figures until ``near`` holds (bounded by ``SETTLE_BOUND``)."""
    deadline = time.monotonic() + SETTLE_BOUND
    figures = Figures.of(worker)
    while not near(figures) and time.monotonic() < deadline:
        time.sleep(POLL)
        figures = Figures.of(worker)
    return figures


def near_baseline(baseline: Figures) -> Callable[[Figures], bool]:
    return lambda now: (
        now.fds <= baseline.fds + FD_SLACK and now.rss_kib <= baseline.rss_kib + RSS_SLACK_KIB
    )


def check_survived(worker: Worker, baseline: Figures) -> Figures:
    assert worker.alive(), f"the worker died:\n{worker.stderr()}"
    assert "Traceback" not in worker.stderr(), worker.stderr()
    after = settled(worker, near_baseline(baseline))
    assert near_baseline(baseline)(after), f"resources did not settle: {baseline} -> {after}"
    return after


async def warm_up(dispatch: TcpDispatch, worker: Worker) -> None:
    ended = await call(dispatch, worker, "warm-up")
    assert ended.exact(3), ended
    assert ended.error is None, ended


# --- the cases ---


def test_unusable_requests_get_a_typed_error_and_nothing_else_fails(tmp_path: Path) -> None:
    """TRN-022, TRN-027: each request with one unusable field (Hypothesis, drawn from the
    schema) is refused at the ACK or in its prologue, naming the field; a well-formed request
    alongside gets exactly its items."""
    with running_worker(tmp_path) as worker:

        async def one(unusable: Unusable) -> tuple[Answer, Ended]:
            async with TcpDispatch.open() as dispatch, dial_back_server() as (port, dials):
                answer, ended = None, None

                async def hostile() -> None:
                    nonlocal answer
                    answer = await ask(worker, unusable, port, dials)

                async def alongside() -> None:
                    nonlocal ended
                    ended = await call(dispatch, worker, "alongside")

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(hostile)
                    nursery.start_soon(alongside)
                assert answer is not None
                assert ended is not None
                return answer, ended

        async def first() -> None:
            async with TcpDispatch.open() as dispatch:
                await warm_up(dispatch, worker)

        trio.run(first)
        baseline = Figures.of(worker)
        slowest = 0.0

        @settings(
            max_examples=60,
            deadline=None,
            database=None,
            phases=NO_SHRINKING,
            suppress_health_check=[HealthCheck.too_slow],
        )
        @given(unusable=unusable_requests())
        def each(unusable: Unusable) -> None:
            nonlocal slowest
            answer, ended = trio.run(one, unusable)
            assert worker.alive(), f"{unusable} killed the worker:\n{worker.stderr()}"
            problem = typed_answer(unusable, answer)
            assert problem is None, f"{unusable}: {problem}"
            assert ended.exact(3), ended
            assert ended.error is None, ended
            slowest = max(slowest, answer.seconds)

        each()
        after = check_survived(worker, baseline)
        slowest_ms = f"{slowest * 1000:.0f} ms"
        print(f"\nunusable fields: slowest typed error {slowest_ms}; {baseline} -> {after}")


def test_a_storm_of_every_unusable_kind_leaves_streams_exact(tmp_path: Path) -> None:
    """TRN-022, TRN-023: one request for every field and every class of value it cannot
    take (drawn afresh for each storm), all at once on their own connections, while 20
    well-formed streams run."""
    with running_worker(tmp_path) as worker:

        async def storm(sweep: list[Unusable]) -> tuple[list[str | None], list[Ended]]:
            acks: list[str | None] = [None] * len(sweep)
            room = trio.CapacityLimiter(CONNECTION_CAP // 2)
            async with TcpDispatch.open() as dispatch, dial_back_server() as (port, _dials):

                async def hostile(n: int, unusable: Unusable) -> None:
                    async with room:  # under the cap: that is the flood's case
                        await ask_once(n, unusable)

                async def ask_once(n: int, unusable: Unusable) -> None:
                    with trio.move_on_after(ANSWER_BOUND), contextlib.suppress(*REFUSED):
                        stream = await trio.open_tcp_stream(*worker.host_port)
                        async with stream:
                            connection = FramedConnection(stream)
                            control = unusable.control(port, f"storm-{n}")
                            await connection.send(request_message(NO_ENDPOINT, control))
                            acks[n] = await connection.read_ack()

                async with trio.open_nursery() as nursery:
                    for n, unusable in enumerate(sweep):
                        nursery.start_soon(hostile, n, unusable)
                    ended = await calls(dispatch, worker, 20, "storm")
            return acks, ended

        async def first() -> Figures:
            async with TcpDispatch.open() as dispatch:
                await warm_up(dispatch, worker)
            return Figures.of(worker)

        baseline = trio.run(first)

        @settings(max_examples=3, deadline=None, database=None, phases=NO_SHRINKING)
        @given(sweep=every_unusable_kind())
        def each(sweep: list[Unusable]) -> None:
            acks, ended = trio.run(storm, sweep)
            assert worker.alive(), f"a storm killed the worker:\n{worker.stderr()}"
            unanswered = [u for u, ack in zip(sweep, acks, strict=True) if ack is None]
            assert not unanswered, f"no ACK for {unanswered}"
            assert all(ack == "" or str(ack).startswith("Server unavailable:") for ack in acks)
            assert all(e.exact(3) for e in ended), ended
            assert all(e.error is None for e in ended), ended

        each()
        after = check_survived(worker, baseline)
        print(f"\nstorms of every unusable kind: {baseline} -> {after}")


def test_a_flood_of_idle_connections_is_capped(tmp_path: Path) -> None:
    """TRN-024: 2,000 idle connections against a worker under 256 open files: it holds at most
    its cap (64), a router connected before the flood keeps being served, a new caller gets
    a typed error at once, and everything is released when the flood leaves."""
    flood_size = 2000
    with running_worker(tmp_path) as worker:

        async def flood() -> tuple[Figures, Figures, list[Ended], Ended, Ended]:
            async with TcpDispatch.open() as dispatch:
                await warm_up(dispatch, worker)
                baseline = Figures.of(worker)
                async with contextlib.AsyncExitStack() as held:
                    for _ in range(flood_size):
                        stream = await trio.open_tcp_stream(*worker.host_port)
                        await held.enter_async_context(stream)
                    during = await trio.to_thread.run_sync(
                        settled, worker, lambda now: now.fds <= baseline.fds + CONNECTION_CAP
                    )
                    served = await calls(dispatch, worker, 10, "during")
                    async with TcpDispatch.open() as newcomer:
                        refused = await call(newcomer, worker, "newcomer")
                await trio.to_thread.run_sync(settled, worker, near_baseline(baseline))
                async with TcpDispatch.open() as newcomer:
                    later = await call(newcomer, worker, "later")
            return baseline, during, served, refused, later

        baseline, during, served, refused, later = trio.run(flood)
        held = during.fds - baseline.fds
        assert held <= CONNECTION_CAP, f"the worker holds {held} connections, cap {CONNECTION_CAP}"
        assert all(e.exact(3) and e.error is None for e in served), served
        assert refused.exact(3), f"a caller beyond the cap should get a typed error: {refused}"
        assert later.exact(3), later
        assert later.error is None, later
        after = check_survived(worker, baseline)
        print(
            f"\nidle flood of {flood_size}: worker held {held} (cap {CONNECTION_CAP}); "
            f"newcomer: {refused.error} in {refused.seconds * 1000:.0f} ms; {baseline} -> "
            f"{during} -> {after}"
        )


def test_slow_senders_of_large_messages_stay_within_the_budget(tmp_path: Path) -> None:
    """TRN-026: eight senders each declare a 32 MiB request and send 12 MiB of it, then
    stall. The worker buffers at most its budget (64 MiB), refuses the requests beyond it
    with ``Server overloaded``, serves well-formed requests throughout, and frees it all."""
    senders, declared, sent = 8, 32 * 1024 * 1024, 12 * 1024 * 1024
    with running_worker(tmp_path) as worker:

        async def slow() -> tuple[Figures, Figures, list[Ended], list[str | None]]:
            acks: list[str | None] = []
            async with TcpDispatch.open() as dispatch:
                await warm_up(dispatch, worker)
                baseline = Figures.of(worker)
                path = worker.path.encode()
                envelope = 2 * U16.size + len(path) + 2 + U32.size
                payload = declared - envelope  # the message is 32 MiB in all (TRN-049)
                head = U16.pack(len(path)) + path + U16.pack(2) + b"{}" + U32.pack(payload)
                async with contextlib.AsyncExitStack() as held:
                    streams = []
                    for _ in range(senders):
                        stream = await trio.open_tcp_stream(*worker.host_port)
                        await held.enter_async_context(stream)
                        streams.append(stream)
                    for stream in streams:
                        await stream.send_all(head + bytes(sent))
                    peak = Figures.of(worker)
                    served = await calls(dispatch, worker, 10, "slow")
                    for stream in streams:  # the rest of each message: refused, or undecodable
                        await stream.send_all(bytes(payload - sent))
                    for stream in streams:
                        connection = FramedConnection(stream)
                        ack = None
                        with trio.move_on_after(CALL_BOUND), contextlib.suppress(*REFUSED):
                            ack = await connection.read_ack()
                        acks.append(ack)
            return baseline, peak, served, acks

        baseline, peak, served, acks = trio.run(slow)
        grown = peak.rss_kib - baseline.rss_kib
        assert grown <= BUDGET // 1024 + RSS_SLACK_KIB, f"RSS grew {grown} KiB: {peak}"
        assert all(e.exact(3) for e in served), served
        overloaded = [ack for ack in acks if ack and ack.startswith("Server overloaded:")]
        assert len(acks) == senders, acks
        assert overloaded, acks
        after = check_survived(worker, baseline)
        print(
            f"\nslow senders: RSS {baseline.rss_kib // 1024} -> {peak.rss_kib // 1024} MiB "
            f"(peak) -> {after.rss_kib // 1024} MiB; {len(overloaded)} of {senders} refused"
        )


def test_an_idle_connection_is_closed(tmp_path: Path) -> None:
    """TRN-025, with the clock moved: ``WorkerServer`` closes a connection silent for its
    idle timeout, mid-message or between requests, and keeps serving."""
    from routespec.transport.worker_server import WorkerLimits, WorkerServer

    async def idle() -> None:
        server = WorkerServer(limits=WorkerLimits(idle_timeout=30.0))
        async with trio.open_nursery() as nursery:
            port = await nursery.start(server.run)
            silent = await trio.open_tcp_stream("127.0.0.1", port)
            partial = await trio.open_tcp_stream("127.0.0.1", port)
            async with silent, partial:
                await partial.send_all(U16.pack(5) + b"ab")  # a path cut short
                await trio.testing.wait_all_tasks_blocked()
                assert server.connections == 2
                await trio.sleep(29.0)
                assert server.connections == 2
                await trio.sleep(2.0)
                assert server.connections == 0
                assert await silent.receive_some(1) == b""
                assert await partial.receive_some(1) == b""
            nursery.cancel_scope.cancel()

    trio.run(idle, clock=trio.testing.MockClock(autojump_threshold=0.1))


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 3000), min_size=1, max_size=6),
    chunk=st.integers(16, 700),
    limit=st.integers(200, 2500),
)
def test_a_refused_message_leaves_the_connection_at_a_boundary(
    sizes: list[int], chunk: int, limit: int
) -> None:
    """TRN-026, in memory: whatever the sizes, the chunking and the limit, a message (or
    frame) the budget cannot hold is dropped whole and reported as ``OverBudget``, the next
    one reads intact, and the budget ends empty."""

    async def read_all() -> None:
        for frames in (False, True):
            send, receive = trio.testing.memory_stream_pair()
            budget = ByteBudget(limit)
            connection = FramedConnection(Chunked(receive, chunk), budget=budget)
            units = [
                TwoPart(b"{}", bytes([n % 251]) * size).encode()
                if frames
                else RequestMessage(f"p{n}", b"{}", bytes([n % 251]) * size).encode()
                for n, size in enumerate(sizes)
            ]
            data = b"".join(units)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(feed, send, data, chunk)
                for n, size in enumerate(sizes):
                    try:
                        unit = await (
                            connection.read_two_part() if frames else connection.read_request()
                        )
                    except OverBudget:
                        assert len(units[n]) + chunk > limit, (n, size, limit)
                        continue
                    assert unit is not None
                    body = unit.body if isinstance(unit, TwoPart) else unit.payload
                    assert body == bytes([n % 251]) * size
                    assert budget.used <= limit + chunk
                end = await (connection.read_two_part() if frames else connection.read_request())
                assert end is None
            connection.release()
            assert budget.used == 0

    trio.run(read_all)


class Chunked(trio.abc.Stream):
    """A stream whose every receive returns at most ``chunk`` bytes."""

    def __init__(self, inner: trio.abc.ReceiveStream, chunk: int) -> None:
        self.inner, self.chunk = inner, chunk

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.inner.receive_some(self.chunk)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        raise NotImplementedError

    async def wait_send_all_might_not_block(self) -> None:
        raise NotImplementedError

    async def aclose(self) -> None:
        await self.inner.aclose()


async def feed(send: trio.abc.SendStream, data: bytes, chunk: int) -> None:
    for start in range(0, len(data), chunk):
        await send.send_all(data[start : start + chunk])
    await send.aclose()
