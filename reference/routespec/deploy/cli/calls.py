"""``routespec call`` (one request) and ``routespec router`` (JSON lines on stdin): requests
through the routing host (on ``PushRouter``) and ``Migration`` over ``TcpDispatch``, fed by a
watched discovery store.

No request ends silently. SIGINT (Ctrl-C) and SIGTERM cancel the open requests and exit 130
and 143; ``router`` first writes each open request's end line, with the typed error
``Cancelled``. A request line the router cannot use (not UTF-8, not JSON, nested too deeply,
longer than ``MAX_LINE_BYTES``) gets its own ``InvalidArgument`` end line and the router goes
on. Any other exception is an internal error: the router writes an ``Unknown`` end line for
each open request and the command exits ``INTERNAL_ERROR_EXIT`` with an error line."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager

import attrs
import trio

from routespec.deploy.cli.usage import InternalError, UsageError, bind_failure, sole_bind_error
from routespec.deploy.cli.worker import metrics_for, serving_metrics
from routespec.deploy.metrics import NoMetrics, RouterCounts, RouterMetrics, error_kind
from routespec.discovery.url import open_store
from routespec.errors import ErrorKind, RoutingError, error_chain
from routespec.host.request import HostRequest, RoutingHints
from routespec.host.routing_host import RoutingHost, WorkerConfig
from routespec.migration import Migration
from routespec.routing.exclusions import Exclusions
from routespec.routing.push_router import PushRouter
from routespec.routing.selection import RouterMode
from routespec.routing.streaming import ItemStream, Request
from routespec.transport.frames import MAX_MESSAGE_BYTES
from routespec.transport.tcp_dispatch import TcpDispatch

# the spec's names and order (spec/selection.md, then the routing host's KV and Direct)
MODES = {
    mode.value: mode
    for mode in (
        RouterMode.ROUND_ROBIN,
        RouterMode.RANDOM,
        RouterMode.POWER_OF_TWO_CHOICES,
        RouterMode.LEAST_LOADED,
        RouterMode.DEVICE_AWARE_WEIGHTED,
        RouterMode.KV,
        RouterMode.DIRECT,
    )
}
MODE_ALIASES = {"p2c": RouterMode.POWER_OF_TWO_CHOICES.value}  # accepted, never shown
INTERRUPTED_EXIT = 130  # 128 + SIGINT, as shells report a Ctrl-C
TERMINATED_EXIT = 143  # 128 + SIGTERM
INTERRUPTED = "interrupted (Ctrl-C) before the stream ended"
TERMINATED = "terminated (SIGTERM) before the stream ended"
ROUTER_FAILED = "the router failed before the stream ended"
MAX_LINE_BYTES = MAX_MESSAGE_BYTES  # a longer request line could never be sent whole
SKIP_CHUNK = 1024 * 1024  # an over-long line's rest is read and dropped in pieces this big
CLOSE_TIMEOUT = 5.0  # seconds a stream's close may take once its request ends
PROGRESS_AFTER = 1.0  # seconds: short streams never draw a progress line
PROGRESS_EVERY = 0.1


@attrs.frozen
class Stop:
    """How a signal ends a command: the exit status, and why open requests ended."""

    status: int
    reason: str


STOPS = {
    signal.SIGINT: Stop(INTERRUPTED_EXIT, INTERRUPTED),
    signal.SIGTERM: Stop(TERMINATED_EXIT, TERMINATED),
}


@attrs.define
class Caller:
    """Sends requests through one routing host and counts them in ``metrics``."""

    host: RoutingHost
    migration: Migration
    pin: int | None
    metrics: RouterCounts
    _dispatches: dict[str, Callable[[int], None]] = attrs.field(factory=dict)

    def dispatched(self, request: Request, instance_id: int) -> Request:
        """The host's ``prepare`` step: tell the request's caller where it went."""
        self._dispatches[request.request_id](instance_id)
        return request

    async def stream(
        self, payload: object, on_item: Callable[[object, list[int]], None]
    ) -> RoutingError | None:
        """Stream one request; ``on_item`` gets each item and the workers tried so far.
        Returns the typed error that ended it, or None when it completed."""
        workers: list[int] = []
        routed = HostRequest(
            Request(uuid.uuid4().hex, payload), hints=RoutingHints(backend_instance_id=self.pin)
        )

        def on_dispatch(instance_id: int) -> None:
            self.metrics.dispatched(instance_id, migrated=bool(workers))
            workers.append(instance_id)

        async def attempt(request: Request, exclusions: Exclusions) -> ItemStream:
            return await self.host.generate(attrs.evolve(routed, request=request), exclusions)

        self._dispatches[routed.request_id] = on_dispatch
        self.metrics.start()
        error: RoutingError | None = None
        try:
            # a pinned request goes to its worker alone, and is never migrated (MIG-011)
            stream = await self.migration.stream(
                routed.request, attempt, pinned=self.pin is not None, is_stopped=lambda: False
            )
            try:
                async for item in stream:
                    if item.error is not None:
                        error = item.error
                        break
                    on_item(item.data, workers)
            finally:  # shielded: a cancellation must not replace the exception in flight
                with trio.move_on_after(CLOSE_TIMEOUT, shield=True):
                    await stream.aclose()
        except RoutingError as failure:
            error = failure
        except trio.Cancelled:
            error = RoutingError(ErrorKind.CANCELLED, INTERRUPTED)  # counted as such
            raise
        finally:
            del self._dispatches[routed.request_id]
            self.metrics.finish(error)
        return error


def _mode(args: argparse.Namespace) -> RouterMode:
    mode = MODES[args.mode]
    if mode is RouterMode.DIRECT and args.instance is None:
        raise UsageError("--instance", "--mode direct needs the worker's instance id")
    if mode is not RouterMode.DIRECT and args.instance is not None:
        raise UsageError("--instance", "only with --mode direct")
    return mode


@asynccontextmanager
async def open_caller(args: argparse.Namespace, metrics: RouterCounts) -> AsyncIterator[Caller]:
    mode = _mode(args)
    store = open_store(args.discovery, args.ttl)
    await store.check()
    configs: dict[int, WorkerConfig] = {}  # what the KV selector knows: every discovered worker

    def added(instance_id: int) -> None:
        configs[instance_id] = WorkerConfig()
        dispatch.instance_added(instance_id)

    def removed(instance_id: int) -> None:
        configs.pop(instance_id, None)
        dispatch.instance_removed(instance_id)

    async with AsyncExitStack() as stack:
        try:  # the response plane's listener, where workers dial back
            dispatch = await stack.enter_async_context(TcpDispatch.open(args.host))
        except (OSError, UnicodeError, BaseExceptionGroup) as error:
            if (bind_error := sole_bind_error(error)) is None:
                raise
            raise bind_failure(bind_error, ("--host", args.host), ("--host", 0)) from None
        found = await stack.enter_async_context(store.watch(args.endpoint, added, removed))
        configs.update({instance_id: WorkerConfig() for instance_id in found.instance_ids()})
        router = PushRouter.create(args.endpoint, found, dispatch)
        host = RoutingHost.create(router, mode)
        host.worker_configs = configs
        caller = Caller(host, Migration(router, args.migration_limit), args.instance, metrics)
        host.prepare = caller.dispatched
        yield caller


def parse_payload(text: str, field: str) -> object:
    try:
        return json.loads(text)
    except ValueError as error:
        raise UsageError(field, f"not JSON: {error}") from None


@attrs.define
class Progress:
    """A live line on stderr for long streams, drawn only when stderr is a terminal."""

    enabled: bool
    started: float = attrs.field(factory=time.monotonic)
    items: int = 0
    drawn_at: float = 0.0

    def item(self, workers: list[int]) -> None:
        self.items += 1
        now = time.monotonic()
        if not self.enabled or now - self.started < PROGRESS_AFTER:
            return
        if now - self.drawn_at >= PROGRESS_EVERY:
            self.drawn_at = now
            line = (
                f"{self.items} items, {now - self.started:.1f} s, worker {workers[-1]:x}, "
                f"{len(workers) - 1} migrations"
            )
            sys.stderr.write(f"\r\033[K{line}")
            sys.stderr.flush()

    def clear(self) -> None:
        if self.drawn_at:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


async def until_signal(work: Callable[[], Awaitable[None]]) -> Stop | None:
    """Run ``work`` until it returns, or until SIGINT or SIGTERM cancels it: then the signal's
    ``Stop``. An exception from ``work`` propagates.

    An ignored signal stays ignored: a script's background job is not meant to get SIGINT."""
    watched = [s for s in STOPS if signal.getsignal(s) is not signal.SIG_IGN]
    if not watched:
        await work()
        return None
    stop: Stop | None = None
    with trio.open_signal_receiver(*watched) as signals:
        async with trio.open_nursery() as nursery:

            async def cancel_on_signal() -> None:
                nonlocal stop
                async for signum in signals:
                    stop = STOPS[signal.Signals(signum)]
                    nursery.cancel_scope.cancel()
                    return

            nursery.start_soon(cancel_on_signal)
            await work()
            nursery.cancel_scope.cancel()
    return stop


async def call(args: argparse.Namespace) -> int:
    """Print each item's data as a JSON line; exit 1 with the typed error if one ends it,
    130 on SIGINT and 143 on SIGTERM."""
    payload = parse_payload(args.request, "request")
    progress = Progress(sys.stderr.isatty())
    outcome: list[RoutingError | None] = []

    def on_item(data: object, workers: list[int]) -> None:
        print(json_line(data), flush=True)
        progress.item(workers)

    async def request() -> None:
        async with open_caller(args, NoMetrics()) as caller:
            outcome.append(await caller.stream(payload, on_item))

    try:
        stop = await until_signal(request)
    finally:
        progress.clear()
    if stop is not None:
        print(f"routespec: request failed: Cancelled: {stop.reason}", file=sys.stderr)
        return stop.status
    if not outcome:  # a layer below swallowed what ended the request
        raise InternalError("the request ended without an outcome or an error")
    if outcome[0] is not None:
        print(f"routespec: request failed: {outcome[0]}", file=sys.stderr)
        for cause in list(error_chain(outcome[0]))[1:]:  # e.g. each attempt's failure
            print(f"  caused by: {cause}", file=sys.stderr)
        return 1
    return 0


async def router(args: argparse.Namespace) -> int:
    """Each stdin line is a request (JSON), sent at once; stdout gets JSON lines
    ``{"request": n, "data": ...}``, then ``{"request": n, "done": true}`` or
    ``{"request": n, "error": ..., "type": ...}``. Ends after stdin closes and all are done;
    on SIGINT or SIGTERM, after an end line with ``"type": "Cancelled"`` for each open
    request; on an internal error, after an end line of type ``Unknown`` for each."""
    metrics = metrics_for(args, RouterMetrics)
    requests = OpenRequests()

    async def route() -> None:
        with serving_metrics(metrics, args) as metrics_url:
            async with open_caller(args, metrics) as caller, trio.open_nursery() as nursery:
                print(json.dumps({"ready": True, "metrics": metrics_url}), flush=True)
                number = 0
                stdin = StdinLines(sys.stdin.fileno())
                while (line := await stdin.next()) is not None:
                    if not isinstance(line, bytes) or line.strip():
                        requests.opened(number)
                        nursery.start_soon(requests.route, caller, number, line)
                        number += 1
                requests.input_ended = True

    try:
        stop = await until_signal(route)
    except Exception as failure:
        requests.end_all(RoutingError(ErrorKind.UNKNOWN, f"{ROUTER_FAILED}: {describe(failure)}"))
        raise
    if stop is not None:
        requests.end_all(RoutingError(ErrorKind.CANCELLED, stop.reason))
        return stop.status
    if lost := requests.lost():  # a layer below swallowed what ended the router
        requests.end_all(RoutingError(ErrorKind.UNKNOWN, f"{ROUTER_FAILED}: {describe(lost)}"))
        raise lost
    return 0


def describe(failure: BaseException) -> str:
    """``Type: message`` of an exception, or of the first one an exception group holds."""
    while isinstance(failure, BaseExceptionGroup):
        failure = failure.exceptions[0]
    return f"{type(failure).__name__}: {failure}"


@attrs.frozen
class OverLong:
    """A request line longer than ``MAX_LINE_BYTES``, read and dropped: only its size."""

    size: int


class StdinLines:
    """Request lines from a file descriptor, each at most ``limit`` bytes in memory: a longer
    line is read to its end and dropped (``OverLong``). The blocking read runs in a worker
    thread that a signal's cancellation abandons; it is a bare ``os.read``, which holds no
    lock of Python's buffered stdin, so the process can exit while one is pending."""

    def __init__(self, fd: int, limit: int = MAX_LINE_BYTES) -> None:
        self.fd = fd
        self.limit = limit
        self.buffer = bytearray()
        self.skipped = 0  # bytes of an over-long line dropped so far
        self.ended = False

    async def next(self) -> bytes | OverLong | None:
        """The next line (None once the input has ended)."""
        while True:
            end = self.buffer.find(b"\n") + 1
            if end:
                line = bytes(self.buffer[:end])
                del self.buffer[:end]
                if self.skipped:
                    size, self.skipped = self.skipped + len(line), 0
                    return OverLong(size)
                return line
            if len(self.buffer) > self.limit:
                self.skipped += len(self.buffer)
                self.buffer.clear()
            if self.ended:
                rest, self.buffer = bytes(self.buffer), bytearray()
                if self.skipped:
                    size, self.skipped = self.skipped + len(rest), 0
                    return OverLong(size)
                return rest or None
            chunk = await trio.to_thread.run_sync(
                os.read, self.fd, SKIP_CHUNK, abandon_on_cancel=True
            )
            if chunk:
                self.buffer += chunk
            else:
                self.ended = True


def parse_request(line: bytes | OverLong) -> object:
    """A request line's payload; a line that cannot be one is ``InvalidArgument``."""
    if isinstance(line, OverLong):
        raise RoutingError(
            ErrorKind.INVALID_ARGUMENT,
            f"request line is {line.size} bytes, over the {MAX_LINE_BYTES}-byte limit",
        )
    try:
        return json.loads(line.decode())
    except UnicodeDecodeError as error:
        reason = f"not UTF-8: {error}"
    except RecursionError:
        reason = "not JSON: nested too deeply"
    except ValueError as error:
        reason = f"not JSON: {error}"
    raise RoutingError(ErrorKind.INVALID_ARGUMENT, f"request line is {reason}")


def json_line(data: object) -> str:
    """A response item as one JSON line; an item JSON cannot hold ends its request with a
    typed error (the caller's ``RoutingError``), never the process."""
    try:
        return json.dumps(data)
    except (TypeError, ValueError, RecursionError) as error:
        raise RoutingError(
            ErrorKind.UNKNOWN,
            f"response item cannot be written as JSON: {type(error).__name__}: {error}",
        ) from None


@attrs.define
class OpenRequests:
    """The router's requests without an end line yet, by number; writes their lines.

    ``failures`` keeps each unexpected exception that ended a request's handling, and
    ``input_ended`` says the router read its input to the end, so that ``router`` still
    reports a failure that a layer below swallowed on its way out (``lost``)."""

    numbers: set[int] = attrs.field(factory=set)
    failures: list[Exception] = attrs.field(factory=list)
    input_ended: bool = False

    def opened(self, number: int) -> None:
        self.numbers.add(number)

    def lost(self) -> Exception | None:
        """After the routing ended without an exception: the one it should have ended
        with, if something below swallowed it."""
        if self.failures:
            return self.failures[0]
        if self.numbers:
            return InternalError(f"{len(self.numbers)} requests ended without an outcome")
        if not self.input_ended:
            return InternalError("the router stopped before the end of its input")
        return None

    @staticmethod
    def emit(number: int, **fields: object) -> None:
        print(json_line({"request": number, **fields}), flush=True)

    def end(self, number: int, error: RoutingError | None) -> None:
        """The request's last line: ``done``, or its typed error."""
        if error is None:
            self.emit(number, done=True)
        else:
            self.emit(number, error=str(error), type=error_kind(error))
        self.numbers.discard(number)

    def end_all(self, error: RoutingError) -> None:
        """End every open request with ``error``, in request order."""
        for number in sorted(self.numbers):
            self.end(number, error)

    async def route(self, caller: Caller, number: int, line: bytes | OverLong) -> None:
        try:
            payload = parse_request(line)
        except RoutingError as refused:
            self.end(number, refused)
            return
        try:
            error = await caller.stream(payload, lambda data, _: self.emit(number, data=data))
        except Exception as failure:
            self.failures.append(failure)
            raise
        self.end(number, error)
