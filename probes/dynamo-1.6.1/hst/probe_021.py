"""Probe HST-021 on the real frontend: every worker overloaded / every worker reported down."""
import time
from routespec.adapters.dynamo_frontend import ADAPTER
from routespec.adapters.dynamo_frontend.http_client import CompletionRequest, post_completion
from routespec.testing.target import TargetConfig, HostConfig, HostRoute

def raw(target, host, note):
    fe = target.shared.frontend(0)
    req = CompletionRequest(host.generation.model, (1,), 1)
    status, body = post_completion(fe.host, fe.port, attrs_evolve(req))
    print(f"{note}: HTTP {status} {body[:300]!r}")
    return fe

import attrs
attrs_evolve = lambda r: r

for case in ("overloaded", "down"):
    with ADAPTER.open(TargetConfig()) as target:
        pool = [target.add_worker(), target.add_worker()]
        host = target.open_host(HostConfig(policy="kv"))
        for w in pool:
            (target.mark_overloaded if case == "overloaded" else target.report_down)(*( (w, True) if case == "overloaded" else (w,)))
        fe = raw(target, host, f"kv, every worker {case}, non-streamed")
        print("  streamed outcome:", target.outcome(host.route(HostRoute())))
        log = fe.log_path.read_text(errors="replace")
        hits = [l for l in log.splitlines() if any(k in l for k in ("busy", "overload", "not ready", "No workers", "no instances", "inhibit"))]
        print("  frontend log lines:", *[h[-400:] for h in hits[-8:]], sep="\n    ")
        if case == "overloaded":
            for w in pool:
                target.mark_overloaded(w, False)
