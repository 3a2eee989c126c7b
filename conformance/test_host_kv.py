"""KV selection and route plans (KVS): the block index the host keeps from its own routing
decisions, the cost it selects by, and what previews, plans and probes admit.

A small oracle models the KV host: a block is identified by the whole token prefix it ends
(the same as a hash chained over every block before it), each worker caches the full blocks
of the requests dispatched to it, and its active decode blocks are those of its open
requests. Requests are token requests (``HostRoute``); a worker scripted ``Stall(0)`` keeps
a request open, and so booked, until it is released.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from routespec.conformance.checks import covers, require, require_compare, require_equal, requires
from routespec.conformance.host import ended, host_of, planned, refused_at_construction, workers
from routespec.conformance.plugin import OpenTarget
from routespec.conformance.scenario import finished, reached, shows_outer
from routespec.testing.target import (
    Capability,
    ErrorSpec,
    FailBeforeStream,
    FailMidStream,
    HostConfig,
    HostRoute,
    ObservedError,
    RoutingHostTarget,
    Serve,
    Stall,
    Target,
    TargetConfig,
    WorkerScript,
)

HOST = Capability.ROUTING_HOST
BLOCK = 2
KV = HostConfig(policy="kv", block_size=BLOCK)


def route(
    tokens: Sequence[int],
    *,
    phase: str = "aggregated",
    session: str | None = None,
    backend_instance_id: int | None = None,
) -> HostRoute:
    return HostRoute(
        phase=phase,
        tokens=tuple(tokens),
        max_tokens=1,
        session=session,
        backend_instance_id=backend_instance_id,
    )


def booked(host: RoutingHostTarget) -> dict[int, int]:
    return {worker: count for worker, count in host.bookings().items() if count}


def only_worker(target: Target, request: str, requirement: str) -> int:
    found = reached(target, request)
    if len(found) != 1:
        pytest.fail(f"setup ({requirement}): {request} reached {found}, expected one worker")
    return found[0]


def pin(target: Target, host: RoutingHostTarget, worker: int, tokens: Sequence[int]) -> str:
    """Dispatch ``tokens`` to ``worker`` (an explicit worker), so the host indexes them there."""
    request = host.route(route(tokens, backend_instance_id=worker))
    if reached(target, request) != [worker]:
        pytest.fail(f"setup: {tokens} pinned to {worker} reached {reached(target, request)}")
    return request


def previews(
    host: RoutingHostTarget, tokens: Sequence[int], count: int, requirement: str
) -> list[int]:
    return [planned(host.preview(route(tokens)), requirement).worker_id for _ in range(count)]


# --- the oracle ---


@attrs.define
class KvOracle:
    """What the host should know: cached blocks per worker, and the open requests' blocks."""

    block_size: int
    cached: dict[int, set[tuple[int, ...]]] = attrs.field(factory=dict)
    open: dict[str, tuple[int, int]] = attrs.field(factory=dict)  # request -> (worker, blocks)

    def blocks(self, tokens: Sequence[int]) -> list[tuple[int, ...]]:
        """The full blocks, each named by the whole prefix it ends (a chained hash)."""
        size = self.block_size
        return [tuple(tokens[:end]) for end in range(size, len(tokens) + 1, size)]

    def overlap(self, worker: int, tokens: Sequence[int]) -> int:
        held = self.cached.get(worker, set())
        count = 0
        for block in self.blocks(tokens):
            if block not in held:
                break
            count += 1
        return count

    def active(self, worker: int) -> int:
        return sum(blocks for w, blocks in self.open.values() if w == worker)

    def cost(self, worker: int, tokens: Sequence[int]) -> int:
        """Uncached prefill blocks plus active decode blocks with this request's (KVS-002).
        Only the differences between workers matter: the request's own block count is the
        same for every worker."""
        own = math.ceil(len(tokens) / self.block_size)
        return own - self.overlap(worker, tokens) + self.active(worker) + own

    def costs(self, pool: Sequence[int], tokens: Sequence[int]) -> dict[int, int]:
        return {worker: self.cost(worker, tokens) for worker in pool}

    def dispatched(self, request: str, worker: int, tokens: Sequence[int], held: bool) -> None:
        self.cached.setdefault(worker, set()).update(self.blocks(tokens))
        if held:
            self.open[request] = (worker, len(tokens) // self.block_size)

    def bookings(self) -> dict[int, int]:
        found: dict[int, int] = {}
        for worker, _ in self.open.values():
            found[worker] = found.get(worker, 0) + 1
        return found


# --- KVS-001, KVS-002: the oracle, over random prompts ---


@attrs.frozen
class Step:
    """Route a prompt (held open if ``hold``), or release every held request."""

    stem: int = 0
    take: int = 0
    tail: tuple[int, ...] = ()
    hold: bool = False
    release: bool = False


steps = st.one_of(
    st.builds(
        Step,
        stem=st.integers(0, 2),
        take=st.integers(0, 12),
        tail=st.lists(st.integers(0, 2), max_size=3).map(tuple),
        hold=st.booleans(),
    ),
    st.just(Step(release=True)),
)
stems = st.lists(st.lists(st.integers(0, 2), min_size=4, max_size=12), min_size=3, max_size=3)
EXAMPLES = max(3, settings().max_examples // 4)
"""A quarter of the profile's examples: each one opens a target."""


@covers("KVS-001", "KVS-002")
@requires(HOST, Capability.SCRIPT_STALL)
@settings(max_examples=EXAMPLES, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**16),
    count=st.integers(2, 3),
    block_size=st.integers(1, 4),
    prefixes=stems,
    plan=st.lists(steps, min_size=1, max_size=10),
)
def test_the_host_selects_a_lowest_cost_worker(
    open_target: OpenTarget,
    seed: int,
    count: int,
    block_size: int,
    prefixes: list[list[int]],
    plan: list[Step],
) -> None:
    with open_target(TargetConfig(seed=seed)) as target:
        pool = workers(target, count, Serve())
        host = host_of(target, "KVS-001", HostConfig(policy="kv", block_size=block_size))
        oracle = KvOracle(block_size)
        history: list[str] = []
        for step in plan:
            if step.release:
                for worker in pool:
                    target.release_stalled(worker)
                for request in oracle.open:
                    ended(target, request, "KVS-002")
                oracle.open.clear()
                history.append("release all")
                continue
            tokens = [*prefixes[step.stem][: step.take], *step.tail] or [0]
            held = step.hold and len(tokens) >= block_size
            if held:  # a held request's load is counted in whole blocks: no partial tail
                tokens = tokens[: len(tokens) - len(tokens) % block_size]
            for worker in pool:
                target.script_worker(worker, Stall(0) if held else Serve())
            costs = oracle.costs(pool, tokens)
            lowest = {w for w, cost in costs.items() if cost == min(costs.values())}
            request = host.route(route(tokens))
            chosen = reached(target, request)
            loaded = any(oracle.active(worker) for worker in pool)
            history.append(f"{tokens}{' (held)' if held else ''} -> {chosen}, costs {costs}")
            require(
                "KVS-002" if loaded else "KVS-001",
                len(chosen) == 1 and chosen[0] in lowest,
                f"block size {block_size}: the oracle's costs {costs} (cached blocks "
                f"{ {w: oracle.overlap(w, tokens) for w in pool} }, active decode blocks "
                f"{ {w: oracle.active(w) for w in pool} }) make {sorted(lowest)} the lowest-cost "
                f"workers for {tokens}, yet it reached {chosen}; steps so far: {history}",
            )
            oracle.dispatched(request, chosen[0], tokens, held)
            require_equal(
                "KVS-002",
                booked(host),
                oracle.bookings(),
                f"the host's bookings {booked(host)} are not its open requests "
                f"{oracle.bookings()}; steps so far: {history}",
            )
        for worker in pool:
            target.release_stalled(worker)


@covers("KVS-001")
@requires(HOST)
def test_a_block_matches_only_with_its_whole_prefix(target: Target) -> None:
    first, second = workers(target, 2, Serve())
    host = host_of(target, "KVS-001", KV)
    pin(target, host, first, [1, 2, 3, 4])
    for tokens in ([1, 2, 7, 7], [0, 0, 3, 4], [0, 0, 0, 0, 5, 6]):
        pin(target, host, second, tokens)
    query = [1, 2, 3, 4, 5, 6]
    picks = set(previews(host, query, 20, "KVS-001"))
    require_equal(
        "KVS-001",
        picks,
        {first},
        f"for {query} (blocks of {BLOCK}) worker {first} holds 2 leading blocks and worker "
        f"{second} 1: it holds the blocks [3, 4] and [5, 6] only after other prefixes, which "
        f"must not match; 20 previews chose {sorted(picks)}, expected only {first}",
    )


@covers("KVS-001", "KVS-003")
@requires(HOST)
def test_a_partial_trailing_block_is_not_indexed(target: Target) -> None:
    first, second = workers(target, 2, Serve())
    host = host_of(target, "KVS-001", KV)
    pin(target, host, first, [1, 2, 3])
    pin(target, host, second, [1, 2, 5, 5])
    query = [1, 2, 3]
    picks = set(previews(host, query, 40, "KVS-001"))
    require_equal(
        "KVS-001",
        picks,
        {first, second},
        f"both workers hold the one full block of {query} (blocks of {BLOCK}; the trailing "
        f"[3] is not a block), so they tie and both should be chosen; 40 previews chose "
        f"{sorted(picks)}",
    )


@covers("KVS-002")
@requires(HOST, Capability.SCRIPT_STALL)
def test_the_cost_weighs_cached_blocks_against_active_ones(target: Target) -> None:
    warm, cold = workers(target, 2, Serve())
    host = host_of(target, "KVS-002", KV)
    query = [1, 2, 3, 4, 5, 6]  # 3 blocks, all cached on ``warm``
    pin(target, host, warm, query)
    for load, expected in ((4, cold), (2, warm)):
        target.script_worker(warm, Stall(0))
        pin(target, host, warm, [9] * (BLOCK * load))
        target.script_worker(warm, Serve())
        picks = set(previews(host, query, 10, "KVS-002"))
        require_equal(
            "KVS-002",
            picks,
            {expected},
            f"worker {warm} caches all 3 blocks of {query} and has {load} active decode "
            f"blocks, worker {cold} neither: costs {3 - 3 + load} + 3 against 3 + 3, so "
            f"{expected} should be chosen; 10 previews chose {sorted(picks)}",
        )
        target.release_stalled(warm)


@covers("KVS-001", "KVS-002")
@requires(HOST)
@pytest.mark.parametrize("shorter", [1, 2, 3])
def test_the_longer_cached_prefix_wins(target: Target, shorter: int) -> None:
    """Of two idle workers holding the first ``shorter`` and ``shorter + 1`` blocks of a
    4-block prompt, the longer prefix costs one block less, at every depth."""
    short, long_ = workers(target, 2, Serve())
    host = host_of(target, "KVS-002", KV)
    query = [1, 2, 3, 4, 5, 6, 7, 8]
    pin(target, host, short, query[: BLOCK * shorter])
    pin(target, host, long_, query[: BLOCK * (shorter + 1)])
    picks = set(previews(host, query, 20, "KVS-002"))
    require_equal(
        "KVS-002",
        picks,
        {long_},
        f"worker {short} holds the first {shorter} and worker {long_} the first "
        f"{shorter + 1} of the 4 blocks of {query}; both idle, so {long_} costs one block "
        f"less and 20 previews should choose only it; they chose {sorted(picks)}",
    )


@covers("KVS-002")
@requires(HOST, Capability.SCRIPT_STALL)
def test_decode_load_adds_up_over_a_workers_open_requests(target: Target) -> None:
    """Two open requests of 2 blocks on one worker weigh 4 blocks, more than one of 3
    blocks on the other."""
    twice, once = workers(target, 2, Stall(0))
    host = host_of(target, "KVS-002", KV)
    for tokens in ([1, 2, 3, 4], [5, 6, 7, 8]):
        host.route(route(tokens, backend_instance_id=twice))
    host.route(route([9] * 6, backend_instance_id=once))
    query = [20, 21]
    picks = set(previews(host, query, 10, "KVS-002"))
    require_equal(
        "KVS-002",
        picks,
        {once},
        f"worker {twice} holds two open requests of 2 blocks (4 decode blocks), worker {once} "
        f"one of 3; neither caches {query}, so {once} costs less and 10 previews should "
        f"choose only it; they chose {sorted(picks)}",
    )
    target.release_stalled(twice)
    target.release_stalled(once)


# --- KVS-003, KVS-004 ---


@covers("KVS-003")
@requires(HOST)
def test_ties_at_temperature_zero_are_broken_at_random(target: Target) -> None:
    pool = workers(target, 2, Serve())
    host = host_of(target, "KVS-003", KV)
    picks = previews(host, [5, 6, 7, 8], 40, "KVS-003")
    require_equal(
        "KVS-003",
        set(picks),
        set(pool),
        f"two idle workers with nothing cached tie; 40 previews should choose both, they "
        f"chose {[picks.count(w) for w in pool]} times workers {pool}",
    )


@covers("KVS-004")
@requires(HOST)
def test_a_temperature_sometimes_picks_a_costlier_worker(target: Target) -> None:
    warm, cold = workers(target, 2, Serve())
    host = host_of(target, "KVS-004", HostConfig(policy="kv", block_size=BLOCK, temperature=1.0))
    query = [1, 2, 3, 4, 5, 6, 7, 8]
    pin(target, host, warm, query)
    picks = previews(host, query, 100, "KVS-004")
    require(
        "KVS-004",
        0 < picks.count(cold) < picks.count(warm),
        f"at temperature 1 worker {warm} (all 4 blocks of {query} cached) should be chosen "
        f"most often and worker {cold} (none cached) sometimes; 100 previews chose them "
        f"{picks.count(warm)} and {picks.count(cold)} times",
    )


@covers("KVS-004")
@requires(HOST)
def test_a_temperature_samples_by_the_softmax_of_normalised_costs(target: Target) -> None:
    """Costs 0, 2 and 4 blocks normalise to 0, 0.5 and 1; at temperature 0.5 the weights are
    e^0, e^-1 and e^-2, so the workers are chosen 66.5 %, 24.5 % and 9.0 % of the time."""
    full, half, none = workers(target, 3, Serve())
    host = host_of(target, "KVS-004", HostConfig(policy="kv", block_size=BLOCK, temperature=0.5))
    query = [1, 2, 3, 4, 5, 6, 7, 8]
    pin(target, host, full, query)
    pin(target, host, half, query[:4])
    count = 600
    picks = previews(host, query, count, "KVS-004")
    weights = [math.exp(-cost / 0.5) for cost in (0.0, 0.5, 1.0)]
    expected = [w / sum(weights) for w in weights]
    shares = [picks.count(worker) / count for worker in (full, half, none)]
    # 0.08 is over 4.5 standard deviations of a share near 0.25 in 600 draws
    require(
        "KVS-004",
        all(abs(share - p) <= 0.08 for share, p in zip(shares, expected, strict=True)),
        f"workers {full}, {half}, {none} cache 4, 2 and 0 of the 4 blocks of {query} and "
        f"carry no load: normalised costs 0, 0.5, 1, so at temperature 0.5 they should be "
        f"chosen {[round(p, 3) for p in expected]} of the time; {count} previews chose them "
        f"{[round(s, 3) for s in shares]}",
    )


@covers("KVS-004")
@requires(HOST)
@pytest.mark.parametrize("temperature", [0.001, 0.01])
def test_a_small_temperature_chooses_the_cheapest_worker(
    target: Target, temperature: float
) -> None:
    """Near 0 the softmax is all but a minimum: e^(-1/T) underflows to nothing beside e^0,
    and the sampling must still choose (weights that overflow or all vanish are a fault)."""
    warm, cold = workers(target, 2, Serve())
    host = host_of(
        target, "KVS-004", HostConfig(policy="kv", block_size=BLOCK, temperature=temperature)
    )
    query = list(range(1, 65))
    pin(target, host, warm, query)
    outcome, went = ended(target, host.route(route(query)), "KVS-004")
    require(
        "KVS-004",
        outcome.error is None and went == [warm],
        f"at temperature {temperature} worker {warm} (all {len(query) // BLOCK} blocks of the "
        f"prompt cached, cost 0) should be chosen over {cold} (none cached, normalised cost 1); "
        f"the request reached {went} and ended {outcome}",
    )


# --- KVS-005 to KVS-009: previews, plans and probes ---


@covers("KVS-005")
@requires(HOST, Capability.SCRIPT_STALL)
def test_a_preview_admits_nothing(target: Target) -> None:
    pool = workers(target, 2, Stall(0))
    host = host_of(target, "KVS-005", HostConfig(policy="kv", block_size=BLOCK, affinity_ttl=60))
    host.route(route([9, 9]))  # a held request: the bookings are not empty
    before = (booked(host), host.counters(), len(target.dispatch_log()))
    for session, tokens in (("s1", [1, 2, 3, 4]), ("s2", [9, 9])):
        view = planned(host.preview(route(tokens, session=session)), "KVS-005")
        after = (booked(host), host.counters(), len(target.dispatch_log()))
        require(
            "KVS-005",
            view.worker_id in pool and after == before,
            f"a preview of {tokens} chose {view.worker_id}; it should leave the bookings, "
            f"the counters and the dispatch log as they were {before}, got {after}",
        )
        require_equal(
            "KVS-005",
            host.session(session).state,
            "unbound",
            f"a preview for session {session!r} should not touch its affinity: "
            f"{host.session(session)}",
        )
    for worker in pool:
        target.release_stalled(worker)


@covers("KVS-006")
@requires(HOST)
def test_a_plan_admits_exactly_the_previewed_worker(target: Target) -> None:
    pool = workers(target, 2, Serve())
    host = host_of(target, "KVS-006", KV)
    for attempt in range(6):
        tokens = [attempt, attempt, 1, 1]
        preview = planned(host.preview(route(tokens)), "KVS-006")
        elsewhere = next(w for w in pool if w != preview.worker_id)
        pin(target, host, elsewhere, tokens)  # selecting again would now choose ``elsewhere``
        plan = planned(host.plan(preview.plan_id), "KVS-006")
        require(
            "KVS-006",
            plan.worker_id == preview.worker_id and booked(host) == {preview.worker_id: 1},
            f"{tokens} was previewed on {preview.worker_id}, then cached on {elsewhere}: "
            f"the plan must book the previewed worker, without selecting again; it names "
            f"{plan.worker_id}, bookings {booked(host)}",
        )
        host.abort_plan(plan.plan_id)


PLAN_ENDINGS: list[WorkerScript] = [
    Stall(0),
    FailBeforeStream(ErrorSpec("Disconnected")),
    FailMidStream(0, ErrorSpec("Disconnected")),
]


@covers("KVS-007")
@requires(HOST, Capability.SCRIPT_STALL, Capability.SCRIPT_FAILURES)
@pytest.mark.parametrize("script", PLAN_ENDINGS, ids=["completes", "fails-before", "fails-mid"])
def test_a_dispatched_plan_hands_its_booking_to_the_request(
    target: Target, script: WorkerScript
) -> None:
    pool = workers(target, 2, script)
    host = host_of(target, "KVS-007", KV)
    started, _ = host.counters()
    preview = planned(host.preview(route([1, 2, 3, 4])), "KVS-007")
    plan = planned(host.plan(preview.plan_id), "KVS-007")
    request = host.dispatch_plan(plan.plan_id)
    found = reached(target, request)
    require(
        "KVS-007",
        found == [plan.worker_id] and host.counters()[0] == started + 1,
        f"the plan for {plan.worker_id} was dispatched: it should reach that worker and count "
        f"one started request; it reached {found}, started {started} -> {host.counters()[0]}",
    )
    if isinstance(script, Stall):
        require(
            "KVS-007",
            target.outcome(request) is None and booked(host) == {plan.worker_id: 1},
            f"while the dispatched plan's stream is open its one booking is the request's: "
            f"bookings {booked(host)}, expected {{{plan.worker_id}: 1}}",
        )
        for worker in pool:
            target.release_stalled(worker)
    outcome, _ = ended(target, request, "KVS-007")
    failed = not isinstance(script, Stall)
    require(
        "KVS-007",
        (outcome.error is not None) == failed and not booked(host),
        f"the dispatch ended ({'failed' if failed else 'completed'}: {outcome}); its booking "
        f"should be released, bookings {booked(host)}",
    )


@covers("KVS-007")
@requires(HOST, Capability.SCRIPT_STALL)
@pytest.mark.parametrize("how", ["stopped", "dropped"])
@pytest.mark.parametrize("items", [0, 1], ids=["before-the-first-item", "mid-stream"])
def test_a_dispatched_plan_the_caller_leaves_releases_its_booking(
    target: Target, how: str, items: int
) -> None:
    """KVS-007's handed-over booking on the cancellation path: the caller's context stops,
    or it drops the stream, while the worker is silent."""
    pool = workers(target, 2, Stall(items=items))
    host = host_of(target, "KVS-007", KV)
    plan = planned(host.plan(planned(host.preview(route([1, 2])), "KVS-007").plan_id), "KVS-007")
    request = host.dispatch_plan(plan.plan_id)
    if target.outcome(request) is not None:
        pytest.fail(f"setup: the dispatched plan should still be open: {target.outcome(request)}")
    require_equal(
        "KVS-007",
        booked(host),
        {plan.worker_id: 1},
        f"while the dispatched plan's stream is open its one booking is the request's: "
        f"bookings {booked(host)}",
    )
    if how == "stopped":
        host.stop(request)
    else:
        target.drop(request)
    outcome, _ = ended(target, request, "KVS-007")
    require_equal(
        "KVS-007",
        booked(host),
        {},
        f"the caller {how} the dispatched plan's stream on worker {plan.worker_id} after "
        f"{items} items (it ended {outcome}); the booking it was handed should be released, "
        f"bookings are {booked(host)}",
    )
    for worker in pool:
        target.release_stalled(worker)


@covers("KVS-008")
@requires(HOST)
def test_aborting_a_plan_releases_what_it_holds(target: Target) -> None:
    workers(target, 2, Serve())
    host = host_of(target, "KVS-008", HostConfig(policy="kv", block_size=BLOCK, affinity_ttl=60))
    started, completed = host.counters()
    preview = planned(host.preview(route([1, 2, 3, 4], session="s")), "KVS-008")
    plan = planned(host.plan(preview.plan_id), "KVS-008")
    if booked(host) != {plan.worker_id: 1}:
        pytest.fail(f"setup: the plan should book {plan.worker_id}: {booked(host)}")
    host.abort_plan(plan.plan_id)
    require(
        "KVS-008",
        not booked(host) and host.counters() == (started, completed),
        f"an aborted plan should release its booking and count nothing: bookings "
        f"{booked(host)}, counters {(started, completed)} -> {host.counters()}",
    )
    require_equal(
        "KVS-008",
        host.session("s").state,
        "unbound",
        f"an aborted plan should drop its pending affinity initialization: {host.session('s')}",
    )
    outcome, found = ended(target, host.route(route([1, 2, 3, 4], session="s")), "KVS-008")
    require(
        "KVS-008",
        outcome.error is None and host.session("s").worker_id in found,
        f"a later request of session 's' should bind it without waiting: reached {found}, "
        f"ended {outcome}, session {host.session('s')}",
    )


@covers("KVS-009")
@requires(HOST, Capability.SCRIPT_STALL)
def test_the_prefill_busy_probe_admits_nothing(target: Target) -> None:
    pool = workers(target, 2, Stall(0))
    host = host_of(target, "KVS-009", KV)
    host.route(route([9, 9]))  # a held request: the bookings are not empty
    before = (booked(host), host.counters(), len(target.dispatch_log()))
    for threshold in (0.5, 1.0, 2.0):
        host.prefill_busy(route([1, 2, 3, 4], phase="prefill"), threshold)
        after = (booked(host), host.counters(), len(target.dispatch_log()))
        require_equal(
            "KVS-009",
            after,
            before,
            f"a prefill-busy probe (threshold {threshold}) should leave the bookings, the "
            f"counters and the dispatch log as they were {before}, got {after}",
        )
    for worker in pool:
        target.release_stalled(worker)


# --- HST-014 over a planned route ---


@covers("HST-014", "KVS-006")
@requires(HOST, Capability.MOCK_CLOCK)
def test_a_plan_draws_on_its_preview_budget(target: Target) -> None:
    workers(target, 2, Serve())
    host = host_of(target, "HST-014", KV)
    preview = planned(host.preview(route([1, 2, 3, 4])), "HST-014")
    target.advance_time(3)
    plan = planned(host.plan(preview.plan_id), "HST-014")
    require_compare(
        "HST-014",
        plan.budget_remaining,
        "<=",
        preview.budget_remaining - 3 + 1e-6,
        f"the preview had {preview.budget_remaining} s of cleanup budget left; 3 s later the "
        f"plan should have at most {preview.budget_remaining - 3} s, it has "
        f"{plan.budget_remaining} s",
    )
    require_equal(
        "KVS-006",
        plan.worker_id,
        preview.worker_id,
        f"the plan names {plan.worker_id}, the preview chose {preview.worker_id}",
    )
    host.abort_plan(plan.plan_id)


@covers("KVS-010")
@requires(HOST)
@pytest.mark.parametrize(
    "config",
    [
        HostConfig(policy="kv", block_size=0),
        HostConfig(policy="kv", temperature=-0.5),
        HostConfig(policy="kv", kv_index_blocks=0),
    ],
    ids=["block-size-0", "negative-temperature", "index-blocks-0"],
)
def test_kv_settings_are_checked_at_construction(target: Target, config: HostConfig) -> None:
    refused_at_construction(target, "KVS-010", config, "its KV settings are out of range")


@covers("KVS-011")
@requires(HOST)
@pytest.mark.parametrize("policy", ["round-robin", "least-loaded"])
def test_route_plans_belong_to_the_kv_policy(target: Target, policy: str) -> None:
    workers(target, 1)
    host = host_of(target, "KVS-011", HostConfig(policy=policy))
    preview = host.preview(HostRoute())
    require(
        "KVS-011",
        isinstance(preview, ObservedError)
        and preview.type == "InvalidArgument"
        and policy in preview.links[0][1],
        f"a preview under {policy} should fail InvalidArgument naming the policy, got {preview}",
    )


@covers("KVS-012")
@requires(HOST, Capability.SCRIPT_STALL, Capability.MARK_OVERLOADED)
def test_the_prefill_busy_probe_answers_from_bookings(target: Target) -> None:
    pool = workers(target, 2, Stall(0))
    host = host_of(target, "KVS-012", HostConfig(policy="kv"))
    answers = [host.prefill_busy(HostRoute(), 1)]
    host.route(HostRoute(tokens=(1,)))
    answers.append(host.prefill_busy(HostRoute(), 1))
    host.route(HostRoute(tokens=(2,)))
    answers.append(host.prefill_busy(HostRoute(), 1))
    for worker in pool:
        target.release_stalled(worker)
        target.mark_overloaded(worker, True)
    answers.append(host.prefill_busy(HostRoute(), 1))
    require_equal(
        "KVS-012",
        answers,
        [False, False, True, True],
        f"threshold 1 over two workers: idle, one booked, both booked, none free should read "
        f"[False, False, True, True]; read {answers}",
    )


@covers("KVS-016")
@requires(HOST, Capability.VANISH_WORKER, Capability.REMOVE_WORKER)
def test_a_kv_admitted_dispatch_is_exact(target: Target) -> None:
    pool = workers(target, 3)
    host = host_of(target, "KVS-016", HostConfig(policy="kv", block_size=4))
    prompt = HostRoute(tokens=tuple(range(8)))
    (cached,) = reached(target, host.route(prompt))  # now strictly the cheapest for it
    target.vanish_worker(cached)  # still listed, so still selected; its transport is gone
    request = host.route(prompt)
    outcome = finished(target, request, "KVS-016")
    went, booked = reached(target, request), host.bookings()
    target.remove_worker(cached)
    require(
        "KVS-016",
        shows_outer(outcome.error, "CannotConnect") and went == [] and not any(booked.values()),
        f"{cached} was admitted but its transport is gone: the request should fail with "
        f"CannotConnect, reach no worker and hold no booking; it ended {outcome}, reached "
        f"{went}, bookings {booked} (pool {pool})",
    )


@covers("KVS-016")
@requires(HOST, Capability.MARK_OVERLOADED)
def test_a_kv_admitted_dispatch_skips_the_overload_check(target: Target) -> None:
    pinned, _other = workers(target, 2)
    host = host_of(target, "KVS-016", HostConfig(policy="kv", block_size=4))
    target.mark_overloaded(pinned, True)
    request = host.route(HostRoute(tokens=(1, 2, 3, 4), backend_instance_id=pinned))
    outcome = finished(target, request, "KVS-016")
    require(
        "KVS-016",
        outcome.error is None and reached(target, request) == [pinned],
        f"the KV policy admitted pinned worker {pinned}; marked overloaded, it should still be "
        f"reached (admission already booked it): the request ended {outcome}, reaching "
        f"{reached(target, request)}",
    )


@covers("KVS-014")
@requires(HOST)
def test_the_kv_policy_selects_only_workers_it_knows(target: Target) -> None:
    unseen, known = workers(target, 2)
    host = host_of(target, "KVS-014", HostConfig(policy="kv"))
    host.forget_worker_config(unseen)
    went = [w for n in range(6) for w in reached(target, host.route(HostRoute(tokens=(n,))))]
    require_equal(
        "KVS-014",
        went,
        [known] * 6,
        f"worker {unseen}'s configuration is unseen; every request should reach {known}, "
        f"they reached {went}",
    )


@covers("KVS-014")
@requires(HOST)
@pytest.mark.parametrize("policy", ["kv", "round-robin", "least-loaded"])
def test_only_the_kv_policy_needs_a_worker_configuration(target: Target, policy: str) -> None:
    """Through a constrained route (an allowed set naming both workers): the KV policy never
    selects the worker whose configuration it has not seen; other policies need none (a
    worker without one has no taints) and select it in turn."""
    unseen, known = workers(target, 2)
    host = host_of(target, "KVS-014", HostConfig(policy=policy))
    host.forget_worker_config(unseen)
    allowed = frozenset({unseen, known})
    went = [
        w
        for n in range(6)
        for w in reached(target, host.route(HostRoute(tokens=(n,), allowed=allowed)))
    ]
    if policy == "kv":
        require_equal(
            "KVS-014",
            went,
            [known] * 6,
            f"worker {unseen}'s configuration is unseen; every constrained request should "
            f"reach {known}, they reached {went}",
        )
        return
    require(
        "KVS-014",
        len(went) == 6 and unseen in went,
        f"under {policy} a worker needs no configuration: worker {unseen} (none seen) should "
        f"serve some of six requests allowed on {sorted(allowed)}; they reached {went}",
    )


@covers("KVS-015")
@requires(HOST)
@pytest.mark.parametrize("first", ["dispatch", "abort"])
def test_a_plan_is_used_once(target: Target, first: str) -> None:
    workers(target, 1)
    host = host_of(target, "KVS-015", HostConfig(policy="kv"))
    plan = planned(host.plan(planned(host.preview(HostRoute()), "KVS-015").plan_id), "KVS-015")
    if first == "dispatch":
        host.dispatch_plan(plan.plan_id)
    else:
        host.abort_plan(plan.plan_id)
    counters, bookings = host.counters(), host.bookings()
    aborted = host.abort_plan(plan.plan_id)
    redispatched = target.outcome(host.dispatch_plan(plan.plan_id))
    require(
        "KVS-015",
        aborted is not None
        and aborted.type == "InvalidArgument"
        and redispatched is not None
        and redispatched.error is not None
        and redispatched.error.type == "InvalidArgument"
        and host.counters() == counters
        and host.bookings() == bookings,
        f"after the plan's {first}, a second abort gave {aborted} and a second dispatch "
        f"{redispatched}; counters {counters} -> {host.counters()}, bookings {bookings} -> "
        f"{host.bookings()}",
    )


# --- KVS-017: the index's bound ---


def holds_all(host: RoutingHostTarget, warm: int, query: Sequence[int], why: str) -> None:
    picks = set(previews(host, query, 10, "KVS-017"))
    require_equal(
        "KVS-017",
        picks,
        {warm},
        f"{why}: worker {warm} should still hold every block of {query[:8]}…, so 10 previews "
        f"should choose only it; they chose {sorted(picks)}",
    )


def forgot_the_first(
    host: RoutingHostTarget, pool: Sequence[int], query: Sequence[int], why: str
) -> None:
    picks = set(previews(host, query, 40, "KVS-017"))
    require_equal(
        "KVS-017",
        picks,
        set(pool),
        f"{why}: worker {pool[0]} should have forgotten the first block of {query[:8]}…, so "
        f"it ties with the idle {pool[1]} (KVS-003) and 40 previews should choose both; "
        f"they chose {sorted(picks)}",
    )


@covers("KVS-017", "KVS-010")
@requires(HOST, Capability.KV_INDEX_BOUND)
@pytest.mark.parametrize("bound", [1, 4])
def test_the_index_forgets_past_its_bound(target: Target, bound: int) -> None:
    warm, cold = workers(target, 2, Serve())
    host = host_of(
        target, "KVS-017", HostConfig(policy="kv", block_size=BLOCK, kv_index_blocks=bound)
    )
    query = list(range(1, BLOCK * bound + 1))  # exactly ``bound`` blocks
    pin(target, host, warm, query)
    holds_all(host, warm, query, f"at its bound of {bound} blocks")
    pin(target, host, warm, [0] * BLOCK)  # one block more than the bound
    forgot_the_first(host, [warm, cold], query, f"one block past its bound of {bound}")


@covers("KVS-017")
@requires(HOST, Capability.KV_INDEX_BOUND)
def test_a_block_one_worker_forgets_stays_with_the_others(target: Target) -> None:
    """The bound is per worker: past it, a worker forgets its own oldest blocks, and a
    worker that holds the same blocks keeps them."""
    forgetful, keeper, _cold = workers(target, 3, Serve())
    host = host_of(target, "KVS-017", HostConfig(policy="kv", block_size=BLOCK, kv_index_blocks=2))
    query = [1, 2, 3, 4]
    pin(target, host, forgetful, query)
    pin(target, host, keeper, query)
    pin(target, host, forgetful, [9, 9, 8, 8])  # two blocks more: it forgets both of query's
    picks = set(previews(host, query, 10, "KVS-017"))
    require_equal(
        "KVS-017",
        picks,
        {keeper},
        f"workers {forgetful} and {keeper} both recorded {query} (2 blocks, the bound); "
        f"{forgetful} then recorded two other blocks and forgot them, {keeper} did not, so 10 "
        f"previews should choose only {keeper}; they chose {sorted(picks)}",
    )


@covers("KVS-017")
@requires(HOST, Capability.KV_INDEX_BOUND)
def test_recording_a_held_block_makes_it_the_most_recent(target: Target) -> None:
    warm, _cold = workers(target, 2, Serve())
    host = host_of(target, "KVS-017", HostConfig(policy="kv", block_size=BLOCK, kv_index_blocks=4))
    query = list(range(1, BLOCK * 4 + 1))
    pin(target, host, warm, query)
    pin(target, host, warm, query[:BLOCK])  # the first block again: now the most recent
    pin(target, host, warm, [0] * BLOCK)  # forgets the second block, not the first
    picks = set(previews(host, query, 10, "KVS-017"))
    require_equal(
        "KVS-017",
        picks,
        {warm},
        f"worker {warm} recorded {query} (4 blocks, its bound), then its first block again, "
        f"then another block: it should forget the second block and keep the first, so "
        f"{query} still overlaps it by 1 block and 10 previews should choose only it; they "
        f"chose {sorted(picks)}",
    )


@covers("KVS-017")
@requires(HOST, Capability.KV_INDEX_BOUND)
def test_the_default_bound_is_65536_blocks(target: Target) -> None:
    warm, cold = workers(target, 2, Serve())
    host = host_of(target, "KVS-017", HostConfig(policy="kv", block_size=1))  # its own bound
    query = list(range(65_536))
    pin(target, host, warm, query)
    holds_all(host, warm, query[:4], "at the default bound of 65,536 blocks")
    pin(target, host, warm, [-1])
    forgot_the_first(host, [warm, cold], query[:4], "one block past the default bound of 65,536")
