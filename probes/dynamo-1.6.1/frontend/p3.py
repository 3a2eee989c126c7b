from probe_common import *
from routespec.adapters.dynamo_frontend.http_client import get
t, ws, host = setup()
fe = t._frontend(0)
for w in ws: t.script_worker(w, Stall(0))
r2 = host.route(HostRoute(tokens=(9,9,9,9), backend_instance_id=ws[1], max_tokens=3))
r3 = host.route(HostRoute(tokens=(9,9,9,9,9,9), backend_instance_id=ws[1], max_tokens=3))
st, body = get(fe.host, fe.port, "/metrics")
names = {}
for line in body.decode().splitlines():
    if line.startswith("#"): continue
    n = line.split("{")[0].split(" ")[0]
    if ("active" in n or "request" in n or "inflight" in n or "load" in n or "busy" in n) and "bucket" not in n: names.setdefault(n, []).append(line[:200])
for n, ls in names.items(): print(n, len(ls)); [print("   ", l) for l in ls[:4]]
for w in ws: t.release_stalled(w)
