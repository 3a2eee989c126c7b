from routespec.adapters.dynamo_kv import ADAPTER
from routespec.testing.target import TargetConfig, HostConfig, HostRoute
with ADAPTER.open(TargetConfig()) as t:
    t.add_worker()
    h = t.open_host(HostConfig(policy="kv", block_size=2))
    h.route(HostRoute(tokens=(1,2), max_tokens=1))
    print("\n".join(l for l in t.router.metrics().splitlines() if "requests_started_total" in l or "router_requests_total" in l))
