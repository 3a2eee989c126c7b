"""The discovery stores behind ``--discovery``: the same checks against the file store and a
real etcd server (see ``conftest.backend``); waits are bounded and driven by watch events."""

from __future__ import annotations

import base64
import json
import signal
import uuid
from collections.abc import Callable
from pathlib import Path

import attrs
import httpx
import pytest
import trio

from routespec.discovery.etcd_store import EtcdStore, etcd_key
from routespec.discovery.file_store import decode_record, encode_record, transport_path
from routespec.discovery.instances import Discovery, Instance
from routespec.discovery.store import DiscoveryError
from routespec.discovery.url import open_store
from tests.conftest import Backend
from tests.etcd_server import EtcdServer, free_port
from tests.processes import commands, start_worker

SHORT_TTL = 2.0  # seconds; etcd's smallest lease is 2 s
WAIT = 20.0  # bound on every wait for a store to converge


@pytest.fixture
def endpoint() -> str:
    return f"t{uuid.uuid4().hex[:8]}/comp/generate"


def _instance(endpoint: str, instance_id: int) -> Instance:
    return Instance(instance_id, endpoint, f"127.0.0.1:1/{transport_path(endpoint, instance_id)}")


@attrs.define
class Changes:
    """The watch's callbacks: a log of (kind, id), and a wake-up for each change."""

    log: list[tuple[str, int]] = attrs.field(factory=list)
    event: trio.Event = attrs.field(factory=trio.Event)

    def added(self, instance_id: int) -> None:
        self._note("added", instance_id)

    def removed(self, instance_id: int) -> None:
        self._note("removed", instance_id)

    def _note(self, kind: str, instance_id: int) -> None:
        self.log.append((kind, instance_id))
        self.event.set()

    async def until(self, discovery: Discovery, holds: Callable[[set[int]], bool]) -> None:
        with trio.fail_after(WAIT):
            while not holds(set(discovery.instance_ids())):
                self.event = trio.Event()
                await self.event.wait()


async def test_a_registration_is_watched_and_so_is_its_withdrawal(
    backend: Backend, endpoint: str
) -> None:
    """register -> the watcher reports it added with its record; withdraw -> removed."""
    store, changes = backend.store(SHORT_TTL), Changes()
    instance = _instance(endpoint, 0xA1)
    async with store.watch(endpoint, changes.added, changes.removed) as discovery:
        assert discovery.instance_ids() == ()
        async with store.registration(instance) as registration:
            await changes.until(discovery, lambda ids: ids == {0xA1})
            assert discovery.lookup(0xA1) == instance
            assert discovery.device_type(0xA1) == "cuda"
            await registration.withdraw()
            await changes.until(discovery, lambda ids: not ids)
    assert changes.log == [("added", 0xA1), ("removed", 0xA1)]


async def test_an_earlier_registration_is_in_the_first_snapshot(
    backend: Backend, endpoint: str
) -> None:
    """A watch starts with what is registered, and only for its own endpoint."""
    store = backend.store(SHORT_TTL)
    async with (
        store.registration(_instance(endpoint, 0xB1)),
        store.registration(_instance("other/comp/generate", 0xB2)),
        store.watch(endpoint) as discovery,
    ):
        assert discovery.instance_ids() == (0xB1,)


async def test_a_process_whose_liveness_lapses_is_removed(
    backend: Backend, endpoint: str, tmp_path: Path
) -> None:
    """A worker killed with SIGKILL stops renewing (lease keep-alive, file mtime): its record
    lapses after the TTL and the watcher reports it removed."""
    store, changes = backend.store(SHORT_TTL), Changes()
    async with store.watch(endpoint, changes.added, changes.removed) as discovery:
        with commands(tmp_path) as started:
            worker, instance_id = await trio.to_thread.run_sync(
                lambda: start_worker(
                    started, tmp_path, endpoint, backend.spec, "--ttl", str(SHORT_TTL)
                )
            )
            await changes.until(discovery, lambda ids: ids == {instance_id})
            worker.signal(signal.SIGKILL)
            await changes.until(discovery, lambda ids: not ids)
    assert changes.log == [("added", instance_id), ("removed", instance_id)]


async def test_registrations_and_watches_survive_an_outage(backend: Backend, endpoint: str) -> None:
    """After the store goes away and comes back, the registration is live again and the same
    watch still reports new registrations."""
    store, changes = backend.store(SHORT_TTL), Changes()
    async with (
        store.registration(_instance(endpoint, 0xC1)),
        store.watch(endpoint, changes.added, changes.removed) as discovery,
    ):
        assert discovery.instance_ids() == (0xC1,)
        async with backend.outage():
            pass
        async with store.registration(_instance(endpoint, 0xC2)):
            await changes.until(discovery, lambda ids: ids == {0xC1, 0xC2})


async def test_an_unusable_store_is_a_typed_error(backend: Backend, tmp_path: Path) -> None:
    """A store that cannot be used fails ``check`` with a DiscoveryError naming --discovery."""
    if backend.etcd is not None:
        spec = f"etcd:http://127.0.0.1:{free_port()}"  # nothing listens there
    else:
        (tmp_path / "a-file").write_text("")
        spec = f"file:{tmp_path / 'a-file'}"
    with pytest.raises(DiscoveryError) as failure:
        await open_store(spec).check()
    assert failure.value.field == "--discovery"


@pytest.mark.parametrize(
    "spec", ["", "file:", "etcd:", "nats:x", "etcd:ftp://127.0.0.1:2379", "etcd:http://"]
)
def test_a_malformed_discovery_spec_names_the_argument(spec: str) -> None:
    with pytest.raises(DiscoveryError, match=r"^--discovery: "):
        open_store(spec)


def test_a_non_positive_ttl_names_the_argument() -> None:
    with pytest.raises(DiscoveryError, match=r"^--ttl: "):
        open_store(None, 0)


async def test_etcd_records_use_dynamos_key_layout(etcd: EtcdServer) -> None:
    """Key ``v1/instances/ns/comp/endpoint/<hex id>`` under a lease; value = the file record."""
    endpoint = f"k{uuid.uuid4().hex[:8]}/comp/generate"
    instance = _instance(endpoint, 0x456BDFD36202AFDB)
    async with EtcdStore(etcd.url).registration(instance):
        reply = await trio.to_thread.run_sync(
            lambda: httpx.post(
                f"{etcd.url}/v3/kv/range",
                json={
                    "key": base64.b64encode(
                        etcd_key(endpoint, instance.instance_id).encode()
                    ).decode()
                },
            ).json()
        )
    (kv,) = reply["kvs"]
    assert base64.b64decode(kv["key"]).decode() == f"v1/instances/{endpoint}/456bdfd36202afdb"
    value = base64.b64decode(kv["value"])
    assert decode_record(value) == instance
    assert json.loads(value) == json.loads(encode_record(instance))
    assert int(kv["lease"]) > 0
