"""Probe: what the Python exception of a Dynamo 1.6.1 client carries for an error item whose
chain is EngineShutdown <- Disconnected (sent by a reference worker on Dynamo's wire)."""
import asyncio, os, tempfile
from pathlib import Path
from routespec.adapters.dynamo_wire import DynamoWireTarget
from routespec.conformance.scenario import spec_of
from routespec.testing.target import FailMidStream

with tempfile.TemporaryDirectory() as store:
    t = DynamoWireTarget(Path(store))
    try:
        w = t.add_worker()
        t.script_worker(w, FailMidStream(1, spec_of(("Backend(EngineShutdown)", "Disconnected"))))
        os.environ.update(DYN_FILE_KV=store, DYN_TCP_RPC_HOST="127.0.0.1", DYN_TCP_RESPONSE_STREAM_HOST="127.0.0.1", DYN_LOG="error")
        from dynamo.runtime import DistributedRuntime
        async def main():
            rt = DistributedRuntime(asyncio.get_running_loop(), "file", "tcp")
            c = await rt.endpoint("routespec.conformance.generate").client()
            await asyncio.wait_for(c.wait_for_instances(), 15)
            for annotated in (False, True):
                items = []
                try:
                    async for x in await c.direct({"rid": "p"}, t.instance_id(w), annotated=annotated):
                        items.append(x)
                except Exception as e:
                    print(f"annotated={annotated}: items={items}")
                    print(f"  raised {type(e).__module__}.{type(e).__qualname__} args={e.args!r}")
                    print(f"  __cause__={e.__cause__!r} __context__={e.__context__!r} attrs={[a for a in dir(e) if not a.startswith('__')]}")
                else:
                    print(f"annotated={annotated}: no exception; items={items}")
            rt.shutdown()
        asyncio.run(main())
    finally:
        t.close()
