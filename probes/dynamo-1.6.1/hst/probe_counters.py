"""Probe: which /metrics counters of the 1.6.1 frontend move for each kind of request."""
from routespec.adapters.dynamo_frontend import ADAPTER
from routespec.adapters.dynamo_frontend.http_client import metrics
from routespec.testing.target import (TargetConfig, HostConfig, HostRoute, FailBeforeStream,
                                      ErrorSpec, Serve)

def dump(target, host, what):
    model = host.generation.model
    print(f"-- after {what}: counters()={host.counters()}")
    for fe in list(target.frontends_used):
        for (n, ls), v in sorted(metrics(fe.host, fe.port).items()):
            if "requests" in n and ("started" in n or n.endswith("requests_total")):
                d = dict(ls)
                if d.get("model", model) == model or "router" in n:
                    print(f"    {n} {d} {v}")

with ADAPTER.open(TargetConfig()) as target:
    w = target.add_worker()
    host = target.open_host(HostConfig(policy="kv"))
    dump(target, host, "open")
    print(host.preview(HostRoute()))
    dump(target, host, "preview (query_instance_id)")
    print(target.outcome(host.route(HostRoute(backend_instance_id=9999))))
    dump(target, host, "unknown explicit worker")
    print(target.outcome(host.route(HostRoute())))
    dump(target, host, "completed request")
    target.script_worker(w, FailBeforeStream(ErrorSpec("Disconnected")))
    print(target.outcome(host.route(HostRoute())))
    dump(target, host, "failed dispatch")
