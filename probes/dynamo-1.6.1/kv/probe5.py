from routespec.adapters.dynamo_kv import ADAPTER
from routespec.adapters.dynamo_frontend.deployment import inotify_instances
from routespec.testing.target import TargetConfig, HostConfig, HostRoute
with ADAPTER.open(TargetConfig()) as t:
    t.add_worker(); t.add_worker()
    print("start", inotify_instances(t.router.process.pid), [inotify_instances(w.process.pid) for w in t.workers.values()])
    for n in range(3):
        h = t.open_host(HostConfig(policy="kv", block_size=2))
        print(n, inotify_instances(t.router.process.pid), [inotify_instances(w.process.pid) for w in t.workers.values()])
