"""Probe HST-017: what a DYN_LORA_ENABLED frontend's /metrics shows about a LoRA's requests
while one is open (stalled) and after it ends."""
import time
from routespec.adapters.dynamo_frontend import ADAPTER
from routespec.adapters.dynamo_frontend.http_client import metrics
from routespec.testing.target import TargetConfig, HostConfig, HostRoute, Stall

def lora_series(target):
    fe = target._frontend(0, lora=True)
    return {(n, tuple(sorted(ls))): v for (n, ls), v in metrics(fe.host, fe.port).items()
            if "lora" in n.lower() or any("lora" in str(x).lower() for x in ls)}

with ADAPTER.open(TargetConfig()) as target:
    pool = [target.add_worker() for _ in range(3)]
    host = target.open_host(HostConfig(policy="round-robin", lora=True))
    host.set_lora_replicas("ad", frozenset({pool[0]}))
    print("before:", lora_series(target))
    target.script_worker(pool[0], Stall(items=1))
    rid = host.route(HostRoute(lora="ad", max_tokens=2))
    time.sleep(1.0)
    print("open:", lora_series(target))
    target.release_stalled(pool[0])
    print("outcome:", target.outcome(rid))
    time.sleep(1.0)
    print("ended:", lora_series(target))
