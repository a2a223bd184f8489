"""``streamer bench stream`` end to end on the scripted engine: the table, the JSON and the benchmarks.md section."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamer.bench.report import Distribution
from streamer.bench.stream import TARGETS, StreamFigures
from streamer.cli.main import main
from tests.conftest import DATA

CLIP = DATA / "1089-134686-0000.flac"


def _bench(tmp_path: Path, *extra: str) -> int:
    return main(["bench", "stream", "--engine", "fake", "--rtf", "0.01", "--speed", "20", "--docs", str(tmp_path),
                 "--file", str(CLIP), *extra])  # fmt: skip


def test_stream_bench_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _bench(tmp_path) == 0
    out = capsys.readouterr().out
    for expected in ("WER %", "| partial", "| final", "first partial", "decoder passes", "StreamTargets"):
        assert expected in out
    figures = json.loads((tmp_path / "benchmarks" / "stream.json").read_text())
    assert figures["command"].startswith("streamer bench stream --file")
    assert figures["figures"]["files"] == [CLIP.name]
    assert figures["figures"]["streamed_wer"] is not None and figures["figures"]["offline_wer"] is not None
    assert figures["figures"]["final_ms"]["count"] > 0 and figures["figures"]["partial_ms"]["count"] > 0
    assert figures["figures"]["decoder_passes"]["mean"] > 0  # the scripted engine spends len(words) + 1
    assert figures["streams"][0]["done"]["lost_seconds"] == 0
    assert "stew for dinner" in figures["streams"][0]["text"].lower()
    assert len(figures["verdicts"]) == 3
    markdown = (tmp_path / "benchmarks.md").read_text()
    assert "## stream" in markdown and figures["command"] in markdown
    # the plot is drawn where matplotlib is installed; the section links it exactly when it was drawn
    assert ("stream-latency.png" in markdown) == (tmp_path / "benchmarks" / "stream-latency.png").exists()


def test_stream_bench_rerun_replaces_its_section(tmp_path: Path) -> None:
    assert _bench(tmp_path) == 0
    assert _bench(tmp_path, "--step-ms", "500") == 0
    markdown = (tmp_path / "benchmarks.md").read_text()
    assert markdown.count("## stream") == 1
    assert "--step-ms 500" in markdown


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--speed", "0"], "--speed"),
        (["--chunk-ms", "500"], "--chunk-ms"),
        (["--file", "missing.flac"], "no such file"),
    ],
)
def test_stream_bench_refuses_bad_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main(["bench", "stream", "--engine", "fake", "--docs", str(tmp_path), *args]) == 2
    assert message in capsys.readouterr().err


def _figures(gap_wer: float | None, partial: list[float], final: list[float]) -> StreamFigures:
    empty = Distribution.of([])
    return StreamFigures(
        files=("f",), audio_seconds=1.0, streamed_wer=None if gap_wer is None else 10 + gap_wer,
        offline_wer=None if gap_wer is None else 10.0, partial_ms=Distribution.of(partial),
        final_ms=Distribution.of(final), first_partial_s=empty, decoder_passes=empty, encoder_ms=empty,
        decoder_ms=empty, window_s=empty, engine_busy=0.0, offline_rtf=0.0, lost_seconds=0.0, errors=(),
    )  # fmt: skip


def test_verdicts_against_the_issue_targets() -> None:
    met = _figures(1.5, [TARGETS.partial_p50_ms], [TARGETS.final_p95_ms])
    assert [v[1] for v in met.verdicts()] == [True, True, True]
    missed = _figures(1.6, [TARGETS.partial_p50_ms + 1], [TARGETS.final_p95_ms + 1] * 20)
    assert [v[1] for v in missed.verdicts()] == [False, False, False]
    assert [v[1] for v in _figures(None, [], []).verdicts()] == [None, None, None]
