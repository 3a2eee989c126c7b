"""The suite's side of ``client_driver``: a real Dynamo client in a subprocess, spoken to in
JSON lines, with every wait bounded in real time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from routespec.testing.target import ObservedError, Outcome

WAIT_LIMIT = 20.0
"""Seconds of real time any single wait may take before the adapter gives up."""

CLASSES = (
    "Internal", "InvalidRequest", "Unavailable", "DeadlineExceeded", "CapacityExhausted",
    "Cancelled", "InvalidArgument", "NotFound", "Unknown",
)  # fmt: skip


def dynamo_environment(store: Path) -> dict[str, str]:
    """Loopback only, one discovery directory, quiet logs."""
    return {
        **os.environ,
        "DYN_FILE_KV": str(store),
        "DYN_TCP_RPC_HOST": "127.0.0.1",
        "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
        "DYN_LOG": "error",
        "NO_COLOR": "1",
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]), *sys.path]),
    }


def observed_error(error: Mapping[str, object], *, pre_stream: bool) -> ObservedError:
    """Dynamo's bindings raise ``Class: message`` texts: the class is all the suite can see."""
    text = str(error.get("text", ""))
    exception = str(error.get("exception", ""))
    prefix, _, rest = text.partition(": ")
    error_class = prefix if prefix in CLASSES and rest else None
    if exception.endswith("InvalidArgument"):
        error_class, rest = "InvalidRequest", text
    return ObservedError(
        ((None, rest if error_class else text),),
        pre_stream,
        error_class=error_class,
        types_observed=False,
    )


class ClientDriver:
    """Runs ``routespec.adapters.dynamo.client_driver`` and collects what it reports."""

    def __init__(self, endpoint: str, store: Path) -> None:
        self._log = (store / "client.log").open("w")  # Dynamo's route spans, for debugging
        self._process = subprocess.Popen(
            [sys.executable, "-m", "routespec.adapters.dynamo.client_driver", endpoint],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env=dynamo_environment(store),
        )
        self.changed = threading.Condition()
        self.outcomes: dict[str, dict[str, object]] = {}
        self.opened: set[str] = set()
        self.received: dict[str, int] = {}  # items the client has read, per request
        self._instances: list[int] | None = None
        self.addresses: dict[int, str] = {}  # instance id -> transport address, as listed
        self._ready = False
        threading.Thread(target=self._read, name="dynamo-client", daemon=True).start()
        self.wait_for(lambda: self._ready, "the Dynamo client to start")

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            message = json.loads(line)
            with self.changed:
                op = message.get("op")
                if op == "ready":
                    self._ready = True
                elif op == "instances":
                    self._instances = list(message["ids"])
                    self.addresses = {int(k): str(v) for k, v in message["addresses"].items()}
                elif op == "opened":
                    self.opened.add(message["id"])
                elif op == "progress":
                    self.received[message["id"]] = message["items"]
                elif op == "outcome":
                    self.outcomes[message["id"]] = message
                self.changed.notify_all()

    @property
    def pid(self) -> int:
        """The client process's id (its response-stream server is among its listeners)."""
        return self._process.pid

    def send(self, command: Mapping[str, object]) -> None:
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps(command) + "\n")
        self._process.stdin.flush()

    def wait_for(self, condition: Callable[[], bool], what: str, limit: float = WAIT_LIMIT) -> bool:
        deadline = time.monotonic() + limit
        with self.changed:
            while not condition():
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._process.poll() is not None:
                    return False
                self.changed.wait(min(remaining, 0.05))
        return True

    def instances(self) -> list[int]:
        with self.changed:
            self._instances = None
        self.send({"op": "instances"})
        self.wait_for(lambda: self._instances is not None, "the instance list")
        return list(self._instances or [])

    def await_instances(self, present: set[int], absent: set[int] | None = None) -> None:
        """Poll until the client lists every id in ``present`` and none in ``absent``."""
        absent = absent or set()
        deadline = time.monotonic() + WAIT_LIMIT
        while time.monotonic() < deadline:
            listed = set(self.instances())
            if present <= listed and not listed & absent:
                return
            time.sleep(0.05)
        raise TimeoutError(f"the Dynamo client never listed {present} without {absent}")

    def await_address(self, instance_id: int, address: str) -> None:
        """Poll until the client lists ``instance_id`` at ``address`` (a changed record)."""
        deadline = time.monotonic() + WAIT_LIMIT
        while time.monotonic() < deadline:
            self.instances()
            if self.addresses.get(instance_id) == address:
                return
            time.sleep(0.05)
        raise TimeoutError(f"the Dynamo client never listed {instance_id} at {address}")

    def outcome(self, request_id: str) -> Outcome | None:
        with self.changed:
            message = self.outcomes.get(request_id)
        if message is None:
            return None
        items = message.get("items")
        error = message.get("error")
        observed = None
        if isinstance(error, dict):
            observed = observed_error(error, pre_stream=bool(message.get("pre_stream")))
        return Outcome(
            tuple(items) if isinstance(items, list) else (), observed, bool(message["dropped"])
        )

    def close(self) -> None:
        if self._process.stdin is not None:
            self._process.stdin.close()
        try:
            self._process.wait(5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        finally:
            if self._process.stdout is not None:
                self._process.stdout.close()
            self._log.close()
