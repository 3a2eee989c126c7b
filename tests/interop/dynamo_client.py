"""A real Dynamo 1.6.1 client: ``python dynamo_client.py ns.comp.endpoint COUNT PLAN_JSON``.

It waits until it discovers COUNT instances, prints ``{"instance_ids": [...]}``, then runs
the plan.

The plan is a list of calls ``{"tag", "mode": "round_robin" | "direct", "instance_id"?: N,
"request": {...}}``. For each call it prints one JSON line: the call, the items received (raw
payloads) and, if the call or the stream raised, the exception's class and text.
"""

from __future__ import annotations

import asyncio
import json
import sys

from dynamo.runtime import Client, DistributedRuntime

READY_TIMEOUT = 20.0


async def run_call(client: Client, call: dict[str, object]) -> dict[str, object]:
    items: list[object] = []
    outcome: dict[str, object] = {"call": call, "items": items, "error": None}
    request = call["request"]
    try:
        if call["mode"] == "round_robin":
            stream = await client.round_robin(request, annotated=False)
        else:
            instance_id = call["instance_id"]
            assert isinstance(instance_id, int)
            stream = await client.direct(request, instance_id, annotated=False)
        async for item in stream:
            items.append(item)
    except Exception as error:
        kind = type(error)
        outcome["error"] = {"class": f"{kind.__module__}.{kind.__qualname__}", "text": str(error)}
    return outcome


async def wait_for(client: Client, count: int) -> list[int]:
    await client.wait_for_instances()
    while len(client.instance_ids()) < count:  # noqa: ASYNC110 - polls discovery, no event
        await asyncio.sleep(0.05)
    return [int(instance_id) for instance_id in client.instance_ids()]


async def main(endpoint_path: str, count: int, plan: list[dict[str, object]]) -> None:
    runtime = DistributedRuntime(asyncio.get_running_loop(), "file", "tcp")
    client = await runtime.endpoint(endpoint_path).client()
    ids = await asyncio.wait_for(wait_for(client, count), READY_TIMEOUT)
    print(json.dumps({"instance_ids": sorted(ids)}), flush=True)
    for call in plan:
        print(json.dumps(await run_call(client, call)), flush=True)
    runtime.shutdown()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])))
