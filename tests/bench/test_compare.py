"""``streamer bench compare``: the figures it reads, the interleaving, and the verdicts, with a fake runner."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from streamer.bench.compare import CHECKS, Check, Side, compare, figures_of, verdicts


def document(bench: str, scale: float) -> dict[str, Any]:
    """A benchmark's JSON as the real one is shaped, every figure ``scale`` times a base value."""
    latency = {"p50": 300 * scale, "p95": 500 * scale}
    return {
        "stream": {
            "figures": {"final_ms": latency, "partial_ms": latency, "streamed_wer": 5 * scale, "lost_seconds": 0}
        },
        "capacity": {"largest_held": 8 / scale, "steps": [{"final_ms": latency}, {"final_ms": latency}]},
        "soak": {"figures": {"hwm_mb": 500 * scale, "final_ms": latency, "lost_seconds": 0}},
    }[bench]


def test_every_check_reads_a_figure_of_its_benchmark() -> None:
    for bench in ("stream", "capacity", "soak"):
        figures = figures_of(bench, document(bench, 1.0))
        assert set(figures) == {c.figure for c in CHECKS if c.bench == bench}
    assert figures_of("capacity", document("capacity", 2.0))["streams held"] == 4


def test_sides_alternate_which_runs_first_and_each_run_gets_its_own_docs(tmp_path: Path) -> None:
    calls: list[tuple[str, str, Path]] = []

    def runner(side: Side, bench: str, extra: Sequence[str], docs: Path) -> Mapping[str, Any]:
        calls.append((side.name, bench, docs))
        return document(bench, 1.0 if side.name == "baseline" else 1.05)

    sides = (Side("baseline", tmp_path / "b"), Side("this tree", tmp_path / "c"))
    results = compare(sides, ["stream", "soak"], 2, tmp_path, runner)
    assert [(s, b) for s, b, _ in calls] == [
        ("baseline", "stream"), ("this tree", "stream"), ("baseline", "soak"), ("this tree", "soak"),
        ("this tree", "stream"), ("baseline", "stream"), ("this tree", "soak"), ("baseline", "soak"),
    ]  # fmt: skip
    assert len({docs for _, _, docs in calls}) == len(calls)
    assert len(results["stream"]["baseline"]) == 2
    rows = verdicts(results)
    assert all(r["no_regression"] for r in rows)  # 5% is inside the noise allowed
    assert {r["ratio"] for r in rows if r["figure"] == "final p95 ms"} == {1.05}


def test_a_regression_past_the_noise_is_called_one() -> None:
    results = {
        "capacity": {
            "baseline": [figures_of("capacity", document("capacity", 1.0))],
            "this tree": [figures_of("capacity", document("capacity", 2.0))],  # half the streams, twice the latency
        }
    }
    rows = {r["figure"]: r for r in verdicts(results)}
    assert not rows["streams held"]["no_regression"]
    assert not rows["final p95 ms at the last step"]["no_regression"]
    assert Check("x", "y", (), higher_is_better=True).holds(8, 8)
    assert Check("x", "y", (), ratio=1.1).holds(100, 110) and not Check("x", "y", (), ratio=1.1).holds(100, 111)
