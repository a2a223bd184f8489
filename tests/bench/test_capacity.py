"""``streamer bench capacity``: the ramp, the lag-growth and verdict rules, and a run on the scripted engine."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from streamer.bench import clients
from streamer.bench.capacity import CapacityStep, judge, lag_growth, largest_held, ramp
from streamer.bench.clients import ClientResult, ClientShare, stream_from_process
from streamer.bench.harness import ReceivedTranscript, StreamRun
from streamer.bench.report import Distribution
from streamer.cli.main import main
from tests.conftest import DATA


def test_ramp() -> None:
    assert ramp(1) == [1]
    assert ramp(8) == [1, 2, 4, 6, 8]
    assert ramp(5) == [1, 2, 4, 5]


def _run(lags: list[tuple[float, float]]) -> StreamRun:
    """A 9 s stream whose finals end at ``end`` and arrive ``lag`` seconds after that audio was sent."""
    finals = tuple(ReceivedTranscript(True, "x", end - 1, end, 0.0, end + lag) for end, lag in lags)
    return StreamRun("s", 9.0, 1.0, finals, None, (), 10.0)


def test_lag_growth_compares_first_and_last_thirds() -> None:
    early, late = lag_growth([_run([(1.0, 0.5), (2.0, 0.7), (5.0, 9.0), (8.0, 2.0)]), _run([(9.0, 3.0)])])
    assert early == pytest.approx(0.6)  # the middle third (5 s) counts in neither
    assert late == pytest.approx(2.5)
    assert lag_growth([_run([])]) == (None, None)


def _step(n: int, finals: list[float], early: float = 0.5, late: float = 0.5, lost: float = 0.0) -> CapacityStep:
    return CapacityStep(
        streams=n, final_ms=Distribution.of(finals), partial_ms=Distribution.of([]), lag_early_s=early,
        lag_late_s=late, engine_busy=0.5, windows=1, mean_batch=1.0, decoder_passes=Distribution.of([]),
        lost_seconds=lost, errors=(),
    )  # fmt: skip


def test_judge_names_every_failure() -> None:
    assert judge(_step(1, [1000.0]), 2000, 1.0).held
    failed = judge(_step(2, [3000.0], early=0.5, late=2.0, lost=1.0), 2000, 1.0)
    assert not failed.held
    assert failed.failures == ("final p95 3000 ms > 2000 ms", "lag grew 1.50 s > 1 s", "1.0 s of audio lost")
    assert judge(_step(1, []), 2000, 1.0).failures == ("no finals",)


def test_largest_held() -> None:
    assert largest_held([judge(_step(1, [3000.0]), 2000, 1)]) == 0
    assert largest_held([judge(_step(1, [1.0]), 2000, 1), judge(_step(2, [3000.0]), 2000, 1)]) == 1


def test_capacity_bench_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    clip = str(DATA / "1089-134686-0000.flac")
    code = main(["bench", "capacity", "--engine", "fake", "--rtf", "0.01", "--speed", "10", "--duration", "4",
                 "--max-streams", "2", "--file", clip, "--docs", str(tmp_path)])  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert "| streams" in out and "Largest number of concurrent real-time streams held:" in out
    figures = json.loads((tmp_path / "benchmarks" / "capacity.json").read_text())
    steps = figures["steps"]
    assert all(s["windows"] > 0 and s["final_ms"]["count"] > 0 for s in steps)
    # judged on the speaker's delay, which holds the server's share of it (latency_ms) and the wait before it
    assert all(s["final_ms"]["count"] == s["server_final_ms"]["count"] for s in steps)
    assert all(s["final_ms"][q] >= s["server_final_ms"][q] for s in steps for q in ("p50", "p95"))
    # whether a step holds depends on the machine; what follows from the verdicts does not: the ramp (1, then 2)
    # stops at the first step that failed, and the figure is the last step held
    assert [s["streams"] for s in steps] in ([1], [1, 2])
    assert all(s["held"] for s in steps[:-1]) and (len(steps) == 2 or not steps[-1]["held"])
    held = [s["streams"] for s in steps if s["held"]]
    assert figures["largest_held"] == (held[-1] if held else 0)
    assert f"Largest number of concurrent real-time streams held: {figures['largest_held']}" in out
    assert "## capacity" in (tmp_path / "benchmarks.md").read_text()


def test_capacity_bench_refuses_bad_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "capacity", "--engine", "fake", "--max-streams", "0", "--docs", str(tmp_path)]) == 2
    assert "--max-streams" in capsys.readouterr().err


def test_a_stream_that_fails_in_the_client_process_fails_its_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The clients stream from a process of their own; a stream that fails there is named among the step's errors,
    and the step does not hold, although every other figure of it would."""
    streamed: list[ClientResult] = []

    def one_dropped(share: ClientShare) -> ClientResult:
        result = stream_from_process(share)
        streamed.append(result)
        return replace(result, failed=("stream 9: ConnectionResetError: dropped",))

    monkeypatch.setattr(clients, "stream_from_process", one_dropped)
    clip = str(DATA / "1089-134686-0000.flac")
    code = main(["bench", "capacity", "--engine", "fake", "--rtf", "0.001", "--speed", "10", "--duration", "4",
                 "--max-streams", "1", "--file", clip, "--docs", str(tmp_path)])  # fmt: skip
    assert code == 0
    [result] = streamed
    assert result.pid != os.getpid() and len(result.runs) == 1 and result.wall_seconds > 0
    [step] = json.loads((tmp_path / "benchmarks" / "capacity.json").read_text())["steps"]
    assert step["errors"] == ["stream failed: stream 9: ConnectionResetError: dropped"]
    assert step["final_ms"]["count"] > 0 and not step["held"]
    assert "FAILED: 1 error message(s)" in capsys.readouterr().out
