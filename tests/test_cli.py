"""The ``routespec`` command: argument errors, and small deployments of real processes.

End to end: three demo workers and a router (``routespec router``) as child processes; one
worker is killed with SIGKILL mid-stream and every request must still deliver each of its
tokens exactly once (migrated), with either discovery backend. Waits are for readiness lines
and stream items, never for time.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from routespec.deploy.cli.main import main
from tests.conftest import Backend
from tests.etcd_server import free_port
from tests.processes import Command, commands, start, start_worker

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


def _instances(spec: str) -> str:
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
        check=True,
    )
    return completed.stdout.strip()
