"""Dynamo's file discovery store: record format, registration, expiry and the watch loop."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
import trio.testing

from routespec.discovery.file_store import (
    DEFAULT_TTL,
    FileDiscovery,
    FileRegistration,
    MalformedRecord,
    decode_record,
    default_root,
    encode_record,
    instances_dir,
    record_path,
    transport_path,
)
from routespec.discovery.instances import Instance

ENDPOINT = "wire/comp/generate"
DYNAMO_RECORD = (
    b'{"type":"Endpoint","component":"comp","endpoint":"generate","namespace":"wire",'
    b'"instance_id":5002337910100504539,'
    b'"transport":{"tcp":"127.0.0.1:41953/456bdfd36202afdb/wire/comp/generate"},'
    b'"device_type":"cuda","request_plane_codec":"msgpack"}'
)


def _instance(instance_id: int, port: int = 41953, device: str = "cuda") -> Instance:
    address = f"127.0.0.1:{port}/{transport_path(ENDPOINT, instance_id)}"
    return Instance(instance_id, ENDPOINT, address, device)


def _age(path: Path, seconds: float) -> None:
    old = time.time() - seconds
    os.utime(path, (old, old))


def test_a_dynamo_record_decodes_and_encodes_back() -> None:
    """The record Dynamo 1.6.1 writes round-trips through Instance unchanged."""
    instance = decode_record(DYNAMO_RECORD)
    assert instance == Instance(
        5002337910100504539,
        ENDPOINT,
        "127.0.0.1:41953/456bdfd36202afdb/wire/comp/generate",
        "cuda",
        "msgpack",
    )
    assert json.loads(encode_record(instance)) == json.loads(DYNAMO_RECORD)
    assert instance == _instance(5002337910100504539)


def test_the_record_file_is_named_like_dynamo(tmp_path: Path) -> None:
    """File name = url-encoded ``ns/comp/endpoint/<hex id>`` under v1/instances."""
    path = record_path(tmp_path, ENDPOINT, 5002337910100504539)
    assert path == tmp_path / "v1/instances/wire%2Fcomp%2Fgenerate%2F456bdfd36202afdb"


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xff\xfe",
        b"[1, 2]",
        b'{"type": "Model"}',
        DYNAMO_RECORD.replace(b"5002337910100504539", b'"5"'),
        DYNAMO_RECORD.replace(b'"tcp"', b'"nats_tcp"'),
        DYNAMO_RECORD.replace(b'"namespace":"wire"', b'"namespace":""'),
    ],
)
def test_malformed_records_are_refused(data: bytes) -> None:
    """Anything but a complete Endpoint record with a TCP address is MalformedRecord."""
    with pytest.raises(MalformedRecord):
        decode_record(data)


def test_the_default_root_follows_dyn_file_kv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DYN_FILE_KV wins; otherwise $TMPDIR/dynamo_store_kv."""
    monkeypatch.setenv("DYN_FILE_KV", str(tmp_path / "kv"))
    assert default_root() == tmp_path / "kv"
    monkeypatch.delenv("DYN_FILE_KV")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert default_root() == tmp_path / "dynamo_store_kv"


def test_a_registered_record_is_discovered(tmp_path: Path) -> None:
    """A registration's file is found by a FileDiscovery of the same endpoint only."""
    instance = _instance(0xABC, device="cpu")
    registration = FileRegistration(instance, tmp_path)
    registration.register()
    assert not [p for p in instances_dir(tmp_path).iterdir() if p.name.startswith(".tmp_")]
    discovery = FileDiscovery(tmp_path, ENDPOINT)
    assert discovery.refresh() == (frozenset({0xABC}), frozenset())
    assert discovery.instance_ids() == (0xABC,)
    assert discovery.lookup(0xABC) == instance
    assert discovery.device_type(0xABC) == "cpu"
    assert discovery.lookup(1) is None
    assert discovery.device_type(1) is None
    other = FileDiscovery(tmp_path, "wire.comp.other")
    other.refresh()
    assert other.instance_ids() == ()


def test_deregistration_removes_the_record(tmp_path: Path) -> None:
    """A clean deregistration deletes the file; the next refresh reports the removal."""
    registration = FileRegistration(_instance(7), tmp_path)
    registration.register()
    discovery = FileDiscovery(tmp_path, ENDPOINT)
    discovery.refresh()
    registration.deregister()
    assert not registration.path.exists()
    assert discovery.refresh() == (frozenset(), frozenset({7}))
    assert discovery.instance_ids() == ()


def test_an_expired_record_is_deleted_by_refresh(tmp_path: Path) -> None:
    """A record whose mtime is older than ttl is dead: refresh drops and deletes it."""
    live, dead = FileRegistration(_instance(1), tmp_path), FileRegistration(_instance(2), tmp_path)
    live.register()
    dead.register()
    _age(dead.path, DEFAULT_TTL + 1)
    discovery = FileDiscovery(tmp_path, ENDPOINT)
    discovery.refresh()
    assert discovery.instance_ids() == (1,)
    assert live.path.exists()
    assert not dead.path.exists()


def test_touch_keeps_a_record_alive_and_restores_it(tmp_path: Path) -> None:
    """The heartbeat's touch refreshes the mtime and rewrites a record expired by others."""
    registration = FileRegistration(_instance(3), tmp_path)
    registration.register()
    _age(registration.path, DEFAULT_TTL - 1)
    registration.touch()
    assert registration.path.stat().st_mtime > time.time() - 2
    registration.path.unlink()
    registration.touch()
    assert decode_record(registration.path.read_bytes()) == registration.instance
    registration.deregister()
    registration.touch()
    assert not registration.path.exists()


def test_malformed_files_are_ignored(tmp_path: Path) -> None:
    """Garbage, other record types, directories and temp files never break a refresh."""
    FileRegistration(_instance(5), tmp_path).register()
    directory = instances_dir(tmp_path)
    (directory / "garbage").write_bytes(b"\x00not json")
    (directory / "model").write_text('{"type": "Model", "instance_id": 6}')
    (directory / ".tmp_0123456789abcdef").write_bytes(encode_record(_instance(8)))
    (directory / "subdir").mkdir()
    discovery = FileDiscovery(tmp_path, ENDPOINT)
    discovery.refresh()
    assert discovery.instance_ids() == (5,)


def test_a_missing_store_is_empty(tmp_path: Path) -> None:
    """No directory yet means no instances, not an error."""
    discovery = FileDiscovery(tmp_path / "absent", ENDPOINT)
    assert discovery.refresh() == (frozenset(), frozenset())


async def test_watch_reports_added_and_removed(tmp_path: Path) -> None:
    """The watch loop calls on_added / on_removed with ids as records come and go."""
    events: list[tuple[str, int]] = []
    changed = trio.Event()

    def note(kind: str) -> Callable[[int], None]:
        def callback(instance_id: int) -> None:
            events.append((kind, instance_id))
            changed.set()

        return callback

    discovery = FileDiscovery(tmp_path, ENDPOINT)
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                discovery.watch,
                0.02,
                note("added"),
                note("removed"),
            )
            async with FileRegistration.open(_instance(9), tmp_path, interval=1.0):
                await changed.wait()
                assert events == [("added", 9)]
                changed = trio.Event()
            await changed.wait()
            assert events == [("added", 9), ("removed", 9)]
            nursery.cancel_scope.cancel()


async def test_the_heartbeat_refreshes_the_mtime(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A registration opened with a heartbeat keeps touching its file."""
    async with FileRegistration.open(_instance(4), tmp_path, interval=1.0) as registration:
        _age(registration.path, DEFAULT_TTL - 1)
        await trio.sleep(1.5)  # virtual time: one heartbeat
        assert registration.path.stat().st_mtime > time.time() - 5
    assert not registration.path.exists()
