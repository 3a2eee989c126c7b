# the sweeping processes start before the killed worker: watcher, running worker, then the killed one
import time
from routespec.adapters.dynamo_discovery import DynamoDiscovery
EP = "dsc/backend/generate"
for trial in range(2):
    s = DynamoDiscovery()
    try:
        w = s.watch(EP); r = s.register(EP); k = s.register(EP)
        mtime = s._path(k).stat().st_mtime
        s.lapse(k); killed = time.time()
        gone = unlisted = None
        while time.time() - killed < 16 and (gone is None or unlisted is None):
            s.advance(0.02)
            now = time.time()
            if gone is None and s.record(k) is None: gone = now - mtime
            if unlisted is None and k not in s.listed(w): unlisted = now - mtime
        print(f"trial {trial}: killed {killed-mtime:.2f}s after its last renewal; record deleted at {gone}, unlisted at {unlisted} (s after last renewal)", flush=True)
    finally:
        s.close()
