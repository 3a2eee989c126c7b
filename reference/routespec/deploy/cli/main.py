"""Argument parsing for the ``routespec`` command (argparse: the standard library suffices).

Every bad argument, and every resource a command cannot use at start-up (a discovery store,
a port, a host, a handler module), ends the command with one line naming the argument at
fault and exit code 2; SIGINT (Ctrl-C) ends it with exit code 130 and SIGTERM, for ``call``
and ``router``, with 143. An internal error (a bug) is one line ``routespec: internal error:
...``, then its traceback, and exit code 70. Warnings (a skipped discovery record) are one
line each on stderr. Nothing here imports an optional extra: ``--help``, ``--version`` and
the file store work with the core install.
"""

from __future__ import annotations

import argparse
import logging
import sys
import textwrap
import traceback
from collections.abc import Awaitable, Callable, Iterator, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import NoReturn

import trio

from routespec.deploy.cli.calls import INTERRUPTED_EXIT, MODE_ALIASES, MODES, call, router
from routespec.deploy.cli.conformance import add_parser as add_conformance_parser
from routespec.deploy.cli.conformance import run_conformance
from routespec.deploy.cli.instances import list_instances
from routespec.deploy.cli.usage import INTERNAL_ERROR_EXIT, USAGE_EXIT, UsageError
from routespec.deploy.cli.worker import add_limit_options, serve_worker
from routespec.discovery.file_store import DEFAULT_TTL, split_endpoint
from routespec.discovery.store import DiscoveryError
from routespec.routing.selection import RouterMode
from routespec.transport.connection import LOOPBACK

FAILURES = (UsageError, DiscoveryError)
WIDTH = 78
LOGGERS = "routespec"  # the package's loggers, whose warnings the command prints

DESCRIPTION = (
    "routespec runs small deployments of the routespec reference router, which routes "
    "streamed LLM-inference requests the way NVIDIA Dynamo does, and checks runtimes "
    "against the routespec specification.",
    "Workers serve an async-generator handler and register in a discovery store (a "
    "directory on one host, or etcd); 'call' and 'router' send requests through the "
    "reference routing host, which picks a worker by a routing mode and moves a stream "
    "that fails mid-way to another worker; 'conformance' runs the conformance suite "
    "against an adapter of your runtime.",
)
OVERVIEW_EXAMPLE = """\
example: two workers (each in its own terminal, or in the background with &),
a wait until discovery lists both, and one request:
  routespec worker --endpoint demo.tokens.generate --handler routespec.deploy.demo:tokens
  routespec worker --endpoint demo.tokens.generate --handler routespec.deploy.demo:tokens
  routespec instances --endpoint demo.tokens.generate --wait 2
  routespec call --endpoint demo.tokens.generate '{"token_ids": [1, 2], "max_tokens": 3}'

Run 'routespec COMMAND --help' for a command's options and an example."""

MODE_HELP = {
    RouterMode.ROUND_ROBIN: "each free worker in turn (the default)",
    RouterMode.RANDOM: "a uniformly random free worker",
    RouterMode.POWER_OF_TWO_CHOICES: "the less loaded of two random free workers",
    RouterMode.LEAST_LOADED: "a free worker with the fewest requests in flight",
    RouterMode.DEVICE_AWARE_WEIGHTED: "least loaded in a device group picked by load budget",
    RouterMode.KV: "the cheapest worker by cached prompt prefix and load",
    RouterMode.DIRECT: "the worker --instance names; never migrated",
}
MODES_EPILOG = "routing modes (--mode):\n" + "\n".join(
    f"  {name:23}{MODE_HELP[mode]}" for name, mode in MODES.items()
)


def _text(*paragraphs: str) -> str:
    """Paragraphs filled to the help's width (the parsers print descriptions as written)."""
    return "\n\n".join(
        textwrap.fill(paragraph, WIDTH, break_on_hyphens=False) for paragraph in paragraphs
    )


def _version() -> str:
    try:
        return version("routespec")
    except PackageNotFoundError:  # imported from a source tree that was never installed
        return "unknown"


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


def positive_seconds(value: str) -> float:
    number = seconds(value)
    if number == 0:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {value!r}")
    return number


def non_negative(value: str) -> int:
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value!r}")
    return int(value)


def mode_name(value: str) -> str:
    """The spec's name of a mode; an old spelling (``p2c``) is accepted, never shown."""
    return MODE_ALIASES.get(value, value)


def _discovery_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--endpoint",
        required=True,
        type=endpoint,
        metavar="NS.COMPONENT.ENDPOINT",
        help="the endpoint to serve or call, e.g. demo.tokens.generate (or ns/comp/endpoint)",
    )
    parser.add_argument(
        "--discovery",
        metavar="file:DIR|etcd:URL",
        help="where workers register and routers find them: file:DIR (one host) or "
        "etcd:http://HOST:PORT (several hosts; needs the 'etcd' extra). Default: the file "
        "store in $DYN_FILE_KV, else $TMPDIR/dynamo_store_kv",
    )
    parser.add_argument(
        "--ttl",
        type=positive_seconds,
        default=DEFAULT_TTL,
        metavar="SECONDS",
        help="liveness TTL: a worker's etcd lease; file records older than this are dead, so "
        "give every process of a file store the same value (default %(default)s)",
    )


def _metrics_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--metrics-port",
        type=port,
        metavar="PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (0: any free port; needs "
        "the 'metrics' extra). Default: no metrics",
    )
    parser.add_argument(
        "--metrics-host",
        default=LOOPBACK,
        metavar="HOST",
        help="the address the metrics server binds (default %(default)s)",
    )


def _routing_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--mode",
        type=mode_name,
        choices=list(MODES),
        default=RouterMode.ROUND_ROBIN.value,
        metavar="MODE",
        help="how the router picks a worker: " + ", ".join(MODES) + " (default %(default)s; "
        "see 'routing modes' below)",
    )
    parser.add_argument(
        "--instance",
        type=instance_id,
        metavar="ID",
        help="the worker for --mode direct: its hex id, as 'routespec instances' prints it",
    )
    parser.add_argument(
        "--migration-limit",
        type=non_negative,
        default=3,
        metavar="N",
        help="how many times a request that fails mid-stream may continue on another worker "
        "(default %(default)s; 0: never)",
    )
    parser.add_argument(
        "--host",
        default=LOOPBACK,
        help="the address workers dial back to deliver responses; on several hosts, one the "
        "workers can reach (default %(default)s)",
    )


Runner = Callable[[argparse.Namespace], Awaitable[int | None]]


def _command(
    commands: argparse._SubParsersAction[Parser],
    name: str,
    summary: str,
    description: str,
    epilog: str,
) -> Parser:
    return commands.add_parser(
        name,
        help=summary,
        description=description,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def build_parser() -> Parser:
    parser = Parser(
        prog="routespec",
        description=_text(*DESCRIPTION),
        epilog=OVERVIEW_EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"%(prog)s {_version()}",
        help="print the version and exit",
    )
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", title="commands"
    )

    worker = _command(
        commands,
        "worker",
        "serve an async-generator handler as a worker",
        _text(
            "Serve an async-generator function as a worker of an endpoint: listen for "
            "requests (Dynamo 1.6.1's TCP request plane), register in the discovery store, "
            "and print 'ready instance=<hex id> address=<address> metrics=<url or ->'.",
            "On SIGTERM or Ctrl-C the worker first withdraws its record, so routers stop "
            "choosing it, then refuses new requests and gives open streams --grace-period "
            "seconds to finish; streams still open then end with Backend(EngineShutdown), "
            "which routers migrate to another worker.",
        ),
        "example:\n  routespec worker --endpoint demo.tokens.generate "
        "--handler routespec.deploy.demo:tokens --metrics-port 9464",
    )
    _discovery_options(worker)
    worker.add_argument(
        "--handler",
        required=True,
        metavar="MODULE:FUNCTION",
        help="the async generator function to serve: it takes the request payload and yields "
        "the response items; imported from the current directory or the installed packages",
    )
    worker.add_argument(
        "--host", default=LOOPBACK, help="the address to bind and advertise (default %(default)s)"
    )
    worker.add_argument(
        "--port", type=port, default=0, help="the request-plane port (default 0: any free port)"
    )
    worker.add_argument(
        "--device-type",
        default="cuda",
        metavar="DEVICE",
        help="the device discovery lists for this worker, e.g. cuda or cpu (default "
        "%(default)s; device-aware-weighted routing sets cpu workers apart)",
    )
    worker.add_argument(
        "--grace-period",
        type=seconds,
        default=10.0,
        metavar="SECONDS",
        help="how long open streams may run on after SIGTERM or Ctrl-C (default %(default)s)",
    )
    _metrics_options(worker)
    add_limit_options(worker)
    worker.set_defaults(run=serve_worker)

    one = _command(
        commands,
        "call",
        "stream one request through the router",
        _text(
            "Send one request through the reference routing host to a worker of the "
            "endpoint and print each response item as a JSON line. A stream that fails "
            "mid-way continues on another worker (migration, at most --migration-limit "
            "times), and no item is repeated or lost.",
            "Exit status: 0 when the stream completes; 1 when a typed error ends it (printed "
            "on stderr as 'routespec: request failed: <type>: <message>'); 2 for a bad "
            "argument or an unusable discovery store or host; 130 on Ctrl-C and 143 on "
            "SIGTERM (the request ends as Cancelled); 70 for an internal error.",
        ),
        "examples:\n"
        "  routespec call --endpoint demo.tokens.generate "
        '\'{"token_ids": [1, 2, 3], "max_tokens": 5}\'\n'
        "  routespec call --endpoint demo.tokens.generate --mode direct --instance 3f2a9c01 "
        '\'{"token_ids": [7], "max_tokens": 2}\'\n\n' + MODES_EPILOG,
    )
    _discovery_options(one)
    _routing_options(one)
    one.add_argument("request", metavar="REQUEST", help="the request payload, a JSON value")
    one.set_defaults(run=call)

    many = _command(
        commands,
        "router",
        "route JSON-lines requests from stdin",
        _text(
            "Route the requests read from standard input, one JSON request per line, each "
            "sent as soon as it is read; N numbers the non-empty lines from 0.",
            'Output, as JSON lines: {"ready": true, "metrics": <url or "-">} once the router '
            'runs, then {"request": N, "data": <item>} for each response item, and one end '
            'line per request: {"request": N, "done": true}, or {"request": N, "error": '
            '<message>, "type": <error type>} when a typed error ends it. A line that is not '
            "a request (not UTF-8, not JSON, nested too deeply, over 32 MiB) ends at once "
            'with type "InvalidArgument"; the router goes on.',
            "The router exits 0 once standard input is closed and every request has ended. "
            'On Ctrl-C or SIGTERM it writes an end line of type "Cancelled" for each open '
            "request and exits 130 or 143; on an internal error, an end line of type "
            '"Unknown" for each, an error line on stderr, and exit status 70.',
        ),
        "example:\n"
        "  printf '%s\\n' '{\"token_ids\": [1], \"max_tokens\": 2}' "
        "| routespec router --endpoint demo.tokens.generate\n\n" + MODES_EPILOG,
    )
    _discovery_options(many)
    _routing_options(many)
    _metrics_options(many)
    many.set_defaults(run=router)

    listing = _command(
        commands,
        "instances",
        "list an endpoint's workers",
        _text(
            "List the endpoint's workers as discovery shows them: the instance id (hex, what "
            "--instance takes), address, device, payload codec, whether a router may route "
            "to it and whether it is overloaded; then a summary line.",
            "With --wait N it first waits until N workers are discovered, and exits 2 if "
            "they are not within --timeout seconds.",
        ),
        "example:\n  routespec instances --endpoint demo.tokens.generate --wait 2",
    )
    _discovery_options(listing)
    listing.add_argument(
        "--wait",
        type=non_negative,
        default=0,
        metavar="N",
        help="first wait until N workers are discovered (default 0: list at once)",
    )
    listing.add_argument(
        "--timeout",
        type=seconds,
        default=30.0,
        metavar="SECONDS",
        help="how long --wait waits before it fails (default %(default)s)",
    )
    listing.set_defaults(run=list_instances)

    add_conformance_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _print_warnings(parser.prog)
    try:
        if args.command == "conformance":  # a subprocess, not a trio program
            return run_conformance(args)
        runner: Runner = args.run
        status: int | None = trio.run(runner, args)
        return status or 0
    except (KeyboardInterrupt, BaseExceptionGroup, Exception) as failure:
        return _exit_status(parser, failure)


def _exit_status(parser: Parser, failure: BaseException) -> int:
    """Report what ended a command and return its exit status: Ctrl-C before the command took
    it over is 130; a bad argument or an unusable resource is one line naming it, exit 2;
    anything else is an internal error."""
    leaves = list(_leaves(failure))
    if all(isinstance(leaf, KeyboardInterrupt) for leaf in leaves):
        return INTERRUPTED_EXIT
    if all(isinstance(leaf, (*FAILURES, KeyboardInterrupt)) for leaf in leaves):
        usage = next(leaf for leaf in leaves if isinstance(leaf, FAILURES))
        print(f"{parser.prog}: error: {usage}", file=sys.stderr)
        return USAGE_EXIT
    bug = next(leaf for leaf in leaves if not isinstance(leaf, (*FAILURES, KeyboardInterrupt)))
    print(f"{parser.prog}: internal error: {type(bug).__name__}: {bug}", file=sys.stderr)
    traceback.print_exception(failure, file=sys.stderr)
    return INTERNAL_ERROR_EXIT


def _leaves(failure: BaseException) -> Iterator[BaseException]:
    if isinstance(failure, BaseExceptionGroup):
        for inner in failure.exceptions:
            yield from _leaves(inner)
    else:
        yield failure


class _Warnings(logging.Handler):
    """Each warning of the package's loggers as one line on the current stderr."""

    def __init__(self, prog: str) -> None:
        super().__init__(logging.WARNING)
        self.prog = prog

    def emit(self, record: logging.LogRecord) -> None:
        line = " ".join(record.getMessage().split())  # one line, whatever the message holds
        print(f"{self.prog}: {record.levelname.lower()}: {line}", file=sys.stderr, flush=True)


def _print_warnings(prog: str) -> None:
    logger = logging.getLogger(LOGGERS)
    if not any(isinstance(handler, _Warnings) for handler in logger.handlers):
        logger.addHandler(_Warnings(prog))
