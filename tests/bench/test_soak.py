"""``streamer bench soak``: growth and per-minute figures, the targets, the server command, and one short run
against a real server process."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

from streamer.bench import soak
from streamer.bench.harness import ReceivedTranscript, StreamRun
from streamer.bench.report import Distribution
from streamer.bench.soak import (
    Growth,
    LineFit,
    MemorySample,
    SoakFigures,
    fit_line,
    format_figures,
    growth,
    judge,
    per_minute,
    server_command,
)
from streamer.cli.main import build_parser, main
from streamer.core.errors import ConfigError
from tests.conftest import DATA

CLIP = DATA / "1089-134686-0000.flac"


def _args(*options: str) -> argparse.Namespace:
    return build_parser().parse_args(["bench", "soak", "--file", str(CLIP), *options])


def _samples(rss: list[float], every: float = 5.0) -> list[MemorySample]:
    return [MemorySample(i * every, value) for i, value in enumerate(rss)]


def test_fit_line_with_the_slope_uncertainty() -> None:
    exact = fit_line([(0.0, 1.0), (1.0, 3.0), (2.0, 5.0)])
    assert exact is not None and exact.slope == pytest.approx(2.0) and exact.slope_stderr == pytest.approx(0.0)
    noisy = fit_line([(0.0, 1.0), (1.0, 2.0), (2.0, 1.0), (3.0, 2.0)])
    assert noisy is not None and noisy.slope == pytest.approx(0.2)
    # residuals from 1.2, 1.4, 1.6, 1.8: -0.2, 0.6, -0.6, 0.2, squares summing to 0.8, over (4 - 2) points and a
    # spread of 5 in x
    assert noisy.slope_stderr == pytest.approx((0.8 / 2 / 5) ** 0.5)
    assert fit_line([(0.0, 1.0), (1.0, 3.0)]) == LineFit(2.0, None)  # two points: no residual, no uncertainty
    assert fit_line([(1.0, 1.0), (1.0, 9.0)]) is None  # no spread in x: no line
    assert fit_line([]) is None


def test_growth_of_a_server_that_leaks_in_the_second_half() -> None:
    # 10 minutes sampled every 5 s: flat at 500 MB for 5 minutes, then 2 MB more every minute
    samples = [MemorySample(t, 500.0 + max(0.0, t - 300) / 30) for t in range(0, 601, 5)]
    g = growth(samples)
    assert g.slope_mb_per_minute == pytest.approx(2.0)
    assert g.second_half_mb == pytest.approx(10.0)  # 2 MB/min over 5 minutes
    assert g.second_half_uncertainty_mb == pytest.approx(0.0, abs=1e-6)  # a straight line: no scatter
    # the last minute (9 to 10 min) averages 509 MB and starts at 508 MB; the second minute is flat at 500 MB
    assert g.last_minus_second_minute_mb == pytest.approx(9.0)
    assert g.floor_growth_mb == pytest.approx(8.0)


def test_growth_of_a_server_whose_batches_swing_its_memory() -> None:
    # a flat floor of 500 MB, and +300 MB in every third sample (a batch in flight): no leak, much scatter
    samples = [MemorySample(t, 500.0 + (300.0 if (t // 5) % 3 == 0 else 0.0)) for t in range(0, 601, 5)]
    g = growth(samples)
    assert g.floor_growth_mb == 0.0
    assert g.second_half_uncertainty_mb is not None and g.second_half_uncertainty_mb > 20
    figures = judge(_figures(growth=g), 600, 20)
    assert figures.failures == (
        "RSS growth over the second half <= 20 MB: +0.0 ± 126.5 MB: the scatter exceeds the target",
    )  # the floor did not move: that target is met


def test_growth_of_a_flat_server_and_of_short_runs() -> None:
    flat = growth(_samples([600.0] * 121))
    assert flat == Growth(0.0, 0.0, 0.0, 0.0, 0.0)
    short = growth(_samples([500.0, 510.0, 520.0]))  # 10 s: no second minute to compare with
    assert short.second_half_mb is not None and short.last_minus_second_minute_mb is None
    # under 3 minutes, the last minute overlaps the second
    assert growth(_samples([500.0] * 30, every=5.9)).floor_growth_mb is None
    assert growth([]) == Growth(None, None, None, None, None)


def _run(finals: list[tuple[float, float]], seconds: float = 150.0) -> StreamRun:
    """A stream whose finals end at ``end`` seconds of audio with the server's ``latency_ms``."""
    transcripts = tuple(ReceivedTranscript(True, "x", end - 1, end, latency, end + 0.5) for end, latency in finals)
    return StreamRun("s", seconds, 1.0, transcripts, None, (), seconds + 1)


def test_per_minute_groups_finals_by_the_minute_of_audio_they_end_in() -> None:
    runs = [_run([(10.0, 100.0), (70.0, 300.0)]), _run([(59.9, 200.0), (130.0, 900.0)])]
    samples = _samples([500.0, 510.0, 520.0, 530.0], every=50.0)  # at 0, 50, 100, 150 s
    minutes = per_minute(runs, samples)
    assert [m.minute for m in minutes] == [0, 1, 2]  # 150 s of audio: three minutes, the last one partial
    assert [m.final_ms.count for m in minutes] == [2, 1, 1]
    assert minutes[0].final_ms.p50 == pytest.approx(150.0)
    assert minutes[2].final_ms.max == 900.0
    assert [m.rss_mb for m in minutes] == [505.0, 520.0, 530.0]  # the samples taken while each minute streamed
    # a final that ends with the audio, at exactly 2 minutes of a 2-minute stream, counts in the second minute
    assert [m.final_ms.count for m in per_minute([_run([(30.0, 1.0), (120.0, 2.0)], seconds=120.0)], [])] == [1, 1]
    # at 2x, a minute of audio streams in 30 wall seconds
    assert [m.rss_mb for m in per_minute(runs, samples, speed=2.0)][:2] == [500.0, 510.0]


def _figures(**overrides: object) -> SoakFigures:
    fields: dict[str, object] = {
        "streams": 2,
        "minutes": 10.0,
        "baseline_mb": 500.0,
        "after_mb": 505.0,
        "load_hwm_mb": 550.0,
        "samples": tuple(_samples([520.0, 540.0, 530.0])),
        "hwm_mb": 560.0,
        "growth": Growth(0.5, 2.5, 4.0, 1.0, 0.5),
        "per_minute": (),
        "final_ms": Distribution.of([500.0, 900.0]),
        "finished": 2,
        "lost_seconds": 0.0,
        "errors": (),
    }
    fields.update(overrides)
    return SoakFigures(**fields)  # type: ignore[arg-type]


def test_peak_is_the_larger_of_vmhwm_and_the_samples() -> None:
    assert _figures().peak_mb == 560.0
    assert _figures(hwm_mb=535.0).peak_mb == 540.0  # VmHWM read at another moment than the samples
    assert _figures().end_mb == 530.0


def test_judge_names_every_missed_target() -> None:
    assert judge(_figures(), 600, 20).held
    missed = judge(
        _figures(hwm_mb=700.0, growth=Growth(8.0, 40.0, 5.0, 30.0, 30.0), finished=1, lost_seconds=2.0, errors=("x",)),
        600,
        20,
    )
    assert missed.failures == (
        "peak RSS <= 600 MB: 700 MB",
        "RSS growth over the second half <= 20 MB: +40.0 ± 5.0 MB",
        "RSS floor growth (minimum of the last minute minus that of the second) <= 20 MB: +30.0 MB",
        "all 2 streams served to the end, no audio lost, no error: 1 finished, 2.0 s lost, 1 error(s)",
    )
    # growth that could not be measured is not a pass
    assert not judge(_figures(growth=Growth(None, None, None, None, None)), 600, 20).held


def test_format_figures_shows_the_table_and_the_targets() -> None:
    args = _args("--streams", "2")
    figures = judge(
        _figures(
            hwm_mb=700.0,
            per_minute=tuple(per_minute([_run([(10.0, 400.0), (100.0, 800.0)])], _samples([500.0] * 40))),
        ),
        600,
        20,
    )
    body = format_figures(figures, args)
    assert "| minute | RSS MB | finals | final p50 ms | final p95 ms |" in body
    assert "| 1      |  500.0 |      1 |          400 |          400 |" in body
    assert "first minute p50 400 / p95 400 ms, last minute p50 - / p95 - ms" in body
    assert "- peak RSS <= 600 MB: 700 MB, MISSED" in body
    assert "- RSS growth over the second half <= 20 MB: +2.5 ± 4.0 MB, met" in body
    assert "3 s after the streams closed 505.0 MB" in body
    assert "MB: 10^6 bytes" in body


def test_server_command_runs_the_real_server_with_the_configuration() -> None:
    command = server_command(_args("--streams", "8"), 4321)
    assert command[:4] == [sys.executable, "-m", "streamer", "serve"]
    assert "--no-auth" in command
    text = " ".join(command)
    assert "--port 4321" in text and "--max-sessions 8" in text and "--model tiny.en" in text
    assert "--encoder-precision" not in text and "--max-audio-rate" not in text  # the machine's defaults, real time
    gpu = " ".join(server_command(_args("--config", "int8-encoder+fp16-decoder", "--threads", "2", "--speed", "4"), 1))
    assert "--encoder-precision int8 --encoder-device cpu --decoder-precision fp16 --decoder-device cuda" in gpu
    assert "--threads 2" in gpu and "--max-audio-rate 0" in gpu
    # the command parses as a serve command line
    build_parser().parse_args(command[3:])


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--streams", "0"], "--streams"),
        (["--minutes", "0"], "--minutes"),
        (["--sample-seconds", "0"], "--sample-seconds"),
        (["--limit-mb", "-1"], "--limit-mb"),
        (["--max-growth-mb", "-1"], "--max-growth-mb"),
        (["--config", "nope"], "unknown --config"),
        (["--chunk-ms", "5"], "--chunk-ms"),
        (["--file", "/no/such.flac"], "no such file"),
    ],
)
def test_bad_options_are_refused_before_anything_starts(
    options: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "soak", "--file", str(CLIP), *options, "--docs", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "benchmarks.md").exists()


def test_linux_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    with pytest.raises(ConfigError, match="Linux only"):
        soak.check_arguments(_args())


@pytest.mark.model
def test_soak_end_to_end_against_a_real_server(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "soak", "--streams", "2", "--minutes", "0.3", "--sample-seconds", "1", "--file", str(CLIP),
                 "--docs", str(tmp_path)])  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert "Targets (performance issue):" in out and "- peak RSS <= 600 MB:" in out
    figures = json.loads((tmp_path / "benchmarks" / "soak.json").read_text())["figures"]
    assert figures["baseline_mb"] > 50  # a Python process with torch and a model
    assert len(figures["samples"]) >= 10  # 18 s of audio sampled every second
    assert figures["hwm_mb"] >= max(s["rss_mb"] for s in figures["samples"]) * 0.99
    assert figures["finished"] == 2 and figures["final_ms"]["count"] > 0
    assert figures["growth"]["second_half_mb"] is not None
    assert "## soak" in (tmp_path / "benchmarks.md").read_text()
