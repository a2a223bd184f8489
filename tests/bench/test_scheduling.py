"""``streamer bench scheduling``: both policies run, taking turns, and their final latencies are compared."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamer.bench.capacity import CapacityStep
from streamer.bench.report import Distribution
from streamer.bench.scheduling import PolicyRun, summary
from streamer.cli.main import main
from tests.conftest import DATA


def _step(finals: list[float]) -> CapacityStep:
    return CapacityStep(
        streams=8, final_ms=Distribution.of(finals), partial_ms=Distribution.of([]), lag_early_s=0.5,
        lag_late_s=0.5, engine_busy=0.9, windows=1, mean_batch=3.0, decoder_passes=Distribution.of([]),
        lost_seconds=0.0, errors=(),
    )  # fmt: skip


def test_summary_averages_each_policy_over_its_rounds() -> None:
    runs = [
        PolicyRun("finals first", 1, _step([1000.0] * 20)),
        PolicyRun("round robin", 1, _step([2000.0] * 20)),
        PolicyRun("finals first", 2, _step([1200.0] * 20)),
    ]
    assert summary(runs, "finals first") == (pytest.approx(1100.0), pytest.approx(1100.0))
    assert summary(runs, "round robin") == (pytest.approx(2000.0), pytest.approx(2000.0))
    assert summary(runs, "nobody") == (None, None)


def test_scheduling_bench_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    clip = str(DATA / "1089-134686-0000.flac")
    code = main(["bench", "scheduling", "--engine", "fake", "--rtf", "0.01", "--speed", "10", "--duration", "4",
                 "--streams", "2", "--rounds", "2", "--file", clip, "--docs", str(tmp_path)])  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert "round robin's final p95 is" in out
    figures = json.loads((tmp_path / "benchmarks" / "scheduling.json").read_text())
    # the policies take turns, and the one that goes first alternates between rounds
    assert [(r["policy"], r["round"]) for r in figures["runs"]] == [
        ("finals first", 1), ("round robin", 1), ("round robin", 2), ("finals first", 2),
    ]  # fmt: skip
    assert all(r["final_ms"]["count"] > 0 for r in figures["runs"])
    assert "## scheduling" in (tmp_path / "benchmarks.md").read_text()


def test_scheduling_bench_refuses_bad_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "scheduling", "--engine", "fake", "--rounds", "0", "--docs", str(tmp_path)]) == 2
    assert "--rounds" in capsys.readouterr().err
