"""Probe: which control-message fields a real Dynamo 1.6.1 worker requires (TRN-001, TRN-022).

Raw Dynamo-wire requests at the worker's own endpoint (serve_endpoint, Python handler), each a
usable control message (with ``stream_type``, which 1.6.1 requires) with one field left out
or changed; prints the ACK read on the request connection and the dial-back's handshake,
prologue and first frame, if any."""

import json
import os
import pathlib
import socket
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, ".")  # run from the checkout root
from conformance.test_transport import _listener, request_message, usable_control  # noqa: E402
from routespec.adapters.dynamo.wire_access import record_address  # noqa: E402

WAIT = 4.0
store = tempfile.mkdtemp(prefix="probe-control-")
env = {
    **os.environ,
    "DYN_FILE_KV": store,
    "DYN_TCP_RPC_HOST": "127.0.0.1",
    "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
    "DYN_LOG": "error",
    "NO_COLOR": "1",
}
EP = "routespec.conformance.generate"
worker = subprocess.Popen(
    [sys.executable, "-m", "routespec.adapters.dynamo.worker_process", EP],
    stdin=subprocess.PIPE,
    stdout=subprocess.PIPE,
    stderr=open(os.path.join(store, "worker.err"), "w"),
    text=True,
    env=env,
)
iid = int(json.loads(worker.stdout.readline())["instance_id"])
time.sleep(0.5)
host, port = record_address(pathlib.Path(store), iid)
record = json.load(open(next(pathlib.Path(store, "v1", "instances").glob("*"))))
own_path = record["transport"]["tcp"].partition("/")[2]
print("worker at", host, port, "path", own_path)


def exactly(stream: socket.socket, count: int) -> bytes | None:
    data = b""
    while len(data) < count:
        chunk = stream.recv(count - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def ack(stream: socket.socket) -> str:
    stream.settimeout(WAIT)
    try:
        head = exactly(stream, 4)
        if head is None:
            return "closed"
        text = exactly(stream, struct.unpack(">I", head)[0])
        return f"ACK {text!r}"
    except TimeoutError:
        return f"no ACK in {WAIT} s"


def frame(stream: socket.socket) -> object:
    prefix = exactly(stream, 24)
    if prefix is None:
        return "end of stream"
    header_len, body_len, _ = struct.unpack(">QQQ", prefix)
    data = exactly(stream, header_len + body_len) or b""
    return (data[:header_len].decode(errors="replace"), data[header_len:].decode(errors="replace"))


def dial_back(listener: socket.socket) -> str:
    listener.settimeout(WAIT)
    try:
        stream, _ = listener.accept()
    except TimeoutError:
        return f"no dial-back in {WAIT} s"
    with stream:
        stream.settimeout(WAIT)
        try:
            return f"dialled: {frame(stream)} {frame(stream)} {frame(stream)}"
        except TimeoutError:
            return "dialled, then silent"


def info_with(fields: dict, change: dict) -> None:
    info = json.loads(fields["connection_info"]["info"])
    info["stream_type"] = "response"
    for key, value in change.items():
        if value is None:
            info.pop(key, None)
        else:
            info[key] = value
    fields["connection_info"]["info"] = json.dumps(info)


MISSING = None
CASES = {  # label: (top-level changes, info changes); None: leave the field out
    "usable": ({}, {}),
    "no request_type": ({"request_type": MISSING}, {}),
    "no response_type": ({"response_type": MISSING}, {}),
    "no payload_codec": ({"payload_codec": MISSING}, {}),
    "no metadata": ({"metadata": MISSING}, {}),
    "no id": ({"id": MISSING}, {}),
    "no connection_info.info.context": ({}, {"context": MISSING}),
    "no connection_info.info.stream_type": ({}, {"stream_type": MISSING}),
    "response_type single_out": ({"response_type": "single_out"}, {}),
    "request_type bogus": ({"request_type": "bogus"}, {}),
    "id 7 (a number)": ({"id": 7}, {}),
    "response_type bogus": ({"response_type": "bogus"}, {}),
    "connection_info.info.stream_type request": ({}, {"stream_type": "request"}),
    "connection_info.info.stream_type bogus": ({}, {"stream_type": "bogus"}),
    "connection_info.info.context 7 (a number)": ({}, {"context": 7}),
    "connection_info.info.context empty": ({}, {"context": ""}),
    "connection_info.info.context other": ({}, {"context": "other"}),
    "id other (context probe)": ({"id": "other"}, {}),
    "usable again": ({}, {}),
}

for label, (top, info) in CASES.items():
    with _listener("127.0.0.1") as listener:
        fields = usable_control(f"127.0.0.1:{listener.getsockname()[1]}", "probe")
        info_with(fields, info)
        for key, value in top.items():
            if value is None:
                fields.pop(key, None)
            else:
                fields[key] = value
        message = request_message(own_path, json.dumps(fields).encode(), b'{"rid": "probe"}')
        with socket.create_connection((host, port)) as stream:
            stream.sendall(message)
            answer = ack(stream)
        print(f"{label}: {answer}; {dial_back(listener)}")
worker.kill()
worker.wait()
