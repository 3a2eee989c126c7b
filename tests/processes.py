"""``routespec`` sub-commands as child processes, read line by line with bounded waits."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LINE_TIMEOUT = 20.0  # generous: a loaded CI machine starts Python slowly


def _as_a_foreground_job() -> None:
    """Ctrl-C reaches the child as it would from a terminal, even when the test run itself
    was started in the background (where SIGINT is ignored and children inherit that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Command:
    """One ``python -m routespec ...`` child; stdout lines are queued by a reader thread."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.log = log
        with open(log, "wb") as errors:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "routespec", *args],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errors,
                text=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                preexec_fn=_as_a_foreground_job,
            )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def line(self) -> str:
        """The next stdout line; fails with the child's stderr if none comes in time."""
        try:
            line = self._lines.get(timeout=LINE_TIMEOUT)
        except queue.Empty:
            line = None
        if line is None:
            raise AssertionError(f"no output from {self.process.args!r}: {self.stderr()}")
        return line

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def send(self, text: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(text)
        self.process.stdin.flush()

    def close_stdin(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()

    def signal(self, signum: signal.Signals) -> None:
        self.process.send_signal(signum)

    def wait(self) -> int:
        return self.process.wait(timeout=LINE_TIMEOUT)

    def finish(self) -> None:
        """Kill the child if it still runs, and release its pipes."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=LINE_TIMEOUT)
        self._reader.join(timeout=LINE_TIMEOUT)
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()


@contextmanager
def commands(log_dir: Path) -> Iterator[list[Command]]:
    """Children started into the yielded list are all killed at the end of the block."""
    started: list[Command] = []
    try:
        yield started
    finally:
        for command in started:
            command.finish()


def start(started: list[Command], log_dir: Path, *args: str) -> Command:
    command = Command(list(args), log_dir / f"command-{len(started)}.log")
    started.append(command)
    return command


def start_worker(
    started: list[Command], log_dir: Path, endpoint: str, spec: str, *extra: str
) -> tuple[Command, int]:
    """A demo worker; returns it with its instance id once it reports itself ready."""
    worker = start(
        started,
        log_dir,
        "worker",
        "--endpoint",
        endpoint,
        "--handler",
        "routespec.deploy.demo:tokens",
        "--discovery",
        spec,
        *extra,
    )
    ready = worker.line()
    assert ready.startswith("ready instance="), ready
    return worker, int(ready.split()[1].removeprefix("instance="), 16)
