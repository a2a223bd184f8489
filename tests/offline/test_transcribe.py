from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import soundfile

from streamer.core.errors import ConfigError
from streamer.core.units import SAMPLE_RATE
from streamer.core.vad import VadSpan
from streamer.engine import EngineOptions
from streamer.engine.types import (
    DecodeOptions,
    DecodeRequest,
    DecodeResult,
    EngineInfo,
    SegmentResult,
    StreamId,
    Task,
    WordTiming,
)
from streamer.offline.transcribe import (
    PlannedWindow,
    TranscribeOptions,
    find_speech,
    plan_windows,
    quietest_point,
    transcribe,
)

S = SAMPLE_RATE
DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"


@dataclass(frozen=True)
class TrueWord:
    text: str
    start: int  # absolute samples
    end: int


class OracleEngine:
    """Knows the true words of the recording; hears a word cut by the window's edge as a garbled ``word~``."""

    def __init__(self, words: Sequence[TrueWord], *, words_per_segment: int = 4) -> None:
        self.words = list(words)
        self.words_per_segment = words_per_segment
        self.requests: list[DecodeRequest] = []
        self.temperature_for: dict[int, float] = {}  # request number (from 0) -> temperature to report
        self.silent_requests: set[int] = set()

    @property
    def info(self) -> EngineInfo:
        return EngineInfo(model="oracle", multilingual=False, encoder="fp32/cpu", decoder="fp32/cpu")

    def decode(self, requests: Sequence[DecodeRequest]) -> list[DecodeResult]:
        results = []
        for request in requests:
            results.append(self._decode(request, len(self.requests)))
            self.requests.append(request)
        return results

    def _decode(self, request: DecodeRequest, number: int) -> DecodeResult:
        lo, hi = request.stream_offset, request.stream_offset + len(request.audio)
        heard = []
        for w in self.words:
            if w.end <= lo or w.start >= hi:
                continue
            whole = w.start >= lo and w.end <= hi
            start, end = max(w.start, lo) - lo, min(w.end, hi) - lo
            heard.append(WordTiming(" " + w.text + ("" if whole else "~"), start, end, 0.9))
        segments = []
        for i in range(0, len(heard), self.words_per_segment):
            group = heard[i : i + self.words_per_segment]
            words = tuple(group) if request.options.word_timestamps else ()
            text = "".join(w.word for w in group)
            segments.append(SegmentResult(group[0].start, group[-1].end, text, (1,), words))
        silent = number in self.silent_requests
        return DecodeResult(
            request_id=request.request_id,
            text="".join(s.text for s in segments),
            language="en",
            segments=tuple(segments),
            avg_logprob=-2.0 if silent else -0.2,
            no_speech_prob=0.95 if silent else 0.01,
            compression_ratio=1.2,
            temperature=self.temperature_for.get(number, 0.0),
        )

    def forget_stream(self, stream_id: StreamId) -> None:
        pass

    def close(self) -> None:
        pass


def continuous_speech(seconds: float, word_s: float = 0.43, gap_s: float = 0.07) -> tuple[np.ndarray, list[TrueWord]]:
    """Words back to back with gaps far too short to cut in: a tone while each word lasts, a hum between them."""
    n = int(seconds * S)
    words, t, i = [], 0.05, 0
    while (t + word_s) * S < n:
        words.append(TrueWord(f"w{i}", int(t * S), int((t + word_s) * S)))
        t += word_s + gap_s
        i += 1
    audio = (0.001 * np.sin(np.arange(n) * 0.05)).astype(np.float32)
    for w in words:
        audio[w.start : w.end] *= 100
    return audio, words


def no_vad(**kwargs: object) -> TranscribeOptions:
    return TranscribeOptions(vad=None, **kwargs)  # type: ignore[arg-type]


# --- planning windows -------------------------------------------------------------------------------------------


def test_windows_are_cut_inside_pauses() -> None:
    speech = [VadSpan(0, 8 * S, True), VadSpan(9 * S, 20 * S, True), VadSpan(21 * S, 35 * S, True)]
    windows = plan_windows(speech, TranscribeOptions())
    assert [(w.start, w.end) for w in windows] == [(0, 20 * S), (21 * S, 35 * S)]
    assert not any(w.forced_cut for w in windows)
    assert all(w.end - w.start <= 30 * S for w in windows)


def test_a_span_that_does_not_fit_starts_a_new_window() -> None:
    speech = [VadSpan(0, 5 * S, True), VadSpan(6 * S, 33 * S, True)]
    windows = plan_windows(speech, TranscribeOptions())
    assert [(w.start, w.end) for w in windows] == [(0, 5 * S), (6 * S, 33 * S)]


def test_speech_without_a_pause_gets_forced_cuts_with_overlap() -> None:
    windows = plan_windows([VadSpan(0, 70 * S, True)], TranscribeOptions())
    assert [(w.start, w.end) for w in windows] == [(0, 30 * S), (28 * S, 58 * S), (56 * S, 70 * S)]
    # the overlap is split at its middle: every sample is kept by exactly one window
    assert [(w.keep_from, w.keep_until) for w in windows] == [(0, 29 * S), (29 * S, 57 * S), (57 * S, 70 * S)]
    assert all(w.forced_cut for w in windows)


def test_forced_cuts_fall_between_words() -> None:
    audio, truth = continuous_speech(95)
    windows = plan_windows([VadSpan(0, len(audio), True)], TranscribeOptions(), quietest=quietest_point(audio))
    cuts = [w.keep_until for w in windows[:-1]]
    assert len(cuts) == 3
    for cut in cuts:
        assert not any(w.start <= cut < w.end for w in truth)
    for before, after in itertools.pairwise(windows):
        assert before.end - after.start == 2 * S  # the overlap
        assert before.keep_until == after.keep_from
    assert all(w.end - w.start <= 30 * S for w in windows)


def test_nothing_to_plan_without_speech() -> None:
    assert plan_windows([], TranscribeOptions()) == []


def test_options_are_validated() -> None:
    with pytest.raises(ConfigError, match="overlap"):
        TranscribeOptions(overlap=20 * S).validate()
    with pytest.raises(ConfigError, match="max_window"):
        TranscribeOptions(max_window=40 * S).validate()
    with pytest.raises(ConfigError, match="beam_size"):
        TranscribeOptions(decode=DecodeOptions(beam_size=0)).validate()


def test_find_speech_without_vad_is_everything() -> None:
    assert find_speech(np.zeros(100, dtype=np.float32), None) == [VadSpan(0, 100, True)]


def test_find_speech_ignores_silence() -> None:
    assert find_speech(np.zeros(5 * S, dtype=np.float32), TranscribeOptions().vad) == []


# --- the pipeline -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("word_timestamps", [True, False])
def test_no_word_is_cut_or_doubled_across_forced_cuts(word_timestamps: bool) -> None:
    audio, truth = continuous_speech(95)
    engine = OracleEngine(truth)
    options = no_vad(decode=DecodeOptions(word_timestamps=word_timestamps))
    transcript = transcribe(engine, audio, options)
    assert len(engine.requests) == 4  # 95 s in windows of 30 s sharing 2 s
    assert transcript.text.split() == [w.text for w in truth]
    assert "~" not in transcript.text
    assert transcript.duration == pytest.approx(95)
    if word_timestamps:
        words = [w for s in transcript.segments for w in s.words]
        assert [w.word.strip() for w in words] == [w.text for w in truth]
        for got, want in zip(words, truth, strict=True):
            assert got.start == pytest.approx(want.start / S) and got.end == pytest.approx(want.end / S)
    else:
        assert all(s.words == () for s in transcript.segments)


def test_no_word_is_cut_or_doubled_when_the_cut_lands_inside_a_word() -> None:
    # a uniformly loud recording gives the quiet-point search nothing to go on: cuts land wherever
    _, truth = continuous_speech(95, word_s=0.5)
    audio = np.full(95 * S, 0.1, dtype=np.float32)
    engine = OracleEngine(truth)
    transcript = transcribe(engine, audio, no_vad())
    cuts = [r.stream_offset + 1 * S for r in engine.requests[1:]]
    assert any(any(w.start < cut < w.end for w in truth) for cut in cuts)
    assert transcript.text.split() == [w.text for w in truth]


def test_segments_are_on_the_recording_timeline_in_order() -> None:
    audio, truth = continuous_speech(65)
    transcript = transcribe(OracleEngine(truth), audio, no_vad())
    starts = [s.start for s in transcript.segments]
    assert starts == sorted(starts)
    assert transcript.segments[0].start == pytest.approx(truth[0].start / S)
    assert transcript.segments[-1].end == pytest.approx(truth[-1].end / S)
    assert all(s.text == s.text.strip() and s.end >= s.start for s in transcript.segments)


def test_each_window_is_conditioned_on_the_text_before_it() -> None:
    audio, truth = continuous_speech(65)
    engine = OracleEngine(truth)
    transcribe(engine, audio, no_vad(initial_prompt="Glossary: w0."))
    prompts = [r.prompt.split() for r in engine.requests]
    assert prompts[0] == ["Glossary:", "w0."]
    # then the glossary and every word transcribed so far
    said = ["Glossary:", "w0."] + [w.text for w in truth]
    assert len(prompts) == 3 and 2 < len(prompts[1]) < len(prompts[2])
    assert prompts[1] == said[: len(prompts[1])] and prompts[2] == said[: len(prompts[2])]


def test_the_prompt_is_dropped_after_a_noisy_window() -> None:
    audio, truth = continuous_speech(65)
    engine = OracleEngine(truth)
    engine.temperature_for[1] = 1.0  # the second window needed a high temperature
    transcribe(engine, audio, no_vad())
    assert engine.requests[1].prompt and engine.requests[2].prompt == ""


def test_without_conditioning_windows_share_engine_calls() -> None:
    audio, truth = continuous_speech(95)
    engine = OracleEngine(truth)
    calls: list[int] = []
    original = engine.decode

    def counting(requests: Sequence[DecodeRequest]) -> list[DecodeResult]:
        calls.append(len(requests))
        return original(requests)

    engine.decode = counting  # type: ignore[method-assign]
    transcript = transcribe(engine, audio, no_vad(condition_on_previous_text=False, batch_size=3))
    assert calls == [3, 1]
    assert all(r.prompt == "" for r in engine.requests)
    assert transcript.text.split() == [w.text for w in truth]


def test_silent_windows_are_dropped() -> None:
    audio, truth = continuous_speech(40)
    engine = OracleEngine(truth)
    engine.silent_requests.add(0)
    transcript = transcribe(engine, audio, no_vad())
    first_kept = engine.requests[1].stream_offset / S
    assert transcript.text and "w0" not in transcript.text.split()
    assert transcript.segments[0].start >= first_kept


def test_progress_reaches_the_end() -> None:
    audio, truth = continuous_speech(65)
    seen: list[tuple[int, int]] = []
    transcribe(OracleEngine(truth), audio, no_vad(), progress=lambda done, total: seen.append((done, total)))
    assert len(seen) == 3 and seen[-1] == (65 * S, 65 * S)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_silence_gives_an_empty_transcript_without_decoding() -> None:
    engine = OracleEngine([])
    transcript = transcribe(engine, np.zeros(10 * S, dtype=np.float32))
    assert transcript.text == "" and transcript.segments == () and engine.requests == []
    assert transcript.language == "en"


def test_window_dataclass_reports_forced_cuts() -> None:
    assert PlannedWindow(0, 10, 0, 10).forced_cut is False
    assert PlannedWindow(0, 10, 0, 9).forced_cut is True


# --- the command ------------------------------------------------------------------------------------------------


@pytest.fixture
def streamer_cli(monkeypatch: pytest.MonkeyPatch) -> Callable[..., int]:
    """``streamer`` with only this module's command registered (other commands may not exist yet)."""
    from streamer.cli import main as cli

    monkeypatch.setattr(cli, "COMMANDS", {"transcribe": cli.COMMANDS["transcribe"]})
    return lambda *argv: cli.main([str(a) for a in argv])


@pytest.fixture
def speech_file(tmp_path: Path) -> Path:
    audio, _ = continuous_speech(3)
    path = tmp_path / "speech.wav"
    soundfile.write(path, audio, S)
    return path


@pytest.fixture
def oracle(monkeypatch: pytest.MonkeyPatch) -> OracleEngine:
    _, truth = continuous_speech(3)
    engine = OracleEngine(truth)
    monkeypatch.setattr("streamer.engine.load_engine", lambda model, options=None: engine)
    return engine


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("missing.wav", None, "no such file"),
        ("empty.wav", b"", "is empty"),
        ("corrupt.wav", b"RIFF" + bytes(range(256)) * 8, "cannot be decoded"),
        ("voice.m4a", b"\x00\x00\x00\x20ftypM4A " + bytes(100), "install ffmpeg to read it"),
    ],
)
def test_bad_files_are_one_line_errors(
    streamer_cli: Callable[..., int],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    name: str,
    content: bytes | None,
    message: str,
) -> None:
    from streamer.cli.main import EXIT_CODES
    from streamer.core.errors import AudioFileError

    monkeypatch.setattr("shutil.which", lambda *args, **kwargs: None)
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    assert streamer_cli("transcribe", path) == EXIT_CODES[AudioFileError]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("streamer: error: ") and message in err
    assert "Traceback" not in err


@pytest.mark.model
def test_unknown_model_is_a_one_line_error(
    streamer_cli: Callable[..., int], capsys: pytest.CaptureFixture[str], speech_file: Path
) -> None:
    from streamer.cli.main import EXIT_CODES
    from streamer.core.errors import ModelError

    assert streamer_cli("transcribe", "--model", "no-such-model", speech_file) == EXIT_CODES[ModelError]
    err = capsys.readouterr().err
    assert "no-such-model" in err and "Traceback" not in err and err.count("\n") == 1


@pytest.mark.usefixtures("oracle")
def test_good_files_are_transcribed_around_bad_ones(
    streamer_cli: Callable[..., int], capsys: pytest.CaptureFixture[str], speech_file: Path, tmp_path: Path
) -> None:
    status = streamer_cli("transcribe", "--format", "json", "--no-vad", speech_file, tmp_path / "gone.wav", speech_file)
    out, err = capsys.readouterr()
    assert status == 4
    lines = [json.loads(line) for line in out.splitlines()]
    assert [d["file"] for d in lines] == [str(speech_file)] * 2
    assert lines[0]["text"] == "w0 w1 w2 w3 w4 w5"
    assert {"file", "text", "language", "duration", "segments"} <= set(lines[0])
    assert lines[0]["duration"] == 3.0 and lines[0]["segments"][0]["words"] == []
    assert "gone.wav: no such file" in err and "real-time factor" in err and "Traceback" not in err


@pytest.mark.usefixtures("oracle")
def test_word_timestamps_and_output_dir(streamer_cli: Callable[..., int], speech_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert streamer_cli("transcribe", "--no-vad", "--format", "srt", "--output-dir", out, speech_file) == 0
    assert (out / "speech.srt").read_text().startswith("1\n00:00:00,050 --> 00:00:02,480\n w0"[:26])
    assert streamer_cli("transcribe", "--no-vad", "--word-timestamps", "--format", "json", "--output-dir", out,
                        speech_file) == 0  # fmt: skip
    words = json.loads((out / "speech.json").read_text())["segments"][0]["words"]
    assert words[0] == {"word": " w0", "start": 0.05, "end": 0.48, "probability": 0.9}


@pytest.mark.usefixtures("oracle")
def test_text_of_several_files_names_each(
    streamer_cli: Callable[..., int], capsys: pytest.CaptureFixture[str], speech_file: Path
) -> None:
    assert streamer_cli("transcribe", "--no-vad", speech_file, speech_file) == 0
    assert capsys.readouterr().out == f"{speech_file}\tw0 w1 w2 w3 w4 w5\n" * 2


def test_the_command_loads_the_engine_without_a_warm_up_decode(
    streamer_cli: Callable[..., int], monkeypatch: pytest.MonkeyPatch, speech_file: Path
) -> None:
    """A one-shot command: its first window warms the kernels, so a warm-up would only add a decode to its time."""
    _, truth = continuous_speech(3)
    asked: list[EngineOptions] = []

    def load(model: str, options: EngineOptions | None = None) -> OracleEngine:
        assert options is not None
        asked.append(options)
        return OracleEngine(truth)

    monkeypatch.setattr("streamer.engine.load_engine", load)
    assert streamer_cli("transcribe", "--no-vad", "--threads", "3", speech_file) == 0
    assert streamer_cli("transcribe", "--no-vad", "--no-weight-cache", speech_file) == 0
    assert [(o.warmup, o.weight_cache, o.threads) for o in asked] == [(False, True, 3), (False, False, None)]


def test_subtitles_of_several_files_need_an_output_dir(
    streamer_cli: Callable[..., int], capsys: pytest.CaptureFixture[str], speech_file: Path
) -> None:
    assert streamer_cli("transcribe", "--format", "vtt", speech_file, speech_file) == 2
    assert "--output-dir" in capsys.readouterr().err


def test_translate_needs_a_multilingual_model(oracle: OracleEngine) -> None:
    with pytest.raises(ConfigError, match="English-only"):
        transcribe(oracle, np.zeros(S, dtype=np.float32), TranscribeOptions(decode=DecodeOptions(task=Task.TRANSLATE)))


def test_progress_bar_is_forced_with_progress(
    streamer_cli: Callable[..., int],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    audio, truth = continuous_speech(40)
    path = tmp_path / "long.wav"
    soundfile.write(path, audio, S)
    monkeypatch.setattr("streamer.engine.load_engine", lambda model, options=None: OracleEngine(truth))
    assert streamer_cli("transcribe", "--no-vad", "--progress", path) == 0
    err = capsys.readouterr().err
    assert "\rlong.wav [" in err and "100%  00:40/00:40\n" in err
    assert streamer_cli("transcribe", "--no-vad", path) == 0  # stderr is not a terminal here
    assert "[" not in capsys.readouterr().err


@pytest.mark.model
@pytest.mark.skipif(not DATA.is_dir(), reason="real speech not found at ../shared/data")
def test_tiny_en_transcribes_a_long_recording_without_losing_words() -> None:
    from streamer.engine import load_engine
    from streamer.offline.audiofile import load_audio
    from streamer.offline.normalize import normalize_english, word_error_rate

    name = "librispeech_test-other_1688-142285_0000_to_0009_concat.flac"
    rows = dict(line.split("\t", 1) for line in (DATA / "longform" / "transcripts.tsv").read_text().splitlines())
    engine = load_engine("tiny.en")
    try:
        transcript = transcribe(engine, load_audio(DATA / "longform" / name).samples)
    finally:
        engine.close()
    result = word_error_rate([normalize_english(rows[name])], [normalize_english(transcript.text)])
    assert result.wer < 0.25
    assert transcript.duration > 60 and transcript.segments[-1].end <= transcript.duration
