# Probe: how long does Dynamo 1.6.1 keep a worker out of round-robin after EngineShutdown?
import asyncio, time
from dynamo.runtime import DistributedRuntime

async def call(client, req):
    try:
        return [x async for x in await client.round_robin(req, annotated=False)]
    except Exception as e:
        return repr(e)[:80]

async def main():
    rt = DistributedRuntime(asyncio.get_running_loop(), "file", "tcp")
    client = await rt.endpoint("flt.comp.generate").client()
    await asyncio.wait_for(client.wait_for_instances(), 20)
    while len(client.instance_ids()) < 2:
        await asyncio.sleep(0.2)
    ids = sorted(client.instance_ids())
    victim = ids[0]
    t_start = time.monotonic()
    for trial, delay in enumerate([0.0, 1.3, 2.6, 3.9, 0.7, 3.1]):
        await asyncio.sleep(6.0 + delay)   # clean state, then a varying offset
        # fail the victim: round-robin until the victim gets the failing request
        for _ in range(4):
            r = await call(client, {"fail": victim})
            if isinstance(r, str):
                break
        t_fail = time.monotonic()
        back = None
        while time.monotonic() - t_fail < 8:
            r = await call(client, {"fail": -1})
            if isinstance(r, list) and r and r[0].get("worker") == victim:
                back = time.monotonic() - t_fail
                break
            await asyncio.sleep(0.05)
        print(f"trial {trial}: failed at +{t_fail - t_start:6.2f} s, error={r if not isinstance(r, list) else 'served'}; victim routable again after {back if back is None else round(back, 2)} s", flush=True)
    rt.shutdown()

asyncio.run(main())
