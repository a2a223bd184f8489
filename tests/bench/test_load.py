"""``streamer bench load``: the ramp's parsing, the verdict, and a tiny run against ``streamer serve --engine
scripted`` in its own process, with clients in two processes."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from streamer.bench.load import LoadStep, judge, parse_steps, server_command
from streamer.bench.report import Distribution
from streamer.cli.main import main
from streamer.core.errors import ConfigError
from tests.conftest import DATA


def test_the_ramp_is_increasing_numbers_of_streams() -> None:
    assert parse_steps("1,8,32,64,100") == [1, 8, 32, 64, 100]
    for bad in ("", "0,4", "8,4", "1,x"):
        with pytest.raises(ConfigError, match="--streams"):
            parse_steps(bad)


def _step(failed: int = 0, p95: float = 500.0) -> LoadStep:
    return LoadStep(
        streams=4, final_ms=Distribution.of([p95]), server_final_ms=Distribution.of([10.0]), lag_early_s=0.5,
        lag_late_s=0.6, failed_streams=failed, lost_seconds=0.0, errors=(), wall_seconds=10.0, stream_seconds=40.0,
        server_cpu_seconds=2.0, client_cpu_seconds=1.0,
    )  # fmt: skip


def test_a_step_holds_on_the_capacity_rules_and_only_when_no_stream_failed() -> None:
    held = judge(_step(), 1500, 1.0)
    assert held.held and held.server_cpu_per_stream_second == 0.05 and held.server_cores == 0.2
    assert judge(_step(failed=2, p95=2000.0), 1500, 1.0).failures == (
        "final p95 2000 ms > 1500 ms",
        "2 stream(s) failed",
    )


def _load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], section: str, *options: str
) -> tuple[str, dict[str, Any]]:
    """``streamer bench load OPTIONS`` on a committed clip, with limits so generous that whether a step holds on a
    shared machine is the measurement's business, not the test's: its output and its section's figures."""
    code = main(["bench", "load", *options, "--limit-ms", "60000", "--max-lag-growth", "60",
                 "--file", str(DATA / "1089-134686-0000.flac"), "--docs", str(tmp_path)])  # fmt: skip
    assert code == 0
    figures: dict[str, Any] = json.loads((tmp_path / "benchmarks" / f"{section}.json").read_text())
    return capsys.readouterr().out, figures


def test_load_bench_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, figures = _load(tmp_path, capsys, "load", "--streams", "1,2", "--client-processes", "2", "--duration", "4",
                         "--speed", "4", "--stagger", "0.5", "--scripted-window-ms", "1",
                         "--scripted-batch-ms", "1")  # fmt: skip
    assert "| streams" in out and "Largest number of concurrent real-time streams held: 2" in out
    steps = figures["steps"]
    assert [s["streams"] for s in steps] == [1, 2] and all(s["held"] for s in steps)
    for s in steps:
        assert s["failed_streams"] == 0 and s["lost_seconds"] == 0
        # every stream got finals, timed by the speaker's clock, which holds the server's share of the delay
        assert s["final_ms"]["count"] == s["server_final_ms"]["count"] > 0
        assert s["final_ms"]["p95"] >= s["server_final_ms"]["p95"]
        assert s["stream_seconds"] == 4 * s["streams"]
        assert s["server_cpu_seconds"] > 0 and s["server_cpu_per_stream_second"] > 0
        assert s["windows"] >= s["batches"] > 0 and 0 < s["engine_busy"] < 1  # the server's own counters
    assert "## load" in (tmp_path / "benchmarks.md").read_text()


def test_load_bench_spreads_the_streams_over_several_server_processes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, figures = _load(tmp_path, capsys, "load", "--streams", "1,2", "--server-processes", "2", "--client-processes",
                         "1", "--duration", "3", "--speed", "4", "--stagger", "0.2", "--scripted-window-ms", "1",
                         "--scripted-batch-ms", "1")  # fmt: skip
    assert "in 2 processes, each with its own engine" in out
    assert "Largest number of concurrent real-time streams held: 2" in out
    assert figures["server_processes"] == 2
    for s in figures["steps"]:
        assert s["held"] and s["failed_streams"] == 0 and s["servers"] == 2
        assert s["windows"] >= s["batches"] > 0 and 0 < s["engine_busy"] < 1
        assert sum(s["server_windows"]) == s["windows"]
    one, two = figures["steps"]
    assert min(one["server_windows"]) == 0 < max(one["server_windows"])  # one stream: one server
    assert min(two["server_windows"]) > 0  # two streams: one to each


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed (.ci/run installs it)")
def test_load_bench_drives_a_server_with_workers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, figures = _load(tmp_path, capsys, "load", "--streams", "4", "--workers", "2", "--client-processes", "1",
                         "--duration", "3", "--speed", "2", "--stagger", "1", "--scripted-window-ms", "1",
                         "--scripted-batch-ms", "1")  # fmt: skip
    assert "each `--workers 2`" in out
    [step] = figures["steps"]
    assert step["held"] and step["failed_streams"] == 0 and step["engines"] == 2
    assert len(step["engine_windows"]) == 2 and min(step["engine_windows"]) > 0  # both workers decoded
    assert sum(step["engine_windows"]) == step["windows"] and 0 < step["engine_busy"] < 1


def test_an_engines_busy_share_is_the_mean_over_the_server_processes() -> None:
    from dataclasses import replace

    step = replace(_step(), engine_busy_seconds=6.0, servers=3)  # 10 s of wall time
    assert step.engine_busy == pytest.approx(0.2)
    assert replace(step, servers=1).engine_busy == pytest.approx(0.6)
    assert replace(step, servers=1, engines=2).engine_busy == pytest.approx(0.3)  # one server, two workers


def test_load_bench_refuses_bad_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "load", "--streams", "4,2", "--docs", str(tmp_path)]) == 2
    assert "--streams" in capsys.readouterr().err
    assert main(["bench", "load", "--server-processes", "0", "--docs", str(tmp_path)]) == 2
    assert "--server-processes" in capsys.readouterr().err
    assert main(["bench", "load", "--workers", "0", "--docs", str(tmp_path)]) == 2
    assert "--workers" in capsys.readouterr().err
    assert main(["bench", "load", "--scripted-window-ms", "-1", "--docs", str(tmp_path)]) == 2
    assert "window_ms" in capsys.readouterr().err
    # a scripted cost means nothing to the model: refused, not ignored
    assert main(["bench", "load", "--engine", "whisper", "--scripted-batch-ms", "5", "--docs", str(tmp_path)]) == 2
    assert "scripted engine's" in capsys.readouterr().err


def test_the_server_runs_the_engine_asked_for() -> None:
    args = argparse.Namespace(
        engine="scripted", model="tiny.en", scripted_window_ms=2.0, scripted_batch_ms=5.0, max_batch_size=None,
        speed=1.0, server_arg=[],
    )  # fmt: skip
    scripted = server_command(args, 9000, 16)
    assert scripted[3:6] == ["serve", "--engine", "scripted"] and "--scripted-window-ms" in scripted
    assert "--model" not in scripted
    model = server_command(argparse.Namespace(**{**vars(args), "engine": "whisper", "server_arg": ["--threads", "2"]}),
                           9000, 16)  # fmt: skip
    assert model[3:6] == ["serve", "--engine", "whisper"]
    assert model[model.index("--model") + 1] == "tiny.en" and model[-2:] == ["--threads", "2"]
    assert not any(part.startswith("--scripted") for part in model)


def test_load_bench_against_the_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the ramp bench/gpu.sh runs on a GPU, here on the CPU at one stream: the real engine in its own process gives
    # finals, timed on the client's clock, and the section is the model's, not the scripted engine's
    out, figures = _load(tmp_path, capsys, "load-whisper", "--engine", "whisper", "--streams", "1",
                         "--client-processes", "1", "--duration", "5", "--stagger", "0")  # fmt: skip
    assert "--engine whisper --model tiny.en` in its own process" in out
    assert "Largest number of concurrent real-time streams held: 1" in out
    (step,) = figures["steps"]
    assert step["held"] and step["failed_streams"] == 0 and step["lost_seconds"] == 0
    assert step["final_ms"]["count"] > 0 and step["windows"] >= step["batches"] > 0
    assert not (tmp_path / "benchmarks" / "load.json").exists()
