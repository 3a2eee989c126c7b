"""Probe: how a real Dynamo 1.6.1 worker (serve_endpoint, Python handler) reads request-plane
messages: split across reads, several in one write, the bounds of each length field, bytes
that are not UTF-8 in the path, messages cut short. Prints the ACKs read on the connection
and whether the worker closed it."""
import json, os, socket, struct, subprocess, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, ".")  # run from the checkout root
from conformance.test_transport import request_message, usable_control, NO_ENDPOINT
from routespec.adapters.dynamo.wire_access import record_address

store = tempfile.mkdtemp(prefix="probe-plane-")
env = {**os.environ, "DYN_FILE_KV": store, "DYN_TCP_RPC_HOST": "127.0.0.1",
       "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1", "DYN_LOG": "warn", "NO_COLOR": "1"}
EP = "routespec.conformance.generate"
err = open(Path(store, "worker.err"), "w")
w = subprocess.Popen([sys.executable, "-m", "routespec.adapters.dynamo.worker_process", EP],
                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
                     env=env, cwd=".")
iid = int(json.loads(w.stdout.readline())["instance_id"])
time.sleep(0.5)
host, port = record_address(Path(store), iid)
CONTROL = json.dumps(usable_control("127.0.0.1:9", "probe")).encode()
record = json.load(open(next(Path(store, "v1", "instances").glob("*"))))
OWN = record["transport"]["tcp"].partition("/")[2]  # the worker's own endpoint path


def read_acks(sock, wait=1.5):
    """ACK texts until ``wait`` s pass with nothing, and whether the worker closed."""
    sock.settimeout(wait)
    data, closed = b"", False
    while True:
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            break
        except OSError as e:
            closed = f"error {e}"
            break
        if not chunk:
            closed = True
            break
        data += chunk
    acks = []
    while len(data) >= 4:
        n = struct.unpack(">I", data[:4])[0]
        acks.append(data[4:4 + n][:120])
        data = data[4 + n:]
    return acks, closed, data


def attempt(label, *writes, pause=0.05, shut=False):
    with socket.create_connection((host, port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for chunk in writes:
            s.sendall(chunk)
            time.sleep(pause)
        if shut:
            s.shutdown(socket.SHUT_WR)
        acks, closed, rest = read_acks(s)
    print(f"{label}: acks={acks} closed={closed} rest={rest[:40]!r}", flush=True)


def msg(path=NO_ENDPOINT, headers=b"{}", payload=None):
    if payload is None:
        payload = struct.pack(">QQQ", len(CONTROL), 2, 0) + CONTROL + b"{}"
    p = path if isinstance(path, bytes) else path.encode()
    return (struct.pack(">H", len(p)) + p + struct.pack(">H", len(headers)) + headers
            + struct.pack(">I", len(payload)) + payload)


one = msg()
attempt("whole", one)
attempt("byte by byte", *[one[i:i + 1] for i in range(len(one))], pause=0.002)
attempt("three in one write", one * 3)
attempt("split at 1", one[:1], one[1:])
attempt("split after path", one[:2 + len(NO_ENDPOINT)], one[2 + len(NO_ENDPOINT):])
attempt("empty path", msg(path=b""))
attempt("path 1024 bytes", msg(path="p" * 1024))
attempt("path 1025 bytes", msg(path="p" * 1025))
attempt("path 65535 bytes", msg(path="p" * 65535))
attempt("path not utf-8, then a request", msg(path=b"\xff\xfe") + one)
attempt("empty headers", msg(headers=b""))
attempt("headers not json", msg(headers=b"not json"))
attempt("headers 65535 bytes", msg(headers=b'{"k":"' + b"v" * (65535 - 8) + b'"}'))
attempt("empty payload", msg(payload=b""))
attempt("payload 24 bytes (0,0)", msg(payload=struct.pack(">QQQ", 0, 0, 0)))
head = struct.pack(">H", len(NO_ENDPOINT)) + NO_ENDPOINT.encode() + struct.pack(">H", 2) + b"{}"
attempt("payload_len 32 MiB exactly, nothing sent", head + struct.pack(">I", 32 << 20))
attempt("payload_len 32 MiB + 1, nothing sent", head + struct.pack(">I", (32 << 20) + 1))
attempt("payload_len 0xFFFFFFFF", head + struct.pack(">I", 0xFFFFFFFF))
for cut in (1, 2 + 5, 2 + len(NO_ENDPOINT) + 1, len(head) + 2, len(head) + 4 + 10):
    attempt(f"cut at {cut}, then half-close", one[:cut], shut=True)
big = msg(payload=struct.pack(">QQQ", len(CONTROL), (32 << 20) - 200 - len(CONTROL), 0) + CONTROL
          + b" " * ((32 << 20) - 200 - len(CONTROL)))
print("message of", len(big), "bytes, payload", len(big) - len(head) - 4)
attempt("a message just under 32 MiB in total", big)
envelope = len(msg(payload=b""))
for total in (32 << 20, (32 << 20) + 1):
    attempt(f"lengths declaring {total} bytes in all, the prefix alone sent",
            head + struct.pack(">I", total - envelope))
exact = msg(payload=b" " * ((32 << 20) - envelope))
print("exact message:", len(exact))
attempt("a message of exactly 32 MiB in all", exact)
for label, payload in (("shorter than its prefix", b"\x00" * 10),
                       ("longer than it declares", struct.pack(">QQQ", 2, 0, 0) + b"{}left over"),
                       ("a header past 32 MiB", struct.pack(">QQQ", (32 << 20) + 1, 0, 0))):
    attempt(f"own endpoint, a payload {label}, then a request", msg(path=OWN, payload=payload) + one)
w.kill(); w.wait()
