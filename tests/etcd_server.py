"""A throw-away etcd server for tests: 127.0.0.1, free ports, a temporary data directory.

Tests skip when ``etcd`` is not installed, except under ``ROUTESPEC_REQUIRE_ETCD=1`` (set by
``.ci/run``, which installs it), where a missing etcd fails them instead.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

START_TIMEOUT = 20.0
POLL = 0.05


def etcd_binary() -> str:
    """The etcd executable, or a skip (a failure when CI requires etcd)."""
    path = shutil.which("etcd")
    if path is not None:
        return path
    if os.environ.get("ROUTESPEC_REQUIRE_ETCD"):
        pytest.fail("ROUTESPEC_REQUIRE_ETCD is set but etcd is not installed", pytrace=False)
    pytest.skip("etcd is not installed (apt-get install etcd-server); CI requires it")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class EtcdServer:
    def __init__(self, binary: str, data_dir: Path) -> None:
        self.binary = binary
        self.data_dir = data_dir
        self.client_port, self.peer_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.client_port}"
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        peer = f"http://127.0.0.1:{self.peer_port}"
        with open(self.data_dir.parent / "etcd.log", "ab") as log:
            self._process = subprocess.Popen(
                [
                    self.binary,
                    "--name=test",
                    f"--data-dir={self.data_dir}",
                    f"--listen-client-urls={self.url}",
                    f"--advertise-client-urls={self.url}",
                    f"--listen-peer-urls={peer}",
                    f"--initial-advertise-peer-urls={peer}",
                    f"--initial-cluster=test={peer}",
                    "--log-level=error",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + START_TIMEOUT
        while not self._answers():  # bounded poll until the client port serves requests
            assert self._process.poll() is None, "etcd exited; see etcd.log"
            assert time.monotonic() < deadline, "etcd did not start"
            time.sleep(POLL)

    def _answers(self) -> bool:
        try:
            return httpx.post(f"{self.url}/v3/maintenance/status", json={}).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=10)
            self._process = None


@contextmanager
def running_etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    server = EtcdServer(etcd_binary(), tmp_path / "etcd-data")
    server.start()
    try:
        yield server
    finally:
        server.stop()
