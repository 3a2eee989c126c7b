"""``routespec instances``: an endpoint's discovered workers and this router's view of them.

A fresh process has inhibited and overloaded no worker yet, so routable equals discovered
and overloaded is empty unless a long-lived router's state is asked for (it is not kept).
"""

from __future__ import annotations

import argparse

import attrs
import trio

from routespec.deploy.cli.usage import UsageError
from routespec.discovery.instances import Discovery
from routespec.discovery.url import open_store
from routespec.routing.worker_sets import WorkerSets

COLUMNS = ("INSTANCE", "ADDRESS", "DEVICE", "CODEC", "ROUTABLE", "OVERLOADED")


async def list_instances(args: argparse.Namespace) -> int:
    store = open_store(args.discovery, args.ttl)
    await store.check()
    arrivals = Arrivals()
    async with store.watch(args.endpoint, arrivals.added) as discovery:
        with trio.move_on_after(args.timeout) as waiting:  # scripts start workers, then wait
            await arrivals.until(discovery, args.wait)
        if waiting.cancelled_caught:
            found = len(discovery.instance_ids())
            raise UsageError("--wait", f"{found} of {args.wait} discovered after {args.timeout} s")
        sets = WorkerSets(discovery)
        routable, overloaded = set(sets.routable_ids()), set(sets.overloaded_ids())
        rows = [COLUMNS]
        for instance_id in sets.discovered_ids():
            instance = discovery.lookup(instance_id)
            if instance is None:
                continue
            rows.append(
                (
                    f"{instance_id:x}",
                    instance.address,
                    instance.device_type,
                    instance.payload_codec,
                    "yes" if instance_id in routable else "no",
                    "yes" if instance_id in overloaded else "no",
                )
            )
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    for row in rows:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )
    print(
        f"{args.endpoint}: {len(rows) - 1} discovered, {len(routable)} routable, "
        f"{len(overloaded)} overloaded"
    )
    return 0


@attrs.define
class Arrivals:
    """Wakes a waiter each time the watch reports an added instance."""

    event: trio.Event = attrs.field(factory=trio.Event)

    def added(self, _instance_id: int) -> None:
        self.event.set()

    async def until(self, discovery: Discovery, count: int) -> None:
        while len(discovery.instance_ids()) < count:
            self.event = trio.Event()
            await self.event.wait()
