"""A small client for an OpenAI-compatible router: streamed ``/v1/completions`` over HTTP.

Nothing here is Dynamo's: any router that accepts a completion request whose ``prompt`` is a
list of token ids and streams Server-Sent Events can be driven by it. A request runs in a
thread; the caller reads what arrived so far, waits for its end, or drops it (closes the
connection, as a client that goes away does).

Token ids come back as text: the adapters' tiny tokenizer spells token ``n`` as the word
``t<n>`` (see ``tiny_model``), so each streamed chunk's text reads back as its token ids.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import socket
import threading
import time
from collections.abc import Callable, Mapping

import attrs

from routespec.testing.target import ObservedError

WORD = re.compile(r"t(\d+)")

STATUS_CLASS = {
    400: "InvalidRequest",
    404: "InvalidRequest",
    413: "InvalidRequest",
    422: "InvalidRequest",
    429: "CapacityExhausted",
    499: "Cancelled",
    500: "Internal",
    501: "Internal",
    503: "Unavailable",
    504: "DeadlineExceeded",
    529: "CapacityExhausted",
}
"""The normalised class (spec ERR-003) an HTTP status code stands for."""


@attrs.frozen
class CompletionRequest:
    """One streamed completion: the prompt's token ids, budgets, and routing extras."""

    model: str
    prompt: tuple[int, ...]
    max_tokens: int
    min_tokens: int | None = None
    n: int | None = None
    nvext: Mapping[str, object] = attrs.field(factory=dict)
    headers: Mapping[str, str] = attrs.field(factory=dict)
    extra: Mapping[str, object] = attrs.field(factory=dict)

    def body(self) -> bytes:
        document: dict[str, object] = {
            "model": self.model,
            "prompt": list(self.prompt),
            "max_tokens": self.max_tokens,
            "stream": True,
            **self.extra,
        }
        if self.min_tokens:
            document["min_tokens"] = self.min_tokens
        if self.n is not None:
            document["n"] = self.n
        if self.nvext:
            document["nvext"] = dict(self.nvext)
        return json.dumps(document).encode()


def tokens_of(text: str) -> list[int]:
    return [int(match) for match in WORD.findall(text)]


def error_from_body(status: int, body: bytes, *, pre_stream: bool) -> ObservedError:
    """An error the router answered with: its status (or SSE event) and message."""
    text = body.decode("utf-8", "replace").strip()
    message = text
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        document = json.loads(text)
        inner = document.get("error", document) if isinstance(document, dict) else document
        if isinstance(inner, dict):
            message = str(inner.get("message") or inner.get("error") or text)
            code = inner.get("code")
            if isinstance(code, int) and not status:
                status = code
        elif isinstance(inner, str):
            message = inner
    return ObservedError(
        ((None, message),),
        pre_stream,
        error_class=STATUS_CLASS.get(status),
        types_observed=False,
    )


class StreamCall:
    """A completion request in flight; ``items`` grow as chunks arrive."""

    def __init__(
        self,
        host: str,
        port: int,
        request: CompletionRequest,
        on_change: Callable[[], None],
    ) -> None:
        self.request = request
        self.items: list[dict[str, object]] = []
        self.error: ObservedError | None = None
        self.status: int | None = None
        self.dropped = False
        self.done = threading.Event()
        self.response_id: str | None = None
        self._on_change = on_change
        self._connection = http.client.HTTPConnection(host, port, timeout=300)
        self._thread = threading.Thread(target=self._run, name="http-stream", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._exchange()
        except (OSError, http.client.HTTPException, ValueError) as failure:
            if not self.dropped and self.error is None:
                self.error = ObservedError(
                    ((None, f"connection failed: {failure}"),),
                    not self.items,
                    types_observed=False,
                )
        finally:
            with contextlib.suppress(OSError):
                self._connection.close()
            self.done.set()
            self._on_change()

    def _exchange(self) -> None:
        body = self.request.body()
        connection = self._connection
        connection.putrequest("POST", "/v1/completions")
        headers = {"content-type": "application/json", **self.request.headers}
        for name, value in headers.items():
            connection.putheader(name, value.encode())  # UTF-8, not http.client's latin-1
        connection.putheader("content-length", str(len(body)))
        connection.endheaders(body)
        response = self._connection.getresponse()
        self.status = response.status
        if response.status != 200:
            self.error = error_from_body(response.status, response.read(), pre_stream=True)
            return
        event = "message"
        data: list[str] = []
        while True:
            raw = response.fp.readline() if response.fp is not None else b""
            if not raw:
                return
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())
            elif not line and data:
                if self._dispatch(event, "\n".join(data)):
                    return
                event, data = "message", []

    def _dispatch(self, event: str, data: str) -> bool:
        """Handle one SSE event; True once the stream is over."""
        if data == "[DONE]":
            return True
        if event == "error" or '"error"' in data[:20]:
            # an error event before any item: the call failed before its stream began
            self.error = error_from_body(0, data.encode(), pre_stream=not self.items)
            self._on_change()
            return True
        chunk = json.loads(data)
        if self.response_id is None and isinstance(chunk.get("id"), str):
            self.response_id = chunk["id"]
        for choice in chunk.get("choices") or []:
            item: dict[str, object] = {"token_ids": tokens_of(str(choice.get("text") or ""))}
            finish = choice.get("finish_reason")
            item["finish_reason"] = finish
            if choice.get("index"):
                item["choice"] = choice["index"]
            if item["token_ids"] or finish is not None:
                self.items.append(item)
        self._on_change()
        return False

    def drop(self) -> None:
        """The client goes away: close the connection under the reader."""
        self.dropped = True
        sock = self._connection.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self.done.wait(10)


def get(host: str, port: int, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def wait_for_model(host: str, port: int, model: str, limit: float) -> bool:
    """Poll ``/v1/models`` until ``model`` is listed (bounded)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError, http.client.HTTPException):
            status, body = get(host, port, "/v1/models")
            if status == 200:
                listed = {entry.get("id") for entry in json.loads(body).get("data", [])}
                if model in listed:
                    return True
        time.sleep(0.05)
    return False


def metrics(host: str, port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """``/metrics`` as {(name, labels): value} (Prometheus text format, no histograms)."""
    status, body = get(host, port, "/metrics")
    found: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    if status != 200:
        return found
    sample = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?\s+(\S+)$")
    label = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
    for line in body.decode("utf-8", "replace").splitlines():
        matched = sample.match(line)
        if matched is None or line.startswith("#"):
            continue
        labels = frozenset(label.findall(matched.group(3) or ""))
        with contextlib.suppress(ValueError):
            found[(matched.group(1), labels)] = float(matched.group(4))
    return found


def metric(
    samples: Mapping[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= set(ls))


def post_completion(
    host: str, port: int, request: CompletionRequest, timeout: float = 30.0
) -> tuple[int, bytes]:
    """One non-streamed ``/v1/completions`` exchange: its status and body."""
    document = json.loads(request.body())
    document["stream"] = False
    body = json.dumps(document).encode()
    connection = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        connection.putrequest("POST", "/v1/completions")
        headers = {"content-type": "application/json", **request.headers}
        for name, value in headers.items():
            connection.putheader(name, value.encode())
        connection.putheader("content-length", str(len(body)))
        connection.endheaders(body)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()
