"""Transcript events emitted by the streaming core (:mod:`streamer.core.stream`).

All times are absolute stream samples at 16 kHz (see :mod:`streamer.core.units`); the session converts them to seconds
for the wire. Accounting invariant, per stream: the spans of every :class:`Final`, :class:`NonSpeech` and
:class:`Lost` event tile ``[0, total samples received)`` exactly, with no gap and no overlap, once the stream has ended.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = [
    "CommitRoute",
    "EndReason",
    "Event",
    "Final",
    "Lost",
    "NonSpeech",
    "Partial",
    "SpeechEnded",
    "SpeechStarted",
    "Word",
]


@dataclass(frozen=True)
class Word:
    text: str  # without leading space
    start: int  # absolute stream sample
    end: int
    probability: float
    # who said it, a small integer stable for the session, when the session diarizes (streamer.core.diarization)
    speaker: int | None = None
    # how sure that is: the cosine similarity (0 to 1) of the word's windows to the speaker's voice
    speaker_confidence: float | None = None


@dataclass(frozen=True)
class SpeechStarted:
    """VAD found the start of speech at ``start``."""

    start: int


class EndReason(enum.Enum):
    """Why an utterance closed."""

    VAD = "vad"  # the end point: a pause of the VAD's minimum silence
    FINALIZE = "finalize"  # the client asked for it (``finalize``, a commit, Deepgram's ``Finalize``)
    END_OF_STREAM = "end_of_stream"  # no more audio


@dataclass(frozen=True)
class SpeechEnded:
    """The utterance that began at ``start`` closed: its speech ends at ``end``. Emitted the moment the end point is
    known, before the utterance's last final, which needs one more decode; protocols with an end-of-utterance event
    (``speech_ended``, OpenAI's ``speech_stopped``, Deepgram's ``UtteranceEnd``) send it from here."""

    start: int
    end: int
    reason: EndReason


class CommitRoute(enum.Enum):
    """How a final's words came to be committed (what ``streamer bench accuracy`` attributes each error to)."""

    AGREED = "agreed"  # the commit policy settled them while the utterance went on
    WINDOW_LIMIT = "window_limit"  # the next window had to start after them (it would have exceeded max_window_ms)
    END_POINT = "end_point"  # the window that closed the utterance
    RESUMED = "resumed"  # that window stopped early: the words before its last one, the rest decoded again


@dataclass(frozen=True)
class Partial:
    """Unstable text that may still change; replaces the previous partial of the same segment."""

    segment_id: int
    text: str
    start: int
    end: int
    words: tuple[Word, ...]
    # the stream sample whose arrival made this text possible (the end of the decoded window): latency is measured
    # from when the session received that sample to when the message is sent
    audio_end: int
    # ISO 639-1 code of the language the engine decoded the window in (given, or detected per utterance)
    language: str = ""
    # the speaker of most of its words when the session diarizes (provisional, as the text is)
    speaker: int | None = None


@dataclass(frozen=True)
class Final:
    """Committed text, never revised. ``[start, end)`` is the speech audio this final accounts for."""

    segment_id: int
    text: str
    start: int
    end: int
    words: tuple[Word, ...]
    audio_end: int
    # the language the engine decoded the text in, as on Partial
    language: str = ""
    # how its words were committed (not sent on the wire; a final rebuilt from a shared record says end_point)
    route: CommitRoute = CommitRoute.END_POINT
    # the speaker of most of its words when the session diarizes (each word carries its own)
    speaker: int | None = None


@dataclass(frozen=True)
class NonSpeech:
    """``[start, end)`` held no speech (VAD) and was never sent to the model."""

    start: int
    end: int


@dataclass(frozen=True)
class Lost:
    """``[start, end)`` was accepted but could not be transcribed (engine failure); the session reports it in an
    ``error`` message naming the range."""

    start: int
    end: int
    reason: str


Event = SpeechStarted | SpeechEnded | Partial | Final | NonSpeech | Lost
