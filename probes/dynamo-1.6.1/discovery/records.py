import sys, json
sys.path.insert(0, "conformance")
from test_discovery import MALFORMED, UNUSABLE, ENDPOINT, _record
from routespec.adapters.dynamo_discovery import DynamoDiscovery
FAILED = ["empty-name","slash-in-a-name","no-tcp-transport","tcp-without-a-path","codec-not-a-string",
 "no-port","empty-port","port-a-name","port-signed","port-zero","port-out-of-range","no-host","host-not-a-name",
 "address-not-printable","id-unlike-its-key","endpoint-unlike-its-key","too-large"]
s = DynamoDiscovery()
try:
    w = s.watch(ENDPOINT)
    for name in FAILED:
        value = MALFORMED.get(name) or UNUSABLE[name][0]
        s.put_raw(ENDPOINT, 0xBAD, value)
        s.advance(0.5)
        shown = {hex(k): (v.address, v.device_type) for k, v in s.listed(w).items()}
        print(f"{name}: put {value[:160]!r}{'...' if len(value)>160 else ''} -> lists {shown}", flush=True)
        s._path(0xBAD).unlink()
        s.advance(0.5)
    # overwrite a usable record with an unusable one
    s.put_raw(ENDPOINT, 0xBAD, _record()); s.advance(0.5)
    print("usable:", {hex(k): v for k, v in s.listed(w).items()})
    s.put_raw(ENDPOINT, 0xBAD, _record(request_plane_codec="cbor")); s.advance(1.0)
    print("overwritten with codec cbor:", {hex(k): v for k, v in s.listed(w).items()}, s.events(w))
    print("watcher stderr:", s._watchers[0].child.tail())
finally:
    s.close()
