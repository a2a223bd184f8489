"""Protocol v1 of ``/v1/listen``, server to client: every JSON text frame the server sends, as a typed dataclass, with
its serializer and parser. Times are seconds of stream time (16 kHz samples / 16000) from the stream start.

In order: :class:`Ready`, then any number of :class:`SpeechStartedMessage`, :class:`SpeechEndedMessage`,
:class:`PartialMessage`, :class:`FinalMessage` and :class:`ErrorMessage`, and last :class:`Done` (on a clean end) or
an :class:`ErrorMessage` followed by an error close.

Sans-I/O: the session (:mod:`streamer.server.session`) sends what :func:`serialize` returns; the client
(:mod:`streamer.client`) reads it back with :func:`parse_server_message`. What the client sends is in
:mod:`streamer.server.listen_query` (the handshake's query string) and :mod:`streamer.server.client_messages`; the
full description, with examples, is ``docs/protocol.md``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from streamer.core.errors import MalformedMessage
from streamer.server.bounded_json import parse_json_object

__all__ = [
    "PROTOCOL_VERSION",
    "Done",
    "ErrorMessage",
    "FinalMessage",
    "LatencySummary",
    "LostRange",
    "PartialMessage",
    "Percentiles",
    "Ready",
    "ResumeHint",
    "ServerMessage",
    "SpeakerTalk",
    "SpeechEndedMessage",
    "SpeechStartedMessage",
    "WordMessage",
    "parse_server_message",
    "serialize",
]

PROTOCOL_VERSION = "v1"


@dataclass(frozen=True)
class WordMessage:
    word: str
    start: float
    end: float
    probability: float
    # when the session diarizes (diarize=true): who said it, an integer from 0 stable for the session's channel
    speaker: int | None = None


@dataclass(frozen=True)
class Ready:
    """First message of a session: the handshake was accepted and audio may flow."""

    session_id: str
    model: str
    sample_rate: int
    encoding: str
    channels: int
    # true on a connection that resumed an earlier one's session (?resume=...); its finals continue the seq
    resumed: bool = False
    # seconds of the client's audio (per channel) the session has accepted: a resuming client sends from there
    audio_seconds_received: float = 0.0
    # where the client sends its audio from, in seconds of its stream (per channel): a frame index is
    # round(resume_from * sample_rate). 0 on a new session; on a resumed one the same as audio_seconds_received
    # (the replica that holds the session has everything before it; one that took the session over from its
    # record in Redis asks for the open utterance's context too, up to 30 s before everything its record accounts
    # for, and no earlier than the client's resend_from: see docs/protocol.md, Resume)
    resume_from: float = 0.0
    protocol: str = PROTOCOL_VERSION
    type: str = "ready"


@dataclass(frozen=True)
class SpeechStartedMessage:
    """The voice activity detector found speech starting at ``start``."""

    channel: int
    start: float
    type: str = "speech_started"


@dataclass(frozen=True)
class SpeechEndedMessage:
    """The utterance that began at ``start`` ended at ``end``: sent the moment the end point is known, before the
    utterance's last final (which takes one more decode)."""

    channel: int
    start: float
    end: float
    # why: "vad" (a pause, the end point), "finalize" (the client's finalize), "end_of_stream" (no more audio)
    reason: str
    type: str = "speech_ended"


@dataclass(frozen=True)
class PartialMessage:
    """Unstable text of segment ``segment_id``; the next partial or final of the same segment replaces it."""

    channel: int
    segment_id: int
    text: str
    start: float
    end: float
    words: tuple[WordMessage, ...]
    # milliseconds from the arrival of the audio this text needed to the moment the message was sent
    latency_ms: float
    # ISO 639-1 code of the language the text was decoded in (given in the query, or detected per utterance)
    language: str = ""
    # when the session diarizes: the speaker of most of its words (provisional, as the text is)
    speaker: int | None = None
    type: str = "partial"


@dataclass(frozen=True)
class FinalMessage:
    """Committed text of segment ``segment_id``, never revised."""

    channel: int
    segment_id: int
    text: str
    start: float
    end: float
    words: tuple[WordMessage, ...]
    latency_ms: float
    # 1, 2, 3, ... per session, across resumed connections: a resuming client sends the last one it received
    seq: int = 0
    # ISO 639-1 code of the language the text was decoded in
    language: str = ""
    # when the session diarizes: the speaker of most of its words (each word carries its own)
    speaker: int | None = None
    type: str = "final"


@dataclass(frozen=True)
class LostRange:
    """Stream-time seconds of accepted audio that will never be transcribed."""

    start: float
    end: float


@dataclass(frozen=True)
class ResumeHint:
    """Where a session stood when the server closed it: its id and the seq of the last final sent."""

    session_id: str
    last_seq: int


@dataclass(frozen=True)
class ErrorMessage:
    """Something went wrong. ``code`` is one of :mod:`streamer.core.errors`' wire codes. Sent before every error close;
    also sent without a close when an engine failure cost one window (``lost`` names it, ``channel`` too)."""

    code: str
    message: str
    lost: LostRange | None = None
    channel: int | None = None
    # on shutting_down: the session and its last final's seq, so the client knows which finals it has
    resume: ResumeHint | None = None
    type: str = "error"


@dataclass(frozen=True)
class Percentiles:
    p50: float | None  # milliseconds; None when there was nothing to measure
    p95: float | None


@dataclass(frozen=True)
class LatencySummary:
    partial: Percentiles
    final: Percentiles


@dataclass(frozen=True)
class SpeakerTalk:
    """One speaker of a diarized channel in ``done``: its words' summed durations."""

    channel: int
    speaker: int
    talk_seconds: float


@dataclass(frozen=True)
class Done:
    """Last message before a normal close (1000). Seconds are summed over channels, so that
    ``audio_seconds_transcribed + non_speech_seconds + lost_seconds == audio_seconds_received``."""

    audio_seconds_received: float
    audio_seconds_transcribed: float
    non_speech_seconds: float
    lost_seconds: float
    latency: LatencySummary
    # when the session diarizes: each channel's speakers and how long each talked
    speakers: tuple[SpeakerTalk, ...] | None = None
    type: str = "done"


ServerMessage = Ready | SpeechStartedMessage | SpeechEndedMessage | PartialMessage | FinalMessage | ErrorMessage | Done


# fields left out of a message while they are None: a session without diarization reads as before it existed
_OMITTED_WHEN_NONE = frozenset({"speaker", "speakers"})


def _to_json(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_to_json(v) for v in value]
    if hasattr(value, "__dataclass_fields__"):
        return {
            name: _to_json(getattr(value, name))
            for name in value.__dataclass_fields__
            if not (name in _OMITTED_WHEN_NONE and getattr(value, name) is None)
        }
    return value


def serialize(message: ServerMessage) -> str:
    """The text frame for a server message. Optional fields that are ``None`` are left out."""
    data = _to_json(message)
    if isinstance(message, ErrorMessage):
        data = {k: v for k, v in data.items() if v is not None}
    return json.dumps(data, separators=(",", ":"))


def _words(items: Any) -> tuple[WordMessage, ...]:
    return tuple(WordMessage(**item) for item in items)


def _percentiles(data: Mapping[str, Any]) -> Percentiles:
    return Percentiles(p50=data["p50"], p95=data["p95"])


def _fields(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k != "type"}


def parse_server_message(text: str) -> ServerMessage:
    """Parse a text frame from the server (the client side of :func:`serialize`). Raises
    :class:`~streamer.core.errors.MalformedMessage` for a frame that is not a v1 server message."""
    data = parse_json_object(text, "server messages")  # a server is a peer too: bounded like a client
    try:
        kind = data["type"]
        fields = _fields(data)
        if kind == "ready":
            return Ready(**fields)
        if kind == "speech_started":
            return SpeechStartedMessage(**fields)
        if kind == "speech_ended":
            return SpeechEndedMessage(**fields)
        if kind in ("partial", "final"):
            fields["words"] = _words(fields["words"])
            return PartialMessage(**fields) if kind == "partial" else FinalMessage(**fields)
        if kind == "error":
            lost = fields.get("lost")
            fields["lost"] = None if lost is None else LostRange(**lost)
            resume = fields.get("resume")
            fields["resume"] = None if resume is None else ResumeHint(**resume)
            return ErrorMessage(**fields)
        if kind == "done":
            latency = fields["latency"]
            fields["latency"] = LatencySummary(_percentiles(latency["partial"]), _percentiles(latency["final"]))
            speakers = fields.get("speakers")
            fields["speakers"] = None if speakers is None else tuple(SpeakerTalk(**item) for item in speakers)
            return Done(**fields)
    except (ValueError, KeyError, TypeError) as error:
        raise MalformedMessage(f"not a v1 server message: {error}") from None
    raise MalformedMessage(f"unknown server message type {kind!r}")
