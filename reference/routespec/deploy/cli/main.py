"""Argument parsing for the ``routespec`` command (argparse: the standard library suffices).

Every bad argument, and a discovery store that cannot be reached, ends the command with one
line naming the argument at fault and exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import NoReturn

import trio

from routespec.deploy.cli.calls import MODES, call, router
from routespec.deploy.cli.conformance import run_conformance
from routespec.deploy.cli.instances import list_instances
from routespec.deploy.cli.usage import UsageError
from routespec.deploy.cli.worker import serve_worker
from routespec.discovery.file_store import DEFAULT_TTL, split_endpoint
from routespec.discovery.store import DiscoveryError
from routespec.transport.connection import LOOPBACK

USAGE_EXIT = 2
INTERRUPTED_EXIT = 130
FAILURES = (UsageError, DiscoveryError)


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """One line, not argparse's usage block: the message names the argument."""
        self.exit(USAGE_EXIT, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def endpoint(value: str) -> str:
    try:
        return "/".join(split_endpoint(value))
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def instance_id(value: str) -> int:
    try:
        return int(value, 16)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a hex instance id as 'routespec instances' prints it, got {value!r}"
        ) from None


def port(value: str) -> int:
    number = int(value) if value.isdigit() else -1
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port 0-65535, got {value!r}")
    return number


def seconds(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not number >= 0:
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {value!r}")
    return number


def non_negative(value: str) -> int:
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value!r}")
    return int(value)


def _discovery_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--endpoint", required=True, type=endpoint, help="ns.comp.endpoint (or ns/comp/endpoint)"
    )
    parser.add_argument(
        "--discovery",
        metavar="file:DIR|etcd:URL",
        help="discovery store (default: the file store in $DYN_FILE_KV or $TMPDIR/dynamo_store_kv)",
    )
    parser.add_argument(
        "--ttl",
        type=seconds,
        default=DEFAULT_TTL,
        help="liveness TTL in seconds: a worker's etcd lease; file records older than this are "
        "dead, so give every process of a file store the same value (default %(default)s)",
    )


def _metrics_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metrics-port", type=port, help="serve Prometheus /metrics on this port")
    parser.add_argument("--metrics-host", default=LOOPBACK, help="default %(default)s")


def _routing_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mode", choices=sorted(MODES), default="round-robin")
    parser.add_argument("--instance", type=instance_id, help="the worker for --mode direct (hex)")
    parser.add_argument(
        "--migration-limit",
        type=non_negative,
        default=3,
        help="retries on other workers per request (default %(default)s)",
    )
    parser.add_argument(
        "--host", default=LOOPBACK, help="where workers dial back with responses (%(default)s)"
    )


Runner = Callable[[argparse.Namespace], Awaitable[int | None]]


def build_parser() -> Parser:
    parser = Parser(prog="routespec", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    worker = commands.add_parser("worker", help="serve an async-generator handler")
    _discovery_options(worker)
    worker.add_argument("--handler", required=True, help="module:function, an async generator")
    worker.add_argument("--host", default=LOOPBACK, help="bind and advertise (%(default)s)")
    worker.add_argument("--port", type=port, default=0, help="request-plane port (0: any free)")
    worker.add_argument("--device-type", default="cuda", help="as discovery lists it (cuda, cpu)")
    worker.add_argument(
        "--grace-period",
        type=seconds,
        default=10.0,
        help="seconds open streams get to finish after SIGTERM/SIGINT (default %(default)s)",
    )
    _metrics_options(worker)
    worker.set_defaults(run=serve_worker)

    one = commands.add_parser("call", help="stream one request through the router")
    _discovery_options(one)
    _routing_options(one)
    one.add_argument("request", help="the request payload, JSON")
    one.set_defaults(run=call)

    many = commands.add_parser("router", help="route JSON-lines requests from stdin")
    _discovery_options(many)
    _routing_options(many)
    _metrics_options(many)
    many.set_defaults(run=router)

    listing = commands.add_parser("instances", help="list an endpoint's workers")
    _discovery_options(listing)
    listing.add_argument(
        "--wait", type=non_negative, default=0, help="first wait until N instances are discovered"
    )
    listing.add_argument(
        "--timeout", type=seconds, default=30.0, help="for --wait (default %(default)s)"
    )
    listing.set_defaults(run=list_instances)

    suite = commands.add_parser("conformance", help="run the conformance suite")
    suite.add_argument("--adapter", required=True, help="reference, reference-tcp, module:ADAPTER")
    suite.add_argument("--req", help="only checks citing these ids (DSP-001,DSP-002)")
    suite.add_argument("--hypothesis-profile", default="default")
    suite.add_argument("--report", help="report path (default reports/ADAPTER.json)")
    suite.add_argument("--verbose", action="store_true", help="show pytest's own output")
    suite.set_defaults(run=run_conformance)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "conformance":  # a subprocess, not a trio program
            return run_conformance(args)
        runner: Runner = args.run
        status: int | None = trio.run(runner, args)
        return status or 0
    except KeyboardInterrupt:
        return INTERRUPTED_EXIT
    except FAILURES as failure:
        return _fail(parser, failure)
    except BaseExceptionGroup as group:
        matched, rest = group.split(FAILURES)
        if matched is None or rest is not None:
            raise
        return _fail(parser, _first_leaf(matched))


def _first_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first


def _fail(parser: Parser, failure: BaseException) -> int:
    print(f"{parser.prog}: error: {failure}", file=sys.stderr)
    return USAGE_EXIT
