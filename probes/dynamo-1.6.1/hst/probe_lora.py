"""Probe LoRA routing in the real 1.6.1 frontend: DYN_LORA_ENABLED=1, three Dynamo token
workers serving base model NS (policy POLICY), only worker 1 registering LoRA 'ad'
(register_model(..., lora_name='ad', base_model_path=...)). Which workers get requests
for model 'ad'?"""
import sys, threading, time, uuid, json
import routespec.adapters.dynamo_frontend.deployment as dep
from routespec.adapters.dynamo_frontend.http_client import (
    CompletionRequest, post_completion, wait_for_model, get)

policy = sys.argv[1] if len(sys.argv) > 1 else "round-robin"
affinity = len(sys.argv) > 2 and sys.argv[2] == "affinity"
d = dep.deployment()
original = dep.dynamo_environment
dep.dynamo_environment = lambda store, broker: {**original(store, broker), **({"DYN_LORA_ENABLED": "1"} if "nolora" not in sys.argv else {})}
frontend = dep.Frontend(d.store, d.relay.url, 0, None, d.root)
dep.dynamo_environment = original
print("frontend started with DYN_LORA_ENABLED=1 on port", frontend.port)
changed = threading.Condition()
delivered = []
def report(worker, message):
    if message.get("op") == "delivered":
        delivered.append(worker.worker_id)
workers = d.spare_workers(3)
for i, w in enumerate(workers, 1):
    w.attach(i, changed, report)
ns = f"lora{uuid.uuid4().hex[:6]}"
router = {"policy": policy}
if affinity:
    router["affinity_ttl"] = 10
for i, w in enumerate(workers, 1):
    cmd = {"op": "serve", "endpoint": f"{ns}.backend.generate", "model": ns, "block_size": 16,
           "router": router}
    if i == 1:
        cmd["lora"] = "ad"
    w.send(cmd)
deadline = time.monotonic() + 20
with changed:
    while time.monotonic() < deadline and not all(w.served for w in workers):
        changed.wait(0.1)
print("served:", [w.served for w in workers])
print("instance ids:", {w.worker_id: w.instance_id for w in workers})
for model in (ns, "ad"):
    print(model, "listed:", wait_for_model(frontend.host, frontend.port, model, 10))
status, body = get(frontend.host, frontend.port, "/v1/models")
print("/v1/models:", [e.get("id") for e in json.loads(body)["data"]])
for model in ("ad", ns, "none"):
    delivered.clear()
    answers = []
    for _ in range(6):
        status, body = post_completion(frontend.host, frontend.port, CompletionRequest(model, (1, 2), 1))
        answers.append((status, body[:120]))
        time.sleep(0.05)
    time.sleep(0.3)
    print(f"model {model}: workers reached {delivered}; answers {set(a[0] for a in answers)} {answers[0][1]!r}")
# a hint outside the set
delivered.clear()
status, body = post_completion(frontend.host, frontend.port,
    CompletionRequest("ad", (1, 2), 1, nvext={"backend_instance_id": workers[2].instance_id}))
time.sleep(0.3)
print("model ad, hint worker 3:", status, body[:160], "reached", delivered)
log = frontend.log_path.read_text(errors="replace")
print("frontend log:", *[l[-400:] for l in log.splitlines() if "support" in l.lower() or "LoRA" in l or "lora" in l][-12:], sep="\n  ")
frontend.close()
for w in workers:
    w.close()
d.close()
