"""A scripted engine for fast tests and load tests: no model, no torch.

:class:`ScriptedEngine` knows what was "said" and when (words with absolute stream samples) and answers each
request with the words that lie wholly inside its window, window-relative, as the real engine would. Misbehaviour
is configured in :class:`FakeBehaviour`, so tests can drive every path of the core and the server.

``streamer serve --engine scripted`` serves :func:`scripted_engine`: :class:`SteadyScript` (a word every 0.35 s of
any audio, so every stream gets partials and finals) at a decode cost the operator sets (:class:`ScriptedCost`), to
measure the host's own work per stream, or a proxy's and an autoscaler's, without a model (issue 37).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from streamer.core.errors import ConfigError
from streamer.core.events import Word
from streamer.core.units import SAMPLE_RATE
from streamer.engine.types import (
    DecodeRequest,
    DecodeResult,
    EngineInfo,
    SegmentResult,
    StreamId,
    WordTiming,
)

__all__ = [
    "STEADY_WORDS",
    "FakeBehaviour",
    "FakeEngineError",
    "Script",
    "ScriptedCost",
    "ScriptedEngine",
    "SteadyScript",
    "scripted_engine",
    "words_from_text",
]

Script = Mapping[StreamId | None, Sequence[Word]] | Sequence[Word] | Callable[[DecodeRequest], Sequence[Word]]
"""Per stream id (None for requests without one), one word list for every stream, or a function of the request
returning absolute-time words."""


class FakeEngineError(RuntimeError):
    """Raised by :meth:`ScriptedEngine.decode` on the calls listed in :attr:`FakeBehaviour.fail_calls`."""


@dataclass(frozen=True)
class FakeBehaviour:
    """How the fake misbehaves. Call numbers count :meth:`ScriptedEngine.decode` calls from 1."""

    # the last word of every result gets a different text on each call (a never-agreeing unstable tail)
    unstable_last_word: bool = False
    # these calls return silence-like results (no words, no_speech_prob 0.9, avg_logprob -1.5)
    no_speech_calls: frozenset[int] = frozenset()
    # every call returns no-speech results
    always_no_speech: bool = False
    # these calls (or every call) append "thank you" eight times to the words (a hallucination loop)
    loop_calls: frozenset[int] = frozenset()
    always_loop: bool = False
    # these calls raise FakeEngineError
    fail_calls: frozenset[int] = frozenset()
    # a call holding a window in one of these languages raises FakeEngineError, whatever the engine's info says (a
    # model that fails on a language it claims; a language outside ``info.languages`` always raises, as in the real
    # engine)
    fail_languages: frozenset[str] = frozenset()
    # seconds slept per second of request audio (0.1 = ten times faster than real time); batched requests add up
    real_time_factor: float = 0.0
    # seconds slept per window of a call, and once per call whatever its size (a batched model's fixed cost); they add
    # to real_time_factor's sleep: one call of n windows sleeps batch_seconds + n * window_seconds + rtf * audio
    window_seconds: float = 0.0
    batch_seconds: float = 0.0
    # the language "detected" in a window whose request fixes none (None: "en"); a request that names one is
    # answered in it, as the real engine does
    detect_language: Callable[[DecodeRequest], str] | None = None


def words_from_text(text: str, start: int, word_samples: int, gap_samples: int = 0) -> list[Word]:
    """Evenly spaced words for a script: each ``word_samples`` long, ``gap_samples`` apart, from ``start``."""
    words = []
    t = start
    for token in text.split():
        words.append(Word(token, t, t + word_samples, 0.9))
        t += word_samples + gap_samples
    return words


# Words of the steady script: a word's text is STEADY_WORDS[k % len(STEADY_WORDS)] for the k-th word of the stream
STEADY_WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet")
# one word every 0.35 s, 0.25 s long: about the pace of read speech (LibriSpeech averages 2.7 words a second)
STEADY_PERIOD = 35 * SAMPLE_RATE // 100  # 5600 samples: 0.35 s
STEADY_LENGTH = SAMPLE_RATE // 4  # 4000 samples: 0.25 s


@dataclass(frozen=True)
class SteadyScript:
    """A script for any audio: word k of every stream spans samples ``[k * period, k * period + length)`` of absolute
    stream time, whatever was said there, so any window with speech gets words back, successive windows agree on
    them (they are fixed in stream time) and finals flow. Pass it as :class:`ScriptedEngine`'s script."""

    period: int = STEADY_PERIOD  # samples from one word's start to the next's
    length: int = STEADY_LENGTH  # samples of each word; at most the period

    def __call__(self, request: DecodeRequest) -> list[Word]:
        lo, hi = request.stream_offset, request.stream_offset + len(request.audio)
        first = -(-lo // self.period)  # the first word starting at or after the window's start
        last = (hi - self.length) // self.period  # the last word ending at or before its end
        return [
            Word(STEADY_WORDS[k % len(STEADY_WORDS)], k * self.period, k * self.period + self.length, 0.9)
            for k in range(first, last + 1)
        ]


@dataclass(frozen=True)
class ScriptedCost:
    """The wall time a call of :func:`scripted_engine` takes: ``batch_ms + windows * window_ms``; the engine sleeps
    it (no CPU), on the engine's thread, as a model on an accelerator would keep that thread waiting."""

    window_ms: float = 0.0  # per window in the call
    batch_ms: float = 0.0  # per call, whatever its size

    def validate(self) -> None:
        """Raise :class:`~streamer.core.errors.ConfigError` naming the first bad field."""
        for name, value in (("window_ms", self.window_ms), ("batch_ms", self.batch_ms)):
            if not 0 <= value <= 60_000:  # NaN fails too
                raise ConfigError(f"{name} must be between 0 and 60000 ms, not {value!r}")


def scripted_engine(cost: ScriptedCost, sleep: Callable[[float], None] = time.sleep) -> ScriptedEngine:
    """The engine of ``streamer serve --engine scripted``: :class:`SteadyScript` at ``cost``; ``info.model`` is
    ``"scripted"``."""
    cost.validate()
    behaviour = FakeBehaviour(window_seconds=cost.window_ms / 1000, batch_seconds=cost.batch_ms / 1000)
    return ScriptedEngine(SteadyScript(), behaviour, sleep=sleep)


def synthetic_voice(n: int, seed: int = 0) -> npt.NDArray[np.float32]:
    """``n`` samples that the VAD takes for speech: a gliding 120 Hz harmonic complex with 4 Hz syllabic rhythm."""
    t = np.arange(n) / 16000
    phase = 2 * np.pi * np.cumsum(120 + 20 * np.sin(2 * np.pi * 0.7 * t)) / 16000
    harmonics = sum(np.sin(k * phase) / k for k in range(1, 30))
    rhythm = 0.55 + 0.45 * np.sin(2 * np.pi * 4 * t)
    noise = np.random.default_rng(seed).standard_normal(n)
    return np.asarray(0.2 * harmonics * rhythm + 0.002 * noise, dtype=np.float32)


def synthetic_silence(n: int, seed: int = 1) -> npt.NDArray[np.float32]:
    """``n`` samples of faint noise (-66 dBFS) that the VAD takes for non-speech."""
    return np.asarray(0.0005 * np.random.default_rng(seed).standard_normal(n), dtype=np.float32)


class ScriptedEngine:
    """Implements :class:`~streamer.engine.types.Engine` from a script. Thread-safe counters."""

    def __init__(
        self,
        script: Script,
        behaviour: FakeBehaviour | None = None,
        info: EngineInfo | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._script = script
        self._sleep = sleep  # how the decode cost of the behaviour is spent; tests pass a recorder
        self.behaviour = behaviour or FakeBehaviour()
        # what the fake reports about its "model": English-only by default, like tiny.en
        self._info = info or EngineInfo(model="scripted", multilingual=False, encoder="fake", decoder="fake")
        self._lock = threading.Lock()
        self.calls = 0  # decode() invocations
        self.requests = 0  # requests decoded
        self.samples_decoded = 0  # audio samples across all requests
        self.forgotten: list[StreamId] = []
        self.closed = False

    @property
    def info(self) -> EngineInfo:
        return self._info

    def decode(self, requests: Sequence[DecodeRequest]) -> list[DecodeResult]:
        with self._lock:
            self.calls += 1
            call = self.calls
            self.requests += len(requests)
            self.samples_decoded += sum(len(r.audio) for r in requests)
        b = self.behaviour
        audio_seconds = sum(len(r.audio) for r in requests) / SAMPLE_RATE
        cost = b.batch_seconds + b.window_seconds * len(requests) + b.real_time_factor * audio_seconds
        if cost > 0:
            self._sleep(cost)
        if call in b.fail_calls:
            raise FakeEngineError(f"scripted failure on call {call}")
        for request in requests:
            # like the real engine, one window it cannot decode fails the whole batch
            language = request.options.language
            if language is not None and (language in b.fail_languages or language not in self._info.languages):
                raise FakeEngineError(f"scripted failure: {self._info.model} cannot decode language {language!r}")
        return [self._decode_one(r, call) for r in requests]

    def forget_stream(self, stream_id: StreamId) -> None:
        self.forgotten.append(stream_id)

    def close(self) -> None:
        self.closed = True

    def _script_words(self, request: DecodeRequest) -> Sequence[Word]:
        if callable(self._script):
            return self._script(request)
        if isinstance(self._script, Mapping):
            return self._script.get(request.stream_id, ())
        return self._script

    def _language(self, request: DecodeRequest) -> str:
        detect = self.behaviour.detect_language
        return request.options.language or (detect(request) if detect is not None else "en")

    def _decode_one(self, request: DecodeRequest, call: int) -> DecodeResult:
        b = self.behaviour
        language = self._language(request)
        if b.always_no_speech or call in b.no_speech_calls:
            return DecodeResult(request.request_id, "", language, (), -1.5, 0.9, 1.0, 0.0)
        lo, hi = request.stream_offset, request.stream_offset + len(request.audio)
        timings = [
            WordTiming(" " + w.text, w.start - lo, w.end - lo, w.probability)
            for w in self._script_words(request)
            if lo <= w.start and w.end <= hi
        ]
        if b.unstable_last_word and timings:
            last = timings[-1]
            timings[-1] = WordTiming(f" {last.word.strip()}~{call}", last.start, last.end, 0.3)
        if b.always_loop or call in b.loop_calls:
            t = timings[-1].end if timings else 0
            step = max(1, (len(request.audio) - t) // 17)
            n = len(request.audio)
            for i in range(16):
                text = " thank" if i % 2 == 0 else " you"
                timings.append(WordTiming(text, min(t + i * step, n), min(t + (i + 1) * step, n), 0.5))
        text = "".join(w.word for w in timings)
        segment = SegmentResult(0, len(request.audio), text, (), tuple(timings))
        segments = (segment,) if timings else ()
        passes = len(timings) + 1
        return DecodeResult(request.request_id, text, language, segments, -0.2, 0.01, 1.3, 0.0, decoder_passes=passes)
