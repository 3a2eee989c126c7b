"""Probe: a worker's record is removed from the file store; the Dynamo 1.6.1 client is asked
(direct) for it every 10 ms: does a 'tombstoned' refusal ever show, while still listed?"""
import asyncio, os, tempfile, time
from pathlib import Path
from routespec.adapters.dynamo_wire import DynamoWireTarget

with tempfile.TemporaryDirectory() as store:
    t = DynamoWireTarget(Path(store))
    try:
        w = t.add_worker()
        iid = t.instance_id(w)
        os.environ.update(DYN_FILE_KV=store, DYN_TCP_RPC_HOST="127.0.0.1", DYN_TCP_RESPONSE_STREAM_HOST="127.0.0.1", DYN_LOG="error")
        from dynamo.runtime import DistributedRuntime
        async def main():
            rt = DistributedRuntime(asyncio.get_running_loop(), "file", "tcp")
            c = await rt.endpoint("routespec.conformance.generate").client()
            await asyncio.wait_for(c.wait_for_instances(), 15)
            async def call():
                try:
                    return f"items={[x async for x in await c.direct({'rid': 'p'}, iid, annotated=False)]}"
                except Exception as e:
                    return f"{type(e).__qualname__}: {e}"
            print("before:", await call())
            t._portal.call_sync(t._workers[w].registration.deregister)
            t0 = time.monotonic(); seen = []
            while time.monotonic() - t0 < 5:
                listed = iid in c.instance_ids()
                r = await call()
                if not seen or seen[-1][1:] != (listed, r):
                    seen.append((round(time.monotonic() - t0, 3), listed, r))
                await asyncio.sleep(0.01)
            for s in seen: print(f"  t={s[0]} s listed={s[1]} -> {s[2]}")
            rt.shutdown()
        asyncio.run(main())
    finally:
        t.close()
