from probe_common import *
t, ws, host = setup()
print("workers", {w: t.workers[w].instance_id for w in ws})
r = host.route(HostRoute(tokens=(1,2,3,4,5,6,7,8), backend_instance_id=ws[0]))
print("pinned", t.outcome(r), [d.worker_id for d in t.log])
fe = t._frontend(0)
for ann in (["query_instance_id"], ["query_instance_id:"]):
  for stream in (True, False):
    st, data = raw(fe, {"model": host.generation.model, "prompt": [1,2,3,4,5,6,7,8], "max_tokens": 1, "stream": stream, "nvext": {"annotations": ann}})
    print(ann, stream, st, data[:800])
print("log", [(d.request_id, d.worker_id) for d in t.log])
