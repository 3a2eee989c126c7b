"""Probe the 1.6.1 bindings' client: generate() under RouterMode.KV / Direct, a streamed
(async-iterator) request, Context metadata, client thresholds. Real worker in a subprocess."""
import asyncio, json, os, subprocess, sys, tempfile, time, inspect
from pathlib import Path
sys.path.insert(0, ".")  # run from the checkout root
store = tempfile.mkdtemp(prefix="probe-modes-")
env = {**os.environ, "DYN_FILE_KV": store, "DYN_TCP_RPC_HOST": "127.0.0.1",
       "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1", "DYN_LOG": "error", "NO_COLOR": "1"}
os.environ.update(env)
EP = "probe.comp.generate"
worker = subprocess.Popen([sys.executable, "-m", "routespec.adapters.dynamo.worker_process", EP],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=".")
print("worker:", worker.stdout.readline().strip())
from dynamo.runtime import DistributedRuntime
import dynamo._core as core

async def drain(stream, cap=5.0):
    out = []
    async def go():
        async for x in stream:
            out.append(x)
    await asyncio.wait_for(go(), cap)
    return out

async def attempt(label, coro_factory):
    t0 = time.monotonic()
    try:
        stream = await asyncio.wait_for(coro_factory(), 10)
        items = await drain(stream)
        print(f"{label}: OK items={items} ({time.monotonic()-t0:.2f}s)")
    except Exception as e:
        print(f"{label}: {type(e).__module__}.{type(e).__qualname__}: {str(e)[:300]} ({time.monotonic()-t0:.2f}s)")

async def main():
    rt = DistributedRuntime(asyncio.get_running_loop(), "file", "tcp")
    ep = rt.endpoint(EP)
    print("Endpoint.client signature:", getattr(ep.client, "__text_signature__", None))
    base = await ep.client()
    await asyncio.wait_for(base.wait_for_instances(), 15)
    iid = base.instance_ids()[0]
    print("instances:", [(i.instance_id, i.transport.kind, i.transport.address) for i in base.instances()])
    for mode in ("KV", "Direct", "PowerOfTwoChoices", "LeastLoaded", "DeviceAwareWeighted", "RoundRobin"):
        try:
            c = await asyncio.wait_for(ep.client(router_mode=getattr(core.RouterMode, mode)), 10)
        except Exception as e:
            print(f"client(router_mode={mode}): {type(e).__qualname__}: {e}"); continue
        await asyncio.wait_for(c.wait_for_instances(), 15)
        await attempt(f"client(RouterMode.{mode}).generate", lambda: c.generate({"rid": f"gen-{mode}"}, annotated=False))
    try:
        c = await ep.client(router_mode=core.RouterMode.RoundRobin, busy_threshold=0.5)
        print("client(busy_threshold=) accepted")
    except Exception as e:
        print(f"client(..., busy_threshold=0.5): {type(e).__qualname__}: {e}")
    try:
        c = await ep.client(core.RouterMode.RoundRobin, core.LoadThresholdConfig(active_decode_blocks_threshold=0.5))
        print("client(mode, LoadThresholdConfig) accepted")
    except Exception as e:
        print(f"client(mode, LoadThresholdConfig(...)): {type(e).__qualname__}: {e}")
    # streamed request: an async generator / list as request
    async def inputs():
        for i in range(2):
            yield {"rid": "bidi", "input": i}
    await attempt("round_robin(async generator)", lambda: base.round_robin(inputs(), annotated=False))
    await attempt("direct(async generator)", lambda: base.direct(inputs(), iid, annotated=False))
    # context metadata
    ctx = core.Context(metadata={"trace": "t" * 300})
    await attempt("direct(context=Context(metadata=300 B))", lambda: base.direct({"rid": "meta"}, iid, annotated=False, context=ctx))
    ctx = core.Context(metadata={"pad": "x" * (128 * 1024 + 1)})
    await attempt("direct(context=Context(metadata=128 KiB+1))", lambda: base.direct({"rid": "huge"}, iid, annotated=False, context=ctx))
    ctx = core.Context(metadata={"pad": "x" * (64 * 1024)})
    await attempt("direct(context=Context(metadata=64 KiB))", lambda: base.direct({"rid": "fits"}, iid, annotated=False, context=ctx))
    rt.shutdown()

try:
    asyncio.run(main())
finally:
    worker.kill(); worker.wait()
    print("worker stdout rest:", worker.stdout.read()[-2000:])
