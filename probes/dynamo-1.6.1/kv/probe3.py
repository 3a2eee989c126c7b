from routespec.adapters.dynamo_kv import ADAPTER
from routespec.testing.target import TargetConfig, HostConfig, HostRoute, Serve
with ADAPTER.open(TargetConfig()) as t:
    a = t.add_worker(); b = t.add_worker()
    h = t.open_host(HostConfig(policy="kv", block_size=2))
    r = h.route(HostRoute(tokens=(1,2,3,4), max_tokens=2))
    print(t.outcome(r))
    p = h.plan(h.preview(HostRoute(tokens=(5,6))).plan_id); print(p, h.bookings())
    text = t.router.metrics()
    print("\n".join(l for l in text.splitlines() if "requests" in l and not l.startswith("#") and h.name in l))
    print(h.counters())
