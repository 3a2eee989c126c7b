"""Probe: what the real Dynamo 1.6.1 client does against a reference worker on Dynamo's wire
that goes silent at one stage. Real time, one worker per stage, all at once; 60 s cap."""
import sys, time
from pathlib import Path
import tempfile
from routespec.adapters.dynamo_wire import DynamoWireTarget
from routespec.testing.target import Silent, SilentStage, Stall, Misbehave, WireFault

CAP = float(sys.argv[1]) if len(sys.argv) > 1 else 60.0
STAGES = {
    "a-no-ack": Silent(SilentStage.ACK),
    "b-ack-no-dial-back": Silent(SilentStage.DIAL_BACK),
    "c1-handshake-no-prologue": Silent(SilentStage.HANDSHAKE),
    "c2-prologue-no-item": Stall(0, 1),
    "d-one-item-then-stall": Stall(1, 1),
}
with tempfile.TemporaryDirectory() as store:
    t = DynamoWireTarget(Path(store))
    try:
        sent = {}
        for name, script in STAGES.items():
            w = t.add_worker()
            t.script_worker(w, script)
            rid = f"probe-{name}"
            t.driver.send({"op": "submit", "id": rid, "mode": "direct",
                           "instance_id": t.instance_id(w), "payload": {"rid": rid}})
            sent[rid] = time.monotonic()
        ended = {}
        opened = {}
        deadline = time.monotonic() + CAP
        while time.monotonic() < deadline and len(ended) < len(sent):
            for rid, t0 in sent.items():
                if rid in t.driver.opened and rid not in opened:
                    opened[rid] = time.monotonic() - t0
                if rid in t.driver.outcomes and rid not in ended:
                    ended[rid] = (time.monotonic() - t0, t.driver.outcomes[rid])
            time.sleep(0.05)
        for rid in sent:
            o = opened.get(rid)
            op = f"call returned a stream after {o:.2f} s" if o is not None else "call never returned a stream"
            if rid in ended:
                s, out = ended[rid]
                print(f"{rid}: {op}; ENDED after {s:.2f} s: items={out['items']} error={out['error']} pre_stream={out['pre_stream']}")
            else:
                print(f"{rid}: {op}; still open after {CAP:.0f} s; items read: {t.driver.received.get(rid, 0)}")
    finally:
        for w in list(t._workers):
            try:
                t.release_stalled(w)
            except Exception:
                pass
        t.close()
