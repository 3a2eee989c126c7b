from probe_common import *
from routespec.adapters.dynamo_frontend.http_client import metrics
import sys
policy = sys.argv[1]
t, ws, host = setup(3, HostConfig(policy=policy))
# a generation with a busy threshold
gen = t.generation({"policy": policy, "temperature": 0.0, "busy_prefill_tokens": 1000}, 16, False)
from routespec.adapters.dynamo_frontend.target import FrontendHost
h = FrontendHost(t, HostConfig(policy=policy), gen)
a, b, c = ws
t.script_worker(a, Stall(0))
r = h.route(HostRoute(tokens=tuple(range(2000)), backend_instance_id=a, max_tokens=1))
print("hold", [d.worker_id for d in t.log if d.request_id == r], t.outcome(r))
t.script_worker(a, Serve())
fe = t._frontend(0)
s = metrics(fe.host, fe.port)
print({(n, dict(l).get("worker_id")): v for (n,l),v in s.items() if "worker_active" in n})
picks = []
for i in range(6):
    r = h.route(HostRoute(tokens=(i,))); picks.append((tuple(d.worker_id for d in t.log if d.request_id == r), t.outcome(r).error))
print("unpinned with a busy", picks)
r = h.route(HostRoute(backend_instance_id=a))
print("pin busy", [d.worker_id for d in t.log if d.request_id == r], t.outcome(r))
t.script_worker(b, Stall(0)); t.script_worker(c, Stall(0))
for w in (b, c):
    r = h.route(HostRoute(tokens=tuple(range(2000)), backend_instance_id=w, max_tokens=1))
    print("hold", w, [d.worker_id for d in t.log if d.request_id == r])
t.script_worker(b, Serve()); t.script_worker(c, Serve())
r = h.route(HostRoute())
print("all busy", [d.worker_id for d in t.log if d.request_id == r], t.outcome(r))
for w in ws: t.release_stalled(w)
