"""Chaos for ``routespec router`` and the readers of discovery (issue 14), with real processes
on 127.0.0.1. Every wait is for an output line, bounded by ``LINE_TIMEOUT``; every case is
bounded in count.

No request ends silently:

- a request line the router cannot use (not UTF-8, not JSON, nested too deeply, over the
  message limit), drawn by Hypothesis from those classes, ends its own request with one
  ``InvalidArgument`` end line and no item, and the router goes on serving the requests
  around it; a JSON value that is not an object is a payload like any other;
- SIGINT and SIGTERM end every open request with one ``Cancelled`` end line after its
  items, and the router exits 130 and 143 (an internal error: ``test_swallowed_exceptions``).

Poisoned discovery records (DSC-013, DSC-014): records of every class of unusable value,
drawn at random (the seed is in the failure message), written under the endpoint's keys of
either store while a router streams from a healthy worker. The router, ``call`` and
``instances`` each print one warning per record naming it and the field at fault, list and
route to the healthy worker only, and every stream in flight completes exactly.
"""

from __future__ import annotations

import base64
import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routespec.discovery.file_store import MAX_RECORD_BYTES, write_atomic
from routespec.transport.frames import MAX_MESSAGE_BYTES
from tests.conftest import Backend
from tests.processes import LINE_TIMEOUT, commands, start_worker

PROMPT = [100, 101, 102]
Event = dict[str, object]


class Child:
    """A ``python -m routespec`` child whose stdout and stderr lines are both queued, so a
    test can wait for a line on either (bounded by ``LINE_TIMEOUT``)."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "routespec", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            preexec_fn=_foreground,
        )
        self.stdout: queue.Queue[str | None] = queue.Queue()
        self.stderr: queue.Queue[str | None] = queue.Queue()
        self.errors: list[str] = []  # every stderr line taken so far
        self._readers = [
            threading.Thread(target=self._read, args=(pipe, lines), daemon=True)
            for pipe, lines in (
                (self.process.stdout, self.stdout),
                (self.process.stderr, self.stderr),
            )
        ]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(pipe: object, lines: queue.Queue[str | None]) -> None:
        assert hasattr(pipe, "readline")
        for raw in iter(pipe.readline, b""):
            lines.put(raw.decode(errors="replace").rstrip("\n"))
        lines.put(None)

    def line(self) -> str:
        line = self._take(self.stdout)
        assert line is not None, f"stdout ended; stderr: {self.errors}"
        return line

    def event(self) -> Event:
        event: Event = json.loads(self.line())
        return event

    def error_line(self) -> str:
        line = self._take(self.stderr)
        assert line is not None, f"stderr ended; so far: {self.errors}"
        self.errors.append(line)
        return line

    def _take(self, lines: queue.Queue[str | None]) -> str | None:
        try:
            return lines.get(timeout=LINE_TIMEOUT)
        except queue.Empty:
            raise AssertionError(f"no line in {LINE_TIMEOUT} s; stderr: {self.errors}") from None

    def send(self, data: bytes) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(data)
        self.process.stdin.flush()

    def finish(self) -> int:
        """Close stdin, wait for the exit and take the rest of stderr; the exit status."""
        assert self.process.stdin is not None
        if not self.process.stdin.closed:
            self.process.stdin.close()
        status = self.process.wait(timeout=LINE_TIMEOUT)
        while (line := self._take(self.stderr)) is not None:
            self.errors.append(line)
        return status

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=LINE_TIMEOUT)
        for reader in self._readers:
            reader.join(timeout=LINE_TIMEOUT)
        for pipe in (self.process.stdin, self.process.stdout, self.process.stderr):
            if pipe is not None:
                pipe.close()


def _foreground() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # as from a terminal, even in a background run


@pytest.fixture
def children() -> Iterator[Callable[..., Child]]:
    started: list[Child] = []

    def start(*args: str) -> Child:
        started.append(Child(*args))
        return started[-1]

    try:
        yield start
    finally:
        for child in started:
            child.kill()


def _request(max_tokens: int, delay: float = 0.0) -> bytes:
    line = json.dumps({"token_ids": PROMPT, "max_tokens": max_tokens, "delay": delay})
    return line.encode() + b"\n"


def _tokens(max_tokens: int) -> list[int]:
    return list(range(len(PROMPT), len(PROMPT) + max_tokens))


@attrs.define
class Routed:
    """A router's output, by request number; numbers follow the non-blank lines sent."""

    router: Child
    sent: int = 0
    events: list[Event] = attrs.field(factory=list)

    def send(self, lines: list[bytes]) -> list[int]:
        self.router.send(b"".join(line.rstrip(b"\n") + b"\n" for line in lines))
        numbers = list(range(self.sent, self.sent + len(lines)))
        self.sent += len(lines)
        return numbers

    def ends(self) -> dict[int, Event]:
        ends = [e for e in self.events if "done" in e or "error" in e]
        by_number = {int(str(e["request"])): e for e in ends}
        assert len(by_number) == len(ends), f"a request with two end lines: {ends}"
        return by_number

    def until(self, done: Callable[[], bool]) -> None:
        while not done():
            self.events.append(self.router.event())

    def until_ended(self, numbers: list[int]) -> None:
        self.until(lambda: set(numbers) <= set(self.ends()))

    def items(self, number: int) -> list[object]:
        return [e["data"] for e in self.events if e["request"] == number and "data" in e]

    def tokens(self, number: int) -> list[int]:
        tokens: list[int] = []
        for item in self.items(number):
            assert isinstance(item, dict)
            tokens += item["token_ids"]
        return tokens

    def completed(self, number: int, max_tokens: int) -> None:
        assert self.ends()[number] == {"request": number, "done": True}, self.ends()[number]
        assert self.tokens(number) == _tokens(max_tokens)


def _open_router(start: Callable[..., Child], endpoint: str, spec: str) -> Routed:
    router = start("router", "--endpoint", endpoint, "--discovery", spec)
    assert json.loads(router.line()) == {"ready": True, "metrics": "-"}
    return Routed(router)


# --- request lines the router cannot use ---


@attrs.frozen
class Deployment:
    endpoint: str
    spec: str


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """One demo worker for this module's routers."""
    log_dir = tmp_path_factory.mktemp("chaos-router")
    endpoint = f"chaos{uuid.uuid4().hex[:6]}.tokens.generate"
    spec = f"file:{log_dir / 'kv'}"
    with commands(log_dir) as started:
        start_worker(started, log_dir, endpoint, spec)
        yield Deployment(endpoint, spec)


@pytest.fixture(scope="module")
def shared_router(deployment: Deployment) -> Iterator[Routed]:
    """One router that every generated example talks to: it must outlive them all."""
    router = Child("router", "--endpoint", deployment.endpoint, "--discovery", deployment.spec)
    try:
        assert json.loads(router.line()) == {"ready": True, "metrics": "-"}
        yield Routed(router)
        assert router.finish() == 0, router.errors
        assert not [line for line in router.errors if "Traceback" in line], router.errors
    finally:
        router.kill()


def _json_fails(text: bytes) -> bool:
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return True
    return False


def _blank(line: bytes) -> bool:
    return not line.strip()


@attrs.frozen
class Deep:
    """JSON nested ``depth`` levels: balanced lists, nested objects or unclosed lists (drawn
    as a small value, built as bytes only when sent)."""

    depth: int
    shape: str

    def line(self) -> bytes:
        if self.shape == "lists":
            return b"[" * self.depth + b"]" * self.depth
        if self.shape == "objects":
            return b'{"a":' * self.depth + b"1" + b"}" * self.depth
        return b"[" * self.depth


NOT_UTF8 = (
    st.binary(min_size=1, max_size=48)
    .map(lambda data: data.replace(b"\n", b"\xff"))
    .filter(lambda data: not _blank(data) and not _utf8(data))
)
NOT_JSON = (
    st.text(min_size=1, max_size=48)
    .map(lambda text: text.replace("\n", " ").encode())
    .filter(lambda data: not _blank(data) and _json_fails(data))
)
TOO_DEEP = st.builds(
    Deep, st.integers(2_000, 60_000), st.sampled_from(["lists", "objects", "unclosed"])
)
UNUSABLE_LINES = st.one_of(NOT_UTF8, NOT_JSON, TOO_DEEP)
MSGPACK_INTEGERS = st.integers(-(2**63), 2**64 - 1)  # a payload beyond them cannot be encoded
NOT_OBJECTS = st.one_of(
    st.none(),
    st.booleans(),
    MSGPACK_INTEGERS,
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
    st.lists(MSGPACK_INTEGERS, max_size=4),
).map(lambda value: json.dumps(value).encode())


def _bytes(line: bytes | Deep) -> bytes:
    return line.line() if isinstance(line, Deep) else line


def _utf8(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


@settings(max_examples=12)
@given(
    unusable=st.lists(UNUSABLE_LINES, min_size=1, max_size=4),
    values=st.lists(NOT_OBJECTS, max_size=2),
)
def test_a_line_that_is_no_request_ends_only_its_own(
    shared_router: Routed, unusable: list[bytes | Deep], values: list[bytes]
) -> None:
    """Unusable lines between two requests: each ends at once with InvalidArgument and no
    item, a non-object JSON value is routed like any payload, the requests around them
    complete exactly, and the router is still running."""
    routed = shared_router
    (before,) = routed.send([_request(3)])
    bad = routed.send([_bytes(line) for line in unusable])
    plain = routed.send(values)
    (after,) = routed.send([_request(3)])
    routed.until_ended([before, *bad, *plain, after])
    for number in (before, after):
        routed.completed(number, 3)
    for number, line in zip(bad, unusable, strict=True):
        end = routed.ends()[number]
        assert end["type"] == "InvalidArgument", (line, end)
        assert str(end["error"]).startswith("InvalidArgument: request line is "), end
        assert routed.items(number) == [], line
    for number in plain:
        assert routed.ends()[number] == {"request": number, "done": True}
    assert routed.router.process.poll() is None


def test_a_line_over_the_message_limit_ends_only_its_own(shared_router: Routed) -> None:
    """A request line of 33 MiB (the router never holds it whole) ends with InvalidArgument
    naming the limit; the requests around it complete."""
    routed = shared_router
    padding = "x" * (MAX_MESSAGE_BYTES + 1024 * 1024)
    huge = json.dumps({"token_ids": PROMPT, "max_tokens": 2, "pad": padding}).encode()
    before, oversized, after = routed.send([_request(3), huge, _request(3)])
    routed.until_ended([before, oversized, after])
    routed.completed(before, 3)
    routed.completed(after, 3)
    end = routed.ends()[oversized]
    assert end["type"] == "InvalidArgument", end
    assert f"over the {MAX_MESSAGE_BYTES}-byte limit" in str(end["error"]), end
    assert routed.router.process.poll() is None


def test_a_payload_over_the_limit_once_encoded_ends_only_its_own(
    deployment: Deployment, children: Callable[..., Child]
) -> None:
    """A line under the limit whose msgpack encoding is over it (floats take 9 bytes each)."""
    routed = _open_router(children, deployment.endpoint, deployment.spec)
    pad = ",".join(["1e15"] * 4_200_000)  # 5 bytes each as JSON, 9 as msgpack
    floats = f'{{"token_ids": {PROMPT}, "max_tokens": 2, "pad": [{pad}]}}'
    assert len(floats) < MAX_MESSAGE_BYTES < 9 * 4_200_000
    before, oversized, after = routed.send([_request(3), floats.encode(), _request(3)])
    routed.until_ended([before, oversized, after])
    assert routed.ends()[oversized]["type"] == "InvalidArgument", routed.ends()[oversized]
    routed.completed(after, 3)
    assert routed.router.finish() == 0


# --- signals ---


@pytest.mark.parametrize(
    ("signum", "status", "reason"),
    [
        (signal.SIGINT, 130, "interrupted (Ctrl-C)"),
        (signal.SIGTERM, 143, "terminated (SIGTERM)"),
    ],
    ids=["SIGINT", "SIGTERM"],
)
def test_a_signal_ends_every_open_request_after_its_items(
    deployment: Deployment,
    children: Callable[..., Child],
    signum: signal.Signals,
    status: int,
    reason: str,
) -> None:
    """Three long streams and a short one; the signal comes once the short one is done and
    the long ones have items: each long one gets one Cancelled end line after its items,
    stdout ends, and the exit status is 128 + the signal's number."""
    routed = _open_router(children, deployment.endpoint, deployment.spec)
    long = routed.send([_request(200, 0.05), _request(200, 0.05), _request(200, 0.05)])
    (short,) = routed.send([_request(1)])
    routed.until(lambda: short in routed.ends() and all(routed.items(n) for n in long))
    routed.router.process.send_signal(signum)
    routed.until_ended(long)
    assert routed.router.process.wait(timeout=LINE_TIMEOUT) == status
    assert routed.router.process.stdout is not None
    routed.completed(short, 1)
    for number in long:
        end = routed.ends()[number]
        assert end["type"] == "Cancelled", end
        assert str(end["error"]) == f"Cancelled: {reason} before the stream ended", end
        last_item = max(i for i, e in enumerate(routed.events) if e["request"] == number)
        assert routed.events[last_item] == end
    assert routed.router.finish() == status
    assert not any("Traceback" in line for line in routed.router.errors), routed.router.errors


def test_sigterm_ends_a_call_with_143_and_one_line(
    deployment: Deployment, children: Callable[..., Child]
) -> None:
    request = json.dumps({"token_ids": PROMPT, "max_tokens": 200, "delay": 0.05})
    call = children(
        "call", "--endpoint", deployment.endpoint, "--discovery", deployment.spec, request
    )
    assert json.loads(call.line()) == {"token_ids": [len(PROMPT)]}
    call.process.send_signal(signal.SIGTERM)
    assert call.finish() == 143
    assert call.errors == [
        "routespec: request failed: Cancelled: terminated (SIGTERM) before the stream ended"
    ]


# --- poisoned discovery records ---


@attrs.frozen
class Poison:
    """One unusable record: its key's last part, its value, and the field at fault."""

    kind: str
    key_id: str
    value: bytes
    field: str


def _document(endpoint: str, instance_id: int) -> dict[str, object]:
    namespace, component, name = endpoint.split(".")
    return {
        "type": "Endpoint",
        "namespace": namespace,
        "component": component,
        "endpoint": name,
        "instance_id": instance_id,
        "transport": {"tcp": f"127.0.0.1:4000/{instance_id:x}/{namespace}/{component}/{name}"},
        "device_type": "cuda",
        "request_plane_codec": "msgpack",
    }


WRONG_TYPES: list[object] = [None, True, 1.5, [], {}, -7]
_MISSING = object()
REQUIRED = ("type", "namespace", "component", "endpoint", "instance_id", "transport")


def _poisons(endpoint: str, rng: random.Random) -> list[Poison]:
    """One unusable record of each class, its values drawn from ``rng``."""
    poisons: list[Poison] = []

    def add(kind: str, field: str, **changes: object) -> None:
        instance_id = rng.getrandbits(64)
        document = {**_document(endpoint, instance_id), **changes}
        for name in [k for k, v in changes.items() if v is _MISSING]:
            del document[name]
        value = json.dumps(document).encode()
        poisons.append(Poison(kind, f"{instance_id:x}", value, field))

    word = "".join(rng.choices("abcdefghijklmnopqrstuvwxyz0123456789-", k=rng.randint(1, 12)))
    add("unknown codec", "request_plane_codec", request_plane_codec=f"x{word}")
    port = rng.choice([0, rng.randint(65_536, 10**9)])
    add("port out of range", "transport.tcp", transport={"tcp": f"127.0.0.1:{port}/p"})
    portless = rng.choice(["127.0.0.1/p", "127.0.0.1:/p", f"127.0.0.1:{word}z/p", ":/p"])
    add("address without a port", "transport.tcp", transport={"tcp": portless})
    add("address without a path", "transport.tcp", transport={"tcp": "127.0.0.1:4000"})
    add("unusable host", "transport.tcp", transport={"tcp": f"no host {word}:4000/p"})
    kind = rng.choice(["nats_tcp", "http", "grpc", word])
    add("another transport", "transport", transport={kind: "127.0.0.1:4000/p"})
    missing = rng.choice(REQUIRED)
    add(f"no {missing}", missing, **{missing: _MISSING})
    typed = rng.choice(["instance_id", "device_type", "request_plane_codec", "namespace"])
    wrong = rng.choice(WRONG_TYPES)
    add(f"{typed} of the wrong type", typed, **{typed: wrong})
    add("enormous", "record", pad="x" * (MAX_RECORD_BYTES + rng.randint(1, 10**6)))
    instance_id = rng.getrandbits(64)
    other = _document(endpoint, instance_id ^ 1)
    poisons.append(
        Poison("id unlike its key", f"{instance_id:x}", json.dumps(other).encode(), "instance_id")
    )
    poisons.append(Poison("not an object", f"{rng.getrandbits(64):x}", b"[1, 2]", "record"))
    return poisons


def _put(backend: Backend, endpoint: str, poison: Poison) -> str:
    """Store the poison under the endpoint's key; returns how warnings name the record."""
    key = "/".join((*endpoint.split("."), poison.key_id))
    if backend.etcd is not None:
        full = f"v1/instances/{key}"
        encoded = {"key": base64.b64encode(full.encode()).decode()}
        encoded["value"] = base64.b64encode(poison.value).decode()
        httpx.post(f"{backend.etcd.url}/v3/kv/put", json=encoded).raise_for_status()
        return full
    assert backend.root is not None
    path = backend.root / "v1/instances" / urllib.parse.quote(key, safe="")
    write_atomic(path, poison.value)
    return str(path)


def _warned(lines: list[str], record: str, field: str) -> list[str]:
    return [
        line
        for line in lines
        if line.startswith("routespec: warning: skipped discovery record ")
        and f" {record}: {field}: " in line
    ]


def test_poisoned_records_are_skipped_with_one_warning_each(
    backend: Backend, children: Callable[..., Child], tmp_path: Path
) -> None:
    seed = random.randrange(2**32)
    endpoint = f"poison{uuid.uuid4().hex[:6]}.tokens.generate"
    with commands(tmp_path) as started:
        start_worker(started, tmp_path, endpoint, backend.spec)
        routed = _open_router(children, endpoint, backend.spec)
        streams = routed.send([_request(80, 0.05)] * 4)
        routed.until(lambda: all(routed.items(n) for n in streams))
        poisons = {
            _put(backend, endpoint, poison): poison
            for poison in _poisons(endpoint, random.Random(seed))
        }
        for _ in poisons:
            routed.router.error_line()  # one warning per record, as the router reads it
        for record, poison in poisons.items():
            assert len(_warned(routed.router.errors, record, poison.field)) == 1, (
                seed,
                poison,
                routed.router.errors,
            )
        listed = _run("instances", "--endpoint", endpoint, "--discovery", backend.spec)
        called = _run(
            "call", "--endpoint", endpoint, "--discovery", backend.spec, _request(2).decode()
        )
        routed.until_ended(streams)
        for number in streams:
            routed.completed(number, 80)
        assert routed.router.finish() == 0
    for output in (listed, called):
        assert output.returncode == 0, (seed, output.stderr)
        lines = output.stderr.splitlines()
        for record, poison in poisons.items():
            assert len(_warned(lines, record, poison.field)) == 1, (seed, poison, lines)
        assert len(lines) == len(poisons), (seed, lines)
    assert listed.stdout.splitlines()[-1].endswith(": 1 discovered, 1 routable, 0 overloaded")
    assert called.stdout.splitlines() == [
        json.dumps({"token_ids": [len(PROMPT)]}),
        json.dumps({"token_ids": [len(PROMPT) + 1], "finish_reason": "length"}),
    ]
    assert len(routed.router.errors) == len(poisons), (seed, routed.router.errors)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "routespec", *args],
        capture_output=True,
        text=True,
        timeout=LINE_TIMEOUT,
        check=False,
    )
