import asyncio, json, sys, threading, time
sys.path.insert(0, ".")  # run from the checkout root
from routespec.adapters.dynamo_frontend.deployment import Deployment, dynamo_environment
import os
d = Deployment()
os.environ.update(dynamo_environment(d.store, None))
ws = d.spare_workers(2)
print("workers", [w.instance_id for w in ws])
ep = "kvp1.backend.generate"
for w in ws:
    w.send({"op": "serve", "endpoint": ep, "model": "kvp1", "block_size": 2, "router": None})
time.sleep(1.5)
print("served", [w.served for w in ws])
logs = []
for w in ws:
    def rep(wp, m, w=w): print("  W", w.instance_id, json.dumps(m)[:300])
    w.attach(1, threading.Condition(), rep)

async def main():
    from dynamo.runtime import DistributedRuntime
    from dynamo.llm import KvRouter, KvRouterConfig
    rt = DistributedRuntime(asyncio.get_running_loop(), "file", "tcp")
    endpoint = rt.endpoint(ep)
    r = KvRouter(endpoint, 2, KvRouterConfig(use_kv_events=False, router_temperature=0.0))
    await asyncio.sleep(1.0)
    print("best q", await r.best_worker([1,2,3,4]))
    print("loads", await r.get_potential_loads([1,2,3,4]))
    s = await r.generate([1,2,3,4], "kvp1", stop_conditions={"max_tokens": 2})
    async for it in s: print(" item", it)
    await asyncio.sleep(0.3)
    print("best q after", [await r.best_worker([1,2,3,4]) for _ in range(3)])
    print("overlap", await r.get_overlap_scores([1,2,3,4]))
    print("loads", await r.get_potential_loads([1,2,3,4]))
    print("book", await r.best_worker([5,6,7,8], request_id="b1"))
    print("loads", await r.get_potential_loads([1,2,3,4]))
    await r.mark_prefill_complete("b1")
    print("loads mpc", await r.get_potential_loads([1,2,3,4]))
    await r.free("b1")
    print("loads freed", await r.get_potential_loads([1,2,3,4]))
    try:
        await r.free("b1"); print("second free ok")
    except Exception as e: print("second free", type(e), e)
    try:
        s = await r.generate([1,2], "kvp1", stop_conditions={"max_tokens": 1}, worker_id=12345)
        async for it in s: print(" item", it)
    except Exception as e: print("unknown pin", type(e), e)
    # generate_from_request with annotations
    s = await r.generate_from_request({"token_ids":[9,9], "model":"kvp1", "stop_conditions":{"max_tokens":1}, "sampling_options":{}, "output_options":{}, "eos_token_ids":[], "annotations":["rs:req-7"], "id": "myid-7", "request_id":"myid-7"})
    async for it in s: print(" item", it)
    rt.shutdown()
asyncio.run(main())
for w in ws: w.close()
d.close()
