"""An example handler for ``routespec worker --handler routespec.deploy.demo:tokens``."""

from __future__ import annotations

from collections.abc import AsyncIterator

import trio

from routespec.errors import ErrorKind, RoutingError


async def tokens(request: object) -> AsyncIterator[dict[str, object]]:
    """A stand-in for an LLM engine: yields the token ids that continue the prompt.

    Request: ``{"token_ids": [...prompt...], "max_tokens": N, "delay": seconds per token}``.
    Item k is ``{"token_ids": [len(prompt) + k]}``, the next position. A migrated stream's
    prompt ends with the tokens already delivered, so the replacement worker continues where
    the first one stopped, and a duplicated or lost token would show in the sequence.
    """
    fields = request if isinstance(request, dict) else {}
    prompt, max_tokens, delay = (
        fields.get("token_ids", []),
        fields.get("max_tokens", 16),
        fields.get("delay", 0.0),
    )
    if not isinstance(prompt, list):
        raise RoutingError(ErrorKind.INVALID_ARGUMENT, "token_ids must be a list of integers")
    if not isinstance(max_tokens, int) or max_tokens < 0:
        raise RoutingError(ErrorKind.INVALID_ARGUMENT, "max_tokens must be an integer >= 0")
    if not isinstance(delay, int | float) or delay < 0:
        raise RoutingError(ErrorKind.INVALID_ARGUMENT, "delay must be a number of seconds >= 0")
    for k in range(max_tokens):
        await trio.sleep(delay)
        item: dict[str, object] = {"token_ids": [len(prompt) + k]}
        if k == max_tokens - 1:
            item["finish_reason"] = "length"
        yield item
