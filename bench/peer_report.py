"""``bench.peer``'s figures: min-max over rounds, same-round ratios, the human table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

DYNAMO = "dynamo"
REFERENCE = "reference"
RAW = "raw_trio_socket_baseline"
REFERENCE_TO_DYNAMO = "reference_router_to_dynamo_worker"
DYNAMO_TO_REFERENCE = "dynamo_client_to_reference_worker"
PAIRS = (RAW, REFERENCE, DYNAMO, REFERENCE_TO_DYNAMO, DYNAMO_TO_REFERENCE)
"""Every caller → worker pair, in the order a round measures them (reversed every other)."""

HEADINGS = {
    DYNAMO: "Dynamo",
    REFERENCE: "reference",
    RAW: "raw trio",
    REFERENCE_TO_DYNAMO: "ref router→Dyn worker",
    DYNAMO_TO_REFERENCE: "Dyn client→ref worker",
}

CPU_CASE = "cpu_concurrent_1_item"
"""The concurrent 1-item figure again, with caller and worker CPU µs per request."""

# name: (case, key, higher is better)
FIGURES: dict[str, tuple[str, str, bool]] = {
    "sequential_1_item_p50_us": ("sequential_1_item", "p50_us", False),
    "sequential_1_item_p99_us": ("sequential_1_item", "p99_us", False),
    "sequential_100_items_p50_us": ("sequential_100_items", "p50_us", False),
    "sequential_100_items_p99_us": ("sequential_100_items", "p99_us", False),
    "concurrent_1_item_requests_per_s": ("concurrent_1_item", "requests_per_s", True),
    "concurrent_100_items_items_per_s": ("concurrent_100_items", "items_per_s", True),
    "concurrent_1_item_cpu_us_per_request": (CPU_CASE, "total_us", False),
    "concurrent_1_item_caller_cpu_us_per_request": (CPU_CASE, "caller_us", False),
    "concurrent_1_item_worker_cpu_us_per_request": (CPU_CASE, "worker_us", False),
}

# issue 15's targets: the reference's figure over Dynamo's, in the same round
TARGETS: dict[str, tuple[str, float]] = {
    "concurrent_1_item_requests_per_s": (">=", 1.5),
    "sequential_1_item_p50_us": ("<=", 0.5),
    "concurrent_100_items_items_per_s": (">=", 5.0),
}

Round = Mapping[str, Mapping[str, Any]]  # pair -> bench.transport-shaped results


def _span(values: Sequence[float]) -> dict[str, float]:
    return {"min": min(values), "max": max(values)}


def figure(results: Mapping[str, Any], name: str) -> float:
    case, key, _ = FIGURES[name]
    value = results[case][key]
    assert isinstance(value, int | float)
    return float(value)


def summarise(rounds: Sequence[Round]) -> dict[str, Any]:
    """Per figure and pair: min-max over rounds and, for every pair but Dynamo, the ratio to
    Dynamo's figure of the same round (and to the raw socket's)."""
    figures: dict[str, Any] = {}
    ratios: dict[str, Any] = {}
    for name, (case, _, _) in FIGURES.items():
        pairs = [p for p in PAIRS if all(case in measured.get(p, {}) for measured in rounds)]
        figures[name] = {p: _span([figure(r[p], name) for r in rounds]) for p in pairs}
        ratios[name] = {}
        for base in (DYNAMO, RAW):
            if base not in pairs:
                continue
            ratios[name][f"vs_{base}"] = {
                p: _span([round(figure(r[p], name) / figure(r[base], name), 3) for r in rounds])
                for p in pairs
                if p != base
            }
    summary: dict[str, Any] = {"figures": figures, "ratios": ratios, "faults": _faults(rounds)}
    if all(DYNAMO in measured for measured in rounds):
        summary["targets"] = {
            name: _target(name, ratios[name][f"vs_{DYNAMO}"][REFERENCE]) for name in TARGETS
        }
    return summary


def _faults(rounds: Sequence[Round]) -> dict[str, int]:
    """Error items and missing items per pair over all rounds: figures with faults mislead."""
    faults: dict[str, int] = {}
    for measured in rounds:
        for pair, results in measured.items():
            cases = {case for case, _, _ in FIGURES.values() if case in results}
            missing = sum(results[case]["items_missing"] for case in cases)
            faults[pair] = faults.get(pair, 0) + int(results["error_items"]) + missing
    return {pair: count for pair, count in faults.items() if count}


def _target(name: str, ratio: Mapping[str, float]) -> dict[str, object]:
    """Met only when every round meets it (the worst round's ratio)."""
    relation, bound = TARGETS[name]
    worst = ratio["min"] if relation == ">=" else ratio["max"]
    met = worst >= bound if relation == ">=" else worst <= bound
    return {"reference_vs_dynamo": f"{relation} {bound}", "worst_round": worst, "met": met}


def _range(span: Mapping[str, float], digits: int = 0) -> str:
    low, high = (f"{span[k]:,.{digits}f}" for k in ("min", "max"))
    return low if low == high else f"{low}-{high}"


def table(summary: Mapping[str, Any], rounds: int, dynamo_note: str | None) -> str:
    """Rows: figures; columns: each pair's min-max, then its ratio to Dynamo in brackets."""
    figures, ratios = summary["figures"], summary["ratios"]
    pairs = [p for p in PAIRS if any(p in spans for spans in figures.values())]
    to_dynamo = DYNAMO in pairs
    header = ["figure", *(HEADINGS[p] for p in pairs)]
    rows = [header]
    for name, (_, _, higher) in FIGURES.items():
        row = [f"{name} ({'higher' if higher else 'lower'} is better)"]
        for pair in pairs:
            if pair not in figures[name]:
                row.append("")
                continue
            cell = _range(figures[name][pair])
            if to_dynamo and pair != DYNAMO and pair in ratios[name]["vs_dynamo"]:
                cell += f" ({_range(ratios[name]['vs_dynamo'][pair], 2)}x)"
            row.append(cell)
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [" | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    notes = [f"{rounds} round(s), min-max over rounds; µs for latencies."]
    if to_dynamo:
        notes.append("(Nx) = the figure over Dynamo's in the same round, min-max.")
        for name, target in summary["targets"].items():
            verdict = "met" if target["met"] else "NOT met"
            notes.append(
                f"target {name}: reference/Dynamo {target['reference_vs_dynamo']}: worst "
                f"round {target['worst_round']} → {verdict}"
            )
    if RAW in pairs and REFERENCE in pairs:
        share = ratios["concurrent_1_item_requests_per_s"][f"vs_{RAW}"][REFERENCE]
        notes.append(f"reference 1-item req/s at {_range(share, 2)}x the raw trio socket's.")
    for pair, count in summary["faults"].items():
        notes.append(f"WARNING: {HEADINGS[pair]}: {count} error or missing items; see the JSON.")
    if dynamo_note:
        notes.append(dynamo_note)
    return "\n".join([*lines, "", *notes])
