"""Smoke tests of ``bench.peer`` and ``bench.selection``: the shape of what they print, never
their timings (figures are read by people, not asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import trio

from bench import peer, profile_paths
from bench.peer_report import DYNAMO, FIGURES, PAIRS, RAW, REFERENCE, TARGETS, summarise, table

ROOT = Path(__file__).resolve().parents[1]
CASES = ("sequential_1_item", "sequential_100_items", "concurrent_1_item", "concurrent_100_items")


def _run(*command: str) -> Any:
    done = subprocess.run(
        [sys.executable, "-m", *command],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(done.stdout)


def test_selection_prints_microseconds_by_mode_and_fleet() -> None:
    results = _run("bench.selection", "--quick", "--workers", "4,100")
    modes = {"round-robin", "random", "power-of-two-choices", "least-loaded"}
    assert modes | {"device-aware-weighted", "kv", "direct"} == set(results)
    for row in results.values():
        assert set(row) == {"4", "100"}
        assert all(isinstance(us, float) and us > 0 for us in row.values())


def test_peer_without_dynamo_measures_the_reference_and_says_so() -> None:
    args = peer.parser().parse_args(
        ["--json", "--no-dynamo", "--rounds", "2", "--requests", "10", "--concurrency", "4"]
    )
    document = json.loads(json.dumps(peer.measure(args)))  # it is what --json prints
    assert document["dynamo_measured"] is False
    assert "not measured" in document["dynamo_note"]
    assert len(document["measurements"]) == 2
    for measured in document["measurements"]:
        assert set(measured) == {RAW, REFERENCE}
        assert set(CASES) <= set(measured[REFERENCE])
    assert set(document["figures"]) == set(FIGURES)
    span = document["figures"]["concurrent_1_item_requests_per_s"][REFERENCE]
    assert span["min"] <= span["max"]
    assert "targets" not in document


def _results(scale: float) -> dict[str, Any]:
    figures = {"p50_us": 100 * scale, "p99_us": 200 * scale}
    rates = {"requests_per_s": 1000 / scale, "items_per_s": 10_000 / scale}
    return {"error_items": 0, **{case: {**figures, **rates, "items_missing": 0} for case in CASES}}


def test_peer_summary_has_same_round_ratios_to_dynamo() -> None:
    rounds = [{pair: _results(1.0 + i) for i, pair in enumerate(PAIRS)} for _ in range(3)]
    summary = summarise(rounds)
    vs_dynamo = summary["ratios"]["concurrent_1_item_requests_per_s"][f"vs_{DYNAMO}"]
    assert set(vs_dynamo) == set(PAIRS) - {DYNAMO}
    assert set(summary["targets"]) == set(TARGETS)
    rendered = table(summary, 3, None)
    assert "Dynamo" in rendered
    assert all(name in rendered for name in FIGURES)


def test_profile_of_the_host_path_counts_per_request(tmp_path: Path) -> None:
    result = trio.run(profile_paths._host, 5, tmp_path)
    assert set(result) == {"host_round_robin", "bare_router_round_robin"}
    for section in result.values():
        assert section["items_per_request"] == 100
        assert {"task_steps_per_request", "calls_per_request", "own_time"} <= set(section)
        assert section["calls_per_request"]["cancel scopes entered"] > 0
