"""Choose a discovery store from its command-line spelling: ``file:DIR`` or ``etcd:URL``."""

from __future__ import annotations

from routespec.discovery.etcd_store import EtcdStore
from routespec.discovery.file_store import DEFAULT_TTL, FileStore, default_root
from routespec.discovery.store import FIELD, DiscoveryError, DiscoveryStore

EXAMPLES = "file:DIR or etcd:http://HOST:PORT"


def open_store(spec: str | None, ttl: float = DEFAULT_TTL) -> DiscoveryStore:
    """The store ``spec`` names; None is the default file store ($DYN_FILE_KV, like Dynamo).

    A malformed ``spec`` or a non-positive ``ttl`` is a ``DiscoveryError`` naming its argument
    (DSC-011)."""
    if ttl <= 0:
        raise DiscoveryError("--ttl", f"must be positive, got {ttl}")
    if spec is None:
        return FileStore(default_root(), ttl)
    scheme, _, location = spec.partition(":")
    if scheme == "file" and location:
        return FileStore(location, ttl)
    if scheme == "etcd" and location:
        return EtcdStore(location, ttl)
    raise DiscoveryError(FIELD, f"expected {EXAMPLES}, got {spec!r}")
