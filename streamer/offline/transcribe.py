"""Offline transcription: a whole recording in, a timestamped transcript out (the command is
:mod:`streamer.cli.transcribe`).

The pipeline, for a file of any length:

1. :func:`find_speech` runs the voice activity detector over the recording; silence is never decoded.
2. :func:`plan_windows` packs the speech into windows of at most 30 s (the encoder's span), cutting inside pauses.
   Speech that runs on for more than a window without a pause gets a forced cut with ``overlap`` samples shared by
   both windows; each word of the overlap is kept from one window only, by where its centre falls (the middle of
   the overlap), so a word cut by a window's edge is taken whole from the other window and none is doubled.
3. :func:`transcribe` decodes the windows in order, each conditioned on the text before it (Whisper's prompt), and
   shifts the window-relative spans back onto the recording's timeline, in seconds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from streamer.core.errors import ConfigError
from streamer.core.units import N_SAMPLES, SAMPLE_RATE, samples_to_seconds
from streamer.core.vad import VadOptions, VadSpan
from streamer.engine.types import (
    DecodeOptions,
    DecodeRequest,
    DecodeResult,
    Engine,
    WordTiming,
)

__all__ = [
    "OFFLINE_ENCODER_PAD_SECONDS",
    "PlannedWindow",
    "Segment",
    "TranscribeOptions",
    "Transcript",
    "TranscriptWord",
    "check_engine_serves",
    "find_speech",
    "plan_windows",
    "quietest_point",
    "transcribe",
]

logger = logging.getLogger(__name__)

AudioArray = npt.NDArray[np.float32]
# progress(samples done, samples in total), called after each decoded batch
ProgressCallback = Callable[[int, int], None]

# quietest(lo, hi) -> the sample in [lo, hi) where a forced cut is least likely to split a word
QuietestPoint = Callable[[int, int], int]
_CUT_SEARCH = 8 * SAMPLE_RATE  # a forced cut looks this far back from the window's end for a quiet point
_QUIET_FRAME = 320  # 20 ms: shorter than the gap between most words, longer than a pitch period

# Whisper's transcribe() drops the prompt after a window that needed a temperature above this: a window decoded
# that noisily is often a repetition loop, and conditioning on it makes the next window repeat it too.
_PROMPT_RESET_TEMPERATURE = 0.5
_PROMPT_WORDS = 200  # previous-text words offered as the prompt; the engine keeps the last max_prompt_tokens

# A recording's windows are encoded over their audio and 6 s of the silence after it, not Whisper's whole 30 s
# (DecodeOptions.encoder_pad_seconds), so a short file has far fewer frames to encode. `streamer bench offline
# --isa all --set pooled` (docs/benchmarks.md, offline): WER 7.95 to 8.19 % against 8.58 to 8.67 % for the whole
# window on every x86 kernel class here, and 1.34 to 1.72 times faster-whisper int8's speed against 0.98 to 1.22.
# Streamed windows read 10 s (streamer.core.options.STREAM_ENCODER_PAD_SECONDS): cut off mid-word, they lost 1.4 WER
# points to 6 s.
OFFLINE_ENCODER_PAD_SECONDS = 6.0


@dataclass(frozen=True)
class TranscriptWord:
    word: str  # as decoded, with its leading space
    start: float  # seconds from the start of the recording
    end: float
    probability: float
    # with --diarize: who said it, an integer from 0 (streamer.offline.speakers)
    speaker: int | None = None


@dataclass(frozen=True)
class Segment:
    start: float  # seconds from the start of the recording
    end: float
    text: str  # without leading or trailing space
    words: tuple[TranscriptWord, ...]  # empty unless word timestamps were asked for
    # with --diarize: the speaker of most of its words
    speaker: int | None = None


@dataclass(frozen=True)
class Transcript:
    text: str
    language: str
    duration: float  # seconds of audio transcribed
    segments: tuple[Segment, ...]


@dataclass(frozen=True)
class TranscribeOptions:
    """How a recording is cut and decoded. Validated in :meth:`validate`."""

    # per-window decoding; its word_timestamps says whether words appear in the transcript
    decode: DecodeOptions = field(
        default_factory=lambda: DecodeOptions(word_timestamps=False, encoder_pad_seconds=OFFLINE_ENCODER_PAD_SECONDS)
    )
    # speech detection; None decodes everything, silence included
    # (generous padding: on 66 LibriSpeech utterances 200 ms pads cost 0.8 WER points against no VAD, 600 ms none)
    vad: VadOptions | None = field(
        default_factory=lambda: VadOptions(pad_before_ms=600, pad_after_ms=600, min_silence_ms=500)
    )
    # the longest window in samples (the encoder's 30 s span)
    max_window: int = N_SAMPLES
    # a window is closed at a pause only once it holds this much, so pauses don't make many tiny windows
    min_window: int = 10 * SAMPLE_RATE
    # samples shared by the two windows of a forced cut (speech without a pause); longer than the longest word
    overlap: int = 2 * SAMPLE_RATE
    # condition each window on the text before it; off lets windows be decoded in parallel batches
    condition_on_previous_text: bool = True
    # text to condition the first window on (names, spelling, style)
    initial_prompt: str = ""
    # windows per engine call when not conditioning on previous text
    batch_size: int = 8

    def validate(self) -> None:
        """Raise :class:`~streamer.core.errors.ConfigError` naming the first invalid field."""
        self.decode.validate()
        if self.vad is not None:
            self.vad.validate()
        if not SAMPLE_RATE <= self.max_window <= N_SAMPLES:
            raise ConfigError(f"max_window must be between 1 s and 30 s ({SAMPLE_RATE} to {N_SAMPLES} samples)")
        if not 0 <= self.min_window <= self.max_window:
            raise ConfigError("min_window must be between 0 and max_window")
        if not 0 < self.overlap <= self.max_window // 4:
            raise ConfigError("overlap must be positive and at most a quarter of max_window")
        if self.batch_size < 1:
            raise ConfigError("batch_size must be >= 1")


@dataclass(frozen=True)
class PlannedWindow:
    """``[start, end)`` of the recording to decode; words centred outside ``[keep_from, keep_until)`` are dropped.

    ``keep_from`` and ``keep_until`` differ from ``start`` and ``end`` only at a forced cut, where they mark the
    middle of the overlap shared with the neighbouring window.
    """

    start: int
    end: int
    keep_from: int
    keep_until: int

    @property
    def forced_cut(self) -> bool:
        return self.keep_from > self.start or self.keep_until < self.end


def find_speech(samples: AudioArray, options: VadOptions | None) -> list[VadSpan]:
    """The speech spans of a whole recording, merged where adjacent; all of it when ``options`` is None."""
    if options is None:
        return [VadSpan(0, len(samples), True)] if len(samples) else []
    from streamer.core.vad import VoiceActivityDetector, make_classifier
    from streamer.engine.silero_vad import CLASSIFIERS

    detector = VoiceActivityDetector(options, make_classifier(options, CLASSIFIERS))
    events = detector.process(samples) + detector.flush()
    spans: list[VadSpan] = []
    for event in events:
        if not isinstance(event, VadSpan) or not event.speech or event.end <= event.start:
            continue
        if spans and spans[-1].end == event.start:
            spans[-1] = VadSpan(spans[-1].start, event.end, True)
        else:
            spans.append(event)
    return spans


def plan_windows(
    speech: Sequence[VadSpan], options: TranscribeOptions, *, quietest: QuietestPoint | None = None
) -> list[PlannedWindow]:
    """Pack ``speech`` spans (in order, not overlapping) into windows of at most ``options.max_window`` samples.

    A window grows span by span while it fits; it is closed in the pause before the first span that does not fit,
    or before any pause once it holds ``min_window``. A span longer than a window gets a forced cut: at
    ``quietest(lo, hi)`` (the likeliest gap between two words) when given, else as late as the window allows; the
    two windows around it share ``overlap`` samples and split them at the cut.
    """
    windows: list[PlannedWindow] = []
    longest, half = options.max_window, options.overlap // 2
    current: PlannedWindow | None = None
    for span in speech:
        if current is not None:
            fits = span.end - current.start <= longest
            if fits and current.end - current.start < options.min_window:
                current = replace(current, end=span.end, keep_until=span.end)
                continue
            windows.append(current)
        start, keep_from = span.start, span.start
        while span.end - start > longest:
            latest = start + longest - half
            earliest = max(keep_from + half, latest - _CUT_SEARCH)
            cut = quietest(earliest, latest) if quietest is not None else latest
            windows.append(PlannedWindow(start, cut + half, keep_from, cut))
            start, keep_from = cut - half, cut
        current = PlannedWindow(start, span.end, keep_from, span.end)
    if current is not None:
        windows.append(current)
    return windows


def quietest_point(samples: AudioArray) -> QuietestPoint:
    """A :data:`QuietestPoint` over ``samples``: the middle of the lowest-energy 20 ms frame in ``[lo, hi)``."""

    def quietest(lo: int, hi: int) -> int:
        frames = (hi - lo) // _QUIET_FRAME
        if frames < 1:
            return hi
        region = samples[lo : lo + frames * _QUIET_FRAME].astype(np.float64).reshape(frames, _QUIET_FRAME)
        energy = np.square(region).mean(axis=1)
        return lo + int(np.argmin(energy)) * _QUIET_FRAME + _QUIET_FRAME // 2

    return quietest


def _words_in_window(result: DecodeResult, window: PlannedWindow) -> list[tuple[str, int, int, tuple[WordTiming, ...]]]:
    """``(raw text, start, end, words)`` per kept segment, in absolute samples; overlap words dropped."""
    offset = window.start

    def absolute(position: int) -> int:
        return min(max(offset + position, window.start), window.end)

    def kept(start: int, end: int) -> bool:
        centre = (absolute(start) + absolute(end)) / 2
        return window.keep_from <= centre < window.keep_until

    pieces = []
    for segment in result.segments:
        words = tuple(
            replace(w, start=absolute(w.start), end=absolute(w.end))
            for w in segment.words
            if not window.forced_cut or kept(w.start, w.end)
        )
        if window.forced_cut and segment.words:
            # rebuild the segment from the words that are this window's to keep
            if not words:
                continue
            pieces.append(("".join(w.word for w in words), words[0].start, words[-1].end, words))
        elif not window.forced_cut or kept(segment.start, segment.end):
            pieces.append((segment.text, absolute(segment.start), absolute(segment.end), words))
    return pieces


def _silent(result: DecodeResult, options: DecodeOptions) -> bool:
    # Whisper's rule: a window is silence when the model says so *and* is unsure of the text it produced.
    if options.no_speech_threshold is None or result.no_speech_prob <= options.no_speech_threshold:
        return False
    return options.logprob_threshold is None or result.avg_logprob < options.logprob_threshold


def _tail(text: str, words: int) -> str:
    return " ".join(text.split()[-words:])


def check_engine_serves(engine: Engine, options: DecodeOptions) -> None:
    """Raise :class:`~streamer.core.errors.ConfigError` when ``engine``'s model cannot serve ``options`` (translation
    or another language on an English-only model), before any audio is decoded."""
    from streamer.engine.types import Task

    if engine.info.multilingual:
        return
    if options.task is Task.TRANSLATE:
        raise ConfigError(f"--task translate needs a multilingual model; {engine.info.model} is English-only")
    if options.language not in (None, "en"):
        raise ConfigError(f"--language {options.language}: {engine.info.model} is English-only")


def transcribe(
    engine: Engine,
    audio: AudioArray,
    options: TranscribeOptions | None = None,
    *,
    progress: ProgressCallback | None = None,
) -> Transcript:
    """Transcribe a whole recording (float32 mono at 16 kHz); blocks until done. Call from a worker thread.

    ``progress`` is called after each engine call with the samples done so far and the total.
    """
    options = options or TranscribeOptions()
    options.validate()
    check_engine_serves(engine, options.decode)
    samples = np.ascontiguousarray(audio, dtype=np.float32).reshape(-1)
    windows = plan_windows(find_speech(samples, options.vad), options, quietest=quietest_point(samples))
    decode = options.decode
    language = decode.language or (None if engine.info.multilingual else "en")
    # Sequential when each window's prompt is the text before it; else independent windows share engine calls.
    batch = 1 if options.condition_on_previous_text else options.batch_size
    text_so_far = options.initial_prompt
    pieces: list[tuple[str, int, int, tuple[WordTiming, ...]]] = []
    for first in range(0, len(windows), batch):
        chunk = windows[first : first + batch]
        requests = [
            DecodeRequest(
                audio=samples[w.start : w.end],
                # a forced cut needs word timings to know which words are whose
                options=replace(decode, language=language, word_timestamps=decode.word_timestamps or w.forced_cut),
                prompt=_tail(text_so_far, _PROMPT_WORDS) if options.condition_on_previous_text else "",
                stream_offset=w.start,
                request_id=first + i,
            )
            for i, w in enumerate(chunk)
        ]
        for window, result in zip(chunk, engine.decode(requests), strict=True):
            # the first window's detected language holds for the rest (Whisper detects once per file)
            language = language or result.language
            if _silent(result, decode):
                continue
            kept = _words_in_window(result, window)
            pieces.extend(kept)
            text = "".join(raw for raw, *_ in kept)
            reset = result.temperature > _PROMPT_RESET_TEMPERATURE
            text_so_far = "" if reset else text_so_far + text
        if progress is not None:
            progress(chunk[-1].end, len(samples))
    if progress is not None and not windows:
        progress(len(samples), len(samples))
    segments = tuple(
        Segment(
            start=samples_to_seconds(start),
            end=samples_to_seconds(end),
            text=raw.strip(),
            words=tuple(
                TranscriptWord(w.word, samples_to_seconds(w.start), samples_to_seconds(w.end), w.probability)
                for w in words
            )
            if decode.word_timestamps
            else (),
        )
        for raw, start, end, words in pieces
        if raw.strip()
    )
    return Transcript(
        text="".join(raw for raw, *_ in pieces).strip(),
        language=language or "en",
        duration=samples_to_seconds(len(samples)),
        segments=segments,
    )
