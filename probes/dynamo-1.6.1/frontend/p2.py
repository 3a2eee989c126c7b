from probe_common import *
from routespec.adapters.dynamo_frontend.http_client import metrics
t, ws, host = setup()
inst = {t.workers[w].instance_id: w for w in ws}
fe = t._frontend(0)
def q(tokens, model=None):
    st, data = raw(fe, {"model": model or host.generation.model, "prompt": list(tokens), "max_tokens": 1, "stream": False, "nvext": {"annotations": ["query_instance_id:"]}})
    if st != 200: return (st, data[:200])
    d = json.loads(data)["nvext"]["worker_id"]
    return inst.get(d["decode_worker_id"], d)
print("ties", [q([5,6,7,8]) for _ in range(20)])
r = host.route(HostRoute(tokens=(1,2,3,4,5,6), backend_instance_id=ws[0]))
print("after pin on", ws[0], [q([1,2,3,4,5,6]) for _ in range(10)])
# stall a request on w2 and watch metrics
for w in ws: t.script_worker(w, Stall(0))
r2 = host.route(HostRoute(tokens=(9,9,9,9,9,9,9,9), backend_instance_id=ws[1], max_tokens=3))
print("held", [d.worker_id for d in t.log if d.request_id==r2], t.outcome(r2))
for i in range(6):
    s = metrics(fe.host, fe.port)
    print(i, {(n, dict(l).get("worker_id")): v for (n,l),v in s.items() if "worker_active" in n or "active_requests" in n or "worker_load" in n})
    time.sleep(0.5)
print("during hold", [q([1,2,3,4,5,6]) for _ in range(10)])
for w in ws: t.release_stalled(w)
print(t.outcome(r2))
s = metrics(fe.host, fe.port)
print({(n, dict(l).get("worker_id")): v for (n,l),v in s.items() if "worker_active" in n})
# round robin host query
h2 = t.open_host(HostConfig(policy="round-robin"))
for w in ws: t.script_worker(w, Serve())
st, data = raw(fe, {"model": h2.generation.model, "prompt": [1,2], "max_tokens": 1, "stream": False, "nvext": {"annotations": ["query_instance_id:"]}})
print("rr query", st, data[:400])
print("log", [(d.request_id, d.worker_id) for d in t.log])
