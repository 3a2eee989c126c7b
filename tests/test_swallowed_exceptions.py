"""No cleanup path in the reference can swallow an exception (issue 14).

Two tests. The static scan reads every module of ``reference/routespec`` with ``ast`` and
fails on the shapes that lose an exception on its way out:

- ``cancel-then-await``: a handler or ``finally:`` that cancels a scope (``x.cancel()``) and
  then awaits outside a shield. The await raises ``Cancelled``, which replaces the exception
  being handled; the cancelled scope then absorbs the ``Cancelled``, and the original
  exception is gone (a ``KeyboardInterrupt`` or an internal error becomes a clean exit);
- ``unshielded-await``: a ``finally:``, or a handler that re-raises, awaiting outside a
  shield: a cancellation arriving meanwhile (a timeout, a sibling's failure) replaces the
  exception in flight the same way;
- ``broad-except``: ``except:``, or ``except``/``except*`` of ``BaseException``,
  ``Exception`` or an exception group, whose body neither raises nor uses the exception it
  caught (to log it, keep it for later, or turn it into a typed error);
- ``broad-suppress``: ``contextlib.suppress`` of ``Exception``, ``BaseException``,
  ``trio.Cancelled``, ``KeyboardInterrupt`` or an exception group;
- ``jump-in-finally``: ``return``, ``break`` or ``continue`` in a ``finally:`` block, which
  discards the exception in flight.

A shield is a ``with`` whose items include ``CancelScope(shield=True)`` or a trio timeout
called with ``shield=True``. Each allowed instance is listed in ``ALLOWED`` with the reason
it cannot lose an exception.

The behavioural test runs a real router whose request handling raises an unexpected
exception (injected in the child process) and checks that it ends with a non-zero status,
an end line for every request it accepted and an error line naming the exception.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import pytest
import trio

from tests.processes import commands, start, start_worker

PACKAGE = Path(__file__).resolve().parents[1] / "reference" / "routespec"
BROAD = {"BaseException", "Exception", "BaseExceptionGroup", "ExceptionGroup"}
BROAD_SUPPRESS = BROAD | {"Cancelled", "KeyboardInterrupt"}
TIMEOUTS = {"move_on_after", "move_on_at", "fail_after", "fail_at", "CancelScope"}


@attrs.frozen
class Finding:
    path: str  # relative to reference/routespec
    function: str  # the enclosing function's qualified name
    pattern: str
    line: int

    def key(self) -> tuple[str, str, str]:
        return self.path, self.function, self.pattern

    def __str__(self) -> str:
        return f"{self.path}:{self.line} in {self.function}: {self.pattern}"


# (path, function, pattern): why the instance cannot lose an exception. Empty: every
# instance found so far was fixed. An entry needs a reason in a comment above it, and goes
# when the code it excuses does (the test fails on an entry that matches nothing).
ALLOWED: dict[tuple[str, str, str], str] = {}


def _name(node: ast.expr) -> str:
    """The last name of ``x``, ``a.b.x`` or ``x(...)``."""
    if isinstance(node, ast.Call):
        return _name(node.func)
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


def _caught(handler: ast.ExceptHandler) -> set[str]:
    if handler.type is None:
        return {"BaseException"}
    types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return {_name(kind) for kind in types}


def _shields(node: ast.With | ast.AsyncWith) -> bool:
    for item in node.items:
        call = item.context_expr
        if isinstance(call, ast.Call) and _name(call) in TIMEOUTS:
            for keyword in call.keywords:
                if (
                    keyword.arg == "shield"
                    and isinstance(keyword.value, ast.Constant)
                    and keyword.value.value is True
                ):
                    return True
    return False


def _walk_unshielded(statements: list[ast.stmt]) -> Iterator[ast.AST]:
    """Every node of ``statements`` outside shields and nested functions, in source order."""
    stack: list[ast.AST] = list(reversed(statements))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            continue
        if isinstance(node, ast.With | ast.AsyncWith) and _shields(node):
            continue
        yield node
        stack.extend(reversed(list(ast.iter_child_nodes(node))))


def _awaits(node: ast.AST) -> bool:
    return isinstance(node, ast.Await | ast.AsyncWith | ast.AsyncFor)


def _cancels(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and _name(node) == "cancel" and not node.args


def _raises(statements: list[ast.stmt]) -> bool:
    return any(isinstance(node, ast.Raise) for node in _walk_unshielded(statements))


def _uses(handler: ast.ExceptHandler) -> bool:
    """The handler reads the exception it bound (``except E as name``)."""
    return handler.name is not None and any(
        isinstance(node, ast.Name) and node.id == handler.name
        for statement in handler.body
        for node in ast.walk(statement)
    )


def _jumps(statements: list[ast.stmt]) -> Iterator[ast.stmt]:
    """``return`` anywhere in ``statements``, and ``break``/``continue`` outside loops."""
    for statement in statements:
        if isinstance(statement, ast.Return | ast.Break | ast.Continue):
            yield statement
        elif isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        elif isinstance(statement, ast.For | ast.AsyncFor | ast.While):
            yield from (
                node
                for node in _walk_unshielded(statement.body + statement.orelse)
                if isinstance(node, ast.Return)
            )
        else:
            for field in ("body", "orelse", "finalbody", "handlers"):
                for child in getattr(statement, field, []):
                    if isinstance(child, ast.ExceptHandler):
                        yield from _jumps(child.body)
                    elif isinstance(child, ast.stmt):
                        yield from _jumps([child])


def _cleanup_findings(statements: list[ast.stmt], reraises: bool) -> Iterator[tuple[str, ast.AST]]:
    cancelled = False
    for node in _walk_unshielded(statements):
        if _cancels(node):
            cancelled = True
        elif _awaits(node):
            if cancelled:
                yield "cancel-then-await", node
            elif reraises:
                yield "unshielded-await", node
            return


class Scanner(ast.NodeVisitor):
    def __init__(self, path: str) -> None:
        self.path = path
        self.scope: list[str] = []
        self.findings: list[Finding] = []

    def _add(self, pattern: str, node: ast.AST) -> None:
        function = ".".join(self.scope) or "<module>"
        self.findings.append(Finding(self.path, function, pattern, getattr(node, "lineno", 0)))

    def _nested(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = _nested
    visit_AsyncFunctionDef = _nested
    visit_ClassDef = _nested

    def _try(self, node: ast.Try | ast.TryStar) -> None:
        for handler in node.handlers:
            broad = _caught(handler) & BROAD
            if broad and not _raises(handler.body) and not _uses(handler):
                self._add("broad-except", handler)
            reraises = any(
                isinstance(n, ast.Raise) and n.exc is None for n in _walk_unshielded(handler.body)
            )
            for pattern, at in _cleanup_findings(handler.body, reraises):
                self._add(pattern, at)
        for pattern, at in _cleanup_findings(node.finalbody, reraises=True):
            self._add(pattern, at)
        for jump in _jumps(node.finalbody):
            self._add("jump-in-finally", jump)
        self.generic_visit(node)

    visit_Try = _try
    visit_TryStar = _try

    def visit_With(self, node: ast.With | ast.AsyncWith) -> None:
        for item in node.items:
            call = item.context_expr
            if (
                isinstance(call, ast.Call)
                and _name(call) == "suppress"
                and {_name(arg) for arg in call.args} & BROAD_SUPPRESS
            ):
                self._add("broad-suppress", node)
        self.generic_visit(node)

    visit_AsyncWith = visit_With


def scan(source: str, path: str) -> list[Finding]:
    scanner = Scanner(path)
    scanner.visit(ast.parse(source))
    return scanner.findings


def _package_findings() -> list[Finding]:
    findings = []
    for module in sorted(PACKAGE.rglob("*.py")):
        path = module.relative_to(PACKAGE).as_posix()
        findings += scan(module.read_text(encoding="utf-8"), path)
    return findings


def test_no_cleanup_path_can_swallow_an_exception() -> None:
    findings = _package_findings()
    found = [str(f) for f in findings if f.key() not in ALLOWED]
    assert not found, "cleanup paths that can lose an exception:\n" + "\n".join(found)
    stale = set(ALLOWED) - {f.key() for f in findings}
    assert not stale, f"allowlist entries that match nothing (remove them): {sorted(stale)}"


SWALLOWING = {
    "cancel-then-await": """
        async def f(nursery, stream):
            try:
                yield
            finally:
                nursery.cancel_scope.cancel()
                await stream.aclose()
    """,
    "unshielded-await": """
        async def f(stream):
            try:
                await stream.send(b"x")
            except BaseException:
                await stream.aclose()
                raise
    """,
    "broad-except": """
        async def f(work):
            try:
                await work()
            except BaseException:
                pass
    """,
    "broad-suppress": """
        import contextlib
        def f(work):
            with contextlib.suppress(Exception):
                work()
    """,
    "jump-in-finally": """
        def f(work):
            try:
                return work()
            finally:
                return None
    """,
}
SAFE = """
    import trio
    async def f(nursery, stream, work, log):
        try:
            await work()
        except Exception as error:
            log.warning("work failed: %s", error)
        try:
            yield
        finally:
            nursery.cancel_scope.cancel()
            with trio.CancelScope(shield=True):
                await stream.aclose()
        try:
            await work()
        except BaseException:
            with trio.move_on_after(1, shield=True):
                await stream.aclose()
            raise
        for attempt in range(3):
            try:
                await work()
            finally:
                for item in range(2):
                    continue
"""


@pytest.mark.parametrize("pattern", list(SWALLOWING))
def test_the_scan_finds_each_pattern(pattern: str) -> None:
    """The scan itself: each shape is found, and its shielded form is not."""
    found = {f.pattern for f in scan(textwrap.dedent(SWALLOWING[pattern]), "example.py")}
    assert found == {pattern}
    assert scan(textwrap.dedent(SAFE), "safe.py") == []


# --- the behaviour: an unexpected exception in a router's request handling ---

ENDPOINT = "swallow.tokens.generate"
INJECTED = "injected into the router's request handling"
INJECTION = f"""
from routespec.transport import tcp_dispatch

_generate = tcp_dispatch.TcpDispatch.generate


class Exploding:
    \"\"\"A response stream that raises an unexpected exception after ``left`` items.\"\"\"

    def __init__(self, stream, left):
        self.stream, self.left = stream, left

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self.left == 0:
            raise RuntimeError({INJECTED!r})
        self.left -= 1
        return await self.stream.__anext__()

    async def aclose(self):
        await self.stream.aclose()


async def generate(self, instance, request):
    stream = await _generate(self, instance, request)
    payload = request.payload
    left = payload.get("explode_after") if isinstance(payload, dict) else None
    return stream if left is None else Exploding(stream, left)


tcp_dispatch.TcpDispatch.generate = generate
"""


def _request(max_tokens: int, **extra: object) -> str:
    return json.dumps({"token_ids": [1, 2], "max_tokens": max_tokens, "delay": 0.05, **extra})


def test_an_exception_in_request_handling_ends_the_router_loudly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two long streams run; a third request's stream raises RuntimeError after two items
    (injected in the router process, below migration and the routing host). The router ends
    with exit status 70 and ``routespec: internal error: RuntimeError: ...`` on stderr, after
    one end line of type Unknown for each request, after its items."""
    spec = f"file:{tmp_path / 'kv'}"
    with commands(tmp_path) as started:
        start_worker(started, tmp_path, ENDPOINT, spec)
        injection = tmp_path / "injection"
        injection.mkdir()
        (injection / "sitecustomize.py").write_text(INJECTION, encoding="utf-8")
        path = os.pathsep.join(filter(None, [str(injection), os.environ.get("PYTHONPATH")]))
        monkeypatch.setenv("PYTHONPATH", path)  # the router's environment, not the worker's
        router = start(started, tmp_path, "router", "--endpoint", ENDPOINT, "--discovery", spec)
        assert json.loads(router.line())["ready"] is True
        router.send(_request(60) + "\n" + _request(60) + "\n")
        events: list[dict[str, object]] = []
        while {e["request"] for e in events if "data" in e} != {0, 1}:
            events.append(json.loads(router.line()))
        router.send(_request(60, explode_after=2) + "\n")
        while len(_ends(events)) < 3:
            events.append(json.loads(router.line()))
        assert router.wait() == 70, router.stderr()
    ends = _ends(events)
    for number in (0, 1, 2):
        assert ends[number]["type"] == "Unknown", ends[number]
        assert INJECTED in str(ends[number]["error"]), ends[number]
        items = [i for i, e in enumerate(events) if e["request"] == number and "data" in e]
        assert items, f"request {number} streamed nothing: {events}"
        assert max(items) < events.index(ends[number]), events
    assert len([e for e in events if e["request"] == 2 and "data" in e]) == 2
    first = router.log.read_text(encoding="utf-8").splitlines()[0]
    assert first == f"routespec: internal error: RuntimeError: {INJECTED}", router.stderr()


def _ends(events: list[dict[str, object]]) -> dict[object, dict[str, object]]:
    ends = [e for e in events if "done" in e or "error" in e]
    by_number = {e["request"]: e for e in ends}
    assert len(by_number) == len(ends), f"a request with two end lines: {ends}"
    return by_number


def test_a_swallowed_failure_is_still_reported(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The router's last line of defence, in process: when a layer below swallows the
    exception that ended a request (the routing stack's context returns normally), the
    router still ends the request with an end line and fails with that exception."""
    from routespec.deploy.cli import calls

    class Swallowing:
        async def stream(self, payload: object, on_item: object) -> None:
            raise RuntimeError(INJECTED)

    @asynccontextmanager
    async def swallowing_caller(*_: object) -> AsyncIterator[object]:
        try:
            yield Swallowing()
        except BaseException:  # the defect this guards against: the exception vanishes
            return

    monkeypatch.setattr(calls, "open_caller", swallowing_caller)
    read, write = os.pipe()
    os.write(write, b'{"a": 1}\n')
    os.close(write)
    with open(read, encoding="utf-8") as stdin:
        monkeypatch.setattr(sys, "stdin", stdin)
        args = argparse.Namespace(metrics_port=None, metrics_host=None)
        with pytest.raises(RuntimeError, match=INJECTED):
            trio.run(calls.router, args)
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines[-1] == {
        "request": 0,
        "error": f"Unknown: {calls.ROUTER_FAILED}: RuntimeError: {INJECTED}",
        "type": "Unknown",
    }


def test_a_swallowed_failure_of_the_input_loop_is_still_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same, when what fails is the router's reading of its input: the router did not
    reach the end of its input, so it fails instead of exiting 0."""
    from routespec.deploy.cli import calls
    from routespec.deploy.cli.usage import InternalError

    @asynccontextmanager
    async def swallowing_caller(*_: object) -> AsyncIterator[object]:
        try:
            yield object()
        except BaseException:  # the defect this guards against: the exception vanishes
            return

    async def broken(self: object) -> None:
        raise RuntimeError(INJECTED)

    monkeypatch.setattr(calls, "open_caller", swallowing_caller)
    monkeypatch.setattr(calls.StdinLines, "next", broken)
    read, write = os.pipe()
    os.close(write)
    with open(read, encoding="utf-8") as stdin:
        monkeypatch.setattr(sys, "stdin", stdin)
        args = argparse.Namespace(metrics_port=None, metrics_host=None)
        with pytest.raises(InternalError, match="before the end of its input"):
            trio.run(calls.router, args)
