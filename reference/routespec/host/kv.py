"""KV-aware selection: a prefix-block index per worker and the default cost (KVS)."""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence

import attrs

from routespec.errors import ErrorKind, RoutingError

DEFAULT_BLOCK_SIZE = 16


def block_hashes(tokens: Sequence[int], block_size: int) -> list[int]:
    """Chained hashes of the full blocks: a block's hash covers every token before it."""
    hashes: list[int] = []
    parent = 0
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = hash((parent, tuple(tokens[start : start + block_size])))
        hashes.append(parent)
    return hashes


MAX_BLOCKS_PER_WORKER = 1 << 16


@attrs.define
class PrefixIndex:
    """Which blocks each worker holds, as routing decisions predict it (KVS-001); each
    worker keeps its ``max_blocks`` most recently recorded blocks, so memory is bounded."""

    max_blocks: int = MAX_BLOCKS_PER_WORKER
    _cached: dict[int, dict[int, None]] = attrs.field(factory=dict)  # insertion-ordered sets

    def record(self, worker_id: int, hashes: Iterable[int]) -> None:
        held = self._cached.setdefault(worker_id, {})
        for block in hashes:
            held.pop(block, None)
            held[block] = None  # most recent last
        while len(held) > self.max_blocks:
            del held[next(iter(held))]

    def overlap(self, worker_id: int, hashes: Sequence[int]) -> int:
        """The number of leading blocks the worker holds."""
        held = self._cached.get(worker_id, {})
        count = 0
        for block in hashes:
            if block not in held:
                break
            count += 1
        return count


@attrs.define(eq=False)
class KvBooking:
    """One admitted request's load on its worker; released exactly once."""

    _scheduler: KvScheduler
    worker_id: int
    blocks: int
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self._scheduler._unbook(self)

    def retarget(self, worker_id: int) -> None:
        """Move the load to the worker transport fallback actually used."""
        self._scheduler._unbook(self)
        self.worker_id = worker_id
        self._scheduler._add(self)


@attrs.define
class KvScheduler:
    block_size: int = DEFAULT_BLOCK_SIZE
    temperature: float = 0.0
    rng: random.Random = attrs.field(factory=random.Random)
    index: PrefixIndex = attrs.field(factory=PrefixIndex)
    _requests: dict[int, int] = attrs.field(factory=dict)  # worker -> active requests
    _blocks: dict[int, int] = attrs.field(factory=dict)  # worker -> active decode blocks

    def __attrs_post_init__(self) -> None:
        if self.block_size < 1 or self.temperature < 0:
            raise RoutingError(
                ErrorKind.INVALID_ARGUMENT,
                f"block_size={self.block_size} must be >= 1 and temperature="
                f"{self.temperature} >= 0 (KVS-010)",
            )

    def request_blocks(self, tokens: Sequence[int]) -> int:
        return math.ceil(len(tokens) / self.block_size)

    def costs(self, tokens: Sequence[int], candidates: Iterable[int]) -> dict[int, int]:
        """Prefill blocks not cached on the worker plus decode blocks active on it (KVS-002)."""
        hashes = block_hashes(tokens, self.block_size)
        own = self.request_blocks(tokens)
        return {
            worker: own - self.index.overlap(worker, hashes) + self._blocks.get(worker, 0) + own
            for worker in candidates
        }

    def select(self, tokens: Sequence[int], candidates: Sequence[int]) -> int:
        costs = self.costs(tokens, candidates)
        if self.temperature == 0:
            lowest = min(costs.values())
            return self.rng.choice([w for w in candidates if costs[w] == lowest])  # KVS-003
        return self._sample(costs)

    def _sample(self, costs: Mapping[int, int]) -> int:
        """Softmax over costs normalised to [0, 1]; lower cost, higher weight (KVS-004)."""
        low, high = min(costs.values()), max(costs.values())
        span = (high - low) or 1
        workers = list(costs)
        weights = [math.exp(-((costs[w] - low) / span) / self.temperature) for w in workers]
        return self.rng.choices(workers, weights)[0]

    def book(self, worker_id: int, tokens: Sequence[int]) -> KvBooking:
        booking = KvBooking(self, worker_id, self.request_blocks(tokens))
        self._add(booking)
        return booking

    def _add(self, booking: KvBooking) -> None:
        worker = booking.worker_id
        self._requests[worker] = self._requests.get(worker, 0) + 1
        self._blocks[worker] = self._blocks.get(worker, 0) + booking.blocks

    def active_requests(self) -> Mapping[int, int]:
        return {w: n for w, n in self._requests.items() if n}

    def _unbook(self, booking: KvBooking) -> None:
        self._requests[booking.worker_id] -= 1
        self._blocks[booking.worker_id] -= booking.blocks
