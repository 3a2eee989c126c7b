"""The worker side of the TCP transport: request server, ACK, call-home response streams.

One ``WorkerServer`` listens on a request-plane port and serves handlers by endpoint path.
For each accepted request it ACKs on the same connection, dials the caller's response-stream
address, and writes handshake, prologue, data frames, ``complete_final`` and the sentinel.
A ``stop`` or ``kill`` from the caller, or the caller shutting down its side, ends the stream
at once without a final frame (TRN-035, ``_Watcher``); a bidirectional request whose request
stream breaks ends with a typed error item (TRN-036, ``_read_inputs``), and its request
stream carries nothing from the worker but the handshake (TRN-045). ``drain`` is a
graceful shutdown: new requests are refused, open streams get a grace period to finish, and
the rest end with ``Backend(EngineShutdown)`` so that their callers migrate them.

Whatever a peer sends, only that peer's request or connection fails (TRN-012, TRN-022,
TRN-023): a request the worker cannot use is refused with a typed error naming the field,
and no exception leaves a connection's handler or a request's task. The server bounds what
peers can hold (``WorkerLimits``): connections (TRN-024), idle time (TRN-025), buffered
request bytes (TRN-026), and the hosts it dials back to (TRN-027).
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import functools
import ipaddress
import json
import logging
import resource
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable

import attrs
import trio

from routespec.errors import BackendKind, ErrorKind, RoutingError, one_line
from routespec.routing.streaming import (
    Rejection,
    RejectionKind,
    Request,
    RequestStream,
    WorkerHandler,
)
from routespec.transport.codecs import PayloadCodec, decode_json, encode_json
from routespec.transport.connection import (
    CONNECTION_ERRORS,
    LOOPBACK,
    ByteBudget,
    ConnectionIdle,
    FramedConnection,
    IPAddress,
    OverBudget,
    ip_literal,
    open_stream,
)
from routespec.transport.control import (
    CONNECTION_INFO,
    KILL,
    REQUEST_STREAM_INFO,
    STOP,
    ControlMessage,
    DialBackPolicy,
    StreamAddress,
    UnusableControl,
    host_port,
    read_control,
    shown,
)
from routespec.transport.frame_writer import FrameWriter, before_waiting
from routespec.transport.frames import (
    MAX_CONTROL_BYTES,
    SENTINEL,
    TwoPart,
    WireProtocolError,
    decode_two_part,
    encode_ack,
)
from routespec.transport.response_pool import REUSE, REUSE_HEADER, ResponsePool
from routespec.transport.wire_errors import encode_error

SENTINEL_FRAME = TwoPart(header=SENTINEL).encode()
REUSE_FRAME_HEADER = encode_json(REUSE)  # the control word as a caller writes it
PROLOGUE_OK = TwoPart(header=b'{"error":null}').encode()
VETTED_CACHE = 1024  # IP-literal stream addresses remembered as allowed, per peer
SHUTTING_DOWN = "worker is shutting down"
STREAM_CUT_AT_SHUTDOWN = "worker shut down before the stream finished"
UNUSABLE = "unusable request"

# TRN-024 … TRN-026: the defaults of ``WorkerLimits`` (spec/transport.md states them).
DEFAULT_MAX_CONNECTIONS = 1024
FD_SHARE = 4  # below 4 * 1024 open files, the cap is a quarter of the process's limit
DEFAULT_IDLE_TIMEOUT = 600.0
DEFAULT_MAX_BUFFERED_BYTES = 64 * 1024 * 1024
RESOLVE_TIMEOUT = 5.0  # for a stream address that names a host rather than an IP address

LOG = logging.getLogger("routespec.worker")
_json = json.encoder.encode_basestring_ascii  # a str as encode_json writes it
TaskBody = Callable[..., Awaitable[None]]


def default_max_connections() -> int:
    """1024, or a quarter of the process's open-file limit when that is lower (TRN-024):
    the rest of the descriptors stay free for response streams and the process itself."""
    try:
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return DEFAULT_MAX_CONNECTIONS
    if soft == resource.RLIM_INFINITY:
        return DEFAULT_MAX_CONNECTIONS
    return max(1, min(DEFAULT_MAX_CONNECTIONS, soft // FD_SHARE))


@attrs.frozen
class WorkerLimits:
    """What peers can hold of a worker: request-plane connections at once (TRN-024), the
    seconds a connection may stay silent (TRN-025), the request bytes buffered at once over
    all connections (TRN-026), and where the worker may dial back (TRN-027)."""

    max_connections: int = attrs.field(factory=default_max_connections)
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT
    max_buffered_bytes: int = DEFAULT_MAX_BUFFERED_BYTES
    dial_back: DialBackPolicy = attrs.field(factory=DialBackPolicy)


# An item's frame and the final one, as Dynamo writes them (TRN-039).
def data_frame(codec: PayloadCodec, annotated: dict[str, object]) -> bytes:
    return TwoPart(body=codec.encode({"data": annotated, "complete_final": False})).encode()


@functools.cache
def final_frame(codec: PayloadCodec) -> bytes:
    return TwoPart(body=codec.encode({"complete_final": True})).encode()


def error_annotated(error: RoutingError) -> dict[str, object]:
    return {"event": "error", "error": encode_error(error)}


def prologue_error(error: RoutingError) -> bytes:
    """A prologue that fails the request before its first item with ``error`` (TRN-005)."""
    prologue = {"error": str(error), "typed_error": encode_error(error)}
    return TwoPart(header=encode_json(prologue)).encode()


class WorkerServer:
    """Serves ``WorkerHandler``s over the request plane on ``host`` (loopback by default)."""

    def __init__(
        self, host: str = LOOPBACK, port: int = 0, limits: WorkerLimits | None = None
    ) -> None:
        self.host = host
        self.port = port
        self.limits = WorkerLimits() if limits is None else limits
        self.bytes_received: collections.Counter[str] = collections.Counter()
        self.connections = 0  # request-plane connections open now (TRN-024)
        self.budget = ByteBudget(self.limits.max_buffered_bytes)  # TRN-026
        self._handlers: dict[str, WorkerHandler] = {}
        self._scope = trio.CancelScope()
        self._nursery: trio.Nursery | None = None
        self._draining = False
        self._open_streams: set[trio.CancelScope] = set()
        self._streams_changed = trio.Event()
        self._cap_reported = False
        self._vetted_addresses: dict[tuple[str, IPAddress | None], str] = {}
        self._vetted_under = self.limits
        self.response_pool = ResponsePool()  # connections callers released (TRN-028, TRN-029)

    def serve(self, path: str, handler: WorkerHandler) -> str:
        """Serve ``handler`` at ``path``; returns the transport address discovery records.

        The worker answers in whichever codec (msgpack or JSON) the caller's control message
        names, so its discovery record may declare either."""
        self._handlers[path] = handler
        return f"{self.host}:{self.port}/{path}"

    def kill(self) -> None:
        """Stop at once, as a crashed process would: every socket closes, nothing is flushed."""
        self._scope.cancel()

    async def drain(self, grace_period: float) -> None:
        """Refuse new requests, give open streams ``grace_period`` seconds to finish, then end
        the rest with ``Backend(EngineShutdown)``, a migratable error (TRN-037)."""
        self._draining = True
        with trio.move_on_after(grace_period):
            await self._wait_for_streams()
        for scope in self._open_streams:
            scope.cancel()
        await self._wait_for_streams()

    async def _wait_for_streams(self) -> None:
        while self._open_streams:
            self._streams_changed = trio.Event()
            await self._streams_changed.wait()

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        with self._scope:
            # at its host only, the address its record gives callers (TRN-055)
            listeners = await trio.open_tcp_listeners(self.port, host=self.host)
            self.port = listeners[0].socket.getsockname()[1]
            try:
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    nursery.start_soon(self.response_pool.keep_swept)
                    task_status.started(self.port)
                    await trio.serve_listeners(self._serve_connection, listeners)
            finally:
                self.response_pool.close_all()

    # one request-plane connection

    async def _serve_connection(self, stream: trio.SocketStream) -> None:
        if self.connections >= self.limits.max_connections:  # TRN-024: closed at once
            if not self._cap_reported:  # one line for each time the cap is reached
                self._cap_reported = True
                LOG.warning(
                    "worker: %d connections open, the limit; closing new ones until one ends",
                    self.connections,
                )
            await trio.aclose_forcefully(stream)
            return
        self.connections += 1
        connection = FramedConnection(stream, budget=self.budget)
        peer = connection.peer
        try:
            await self._serve_requests(connection)
        except* Exception as group:  # TRN-023: whatever went wrong ends this connection only
            LOG.warning("worker: connection from %s closed: %s", peer, one_line(group))
        finally:
            self.connections -= 1  # under the cap now: reaching it again is worth a line
            self._cap_reported = False
            connection.release()
            with trio.CancelScope(shield=True):  # a Cancelled must not replace what is in flight
                await trio.aclose_forcefully(stream)

    async def _serve_requests(self, connection: FramedConnection) -> None:
        try:
            with connection.ending_when_idle(self.limits.idle_timeout):
                await self._read_requests(connection)
        except WireProtocolError as error:  # TRN-057: the peer is told nothing, the log is
            LOG.warning("worker: connection from %s closed: %s", connection.peer, error)
        except (ConnectionIdle, *CONNECTION_ERRORS):
            pass  # a silent or vanished peer loses only its own connection (TRN-012)
        if connection.holding:  # the ACKs of the requests read before the fault or the end
            with contextlib.suppress(*CONNECTION_ERRORS):
                await connection.send(b"")

    async def _read_requests(self, connection: FramedConnection) -> None:
        while True:
            try:
                message = await connection.read_request()
            except OverBudget as refused:  # TRN-026: its bytes were dropped, not held
                await connection.send(encode_ack(f"{RejectionKind.OVERLOADED.value} {refused}"))
                continue
            if message is None:
                return
            size = 8 + len(message.path.encode()) + len(message.headers) + len(message.payload)
            self.bytes_received[message.path if message.path in self._handlers else ""] += size
            reuse = REUSE_HEADER in message.headers  # the caller offers reuse (TRN-028)
            await self._accept(connection, message.path, message.payload, reuse)

    async def _accept(
        self, connection: FramedConnection, path: str, payload: bytes, reuse: bool
    ) -> None:
        """Check the request, ACK it, and start its response (TRN-022: a request the worker
        cannot use is refused here, or in its prologue, naming the field at fault)."""
        peer = connection.peer  # found once per connection
        try:
            parts = decode_two_part(payload)
        except WireProtocolError as error:
            await self._refuse(connection, error)
            return
        read = read_control(parts.header)
        unusable = read.error if isinstance(read, UnusableControl) else None
        if read.response is None:
            assert unusable is not None
            await self._refuse(connection, unusable)  # nowhere to send a prologue: no dial
            return
        response = await self._vetted(read.response, CONNECTION_INFO, peer)
        if isinstance(response, WireProtocolError):
            await self._refuse(connection, response)  # TRN-027: never dialled
            return
        if isinstance(read, ControlMessage) and read.request_stream is not None:
            inputs = await self._vetted(read.request_stream, REQUEST_STREAM_INFO, peer)
            if isinstance(inputs, WireProtocolError):
                unusable = inputs
            else:
                read = attrs.evolve(read, request_stream=inputs)
        if unusable is not None or not isinstance(read, ControlMessage):
            assert unusable is not None
            await _ack(connection, "")
            invalid = RoutingError(ErrorKind.INVALID_ARGUMENT, f"{UNUSABLE}: {unusable}")
            self._start(peer, self._fail_in_prologue, response, invalid)
            return
        control = read if response is read.response else attrs.evolve(read, response=response)
        handler = self._handlers.get(path)
        if handler is None:
            await _ack(connection, f"Server unavailable: no endpoint at {path}")
            return
        failure: WireProtocolError | None = None
        body: object = None
        if control.request_stream is None:  # a bidirectional envelope is header-only
            try:
                body = control.payload_codec.decode(parts.body, "request.body")
            except WireProtocolError as error:
                failure = error
        request = Request(control.request_id, body, control.metadata)
        try:
            rejection = handler.admit(request)
        except Exception as error:  # TRN-023: a handler's fault refuses its request only
            LOG.warning("worker: admitting a request from %s failed: %s", peer, one_line(error))
            rejection = Rejection(RejectionKind.UNAVAILABLE, f"admission failed: {error}")
        if self._draining:  # WorkerUnavailable at the caller: it migrates the request
            rejection = Rejection(RejectionKind.UNAVAILABLE, SHUTTING_DOWN)
        if rejection is not None:
            await _ack(connection, rejection.ack_text())
            return
        # The ACK leaves with the stream's first write, or as soon as the stream's task
        # first waits (``_acked_then``): the caller then reads both in one wake-up.
        connection.hold(encode_ack(""))
        pool = self.response_pool if reuse and control.request_stream is None else None
        assert self._nursery is not None
        self._nursery.start_soon(
            _acked_then, connection, peer, self._respond, control, handler, request, failure, pool
        )

    async def _refuse(self, connection: FramedConnection, error: WireProtocolError) -> None:
        """Refuse at the ACK, naming the field, when no usable response address exists."""
        await _ack(connection, f"{RejectionKind.UNAVAILABLE.value} {UNUSABLE}: {error}")

    async def _vetted(
        self, address: StreamAddress, name: str, peer: IPAddress | None
    ) -> StreamAddress | WireProtocolError:
        """``address`` with its host resolved to an IP address this worker may dial back to
        (TRN-027), or the error naming the field."""
        if self._vetted_under is not self.limits:  # the policy changed: forget its answers
            self._vetted_addresses.clear()
            self._vetted_under = self.limits
        known = self._vetted_addresses.get((address.address, peer))
        if known is not None:  # an IP literal this peer was allowed before (TRN-027)
            return address if known == address.address else attrs.evolve(address, address=known)
        field = f"{name}.info.address"
        try:
            host, port = host_port(address.address, field)
            candidates = await _resolve(host, port, field)
        except WireProtocolError as error:
            return error
        policy = self.limits.dial_back
        for ip in candidates:
            if policy.allows(ip, peer):
                literal = f"[{ip}]" if ip.version == 6 else str(ip)
                vetted = f"{literal}:{port}"
                if ip_literal(host) is not None:  # a name may resolve otherwise next time
                    if len(self._vetted_addresses) >= VETTED_CACHE:
                        self._vetted_addresses.clear()
                    self._vetted_addresses[(address.address, peer)] = vetted
                return attrs.evolve(address, address=vetted)
        return WireProtocolError(
            field,
            f"host {shown(host)} is not one this worker dials back to (the request came from "
            f"{peer}; allowed: {policy.describe()})",
        )

    def _start(self, peer: IPAddress | None, body: TaskBody, *args: object) -> None:
        assert self._nursery is not None
        self._nursery.start_soon(_guarded, peer, body, *args)

    # one request's streams

    async def _fail_in_prologue(self, response: StreamAddress, failure: RoutingError) -> None:
        try:
            async with _dial(response, "response", prologue_error(failure), self.budget):
                pass
        except* (OSError, *CONNECTION_ERRORS):
            pass  # the caller went away; nothing is left to tell it

    async def _respond(
        self,
        control: ControlMessage,
        handler: WorkerHandler,
        request: Request,
        failure: WireProtocolError | None,
        pool: ResponsePool | None = None,
    ) -> None:
        try:
            if control.request_stream is not None:
                async with _dial(control.request_stream, "request", b"", self.budget) as inputs:
                    inputs_stream = RequestStream(_read_inputs(inputs, control.payload_codec))
                    request = attrs.evolve(request, payload=inputs_stream)
                    await self._respond_with(control, handler, request, failure, None)
            else:
                await self._respond_with(control, handler, request, failure, pool)
        except* (OSError, *CONNECTION_ERRORS):
            pass  # the caller went away; nothing is left to tell it

    async def _respond_with(
        self,
        control: ControlMessage,
        handler: WorkerHandler,
        request: Request,
        failure: WireProtocolError | None,
        pool: ResponsePool | None,
    ) -> None:
        try:
            if failure is not None:
                raise RoutingError(ErrorKind.INVALID_ARGUMENT, str(failure))
            items = await _started(handler, request)
        except RoutingError as error:
            async with _dial(control.response, "response", prologue_error(error), self.budget):
                return
        try:
            # Handshake and prologue go out with the first frames: one send, not two.
            async with _dial(
                control.response, "response", PROLOGUE_OK, self.budget, hold=True, pool=pool
            ) as output:
                ended = await self.send_items(output, control.payload_codec, items, watch=True)
                if ended and pool is not None:
                    await _await_release(output, pool)
        finally:
            if not _finished(items):
                with trio.CancelScope(shield=True):
                    await items.aclose()

    async def send_items(
        self,
        connection: FramedConnection,
        codec: PayloadCodec,
        items: AsyncGenerator[object, None],
        *,
        watch: bool = False,
    ) -> bool:
        """Data frames, an error item if the handler fails or a drain cuts the stream, then
        final frame and sentinel (True once they are sent). With ``watch``, a ``stop`` or
        ``kill`` from the caller, or the caller going away, ends the stream at once."""
        # One scope per stream: ``drain`` cancels it after its grace period (the stream then
        # ends with an error item), a caller's stop or kill too (it ends there).
        stream = trio.CancelScope()
        self._open_streams.add(stream)
        watcher = _Watcher(connection, self._nursery, stream) if watch else None
        out = FrameWriter(connection) if watcher is None else FrameWriter(connection, watcher.start)
        try:
            with stream:
                try:
                    while True:
                        try:
                            item = await before_waiting(items.__anext__(), out.about_to_wait)
                        except StopAsyncIteration:
                            break
                        if not await self.send_item(out, codec, item):
                            await out.flush()
                            return False  # the stream ends here, without a final frame
                except RoutingError as error:
                    await out.write(data_frame(codec, error_annotated(error)))
                except Exception as error:  # TRN-023: the handler's fault ends its stream
                    failure = RoutingError(BackendKind.UNKNOWN, one_line(error))
                    await out.write(data_frame(codec, error_annotated(failure)))
            if watcher is not None and watcher.stopped:
                return False  # a stop, a kill or a close cut it short
            if stream.cancelled_caught:
                cut = RoutingError(BackendKind.ENGINE_SHUTDOWN, STREAM_CUT_AT_SHUTDOWN)
                await out.write(data_frame(codec, error_annotated(cut)))
            await out.write(final_frame(codec) + SENTINEL_FRAME)
            await out.flush()
            return True
        finally:  # after the frames have left: a drain waits for them
            if watcher is not None and watcher.started:
                with trio.CancelScope(shield=True):
                    await watcher.ended()
            self._open_streams.discard(stream)
            self._streams_changed.set()

    async def send_item(self, out: FrameWriter, codec: PayloadCodec, item: object) -> bool:
        """Write one item; False ends the stream at once."""
        await out.write(data_frame(codec, {"data": item}))
        return True


def _finished(items: AsyncGenerator[object, None]) -> bool:
    """An async generator that ran to its end: closing it cannot wait, or do anything."""
    return getattr(items, "ag_frame", True) is None


async def _ack(connection: FramedConnection, text: str) -> None:
    """Send the ACK of a request that gets no stream of its own; while another whole
    request is buffered behind it, hold it to leave with what is written next there."""
    if connection.request_buffered():
        connection.hold(encode_ack(text))
    else:
        await connection.send(encode_ack(text))


# In a stream's task (``_acked_then``): what sends the request's held ACK, which should
# leave just before the stream's first write, so that the caller finds both at once.
_ACK_FIRST: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar(
    "routespec_ack_first", default=None
)


async def _acked_then(
    connection: FramedConnection, peer: IPAddress | None, body: TaskBody, *args: object
) -> None:
    """``_guarded``, sending the ACKs ``connection`` holds before the task first waits (or
    when it ends, if it never does)."""
    _ACK_FIRST.set(connection.send_held_nowait)  # this task's context only
    try:
        await before_waiting(_guarded(peer, body, *args), connection.send_held_nowait)
    finally:
        connection.send_held_nowait()


async def _guarded(peer: IPAddress | None, body: TaskBody, *args: object) -> None:
    """A request's task: no exception leaves it (TRN-023); cancellation still does."""
    try:
        await body(*args)
    except* Exception as group:
        LOG.warning("worker: a request from %s ended early: %s", peer, one_line(group))


async def _started(handler: WorkerHandler, request: Request) -> AsyncGenerator[object, None]:
    """``handler.start``; an exception other than ``RoutingError`` is ``Backend(Unknown)``."""
    try:
        return await handler.start(request)
    except RoutingError:
        raise
    except Exception as error:
        raise RoutingError(BackendKind.UNKNOWN, one_line(error)) from None


async def _resolve(host: str, port: int, field: str) -> list[IPAddress]:
    """The IP addresses ``host`` stands for: itself, or what the resolver says within
    ``RESOLVE_TIMEOUT`` seconds."""
    literal = ip_literal(host)
    if literal is not None:
        return [literal]
    found: list[IPAddress] = []
    with trio.move_on_after(RESOLVE_TIMEOUT):
        try:
            infos = await trio.socket.getaddrinfo(host, port, type=trio.socket.SOCK_STREAM)
        except (OSError, UnicodeError) as error:
            reason = f"host {shown(host)} does not resolve: {error}"
            raise WireProtocolError(field, reason) from None
        for *_, sockaddr in infos:
            with contextlib.suppress(ValueError):
                found.append(ipaddress.ip_address(str(sockaddr[0]).partition("%")[0]))
        return found
    raise WireProtocolError(field, f"host {shown(host)} did not resolve in {RESOLVE_TIMEOUT:g} s")


@contextlib.asynccontextmanager
async def _dial(
    address: StreamAddress,
    stream_type: str,
    then: bytes = b"",
    budget: ByteBudget | None = None,
    *,
    hold: bool = False,
    pool: ResponsePool | None = None,
) -> AsyncIterator[FramedConnection]:
    """Dial the caller's stream server (or, with ``pool``, take a connection it released
    there), introduce the stream by its subject and send ``then`` (the prologue) in the same
    write; with ``hold``, in the first write of the stream (``FramedConnection.hold``). With
    ``pool``, the handshake offers the connection for reuse, and it goes back to the pool if
    the caller released it (TRN-028)."""
    connection = None if pool is None else pool.take(address.address)
    if connection is None:
        connection = FramedConnection(await open_stream(address.address), budget=budget)
    connection.before_send = _ACK_FIRST.get()  # the ACK leaves just ahead of the stream
    kept = False
    try:
        reuse = ',"reuse":true' if pool is not None else ""
        handshake = (  # what encode_json gives for the map, without building it
            f'{{"subject":{_json(address.subject)},"stream_type":"{stream_type}"{reuse}}}'
        )
        introduction = TwoPart(header=handshake.encode()).encode() + then
        if hold:
            connection.hold(introduction)
        else:
            await connection.send(introduction)
        yield connection
        kept = connection.released
    finally:
        connection.release()
        if kept and pool is not None:
            pool.put(address.address, connection)
        elif not connection.close_now():
            with trio.CancelScope(shield=True):
                await connection.aclose()


async def _read_inputs(
    connection: FramedConnection, codec: PayloadCodec
) -> AsyncGenerator[object, None]:
    """A bidirectional request's items as Dynamo 1.6.1 frames them (TRN-047): each frame's
    body is one item in the request's codec, until the header-only ``"sentinel"``."""
    while True:
        try:
            frame = await connection.read_two_part()
        except OverBudget as error:  # TRN-026
            raise RoutingError(ErrorKind.WORKER_OVERLOADED, f"request stream: {error}") from None
        except (WireProtocolError, *CONNECTION_ERRORS):
            frame = None
        if frame is None:
            raise RoutingError(ErrorKind.DISCONNECTED, "request stream ended before its sentinel")
        if frame.header == SENTINEL:
            return
        if frame.header:  # TRN-040: a word the worker does not know is ignored
            continue
        try:
            item = codec.decode(frame.body, "request_stream.frame")
        except WireProtocolError as error:
            raise RoutingError(ErrorKind.INVALID_ARGUMENT, f"request stream: {error}") from None
        yield item


async def _await_release(connection: FramedConnection, pool: ResponsePool) -> None:
    """After the sentinel, the caller's ``reuse``, if it comes soon (TRN-028): then, and only
    then, the connection is marked released (nothing follows it until the next stream). The
    pool's sweep closes the connection if it does not come within ``RELEASE_WAIT`` (one
    timer for all streams rather than a cancel scope for each)."""
    pool.awaiting_release(connection)
    if not connection.buffered:
        connection.expect_a_wait()  # the caller has not read the sentinel yet
    try:
        frame = await connection.read_two_part(MAX_CONTROL_BYTES)
        connection.released = frame is not None and _releases(frame, connection)
    except (WireProtocolError, OverBudget, *CONNECTION_ERRORS):
        pass
    finally:
        pool.release_ended(connection)


# TRN-040: a word the watch does not know, or a body (None here), is ignored; a header that
# is not JSON fails to decode, which ends the stream as a kill does.
def _control_word(frame: TwoPart) -> object:
    """The control word a caller's frame carries (None for a frame without a header)."""
    if frame.header == REUSE_FRAME_HEADER:  # the usual one: no decoding
        return REUSE
    return decode_json(frame.header, "control") if frame.header else None


def _releases(frame: TwoPart, connection: FramedConnection) -> bool:
    """The caller's release (TRN-028): a header-only ``reuse``, with nothing after it."""
    return not frame.body and _control_word(frame) == REUSE and not connection.buffered


class _Watcher:
    """While a stream's producer waits (for its handler or the socket), reads the caller's
    control words: a ``stop`` or ``kill``, or the caller going away, cancels the stream.
    A ``reuse`` it reads is no release (TRN-028): the watch ends, without a checkpoint, as
    soon as the sentinel is written, so the caller sent it before it could have read the
    sentinel; ``_await_release`` reads the release that follows the sentinel. Started the
    first time the producer is about to wait (a stream whose items are all ready needs
    none), in the server's nursery; ``ended`` stops it before anything else reads the
    connection."""

    def __init__(
        self, connection: FramedConnection, nursery: trio.Nursery | None, stream: trio.CancelScope
    ) -> None:
        self._connection = connection
        self._nursery = nursery
        self._stream = stream
        self._scope: trio.CancelScope | None = None
        self._done = trio.Event()
        self.stopped = False  # the caller stopped the stream

    @property
    def started(self) -> bool:
        return self._scope is not None

    def start(self) -> None:
        if self._scope is None and self._nursery is not None:
            self._scope = trio.CancelScope()
            # _guarded: whatever goes wrong here ends this watch only (TRN-023)
            self._nursery.start_soon(_guarded, self._connection.peer, self._watch, self._scope)

    async def ended(self) -> None:
        """Stop watching (once ``started``), and wait until the watch has let go of the
        connection."""
        assert self._scope is not None
        self._scope.cancel()
        await self._done.wait()

    def _stop(self) -> None:
        self.stopped = True
        self._stream.cancel()

    async def _watch(self, scope: trio.CancelScope) -> None:
        connection = self._connection
        try:
            with scope:
                while (frame := await connection.read_two_part(MAX_CONTROL_BYTES)) is not None:
                    if _control_word(frame) in (STOP, KILL):
                        break
                self._stop()
        except (WireProtocolError, OverBudget, *CONNECTION_ERRORS):
            self._stop()
        finally:
            self._done.set()
