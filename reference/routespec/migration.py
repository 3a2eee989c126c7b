"""Migration: retry typed failures on another worker and deliver one clean stream (spec: MIG).

A request is a token request when its payload is a map with ``token_ids`` (the prompt) and
optionally ``max_tokens``, ``min_tokens``, ``n`` and ``guided_decoding``; each response item
carries the ``token_ids`` it generated and may carry a ``finish_reason``. Mid-stream
migration needs that shape (delivered tokens are appended to the prompt); failures before
the stream are retried for any request.
"""

from __future__ import annotations

import collections
from collections.abc import Awaitable, Callable, Mapping

import attrs

from routespec.errors import (
    BackendKind,
    ErrorKind,
    ErrorType,
    RoutingError,
    is_migration_sensitive,
    match_error_chain,
)
from routespec.routing.exclusions import Exclusions
from routespec.routing.push_router import Prepare, PushRouter
from routespec.routing.selection import RouterMode
from routespec.routing.streaming import Annotated, ItemStream, Request

MIGRATABLE_TYPES: frozenset[ErrorType] = frozenset(
    {
        ErrorKind.CANNOT_CONNECT,
        ErrorKind.DISCONNECTED,
        ErrorKind.CONNECTION_TIMEOUT,  # a deadline's expiry moves the request on (TMO-007)
        ErrorKind.RESPONSE_TIMEOUT,
        ErrorKind.WORKER_OVERLOADED,
        ErrorKind.WORKER_UNAVAILABLE,
        BackendKind.CANNOT_CONNECT,
        BackendKind.DISCONNECTED,
        BackendKind.CONNECTION_TIMEOUT,
        BackendKind.RESPONSE_TIMEOUT,
        BackendKind.ENGINE_SHUTDOWN,
        BackendKind.STREAM_INCOMPLETE,
    }
)
CANCELLED_FINISH = "cancelled"

Attempt = Callable[[Request, Exclusions], Awaitable[ItemStream]]


def is_migratable(error: BaseException) -> bool:
    """A migratable type on some link and no blocking link, by type or by reason (MIG-001,
    MIG-002, MIG-003, MIG-016): the transport's sensitive test is the same (MIG-015)."""
    return not is_migration_sensitive(error) and match_error_chain(error, MIGRATABLE_TYPES)


def migration_permitted(payload: object) -> bool:
    """Migration is off for n > 1 and for guided decoding (MIG-005)."""
    if not isinstance(payload, Mapping):
        return True
    return payload.get("n", 1) in (None, 1) and not payload.get("guided_decoding", False)


def prompt_tokens(payload: object) -> list[object] | None:
    """A token request's prompt, its payload's ``token_ids`` list; None for any other
    request, which migrates only before its stream (MIG-008) and has no length (MIG-005)."""
    tokens = payload.get("token_ids") if isinstance(payload, Mapping) else None
    return tokens if isinstance(tokens, list) else None


def continued(payload: Mapping[str, object], delivered: list[int]) -> dict[str, object]:
    """The token request a replacement worker gets: delivered tokens join the prompt and the
    token budgets shrink by as many, never below zero (MIG-009)."""
    prompt = prompt_tokens(payload)
    assert prompt is not None, "only a token request continues mid-stream"
    follow_up = dict(payload)
    follow_up["token_ids"] = [*prompt, *delivered]
    for budget in ("max_tokens", "min_tokens"):
        value = payload.get(budget)
        if isinstance(value, int):
            follow_up[budget] = max(0, value - len(delivered))
    return follow_up


@attrs.define
class Migration:
    """Wraps a ``PushRouter``: up to ``limit`` retries per request on other workers."""

    router: PushRouter
    limit: int
    max_seq_len: int | None = None

    def is_migratable(self, failure: RoutingError) -> bool:
        return is_migratable(failure)

    def continued(self, payload: Mapping[str, object], delivered: list[int]) -> dict[str, object]:
        """The payload of a replacement attempt after ``delivered`` tokens (MIG-009)."""
        return continued(payload, delivered)

    async def generate(
        self,
        request: Request,
        mode: RouterMode = RouterMode.ROUND_ROBIN,
        *,
        pin: int | None = None,
        prepare: Prepare | None = None,
        is_stopped: Callable[[], bool] = lambda: False,
    ) -> MigratingStream:
        """``pin`` is an explicit worker for the request's phase: it blocks migration
        (MIG-011). ``is_stopped`` reports the caller's context (MIG-006)."""
        router = self.router

        async def attempt(request: Request, exclusions: Exclusions) -> ItemStream:
            if pin is not None:
                return await router.direct(request, pin, prepare)
            return await router.generate(request, mode, prepare, exclusions)

        return await self.stream(request, attempt, pinned=pin is not None, is_stopped=is_stopped)

    async def stream(
        self,
        request: Request,
        attempt: Attempt,
        *,
        pinned: bool,
        is_stopped: Callable[[], bool],
    ) -> MigratingStream:
        """Migrate ``request`` over any dispatcher: ``attempt`` sends it once, never to a
        worker in the exclusions it is given, and records a failed worker there."""
        attempts = self.limit + 1  # Python integers: no overflow at any limit (MIG-004)
        if pinned or not migration_permitted(request.payload):
            attempts = 1
        stream = MigratingStream(self, request, attempt, is_stopped, attempts)
        await stream.open()
        return stream


class MigratingStream:
    """The client's single stream over one or more attempts."""

    def __init__(
        self,
        migration: Migration,
        request: Request,
        attempt: Attempt,
        is_stopped: Callable[[], bool],
        attempts: int,
    ) -> None:
        self._migration = migration
        self._original = request
        self._request = request
        self._send = attempt
        self._is_stopped = is_stopped
        self._attempts_left = attempts
        self._exclusions = Exclusions()
        self._delivered: list[int] = []
        self._ready: collections.deque[Annotated] = collections.deque()
        self._held: Annotated | None = None
        self._stream: ItemStream | None = None
        self._done = False

    async def open(self) -> None:
        self._stream = await self._attempt()

    async def _attempt(self) -> ItemStream:
        """Dispatch until a stream exists, a failure may not migrate, or attempts run out."""
        while True:
            if self._is_stopped():
                raise RoutingError(ErrorKind.CANCELLED, "request stopped before a new attempt")
            self._attempts_left -= 1
            try:  # a fresh attempt under the same request id (MIG-007)
                return await self._send(self._request, self._exclusions)
            except RoutingError as failure:
                if not self._may_retry(failure):
                    raise

    def _may_retry(self, failure: RoutingError) -> bool:
        if self._attempts_left <= 0 or not self._migration.is_migratable(failure):
            return False
        limit = self._migration.max_seq_len
        prompt = prompt_tokens(self._original.payload)
        # MIG-005: only a token request has a length to bound
        return limit is None or prompt is None or len(prompt) + len(self._delivered) <= limit

    def _resumable(self) -> bool:
        """Mid-stream migration needs a token request, to continue where it stopped."""
        return prompt_tokens(self._original.payload) is not None

    def __aiter__(self) -> MigratingStream:
        return self

    async def __anext__(self) -> Annotated:
        while not self._ready:
            if self._done or self._stream is None:
                raise StopAsyncIteration
            await self._pull()
        return self._ready.popleft()

    async def _pull(self) -> None:
        """Read one item of the current attempt and decide what the client sees."""
        assert self._stream is not None
        try:
            item = await self._stream.__anext__()
        except StopAsyncIteration:
            self._release_held()
            self._done = True
            return
        if item.error is None:
            if _finish_reason(item) == CANCELLED_FINISH and self._resumable():
                self._held = item  # a terminal frame: shown only if no migration follows
                return
            self._release_held()
            self._delivered.extend(_tokens(item))
            self._ready.append(item)
            return
        if self._resumable() and self._may_retry(item.error):
            self._held = None  # MIG-013: the aborted attempt's terminal frame is dropped
            await self._stream.aclose()  # its booking and inflight slot end here (MIG-014)
            payload = self._original.payload
            assert isinstance(payload, Mapping)
            self._request = attrs.evolve(
                self._original, payload=self._migration.continued(payload, self._delivered)
            )
            try:
                self._stream = await self._attempt()
                return
            except RoutingError:
                self._stream = None  # MIG-008: no replacement, the original error stands
        self._release_held()
        self._ready.append(item)
        self._done = True

    def _release_held(self) -> None:
        if self._held is not None:
            self._ready.append(self._held)
            self._held = None

    async def aclose(self) -> None:
        self._done = True
        if self._stream is not None:
            await self._stream.aclose()


def _finish_reason(item: Annotated) -> object:
    return item.data.get("finish_reason") if isinstance(item.data, Mapping) else None


def _tokens(item: Annotated) -> list[int]:
    data = item.data
    tokens = data.get("token_ids") if isinstance(data, Mapping) else None
    return [t for t in tokens if isinstance(t, int)] if isinstance(tokens, list) else []
