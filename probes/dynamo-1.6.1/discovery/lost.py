import os, time
import routespec.adapters.dynamo_discovery as m
m.LOOPBACK["DYN_LOG"] = os.environ.get("PROBE_LOG", "error")
EP = "dsc/backend/generate"
s = m.DynamoDiscovery()
try:
    w = s.watch(EP); k = s.register(EP); s.advance(0.5)
    print("before:", [hex(i) for i in s.listed(w)], "record:", s.record(k) is not None)
    s.lose_records(); t = time.monotonic()
    s.advance(3 * m.RENEWAL + 0.5)
    print(f"{time.monotonic()-t:.1f}s after losing the record:", [hex(i) for i in s.listed(w)], "record:", s.record(k) is not None, "events:", s.events(w))
    s.put_raw(EP, 0xBAD, b"\x00not json"); s.advance(1.0)
    print("worker stderr:", s._workers[k].tail()[-700:])
    print("watcher stderr:", s._watchers[w].child.tail()[-900:])
finally:
    s.close()
