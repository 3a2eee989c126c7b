"""Selection (SEL): which worker each router mode picks, and how occupancy modes book it.

Load is built with Stall-scripted requests that stay open; ``Preselected`` calls book a chosen
worker exactly (as a routing host's occupancy policy would), which lets a check set up uneven
occupancy without depending on the mode under test.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from routespec.conformance.checks import (
    RequirementViolation,
    covers,
    require,
    require_compare,
    require_equal,
    require_false,
    requires,
)
from routespec.conformance.plugin import OpenTarget
from routespec.conformance.scenario import (
    BUILTIN_MODES,
    OCCUPANCY_MODES,
    built,
    finished,
    loads,
    no_workers_available,
    reached,
    refusal,
    shows_outer,
)
from routespec.testing.target import (
    Capability,
    ErrorSpec,
    FailBeforeStream,
    Generate,
    Migrate,
    Preselected,
    Serve,
    Stall,
    Target,
    TargetConfig,
)


def only_worker(target: Target, request_id: str, requirement: str) -> int:
    workers = reached(target, request_id)
    if len(workers) != 1:
        raise RequirementViolation(
            requirement,
            f"{request_id} reached workers {workers} and ended {target.outcome(request_id)}; "
            "expected exactly one worker",
        )
    return workers[0]


def book(target: Target, worker: int, times: int) -> None:
    """Hold ``times`` open, booked requests on ``worker`` (its script is left as Stall)."""
    target.script_worker(worker, Stall())
    for _ in range(times):
        target.submit(Preselected(worker))


def release_all(target: Target, workers: Sequence[int]) -> None:
    for worker in workers:
        target.release_stalled(worker)


# --- SEL-001, SEL-002 ---


@covers("SEL-001")
@pytest.mark.parametrize("mode", BUILTIN_MODES)
def test_builtin_modes_dispatch(open_target: OpenTarget, mode: str) -> None:
    """On a router left its own randomness (seed None), as a deployment's is: whatever it
    draws, every request reaches one of the free workers."""
    with open_target(TargetConfig(seed=None)) as target:
        workers = [target.add_worker() for _ in range(3)]
        for _ in range(4):
            request = target.submit(Generate(mode))
            outcome = finished(target, request, "SEL-001")
            require(
                "SEL-001",
                outcome.error is None and len(outcome.items) == 1,
                f"generate({mode}) with free workers {workers} ended {outcome}, expected one item",
            )
            worker = only_worker(target, request, "SEL-001")
            require_compare(
                "SEL-001",
                worker,
                "in",
                workers,
                f"generate({mode}) reached {worker}, not in {workers}",
            )


@covers("SEL-002")
@requires(Capability.REFUSES_KV_AND_DIRECT)
@pytest.mark.parametrize("mode", ["kv", "direct"])
def test_kv_and_direct_are_refused(target: Target, mode: str) -> None:
    workers = [target.add_worker() for _ in range(2)]
    request = target.submit(Generate(mode))
    outcome = finished(target, request, "SEL-002")
    require(
        "SEL-002",
        shows_outer(outcome.error, "InvalidArgument")
        and outcome.error is not None
        and mode in outcome.error.links[0][1].lower(),
        f"generate({mode}) with workers {workers} ended {outcome}; a bare router must refuse "
        f"it with InvalidArgument naming the mode",
    )
    require_false(
        "SEL-002",
        target.dispatch_log(),
        f"generate({mode}) reached workers: {list(target.dispatch_log())}",
    )


# --- SEL-003 ---


@covers("SEL-003")
@requires(Capability.SCRIPT_STALL, Capability.MARK_OVERLOADED, Capability.REPORT_DOWN)
@pytest.mark.parametrize("mode", BUILTIN_MODES)
def test_selection_draws_only_from_the_free_set(target: Target, mode: str) -> None:
    """Free workers carry open streams while an overloaded and an inhibited worker sit idle,
    so a load-seeking mode that ignored the free set would pick them."""
    workers = [target.add_worker() for _ in range(5)]
    overloaded, inhibited = workers[1], workers[2]
    free = {w for w in workers if w not in (overloaded, inhibited)}
    target.mark_overloaded(overloaded, True)
    target.report_down(inhibited)
    for worker in workers:
        target.script_worker(worker, Stall())
    for _ in range(12):
        request = target.submit(Generate(mode))
        worker = only_worker(target, request, "SEL-003")
        require_compare(
            "SEL-003",
            worker,
            "in",
            free,
            f"generate({mode}) reached {worker}; the free set is {sorted(free)} "
            f"({overloaded} overloaded, {inhibited} inhibited)",
        )
    release_all(target, workers)


# --- SEL-004, SEL-005 ---


@covers("SEL-004")
@requires(Capability.MARK_OVERLOADED)
@pytest.mark.parametrize("mode", BUILTIN_MODES)
def test_all_overloaded_is_resource_exhausted(target: Target, mode: str) -> None:
    workers = [target.add_worker() for _ in range(3)]
    for worker in workers:
        target.mark_overloaded(worker, True)
    outcome = finished(target, target.submit(Generate(mode)), "SEL-004")
    require(
        "SEL-004",
        shows_outer(outcome.error, "ResourceExhausted"),
        f"generate({mode}) with every routable worker overloaded ended {outcome}, "
        "expected ResourceExhausted",
    )
    require_false(
        "SEL-004",
        target.dispatch_log(),
        f"generate({mode}) reached a worker: {list(target.dispatch_log())}",
    )


@covers("SEL-005")
@pytest.mark.parametrize("mode", BUILTIN_MODES)
def test_no_worker_is_unavailable(target: Target, mode: str) -> None:
    outcome = finished(target, target.submit(Generate(mode)), "SEL-005")
    require(
        "SEL-005",
        no_workers_available(outcome.error),
        f"generate({mode}) with no worker ended {outcome}, expected Unavailable "
        "'No workers available for endpoint namespace/component/name'",
    )


@covers("SEL-005")
@requires(Capability.REPORT_DOWN, Capability.MARK_OVERLOADED)
@pytest.mark.parametrize("mode", BUILTIN_MODES)
def test_all_inhibited_is_unavailable(target: Target, mode: str) -> None:
    """Routable is empty (one worker overloaded as well): Unavailable, not ResourceExhausted."""
    workers = [target.add_worker() for _ in range(2)]
    for worker in workers:
        target.report_down(worker)
    target.mark_overloaded(workers[1], True)
    outcome = finished(target, target.submit(Generate(mode)), "SEL-005")
    require(
        "SEL-005",
        no_workers_available(outcome.error),
        f"generate({mode}) with every worker locally inhibited ended {outcome}, "
        "expected Unavailable 'No workers available for endpoint namespace/component/name'",
    )
    require_false(
        "SEL-005",
        target.dispatch_log(),
        f"generate({mode}) reached a worker: {list(target.dispatch_log())}",
    )


# --- SEL-006 ---


def _round_robin(target: Target, count: int) -> list[int]:
    return [
        only_worker(target, target.submit(Generate("round-robin")), "SEL-006") for _ in range(count)
    ]


@covers("SEL-006")
@requires(Capability.ROUND_ROBIN)
def test_round_robin_cycles_through_a_stable_free_set(target: Target) -> None:
    workers = sorted(target.add_worker() for _ in range(3))
    observed = _round_robin(target, 7)
    expected = [workers[n % 3] for n in range(7)]
    require_equal(
        "SEL-006", observed, expected, f"round-robin reached {observed}, expected {expected}"
    )


@covers("SEL-006")
@requires(Capability.ROUND_ROBIN, Capability.MARK_OVERLOADED)
def test_round_robin_indexes_the_current_free_set(target: Target) -> None:
    """``n`` counts every earlier selection while the index is taken in the free set of now."""
    first, second, third = sorted(target.add_worker() for _ in range(3))
    observed = _round_robin(target, 2)  # n = 0, 1 over [1, 2, 3]
    target.mark_overloaded(first, True)
    observed += _round_robin(target, 3)  # n = 2, 3, 4 over [2, 3]
    target.mark_overloaded(first, False)
    observed += _round_robin(target, 2)  # n = 5, 6 over [1, 2, 3]
    expected = [first, second, second, third, second, third, first]
    require_equal(
        "SEL-006",
        observed,
        expected,
        f"round-robin reached {observed}, expected free[n mod len(free)] = {expected}",
    )


@covers("SEL-006")
@requires(Capability.ROUND_ROBIN, Capability.RANDOM, Capability.LEAST_LOADED)
def test_round_robin_counts_only_its_own_selections(target: Target) -> None:
    workers = sorted(target.add_worker() for _ in range(3))
    observed = _round_robin(target, 1)
    target.submit(Generate("random"))
    target.submit(Generate("least-loaded"))
    observed += _round_robin(target, 1)
    target.submit(Generate("random"))
    observed += _round_robin(target, 1)
    expected = workers[:3]
    require_equal(
        "SEL-006",
        observed,
        expected,
        f"round-robin reached {observed} with other modes in between, expected {expected}: "
        "n counts round-robin selections only",
    )


# --- SEL-007 ---


@covers("SEL-007")
@requires(Capability.RANDOM)
def test_random_reaches_every_free_worker(target: Target) -> None:
    workers = [target.add_worker() for _ in range(3)]
    counts = dict.fromkeys(workers, 0)
    for _ in range(600):
        worker = only_worker(target, target.submit(Generate("random")), "SEL-007")
        counts[worker] = counts.get(worker, 0) + 1
    require(
        "SEL-007",
        all(counts[w] >= 100 for w in workers) and set(counts) == set(workers),
        f"600 random selections over {workers} gave {counts}, expected each >= 100",
    )


# --- SEL-008 ---


@covers("SEL-008")
@requires(
    Capability.POWER_OF_TWO_CHOICES,
    Capability.PRESELECTED,
    Capability.SCRIPT_STALL,
    Capability.OBSERVE_OCCUPANCY,
)
@pytest.mark.parametrize(
    "booked",
    [(1, 0), (0, 3), (2, 1, 0), (1, 0, 0), (0, 2, 1), (3, 2, 2, 0), (1, 0, 0, 0, 0)],
    ids=lambda booked: "-".join(map(str, booked)),
)
def test_power_of_two_never_picks_the_unique_busiest(
    open_target: OpenTarget, booked: tuple[int, ...]
) -> None:
    for seed in range(3):
        with open_target(TargetConfig(seed=seed)) as target:
            workers = [target.add_worker() for _ in booked]
            for worker, count in zip(workers, booked, strict=True):
                book(target, worker, count)
                target.script_worker(worker, Serve())
            occupancy = loads(target)
            busiest = max(workers, key=lambda w: occupancy.get(w, 0))
            if sum(occupancy.get(w, 0) == occupancy.get(busiest, 0) for w in workers) != 1:
                pytest.fail(
                    f"setup: occupancy {occupancy} after booking {booked} has no unique max"
                )
            picks: list[int] = []
            for _ in range(40):
                request = target.submit(Generate("power-of-two-choices"))
                picks.append(only_worker(target, request, "SEL-008"))
            require_compare(
                "SEL-008",
                busiest,
                "not in",
                picks,
                f"seed {seed}: with occupancy {occupancy}, power-of-two-choices picked the "
                f"unique busiest worker {busiest} {picks.count(busiest)} times in 40",
            )
            release_all(target, workers)


# --- SEL-009 ---


@covers("SEL-009")
@requires(
    Capability.LEAST_LOADED,
    Capability.PRESELECTED,
    Capability.SCRIPT_STALL,
    Capability.OBSERVE_OCCUPANCY,
    Capability.MARK_OVERLOADED,
)
def test_least_loaded_picks_a_minimum(target: Target) -> None:
    workers = [target.add_worker() for _ in range(5)]
    idle_but_overloaded = workers[4]
    for worker, count in zip(workers, (3, 0, 1, 0, 0), strict=True):
        book(target, worker, count)
        target.script_worker(worker, Stall())
    target.mark_overloaded(idle_but_overloaded, True)
    free = workers[:4]
    for step in range(12):
        before = loads(target)
        minimum = min(before.get(w, 0) for w in free)
        worker = only_worker(target, target.submit(Generate("least-loaded")), "SEL-009")
        require(
            "SEL-009",
            worker in free and before.get(worker, 0) == minimum,
            f"step {step}: occupancy {before} over free {free}; least-loaded picked {worker} "
            f"(load {before.get(worker, 0)}), the minimum is {minimum}",
        )
    release_all(target, workers)


@covers("SEL-009")
@requires(
    Capability.LEAST_LOADED,
    Capability.PRESELECTED,
    Capability.SCRIPT_STALL,
    Capability.OBSERVE_OCCUPANCY,
)
def test_least_loaded_stays_right_over_many_requests(target: Target) -> None:
    """200 requests that come and go on one worker while the other holds more: each load
    change is bookkeeping an implementation may keep incrementally, and the pick must
    follow the loads however long the history."""
    busy, light = target.add_worker(), target.add_worker()
    book(target, busy, 2)
    book(target, light, 1)
    target.script_worker(light, Serve())
    picks = [
        only_worker(target, target.submit(Generate("least-loaded")), "SEL-009") for _ in range(200)
    ]
    require_compare(
        "SEL-009",
        busy,
        "not in",
        picks,
        f"worker {busy} holds two requests and worker {light} one between requests; every "
        f"least-loaded pick should be {light}, but {busy} was picked at steps "
        f"{[n for n, w in enumerate(picks) if w == busy][:10]}",
    )
    release_all(target, [busy, light])


# --- SEL-010 ---


def _expected_group(
    occupancy: Mapping[int, int], devices: Mapping[int, str], ratio: int
) -> set[int]:
    cpu = [w for w, device in devices.items() if device == "cpu"]
    non_cpu = [w for w, device in devices.items() if device != "cpu"]
    if not cpu or not non_cpu:
        return set(devices)
    cpu_load = sum(occupancy.get(w, 0) for w in cpu)
    non_cpu_load = sum(occupancy.get(w, 0) for w in non_cpu)
    budget = non_cpu_load * len(cpu) // (ratio * len(non_cpu))
    return set(cpu) if cpu_load < budget else set(non_cpu)


MIXED_LAYOUTS = [("cpu", "cuda", "cuda"), ("cuda", "cpu", "cpu"), ("cpu", "cuda")]


@covers("SEL-010")
@requires(
    Capability.DEVICE_AWARE_WEIGHTED,
    Capability.DEVICE_TYPES,
    Capability.PRESELECTED,
    Capability.SCRIPT_STALL,
    Capability.OBSERVE_OCCUPANCY,
)
@pytest.mark.parametrize(
    "layout", [*MIXED_LAYOUTS, ("cpu", "cpu"), ("cuda", "cuda", "cuda")], ids="-".join
)
def test_device_aware_weighs_device_groups(target: Target, layout: tuple[str, ...]) -> None:
    weighs_device_groups(target, layout, ratio=8)  # the target keeps its own default ratio


@covers("SEL-010")
@requires(
    Capability.DEVICE_AWARE_WEIGHTED,
    Capability.DEVICE_TYPES,
    Capability.PRESELECTED,
    Capability.SCRIPT_STALL,
    Capability.OBSERVE_OCCUPANCY,
)
@pytest.mark.parametrize("layout", MIXED_LAYOUTS, ids="-".join)
@pytest.mark.parametrize("ratio", [1, 2], ids=lambda ratio: f"ratio-{ratio}")
def test_device_aware_applies_its_ratio(
    open_target: OpenTarget, ratio: int, layout: tuple[str, ...]
) -> None:
    """The lower bound 1 and the value just over it are each built and applied as set."""
    with built(open_target, TargetConfig(device_ratio=ratio), "SEL-010") as target:
        weighs_device_groups(target, layout, ratio)


@covers("SEL-010")
@requires(Capability.DEVICE_AWARE_WEIGHTED)
@pytest.mark.parametrize("ratio", [0, -1], ids=lambda ratio: f"ratio-{ratio}")
def test_a_ratio_below_one_is_refused(open_target: OpenTarget, ratio: int) -> None:
    refused = refusal(open_target, TargetConfig(device_ratio=ratio))
    require(
        "SEL-010",
        refused is not None,
        f"device_ratio={ratio} is below 1, yet a router with it was built",
        expected="refused when the router is built",
        actual="built",
    )


@covers("SEL-010")
@requires(
    Capability.DEVICE_AWARE_WEIGHTED,
    Capability.DEVICE_TYPES,
    Capability.PRESELECTED,
    Capability.SCRIPT_STALL,
    Capability.REPORT_DOWN,
    Capability.MOCK_CLOCK,
)
def test_device_aware_weighs_the_loads_of_the_free_set_as_it_changes(target: Target) -> None:
    """The group loads follow a loaded worker out of the free set and back: with the default
    ratio 8, CPU worker ``cpu`` gets work while 0 < non-CPU load x 1 / (8 x non-CPU count),
    and the least-loaded non-CPU worker otherwise."""
    cpu = target.add_worker(device="cpu")
    gpu_a, gpu_b = target.add_worker(), target.add_worker()
    book(target, gpu_a, 9)
    book(target, gpu_b, 7)
    target.script_worker(cpu, Serve())  # ends at once: the CPU group's load stays 0
    target.script_worker(gpu_b, Serve())
    steps = [
        ("all free: 16 // (8 x 2) = 1 > 0", None, cpu),
        (f"{gpu_a} inhibited, its 9 leave the group: 7 // (8 x 1) = 0", "down", gpu_b),
        (f"{gpu_a} back: 16 // (8 x 2) = 1 > 0", "back", cpu),
    ]
    for why, event, expected in steps:
        if event == "down":
            target.report_down(gpu_a)
        elif event == "back":
            target.advance_time(5.0)  # FLT's default inhibition
        picked = only_worker(target, target.submit(Generate("device-aware-weighted")), "SEL-010")
        require(
            "SEL-010",
            picked == expected,
            f"non-CPU workers {gpu_a} (9 open requests) and {gpu_b} (7), CPU worker {cpu} "
            f"idle; {why}, so worker {expected} should be chosen, not {picked}",
        )
    release_all(target, [gpu_a, gpu_b])


REWRITES = {  # the moved worker's device type, before and after, and why each pick
    "cuda-to-cpu": (
        "cuda",
        "cpu",
        "0 < 4 x 1 // (8 x 2) = 0 fails, so the least-loaded non-CPU worker, the moved one; "
        "then 0 < 4 x 2 // (8 x 1) = 1 holds, so the CPU group's lowest id",
    ),
    "cpu-to-cuda": (
        "cpu",
        "cuda",
        "0 < 4 x 2 // (8 x 1) = 1 holds, so the CPU group's lowest id; then "
        "0 < 4 x 1 // (8 x 2) = 0 fails, so the least-loaded non-CPU worker, the moved one",
    ),
}


@covers("SEL-010")
@requires(
    Capability.DEVICE_AWARE_WEIGHTED,
    Capability.DEVICE_TYPES,
    Capability.PRESELECTED,
    Capability.SCRIPT_STALL,
)
@pytest.mark.parametrize("rewrite", list(REWRITES))
def test_device_aware_follows_a_rewritten_device_type(target: Target, rewrite: str) -> None:
    """A worker whose record's device type is rewritten is weighed in its new group, and only
    there, from then on: a CPU worker and the moved one idle, a non-CPU worker with 4 open
    requests."""
    was, now, why = REWRITES[rewrite]
    cpu = target.add_worker(device="cpu")
    moved = target.add_worker(device=was)
    loaded = target.add_worker()
    book(target, loaded, 4)
    for worker in (cpu, moved):
        target.script_worker(worker, Serve())
    before = only_worker(target, target.submit(Generate("device-aware-weighted")), "SEL-010")
    target.set_device(moved, now)
    after = only_worker(target, target.submit(Generate("device-aware-weighted")), "SEL-010")
    expected = (moved, cpu) if now == "cpu" else (cpu, moved)
    require(
        "SEL-010",
        (before, after) == expected,
        f"CPU worker {cpu} idle, {was} worker {moved} idle, non-CPU {loaded} with 4 open "
        f"requests, then {moved}'s record says {now}: {why}; the picks should be {expected}, "
        f"they were {(before, after)}",
    )
    release_all(target, [loaded])


# A migrating device-aware request whose first attempt fails on a non-CPU worker: its
# replacement is selected among the workers it has not tried.
UNTRIED_DEVICE_AWARE = (
    Capability.DEVICE_AWARE_WEIGHTED,
    Capability.DEVICE_TYPES,
    Capability.SCRIPT_FAILURES,
    Capability.MIGRATION,
)


def failing_first(target: Target) -> int:
    """A non-CPU worker that fails before its stream, added first (idle, lowest id)."""
    failing = target.add_worker()
    target.script_worker(failing, FailBeforeStream(ErrorSpec("Disconnected")))
    return failing


def one_retry_attempts(target: Target) -> list[int]:
    """The workers a device-aware request with one retry reached, in order."""
    return reached(target, target.submit(Migrate(mode="device-aware-weighted", limit=1)))


@covers("SEL-010")
@requires(*UNTRIED_DEVICE_AWARE, Capability.PRESELECTED, Capability.SCRIPT_STALL)
@pytest.mark.parametrize(("cpu_load", "load"), [(0, 7), (0, 8), (1, 15), (1, 16)])
def test_device_aware_weighs_a_migrating_requests_untried_workers(
    target: Target, cpu_load: int, load: int
) -> None:
    """A replacement attempt selects among the workers the request has not tried: the same
    rule over that smaller set. Non-CPU ``failing`` (idle, fails before its stream) takes
    the first attempt; then CPU ``cpu`` against non-CPU ``loaded``: the CPU group is chosen
    while its load is under ``load`` x 1 // (8 x 1)."""
    failing = failing_first(target)
    cpu = target.add_worker(device="cpu")
    loaded = target.add_worker()
    book(target, cpu, cpu_load)
    book(target, loaded, load)
    for worker in (cpu, loaded):
        target.script_worker(worker, Serve())
    attempts = one_retry_attempts(target)
    second = cpu if cpu_load < load // 8 else loaded
    require_equal(
        "SEL-010",
        attempts,
        [failing, second],
        f"non-CPU {failing} idle, CPU {cpu} with {cpu_load} open requests, non-CPU {loaded} "
        f"with {load}: the first attempt should go to {failing} ({cpu_load} is not under "
        f"{load} // (8 x 2) = {load // 16}) and, once it failed, the second to {second} "
        f"({cpu_load} against {load} // 8 = {load // 8}); the attempts reached {attempts}",
    )
    release_all(target, [cpu, loaded])


@covers("SEL-010")
@requires(*UNTRIED_DEVICE_AWARE, Capability.PRESELECTED, Capability.SCRIPT_STALL)
@pytest.mark.parametrize("load", [3, 4])
def test_device_aware_weighs_group_sizes_over_untried_workers(target: Target, load: int) -> None:
    """Two CPU and two non-CPU workers left untried: the budget weighs both group sizes,
    2 x ``load`` x 2 // (8 x 2), so the CPU group is chosen from ``load`` 4 on."""
    failing = failing_first(target)
    cpus = [target.add_worker(device="cpu") for _ in range(2)]
    gpus = [target.add_worker() for _ in range(2)]
    for worker in gpus:
        book(target, worker, load)
    for worker in cpus + gpus:
        target.script_worker(worker, Serve())
    attempts = one_retry_attempts(target)
    devices = {**dict.fromkeys(cpus, "cpu"), **dict.fromkeys(gpus, "cuda")}
    group = _expected_group(dict.fromkeys(gpus, load), devices, ratio=8)
    require(
        "SEL-010",
        len(attempts) == 2 and attempts[0] == failing and attempts[1] in group,
        f"non-CPU {failing} idle takes the first attempt; then CPU {cpus} (idle) against "
        f"non-CPU {gpus} ({load} open requests each): the budget {2 * load} x 2 // (8 x 2) = "
        f"{2 * load * 2 // 16} should send the second attempt to one of {group}; the attempts "
        f"reached {attempts}",
    )
    release_all(target, gpus)


@covers("SEL-010")
@requires(*UNTRIED_DEVICE_AWARE)
def test_device_aware_over_untried_workers_of_one_group(target: Target) -> None:
    """When the untried workers are all CPU workers, there is no budget to weigh: the
    least-loaded of them is chosen."""
    failing = failing_first(target)
    first_cpu, second_cpu = target.add_worker(device="cpu"), target.add_worker(device="cpu")
    book(target, first_cpu, 1)
    target.script_worker(first_cpu, Serve())
    attempts = one_retry_attempts(target)
    require_equal(
        "SEL-010",
        attempts,
        [failing, second_cpu],
        f"after non-CPU {failing} failed, only CPU workers {first_cpu} (1 open request) and "
        f"{second_cpu} (idle) are untried: the second attempt should go to {second_cpu}; "
        f"the attempts reached {attempts}",
    )
    release_all(target, [first_cpu])


def weighs_device_groups(target: Target, layout: tuple[str, ...], ratio: int) -> None:
    devices = {target.add_worker(device=device): device for device in layout}
    workers = list(devices)
    book(target, workers[-1], 2)
    for worker in workers:
        target.script_worker(worker, Stall())
    groups_used: set[str] = set()
    for step in range(40):
        before = loads(target)
        group = _expected_group(before, devices, ratio)
        minimum = min(before.get(w, 0) for w in group)
        worker = only_worker(target, target.submit(Generate("device-aware-weighted")), "SEL-010")
        require(
            "SEL-010",
            worker in group and before.get(worker, 0) == minimum,
            f"step {step}: ratio {ratio}, devices {devices}, occupancy {before}: expected a "
            f"least-loaded worker of {sorted(group)} (load {minimum}), got {worker} "
            f"(load {before.get(worker, 0)})",
        )
        groups_used.add(devices[worker])
    if "cpu" in layout and len(set(layout)) == 2:
        require(
            "SEL-010",
            "cpu" in groups_used and groups_used != {"cpu"},
            f"40 requests over {devices} used device groups {groups_used}; the load budget "
            "should have sent work to both",
        )
    release_all(target, workers)


# --- SEL-011 ---


@covers("SEL-011", "DSP-011")
@requires(Capability.SCRIPT_STALL, Capability.OBSERVE_OCCUPANCY)
@pytest.mark.parametrize("mode", OCCUPANCY_MODES)
def test_occupancy_modes_book_the_selected_worker(target: Target, mode: str) -> None:
    workers = [target.add_worker() for _ in range(2)]
    for worker in workers:
        target.script_worker(worker, Stall())
    requests: list[str] = []
    for _ in range(5):
        before = loads(target)
        request = target.submit(Generate(mode))
        requests.append(request)
        worker = only_worker(target, request, "SEL-011")
        expected = {**before, worker: before.get(worker, 0) + 1}
        after = loads(target)
        require_equal(
            "SEL-011",
            after,
            expected,
            f"generate({mode}) reached {worker} and stays open: occupancy went {before} -> "
            f"{after}, expected {expected}",
        )
    # The cancellation path too: a stream the caller drops is no longer open.
    dropped = requests.pop(0)
    worker = only_worker(target, dropped, "SEL-011")
    before = loads(target)
    target.drop(dropped)
    expected = {w: n for w, n in {**before, worker: before[worker] - 1}.items() if n}
    require_equal(
        "SEL-011",
        loads(target),
        expected,
        f"generate({mode}): the caller dropped {dropped} on {worker}; occupancy went {before} "
        f"-> {loads(target)}, expected {expected}",
    )
    release_all(target, workers)
    for request in requests:
        outcome = finished(target, request, "SEL-011")
        require_compare(
            "SEL-011", outcome.error, "is", None, f"{request} ended with {outcome.error}"
        )
    require_equal(
        "DSP-011",
        loads(target),
        {},
        f"every stream ended, yet occupancy is {loads(target)}, expected none",
    )
