from probe_common import *
shared = deployment(); shared.recycle()
t = FrontendTarget(TargetConfig(), shared)
ws = [t.add_worker() for _ in range(4)]
for w in ws: t.script_worker(w, FailBeforeStream(ErrorSpec("Disconnected")))
r = t.submit(Migrate(limit=2**32 - 1))
time.sleep(5)
seq = [d.worker_id for d in t.log if d.request_id == r]
print("after 35 s: outcome", t.outcome(r), "attempts", len(seq), "first", seq[:12])
t.close()
