import asyncio, json, sys, threading, time, os, urllib.request
sys.path.insert(0, ".")  # run from the checkout root
from routespec.adapters.dynamo_frontend.deployment import Deployment, dynamo_environment, free_port
d = Deployment()
os.environ.update(dynamo_environment(d.store, None))
import socket, random
while True:
    port = random.randint(20000, 32000)
    with socket.socket() as p:
        try: p.bind(("127.0.0.1", port)); break
        except OSError: pass
os.environ["DYN_SYSTEM_PORT"] = str(port); os.environ["DYN_SYSTEM_ENABLED"] = "true"
ws = d.spare_workers(2)
ep = "kvp2.backend.generate"
for w in ws:
    w.send({"op": "serve", "endpoint": ep, "model": "kvp2", "block_size": 2, "router": None})
time.sleep(1.5)
a, b = [w.instance_id for w in ws]
async def main():
    from dynamo.runtime import DistributedRuntime
    from dynamo.llm import KvRouter, KvRouterConfig
    rt = DistributedRuntime(asyncio.get_running_loop(), "file", "tcp")
    endpoint = rt.endpoint(ep)
    for bs in (0,):
        try:
            KvRouter(endpoint, bs, KvRouterConfig(use_kv_events=False)); print("block", bs, "accepted")
        except Exception as e: print("block", bs, type(e).__name__, e)
    try:
        c = KvRouterConfig(use_kv_events=False, router_temperature=-0.5); print("temp -0.5 config accepted")
        KvRouter(endpoint, 2, c); print("temp -0.5 router accepted")
    except Exception as e: print("temp", type(e).__name__, e)
    r = KvRouter(endpoint, 2, KvRouterConfig(use_kv_events=False, router_temperature=0.0))
    await asyncio.sleep(1.0)
    picks = [(await r.best_worker([5,6,7,8]))[0] for _ in range(40)]
    print("ties", picks.count(a), picks.count(b))
    s = await r.generate([1,2,3,4], "kvp2", stop_conditions={"max_tokens": 1}, worker_id=b)
    async for it in s: pass
    await asyncio.sleep(0.2)
    print("after pin to b, best", [(await r.best_worker([1,2,3,4,5,6]))[0]==b for _ in range(5)])
    r1 = KvRouter(endpoint, 2, KvRouterConfig(use_kv_events=False, router_temperature=1.0))
    await asyncio.sleep(0.5)
    picks = [(await r1.best_worker([5,6,7,8]))[0] for _ in range(40)]
    print("temp1 fresh ties", picks.count(a), picks.count(b))
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=3).read().decode()
        print(sorted({l.split("{")[0].split(" ")[0] for l in body.splitlines() if not l.startswith("#")}))
    except Exception as e: print("metrics", e)
    rt.shutdown()
asyncio.run(main())
for w in ws: w.close()
d.close()
