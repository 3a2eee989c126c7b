from probe_common import *
from routespec.adapters.dynamo_frontend.http_client import metrics
t, ws, host = setup(2, HostConfig(policy="kv", block_size=16))
fe = t._frontend(0)
for w in ws: t.script_worker(w, Stall(0))
r = host.route(HostRoute(tokens=(1,), max_tokens=1))
r2 = host.route(HostRoute(tokens=(1,), max_tokens=1))
print("held", [d.worker_id for d in t.log])
s = metrics(fe.host, fe.port)
print({(n, dict(l).get("worker_id")): v for (n,l),v in s.items() if "worker_active" in n})
for w in ws: t.release_stalled(w)
time.sleep(0.3)
s = metrics(fe.host, fe.port)
print("after", {(n, dict(l).get("worker_id")): v for (n,l),v in s.items() if "worker_active" in n})
