"""A request as the routing host sees it: phase, routing hints and the caller's context."""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable

import attrs

from routespec.routing.streaming import Request


class Phase(enum.Enum):
    AGGREGATED = "aggregated"
    PREFILL = "prefill"
    DECODE = "decode"


@attrs.frozen
class RoutingHints:
    """The request's routing extension (Dynamo's ``nvext`` routing fields)."""

    backend_instance_id: int | None = None
    decode_worker_id: int | None = None
    prefill_worker_id: int | None = None
    dp_rank: int | None = None
    lora_name: str | None = None
    allowed_worker_ids: frozenset[int] | None = None
    required_taints: frozenset[str] = frozenset()

    def explicit_worker(self, phase: Phase) -> tuple[str, int] | None:
        """The field and id naming this phase's explicit worker, by precedence (HST-003)."""
        own = ("prefill_worker_id", self.prefill_worker_id)
        if phase is not Phase.PREFILL:
            own = ("decode_worker_id", self.decode_worker_id)
        for field, worker_id in (own, ("backend_instance_id", self.backend_instance_id)):
            if worker_id is not None:
                return field, worker_id
        return None


@attrs.define(eq=False)
class RequestContext:
    """The caller's side of a request; whatever waits on its behalf hears when it stops."""

    stopped: bool = False
    _listeners: list[Callable[[], None]] = attrs.field(factory=list)

    def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            for listener in list(self._listeners):
                listener()

    def listen(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` when the request stops (at once if it already has)."""
        self._listeners.append(listener)
        if self.stopped:
            listener()

    def unlisten(self, listener: Callable[[], None]) -> None:
        self._listeners.remove(listener)


def _session(session_id: str | None) -> str | None:
    """An empty session id is no session (AFF-004), as Dynamo's frontend reads it."""
    return session_id or None


@attrs.frozen
class HostRequest:
    """``staged_kv``: a decode leg whose remote prefill left KV blocks on its worker."""

    request: Request
    phase: Phase = Phase.AGGREGATED
    hints: RoutingHints = RoutingHints()
    session_id: str | None = attrs.field(default=None, converter=_session)
    staged_kv: bool = False
    context: RequestContext = attrs.field(factory=RequestContext, eq=False)

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def must_reach_worker(self) -> bool:
        """A stopped request still goes out only to release staged KV (HST-013)."""
        return self.phase is Phase.DECODE and self.staged_kv

    def tokens(self) -> list[int]:
        """The prompt's token ids; one list per request, so read it, never change it."""
        return self._tokens

    @functools.cached_property
    def _tokens(self) -> list[int]:
        # O(T) once: selection, admission and recording each read the prompt
        payload = self.request.payload
        tokens = payload.get("token_ids") if isinstance(payload, dict) else None
        if not isinstance(tokens, list):
            return []
        if set(map(type, tokens)) <= {int}:  # the usual prompt: no per-token Python code
            return list(tokens)
        return [t for t in tokens if isinstance(t, int)]
