"""Probe: the 1.6.1 bindings' public surface for a streamed request, a first-response guard,
busy thresholds, worker sets and the error model."""
import inspect
import dynamo._core as c
try:
    c.PyAsyncRequestStream()
    print("PyAsyncRequestStream(): constructed")
except Exception as e:
    print(f"PyAsyncRequestStream(): {type(e).__name__}: {e}")
for name in ("generate", "round_robin", "random", "direct", "device_aware_weighted"):
    print(f"Client.{name}{getattr(getattr(c.Client, name), '__text_signature__', None)}")
print("Endpoint.client", c.Endpoint.client.__text_signature__)
print("Instance attrs:", [a for a in dir(c.Instance) if not a.startswith("_")])
hits = [n for n in dir(c) if any(k in n.lower() for k in ("match", "classif", "migrat", "chain", "guard", "overload", "busy"))]
print("dynamo._core names matching match/classif/migrat/chain/guard/overload/busy:", hits)
