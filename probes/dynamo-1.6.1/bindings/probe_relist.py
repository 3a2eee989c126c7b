"""Probe: does the Dynamo client follow a changed record (same instance, new address)?"""
import tempfile, time, sys
from pathlib import Path
import routespec.adapters.dynamo_wire as dw

from routespec.testing.target import Silent, SilentStage, Serve, Direct
with tempfile.TemporaryDirectory() as store:
    t = dw.DynamoWireTarget(Path(store))
    try:
        w = t.add_worker()
        t.script_worker(w, Silent(SilentStage.CONNECT))
        t0 = time.monotonic(); r = t.submit(Direct(w)); 
        while t.outcome(r) is None and time.monotonic() - t0 < 15: time.sleep(0.05)
        print(f"silent-at-connect request after {time.monotonic()-t0:.2f} s:", t.outcome(r), "deliveries:", t.deliveries())
        t.script_worker(w, Serve(1))
        r = t.submit(Direct(w)); print("served again:", t.outcome(r))
    finally:
        t.close()
