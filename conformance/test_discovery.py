"""Discovery (DSC): registration, withdrawal, liveness, Dynamo's records, malformed records,
outages, refused stores, and what watchers list and report.

Each check opens an empty store with ``target.open_discovery()`` and moves the store's time
with ``advance``, in multiples of the periods the store declares (``timing()``). Time bounds
are checked with a margin of one propagation delay on the safe side, so the few real
milliseconds a check itself takes never decide it.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from routespec.conformance.checks import covers, require, require_compare, require_equal, requires
from routespec.testing.target import Capability, DiscoveryTarget, ListedInstance, Target

STORE = Capability.DISCOVERY_STORE
ENDPOINT = "dsc/backend/generate"
SIBLING = "dsc/backend/clear_kv_blocks"  # same namespace and component
ELSEWHERE = "other/backend/generate"  # same component and endpoint names
RECORD_FIELDS = {
    "type",
    "namespace",
    "component",
    "endpoint",
    "instance_id",
    "transport",
    "device_type",
    "request_plane_codec",
}
DYNAMO_ENDPOINT = "wire/comp/generate"
DYNAMO_ID = 5002337910100504539
DYNAMO_ADDRESS = "127.0.0.1:41953/456bdfd36202afdb/wire/comp/generate"
DYNAMO_RECORD = (
    b'{"type":"Endpoint","component":"comp","endpoint":"generate","namespace":"wire",'
    b'"instance_id":5002337910100504539,'
    b'"transport":{"tcp":"127.0.0.1:41953/456bdfd36202afdb/wire/comp/generate"},'
    b'"device_type":"cuda","request_plane_codec":"msgpack"}'
)
"""A record exactly as a Dynamo 1.6.1 worker wrote it to its file store."""
DEFAULT_TTL = 10.0  # the liveness period of a store opened with no --ttl (Dynamo's)


STORES = [pytest.param(None, id="own-store"), pytest.param("etcd", id="etcd")]
"""The target's own store, and a new etcd store (SKIP where the target cannot open one)."""


def opened(target: Target, kind: str | None) -> DiscoveryTarget:
    """A new empty store: the target's own, or one of ``kind`` (``reopen(store=kind)``)."""
    store = target.open_discovery()
    return store if kind is None else store.reopen(store=kind)


def ids(store: DiscoveryTarget, watcher: int) -> set[int]:
    return set(store.listed(watcher))


def resolved(listed: Mapping[int, ListedInstance]) -> dict[int, tuple[str | None, str | None]]:
    """Each listed instance's address and device type."""
    return {i: (instance.address, instance.device_type) for i, instance in listed.items()}


def address_in_record(store: DiscoveryTarget, instance_id: int) -> str | None:
    record = store.record(instance_id)
    if record is None:
        return None
    transport = json.loads(record.value).get("transport")
    return transport.get("tcp") if isinstance(transport, dict) else None


# --- DSC-001 to DSC-003: who lists a registration, and from when ---


@covers("DSC-001")
@requires(STORE)
@pytest.mark.parametrize("kind", STORES)
def test_a_registration_reaches_its_endpoints_watchers(target: Target, kind: str | None) -> None:
    store = opened(target, kind)
    watchers = [store.watch(ENDPOINT), store.watch(ENDPOINT)]
    worker = store.register(ENDPOINT, device="cpu")
    store.advance(store.timing().propagation)
    expected = (address_in_record(store, worker), "cpu")
    for watcher in watchers:
        listed = store.listed(watcher)
        require(
            "DSC-001",
            resolved(listed).get(worker) == expected and expected[0] is not None,
            f"watcher {watcher} lists {listed}; expected {worker:x} at {expected[0]}, a cpu",
        )
        require_equal(
            "DSC-001",
            store.events(watcher),
            (("added", worker),),
            f"watcher {watcher} reported {store.events(watcher)}; expected {worker:x} added",
        )


LONG_NAMES = "/".join(name * 30 for name in "nce")  # three names of 30 characters


@covers("DSC-001", "DSC-007")
@requires(STORE)
@pytest.mark.parametrize(
    "endpoint",
    ["_tmp_ns/backend/generate", "dsc/back_end/gen-erate_1", LONG_NAMES],
    ids=["temp-file-prefix", "underscores-and-dashes", "names-of-30"],
)
def test_names_with_punctuation_or_30_characters_are_listed(target: Target, endpoint: str) -> None:
    """Names may hold underscores and dashes, even where a file store's temp files have
    theirs (``.tmp_``), and be 30 characters long (a file store that named the record's file
    with every byte percent-encoded, as only ``/`` and punctuation must be, would need 327
    bytes for that key, more than a file name can hold): the registration is listed like
    any other."""
    store = target.open_discovery()
    watcher = store.watch(endpoint)
    worker = store.register(endpoint)
    store.advance(store.timing().propagation)
    require_equal(
        "DSC-001",
        ids(store, watcher),
        {worker},
        f"the watcher of {endpoint!r} lists {sorted(ids(store, watcher))}; expected {worker}",
    )


@covers("DSC-002", "DSC-014")
@requires(STORE)
def test_a_watcher_lists_only_its_own_endpoint(target: Target) -> None:
    """Nor does it report the other endpoints' records as skipped: they are usable records,
    just not its own (DSC-014: a usable record is never reported)."""
    store = target.open_discovery()
    endpoints = (ENDPOINT, SIBLING, ELSEWHERE)
    before = {endpoint: store.register(endpoint) for endpoint in endpoints}
    watchers = {endpoint: store.watch(endpoint) for endpoint in endpoints}
    after = {endpoint: store.register(endpoint) for endpoint in endpoints}
    store.advance(store.timing().propagation)
    for endpoint, watcher in watchers.items():
        require_equal(
            "DSC-002",
            ids(store, watcher),
            {before[endpoint], after[endpoint]},
            f"the watcher of {endpoint} lists {sorted(ids(store, watcher))}; its endpoint's "
            f"instances are {before[endpoint]}, {after[endpoint]} (all: {before}, {after})",
        )
        require_equal(
            "DSC-014",
            store.skipped(watcher),
            (),
            f"the watcher of {endpoint} reported skipping records (all of them usable, of "
            f"its own endpoint or another)",
        )


@covers("DSC-003")
@requires(STORE)
def test_a_watcher_starts_from_what_is_registered(target: Target) -> None:
    store = target.open_discovery()
    first = store.register(ENDPOINT)
    store.advance(2 * store.timing().renewal)
    second = store.register(ENDPOINT)
    watcher = store.watch(ENDPOINT)
    require_equal(
        "DSC-003",
        ids(store, watcher),
        {first, second},
        f"a watcher started after {first} and {second} registered first lists "
        f"{sorted(ids(store, watcher))}",
    )


@covers("DSC-017")
@requires(STORE)
def test_an_endpoint_spelled_as_dynamo_spells_it_is_the_same_endpoint(target: Target) -> None:
    """``dsc.backend.generate`` (Dynamo's spelling, and the command line's) is the endpoint
    ``dsc/backend/generate``: a worker registered under either spelling is stored under the
    key of the three names and listed by the watchers of both."""
    dotted = ENDPOINT.replace("/", ".")
    store = target.open_discovery()
    watchers = {ENDPOINT: store.watch(ENDPOINT), dotted: store.watch(dotted)}
    workers = {ENDPOINT: store.register(ENDPOINT), dotted: store.register(dotted)}
    store.advance(store.timing().propagation)
    for spelling, worker in workers.items():
        record = store.record(worker)
        key = f"v1/instances/{ENDPOINT}/{worker:x}"
        require(
            "DSC-017",
            record is not None and record.key == key,
            f"a worker registered as {spelling!r} is stored under "
            f"{None if record is None else record.key!r}; expected {key!r}",
        )
    for spelling, watcher in watchers.items():
        require_equal(
            "DSC-017",
            ids(store, watcher),
            set(workers.values()),
            f"the watcher of {spelling!r} lists {sorted(map(hex, ids(store, watcher)))}; "
            f"expected the workers registered as {ENDPOINT!r} and {dotted!r}: {workers}",
        )


# --- DSC-004 to DSC-006: withdrawal, renewal, liveness ---


@covers("DSC-004")
@requires(STORE)
def test_a_withdrawn_registration_is_gone_for_good(target: Target) -> None:
    store = target.open_discovery()
    timing = store.timing()
    watcher = store.watch(ENDPOINT)
    worker, other = store.register(ENDPOINT), store.register(ENDPOINT)
    store.advance(timing.propagation)
    store.withdraw(worker)
    store.advance(timing.propagation)
    require_compare(
        "DSC-004", store.record(worker), "is", None, f"{worker} withdrawn, its record is kept"
    )
    require_equal(
        "DSC-004",
        ids(store, watcher),
        {other},
        f"after {worker} withdrew the watcher lists {sorted(ids(store, watcher))}",
    )
    expected = (("added", worker), ("added", other), ("removed", worker))
    require(
        "DSC-004",
        sorted(store.events(watcher)) == sorted(expected)
        and store.events(watcher)[-1] == expected[-1],
        f"the watcher reported {store.events(watcher)}",
    )
    store.advance(2 * timing.ttl)  # the withdrawn process keeps running (it drains)
    require(
        "DSC-004",
        ids(store, watcher) == {other} and store.record(worker) is None,
        f"{2 * timing.ttl} s after withdrawing, {worker} is back: watcher lists "
        f"{sorted(ids(store, watcher))}",
    )


@covers("DSC-005")
@requires(STORE)
def test_renewal_keeps_a_running_registration_alive(target: Target) -> None:
    store = target.open_discovery()
    timing = store.timing()
    watcher = store.watch(ENDPOINT)
    worker = store.register(ENDPOINT)
    elapsed = 0.0
    while elapsed < 3 * timing.ttl:
        store.advance(timing.renewal / 2)
        elapsed += timing.renewal / 2
        require(
            "DSC-005",
            ids(store, watcher) == {worker} and store.record(worker) is not None,
            f"{elapsed:.1f} s after registering, the running {worker} is not listed",
        )
    require_equal(
        "DSC-005",
        store.events(watcher),
        (("added", worker),),
        f"the watcher reported {store.events(watcher)}",
    )


@covers("DSC-006")
@requires(STORE)
@pytest.mark.parametrize("renewed", [False, True], ids=["at-once", "after-renewals"])
def test_a_killed_process_lapses_after_ttl_not_before(target: Target, renewed: bool) -> None:
    store = target.open_discovery()
    timing = store.timing()
    delay = timing.propagation
    watcher = store.watch(ENDPOINT)
    killed, running = store.register(ENDPOINT), store.register(ENDPOINT)
    store.advance(delay)
    if renewed:
        store.advance(2.5 * timing.renewal)
    store.lapse(killed)
    # the last renewal is at most this long before the kill: one renewal interval, or, if
    # no renewal has happened yet, the time since the registration
    since_renewal = timing.renewal if renewed else delay
    hold = timing.ttl - since_renewal - delay  # a propagation delay short of the earliest expiry
    store.advance(hold)
    require(
        "DSC-006",
        ids(store, watcher) == {killed, running} and store.record(killed) is not None,
        f"{hold:.2f} s after the kill, less than ttl ({timing.ttl} s) after the last renewal, "
        f"the watcher lists {sorted(ids(store, watcher))}; {killed} should still be listed",
    )
    store.advance(timing.ttl + timing.renewal + delay - hold)
    require_equal(
        "DSC-006",
        ids(store, watcher),
        {running},
        f"ttl + one renewal interval + {delay} s after the kill the watcher lists "
        f"{sorted(ids(store, watcher))}",
    )
    require_compare(
        "DSC-006", store.record(killed), "is", None, f"the record of {killed} is still stored"
    )
    require_equal(
        "DSC-006",
        store.events(watcher)[-1],
        ("removed", killed),
        f"the watcher reported {store.events(watcher)}",
    )


@covers("DSC-005", "DSC-006")
@requires(STORE)
@pytest.mark.parametrize(
    ("store_named", "ttl", "kind"),
    [
        (True, None, None),
        (True, 3.0, None),
        (True, 30.0, None),
        (False, 3.0, None),
        (True, 3.0, "etcd"),  # on real time: the shortest
    ],
    ids=["no-ttl", "ttl-3", "ttl-30", "default-store-ttl-3", "etcd-ttl-3"],
)
def test_a_store_keeps_the_liveness_period_it_is_opened_with(
    target: Target, tmp_path: Path, store_named: bool, ttl: float | None, kind: str | None
) -> None:
    """``ttl`` is the one the store is opened with (``--ttl``), 10 s without one, whether
    ``--discovery`` names the store (the target's own kind, or etcd) or the default one is
    used: a killed process's record lapses after it, not before, and a running one, renewed
    every ``ttl / 3``, never does."""
    environment = None if store_named else {"DYN_FILE_KV": str(tmp_path)}
    store = opened(target, kind).reopen(ttl=ttl, environment=environment)
    period = DEFAULT_TTL if ttl is None else ttl
    delay = store.timing().propagation
    watcher = store.watch(ENDPOINT)
    running = store.register(ENDPOINT)
    killed = store.register(ENDPOINT)
    store.advance(delay)
    store.lapse(killed)  # its last renewal is its registration, at most `delay` before
    store.advance(period - 2 * delay)
    require(
        "DSC-006",
        ids(store, watcher) == {running, killed},
        f"{period - 2 * delay} s after {killed:x} was killed, less than ttl ({period} s) after "
        f"its registration, the watcher lists {sorted(map(hex, ids(store, watcher)))}; "
        f"expected {running:x} and {killed:x}",
    )
    renewal = store.timing().renewal
    store.advance(3 * delay + renewal)
    require_equal(
        "DSC-006",
        ids(store, watcher),
        {running},
        f"ttl ({period} s) + one renewal interval ({renewal} s) + {delay} s after {killed:x} "
        f"was killed the watcher lists "
        f"{sorted(map(hex, ids(store, watcher)))}; expected only the running {running:x}",
    )
    store.advance(2 * period)
    require(
        "DSC-005",
        ids(store, watcher) == {running} and ("removed", running) not in store.events(watcher),
        f"{3 * period} s after registering, with ttl {period} s, the running {running:x} is "
        f"listed {running in ids(store, watcher)}; the watcher reported {store.events(watcher)}",
    )


DEFAULT_STORES = {  # the store variables of a worker's environment -> where its store is
    "DYN_FILE_KV": ({"DYN_FILE_KV": "{kv}", "TMPDIR": "{tmp}"}, "{kv}"),
    "TMPDIR": ({"TMPDIR": "{tmp}"}, "{tmp}/dynamo_store_kv"),
    "neither": ({}, "/tmp/dynamo_store_kv"),
}


@covers("DSC-016", "DSC-007")
@requires(STORE)
@pytest.mark.parametrize("variables", list(DEFAULT_STORES))
def test_a_process_naming_no_store_uses_dynamos_default_one(
    target: Target, tmp_path: Path, variables: str
) -> None:
    """Workers started with no ``--discovery`` keep their records as Dynamo's do: in
    ``$DYN_FILE_KV``, else ``$TMPDIR/dynamo_store_kv``, else ``/tmp/dynamo_store_kv``,
    under ``v1/instances/``, each under its own random u64 instance id."""
    (tmp_path / "tmp").mkdir()
    places = {"kv": tmp_path / "kv", "tmp": tmp_path / "tmp"}
    variables_given, where = DEFAULT_STORES[variables]
    environment = {name: value.format(**places) for name, value in variables_given.items()}
    directory = Path(where.format(**places)) / "v1" / "instances"
    store = target.open_discovery().reopen(environment=environment)
    workers = [store.register(ENDPOINT) for _ in range(4)]

    def keys() -> set[str]:
        if not directory.is_dir():
            return set()
        return {urllib.parse.unquote(entry.name) for entry in directory.iterdir()}

    try:
        expected = {f"{ENDPOINT}/{worker:x}" for worker in workers}
        require(
            "DSC-016",
            expected <= keys(),
            f"workers started with {environment or 'neither variable'} and no --discovery "
            f"should keep their records {sorted(expected)} in {directory}; it holds "
            f"{sorted(keys())}",
        )
        require(
            "DSC-007",
            len(set(workers)) == len(workers) and all(0 <= w < 2**64 for w in workers),
            f"the instance ids of {len(workers)} workers are {workers}: not distinct u64s",
        )
    finally:
        for worker in workers:
            store.withdraw(worker)


# --- DSC-007, DSC-008: records ---


@covers("DSC-007")
@requires(STORE)
def test_records_use_dynamos_key_layout_and_record(target: Target) -> None:
    store = target.open_discovery()
    worker = store.register(ENDPOINT, device="cpu")
    record = store.record(worker)
    require_compare("DSC-007", record, "is not", None, f"no record is stored for {worker}")
    assert record is not None
    key = f"v1/instances/{ENDPOINT}/{worker:x}"
    require_equal("DSC-007", record.key, key, f"stored under {record.key!r}; expected {key!r}")
    document = json.loads(record.value)
    namespace, component, endpoint = ENDPOINT.split("/")
    require(
        "DSC-007",
        isinstance(document, dict) and set(document) == RECORD_FIELDS,
        f"the record's fields are {sorted(document) if isinstance(document, dict) else document}",
    )
    expected = {
        "type": "Endpoint",
        "namespace": namespace,
        "component": component,
        "endpoint": endpoint,
        "instance_id": worker,
        "device_type": "cpu",
    }
    require(
        "DSC-007",
        {field: document[field] for field in expected} == expected
        and type(document["instance_id"]) is int,
        f"the record is {document}; expected {expected}",
    )
    transport = document["transport"]
    address = transport.get("tcp") if isinstance(transport, dict) else None
    require(
        "DSC-007",
        isinstance(transport, dict)
        and set(transport) == {"tcp"}
        and isinstance(address, str)
        and re.fullmatch(rf"[^/]+:\d+/{worker:x}/{re.escape(ENDPOINT)}", address) is not None,
        f"transport is {transport}; expected {{'tcp': 'host:port/{worker:x}/{ENDPOINT}'}}",
    )
    require_compare(
        "DSC-007",
        document["request_plane_codec"],
        "in",
        ("msgpack", "json"),
        f"request_plane_codec is {document['request_plane_codec']!r}",
    )
    store.put_raw(DYNAMO_ENDPOINT, DYNAMO_ID, DYNAMO_RECORD)
    watcher = store.watch(DYNAMO_ENDPOINT)
    listed = store.listed(watcher)
    require_equal(
        "DSC-007",
        resolved(listed),
        {DYNAMO_ID: (DYNAMO_ADDRESS, "cuda")},
        f"Dynamo's record is listed as {listed}",
    )


@covers("DSC-007")
@requires(STORE)
def test_a_record_without_a_device_type_is_listed_as_cuda(target: Target) -> None:
    """The record table's default: a record that carries no ``device_type`` is ``cuda``
    (listed as ``cuda``, or with no device type, as Dynamo 1.6.1's watcher lists it; never as
    another device); one that carries ``cpu`` is ``cpu``."""
    store = target.open_discovery()
    without, with_cpu = 0x600D, 0x600E
    no_device = json.loads(_record(instance_id=without, transport={"tcp": _address_of(without)}))
    del no_device["device_type"]
    store.put_raw(ENDPOINT, without, json.dumps(no_device).encode())
    cpu = _record(instance_id=with_cpu, transport={"tcp": _address_of(with_cpu)}, device_type="cpu")
    store.put_raw(ENDPOINT, with_cpu, cpu)
    listed = store.listed(store.watch(ENDPOINT))
    devices = {i: listed[i].device_type for i in listed}
    require(
        "DSC-007",
        set(devices) == {without, with_cpu}
        and devices[without] in ("cuda", None)
        and devices[with_cpu] == "cpu",
        f"a record without device_type and one with 'cpu' are listed as {listed}",
    )


@covers("DSC-007")
@requires(STORE)
def test_a_record_without_a_codec_is_listed(target: Target) -> None:
    """The record table's default: a record that carries no ``request_plane_codec`` predates
    msgpack payloads and is ``json``, a codec every caller speaks: it is listed, not skipped."""
    store = target.open_discovery()
    without = 0x600D
    no_codec = json.loads(_record(instance_id=without, transport={"tcp": _address_of(without)}))
    del no_codec["request_plane_codec"]
    store.put_raw(ENDPOINT, without, json.dumps(no_codec).encode())
    watcher = store.watch(ENDPOINT)
    store.advance(store.timing().propagation)
    listed = store.listed(watcher)
    require(
        "DSC-007",
        set(listed) == {without} and listed[without].address == _address_of(without),
        f"a record without request_plane_codec is listed as {listed} (skipped: "
        f"{store.skipped(watcher)}); expected {without:#x} at {_address_of(without)}",
    )


LISTED_CODECS = {0xC0D1: "msgpack", 0xC0D2: "json", 0xC0D3: None}  # None: the field is absent


@covers("DSC-007")
@requires(STORE, Capability.OBSERVE_LISTED_CODEC)
def test_a_record_is_listed_with_its_payload_codec(target: Target) -> None:
    """A caller speaks to an instance in the payload codec its record names (TRN-001):
    ``msgpack``, ``json``, and ``json`` for a record without ``request_plane_codec``, which
    predates msgpack payloads."""
    store = target.open_discovery()
    for instance_id, codec in LISTED_CODECS.items():
        document = json.loads(
            _record(instance_id=instance_id, transport={"tcp": _address_of(instance_id)})
        )
        if codec is None:
            del document["request_plane_codec"]
        else:
            document["request_plane_codec"] = codec
        store.put_raw(ENDPOINT, instance_id, json.dumps(document).encode())
    listed = store.listed(store.watch(ENDPOINT))
    codecs = {instance_id: instance.payload_codec for instance_id, instance in listed.items()}
    expected = {instance_id: codec or "json" for instance_id, codec in LISTED_CODECS.items()}
    require_equal(
        "DSC-007",
        codecs,
        expected,
        f"records naming msgpack, json and no codec are listed with the codecs {codecs}",
    )


def _address_of(instance_id: int) -> str:
    return f"127.0.0.1:1/{instance_id:x}/{ENDPOINT}"


def _record(**changes: object) -> bytes:
    """A well-formed record of instance 0xBAD under ``ENDPOINT``, with ``changes``."""
    namespace, component, endpoint = ENDPOINT.split("/")
    document = {
        "type": "Endpoint",
        "component": component,
        "endpoint": endpoint,
        "namespace": namespace,
        "instance_id": 0xBAD,
        "transport": {"tcp": f"127.0.0.1:1/bad/{ENDPOINT}"},
        "device_type": "cuda",
        "request_plane_codec": "msgpack",
        **changes,
    }
    return json.dumps(document).encode()


MALFORMED: dict[str, bytes] = {
    "empty": b"",
    "not-json": b"\x00not json",
    "not-utf-8": b"\xff\xfe\x00",
    "too-deep": b"[" * 100_000,
    "an-array": b"[1, 2]",
    "another-type": _record(type="Model"),
    "no-type": json.dumps({"instance_id": 0xBAD}).encode(),
    "empty-name": _record(namespace=""),
    "slash-in-a-name": _record(component="back/end"),
    "slash-in-the-last-name": _record(endpoint="generate/more"),  # the key's names first
    "a-name-not-a-string": _record(endpoint=7),
    "id-a-string": _record(instance_id="2989"),
    "id-negative": _record(instance_id=-2989),
    "id-a-boolean": _record(instance_id=True),
    "no-tcp-transport": _record(transport={"nats_tcp": f"127.0.0.1:1/bad/{ENDPOINT}"}),
    "tcp-without-a-path": _record(transport={"tcp": "127.0.0.1:1"}),
    "transport-a-string": _record(transport="127.0.0.1:1/bad"),
    "device-type-not-a-string": _record(device_type=0),
    "codec-not-a-string": _record(request_plane_codec=None),
}


@covers("DSC-008")
@requires(STORE)
@pytest.mark.parametrize("value", list(MALFORMED.values()), ids=list(MALFORMED))
def test_malformed_records_are_skipped(target: Target, value: bytes) -> None:
    store = target.open_discovery()
    early = store.watch(ENDPOINT)
    worker = store.register(ENDPOINT)
    store.put_raw(ENDPOINT, 0x600D, _record(instance_id=0x600D))  # another process's record
    store.put_raw(ENDPOINT, 0xBAD, value)
    store.advance(store.timing().propagation)
    late = store.watch(ENDPOINT)
    for watcher in (early, late):
        require_equal(
            "DSC-008",
            ids(store, watcher),
            {worker, 0x600D},
            f"watcher {watcher} lists {sorted(map(hex, ids(store, watcher)))}; expected "
            f"{worker:#x} and 0x600d, and not the malformed 0xbad",
        )


MAX_RECORD_BYTES = 64 * 1024  # DSC-013
U64_MAX = 2**64 - 1
AT_BOUND, PAST_BOUND = 0xA7, 0xBAD


def _sized_record(size: int, instance_id: int) -> bytes:
    """A well-formed record of ``instance_id``, padded to exactly ``size`` bytes."""
    bare = _record(instance_id=instance_id, padding="")
    record = _record(instance_id=instance_id, padding="x" * (size - len(bare)))
    assert len(record) == size, f"a record of {len(record)} bytes, not {size}"
    return record


def _at_port(port: object, instance_id: int) -> bytes:
    return _record(instance_id=instance_id, transport={"tcp": f"127.0.0.1:{port}/b/{ENDPOINT}"})


# Each bound a usable record has (DSC-008, DSC-013): (requirement, id of the record at the
# bound, the record at it, id of the record just past it, the record just past it).
BOUNDS = {
    "record-size": (
        "DSC-013",
        AT_BOUND,
        _sized_record(MAX_RECORD_BYTES, AT_BOUND),
        PAST_BOUND,
        _sized_record(MAX_RECORD_BYTES + 1, PAST_BOUND),
    ),
    "lowest-port": (
        "DSC-013",
        AT_BOUND,
        _at_port(1, AT_BOUND),
        PAST_BOUND,
        _at_port(0, PAST_BOUND),
    ),
    "highest-port": (
        "DSC-013",
        AT_BOUND,
        _at_port(65535, AT_BOUND),
        PAST_BOUND,
        _at_port(65536, PAST_BOUND),
    ),
    "lowest-id": ("DSC-008", 0, _record(instance_id=0), PAST_BOUND, _record(instance_id=-1)),
    "highest-id": (
        "DSC-013",
        U64_MAX,
        _record(instance_id=U64_MAX),
        PAST_BOUND,
        _record(instance_id=U64_MAX + 1),
    ),
    "device-type-length": (
        "DSC-013",
        AT_BOUND,
        _record(instance_id=AT_BOUND, device_type="d" * 64),
        PAST_BOUND,
        _record(instance_id=PAST_BOUND, device_type="d" * 65),
    ),
}


@covers("DSC-008", "DSC-013")
@requires(STORE)
@pytest.mark.parametrize("bound", list(BOUNDS))
def test_a_record_at_a_bound_is_listed_and_one_past_it_is_skipped(
    target: Target, bound: str
) -> None:
    """Both sides of each bound: 64 KiB of record, ports 1 and 65535, instance ids 0 and
    2**64 - 1, a 64-character device type are usable; one byte, one port, one id or one
    character further is not."""
    requirement, at_id, at_value, past_id, past_value = BOUNDS[bound]
    store = target.open_discovery()
    early = store.watch(ENDPOINT)
    store.put_raw(ENDPOINT, at_id, at_value)
    store.put_raw(ENDPOINT, past_id, past_value)
    store.advance(store.timing().propagation)
    late = store.watch(ENDPOINT)
    for watcher in (early, late):
        require_equal(
            requirement,
            ids(store, watcher),
            {at_id},
            f"{bound}: watcher {watcher} lists {sorted(map(hex, ids(store, watcher)))}; "
            f"expected {at_id:#x}, whose record is at the bound, and not {past_id:#x}, whose "
            "record is just past it",
        )


# --- DSC-009, DSC-010: outages ---


@covers("DSC-009", "DSC-010")
@requires(STORE)
def test_a_store_that_lost_its_records_is_repopulated(target: Target) -> None:
    store = target.open_discovery()
    timing = store.timing()
    watcher = store.watch(ENDPOINT)
    worker = store.register(ENDPOINT)
    store.advance(timing.propagation)
    store.lose_records()
    store.advance(timing.renewal + timing.propagation)
    require(
        "DSC-009",
        ids(store, watcher) == {worker} and store.record(worker) is not None,
        f"a renewal interval after the store lost its records, the running {worker} is not "
        f"listed again (the watcher lists {sorted(ids(store, watcher))})",
    )
    newcomer = store.register(ENDPOINT)
    store.advance(timing.propagation)
    require_equal(
        "DSC-010",
        ids(store, watcher),
        {worker, newcomer},
        f"after the loss the watcher lists {sorted(ids(store, watcher))}; {newcomer} "
        f"registered since",
    )


@covers("DSC-010")
@requires(STORE)
def test_a_watcher_lists_what_registers_after_an_outage(target: Target) -> None:
    """DSC-010 on its own, whether or not the running worker's record comes back (DSC-009)."""
    store = target.open_discovery()
    timing = store.timing()
    watcher = store.watch(ENDPOINT)
    store.register(ENDPOINT)
    store.advance(timing.propagation)
    store.lose_records()
    store.advance(timing.propagation)
    newcomer = store.register(ENDPOINT)
    store.advance(timing.propagation)
    require_compare(
        "DSC-010",
        newcomer,
        "in",
        ids(store, watcher),
        f"{newcomer} registered after the store lost its records; the watcher, running "
        f"through the loss, lists {sorted(ids(store, watcher))}",
    )


# --- DSC-011: refused stores ---

OWN_STORE = "<the target's own store>"
OWN_PLACE = "<the target's own store's place, under another scheme>"
REFUSED = [
    ("", 10.0, "--discovery"),
    ("nats:localhost:4222", 10.0, "--discovery"),
    ("file:", 10.0, "--discovery"),
    ("etcd:", 10.0, "--discovery"),
    ("etcd:ftp://127.0.0.1:2379", 10.0, "--discovery"),
    ("etcd:http://", 10.0, "--discovery"),
    ("file:/dev/null", 10.0, "--discovery"),  # a file where the directory should be
    ("etcd:http://127.0.0.1:1", 10.0, "--discovery"),  # nothing answers there
    (OWN_STORE, 0.0, "--ttl"),
    (OWN_STORE, -1.0, "--ttl"),
    (OWN_STORE, math.inf, "--ttl"),  # never lapses: a killed worker would stay listed
    (OWN_STORE, math.nan, "--ttl"),
    (OWN_PLACE, 10.0, "--discovery"),  # neither file: nor etcd:, though its place is usable
]


@covers("DSC-011")
@requires(STORE)
@pytest.mark.parametrize("kind", STORES)
@pytest.mark.parametrize(("address", "ttl", "argument"), REFUSED)
def test_an_unusable_store_is_refused_naming_its_argument(
    target: Target, address: str, ttl: float, argument: str, kind: str | None
) -> None:
    store = opened(target, kind)
    usable = store.refusal(store.address(), 10.0)
    require_compare(
        "DSC-011", usable, "is", None, f"the usable {store.address()} is refused ({usable})"
    )
    if address == OWN_STORE:
        address = store.address()
    elif address == OWN_PLACE:
        address = f"nats:{store.address().partition(':')[2]}"
    named = store.refusal(address, ttl)
    require_equal(
        "DSC-011",
        named,
        argument,
        f"opening {address!r} with ttl {ttl} named {named!r}; expected a refusal naming {argument}",
    )


@covers("DSC-011")
@requires(STORE)
@pytest.mark.parametrize("ttl", [0.5, 1.0])
def test_a_positive_ttl_is_accepted(target: Target, ttl: float) -> None:
    """The other side of the ``--ttl`` bound: any positive liveness period, under a second
    or of one, is a store's to use."""
    store = target.open_discovery()
    named = store.refusal(store.address(), ttl)
    require_compare(
        "DSC-011",
        named,
        "is",
        None,
        f"opening {store.address()!r} with ttl {ttl} (positive) was refused naming {named!r}",
    )


@covers("DSC-011")
@requires(STORE)
def test_a_file_store_directory_may_hold_a_colon(target: Target) -> None:
    """``file:DIR``: everything after the first colon is the directory, colons included."""
    store = target.open_discovery()
    address = store.address()
    if not address.startswith("file:"):
        pytest.skip(f"the target's store is {address!r}, not a file store")
    nested = f"{address}/a:b"  # a directory still to be made, under an existing one
    named = store.refusal(nested, 10.0)
    require_compare(
        "DSC-011",
        named,
        "is",
        None,
        f"{nested!r} names a directory whose name holds a colon; it was refused naming {named!r}",
    )


def _still_readable(read: Callable[[], object]) -> bool:
    """Whether ``read`` succeeds though the mode forbids it (root, with CAP_DAC_OVERRIDE)."""
    try:
        read()
    except PermissionError:
        return False
    return True


NOWHERE = ["dangling-link", "link-loop", "link-to-an-overlong-name", "a-file", "unlistable"]


@covers("DSC-011")
@requires(STORE)
@pytest.mark.parametrize("what", NOWHERE)
@pytest.mark.parametrize("where", ["store", "records"], ids=["dir", "dir-v1-instances"])
def test_a_file_store_directory_that_leads_nowhere_is_refused(
    target: Target, tmp_path: Path, where: str, what: str
) -> None:
    """A ``file:DIR`` whose DIR, or whose records directory ``DIR/v1/instances``, is a
    symbolic link to nothing, to itself, or to a name the system cannot resolve (a 300-byte
    file name), is a file, or is a directory this process cannot list (mode ``-wx``) is
    refused at once, naming ``--discovery``: not at the first registration, and not by a
    watcher that lists nothing."""
    store = target.open_discovery()
    if not store.address().startswith("file:"):
        pytest.skip(f"the target's store is {store.address()!r}, not a file store")
    root = tmp_path / "store"
    path = root if where == "store" else root / "v1" / "instances"
    path.parent.mkdir(parents=True, exist_ok=True)
    leads_to = {
        "dangling-link": tmp_path / "gone",
        "link-loop": path,
        "link-to-an-overlong-name": tmp_path / ("x" * 300),
    }
    if what in leads_to:
        path.symlink_to(leads_to[what])
    elif what == "a-file":
        path.write_bytes(b"")
    else:
        path.mkdir()
        path.chmod(0o300)  # write and search, no read
        if _still_readable(lambda: os.listdir(path)):
            path.chmod(0o700)
            pytest.skip("this process lists directories whatever their mode (root)")
    try:
        named = store.refusal(f"file:{root}", 10.0)
    finally:
        if what == "unlistable":
            path.chmod(0o700)  # so that tmp_path can be removed
    shown = f"a link to {str(leads_to[what])[:60]!r}" if what in leads_to else what
    require_equal(
        "DSC-011",
        named,
        "--discovery",
        f"opening 'file:{root}' whose {path.relative_to(tmp_path)} is {shown} named "
        f"{named!r}; expected a refusal naming --discovery",
    )


# --- DSC-012: reports and lists ---


@covers("DSC-012")
@requires(STORE)
def test_a_watchers_reports_agree_with_its_list(target: Target) -> None:
    store = target.open_discovery()
    timing = store.timing()
    first_reads: dict[int, set[int]] = {}

    def watch() -> None:
        watcher = store.watch(ENDPOINT)
        first_reads[watcher] = ids(store, watcher)

    def agree(step: str) -> None:
        for watcher, first in first_reads.items():
            last: dict[int, str] = {}
            for kind, instance_id in store.events(watcher):
                last[instance_id] = kind
            replayed = (first | {i for i, kind in last.items() if kind == "added"}) - {
                i for i, kind in last.items() if kind == "removed"
            }
            require_equal(
                "DSC-012",
                ids(store, watcher),
                replayed,
                f"after {step}: watcher {watcher} lists {sorted(ids(store, watcher))}; its "
                f"first read {sorted(first)} and reports {store.events(watcher)} give "
                f"{sorted(replayed)}",
            )

    steps: list[tuple[str, Callable[[], object]]] = []
    workers: list[int] = []
    steps += [
        ("a watcher starts", watch),
        ("three registrations", lambda: workers.extend(store.register(ENDPOINT) for _ in "abc")),
        ("a propagation delay", lambda: store.advance(timing.propagation)),
        ("a second watcher starts", watch),
        ("a withdrawal", lambda: store.withdraw(workers[0])),
        ("a kill", lambda: store.lapse(workers[1])),
        ("a propagation delay", lambda: store.advance(timing.propagation)),
        ("a third watcher starts", watch),
        ("ttl", lambda: store.advance(timing.ttl)),
        ("the store loses its records", store.lose_records),
        ("a registration", lambda: workers.append(store.register(ENDPOINT))),
        ("a propagation delay", lambda: store.advance(timing.propagation)),
        ("a renewal interval", lambda: store.advance(timing.renewal)),
    ]
    for step, act in steps:
        act()
        agree(step)
    first = min(first_reads)
    require_equal(
        "DSC-012",
        ids(store, first),
        {workers[2], workers[3]},
        f"the first watcher ends with {sorted(ids(store, first))}; expected {workers[2:]}",
    )


# --- DSC-013, DSC-014: records that parse but cannot be used; how skips are reported ---

UNUSABLE: dict[str, tuple[bytes, str]] = {
    "unknown-codec": (_record(request_plane_codec="cbor"), "request_plane_codec"),
    "another-transport-kind": (
        _record(transport={"grpc": f"127.0.0.1:1/bad/{ENDPOINT}"}),
        "transport",
    ),
    "no-port": (_record(transport={"tcp": f"127.0.0.1/bad/{ENDPOINT}"}), "transport.tcp"),
    "empty-port": (_record(transport={"tcp": f"127.0.0.1:/bad/{ENDPOINT}"}), "transport.tcp"),
    "port-a-name": (_record(transport={"tcp": f"127.0.0.1:http/bad/{ENDPOINT}"}), "transport.tcp"),
    "port-signed": (_record(transport={"tcp": f"127.0.0.1:+80/bad/{ENDPOINT}"}), "transport.tcp"),
    "port-zero": (_record(transport={"tcp": f"127.0.0.1:0/bad/{ENDPOINT}"}), "transport.tcp"),
    "port-out-of-range": (
        _record(transport={"tcp": f"127.0.0.1:65536/bad/{ENDPOINT}"}),
        "transport.tcp",
    ),
    "no-host": (_record(transport={"tcp": f":80/bad/{ENDPOINT}"}), "transport.tcp"),
    "host-not-a-name": (
        _record(transport={"tcp": f"no such host:80/bad/{ENDPOINT}"}),
        "transport.tcp",
    ),
    "address-not-printable": (
        _record(transport={"tcp": f"127.0.0.1:1/bad/{ENDPOINT}\n"}),
        "transport.tcp",
    ),
    "name-not-utf-8": (_record(namespace="\ud800"), "namespace"),
    "address-not-utf-8": (
        _record(transport={"tcp": f"127.0.0.1:1/bad/{ENDPOINT}\udc80"}),
        "transport.tcp",
    ),
    "id-over-a-u64": (_record(instance_id=2**64), "instance_id"),
    "device-type-not-a-name": (_record(device_type="gp u"), "device_type"),
    "device-type-empty": (_record(device_type=""), "device_type"),
    "id-unlike-its-key": (_record(instance_id=0xBAE), "instance_id"),
    "endpoint-unlike-its-key": (_record(endpoint="other"), "endpoint"),
    "namespace-unlike-its-key": (_record(namespace="other"), "namespace"),
    "component-unlike-its-key": (_record(component="other"), "component"),
    "host-name-over-253": (
        _record(transport={"tcp": f"{'a.' * 126}ab:80/bad/{ENDPOINT}"}),  # 254 characters
        "transport.tcp",
    ),
    "host-unclosed-bracket": (
        _record(transport={"tcp": f"[::1:80/bad/{ENDPOINT}"}),
        "transport.tcp",
    ),
    "host-label-over-63": (
        _record(transport={"tcp": f"{'a' * 64}.example:80/bad/{ENDPOINT}"}),
        "transport.tcp",
    ),
    "too-large": (_record(padding="x" * 70_000), "record"),
}
MALFORMED_FIELDS = {
    "empty": "record",
    "not-json": "record",
    "not-utf-8": "record",
    "too-deep": "record",
    "an-array": "record",
    "another-type": "type",
    "no-type": "type",
    "empty-name": "namespace",
    "slash-in-a-name": "component",
    "slash-in-the-last-name": "endpoint",
    "a-name-not-a-string": "endpoint",
    "id-a-string": "instance_id",
    "id-negative": "instance_id",
    "id-a-boolean": "instance_id",
    "no-tcp-transport": "transport",
    "tcp-without-a-path": "transport.tcp",
    "transport-a-string": "transport",
    "device-type-not-a-string": "device_type",
    "codec-not-a-string": "request_plane_codec",
}
BAD_KEY = f"v1/instances/{ENDPOINT}/bad"


@covers("DSC-013")
@requires(STORE)
@pytest.mark.parametrize("name", list(UNUSABLE))
def test_records_that_cannot_be_used_are_skipped(target: Target, name: str) -> None:
    value, _field = UNUSABLE[name]
    store = target.open_discovery()
    early = store.watch(ENDPOINT)
    worker = store.register(ENDPOINT)
    store.put_raw(ENDPOINT, 0x600D, _record(instance_id=0x600D))
    store.put_raw(ENDPOINT, 0xBAD, value)
    store.advance(store.timing().propagation)
    late = store.watch(ENDPOINT)
    for watcher in (early, late):
        require_equal(
            "DSC-013",
            ids(store, watcher),
            {worker, 0x600D},
            f"watcher {watcher} lists {sorted(map(hex, ids(store, watcher)))}; expected "
            f"{worker:#x} and 0x600d, and not 0xbad, whose record is unusable ({name})",
        )


USABLE_HOSTS = {
    "ipv6-in-brackets": "[::1]",
    "ipv6-bare": "::1",
    "ipv4-mapped-ipv6-in-brackets": "[::ffff:127.0.0.1]",
    "name-with-a-trailing-dot": "localhost.",
    "name-of-253": f"{'a.' * 125}abc",  # 253 characters: the longest DNS name
    "label-of-63": f"{'a' * 63}.example",  # the longest label
    "label-with-underscore-and-dash": "w_1-a.example",
}


@covers("DSC-013")
@requires(STORE)
@pytest.mark.parametrize("name", list(USABLE_HOSTS))
def test_a_record_whose_host_is_at_a_bound_is_listed(target: Target, name: str) -> None:
    """The other side of the address bounds: hosts that are IP addresses (IPv6 with or
    without brackets) or DNS names up to 253 characters, labels up to 63, are usable."""
    host = USABLE_HOSTS[name]
    address = f"{host}:80/bad/{ENDPOINT}"
    store = target.open_discovery()
    store.put_raw(ENDPOINT, 0xBAD, _record(transport={"tcp": address}))
    watcher = store.watch(ENDPOINT)
    listed = store.listed(watcher)
    require(
        "DSC-013",
        0xBAD in listed and listed[0xBAD].address == address and not store.skipped(watcher),
        f"a record whose host is {host!r} ({len(host)} characters) is usable and should be "
        f"listed; the watcher lists {listed} and skipped {store.skipped(watcher)}",
    )


@covers("DSC-013")
@requires(STORE)
def test_a_record_overwritten_with_an_unusable_one_is_removed(target: Target) -> None:
    store = target.open_discovery()
    delay = store.timing().propagation
    watcher = store.watch(ENDPOINT)
    store.put_raw(ENDPOINT, 0xBAD, _record())
    store.advance(delay)
    require_equal(
        "DSC-013", ids(store, watcher), {0xBAD}, "the usable record of 0xbad is not listed"
    )
    store.put_raw(ENDPOINT, 0xBAD, _record(request_plane_codec="cbor"))
    store.advance(delay)
    require_equal(
        "DSC-013",
        (ids(store, watcher), store.events(watcher)),
        (set(), (("added", 0xBAD), ("removed", 0xBAD))),
        f"after 0xbad's record became unusable the watcher lists "
        f"{sorted(map(hex, ids(store, watcher)))} and reported {store.events(watcher)}",
    )


@covers("DSC-014")
@requires(STORE)
@pytest.mark.parametrize("name", [*MALFORMED, *UNUSABLE])
def test_a_skipped_record_is_reported_once_naming_it_and_the_field(
    target: Target, name: str
) -> None:
    if name in MALFORMED:
        value, field = MALFORMED[name], MALFORMED_FIELDS[name]
    else:
        value, field = UNUSABLE[name]
    store = target.open_discovery()
    delay = store.timing().propagation
    early = store.watch(ENDPOINT)
    store.put_raw(ENDPOINT, 0x600D, _record(instance_id=0x600D))
    store.put_raw(ENDPOINT, 0xBAD, value)
    store.advance(delay)
    late = store.watch(ENDPOINT)
    store.advance(3 * delay)  # the store is read again, and the record with it
    for watcher in (early, late):
        require_equal(
            "DSC-014",
            store.skipped(watcher),
            ((BAD_KEY, field),),
            f"watcher {watcher} reported {store.skipped(watcher)} for the {name} record at "
            f"{BAD_KEY}; expected one report naming the field {field!r}",
        )


@covers("DSC-014")
@requires(STORE)
def test_an_unreadable_record_is_reported_naming_record(target: Target) -> None:
    """A record file this process cannot read (mode ``000``) is skipped and reported once,
    naming ``record`` (the value as a whole), and the endpoint's other records are listed."""
    store = target.open_discovery()
    if not store.address().startswith("file:"):
        pytest.skip(f"the target's store is {store.address()!r}, not a file store")
    store.put_raw(ENDPOINT, 0x600D, _record(instance_id=0x600D))
    store.put_raw(ENDPOINT, 0xBAD, _record())
    directory = Path(store.address().removeprefix("file:")) / "v1" / "instances"
    (path,) = (
        p
        for p in directory.iterdir()
        if urllib.parse.unquote(p.name) == BAD_KEY.removeprefix("v1/instances/")
    )
    path.chmod(0)
    try:
        if _still_readable(path.read_bytes):
            pytest.skip("this process reads files whatever their mode (root)")
        watcher = store.watch(ENDPOINT)
        store.advance(3 * store.timing().propagation)  # the store is read again
        seen = (ids(store, watcher), store.skipped(watcher))
    finally:
        path.chmod(0o600)
    require_equal(
        "DSC-014",
        seen,
        ({0x600D}, ((BAD_KEY, "record"),)),
        f"with the record file {path.name} unreadable (mode 000) the watcher lists and "
        "reports (listed, skipped)",
    )


@covers("DSC-008", "DSC-014")
@requires(STORE)
@pytest.mark.parametrize("value", [False, True], ids=["false", "true"])
def test_a_boolean_id_is_malformed_even_under_the_key_it_equals(
    target: Target, value: bool
) -> None:
    """JSON's ``true`` and ``false`` are not the integers 1 and 0: a record whose
    ``instance_id`` is a boolean is malformed under any key, ``.../1`` and ``.../0`` too."""
    instance_id = int(value)
    key = f"v1/instances/{ENDPOINT}/{instance_id:x}"
    store = target.open_discovery()
    store.put_raw(ENDPOINT, 0x600D, _record(instance_id=0x600D))
    store.put_raw(
        ENDPOINT,
        instance_id,
        _record(instance_id=value, transport={"tcp": _address_of(instance_id)}),
    )
    watcher = store.watch(ENDPOINT)
    store.advance(3 * store.timing().propagation)
    require_equal(
        "DSC-008",
        ids(store, watcher),
        {0x600D},
        f"the watcher lists {sorted(map(hex, ids(store, watcher)))}; expected 0x600d, and not "
        f"the record under {key} whose instance_id is {json.dumps(value)}",
    )
    require_equal(
        "DSC-014",
        store.skipped(watcher),
        ((key, "instance_id"),),
        f"the watcher reported {store.skipped(watcher)} for the record under {key} whose "
        f"instance_id is {json.dumps(value)}; expected one report naming 'instance_id'",
    )


NOT_AN_ID = {"not-hex": "xyz", "over-16-digits": "1" * 17, "signed": "-1"}


@covers("DSC-013", "DSC-014")
@requires(STORE)
@pytest.mark.parametrize("name", list(NOT_AN_ID))
def test_a_record_under_a_key_without_an_instance_id_is_skipped(target: Target, name: str) -> None:
    """A usable record stored under a key whose last part is not a hex instance id does not
    match its key (DSC-013): it is skipped, and reported once naming ``key`` (DSC-014)."""
    key = f"v1/instances/{ENDPOINT}/{NOT_AN_ID[name]}"
    store = target.open_discovery()
    delay = store.timing().propagation
    early = store.watch(ENDPOINT)
    store.put_raw(ENDPOINT, 0x600D, _record(instance_id=0x600D))
    store.put_raw_key(key, _record())
    store.advance(delay)
    late = store.watch(ENDPOINT)
    store.advance(3 * delay)  # the store is read again, and the record with it
    for watcher in (early, late):
        require_equal(
            "DSC-013",
            ids(store, watcher),
            {0x600D},
            f"watcher {watcher} lists {sorted(map(hex, ids(store, watcher)))}; expected 0x600d, "
            f"and not the record under {key} ({name})",
        )
        require_equal(
            "DSC-014",
            store.skipped(watcher),
            ((key, "key"),),
            f"watcher {watcher} reported {store.skipped(watcher)} for the record under {key}; "
            "expected one report naming the field 'key'",
        )


@covers("DSC-014")
@requires(STORE)
def test_a_skipped_record_is_reported_again_only_when_its_fault_changes(
    target: Target,
) -> None:
    store = target.open_discovery()
    delay = store.timing().propagation
    watcher = store.watch(ENDPOINT)
    steps = [
        ("an unknown codec", _record(request_plane_codec="cbor")),
        ("the same fault, other bytes", _record(request_plane_codec="cbor", padding="x")),
        ("another fault", _record(device_type="gp u")),
        ("a usable record", _record()),
    ]
    for _step, value in steps:
        store.put_raw(ENDPOINT, 0xBAD, value)
        store.advance(2 * delay)
    expected = ((BAD_KEY, "request_plane_codec"), (BAD_KEY, "device_type"))
    require_equal(
        "DSC-014",
        store.skipped(watcher),
        expected,
        f"after {', then '.join(step for step, _ in steps)} under {BAD_KEY}, the watcher "
        f"reported {store.skipped(watcher)}",
    )
    require_equal(
        "DSC-014", ids(store, watcher), {0xBAD}, "the record, usable again, is not listed"
    )


TCP = f"127.0.0.1:1/bad/{ENDPOINT}"
SAME_FIELD_FAULTS: dict[str, tuple[str, bytes, bytes]] = {  # id: field, then two faults of it
    "id-negative-then-a-string": (
        "instance_id",
        _record(instance_id=-0xBAD),
        _record(instance_id="2989"),
    ),
    "empty-name-then-a-slash": ("namespace", _record(namespace=""), _record(namespace="a/b")),
    "name-a-number-then-a-bell": ("component", _record(component=5), _record(component="b\a")),
    "tcp-a-number-then-a-bell": (
        "transport.tcp",
        _record(transport={"tcp": 5}),
        _record(transport={"tcp": "a\a:1/x"}),
    ),
    "tcp-without-a-port-then-a-port-past-65535": (
        "transport.tcp",
        _record(transport={"tcp": TCP.replace(":1/", "/")}),
        _record(transport={"tcp": TCP.replace(":1/", ":70000/")}),
    ),
    "tcp-without-a-port-then-a-named-port": (
        "transport.tcp",
        _record(transport={"tcp": TCP.replace(":1/", "/")}),
        _record(transport={"tcp": TCP.replace(":1/", ":http/")}),
    ),
    "device-a-number-then-a-space": (
        "device_type",
        _record(device_type=5),
        _record(device_type="bad device"),
    ),
    "codec-unknown-then-null": (
        "request_plane_codec",
        _record(request_plane_codec="cbor"),
        _record(request_plane_codec=None),
    ),
    "transport-a-list-then-a-string": (
        "transport",
        _record(transport=[]),
        _record(transport="tcp"),
    ),
    "transport-empty-then-another-kind": (
        "transport",
        _record(transport={}),
        _record(transport={"nats_tcp": "x"}),
    ),
    "type-another-then-null": ("type", _record(type="Model"), _record(type=None)),
    "record-an-array-then-a-number": ("record", b"[1]", b"5"),
    "record-cut-json-then-not-utf-8": ("record", b"{", b"\xff\xfe"),
    # the same fault, another value at fault
    "tcp-without-a-path-twice": (
        "transport.tcp",
        _record(transport={"tcp": "127.0.0.1:1"}),
        _record(transport={"tcp": "127.0.0.2:1"}),
    ),
    "tcp-port-past-65535-twice": (
        "transport.tcp",
        _record(transport={"tcp": TCP.replace(":1/", ":70000/")}),
        _record(transport={"tcp": TCP.replace(":1/", ":80000/")}),
    ),
    "tcp-host-not-a-name-twice": (
        "transport.tcp",
        _record(transport={"tcp": TCP.replace("127.0.0.1", "bad host!")}),
        _record(transport={"tcp": TCP.replace("127.0.0.1", "worse host!")}),
    ),
    "transport-without-tcp-twice": (
        "transport",
        _record(transport={"nats_tcp": "x"}),
        _record(transport={"http": "y"}),
    ),
    "name-not-the-keys-twice": (
        "endpoint",
        _record(endpoint="elsewhere"),
        _record(endpoint="anywhere"),
    ),
    "id-not-the-keys-twice": (
        "instance_id",
        _record(instance_id=0xBEE),
        _record(instance_id=0xBEF),
    ),
}


@covers("DSC-014")
@requires(STORE)
@pytest.mark.parametrize("faults", list(SAME_FIELD_FAULTS))
def test_another_fault_of_the_same_field_is_reported_again(target: Target, faults: str) -> None:
    """The record's fault changes but stays in one field (a value of the wrong type, then
    one its field does not allow; two different faults of one string; or the same fault of
    another value): that is a new fault, so the watcher reports the record again, naming the
    same field."""
    field, first, second = SAME_FIELD_FAULTS[faults]
    store = target.open_discovery()
    delay = store.timing().propagation
    watcher = store.watch(ENDPOINT)
    for value in (first, second):
        store.put_raw(ENDPOINT, 0xBAD, value)
        store.advance(2 * delay)
    require_equal(
        "DSC-014",
        store.skipped(watcher),
        ((BAD_KEY, field),) * 2,
        f"a record under {BAD_KEY} skipped for {field}, then stored with another fault of "
        f"{field} ({faults.replace('-', ' ')}): the watcher reported {store.skipped(watcher)}",
    )


@covers("DSC-014")
@requires(STORE)
@pytest.mark.parametrize("kind", STORES)
def test_a_skipped_record_that_comes_back_is_reported_again(
    target: Target, kind: str | None
) -> None:
    """A skipped record is reported once per stay in the store: stored, gone (the store lost
    its records), then stored again with the same fault, it is reported twice."""
    store = opened(target, kind)
    delay = store.timing().propagation
    watcher = store.watch(ENDPOINT)
    unusable = _record(request_plane_codec="cbor")
    store.put_raw(ENDPOINT, 0xBAD, unusable)
    store.advance(2 * delay)
    store.lose_records()
    store.advance(2 * delay)
    store.put_raw(ENDPOINT, 0xBAD, unusable)
    store.advance(2 * delay)
    require_equal(
        "DSC-014",
        store.skipped(watcher),
        ((BAD_KEY, "request_plane_codec"),) * 2,
        f"a cbor record under {BAD_KEY}, lost with the store's records, then stored again: "
        f"the watcher reported {store.skipped(watcher)}",
    )


# --- DSC-015: refused registrations ---

UNREGISTRABLE = [
    pytest.param(ENDPOINT, "gp u", "127.0.0.1", "--device-type", id="device-with-a-space"),
    pytest.param(ENDPOINT, "", "127.0.0.1", "--device-type", id="empty-device"),
    pytest.param(ENDPOINT, "d" * 65, "127.0.0.1", "--device-type", id="device-of-65"),
    pytest.param(ENDPOINT, "cuda", "not a host!", "--host", id="host-not-a-name"),
    pytest.param(ENDPOINT, "cuda", "", "--host", id="empty-host"),
    pytest.param("dsc/backend/gen\x07", "cuda", "127.0.0.1", "--endpoint", id="unprintable"),
    # a record past 64 KiB (DSC-013), made so by the endpoint or by the host
    pytest.param("dsc/backend/" + "g" * 70_000, "cuda", "127.0.0.1", "--endpoint", id="long-name"),
    pytest.param(ENDPOINT, "cuda", ".".join(["h" * 60] * 1_200), "--host", id="long-host"),
]


@covers("DSC-015")
@requires(STORE)
@pytest.mark.parametrize(("endpoint", "device", "host", "option"), UNREGISTRABLE)
def test_a_record_watchers_would_skip_is_never_registered(
    target: Target, endpoint: str, device: str, host: str, option: str
) -> None:
    """The registration is refused, naming the option at fault, and the endpoint's watcher
    then lists, reports and skips nothing; the same worker with a device name (64
    characters, the longest) and a host name registers and is listed."""
    store = target.open_discovery()
    delay = store.timing().propagation
    watcher = store.watch(endpoint)
    named = store.register_refusal(endpoint, device=device, host=host)
    require_equal(
        "DSC-015",
        named,
        option,
        f"registering {endpoint!r} with device type {device!r} at host {host!r} should be "
        f"refused naming {option}",
    )
    store.advance(2 * delay)
    seen = (store.listed(watcher), store.events(watcher), store.skipped(watcher))
    require_equal(
        "DSC-015",
        seen,
        ({}, (), ()),
        f"after the refused registration the watcher of {endpoint!r} lists, reports and "
        f"skips (listed, events, skipped)",
    )
    usable = store.register_refusal(ENDPOINT, device="d" * 64, host="worker-1.example")
    require_compare(
        "DSC-015", usable, "is", None, f"a usable registration of {ENDPOINT} was refused"
    )
    if endpoint == ENDPOINT:
        store.advance(2 * delay)
        require_equal(
            "DSC-015",
            len(store.listed(watcher)),
            1,
            f"the usable registration of {ENDPOINT} is not listed by its watcher",
        )


NOT_AN_ENDPOINT = {
    "four-names": f"{ENDPOINT}/more",
    "two-names": "dsc/backend",
    "an-empty-name": "dsc//generate",
    "four-dotted-names": f"{ENDPOINT.replace('/', '.')}.more",
}


@covers("DSC-015")
@requires(STORE)
@pytest.mark.parametrize("name", list(NOT_AN_ENDPOINT))
def test_an_endpoint_without_three_names_is_never_registered(target: Target, name: str) -> None:
    """An endpoint is three non-empty names: a worker asked to serve anything else is refused,
    naming ``--endpoint``, and no record of it is stored under any endpoint's key (not under
    its first three names either)."""
    endpoint = NOT_AN_ENDPOINT[name]
    store = target.open_discovery()
    watcher = store.watch(ENDPOINT)
    named = store.register_refusal(endpoint)
    require_equal(
        "DSC-015",
        named,
        "--endpoint",
        f"registering {endpoint!r} ({name}) should be refused naming --endpoint",
    )
    store.advance(2 * store.timing().propagation)
    seen = (store.listed(watcher), store.events(watcher), store.skipped(watcher))
    require_equal(
        "DSC-015",
        seen,
        ({}, (), ()),
        f"after the refused registration of {endpoint!r} the watcher of {ENDPOINT} lists, "
        "reports and skips (listed, events, skipped)",
    )


@covers("DSC-018")
@requires(STORE)
def test_entries_of_a_file_store_that_are_not_files_are_not_records(target: Target) -> None:
    """A FIFO and a directory named with the endpoint's keys: the watcher lists neither and
    never opens the FIFO (its reader would wait for a writer forever: the check plays that
    writer to free it, and fails), and goes on listing the records, old and new."""
    store = target.open_discovery()
    if not store.address().startswith("file:"):
        pytest.skip(f"the target's store is {store.address()!r}, not a file store")
    delay = store.timing().propagation
    store.put_raw(ENDPOINT, 0x600D, _record(instance_id=0x600D))
    directory = Path(store.address().removeprefix("file:")) / "v1" / "instances"
    fifo = directory / urllib.parse.quote(f"{ENDPOINT}/f1f0", safe="")
    os.mkfifo(fifo)
    (directory / urllib.parse.quote(f"{ENDPOINT}/d1", safe="")).mkdir()
    opened: list[float] = []  # when a reader was found waiting on the FIFO
    done = threading.Event()

    def free_readers() -> None:
        while not done.wait(0.02):
            try:  # succeeds only while a reader has the FIFO open: it then reads an EOF
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                continue
            opened.append(time.monotonic())

    freer = threading.Thread(target=free_readers, daemon=True)
    freer.start()
    try:
        watcher = store.watch(ENDPOINT)
        store.advance(3 * delay)
        worker = store.register(ENDPOINT)
        store.advance(delay)
    finally:
        done.set()
        freer.join()
    require(
        "DSC-018",
        not opened,
        f"the watcher opened the FIFO {fifo.name} as a record {len(opened)} times (freed by "
        "the check each time); a reader of a FIFO waits for a writer forever",
    )
    require_equal(
        "DSC-018",
        ids(store, watcher),
        {0x600D, worker},
        f"with a FIFO (…/f1f0) and a directory (…/d1) among the records the watcher lists "
        f"{sorted(map(hex, ids(store, watcher)))}; expected 0x600d and {worker:#x}",
    )


@covers("DSC-018")
@requires(STORE)
def test_a_link_in_a_file_store_is_not_a_record(target: Target) -> None:
    """A symbolic link named with the endpoint's key, to a file holding a usable record of
    that key, is not a regular file of the store: the watcher does not list it (its liveness
    would be another file's mtime, and a link makes watchers read any file of the host)."""
    store = target.open_discovery()
    if not store.address().startswith("file:"):
        pytest.skip(f"the target's store is {store.address()!r}, not a file store")
    delay = store.timing().propagation
    store.put_raw(ENDPOINT, 0x600D, _record(instance_id=0x600D))
    root = Path(store.address().removeprefix("file:"))
    elsewhere = root / "elsewhere.json"  # outside v1/instances
    elsewhere.write_bytes(_record(instance_id=0x5E1F, transport={"tcp": _address_of(0x5E1F)}))
    link = root / "v1" / "instances" / urllib.parse.quote(f"{ENDPOINT}/5e1f", safe="")
    link.symlink_to(elsewhere)
    watcher = store.watch(ENDPOINT)
    store.advance(3 * delay)
    require_equal(
        "DSC-018",
        ids(store, watcher),
        {0x600D},
        f"with a link {link.name} -> {elsewhere.name} (a usable record of 0x5e1f) the watcher "
        f"lists {sorted(map(hex, ids(store, watcher)))}; expected only 0x600d",
    )
