"""What the core asks the engine to decode, and what it gets back: :class:`DecodeRequest` (a window of audio with its
:class:`DecodeOptions`) out, :class:`DecodeResult` (segments of timed words) in.

The core makes the requests (:meth:`streamer.core.stream.StreamCore.windows_to_decode`) and reads the results
(:meth:`~streamer.core.stream.StreamCore.receive_decode_result`); an engine (:class:`streamer.engine.types.Engine`,
which re-exports everything here) runs them. They live in the core because the core is the lower layer: it must
not import the engine (issue 38). Plain records and bounds only: no model, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import NewType

import numpy as np
import numpy.typing as npt

from streamer.core.errors import ConfigError

__all__ = [
    "KEYWORD_BONUS",
    "MAX_INITIAL_PROMPT_CHARS",
    "MAX_KEYWORDS",
    "MAX_KEYWORD_BONUS",
    "MAX_KEYWORD_CHARS",
    "MIN_ENCODER_PAD_SECONDS",
    "AudioArray",
    "DecodeOptions",
    "DecodeRequest",
    "DecodeResult",
    "SegmentResult",
    "StageTimings",
    "StreamId",
    "Task",
    "WordTiming",
]

StreamId = NewType("StreamId", str)

AudioArray = npt.NDArray[np.float32]


class Task(StrEnum):
    TRANSCRIBE = "transcribe"
    TRANSLATE = "translate"


# bounds on what a session may ask the decoder to favour: the prompt shares the model's 448-token context with the
# committed text and the output (about 4 characters a token), and each keyword costs work in every greedy step
MAX_INITIAL_PROMPT_CHARS = 800
MAX_KEYWORDS = 100
MAX_KEYWORD_CHARS = 50
# the default DecodeOptions.keyword_bonus, in logits (natural-log odds). Measured by ``streamer bench keywords``
# (docs/benchmarks.md) with tiny.en on 20 LibriSpeech utterances: the glossary alone raised rare-word recall from 33 %
# to 90 %, a bonus of 1.5 to 92 %, 3 to 95 % with the lowest WER (14.6 % without keywords, 8.4 %), no distractor
# written and no more words on noise; 6 gained no recall, doubled the WER and wrote distractors and words on noise
KEYWORD_BONUS = 3.0
# the largest keyword_bonus accepted: past it a keyword's first token beats nearly any other
MAX_KEYWORD_BONUS = 10.0
# the least silence DecodeOptions.encoder_pad_seconds may give the encoder after a window's audio: with less, the
# model does not see the speech end and writes on past it (see streamer.engine.features.encoder_frames)
MIN_ENCODER_PAD_SECONDS = 3.0


@dataclass(frozen=True)
class DecodeOptions:
    """How to decode one window. Validated in :meth:`validate`, the one place options are checked."""

    # ISO 639-1 code; None detects the language (multilingual models) or means "en" (English-only models)
    language: str | None = None
    # transcribe, or translate into English (multilingual models only)
    task: Task = Task.TRANSCRIBE
    # temperature fallback schedule: the first is tried first, the next only when a quality check fails
    temperatures: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    # 1 is greedy; more is beam search at temperature 0
    beam_size: int = 1
    # candidates sampled at a temperature above 0, the best kept
    best_of: int = 5
    # fall back to the next temperature when gzip compression ratio of the text exceeds this (a loop)
    compression_ratio_threshold: float | None = 2.4
    # fall back when the average log-probability of the sampled tokens is below this
    logprob_threshold: float | None = -1.0
    # treat the window as silent when no-speech probability is above this and avg log-prob below logprob_threshold
    no_speech_threshold: float | None = 0.6
    # compute per-word timestamps from the cross-attention alignment heads (DTW)
    word_timestamps: bool = True
    # decode without timestamp tokens (one segment per window)
    without_timestamps: bool = False
    # the first timestamp may be at most this many seconds into the window
    max_initial_timestamp: float = 1.0
    # suppress blank and end-of-text as the first sampled token
    suppress_blank: bool = True
    # at most this many previous-text tokens go in the prompt (the model's context is 448, half for the prompt)
    max_prompt_tokens: int = 223
    # stop decoding after this many new tokens
    max_new_tokens: int = 224
    # also stop after 16 + this many tokens per second of window audio (speech runs at 3 to 8 tokens a second; a
    # window that goes on is caught in a loop); None: max_new_tokens only
    max_tokens_per_second: float | None = None
    # greedy and sampled decoding stop once a run of up to 16 text tokens repeats this many times in a row (a loop,
    # which the streaming guards cut at its first occurrence anyway); None decodes on
    stop_on_repeats: int | None = None
    # the encoder reads the window's audio and this many seconds of the silence after it (rounded up to whole
    # seconds) instead of Whisper's whole 30 s: a 5 s window with 6 s is 11 s of frames to encode and to attend
    # to across the decoder. On the CPU each window of a batch is encoded over its own span (the decoder masks the
    # shorter ones' padding), so a window reads the same whatever it is batched with; a GPU encodes a batch over its
    # longest. None: 30 s, as the model was trained. Offline transcription asks for 6 s, streamed windows for 10 s
    # (see streamer.engine.features.encoder_frames and docs/benchmarks.md, encoder span)
    encoder_pad_seconds: float | None = None
    # the session's own prompt (a domain, names, a spelling style), placed before the committed text in every
    # window's prompt, as whisper's initial_prompt; at most MAX_INITIAL_PROMPT_CHARS
    initial_prompt: str = ""
    # words and names whose spelling decoding should favour (Deepgram's keyterm, OpenAI's keywords); at most
    # MAX_KEYWORDS of at most MAX_KEYWORD_CHARS each
    keywords: tuple[str, ...] = ()
    # added to the logit of each keyword's next token in every greedy, sampling or beam step: its first token
    # anywhere, its following ones once the text ends with its start (see streamer.engine.filters). The keywords
    # are in the prompt as a glossary too; the default is measured by ``streamer bench keywords``
    # (docs/benchmarks.md); 0 leaves them to the prompt alone
    keyword_bonus: float = KEYWORD_BONUS

    def validate(self) -> None:
        """Raise :class:`~streamer.core.errors.ConfigError` naming the first invalid field."""
        if not self.temperatures or any(t < 0 for t in self.temperatures):
            raise ConfigError("temperatures must be a non-empty list of numbers >= 0")
        if self.beam_size < 1:
            raise ConfigError("beam_size must be >= 1")
        if self.best_of < 1:
            raise ConfigError("best_of must be >= 1")
        if not 0 <= self.max_prompt_tokens <= 223:
            raise ConfigError("max_prompt_tokens must be between 0 and 223")
        if not 1 <= self.max_new_tokens <= 224:
            raise ConfigError("max_new_tokens must be between 1 and 224")
        if self.max_tokens_per_second is not None and self.max_tokens_per_second <= 0:
            raise ConfigError("max_tokens_per_second must be > 0")
        if self.stop_on_repeats is not None and self.stop_on_repeats < 2:
            raise ConfigError("stop_on_repeats must be >= 2")
        if self.encoder_pad_seconds is not None and not MIN_ENCODER_PAD_SECONDS <= self.encoder_pad_seconds <= 30:
            raise ConfigError(f"encoder_pad_seconds must be between {MIN_ENCODER_PAD_SECONDS:g} and 30 (or None)")
        if len(self.initial_prompt) > MAX_INITIAL_PROMPT_CHARS:
            raise ConfigError(f"initial_prompt must be at most {MAX_INITIAL_PROMPT_CHARS} characters")
        if len(self.keywords) > MAX_KEYWORDS:
            raise ConfigError(f"keywords: at most {MAX_KEYWORDS}")
        if any(not k.strip() or len(k) > MAX_KEYWORD_CHARS for k in self.keywords):
            raise ConfigError(f"keywords must be non-empty and at most {MAX_KEYWORD_CHARS} characters each")
        if not 0 <= self.keyword_bonus <= MAX_KEYWORD_BONUS:
            raise ConfigError(f"keyword_bonus must be between 0 and {MAX_KEYWORD_BONUS:g}")
        if self.language is not None and not (2 <= len(self.language) <= 3 and self.language.isalpha()):
            raise ConfigError(f"language must be an ISO 639-1 code such as 'en', not {self.language!r}")


@dataclass(frozen=True)
class DecodeRequest:
    """One window of audio to transcribe."""

    # float32 mono samples at 16 kHz, at most 30 s (N_SAMPLES); shorter windows are padded by the engine
    audio: AudioArray
    options: DecodeOptions = field(default_factory=DecodeOptions)
    # previous text the model is conditioned on (whisper's "prompt"); empty for none
    prompt: str = ""
    # the stream this window belongs to; the engine may keep per-stream state (draft tokens, caches) keyed by it
    stream_id: StreamId | None = None
    # absolute stream sample of audio[0]; informational for the engine (logs, fakes), results stay window-relative
    stream_offset: int = 0
    # caller's id to match results to requests
    request_id: int = 0


@dataclass(frozen=True)
class WordTiming:
    """A word with its span in samples, relative to the start of the request's audio."""

    word: str  # as decoded, with its leading space
    start: int
    end: int
    probability: float


@dataclass(frozen=True)
class SegmentResult:
    """One timestamped segment of a window; spans in samples relative to the window start."""

    start: int
    end: int
    text: str
    tokens: tuple[int, ...]
    words: tuple[WordTiming, ...]


@dataclass(frozen=True)
class StageTimings:
    """Seconds of wall time spent per stage for one request (batch stages shared out evenly)."""

    features: float = 0.0
    encoder: float = 0.0
    decoder: float = 0.0


@dataclass(frozen=True)
class DecodeResult:
    """The engine's answer to one :class:`DecodeRequest`."""

    request_id: int
    text: str
    language: str
    segments: tuple[SegmentResult, ...]
    avg_logprob: float
    no_speech_prob: float
    compression_ratio: float
    temperature: float
    # number of batched decoder forward passes spent on this request (a draft verified in one pass counts as one)
    decoder_passes: int = 0
    timings: StageTimings = field(default_factory=StageTimings)

    @property
    def words(self) -> tuple[WordTiming, ...]:
        return tuple(w for s in self.segments for w in s.words)

    @property
    def tokens(self) -> tuple[int, ...]:
        return tuple(t for s in self.segments for t in s.tokens)
