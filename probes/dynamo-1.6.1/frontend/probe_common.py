import json, time, http.client, sys
sys.path.insert(0, ".")  # run from the checkout root
from routespec.adapters.dynamo_frontend.deployment import deployment
from routespec.adapters.dynamo_frontend.target import FrontendTarget
from routespec.testing.target import *

def raw(frontend, body, headers=None, timeout=30):
    c = http.client.HTTPConnection(frontend.host, frontend.port, timeout=timeout)
    c.request("POST", "/v1/completions", json.dumps(body), {"content-type": "application/json", **(headers or {})})
    r = c.getresponse()
    data = r.read().decode()
    return r.status, data

def setup(n=2, config=HostConfig(policy="kv", block_size=2)):
    shared = deployment(); shared.recycle()
    t = FrontendTarget(TargetConfig(), shared)
    ws = [t.add_worker() for _ in range(n)]
    for w in ws: t.script_worker(w, Serve())
    host = t.open_host(config)
    return t, ws, host
