"""Probe: where a real Dynamo 1.6.1 worker's request plane listens (TRN-055).

A worker started with DYN_TCP_RPC_HOST=127.0.0.1 (serve_endpoint, Python handler); prints the
address its discovery record gives, and whether the same port accepts a connection at that
address and at another loopback address (127.0.0.2)."""

import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, ".")  # run from the checkout root
from routespec.adapters.dynamo.wire_access import record_address  # noqa: E402

store = tempfile.mkdtemp(prefix="probe-listen-")
env = {
    **os.environ,
    "DYN_FILE_KV": store,
    "DYN_TCP_RPC_HOST": "127.0.0.1",
    "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
    "DYN_LOG": "error",
    "NO_COLOR": "1",
}
worker = subprocess.Popen(
    [sys.executable, "-m", "routespec.adapters.dynamo.worker_process", "probe.listen.generate"],
    stdin=subprocess.PIPE,
    stdout=subprocess.PIPE,
    stderr=open(os.path.join(store, "worker.err"), "w"),
    text=True,
    env=env,
)
try:
    iid = int(json.loads(worker.stdout.readline())["instance_id"])
    time.sleep(0.5)
    host, port = record_address(pathlib.Path(store), iid)
    print("record address", f"{host}:{port}")
    for at in (host, "127.0.0.2"):
        try:
            with socket.create_connection((at, port), timeout=2.0):
                print(f"{at}:{port}", "accepted")
        except OSError as error:
            print(f"{at}:{port}", "refused:", error)
finally:
    worker.kill()
    worker.wait()
