"""A real Dynamo 1.6.1 worker: ``python dynamo_worker.py ns.comp.endpoint LABEL``.

Prints ``{"instance_id": N}`` once its runtime exists, then serves until killed. The handler
yields ``request["n"]`` items ``{"worker": LABEL, "i": i}`` and then, when ``request["fail"]``
names one, raises that failure (see ``FAILURES``).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Callable

from dynamo._core import Cancelled, EngineShutdown, InvalidArgument
from dynamo.runtime import DistributedRuntime

FAILURES: dict[str, Callable[[str], Exception]] = {
    "engine_shutdown": EngineShutdown,
    "invalid_argument": InvalidArgument,
    "cancelled": Cancelled,
    "value_error": ValueError,
    "runtime_error": RuntimeError,
}


def make_handler(label: str) -> Callable[[object, object], AsyncIterator[object]]:
    async def generate(request: object, context: object) -> AsyncIterator[object]:
        fields = request if isinstance(request, dict) else {}
        for i in range(int(fields.get("n", 0))):
            yield {"worker": label, "i": i}
        fail = fields.get("fail")
        if isinstance(fail, str):
            raise FAILURES[fail](f"{fail} from {label}")

    return generate


async def main(endpoint_path: str, label: str) -> None:
    runtime = DistributedRuntime(asyncio.get_running_loop(), "file", "tcp")
    endpoint = runtime.endpoint(endpoint_path)
    print(json.dumps({"instance_id": endpoint.connection_id()}), flush=True)
    await endpoint.serve_endpoint(make_handler(label))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
