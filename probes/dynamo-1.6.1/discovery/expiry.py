import time, os, sys
from routespec.adapters.dynamo_discovery import DynamoDiscovery
EP = "dsc/backend/generate"
for trial in range(int(sys.argv[1])):
    s = DynamoDiscovery()
    try:
        t = time.monotonic(); w = s.watch(EP); t_w = time.monotonic() - t
        t = time.monotonic(); k = s.register(EP); r = s.register(EP); t_r = (time.monotonic() - t) / 2
        time.sleep(float(sys.argv[2]))
        mtime = s._path(k).stat().st_mtime
        s.lapse(k); killed = time.time()
        gone = unlisted = None
        while time.time() - killed < 16 and (gone is None or unlisted is None):
            s.advance(0.02)
            now = time.time()
            if gone is None and s.record(k) is None: gone = now - mtime
            if unlisted is None and k not in s.listed(w): unlisted = now - mtime
        print(f"trial {trial}: watcher start {t_w:.2f}s, worker start {t_r:.2f}s; kill at {killed-mtime:.2f}s after last renewal; record deleted at {gone:.2f}s, unlisted at {unlisted:.2f}s", flush=True)
    finally:
        t = time.monotonic(); s.close(); print(f"   close {time.monotonic()-t:.2f}s")
