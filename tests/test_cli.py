"""The ``routespec`` command: its help, argument errors, and small deployments of real
processes.

End to end: three demo workers and a router (``routespec router``) as child processes; one
worker is killed with SIGKILL mid-stream and every request must still deliver each of its
tokens exactly once (migrated), with either discovery backend. Ctrl-C (SIGINT) ends ``call``
and ``router`` with exit 130 and, for the router, an end line per open request. Without the
optional extras (simulated by a ``sitecustomize`` that blocks their imports) the file-store
commands still run and the options that need them fail in one line. Waits are for readiness
lines and stream items, never for time.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from importlib.metadata import version
from pathlib import Path

import httpx
import pytest

from routespec.conformance.scenario import MODE_CAPABILITY
from routespec.deploy.cli.calls import MODES
from routespec.deploy.cli.main import build_parser, main
from routespec.routing.selection import RouterMode
from tests.conftest import Backend
from tests.etcd_server import free_port
from tests.processes import LINE_TIMEOUT, Command, commands, start, start_worker

ENDPOINT = "e2e.tokens.generate"
PROMPT = [100, 101, 102, 103, 104]
MAX_TOKENS = 60
DELAY = 0.05  # seconds per token: 3 s streams, long enough to be killed mid-stream
REQUESTS = 6


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["call", "--endpoint", "x", "{}"], "argument --endpoint"),
        (["call", "--endpoint", "a.b.c", "--mode", "device-aware", "{}"], "argument --mode"),
        (["call", "--endpoint", "a.b.c", "--instance", "zz", "{}"], "argument --instance"),
        (["call", "--endpoint", "a.b.c", "--migration-limit", "-1", "{}"], "--migration-limit"),
        (["call", "--endpoint", "a.b.c", "--mode", "direct", "{}"], "--instance"),
        (["call", "--endpoint", "a.b.c", "--instance", "1f", "{}"], "--instance"),
        (["call", "--endpoint", "a.b.c", "{nope"], "request"),
        (["call", "--endpoint", "a.b.c", "--discovery", "zk:x", "{}"], "--discovery"),
        (["worker", "--endpoint", "a.b.c", "--handler", "no_such_module:f"], "--handler"),
        (["worker", "--endpoint", "a.b.c", "--handler", "json:dumps"], "--handler"),
        (["worker", "--endpoint", "a.b.c", "--handler", "x", "--port", "70000"], "--port"),
        (["instances", "--endpoint", "a.b.c", "--ttl", "soon"], "argument --ttl"),
        (["instances", "--endpoint", "a.b.c", "--ttl", "0"], "argument --ttl"),
        (["router", "--endpoint", "a.b.c", "--metrics-port", "x"], "argument --metrics-port"),
        (["call", "--endpoint", "a.b.c", "--mode", "p2", "{}"], "argument --mode"),
        (["conformance"], "--adapter"),
    ],
)
def test_a_bad_argument_exits_2_with_one_line_naming_it(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        raise SystemExit(main(argv))
    assert exited.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert named in lines[0]


COMMANDS = ("worker", "call", "router", "instances")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (commands,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(commands.choices)


def test_version_prints_the_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"routespec {version('routespec')}\n"


def test_the_help_says_what_the_tool_does_and_lists_the_commands() -> None:
    text = build_parser().format_help()
    assert text.splitlines()[2].startswith("routespec runs small deployments")
    assert "argparse" not in text  # not the module docstring
    for command in (*COMMANDS, "conformance"):
        assert f"    {command}" in text


@pytest.mark.parametrize("command", [*COMMANDS, "conformance"])
def test_each_command_has_a_description_an_example_and_help_for_every_option(
    command: str,
) -> None:
    parser = _subparsers(build_parser())[command]
    assert parser.description
    assert parser.epilog is not None
    assert "example" in parser.epilog
    assert f"routespec {command} " in parser.epilog
    undocumented = [a.dest for a in parser._actions if not a.help]
    assert undocumented == []


@pytest.mark.parametrize("command", ["call", "router"])
def test_the_help_lists_every_mode_by_its_spec_name(command: str) -> None:
    text = _subparsers(build_parser())[command].format_help()
    for mode in RouterMode:
        assert f"  {mode.value} " in text
    assert "p2c" not in text


def test_the_cli_names_modes_as_the_spec_and_the_suite_do() -> None:
    """One name per mode: RouterMode's values, which the conformance suite uses too."""
    assert set(MODES) == {mode.value for mode in RouterMode}
    assert all(MODES[name].value == name for name in MODES)
    assert set(MODE_CAPABILITY) <= set(MODES)


def test_the_old_p2c_spelling_is_still_accepted() -> None:
    args = build_parser().parse_args(["call", "--endpoint", "a.b.c", "--mode", "p2c", "{}"])
    assert args.mode == RouterMode.POWER_OF_TWO_CHOICES.value


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield int(taken.getsockname()[1])


@pytest.mark.parametrize("option", ["--port", "--metrics-port"])
def test_a_port_in_use_is_blamed_on_its_option(
    option: str, taken_port: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["worker", "--endpoint", "a.b.c", "--handler", "routespec.deploy.demo:tokens"]
    argv += ["--discovery", f"file:{tmp_path / 'kv'}", option, str(taken_port)]
    assert main(argv) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"routespec: error: {option}: cannot listen on 127.0.0.1:{taken_port}")


def test_unreachable_etcd_exits_2_naming_discovery(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["instances", "--endpoint", "a.b.c", "--discovery", f"etcd:{url}"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"routespec: error: --discovery: etcd at {url} is unreachable")


def _request_line() -> str:
    return json.dumps({"token_ids": PROMPT, "max_tokens": MAX_TOKENS, "delay": DELAY}) + "\n"


def _metrics(url: str) -> dict[str, float]:
    """Samples of the routespec_* metrics, by name with labels."""
    samples = {}
    for line in httpx.get(url).text.splitlines():
        if line.startswith("routespec_"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def _start_router(
    started: list[Command], tmp_path: Path, spec: str, *extra: str
) -> tuple[Command, str]:
    """A ``routespec router`` with metrics; returns it and its metrics URL once ready."""
    router = start(
        started,
        tmp_path,
        "router",
        "--endpoint",
        ENDPOINT,
        "--discovery",
        spec,
        "--metrics-port",
        "0",
        *extra,
    )
    return router, json.loads(router.line())["metrics"]


def _route(
    router: Command, count: int, when_streaming: Callable[[], None], line: str | None = None
) -> list[list[int]]:
    """Send ``count`` demo requests (``line``, by default the usual prompt) and collect each
    one's tokens until all are done; ``when_streaming`` runs once every request has its
    first token."""
    router.send((line or _request_line()) * count)
    tokens: dict[int, list[int]] = {}  # by the router's request number
    done: set[int] = set()
    streaming = False
    while len(done) < count:
        event = json.loads(router.line())
        assert "error" not in event, event
        if event.get("done"):
            done.add(event["request"])
            continue
        tokens.setdefault(event["request"], []).extend(event["data"]["token_ids"])
        if not streaming and len(tokens) == count:
            streaming = True
            when_streaming()
    return [tokens.get(number, []) for number in sorted(done)]


EXPECTED = list(range(len(PROMPT), len(PROMPT) + MAX_TOKENS))


def _start_workers(
    started: list[Command], tmp_path: Path, spec: str, count: int, *extra: str
) -> dict[int, Command]:
    """Demo workers by instance id; the lowest id is round robin's first pick."""
    workers = {}
    for _ in range(count):
        worker, instance_id = start_worker(started, tmp_path, ENDPOINT, spec, *extra)
        workers[instance_id] = worker
    return workers


def test_a_worker_killed_mid_stream_loses_no_token(backend: Backend, tmp_path: Path) -> None:
    """3 workers, 6 round-robin streams (2 per worker); SIGKILL the worker with the lowest id
    once every stream has its first token: each request still ends with the full token
    sequence, none repeated or lost, and the router's metrics count the migrations."""
    with commands(tmp_path) as started:
        workers = _start_workers(started, tmp_path, backend.spec, 3)
        router, metrics_url = _start_router(started, tmp_path, backend.spec)
        victim = workers[min(workers)]
        tokens = _route(router, REQUESTS, lambda: victim.signal(signal.SIGKILL))
        metrics = _metrics(metrics_url)
        router.close_stdin()
        assert router.wait() == 0, router.stderr()
    assert tokens == [EXPECTED] * REQUESTS
    assert metrics['routespec_router_requests_completed_total{outcome="ok"}'] == REQUESTS
    assert metrics["routespec_router_migrations_total"] >= 2
    dispatches = sum(
        v for k, v in metrics.items() if k.startswith("routespec_router_dispatches_total")
    )
    assert dispatches == REQUESTS + metrics["routespec_router_migrations_total"]
    assert metrics["routespec_router_requests_inflight"] == 0


def test_the_kv_policy_sends_a_repeated_prompt_to_the_worker_that_has_it(
    tmp_path: Path,
) -> None:
    """``--mode kv`` routes through the routing host's KV policy: the second of two identical
    prompts, sent after the first finished, goes to the worker the first one went to."""
    spec = f"file:{tmp_path / 'kv'}"
    with commands(tmp_path) as started:
        _start_workers(started, tmp_path, spec, 2)
        router, metrics_url = _start_router(started, tmp_path, spec, "--mode", "kv")
        prompt = list(range(32))  # two full KV blocks of 16 tokens
        line = json.dumps({"token_ids": prompt, "max_tokens": MAX_TOKENS}) + "\n"
        expected = [list(range(32, 32 + MAX_TOKENS))]
        assert _route(router, 1, lambda: None, line) == expected
        assert _route(router, 1, lambda: None, line) == expected
        metrics = _metrics(metrics_url)
        router.close_stdin()
        assert router.wait() == 0, router.stderr()
    per_worker = [
        v for k, v in metrics.items() if k.startswith("routespec_router_dispatches_total")
    ]
    assert per_worker == [2.0], metrics


def test_sigterm_deregisters_first_then_finishes_open_streams(tmp_path: Path) -> None:
    """SIGTERM mid-stream: the record goes at once, the open stream still completes on the
    same worker (no migration) within the grace period, then the worker exits 0."""
    spec = f"file:{tmp_path / 'kv'}"
    with commands(tmp_path) as started:
        workers = _start_workers(started, tmp_path, spec, 1, "--grace-period", "60")
        (worker,) = workers.values()
        router, metrics_url = _start_router(started, tmp_path, spec)
        listed: list[str] = []

        def terminate() -> None:
            worker.signal(signal.SIGTERM)
            assert worker.line() == "deregistered"
            listed.append(_instances(spec))

        tokens = _route(router, 1, terminate)
        assert worker.wait() == 0
        assert worker.line() == "stopped"
        metrics = _metrics(metrics_url)
    assert tokens == [EXPECTED]
    assert metrics["routespec_router_migrations_total"] == 0
    assert listed[0].endswith("0 discovered, 0 routable, 0 overloaded")


def test_streams_outliving_the_grace_period_migrate(tmp_path: Path) -> None:
    """SIGTERM with no grace: the worker's open streams end with Backend(EngineShutdown),
    which callers migrate; every token still arrives exactly once."""
    spec = f"file:{tmp_path / 'kv'}"
    with commands(tmp_path) as started:
        workers = _start_workers(started, tmp_path, spec, 2, "--grace-period", "0")
        router, metrics_url = _start_router(started, tmp_path, spec)
        leaving = workers[min(workers)]
        tokens = _route(router, 2, lambda: leaving.signal(signal.SIGTERM))
        metrics = _metrics(metrics_url)
        assert leaving.wait() == 0
    assert tokens == [EXPECTED] * 2
    assert metrics["routespec_router_migrations_total"] == 1
    assert metrics['routespec_router_requests_completed_total{outcome="ok"}'] == 2


def _instances(spec: str, env: dict[str, str] | None = None) -> str:
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "routespec",
            "instances",
            "--endpoint",
            ENDPOINT,
            "--discovery",
            spec,
        ],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return completed.stdout.strip()


def _long_request(max_tokens: int = MAX_TOKENS) -> str:
    return json.dumps({"token_ids": PROMPT, "max_tokens": max_tokens, "delay": DELAY})


def _assert_no_traceback(command: Command) -> None:
    assert "Traceback" not in command.stderr(), command.stderr()


def test_a_stopped_worker_ends_a_call_instead_of_hanging_it(tmp_path: Path) -> None:
    """A SIGSTOPped worker still completes TCP connects (the kernel does) but never ACKs:
    the caller's ACK deadline (TMO-002, 5 s by default) fails the attempt, the worker is
    reported down and, with no other worker, the call ends with a typed error (before the
    deadlines it waited forever). The subprocess timeout only guards against that hang."""
    spec = f"file:{tmp_path / 'kv'}"
    with commands(tmp_path) as started:
        worker, _ = start_worker(started, tmp_path, ENDPOINT, spec)
        os.kill(worker.process.pid, signal.SIGSTOP)
        try:
            done = subprocess.run(
                [sys.executable, "-m", "routespec", "call", "--endpoint", ENDPOINT,
                 "--discovery", spec, json.dumps({"token_ids": PROMPT, "max_tokens": 2})],
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
        finally:
            os.kill(worker.process.pid, signal.SIGCONT)
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("routespec: request failed: "), done.stderr
    assert "caused by: " in done.stderr, done.stderr
    assert "ConnectionTimeout" in done.stderr, done.stderr
    assert done.stdout == "", done.stdout


def test_ctrl_c_ends_a_call_with_130_and_no_traceback(tmp_path: Path) -> None:
    spec = f"file:{tmp_path / 'kv'}"
    with commands(tmp_path) as started:
        _start_workers(started, tmp_path, spec, 1)
        call = start(
            started, tmp_path, "call", "--endpoint", ENDPOINT, "--discovery", spec,
            _long_request(),
        )  # fmt: skip
        assert json.loads(call.line())["token_ids"] == [len(PROMPT)]  # mid-stream
        call.signal(signal.SIGINT)
        assert call.wait() == 130
    _assert_no_traceback(call)


def test_ctrl_c_ends_every_open_router_request_then_exits_130(tmp_path: Path) -> None:
    """Two long streams and a short one; Ctrl-C once the short one is done and both long
    ones have items: each long one gets one end line of type Cancelled, after its items,
    and the router exits 130."""
    spec = f"file:{tmp_path / 'kv'}"
    with commands(tmp_path) as started:
        _start_workers(started, tmp_path, spec, 2)
        router = start(started, tmp_path, "router", "--endpoint", ENDPOINT, "--discovery", spec)
        assert json.loads(router.line()) == {"ready": True, "metrics": "-"}
        router.send("\n".join([_long_request(), _long_request(1), _long_request(), ""]))
        events: list[dict[str, object]] = []
        streaming: set[object] = set()
        while not ({0, 2} <= streaming and 1 in _ended(events)):
            events.append(json.loads(router.line()))
            if "data" in events[-1]:
                streaming.add(events[-1]["request"])
        router.signal(signal.SIGINT)
        while len(_ended(events)) < 3:
            events.append(json.loads(router.line()))
        assert router.wait() == 130
        with pytest.raises(AssertionError, match="no output"):
            router.line()  # stdout ended: no line after the end lines
    _assert_no_traceback(router)
    ends = _ended(events)
    assert ends[1] == {"request": 1, "done": True}
    for number in (0, 2):
        assert ends[number]["type"] == "Cancelled", ends[number]
        assert str(ends[number]["error"]).startswith("Cancelled: "), ends[number]
        last_item = max(i for i, e in enumerate(events) if e["request"] == number and "data" in e)
        assert events.index(ends[number]) > last_item


def _ended(events: list[dict[str, object]]) -> dict[object, dict[str, object]]:
    """End lines by request number; fails if a request has two."""
    ends = [e for e in events if "done" in e or "error" in e]
    by_number = {e["request"]: e for e in ends}
    assert len(by_number) == len(ends), ends
    return by_number


LAST_OF_TWO = '{"token_ids": [6], "finish_reason": "length"}'
BLOCKER = """\
import sys

for name in ("httpx", "prometheus_client"):  # as if the extras were not installed
    sys.modules[name] = None
"""


@pytest.fixture
def without_extras(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """An environment whose Python processes cannot import httpx or prometheus-client: a
    ``sitecustomize`` on PYTHONPATH blocks them in every child, pytest's included."""
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(BLOCKER, encoding="utf-8")
    path = os.pathsep.join(filter(None, [str(blocker), os.environ.get("PYTHONPATH")]))
    monkeypatch.setenv("PYTHONPATH", path)
    return {**os.environ, "PYTHONPATH": path}


def _routespec(
    env: dict[str, str], *args: str, cwd: Path | None = None, timeout: float = LINE_TIMEOUT
) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-m", "routespec", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=timeout,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("args", "option", "extra"),
    [
        (["worker", "--handler", "routespec.deploy.demo:tokens", "--metrics-port", "0"],
         "--metrics-port", "metrics"),
        (["router", "--metrics-port", "0"], "--metrics-port", "metrics"),
        (["instances", "--discovery", "etcd:http://127.0.0.1:1"], "--discovery", "etcd"),
    ],
)  # fmt: skip
def test_an_option_needing_a_missing_extra_names_it_in_one_line(
    args: list[str], option: str, extra: str, without_extras: dict[str, str]
) -> None:
    code, output = _routespec(without_extras, *args, "--endpoint", "a.b.c")
    assert code == 2
    (line,) = output.splitlines()
    assert line.startswith(f"routespec: error: {option}: "), line
    assert line.endswith(f"needs the '{extra}' extra: pip install 'routespec[{extra}]'"), line


def test_the_core_commands_run_without_the_extras(
    without_extras: dict[str, str], tmp_path: Path
) -> None:
    """--version, --help, a worker, call, router and instances on the file store, and a
    filtered conformance run (from an empty directory), with httpx and prometheus-client
    impossible to import."""
    assert _routespec(without_extras, "--version")[0] == 0
    assert _routespec(without_extras, "--help")[0] == 0
    spec = f"file:{tmp_path / 'kv'}"
    request = json.dumps({"token_ids": PROMPT, "max_tokens": 2})
    with commands(tmp_path) as started:
        _start_workers(started, tmp_path, spec, 1)
        code, output = _routespec(
            without_extras, "call", "--endpoint", ENDPOINT, "--discovery", spec, request
        )
        assert (code, output.splitlines()) == (0, ['{"token_ids": [5]}', LAST_OF_TWO])
        router = start(started, tmp_path, "router", "--endpoint", ENDPOINT, "--discovery", spec)
        assert json.loads(router.line()) == {"ready": True, "metrics": "-"}
        router.send(request + "\n")
        router.close_stdin()
        lines = [json.loads(router.line()) for _ in range(3)]
        assert router.wait() == 0, router.stderr()
        listed = _instances(spec, env=without_extras)
    assert lines[-1] == {"request": 0, "done": True}
    assert listed.endswith("1 discovered, 1 routable, 0 overloaded"), listed
    empty = tmp_path / "empty"  # as a user runs it: the checkout's tests/ need the extras
    empty.mkdir()
    code, output = _routespec(
        without_extras, "conformance", "--adapter", "reference", "--req", "SEL-006",
        "--report", str(tmp_path / "report.json"), cwd=empty, timeout=300,
    )  # fmt: skip
    assert code == 0, output


# --- start-up failures: one line naming the argument or resource, exit 2 (issue 14) ---

LONG_LABEL = "a" * 64 + ".example"  # IDNA refuses a label over 63 characters
SYNTAX_ERROR = "async def tokens(request):\n    yield (\n"
RAISES_ON_IMPORT = "raise RuntimeError('the module fails as it is imported')\n"
DEMO = "routespec.deploy.demo:tokens"


def _startup_cases() -> list[tuple[list[str], str]]:
    """(argv after the command's name, the option the one line must name); ``{kv}`` is a
    usable store, ``{file}`` a regular file."""
    cases: list[tuple[list[str], str]] = []
    for command, extra in (("router", []), ("call", ["{}"]), ("instances", [])):
        base = [command, "--endpoint", "a.b.c"]
        cases += [
            ([*base, "--discovery", "file:{file}/kv", *extra], "--discovery"),
            ([*base, "--discovery", "{kv}", "--ttl", "inf", *extra], "--ttl"),
        ]
        if command != "instances":
            cases.append(([*base, "--discovery", "{kv}", "--host", LONG_LABEL, *extra], "--host"))
    worker = ["worker", "--endpoint", "a.b.c", "--discovery", "{kv}", "--handler"]
    cases += [
        ([*worker, "broken_syntax:tokens"], "--handler"),
        ([*worker, "raises_on_import:tokens"], "--handler"),
        ([*worker, ".relative:tokens"], "--handler"),
        ([*worker, DEMO, "--device-type", "gp u"], "--device-type"),
        (["worker", "--endpoint", "a.b.c", "--discovery", "file:{file}/kv", "--handler", DEMO],
         "--discovery"),
    ]  # fmt: skip
    return cases


def _startup_argv(argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Modules that fail to import in the working directory, a file where a store's
    directory should be, and ``argv`` with ``{kv}`` and ``{file}`` filled in."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the worker adds the working directory
    (tmp_path / "broken_syntax.py").write_text(SYNTAX_ERROR, encoding="utf-8")
    (tmp_path / "raises_on_import.py").write_text(RAISES_ON_IMPORT, encoding="utf-8")
    (tmp_path / "a-file").write_text("", encoding="utf-8")
    filled = {"{kv}": f"file:{tmp_path / 'kv'}", "{file}": str(tmp_path / "a-file")}
    return [
        arg.replace("{file}", filled["{file}"]) if "{file}" in arg else filled.get(arg, arg)
        for arg in argv
    ]


@pytest.mark.parametrize(("argv", "option"), _startup_cases())
def test_a_startup_failure_is_one_line_naming_its_argument(
    argv: list[str],
    option: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A host the response plane cannot bind, a store under a file or with a ttl of inf, a
    handler module that does not compile, raises or is relative, a device type no watcher
    would accept: exit 2 and one line ``routespec: error: <option>: ...``, no traceback."""
    assert main(_startup_argv(argv, tmp_path, monkeypatch)) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"routespec: error: {option}: "), lines[0]


@pytest.mark.parametrize(
    "argv",
    [
        ["router", "--endpoint", "a.b.c", "--discovery", "{kv}", "--metrics-port", "0",
         "--metrics-host", LONG_LABEL],
        ["worker", "--endpoint", "a.b.c", "--discovery", "{kv}", "--handler", DEMO,
         "--host", LONG_LABEL],
    ],
    ids=["router-metrics-host", "worker-host"],
)  # fmt: skip
def test_a_host_name_that_cannot_be_encoded_is_one_line(
    argv: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(_startup_argv(argv, tmp_path, monkeypatch)) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"routespec: error: {argv[-2]}: "), line


def test_an_internal_error_is_a_line_a_traceback_and_exit_70(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An exception no command expects (here ``instances`` fails inside) is reported as
    ``routespec: internal error: <type>: <message>`` first, then its traceback."""
    from routespec.deploy.cli import instances

    def broken(*_: object) -> object:
        raise ZeroDivisionError("injected")

    monkeypatch.setattr(instances, "open_store", broken)
    assert main(["instances", "--endpoint", "a.b.c"]) == 70
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "routespec: internal error: ZeroDivisionError: injected", lines
    assert "Traceback (most recent call last):" in lines[1], lines


def test_a_router_metrics_port_in_use_is_one_line(
    taken_port: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["router", "--endpoint", "a.b.c", "--discovery", f"file:{tmp_path / 'kv'}"]
    assert main([*argv, "--metrics-port", str(taken_port)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(
        f"routespec: error: --metrics-port: cannot listen on 127.0.0.1:{taken_port}"
    )
