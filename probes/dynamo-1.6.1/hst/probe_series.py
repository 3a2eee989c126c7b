"""Probe: is the frontend's router series per model (router_id) or per process?"""
from routespec.adapters.dynamo_frontend import ADAPTER
from routespec.adapters.dynamo_frontend.http_client import metrics
from routespec.testing.target import TargetConfig, HostConfig, HostRoute

def show(target, what):
    print("--", what)
    for fe in list(target.frontends_used):
        for (n, ls), v in sorted(metrics(fe.host, fe.port).items()):
            if n == "dynamo_component_router_requests_started_total":
                d = dict(ls); print("   ", d.get("dynamo_namespace"), d.get("router_id"), v)

with ADAPTER.open(TargetConfig()) as target:
    target.add_worker()
    first = target.open_host(HostConfig(policy="kv"))
    print(target.outcome(first.route(HostRoute())).error)
    show(target, f"one request on {first.generation.model}")
    second = target.open_host(HostConfig(policy="kv", temperature=0.5))
    print(target.outcome(second.route(HostRoute())).error)
    print(target.outcome(second.route(HostRoute())).error)
    show(target, f"two requests on {second.generation.model}")
    third = target.open_host(HostConfig(policy="round-robin"))
    print(target.outcome(third.route(HostRoute())).error)
    show(target, f"one request on round-robin {third.generation.model}")
