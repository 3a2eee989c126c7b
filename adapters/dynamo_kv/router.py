"""The suite's side of ``router_process``: one process holding the run's real ``KvRouter``s,
spoken to in JSON lines, its ``/metrics`` on 127.0.0.1, every wait bounded in real time."""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from routespec.adapters.dynamo_frontend.deployment import (
    WAIT_LIMIT,
    die_with_parent,
    dynamo_environment,
    inotify_instances,
)

Listener = Callable[[Mapping[str, Any]], None]


class RouterError(Exception):
    """A call the runtime refused: its exception's class path and text."""

    def __init__(self, exception: str, text: str) -> None:
        super().__init__(f"{exception}: {text}")
        self.exception = exception
        self.text = text


def system_port() -> int:
    """A free loopback port below 32768: ``DYN_SYSTEM_PORT`` is parsed as an i16 (1.6.1
    refuses 52473 with ``expected i16 for key "SYSTEM_PORT"``)."""
    while True:
        port = random.randint(20_000, 32_000)
        with socket.socket() as probe, contextlib.suppress(OSError):
            probe.bind(("127.0.0.1", port))
            return port


class RouterProcess:
    """``python -m routespec.adapters.dynamo_kv.router_process`` and what it reports."""

    def __init__(self, store: Path, log_dir: Path) -> None:
        self.port = system_port()
        environment = dynamo_environment(store, None)
        environment.update(DYN_SYSTEM_PORT=str(self.port), DYN_SYSTEM_ENABLED="true")
        self._log = (log_dir / f"kv-router-{self.port}.log").open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "routespec.adapters.dynamo_kv.router_process"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env=environment,
            preexec_fn=die_with_parent,
        )
        self.changed = threading.Condition()
        self.ready = False
        self.hosts_opened = 0
        self.replies: dict[int, Mapping[str, Any]] = {}
        self.listeners: dict[str, Listener] = {}  # request key -> its target's listener
        self._calls = itertools.count(1)
        self._write = threading.Lock()
        threading.Thread(target=self._read, name="kv-router", daemon=True).start()
        with self.changed:
            self.changed.wait_for(lambda: self.ready or not self.alive(), WAIT_LIMIT)
        if not self.ready:
            raise RuntimeError(f"the KvRouter process did not start; see {self._log.name}")

    def alive(self) -> bool:
        return self.process.poll() is None

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            with self.changed:
                op = message.get("op")
                if op == "ready":
                    self.ready = True
                elif op == "reply":
                    self.replies[int(message["call"])] = message
                else:
                    listener = self.listeners.get(str(message.get("rid")))
                    if listener is not None:
                        listener(message)
                self.changed.notify_all()
        with self.changed:
            self.changed.notify_all()

    def call(self, op: str, limit: float = WAIT_LIMIT, /, **arguments: object) -> Any:
        """Run one command and return its result; the runtime's refusal raises RouterError."""
        number = next(self._calls)
        with self._write:
            if self.process.stdin is None or not self.alive():
                raise RuntimeError("the KvRouter process has exited")
            self.process.stdin.write(json.dumps({"op": op, "call": number, **arguments}) + "\n")
            self.process.stdin.flush()
        with self.changed:
            if not self.changed.wait_for(lambda: number in self.replies, limit):
                raise TimeoutError(f"KvRouter {op} gave no answer within {limit} s")
            reply = self.replies.pop(number)
        error = reply.get("error")
        if error is not None:
            raise RouterError(str(error["exception"]), str(error["text"]))
        return reply.get("result")

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as got:
            text: str = got.read().decode()
        return text

    def close(self) -> None:
        if self.alive() and self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.process.stdin.flush()
            try:
                self.process.wait(3)
            except subprocess.TimeoutExpired:
                self.process.send_signal(signal.SIGKILL)
                self.process.wait(5)
        self._log.close()


_ROUTER: RouterProcess | None = None
HOST_BUDGET = 1
"""KvRouters a router process may have built before it is replaced between targets: each
keeps 6 inotify instances on the file store (probed: 0, 6, 12, 18 after 0-3 hosts), and
inotify instances are limited per user (128 by default, shared with every Dynamo process
of the user, such as a frontend's ~75): lanes hit "Too many open files (os error 24)"
building a host, so the adapter holds as few as it can."""
EXHAUSTED = "(os error 24)"
"""How the runtime reports the exhausted inotify limit; the host retries (``KvHost.open``)."""


def router(store: Path, log_dir: Path) -> RouterProcess:
    """The run's router process: started on first use, replaced if it died or has built
    ``HOST_BUDGET`` hosts (called between targets only)."""
    global _ROUTER
    if _ROUTER is not None and (
        _ROUTER.hosts_opened >= HOST_BUDGET or inotify_instances(_ROUTER.process.pid) > 18
    ):
        _ROUTER.close()
    if _ROUTER is None or not _ROUTER.alive():
        _ROUTER = RouterProcess(store, log_dir)
        atexit.register(_ROUTER.close)
    return _ROUTER


def wait_until(changed: threading.Condition, condition: Callable[[], bool], limit: float) -> bool:
    deadline = time.monotonic() + limit
    with changed:
        while not condition():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            changed.wait(min(remaining, 0.05))
    return True
