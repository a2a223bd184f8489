"""``streamer bench accuracy``: the set built from the shared tables, delays measured from send times and word ends,
pooling, and a small accelerated run on the scripted engine (no model)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from streamer.bench.accuracy import (
    Delays,
    RouteErrors,
    StreamMeasured,
    final_delays,
    first_partial_delay,
    pool,
    route_errors,
    section_name,
    sent_at,
    starts,
)
from streamer.bench.evalset import channel_references, plan_speaker_runs, read_textgrid
from streamer.bench.harness import ReceivedTranscript, StreamRun, TimedWord
from streamer.bench.simulate import SimulatedStream, simulate
from streamer.cli.main import main
from streamer.core.options import CoreOptions
from streamer.engine.fake import FakeBehaviour, ScriptedEngine, synthetic_silence, synthetic_voice, words_from_text
from streamer.offline.normalize import word_error_rate
from streamer.server.scheduler import SchedulerOptions

# --- the set ---------------------------------------------------------------------------------------------------------


def _row(utt: str, speaker: str, subset: str = "test-other") -> dict[str, str]:
    return {
        "file": f"{subset}/{speaker}/{utt}.flac",
        "utt_id": utt,
        "subset": subset,
        "speaker": speaker,
        "transcript": f"words of {utt}",
    }


def test_speaker_runs_join_each_speakers_utterances_in_order_and_skip_joins_already_in_the_set() -> None:
    rows = [
        _row("533-1-0001", "533"),
        _row("533-1-0000", "533"),
        _row("1688-2-0000", "1688"),
        _row("1688-2-0001", "1688"),
        _row("99-3-0000", "99", subset="test-clean"),
    ]
    runs = plan_speaker_runs(rows, "test-other", covered=frozenset({"1688-2-0000", "1688-2-0001"}))
    assert [r.speaker for r in runs] == ["533"]  # 1688 is a long-form file already; 99 is test-clean
    assert runs[0].files == ("test-other/533/533-1-0000.flac", "test-other/533/533-1-0001.flac")
    assert runs[0].texts == ("words of 533-1-0000", "words of 533-1-0001")
    assert runs[0].name == "librispeech/test-other-533-joined"
    # without the long-form join, 1688 gets its own run; speakers in numeric order
    assert [r.speaker for r in plan_speaker_runs(rows, "test-other", frozenset())] == ["533", "1688"]


_GRID = """File type = "ooTextFile"
item [1]:
    class = "IntervalTier"
    name = "alice"
    intervals [1]:
        xmin = 0
        xmax = 1.5
        text = ""
    intervals [2]:
        xmin = 1.5
        xmax = 3.25
        text = "hello
there"
item [2]:
    class = "IntervalTier"
    name = "bob"
    intervals [1]:
        xmin = 4
        xmax = 5
        text = "bye"
"""


def test_textgrid_tiers_become_channel_references_with_utterances() -> None:
    tiers = read_textgrid(_GRID)
    assert list(tiers) == ["alice", "bob"]
    assert [(i.start, i.end, i.text) for i in tiers["alice"]] == [(1.5, 3.25, "hello there")]
    refs = channel_references(2, "", _GRID)
    assert refs is not None
    assert refs[0][0] == "hello there" and refs[1][0] == "bye"
    assert [(u.start, u.end) for u in refs[0][1]] == [(24000, 52000)]


def test_channel_references_from_the_metadata_note_or_none() -> None:
    refs = channel_references(2, "2-channel, one talker per channel. LEFT: ONE TWO | RIGHT: THREE", None)
    assert refs == [("ONE TWO", ()), ("THREE", ())]
    assert channel_references(2, "two talkers", None) is None
    assert channel_references(3, "LEFT: A | RIGHT: B", None) is None


def test_the_shared_set_has_every_group(shared_data: Path) -> None:
    from streamer.bench.evalset import build_set

    streams = build_set(("librispeech", "conversation"), data=shared_data)
    names = [s.name for s in streams]
    # four test-other speaker runs (1688's is the long-form file), each about a minute with ten utterance boundaries;
    # and test-clean's twelve speakers, one to four utterances each
    runs = [s for s in streams if s.name.startswith("librispeech/test-other")]
    assert len(runs) == 4 and all(55 < s.seconds < 80 and len(s.utterances) == 10 for s in runs)
    clean = [s for s in streams if s.name.startswith("librispeech/test-clean")]
    assert len(clean) == 12 and sum(len(s.utterances) for s in clean) == 16
    assert all(s.utterances[-1].end == len(s.samples) for s in runs)
    # the stereo files are two streams each, with their own references
    assert "conversation/stereo_diarization.wav [right]" in names
    right = next(s for s in streams if s.name.endswith("stereo_diarization.wav [right]"))
    assert right.reference == "THE HORIZON SEEMS EXTREMELY DISTANT"


# --- delays ----------------------------------------------------------------------------------------------------------


def _final(
    text: str, words: list[tuple[float, float]], received: float, latency_ms: float = 100.0
) -> ReceivedTranscript:
    timed = tuple(TimedWord(f"w{i}", a, b) for i, (a, b) in enumerate(words))
    return ReceivedTranscript(
        True, text, words[0][0] if words else 0.0, words[-1][1] if words else 0.0, latency_ms, received, timed
    )


def _run(transcripts: list[ReceivedTranscript], sent: list[float], chunk: int = 1600) -> StreamRun:
    return StreamRun("x", 10.0, 1.0, tuple(transcripts), None, (), 12.0, tuple(sent), chunk)


def test_a_word_end_is_sent_with_the_chunk_that_holds_its_last_sample() -> None:
    # chunks of 100 ms, each sent 5 ms late and one (the fourth) 300 ms late, as a congested client would
    sent = [0.1 * i + 0.005 for i in range(10)]
    sent[3] += 0.3
    run = _run([], sent)
    assert sent_at(run, 0.1) == pytest.approx(0.005)  # sample 1599 is the last of chunk 0
    assert sent_at(run, 0.1001) == pytest.approx(0.105)
    assert sent_at(run, 0.35) == pytest.approx(0.605)
    assert sent_at(run, 99.0) == pytest.approx(0.905)  # past the end: the last chunk
    assert sent_at(_run([], []), 1.0) is None


def test_final_delay_runs_from_sending_the_last_word_to_the_final_arriving() -> None:
    sent = [0.1 * i for i in range(30)]
    run = _run(
        [
            ReceivedTranscript(False, "w0", 0.2, 0.5, 50.0, 0.9, (TimedWord("w0", 0.2, 0.45),)),
            _final("w0 w1", [(0.2, 0.45), (0.5, 1.25)], received=2.5),
            _final("", [], received=2.6),  # a final without words (non-speech) has no speaker delay
            _final("w2", [(2.0, 2.31)], received=3.0, latency_ms=300.0),
        ],
        sent,
    )
    # 1.25 s is sample 20000, whose last sample 19999 is in chunk 12 (sent at 1.2 s)
    assert final_delays(run) == pytest.approx([2.5 - 1.2, 3.0 - 2.3])
    # the first text's first word ends at 0.45 s (chunk 4, sent at 0.4 s), the partial arrives at 0.9 s
    assert first_partial_delay(run) == pytest.approx(0.5)
    assert first_partial_delay(_run([_final("", [], 1.0)], sent)) is None


def test_each_error_is_charged_to_the_final_it_falls_in_and_a_missing_word_to_the_one_before() -> None:
    def final(text: str, route: str) -> ReceivedTranscript:
        return ReceivedTranscript(True, text, 0.0, 1.0, 100.0, 1.0, route=route)

    run = _run(
        [
            final("The cat sat", "agreed"),  # right
            final("on a mat,", "agreed"),  # "a" for "the": one substitution
            final("and then", "end_point"),  # "it" is missing after "then": charged here
            final("slept well well.", "end_point"),  # one inserted "well"
        ],
        [],
    )
    routes = {r.route: r for r in route_errors("the cat sat on the mat and then it slept well", run)}
    assert routes == {
        "agreed": RouteErrors("agreed", 2, 6, 1),
        "end_point": RouteErrors("end_point", 2, 5, 2),
    }
    # beside offline's transcript ("a" for "the" too, "it" heard): only the missing "it" and the extra "well" are
    # streaming's own
    offline = "the cat sat on a mat and then it slept well"
    beside = {r.route: r for r in route_errors("the cat sat on the mat and then it slept well", run, offline)}
    assert beside["agreed"].streaming_only == 0 and beside["end_point"].streaming_only == 2
    # a run whose finals came over the wire has no routes; a run with no words charges its missing words to none
    assert route_errors("the cat", _run([final("The cat", "")], [])) == ()
    assert route_errors("the cat", _run([final("", "end_point")], [])) == (
        RouteErrors("end_point", 1, 0, 0),
        RouteErrors("none", 0, 0, 2),
    )


def test_delays_percentiles() -> None:
    d = Delays.of([float(i) for i in range(1, 101)])
    assert (d.count, d.p50, d.p90, d.max) == (100, pytest.approx(50.5), pytest.approx(90.1), 100.0)
    assert Delays.of([]) == Delays(0, None, None, None, None)


def test_pooling_weights_wer_by_words_and_joins_the_delays() -> None:
    short = StreamMeasured(
        "a",
        5.0,
        1,
        word_error_rate(["one two"], ["one"]),
        word_error_rate(["one two"], ["one two"]),
        (1.0,),
        (0.5,),
        (0.3,),
    )
    long = StreamMeasured(
        "b",
        50.0,
        1,
        word_error_rate(["a b c d e f g h"], ["a b c d e f g h"]),
        word_error_rate(["a b c d e f g h"], ["a b c d e f g x"]),
        (2.0, 3.0),
        (1.0, 1.0),
        (0.4,),
    )
    both = pool("all", [short, long])
    assert both.streamed.wer == pytest.approx(1 / 10)  # not the mean of 50% and 0%
    assert both.offline.wer == pytest.approx(1 / 10)
    assert both.gap == pytest.approx(0.0)
    assert both.final_delays == (1.0, 2.0, 3.0) and both.first_partials == (0.3, 0.4)
    assert both.seconds == 55.0
    with pytest.raises(ValueError):
        pool("none", [])


def test_starts_are_staggered_over_one_step_or_together() -> None:
    assert starts(4, together=False, step_ms=1000) == [0.0, 0.25, 0.5, 0.75]
    assert starts(3, together=True, step_ms=1000) == [0.0, 0.0, 0.0]


# --- the accelerated mode on the scripted engine ---------------------------------------------------------------------

_SAMPLES = np.concatenate(
    [
        synthetic_silence(8000),
        synthetic_voice(48000),
        synthetic_silence(24000),
        synthetic_voice(32000),
        synthetic_silence(16000),
    ]
)
_SCRIPT = words_from_text("one two three four five six", 8000 + 2000, 6000, 1000) + words_from_text(
    "seven eight nine", 80000 + 2000, 6000, 2000
)


def test_an_accelerated_run_streams_every_copy_through_the_core_and_charges_the_engine_time() -> None:
    engine = ScriptedEngine(_SCRIPT, FakeBehaviour(real_time_factor=0.01))
    copies = [SimulatedStream(f"copy {i}", _SAMPLES, t) for i, t in enumerate(starts(2, together=True, step_ms=1000))]
    sim = simulate(engine, copies, CoreOptions(), SchedulerOptions(max_batch_size=1))
    assert [r.text for r in sim.runs] == ["one two three four five six seven eight nine"] * 2
    assert sim.windows == engine.requests and sim.batches == engine.calls  # one window per call at batch size 1
    # the clock ends no earlier than the last chunk's arrival (chunk k arrives at k * 0.1 s)
    assert sim.decode_seconds > 0 and sim.simulated_seconds >= (len(_SAMPLES) - 1600) / 16000
    for run in sim.runs:
        assert run.errors == () and len(run.sent) == len(_SAMPLES) // 1600
        # nothing arrives before the audio it transcribes was sent, and the server's share is part of the delay
        delays = final_delays(run)
        assert len(delays) == sum(1 for t in run.finals if t.words) >= 2 and all(d > 0 for d in delays)
        assert all(t.received >= sent_at(run, t.words[-1].end) for t in run.transcripts if t.words)  # type: ignore[operator]
    # both copies start together on an engine that decodes one window at a time: the one served second waits for
    # the first one's decode, so its first text comes later
    first = sorted(run.transcripts[0].received for run in sim.runs)
    assert first[1] > first[0]
    assert engine.forgotten == ["sim-0", "sim-1"]


def test_accuracy_bench_end_to_end_on_the_scripted_engine(
    shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "bench",
            "accuracy",
            "--engine",
            "fake",
            "--rtf",
            "0.001",
            "--group",
            "conversation",
            "--only",
            "stereo",
            "--streams",
            "2",
            "--docs",
            str(tmp_path),
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    # stereo_diarization's channels are two LibriSpeech readers, one in each half: the verdicts are the report half's
    assert "final delay p50 s" in out and "**all** (pooled)" in out and "**report** (pooled)" in out
    assert "[left] (tune)" in out and "[right] (report)" in out
    assert "Targets (issues 16 and 39), pooled over the report half" in out
    assert "Errors by commit route" in out and "end_point" in out
    # two streams write their own section: the one-stream figures stay beside them
    figures = json.loads((tmp_path / "benchmarks" / "accuracy-2-streams-staggered.json").read_text())
    streams = figures["pass"]["streams"]
    assert [s["name"] for s in streams] == [
        "conversation/stereo_diarization.wav [left]",
        "conversation/stereo_diarization.wav [right]",
    ]
    assert all(s["copies"] == 2 and len(s["final_delays"]) >= 2 for s in streams)
    assert "## accuracy-2-streams-staggered" in (tmp_path / "benchmarks.md").read_text()


def test_a_realtime_run_streams_every_copy_from_a_client_process_and_times_it_on_the_clients_clock(
    shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a 5 s channel, two copies staggered by a step, paced in real time from a process of their own
    args = ["bench", "accuracy", "--mode", "realtime", "--engine", "fake", "--rtf", "0.001", "--group", "conversation"]
    code = main([*args, "--only", "stereo_diarization.wav [right]", "--streams", "2", "--docs", str(tmp_path)])
    assert code == 0
    out = capsys.readouterr().out
    assert "realtime, 2 streams, starts staggered" in out and "The engine decoded" in out
    figures = json.loads((tmp_path / "benchmarks" / "accuracy-2-streams-staggered.json").read_text())
    assert "--clients process" in figures["command"]
    [stream] = figures["pass"]["streams"]
    assert stream["copies"] == 2 and stream["errors"] == []
    work = figures["pass"]["engine_work"]  # the windows of both copies, recorded as the in-process server ran them
    assert work["windows"] >= work["calls"] >= len(stream["final_delays"]) / 2
    # every final of both copies timed from the sending of its last word's audio, the server's share inside it
    assert len(stream["final_delays"]) == len(stream["server_final"]) >= 2
    assert min(stream["final_delays"]) > 0
    assert sorted(stream["final_delays"])[-1] >= sorted(stream["server_final"])[-1]


def test_each_number_of_streams_and_start_writes_its_own_section() -> None:
    assert section_name(1, together=False) == section_name(1, together=True) == "accuracy"
    assert section_name(8, together=False) == "accuracy-8-streams-staggered"
    assert section_name(8, together=True) == "accuracy-8-streams-together"
    assert section_name(1, together=False, half="report") == "accuracy-report-half"
    assert section_name(8, together=True, half="tune") == "accuracy-8-streams-together-tune-half"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--speed", "2"], "real time"),
        (["--streams", "0"], "--streams"),
        (["--agreement-n", "9"], "agreement_n"),
    ],
)
def test_accuracy_bench_refuses_bad_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main(["bench", "accuracy", "--engine", "fake", "--docs", str(tmp_path), *args]) != 0
    assert message in capsys.readouterr().err


def test_workers_are_for_the_realtime_mode_with_the_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "accuracy", "--workers", "2", "--docs", str(tmp_path)]) == 2
    assert "--workers is for --mode realtime" in capsys.readouterr().err
    assert main(["bench", "accuracy", "--mode", "realtime", "--workers", "0", "--docs", str(tmp_path)]) == 2
