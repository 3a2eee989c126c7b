"""Probe: raw Dynamo-wire requests at a real Dynamo 1.6.1 worker (serve_endpoint, Python
handler), reading its ACK on the request connection and any dial-back."""
import json, os, socket, struct, subprocess, sys, tempfile, time
sys.path.insert(0, ".")  # run from the checkout root
from conformance.test_transport import request_message, usable_control, _listener, dialled_back, MARKER, NO_ENDPOINT
import conformance.test_transport as tt
tt.DIAL_WAIT = 4.0
from routespec.adapters.dynamo.wire_access import record_address
store = tempfile.mkdtemp(prefix="probe-raw-")
env = {**os.environ, "DYN_FILE_KV": store, "DYN_TCP_RPC_HOST": "127.0.0.1",
       "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1", "DYN_LOG": "error", "NO_COLOR": "1"}
EP = "routespec.conformance.generate"
w = subprocess.Popen([sys.executable, "-m", "routespec.adapters.dynamo.worker_process", EP],
                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open("raw-worker.err","w"), text=True, env=env, cwd=".")
iid = int(json.loads(w.stdout.readline())["instance_id"])
time.sleep(0.5)
host, port = record_address(__import__("pathlib").Path(store), iid)
rec = json.load(open(next(__import__("pathlib").Path(store, "v1", "instances").glob("*"))))
own_path = rec["transport"]["tcp"].partition("/")[2]
print("record:", rec["transport"], "path", own_path)

def ack(sock):
    sock.settimeout(4)
    try:
        head = sock.recv(4)
        if len(head) < 4: return f"closed ({head!r})"
        n = struct.unpack(">I", head)[0]
        data = b""
        while len(data) < n:
            c = sock.recv(n - len(data))
            if not c: break
            data += c
        return f"ACK len={n} {data[:200]!r}"
    except socket.timeout:
        return "no ACK in 4 s"
    except OSError as e:
        return f"error {e}"

def attempt(label, path, control_fields, body=b"{}"):
    with _listener("127.0.0.1") as lst:
        p = lst.getsockname()[1]
        fields = control_fields(p)
        msg = request_message(path, json.dumps(fields).encode(), body)
        with socket.create_connection((host, port)) as s:
            s.sendall(msg)
            a = ack(s)
        earlier, prologue = dialled_back(lst, fields["id"])
        print(f"{label}: {a}; dial-back prologue={prologue!r} earlier={earlier!r}")

def ctl(subject, **over):
    def make(p):
        f = usable_control(f"127.0.0.1:{p}", subject)
        f.update(over)
        return f
    return make


def with_stream_type(subject, **over):
    def make(p):
        f = ctl(subject, **over)(p)
        info = json.loads(f["connection_info"]["info"]); info["stream_type"] = "response"
        f["connection_info"]["info"] = json.dumps(info)
        return f
    return make

def at_host(host, subject):
    def run():
        with _listener(host) as lst:
            p = lst.getsockname()[1]
            f = usable_control(f"{host}:{p}", subject)
            info = json.loads(f["connection_info"]["info"]); info["stream_type"] = "response"
            f["connection_info"]["info"] = json.dumps(info)
            msg = request_message(own_path, json.dumps(f).encode(), json.dumps({"rid": subject}).encode())
            with socket.create_connection((host_, port_)) as s:
                s.sendall(msg); a = ack(s)
            earlier, prologue = dialled_back(lst, subject)
            print(f"own endpoint, usable, response address {host}:{p} (request from 127.0.0.1): {a}; dial-back prologue={prologue!r}")
    run()
host_, port_ = host, port
at_host("127.0.0.2", "other-host")
at_host("127.0.0.1", "peer-host")
w.kill(); w.wait()
