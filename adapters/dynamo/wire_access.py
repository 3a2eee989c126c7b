"""Reaching real Dynamo processes on their wire from outside (Capability.WIRE_TRANSPORT,
Capability.OBSERVE_WORKER_BYTES on the ``dynamo`` adapter).

A worker's request-plane address is read from its discovery record, as any Dynamo client
reads it; the client's response-stream address is the port its process listens on. Bytes a
worker received are the kernel's per-connection count (``ss``'s ``bytes_received``) on the
connections its request-plane port accepted, summed over every connection seen so far.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import urllib.parse
from pathlib import Path

CONNECT_LIMIT = 5.0
"""Real seconds ``send_raw`` may take to connect and write."""

_SS_INODE = re.compile(r"\bino:(\d+)")
_SS_RECEIVED = re.compile(r"\bbytes_received:(\d+)")


def record_address(store: Path, instance_id: int) -> tuple[str, int]:
    """``(host, port)`` of the TCP request plane in the instance's file-store record."""
    for path in (store / "v1" / "instances").glob("*"):
        if not urllib.parse.unquote(path.name).endswith(f"/{instance_id:x}"):
            continue
        record = json.loads(path.read_text())
        if int(record.get("instance_id", -1)) != instance_id:
            continue
        host, _, port = str(record["transport"]["tcp"]).partition("/")[0].rpartition(":")
        return host, int(port)
    raise LookupError(f"no discovery record for instance {instance_id} in {store}")


def listening_ports(pid: int) -> list[int]:
    """The TCP ports process ``pid`` listens on (IPv4), read from ``/proc``."""
    inodes: set[str] = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            link = os.readlink(fd)
        except OSError:
            continue  # closed meanwhile
        if link.startswith("socket:["):
            inodes.add(link[len("socket:[") : -1])
    ports = []
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
            ports.append(int(fields[1].rpartition(":")[2], 16))
    return sorted(ports)


def send_raw(address: tuple[str, int], data: bytes) -> None:
    """Connect, write ``data``, close: the peer may reset or close first, which is its answer."""
    try:
        with socket.create_connection(address, timeout=CONNECT_LIMIT) as stream:
            stream.sendall(data)
    except OSError:
        pass


class ReceivedBytes:
    """Bytes received on the connections a listening port accepted, including closed ones
    seen at an earlier reading (keyed by socket inode; each reading keeps the maximum)."""

    def __init__(self, port: int) -> None:
        self._port = port
        self._seen: dict[str, int] = {}

    def total(self) -> int:
        shown = subprocess.run(
            ["ss", "-tineH", "state", "established", f"( sport = :{self._port} )"],
            capture_output=True,
            text=True,
            check=True,
            timeout=CONNECT_LIMIT,
        ).stdout
        for inode, received in _connections(shown):
            self._seen[inode] = max(self._seen.get(inode, 0), received)
        return sum(self._seen.values())


def _connections(shown: str) -> list[tuple[str, int]]:
    """``(inode, bytes_received)`` per connection in ``ss -tineH`` output, where a
    connection's details continue on indented lines."""
    blocks: list[str] = []
    for line in shown.splitlines():
        if line[:1].isspace() and blocks:
            blocks[-1] += " " + line
        elif line.strip():
            blocks.append(line)
    found = []
    for block in blocks:
        inode, received = _SS_INODE.search(block), _SS_RECEIVED.search(block)
        if inode is not None:
            found.append((inode.group(1), int(received.group(1)) if received else 0))
    return found
