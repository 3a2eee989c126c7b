"""Discovery backends under test (the same tests run against the file store and etcd), and
the Hypothesis settings of the project's own tests."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import pytest
import trio
from hypothesis import HealthCheck, settings

from routespec.discovery.file_store import FileStore
from routespec.discovery.store import DiscoveryStore
from routespec.discovery.url import open_store
from tests.etcd_server import EtcdServer, running_etcd

# Fuzzing and chaos tests drive real sockets and processes: no per-example deadline.
settings.register_profile(
    "routespec-tests", deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("routespec-tests")


@pytest.fixture(scope="session")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    with running_etcd(tmp_path_factory.mktemp("etcd")) as server:
        yield server


@attrs.frozen
class Backend:
    """One discovery backend: its command-line spelling and a way to take it away."""

    spec: str
    etcd: EtcdServer | None = None
    root: Path | None = None

    def store(self, ttl: float) -> DiscoveryStore:
        return open_store(self.spec, ttl)

    @asynccontextmanager
    async def outage(self) -> AsyncIterator[None]:
        """The store is gone for the block: etcd stops (then restarts on the same data), the
        file store's directory is deleted (then its writers recreate their records)."""
        if self.etcd is not None:
            await trio.to_thread.run_sync(self.etcd.stop)
            try:
                yield
            finally:
                await trio.to_thread.run_sync(self.etcd.start)
        else:
            assert self.root is not None
            shutil.rmtree(self.root, ignore_errors=True)
            yield


@pytest.fixture(params=["file", "etcd"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "file":
        store = FileStore(tmp_path / "kv")
        return Backend(f"file:{store.root}", root=store.root)
    server: EtcdServer = request.getfixturevalue("etcd")
    return Backend(f"etcd:{server.url}", etcd=server)
