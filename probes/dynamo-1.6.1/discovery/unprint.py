import os, time
from routespec.adapters.dynamo_discovery import DynamoDiscovery
s = DynamoDiscovery()
try:
    w = s.watch("dsc/backend/gen\x07")
    try:
        i = s.register("dsc/backend/gen\x07"); print("registered", hex(i))
    except Exception as e:
        print("ERR", str(e)[-400:])
    s.advance(1.0)
    print("files:", os.listdir(s._root / "v1/instances"))
    print("listed:", s.listed(w), "skipped:", s.skipped(w))
finally:
    s.close()
