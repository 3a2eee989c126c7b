"""Launching the real Dynamo 1.6.1 pieces on loopback: frontends, a ZMQ relay, token workers.

- ``Frontends``: ``python -m dynamo.frontend`` processes, one per migration setting (the only
  settings that are the frontend's own: the router's policy, its KV settings and session
  affinity travel in each model's card, so one frontend serves many configurations). They
  are started on first use and kept for the whole run.
- A ZMQ XSUB/XPUB relay on 127.0.0.1: with session affinity the frontend's replica sync
  opens a PUB socket on ``tcp://0.0.0.0:0`` unless ``DYN_ZMQ_BROKER_URL`` names a broker; the
  relay is that broker, and its subscriber reads the session bindings the frontend publishes.
- ``WorkerProcess``: one ``worker_process`` (a real Dynamo token worker) per suite worker.

Everything shares one file-discovery directory; every socket is on 127.0.0.1.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from routespec.adapters.dynamo_frontend.http_client import get
from routespec.adapters.dynamo_frontend.tiny_model import build_tiny_model

WAIT_LIMIT = 20.0
U32_MAX = 2**32 - 1


def die_with_parent() -> None:
    """In the child before exec: SIGKILL it when the process that started it dies."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def inotify_instances(pid: int) -> int:
    """The inotify instances a process holds (the kernel allows 128 per user by default)."""
    try:
        descriptors = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return 0
    count = 0
    for descriptor in descriptors:
        with contextlib.suppress(OSError):  # closed since the listing
            count += "inotify" in os.readlink(descriptor)
    return count


def user_inotify_instances() -> int:
    """The inotify instances every process of this user holds: the kernel's limit is per
    user, and frontends, workers and whatever else the user runs share it."""
    uid = os.getuid()
    total = 0
    for process in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if process.name.isdigit() and process.stat().st_uid == uid:
                total += inotify_instances(int(process.name))
    return total


def inotify_limit() -> int:
    try:
        return int(Path("/proc/sys/fs/inotify/max_user_instances").read_text())
    except (OSError, ValueError):
        return 128


INOTIFY_BUDGET = 20
"""A frontend opens an inotify instance for each model it discovers and keeps it after the
model is unregistered (observed on 1.6.1: 75 instances after ~60 checks), and the kernel's
default limit is 128 per user: a frontend holding more than this is replaced between
checks."""

INOTIFY_HEADROOM = 64
"""What one check may add before the next recycling (seen: +19 within one migration machine
run, 8 frontends alive): between checks, frontends are replaced (those holding most first)
until the user's total is this far under the kernel's limit.
Past the limit a frontend fails to start, or fails to watch a model's instances and routes
nothing to them (seen in CI: "Too many open files (os error 24)" at startup)."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def dynamo_environment(store: Path, broker: str | None) -> dict[str, str]:
    """Loopback only, one discovery directory, quiet logs."""
    environment = {
        **os.environ,
        "DYN_FILE_KV": str(store),
        "DYN_TCP_RPC_HOST": "127.0.0.1",
        "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
        "DYN_EVENT_PLANE_HOST": "127.0.0.1",
        "DYN_SYSTEM_HOST": "127.0.0.1",
        "DYN_SELF_HOST_METADATA": "0",
        "DYN_LOG": "warn",
        "NO_COLOR": "1",
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]), *sys.path]),
    }
    environment.pop("DYN_SYSTEM_PORT", None)
    if broker is not None:
        environment["DYN_ZMQ_BROKER_URL"] = broker
    return environment


class AffinityRelay:
    """The ZMQ broker the frontends publish session-affinity events through, and a reader
    of those events: the last binding published per (endpoint namespace, session)."""

    def __init__(self) -> None:
        import zmq

        self._zmq = zmq
        self.context = zmq.Context()
        self.xsub = self.context.socket(zmq.XSUB)
        self.xpub = self.context.socket(zmq.XPUB)
        xsub_port = self.xsub.bind_to_random_port("tcp://127.0.0.1")
        xpub_port = self.xpub.bind_to_random_port("tcp://127.0.0.1")
        self.url = f"xsub=tcp://127.0.0.1:{xsub_port} , xpub=tcp://127.0.0.1:{xpub_port}"
        self.bindings: dict[tuple[str, str], tuple[int, int | None]] = {}
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.changed = threading.Condition()
        self._sub = self.context.socket(zmq.SUB)
        self._sub.connect(f"tcp://127.0.0.1:{xpub_port}")
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")
        # closing: a TERMINATE on this pair ends the proxy, then every socket is closed by
        # the thread that uses it (destroying the context under a running proxy aborts the
        # process in libzmq's signaler)
        self._control_url = f"inproc://relay-control-{id(self)}"
        self._control = self.context.socket(zmq.PAIR)
        self._control.bind(self._control_url)
        self._stopping = threading.Event()
        self._threads = [
            threading.Thread(target=self._proxy, name="zmq-relay", daemon=True),
            threading.Thread(target=self._read, name="zmq-affinity", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _proxy(self) -> None:
        control = self.context.socket(self._zmq.PAIR)
        control.connect(self._control_url)
        with contextlib.suppress(Exception):
            self._zmq.proxy_steerable(self.xsub, self.xpub, None, control)
        for socket_ in (control, self.xsub, self.xpub):
            socket_.close(linger=0)

    def _read(self) -> None:
        try:
            self._read_events()
        finally:
            self._sub.close(linger=0)

    def _read_events(self) -> None:
        import msgpack

        while not self._stopping.is_set():
            try:
                if not self._sub.poll(100):
                    continue
                parts = self._sub.recv_multipart()
            except Exception:
                return
            topic = parts[0].decode("utf-8", "replace")
            if not topic.endswith("session_affinity_events") or len(parts) < 4:
                continue
            with contextlib.suppress(Exception):
                envelope = self._envelope(msgpack, parts[3])
                payload = msgpack.unpackb(envelope["payload"], raw=False)
                namespace = topic.split(".")[1]
                with self.changed:
                    self.events.append((namespace, payload))
                    session = str(payload.get("session_id"))
                    worker = payload.get("worker_id")
                    if isinstance(worker, int):
                        self.bindings[(namespace, session)] = (worker, payload.get("dp_rank"))
                    else:
                        self.bindings.pop((namespace, session), None)
                    self.changed.notify_all()

    @staticmethod
    def _envelope(msgpack: Any, frame: bytes) -> dict[str, Any]:
        """The event's msgpack map, after the frame's short binary header."""
        for offset in range(min(len(frame), 12)):
            if frame[offset] & 0xF0 != 0x80:  # a fixmap starts the envelope
                continue
            with contextlib.suppress(Exception):
                unpacker = msgpack.Unpacker(raw=False)
                unpacker.feed(frame[offset:])
                found = next(unpacker)
                if isinstance(found, dict) and "payload" in found:
                    return found
        raise ValueError("no event envelope in the frame")

    def close(self) -> None:
        self._stopping.set()
        with contextlib.suppress(Exception):
            self._control.send(b"TERMINATE")
        for thread in self._threads:
            thread.join(2.0)
        self._control.close(linger=0)
        if not any(thread.is_alive() for thread in self._threads):
            with contextlib.suppress(Exception):
                self.context.term()


class Frontend:
    """One ``python -m dynamo.frontend`` on 127.0.0.1."""

    def __init__(
        self,
        store: Path,
        broker: str,
        migration_limit: int,
        max_seq_len: int | None,
        log_dir: Path,
        lora: bool = False,
    ) -> None:
        self.host = "127.0.0.1"
        self.port = free_port()
        self.migration_limit = migration_limit
        arguments = [
            sys.executable, "-m", "dynamo.frontend",
            "--http-host", self.host, "--http-port", str(self.port),
            "--discovery-backend", "file", "--request-plane", "tcp", "--event-plane", "zmq",
            "--router-mode", "round-robin", "--no-router-kv-events",
            "--migration-limit", str(migration_limit),
        ]  # fmt: skip
        if max_seq_len is not None:
            arguments += ["--migration-max-seq-len", str(max_seq_len)]
        self.arguments = arguments
        self.log_path = log_dir / f"frontend-{self.port}.log"
        self._log = self.log_path.open("w")
        self.process = subprocess.Popen(
            arguments,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            # LoRA filtering is the frontend's, switched on for the whole process
            env={
                **dynamo_environment(store, broker),
                **({"DYN_LORA_ENABLED": "1"} if lora else {}),
            },
            preexec_fn=die_with_parent,
        )
        deadline = time.monotonic() + WAIT_LIMIT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            with contextlib.suppress(OSError):
                if get(self.host, self.port, "/v1/models", 1.0)[0] == 200:
                    return
            time.sleep(0.05)
        self.close()
        tail = self.log_path.read_text(errors="replace")[-600:]
        raise RuntimeError(f"the Dynamo frontend did not start: {' '.join(arguments)}\n{tail}")

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self._log.close()


def refusal_to_start(migration_limit: int) -> str:
    """Run ``python -m dynamo.frontend --migration-limit N`` and return why it would not start
    (its last output line), or an empty string if it started (then it is stopped)."""
    store = Path(tempfile.mkdtemp(prefix="routespec-dynamo-frontend-refusal-"))
    try:
        arguments = [
            sys.executable, "-m", "dynamo.frontend",
            "--http-host", "127.0.0.1", "--http-port", str(free_port()),
            "--discovery-backend", "file", "--request-plane", "tcp",
            "--migration-limit", str(migration_limit),
        ]  # fmt: skip
        process = subprocess.Popen(
            arguments,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=dynamo_environment(store, None),
            preexec_fn=die_with_parent,
        )
        try:
            output, _ = process.communicate(timeout=WAIT_LIMIT * 2)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            return ""
        lines = [line.strip() for line in output.splitlines() if line.strip()]
        return lines[-1] if process.returncode != 0 and lines else ""
    finally:
        shutil.rmtree(store, ignore_errors=True)


class Deployment:
    """What a run shares: the discovery directory, the tiny model, the relay, the frontends."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="routespec-dynamo-frontend-"))
        self.store = self.root / "store"
        self.store.mkdir()
        self.model_dir = build_tiny_model(self.root / "tiny-model")
        self.relay = AffinityRelay()
        self._frontends: dict[tuple[int, int | None, bool], Frontend] = {}
        self.spares: list[WorkerProcess] = []
        self._lock = threading.Lock()
        atexit.register(self.close)

    def frontend(
        self, migration_limit: int, max_seq_len: int | None = None, lora: bool = False
    ) -> Frontend:
        """The frontend with these migration settings, LoRA filtering on or off (started on
        first use)."""
        if not 0 <= migration_limit <= U32_MAX:
            raise ValueError(
                f"--migration-limit must be between 0 and {U32_MAX} (0=disabled): "
                "dynamo.frontend 1.6.1 refuses to start with it"
            )
        key = (migration_limit, max_seq_len, lora)
        with self._lock:
            found = self._frontends.get(key)
            if found is None or found.process.poll() is not None:
                found = Frontend(
                    self.store, self.relay.url, migration_limit, max_seq_len, self.root, lora
                )
                self._frontends[key] = found
            return found

    def spare_workers(self, count: int) -> list[WorkerProcess]:
        """``count`` ready worker processes with nothing registered, fastest first: spares
        left by earlier targets, then new ones started together."""
        changed = threading.Condition()
        taken = [w for w in self.spares[:count] if w.alive()]
        self.spares = self.spares[count:]
        fresh = [WorkerProcess(0, self, changed) for _ in range(count - len(taken))]
        deadline = time.monotonic() + WAIT_LIMIT
        with changed:
            while any(w.instance_id is None and w.alive() for w in fresh):
                if time.monotonic() > deadline:
                    break
                changed.wait(0.05)
        return [w for w in taken + fresh if w.instance_id is not None and w.alive()]

    def return_spares(self, workers: list[WorkerProcess]) -> None:
        for worker in workers:
            worker.attach(0, threading.Condition(), None)
        self.spares.extend(workers)

    def recycle(self) -> None:
        """Between checks: replace frontends that hold too many inotify instances, each on
        its own or together with everything else this user runs."""
        with self._lock:
            by_frontend = {
                key: inotify_instances(frontend.process.pid)
                for key, frontend in self._frontends.items()
            }
            retire = [key for key, count in by_frontend.items() if count > INOTIFY_BUDGET]
            ceiling = inotify_limit() - INOTIFY_HEADROOM
            spare = {key: count for key, count in by_frontend.items() if key not in retire}
            over = user_inotify_instances() - sum(by_frontend[key] for key in retire) - ceiling
            # the frontends holding most first; none that would free nothing
            for key in sorted(spare, key=spare.__getitem__, reverse=True):
                if over <= 0 or not spare[key]:
                    break
                retire.append(key)
                over -= spare[key]
            for key in retire:
                self._frontends.pop(key).close()

    def close(self) -> None:
        for frontend in self._frontends.values():
            with contextlib.suppress(Exception):
                frontend.close()
        self._frontends.clear()
        for worker in self.spares:
            with contextlib.suppress(Exception):
                worker.kill()
        self.relay.close()
        shutil.rmtree(self.root, ignore_errors=True)


_DEPLOYMENT: Deployment | None = None


def deployment() -> Deployment:
    global _DEPLOYMENT
    if _DEPLOYMENT is None:
        _DEPLOYMENT = Deployment()
    return _DEPLOYMENT


class WorkerProcess:
    """One ``routespec.adapters.dynamo_frontend.worker_process`` and what it reports."""

    def __init__(
        self,
        worker_id: int,
        shared: Deployment,
        changed: threading.Condition,
        report: Callable[[WorkerProcess, Mapping[str, Any]], None] | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.instance_id: int | None = None
        self.used = False  # a model was served, a script sent, or it was killed or removed
        self.served: dict[str, str | None] = {}  # endpoint -> None (served) or its refusal
        self.loras: dict[str, str | None] = {}  # LoRA -> None (registered) or its refusal
        self.last_pong = 0  # every report written before this ping has been read
        self._changed = changed
        self._report = report
        self._log = (shared.root / f"worker-{os.getpid()}-{id(self)}.log").open("w")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "routespec.adapters.dynamo_frontend.worker_process",
                str(shared.model_dir),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env=dynamo_environment(shared.store, None),
            preexec_fn=die_with_parent,
        )
        self._reader = threading.Thread(target=self._read, name=f"worker-{worker_id}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            with self._changed:
                op = message.get("op")
                if op == "ready":
                    self.instance_id = int(message["instance_id"])
                elif op == "served":
                    self.served[str(message["endpoint"])] = None
                elif op == "serve-failed":
                    self.served[str(message["endpoint"])] = str(message["error"])
                elif op == "lora-done":
                    self.loras[str(message["lora"])] = None
                elif op == "unlora-done":
                    self.loras.pop(str(message["lora"]), None)
                elif op == "lora-failed":
                    self.loras[str(message["lora"])] = str(message["error"])
                elif op == "pong":
                    self.last_pong = int(message["n"])
                if self._report is not None:
                    self._report(self, message)
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def alive(self) -> bool:
        return self.process.poll() is None

    def attach(
        self,
        worker_id: int,
        changed: threading.Condition,
        report: Callable[[WorkerProcess, Mapping[str, Any]], None] | None,
    ) -> None:
        """Hand a spare process to a target (or back to the pool, with ``report`` None)."""
        with self._changed:
            self.worker_id = worker_id
            self._changed = changed
            self._report = report

    def send(self, command: Mapping[str, object]) -> None:
        if self.alive() and self.process.stdin is not None:
            with contextlib.suppress(BrokenPipeError, OSError):
                self.process.stdin.write(json.dumps(command) + "\n")
                self.process.stdin.flush()

    def kill(self) -> None:
        if self.alive():
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(WAIT_LIMIT)

    def close(self) -> None:
        """Unregister its models and exit; SIGKILL if it does not within a second."""
        self.send({"op": "quit"})
        try:
            self.process.wait(1.5)
        except subprocess.TimeoutExpired:
            self.kill()
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                with contextlib.suppress(BrokenPipeError, OSError):
                    stream.close()
        self._log.close()
