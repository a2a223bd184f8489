"""OpenAI Realtime API transcription sessions, sans-I/O: the events of ``/v1/realtime?intent=transcription``.

Clients (the official ``openai`` package among them) send JSON events: ``session.update`` (GA shape,
``session.type = "transcription"``, ``session.audio.input.{format, transcription, turn_detection}``) or
``transcription_session.update`` (beta shape: ``input_audio_format``, ``input_audio_transcription``,
``turn_detection``), ``input_audio_buffer.append`` (base64 audio), ``.commit`` and ``.clear``. Audio formats:
``audio/pcm`` (16-bit little-endian mono at 24 kHz), ``audio/pcmu`` and ``audio/pcma`` (G.711 at 8 kHz), and the
older names ``pcm16``, ``g711_ulaw``, ``g711_alaw``.

:func:`parse_client_event` turns a frame into a typed event; an invalid one raises :class:`InvalidRequest`, which
the session answers with an ``error`` event in OpenAI's shape (``error.type``, ``code``, ``message``, ``param``,
``event_id``) and goes on, as OpenAI does.

:class:`Items` maps the core's transcript onto conversation items. With ``turn_detection`` ``server_vad`` (the
default) each utterance the core's VAD finds is an item: ``speech_started`` when it begins, and once its last final
is out ``speech_stopped``, ``committed``, one ``delta`` per final and ``completed``. With ``turn_detection: null``
the client's ``commit`` closes an item: ``committed`` at once, then the deltas and ``completed`` when the core has
committed every utterance begun before the commit point.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import secrets
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from streamer.core.audio import Encoding
from streamer.core.errors import MalformedMessage
from streamer.core.units import SAMPLE_RATE
from streamer.server.protocol import parse_json_object

__all__ = [
    "MAX_APPEND_BYTES",
    "MAX_APPEND_SECONDS",
    "MAX_EVENT_CHARS",
    "REALTIME_PATH",
    "AudioAppend",
    "AudioClear",
    "AudioCommit",
    "ClientEvent",
    "InputFormat",
    "InvalidRequest",
    "Items",
    "SessionUpdate",
    "TranscriptionConfig",
    "error_event",
    "parse_client_event",
]

REALTIME_PATH = "/v1/realtime"
_MS = SAMPLE_RATE // 1000
MIN_COMMIT_MS = 100  # OpenAI refuses to commit less audio than this (input_audio_buffer_commit_empty)
# Audio in one append, in seconds whatever the format (issue 14: 1 MiB of g711_ulaw was 131 s, decoded, resampled
# and queued in one go). 20 s is 960,000 bytes of the default format (24 kHz PCM16), within the 1 MiB of a
# /v1/listen binary frame; a third of the rate limit's 60 s burst; and far more than a streaming client sends at
# once (OpenAI's examples append 100 ms to 1 s; OpenAI's own limit is 15 MiB an event). Each format's byte limit
# is checked on the base64 before decoding.
MAX_APPEND_SECONDS = 20


class InputFormat(StrEnum):
    PCM = "audio/pcm"  # 16-bit little-endian mono at 24 kHz
    PCMU = "audio/pcmu"  # G.711 mu-law at 8 kHz
    PCMA = "audio/pcma"  # G.711 A-law at 8 kHz

    @property
    def sample_rate(self) -> int:
        return 24000 if self is InputFormat.PCM else 8000

    @property
    def encoding(self) -> Encoding:
        return {InputFormat.PCM: Encoding.PCM_S16LE, InputFormat.PCMU: Encoding.MULAW, InputFormat.PCMA: Encoding.ALAW}[
            self
        ]

    @property
    def max_append_bytes(self) -> int:
        """Bytes of :data:`MAX_APPEND_SECONDS` of audio in this format."""
        return MAX_APPEND_SECONDS * self.sample_rate * self.encoding.bytes_per_sample

    @property
    def legacy_name(self) -> str:
        return {InputFormat.PCM: "pcm16", InputFormat.PCMU: "g711_ulaw", InputFormat.PCMA: "g711_alaw"}[self]


_FORMAT_NAMES = {f.value: f for f in InputFormat} | {f.legacy_name: f for f in InputFormat}
# bytes of MAX_APPEND_SECONDS in the widest format, and the longest event: its audio's base64 plus a little JSON
MAX_APPEND_BYTES = max(f.max_append_bytes for f in InputFormat)
MAX_EVENT_CHARS = 4 * -(-MAX_APPEND_BYTES // 3) + 4096


class InvalidRequest(Exception):
    """A client event the server cannot act on; answered with an ``error`` event, the session goes on."""

    def __init__(self, message: str, *, code: str = "invalid_value", param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param
        self.event_id: str | None = None


def error_event(event_id: str, error: InvalidRequest, error_type: str = "invalid_request_error") -> dict[str, Any]:
    """OpenAI's ``error`` server event."""
    return {
        "type": "error",
        "event_id": event_id,
        "error": {
            "type": error_type,
            "code": error.code,
            "message": error.message,
            "param": error.param,
            "event_id": error.event_id,
        },
    }


@dataclass(frozen=True)
class TranscriptionConfig:
    """The session as the client configured it (echoed in ``session.created`` / ``session.updated``)."""

    # how appended audio is encoded
    format: InputFormat = InputFormat.PCM
    # ISO 639-1 code, or None to let a multilingual model detect it
    language: str | None = None
    # text the model is conditioned on at the start of the session
    prompt: str = ""
    # the model name the client asked for (echoed; the server transcribes with its own model)
    model: str = "whisper-1"
    # server_vad: the server ends turns at pauses; False (turn_detection null): the client commits
    server_vad: bool = True
    # pause that ends a turn under server_vad
    silence_duration_ms: int = 500

    def session_object(self, session_id: str, beta: bool) -> dict[str, Any]:
        """The ``session`` object of ``session.created`` (GA) or ``transcription_session.created`` (beta)."""
        turn_detection = (
            {"type": "server_vad", "silence_duration_ms": self.silence_duration_ms, "prefix_padding_ms": 300}
            if self.server_vad
            else None
        )
        transcription = {"model": self.model, "language": self.language, "prompt": self.prompt}
        if beta:
            return {
                "id": session_id,
                "object": "realtime.transcription_session",
                "input_audio_format": self.format.legacy_name,
                "input_audio_transcription": transcription,
                "turn_detection": turn_detection,
                "modalities": ["text"],
            }
        audio_format: dict[str, Any] = {"type": self.format.value}
        if self.format is InputFormat.PCM:
            audio_format["rate"] = 24000
        return {
            "type": "transcription",
            "id": session_id,
            "object": "realtime.transcription_session",
            "audio": {
                "input": {
                    "format": audio_format,
                    "transcription": transcription,
                    "turn_detection": turn_detection,
                    "noise_reduction": None,
                }
            },
        }


# ---------------------------------------------------------------------------------------------------------------------
# Client events


@dataclass(frozen=True)
class SessionUpdate:
    event_id: str | None
    config: TranscriptionConfig  # the configuration after the update
    beta: bool  # transcription_session.update: answer transcription_session.updated


@dataclass(frozen=True)
class AudioAppend:
    event_id: str | None
    audio: bytes


@dataclass(frozen=True)
class AudioCommit:
    event_id: str | None


@dataclass(frozen=True)
class AudioClear:
    event_id: str | None


ClientEvent = SessionUpdate | AudioAppend | AudioCommit | AudioClear


def _format(value: Any, param: str) -> InputFormat:
    name = value.get("type") if isinstance(value, dict) else value
    fmt = _FORMAT_NAMES.get(name) if isinstance(name, str) else None
    if fmt is None:
        allowed = ", ".join(_FORMAT_NAMES)
        raise InvalidRequest(f"unsupported audio format {name!r}; use one of {allowed}", param=param)
    rate = value.get("rate") if isinstance(value, dict) else None
    if rate is not None and rate != fmt.sample_rate:
        raise InvalidRequest(f"{fmt.value} must be at {fmt.sample_rate} Hz, not {rate!r}", param=f"{param}.rate")
    return fmt


def _apply_transcription(config: TranscriptionConfig, value: Any, param: str) -> TranscriptionConfig:
    if value is None:
        return config
    if not isinstance(value, dict):
        raise InvalidRequest("transcription must be an object", param=param)
    language = value.get("language", config.language)
    if language is not None and not (isinstance(language, str) and 2 <= len(language) <= 3 and language.isalpha()):
        raise InvalidRequest(f"language must be an ISO 639-1 code, not {language!r}", param=f"{param}.language")
    prompt = value.get("prompt", config.prompt)
    if not isinstance(prompt, str | None):
        raise InvalidRequest("prompt must be a string", param=f"{param}.prompt")
    model = value.get("model", config.model)
    return replace(config, language=language or None, prompt=prompt or "", model=str(model or config.model))


def _apply_turn_detection(config: TranscriptionConfig, value: Any, param: str) -> TranscriptionConfig:
    if value is None:
        return replace(config, server_vad=False)
    if not isinstance(value, dict) or value.get("type") != "server_vad":
        kind = value.get("type") if isinstance(value, dict) else value
        raise InvalidRequest(f"turn_detection must be server_vad or null, not {kind!r}", param=param)
    silence = value.get("silence_duration_ms", config.silence_duration_ms)
    if not isinstance(silence, int) or not 100 <= silence <= 10000:
        raise InvalidRequest("silence_duration_ms must be 100 to 10000", param=f"{param}.silence_duration_ms")
    return replace(config, server_vad=True, silence_duration_ms=silence)


def _apply_session(config: TranscriptionConfig, session: Any, beta: bool) -> TranscriptionConfig:
    if not isinstance(session, dict):
        raise InvalidRequest("session must be an object", param="session")
    if beta:
        if "input_audio_format" in session:
            config = replace(config, format=_format(session["input_audio_format"], "session.input_audio_format"))
        if "input_audio_transcription" in session:
            config = _apply_transcription(
                config, session["input_audio_transcription"], "session.input_audio_transcription"
            )
        if "turn_detection" in session:
            config = _apply_turn_detection(config, session["turn_detection"], "session.turn_detection")
        return config
    if session.get("type", "transcription") != "transcription":
        raise InvalidRequest("this server only transcribes: session.type must be 'transcription'", param="session.type")
    audio_input = (session.get("audio") or {}).get("input") or {}
    if not isinstance(audio_input, dict):
        raise InvalidRequest("session.audio.input must be an object", param="session.audio.input")
    if "format" in audio_input:
        config = replace(config, format=_format(audio_input["format"], "session.audio.input.format"))
    if "transcription" in audio_input:
        config = _apply_transcription(config, audio_input["transcription"], "session.audio.input.transcription")
    if "turn_detection" in audio_input:
        config = _apply_turn_detection(config, audio_input["turn_detection"], "session.audio.input.turn_detection")
    return config


def parse_client_event(frame: str | bytes, config: TranscriptionConfig) -> ClientEvent:
    """Parse one text frame against the current ``config``; raises :class:`InvalidRequest` (binary frames, and text
    over :data:`MAX_EVENT_CHARS`, before any decoding)."""
    if not isinstance(frame, str):
        raise InvalidRequest("events are JSON text frames, not binary", code="invalid_json")
    if len(frame) > MAX_EVENT_CHARS:
        raise InvalidRequest(f"events are at most {MAX_EVENT_CHARS} characters", code="invalid_json")
    try:
        data = parse_json_object(frame, "events")
    except MalformedMessage as error:  # not JSON, not an object, or nested too deep (checked before parsing)
        raise InvalidRequest(error.message, code="invalid_json") from None
    if not isinstance(data.get("type"), str):
        raise InvalidRequest("an event is a JSON object with a 'type'", param="type")
    event_id = data.get("event_id") if isinstance(data.get("event_id"), str) else None
    kind = data["type"]
    try:
        if kind in ("session.update", "transcription_session.update"):
            beta = kind == "transcription_session.update"
            return SessionUpdate(event_id, _apply_session(config, data.get("session"), beta), beta)
        if kind == "input_audio_buffer.append":
            audio = data.get("audio")
            if not isinstance(audio, str):
                raise InvalidRequest("audio must be a base64 string", param="audio")
            limit = config.format.max_append_bytes
            too_long = InvalidRequest(
                f"one append carries at most {MAX_APPEND_SECONDS} s of audio ({limit} bytes of {config.format.value})",
                param="audio",
            )
            if len(audio) > 4 * -(-limit // 3):  # base64 of more than `limit` bytes: refused before decoding
                raise too_long
            try:
                decoded = base64.b64decode(audio, validate=True)
            except (binascii.Error, ValueError):
                raise InvalidRequest("audio is not valid base64", param="audio") from None
            if len(decoded) > limit:
                raise too_long
            return AudioAppend(event_id, decoded)
        if kind == "input_audio_buffer.commit":
            return AudioCommit(event_id)
        if kind == "input_audio_buffer.clear":
            return AudioClear(event_id)
        raise InvalidRequest(
            f"event type {kind!r} is not supported by this transcription server", code="unknown_event", param="type"
        )
    except InvalidRequest as error:
        error.event_id = event_id
        raise
    except (AttributeError, TypeError, ValueError, KeyError):
        # a field of the wrong JSON type where an object belongs (found by tests/reliability/test_fuzz.py)
        wrong_type = InvalidRequest(f"{kind} has fields of the wrong type")
        wrong_type.event_id = event_id
        raise wrong_type from None


# ---------------------------------------------------------------------------------------------------------------------
# Items


@dataclass
class _Item:
    item_id: str
    start: int  # server_vad: the utterance start; null mode: the previous commit point
    boundary: int | None = None  # null mode: the commit point; None while audio still joins it
    committed: bool = False  # `committed` sent: deltas may go out as finals arrive
    discard: bool = False  # cleared: its finals are dropped
    texts: list[str] = field(default_factory=list)
    sent: int = 0  # texts already sent as deltas
    end: int = 0  # end of its last final


class Items:
    """Conversation items of one session, built from core events; every method returns the server events to send,
    in order. Times are 16 kHz stream samples."""

    def __init__(self, server_vad: bool) -> None:
        self.server_vad = server_vad
        self._items: list[_Item] = []  # not yet completed, in stream order
        self._previous: str | None = None  # the last committed item, for previous_item_id
        self._event_ids = itertools.count(1)
        self._prefix = secrets.token_hex(4)
        self._last_commit = 0

    def event_id(self) -> str:
        return f"event_{self._prefix}{next(self._event_ids):06d}"

    def _new_item(self, start: int) -> _Item:
        item = _Item(f"item_{secrets.token_hex(8)}", start)
        self._items.append(item)
        return item

    def speech_started(self, start: int) -> list[dict[str, Any]]:
        if not self.server_vad:
            return []
        item = self._new_item(start)
        return [self._event("input_audio_buffer.speech_started", audio_start_ms=start // _MS, item_id=item.item_id)]

    def final(self, start: int, end: int, text: str) -> list[dict[str, Any]]:
        """A core Final: add its text to the item it belongs to (deltas go out once the item is committed)."""
        item = self._owner(start)
        item.end = max(item.end, end)
        if text.strip():
            item.texts.append(text.strip())
        return self._deltas(item) if item.committed and not item.discard else []

    def commit(self, point: int) -> list[dict[str, Any]]:
        """The client committed the buffer at stream sample ``point`` (the session finalized the core)."""
        if point - self._last_commit < MIN_COMMIT_MS * _MS:
            raise InvalidRequest(
                f"buffer too small: expected at least {MIN_COMMIT_MS} ms of audio since the last commit, "
                f"got {(point - self._last_commit) / _MS:.0f} ms",
                code="input_audio_buffer_commit_empty",
            )
        self._last_commit = point
        if self.server_vad:
            return []  # the open utterance ends at the commit point and completes like any other
        item = self._open_item()
        item.boundary = point
        return self._committed(item) + self._deltas(item)

    def clear(self, point: int) -> list[dict[str, Any]]:
        """Drop the audio not yet committed (the session finalized the core so that it ends at ``point``)."""
        for item in self._items:
            if not item.committed:
                item.discard = True
                item.boundary = point if item.boundary is None else item.boundary
        self._last_commit = point
        return [self._event("input_audio_buffer.cleared")]

    def settle(self, uncommitted_from: int | None) -> list[dict[str, Any]]:
        """Complete every item whose speech the core has wholly committed (``uncommitted_from`` is
        :attr:`~streamer.core.stream.StreamCore.uncommitted_from`). Call after every batch of core events."""
        events: list[dict[str, Any]] = []
        while self._items:
            item = self._items[0]
            if self.server_vad and not item.discard:
                nxt = self._items[1].start if len(self._items) > 1 else None
                done = uncommitted_from is None or uncommitted_from > item.start
                if nxt is not None:
                    done = done or (uncommitted_from is not None and uncommitted_from >= nxt)
            else:
                done = item.boundary is not None and (uncommitted_from is None or uncommitted_from >= item.boundary)
            if not done:
                break
            self._items.pop(0)
            if item.discard:
                continue
            if not item.committed:
                events.append(
                    self._event("input_audio_buffer.speech_stopped", audio_end_ms=item.end // _MS, item_id=item.item_id)
                )
                events += self._committed(item)
            events += self._deltas(item)
            events.append(
                self._event(
                    "conversation.item.input_audio_transcription.completed",
                    item_id=item.item_id,
                    content_index=0,
                    transcript=" ".join(item.texts),
                    usage={"type": "duration", "seconds": round(max(0, item.end - item.start) / SAMPLE_RATE, 3)},
                )
            )
        return events

    def end(self) -> list[dict[str, Any]]:
        """The stream is over and the core has ended: complete what is left, as if committed."""
        for item in self._items:
            if item.boundary is None:
                item.boundary = item.end
        return self.settle(None)

    # -- helpers ----------------------------------------------------------------------------------------------------

    def _open_item(self) -> _Item:
        for item in self._items:
            if item.boundary is None and not item.discard:
                return item
        return self._new_item(self._last_commit)

    def _owner(self, start: int) -> _Item:
        if self.server_vad:
            candidates = [i for i in self._items if i.start <= start]
            return candidates[-1] if candidates else (self._items[0] if self._items else self._new_item(start))
        for item in self._items:
            if item.boundary is not None and start < item.boundary:
                return item
        return self._open_item()

    def _committed(self, item: _Item) -> list[dict[str, Any]]:
        item.committed = True
        event = self._event("input_audio_buffer.committed", item_id=item.item_id, previous_item_id=self._previous)
        self._previous = item.item_id
        return [event]

    def _deltas(self, item: _Item) -> list[dict[str, Any]]:
        events = []
        for index in range(item.sent, len(item.texts)):
            delta = item.texts[index] if index == 0 else " " + item.texts[index]
            events.append(
                self._event(
                    "conversation.item.input_audio_transcription.delta",
                    item_id=item.item_id,
                    content_index=0,
                    delta=delta,
                )
            )
        item.sent = len(item.texts)
        return events

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        return {"type": kind, "event_id": self.event_id(), **fields}
