"""SKIP for what the 1.6.1 ``KvRouter`` API has no surface for."""

from __future__ import annotations

from typing import NoReturn

import pytest


def unreachable(what: str) -> NoReturn:
    """This step has no surface on the 1.6.1 KvRouter: the check is SKIP, with why."""
    pytest.skip(f"dynamo-kv: {what}")


SESSION_PROBE = (
    "probed: 8 fresh prompts per field through generate_from_request, 2 workers, "
    "temperature 0: routing.session_id, agent_context.session_id, session_id, "
    "nvext.session_id and annotations ['session_id:S'] each reached 2 distinct workers, as "
    "with no session field"
)
