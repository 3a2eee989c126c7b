"""Choose a discovery store from its command-line spelling: ``file:DIR`` or ``etcd:URL``.

The etcd store needs httpx, the optional ``etcd`` extra: it is imported only when an
``etcd:`` store is asked for, and refuses the spelling itself when httpx is missing."""

from __future__ import annotations

import math

from routespec.discovery.file_store import DEFAULT_TTL, FileStore, default_root
from routespec.discovery.store import FIELD, DiscoveryError, DiscoveryStore

EXAMPLES = "file:DIR or etcd:http://HOST:PORT"


def open_store(spec: str | None, ttl: float = DEFAULT_TTL) -> DiscoveryStore:
    """The store ``spec`` names; None is the default file store ($DYN_FILE_KV, like Dynamo).

    A malformed ``spec``, a ``ttl`` that is not a finite positive number of seconds or an etcd
    store without the ``etcd`` extra is a ``DiscoveryError`` naming its argument (DSC-011)."""
    if not 0 < ttl < math.inf:
        raise DiscoveryError("--ttl", f"must be a finite number of seconds > 0, got {ttl}")
    if spec is None:
        return FileStore(default_root(), ttl)
    scheme, _, location = spec.partition(":")
    if scheme == "file" and location:
        return FileStore(location, ttl)
    if scheme == "etcd" and location:
        from routespec.discovery.etcd_store import EtcdStore  # needs the extra: DSC-011

        return EtcdStore(location, ttl)
    raise DiscoveryError(FIELD, f"expected {EXAMPLES}, got {spec!r}")
