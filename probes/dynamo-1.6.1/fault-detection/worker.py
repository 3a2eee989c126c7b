# Probe worker: fails with EngineShutdown when the request says so, else serves one item.
import asyncio, sys
from dynamo.runtime import DistributedRuntime
from dynamo._core import EngineShutdown

async def main():
    rt = DistributedRuntime(asyncio.get_running_loop(), "file", "tcp")
    ep = rt.endpoint("flt.comp.generate")
    me = {}
    async def generate(request, context):
        if request.get("fail") == me.get("id"):
            raise EngineShutdown("probe failure")
        yield {"worker": me.get("id")}
    me["id"] = ep.connection_id()
    print("ID", me["id"], flush=True)
    await ep.serve_endpoint(generate)

asyncio.run(main())
