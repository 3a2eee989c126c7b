from probe_common import *
t, ws, host = setup(3, HostConfig(policy="round-robin"))
a, b, c = ws
# report_down: a pinned request the worker fails with EngineShutdown
t.script_worker(b, FailBeforeStream(ErrorSpec("Backend(EngineShutdown)")))
r = host.route(HostRoute(backend_instance_id=b))
print("down-probe", t.outcome(r), [d.worker_id for d in t.log if d.request_id == r])
t.script_worker(b, Serve())
t0=time.monotonic()
picks = []
for i in range(6):
    r = host.route(HostRoute()); picks.append(tuple(d.worker_id for d in t.log if d.request_id == r))
print("rr after down", picks, round(time.monotonic()-t0,2))
r = host.route(HostRoute(backend_instance_id=b))
print("pin on inhibited", t.outcome(r), [d.worker_id for d in t.log if d.request_id == r])
time.sleep(6)
picks = []
for i in range(6):
    r = host.route(HostRoute()); picks.append(tuple(d.worker_id for d in t.log if d.request_id == r))
print("rr after 6s", picks)
# vanish: SIGKILL a
t.workers[a].kill()
t1=time.monotonic()
r = host.route(HostRoute(backend_instance_id=a))
print("pin vanished", t.outcome(r), [d.worker_id for d in t.log if d.request_id == r], round(time.monotonic()-t1,2))
d = t.open_host(HostConfig(policy="direct"))
r = d.route(HostRoute(backend_instance_id=a))
print("direct-mode vanished", t.outcome(r), [d_.worker_id for d_ in t.log if d_.request_id == r], round(time.monotonic()-t1,2))
