"""The streaming benchmarks' machinery: files and references, the scripted timeline, the decode recorder, the
figures of a streamed run."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest

from streamer.bench.harness import (
    BenchFile,
    FakeTimeline,
    ReceivedTranscript,
    RecordingEngine,
    SpokenUtterance,
    StreamRun,
    bench_scheduler,
    load_bench_file,
    tiled,
)
from streamer.engine.fake import ScriptedEngine, words_from_text
from streamer.engine.types import DecodeRequest, StreamId
from streamer.server.scheduler import SchedulerOptions
from tests.conftest import CLIPS, DATA


def test_load_bench_file_finds_the_reference_beside_it() -> None:
    file = load_bench_file(DATA / "1089-134686-0001.flac")
    assert file.reference == CLIPS["1089-134686-0001.flac"]
    assert file.utterances == ()
    assert 3 < file.seconds < 4


def test_load_bench_file_without_reference(tmp_path: Path) -> None:
    import soundfile as sf

    sf.write(tmp_path / "x.wav", np.zeros(1600, dtype=np.float32), 16000)
    assert load_bench_file(tmp_path / "x.wav").reference is None


def test_tiled_cuts_or_repeats() -> None:
    samples = np.arange(16000, dtype=np.float32)
    assert len(tiled(samples, 0.5)) == 8000
    longer = tiled(samples, 2.5)
    assert len(longer) == 40000 and longer[16000] == 0 and longer[39999] == 7999


def test_timeline_spreads_each_utterance_over_its_span() -> None:
    file = BenchFile(
        Path("x.flac"),
        np.zeros(32000, dtype=np.float32),
        "ONE TWO THREE",
        (SpokenUtterance(0, 8000, "ONE TWO"), SpokenUtterance(16000, 32000, "THREE")),
    )
    words = FakeTimeline.words_for(file)
    assert [(w.text, w.start, w.end) for w in words] == [("ONE", 0, 3999), ("TWO", 4000, 7999), ("THREE", 16000, 31999)]
    whole = FakeTimeline.words_for(BenchFile(Path("y.flac"), np.zeros(300, dtype=np.float32), "A B C"))
    assert [w.start for w in whole] == [0, 100, 200]


def test_recording_engine_records_every_window() -> None:
    engine = RecordingEngine(ScriptedEngine(words_from_text("a b c", 0, 1000)))
    requests = [
        DecodeRequest(np.zeros(16000, dtype=np.float32), stream_id=StreamId("s"), request_id=1),
        DecodeRequest(np.zeros(8000, dtype=np.float32), stream_id=StreamId("t"), request_id=2),
    ]
    results = engine.decode(requests)
    assert [r.request_id for r in results] == [1, 2]
    records = engine.take()
    assert [(r.stream_id, r.audio_seconds, r.batch_size) for r in records] == [("s", 1.0, 2), ("t", 0.5, 2)]
    assert [r.decoder_passes for r in records] == [r.decoder_passes for r in results] == [4, 4]
    assert engine.take() == []
    engine.close()
    assert engine.inner.closed  # type: ignore[attr-defined]


def _transcript(final: bool, text: str, start: float, end: float, received: float) -> ReceivedTranscript:
    return ReceivedTranscript(final, text, start, end, 100.0, received)


def test_stream_run_figures() -> None:
    run = StreamRun(
        "f",
        audio_seconds=10.0,
        speed=2.0,
        transcripts=(
            _transcript(False, "", 0.0, 1.0, 0.6),
            _transcript(False, " hello", 1.0, 2.0, 1.5),
            _transcript(True, " world", 3.0, 4.0, 2.5),
            _transcript(True, " hello", 1.0, 2.0, 2.0),
        ),
        done=None,
        errors=(),
        wall_seconds=6.0,
    )
    assert run.text == "hello world"
    assert [t.text for t in run.partials] == ["", " hello"]
    assert run.lag(run.finals[0]) == 0.5  # the end of its audio (4 s) was sent at 2 s, at twice real time
    assert run.first_partial_seconds == 1.0  # the first text's audio started at 1 s of audio, sent at 0.5 s


def test_engine_work_counts_each_call_once_and_sums_each_window() -> None:
    from streamer.bench.harness import DecodeRecord, EngineWork

    def record(finished: float, batch: int, batch_seconds: float, passes: int) -> DecodeRecord:
        return DecodeRecord(StreamId("s"), 10.0, passes, 0.1, 0.2, batch, batch_seconds, finished)

    # two calls: a batch of two windows that took 0.5 s, then one window alone that took 0.3 s
    work = EngineWork.of([record(1.0, 2, 0.5, 20), record(1.0, 2, 0.5, 10), record(2.0, 1, 0.3, 6)])
    assert (work.windows, work.calls, work.decoder_passes) == (3, 2, 36)
    assert work.busy_seconds == pytest.approx(0.8)
    assert (work.encoder_seconds, work.decoder_seconds, work.audio_seconds) == pytest.approx((0.3, 0.6, 30.0))
    assert work.describe(1.6) == (
        "The engine decoded 3 windows in 2 calls (1.50 a call), busy 50 % of the streaming time; a window averaged "
        "10.0 s of audio, 100 ms of encoder, 200 ms of decoder over 12.0 passes."
    )
    assert EngineWork.of([]).describe(1.0) == "The engine decoded no window."


def test_bench_scheduler_carries_the_scheduling_a_bench_asks_for() -> None:
    # the in-process server and the accelerated simulation read the same options: a bench's --max-batch-size,
    # opening-window options and finals_first; the scheduler's defaults where a bench's parser lacks them
    asked = argparse.Namespace(max_batch_size=3, openings_first=False, opening_batch_size=1, finals_first=False)
    options = bench_scheduler(asked)
    assert (options.max_batch_size, options.openings_first, options.opening_batch_size, options.finals_first) == (
        3,
        False,
        1,
        False,
    )
    assert bench_scheduler(argparse.Namespace()) == SchedulerOptions()
    assert bench_scheduler(argparse.Namespace(max_batch_size=None)) == SchedulerOptions()
