"""Probe: the real Dynamo 1.6.1 client against an instance whose request-plane port never
completes a TCP connection (a listener with a full backlog: Linux drops the SYN)."""
import tempfile, time
from pathlib import Path
from routespec.adapters.dynamo_wire import DynamoWireTarget, ENDPOINT
from routespec.discovery.file_store import FileRegistration, transport_path
from routespec.discovery.instances import Instance
from routespec.testing.drill_server import serve_black_hole

with tempfile.TemporaryDirectory() as store:
    t = DynamoWireTarget(Path(store))
    try:
        iid = t._instance_base + 99
        async def start():
            hole = await t._portal.nursery.start(serve_black_hole)
            reg = FileRegistration(Instance(iid, ENDPOINT, f"{hole}/{transport_path(ENDPOINT, iid)}", "cuda"), Path(store))
            return hole, reg
        hole, reg = t._portal.call(start)
        print("black hole:", hole, "record address:", f"{hole}/{transport_path(ENDPOINT, iid)}")
        reg.register()
        t.driver.await_instances({iid})
        t0 = time.monotonic()
        t.driver.send({"op": "submit", "id": "c", "mode": "direct", "instance_id": iid, "payload": {"rid": "c"}})
        while time.monotonic() - t0 < 60 and "c" not in t.driver.outcomes:
            time.sleep(0.05)
        if "c" in t.driver.outcomes:
            o = t.driver.outcomes["c"]
            print(f"connect: ENDED after {time.monotonic()-t0:.2f} s: error={o['error']} pre_stream={o['pre_stream']}")
        else:
            print("connect: still open after 60 s")
    finally:
        t.close()
