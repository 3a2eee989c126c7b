# Does any request field of KvRouter.generate_from_request carry a session id (1.6.1)?
import asyncio, json, sys, threading, time, os
from routespec.adapters.dynamo_frontend.deployment import Deployment, dynamo_environment
d = Deployment()
os.environ.update(dynamo_environment(d.store, None))
ws = d.spare_workers(2)
ep = "kvp7.backend.generate"
for w in ws:
    w.send({"op": "serve", "endpoint": ep, "model": "kvp7", "block_size": 2, "router": None})
time.sleep(1.5)
seen = {}
for w in ws:
    def rep(wp, m, w=w):
        if m.get("op") == "delivered": seen[tuple(m["payload"]["token_ids"])] = w.instance_id
    w.attach(1, threading.Condition(), rep)
CANDIDATES = {
    "none": {},
    "routing.session_id": {"routing": {"session_id": "S"}},
    "agent_context.session_id": {"agent_context": {"session_id": "S"}},
    "top-level session_id": {"session_id": "S"},
    "nvext.session_id": {"nvext": {"session_id": "S"}},
    "annotations session_id:S": {"annotations": ["session_id:S"]},
}
async def main():
    from dynamo.runtime import DistributedRuntime
    from dynamo.llm import KvRouter, KvRouterConfig
    rt = DistributedRuntime(asyncio.get_running_loop(), "file", "tcp")
    base = 100
    for name, extra in CANDIDATES.items():
        r = KvRouter(rt.endpoint(ep), 2, KvRouterConfig(use_kv_events=False), session_affinity_ttl_secs=60)
        await asyncio.sleep(0.8)
        picks = []
        for k in range(8):
            base += 1
            toks = [base, base]
            req = {"model": "kvp7", "token_ids": toks, "stop_conditions": {"max_tokens": 1},
                   "sampling_options": {}, "output_options": {}, "eos_token_ids": [], **extra}
            async for _ in await r.generate_from_request(req): pass
            await asyncio.sleep(0.05)
            picks.append(seen.get(tuple(toks)))
        print(f"{name:28s} distinct workers over 8 fresh prompts: {len(set(picks))}")
    rt.shutdown()
asyncio.run(main())
for w in ws: w.close()
d.close()
