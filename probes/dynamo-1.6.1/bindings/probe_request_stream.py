"""Probe: how a real Dynamo 1.6.1 worker reads a bidirectional request's request stream
(TRN-020, TRN-036).

A worker process serves ``serve_bidirectional_endpoint`` with a Python handler that yields
one item per input it reads, ``{"input": …}``, then ``{"end": …}`` naming how its request
stream ended (``StopAsyncIteration`` or the exception it raised). Raw Dynamo-wire
bidirectional requests (JSON codec) at its own endpoint; on the request stream the worker
dials, the probe writes the frames of each case, then waits; it prints what the response
stream carried and whether the worker closed the request stream."""

import json
import os
import pathlib
import socket
import struct
import subprocess
import sys
import tempfile
import textwrap
import time

sys.path.insert(0, ".")  # run from the checkout root
from conformance.test_transport import _listener, request_message, usable_control  # noqa: E402
from routespec.adapters.dynamo.wire_access import record_address  # noqa: E402

WAIT = 4.0
WORKER = textwrap.dedent(
    """
    import asyncio, json, sys
    from dynamo.runtime import DistributedRuntime

    def generate(request_stream, context):  # a plain callable returning the generator
        async def items():
            try:
                async for item in request_stream:
                    yield {"input": item}
                yield {"end": "StopAsyncIteration"}
            except Exception as error:
                yield {"end": f"{type(error).__name__}: {error}"}
        return items()

    async def main():
        runtime = DistributedRuntime(asyncio.get_running_loop(), "file", "tcp")
        endpoint = runtime.endpoint(sys.argv[1])
        serving = asyncio.ensure_future(endpoint.serve_bidirectional_endpoint(generate))
        await asyncio.sleep(0)
        print(json.dumps({"instance_id": int(endpoint.connection_id())}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        serving.cancel()
        runtime.shutdown()

    asyncio.run(main())
    """
)

store = tempfile.mkdtemp(prefix="probe-request-stream-")
env = {
    **os.environ,
    "DYN_FILE_KV": store,
    "DYN_TCP_RPC_HOST": "127.0.0.1",
    "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
    "DYN_LOG": "error",
    "NO_COLOR": "1",
}
worker = subprocess.Popen(
    [sys.executable, "-c", WORKER, "routespec.conformance.bidi"],
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


def body(data: bytes) -> bytes:
    return struct.pack(">QQQ", 0, len(data), 0) + data


def control(header: bytes) -> bytes:
    return struct.pack(">QQQ", len(header), 0, 0) + header


def exactly(stream: socket.socket, count: int) -> bytes | None:
    data = b""
    while len(data) < count:
        chunk = stream.recv(count - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def frames(stream: socket.socket) -> list[object]:
    """The frames until the sentinel or the connection's end (or WAIT s of silence)."""
    seen: list[object] = []
    stream.settimeout(WAIT)
    try:
        while (prefix := exactly(stream, 24)) is not None:
            header_len, body_len, _ = struct.unpack(">QQQ", prefix)
            data = exactly(stream, header_len + body_len) or b""
            header, rest = data[:header_len], data[header_len:]
            seen.append(header.decode(errors="replace") if header else rest.decode(errors="replace"))
            if header == b'"sentinel"':
                return seen
        seen.append("<closed>")
    except TimeoutError:
        seen.append(f"<silent {WAIT} s>")
    except ConnectionResetError:
        seen.append("<reset>")
    return seen


DATA_0 = body(b'{"data":0,"complete_final":false}')
FINAL = body(b'{"complete_final":true}')
CASES = {  # what the probe writes on the request stream
    "usable: data 0, complete_final": DATA_0 + FINAL,
    "no complete_final key: {data: 0}, then complete_final": body(b'{"data":0}') + FINAL,
    "COMPLETE_FINAL key: {data: 0, COMPLETE_FINAL: false}, then complete_final": body(
        b'{"data":0,"COMPLETE_FINAL":false}'
    )
    + FINAL,
    "data 0, then body null": DATA_0 + body(b"null"),
    "data 0, then body 7": DATA_0 + body(b"7"),
    "data 0, then body {}": DATA_0 + body(b"{}"),
    "data 0, then {data: 1, complete_final: true}": DATA_0
    + body(b'{"data":1,"complete_final":true}'),
    "data 0, then {complete_final: false} (no data)": DATA_0
    + body(b'{"complete_final":false}')
    + FINAL,
    "data 0, then a header-only stop, then complete_final": DATA_0 + control(b'"stop"') + FINAL,
    "data 0, then a header-only sentinel": DATA_0 + control(b'"sentinel"'),
    "raw item 5, then a header-only sentinel": body(b"5") + control(b'"sentinel"'),
    "raw item 5, then a header-only kill": body(b"5") + control(b'"kill"'),
    "raw item 5, then a header-only sentinel, then raw item 6": body(b"5")
    + control(b'"sentinel"')
    + body(b"6"),
    "data 0, then nothing (kept open)": DATA_0,
    "data 0, then half-close": (DATA_0, "half-close"),
    "data 0, then close": (DATA_0, "close"),
    "raw item 5, then half-close": (body(b"5"), "half-close"),
}

for label, written in CASES.items():
    with _listener("127.0.0.1") as listener:
        listener.settimeout(WAIT)
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        control = json.dumps(usable_control(address, "probe", many_in=True)).encode()
        with socket.create_connection((host, port)) as plane:
            plane.sendall(request_message(own_path, control, b""))
            streams = {}
            try:
                for _ in range(2):
                    stream, _ = listener.accept()
                    stream.settimeout(WAIT)
                    prefix = exactly(stream, 24)
                    header_len, body_len, _ = struct.unpack(">QQQ", prefix)
                    handshake = json.loads(exactly(stream, header_len + body_len)[:header_len])
                    streams[handshake.get("stream_type")] = stream
            except TimeoutError:
                print(f"{label}: dialled back only {sorted(streams)}")
                continue
            inputs, response = streams["request"], streams["response"]
            with inputs, response:
                written, ending = written if isinstance(written, tuple) else (written, None)
                inputs.sendall(written)
                if ending == "half-close":
                    inputs.shutdown(socket.SHUT_WR)
                elif ending == "close":
                    inputs.shutdown(socket.SHUT_RDWR)
                print(f"{label}:\n  response stream: {frames(response)}")
                inputs.settimeout(0.5)
                try:
                    late = inputs.recv(100)
                    state = "closed by the worker" if late == b"" else f"wrote {late!r}"
                except TimeoutError:
                    state = "still open"
                except ConnectionResetError:
                    state = "reset"
                except OSError:
                    state = "closed by the probe"
                print(f"  request stream: {state}")
worker.stdin.close()
worker.kill()
worker.wait()
