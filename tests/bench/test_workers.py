"""A benchmark's server as ``streamer serve --workers N`` runs it (:mod:`streamer.bench.workers`): the accuracy bench
streams through worker processes that serve its own configuration, and gets their engines' records back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamer.bench.harness import RecordingEngine
from streamer.bench.workers import WorkerSpec, worker_pool
from streamer.cli.main import main
from streamer.cli.workers import WorkerThreads
from streamer.core.errors import StreamerError
from streamer.engine.fake import ScriptedEngine
from streamer.server.serve import ServerConfig
from tests.helpers import WORDS


def test_a_realtime_run_can_serve_from_worker_processes(
    shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # two copies of a 5 s channel against two worker processes with the model (streamer serve --workers 2)
    args = ["bench", "accuracy", "--mode", "realtime", "--group", "conversation", "--threads", "1", "--workers", "2"]
    code = main([*args, "--only", "stereo_diarization.wav [right]", "--streams", "2", "--docs", str(tmp_path)])
    assert code == 0
    out = capsys.readouterr().out
    assert "`streamer serve --workers 2` does: 2 processes on one port" in out
    figures = json.loads((tmp_path / "benchmarks" / "accuracy-2-streams-staggered-2-workers.json").read_text())
    [stream] = figures["pass"]["streams"]
    assert stream["copies"] == 2 and stream["errors"] == []
    assert len(stream["final_delays"]) >= 2 and stream["streamed"]["wer"] < 0.5  # the speech came through
    work = figures["pass"]["engine_work"]  # recorded in the workers, handed to the bench's recorder at their stop
    assert work["windows"] >= work["calls"] > 0 and work["decoder_passes"] > 0


def test_a_worker_that_cannot_start_is_reported_with_its_log() -> None:
    threads = WorkerThreads(1, None)
    spec = WorkerSpec(ServerConfig(port=0), model="no-such-model", engine_config="default", threads=threads)
    recorder = RecordingEngine(ScriptedEngine(WORDS))
    failing = pytest.raises(StreamerError, match=r"0 of 2 workers ready \(exits: \[")
    with failing as raised, worker_pool(spec, 2, recorder, ready_timeout=120):
        pass
    assert "no-such-model" in str(raised.value)  # the workers' own words, from their logs
    assert recorder.take() == []
