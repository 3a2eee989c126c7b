from routespec.adapters.dynamo_kv import ADAPTER
from routespec.testing.target import TargetConfig, HostConfig, HostRoute, Serve
with ADAPTER.open(TargetConfig()) as t:
    a = t.add_worker(); b = t.add_worker()
    for n in range(2):
        h = t.open_host(HostConfig(policy="kv", block_size=2))
        for k in range(n + 1):
            r = h.route(HostRoute(tokens=(1,2,3,4), max_tokens=2))
        text = t.router.metrics()
        print(h.name, "\n".join(l for l in text.splitlines() if "requests" in l and not l.startswith("#")))
