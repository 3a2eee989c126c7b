"""KV-aware selection: a prefix-block index per worker and the default cost (KVS)."""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from itertools import accumulate, compress, repeat

import attrs

from routespec.errors import ErrorKind, RoutingError

DEFAULT_BLOCK_SIZE = 16


def block_hashes(tokens: Sequence[int], block_size: int) -> list[int]:
    """Chained hashes of the full blocks: a block's hash covers every token before it."""
    # full blocks as tuples, chunked in C; a partial last block is left out
    blocks = zip(*[iter(tokens)] * block_size, strict=False)
    chained = accumulate(blocks, lambda parent, block: hash((parent, block)), initial=0)
    return list(chained)[1:]


KV_INDEX_BLOCKS = 1 << 16  # per worker (KVS-017)
NO_HOLDERS: frozenset[int] = frozenset()


@attrs.define
class PrefixIndex:
    """Which blocks each worker holds, as routing decisions predict it (KVS-001); each
    worker keeps its ``max_blocks`` most recently recorded blocks, so memory is bounded
    (KVS-017).

    Kept both ways: each worker's blocks (for eviction) and each block's holders (to match
    a prompt against every worker at once, as a radix tree of chained block hashes would).
    """

    max_blocks: int = KV_INDEX_BLOCKS
    _cached: dict[int, dict[int, None]] = attrs.field(factory=dict)  # insertion-ordered sets
    _holders: dict[int, set[int]] = attrs.field(factory=dict)  # block -> workers holding it

    def record(self, worker_id: int, hashes: Iterable[int]) -> None:
        """O(1) per block recorded or evicted."""
        held = self._cached.setdefault(worker_id, {})
        for block in hashes:
            if block in held:
                del held[block]
            else:
                self._holders.setdefault(block, set()).add(worker_id)
            held[block] = None  # most recent last
        while len(held) > self.max_blocks:
            evicted = next(iter(held))
            del held[evicted]
            holders = self._holders[evicted]
            holders.discard(worker_id)
            if not holders:
                del self._holders[evicted]

    def overlaps(self, hashes: Sequence[int]) -> dict[int, int]:
        """``overlap`` of every worker holding the first block (the others' is 0), walking
        the prompt's blocks once while any worker still holds all of them: O(matched
        blocks) steps, each a set intersection over the workers still matching."""
        holders, matched = self._holders, {}
        alive: AbstractSet[int] = holders.get(hashes[0], NO_HOLDERS) if hashes else NO_HOLDERS
        depth, end = 1, len(hashes)
        while alive and depth < end:
            next_holders = holders.get(hashes[depth], NO_HOLDERS)
            if not alive <= next_holders:  # some matching worker stops here
                kept = alive & next_holders
                matched.update(dict.fromkeys(alive - kept, depth))
                alive = kept
            depth += 1
        matched.update(dict.fromkeys(alive, depth))
        return matched


@attrs.define(eq=False)
class KvBooking:
    """One admitted request's load on its worker; released exactly once, by its admission
    (``HostAdmission.release``)."""

    _scheduler: KvScheduler
    worker_id: int
    blocks: int

    def release(self) -> None:
        self._scheduler._unbook(self)


@attrs.define
class KvScheduler:
    block_size: int = DEFAULT_BLOCK_SIZE
    temperature: float = 0.0
    rng: random.Random = attrs.field(factory=random.Random)
    kv_index_blocks: int = KV_INDEX_BLOCKS
    index: PrefixIndex = attrs.field(
        default=attrs.Factory(lambda self: PrefixIndex(self.kv_index_blocks), takes_self=True)
    )
    _requests: dict[int, int] = attrs.field(factory=dict)  # worker -> active requests
    _blocks: dict[int, int] = attrs.field(factory=dict)  # worker -> active decode blocks
    _last: tuple[Sequence[int] | None, list[int]] = (None, [])

    def __attrs_post_init__(self) -> None:
        if self.block_size < 1 or self.temperature < 0 or self.kv_index_blocks < 1:
            raise RoutingError(
                ErrorKind.INVALID_ARGUMENT,
                f"block_size={self.block_size} and kv_index_blocks={self.kv_index_blocks} "
                f"must be >= 1 and temperature={self.temperature} >= 0 (KVS-010)",
            )

    def request_blocks(self, tokens: Sequence[int]) -> int:
        return math.ceil(len(tokens) / self.block_size)

    def hashes(self, tokens: Sequence[int]) -> list[int]:
        """The prompt's block hashes, O(T); the last prompt's are kept, so selecting,
        booking and recording one request hash it once (the list must not be mutated)."""
        last_tokens, last_hashes = self._last
        if tokens is not last_tokens:
            last_hashes = block_hashes(tokens, self.block_size)
            self._last = (tokens, last_hashes)  # holding ``tokens`` keeps its id unique
        return last_hashes

    def _relative_costs(self, tokens: Sequence[int], candidates: Iterable[int]) -> dict[int, int]:
        """Each candidate's cost (KVS-002: prefill blocks not cached on the worker plus decode
        blocks active on it, the request's blocks counted twice) less the request's own
        blocks, which are the same for every worker; in candidate order. For N candidates
        and a prompt of T tokens in B blocks: O(T) to hash it (once per request), O(sum of
        matched blocks) set probes to match it against every worker through the block index
        (at most B steps), then O(N) C-level reads of the decode load and one update per
        matching worker."""
        matched = self.index.overlaps(self.hashes(tokens))
        workers = list(candidates)
        relative = dict(zip(workers, map(self._blocks.get, workers, repeat(0)), strict=True))
        for worker, overlap in matched.items():
            if worker in relative:
                relative[worker] -= overlap
        return relative

    def select(self, tokens: Sequence[int], candidates: Sequence[int]) -> int:
        # ranking and softmax weights do not change when every cost moves by the same amount
        costs = self._relative_costs(tokens, candidates)
        if self.temperature == 0:
            lowest = min(costs.values())
            tied = list(compress(costs, map(lowest.__eq__, costs.values())))
            return self.rng.choice(tied)  # KVS-003
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
