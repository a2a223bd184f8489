"""OpenAI Realtime API transcription sessions, sans-I/O: the client events of ``/v1/realtime?intent=transcription``.

Clients (the official ``openai`` package among them) send JSON events: ``session.update`` (GA shape,
``session.type = "transcription"``, ``session.audio.input.{format, transcription, turn_detection, noise_reduction}``,
``session.include``) or ``transcription_session.update`` (beta shape: ``input_audio_format``,
``input_audio_transcription``, ``turn_detection``, ``input_audio_noise_reduction``, ``include``),
``input_audio_buffer.append`` (base64 audio), ``.commit`` and ``.clear``. Audio formats: ``audio/pcm`` (16-bit
little-endian mono at 24 kHz), ``audio/pcmu`` and ``audio/pcma`` (G.711 at 8 kHz), and the older names ``pcm16``,
``g711_ulaw``, ``g711_alaw``.

:func:`parse_client_event` turns a frame into a typed event carrying the session's configuration after it
(:class:`TranscriptionConfig`); an invalid one raises :class:`InvalidRequest`, which the session answers with an
``error`` event in OpenAI's shape (``error.type``, ``code``, ``message``, ``param``, ``event_id``) and goes on, as
OpenAI does. The server events of conversation items are :mod:`streamer.integrations.realtime_items`'.

How the configuration maps onto the stream core (docs/protocol.md lists it for users):

- ``transcription.prompt`` is the decoder's ``initial_prompt`` and ``transcription.keywords`` its ``keywords``
  (:class:`~streamer.engine.types.DecodeOptions`, which bounds both); ``language`` (or a ``languages`` list of one)
  fixes the stream's language.
- ``turn_detection`` ``server_vad``: ``silence_duration_ms`` is the core's end point; ``semantic_vad`` is served by
  the same VAD, its ``eagerness`` choosing the end-point silence (:data:`EAGERNESS_SILENCE_MS`).
- ``transcription.delay`` chooses how many successive hypotheses must agree before a word is final
  (:data:`DELAY_AGREEMENT`), or under AlignAtt how far past a word the decoder must have read
  (:data:`DELAY_MARGIN_FACTOR`): more waits longer and revises less, as OpenAI's "higher values can improve accuracy
  at the cost of latency".
- ``noise_reduction`` is accepted and echoed but not applied.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, TypeVar

from streamer.core.audio import Encoding
from streamer.core.errors import ConfigError, MalformedMessage
from streamer.engine.types import DecodeOptions
from streamer.server.bounded_json import parse_json_object

__all__ = [
    "CLIENT_SECRETS_PATH",
    "DELAY_AGREEMENT",
    "DELAY_MARGIN_FACTOR",
    "EAGERNESS_SILENCE_MS",
    "LOGPROBS",
    "MAX_APPEND_BYTES",
    "MAX_APPEND_SECONDS",
    "MAX_EVENT_CHARS",
    "REALTIME_PATH",
    "AudioAppend",
    "AudioClear",
    "AudioCommit",
    "ClientEvent",
    "Delay",
    "Eagerness",
    "InputFormat",
    "InvalidRequest",
    "NoiseReduction",
    "SessionUpdate",
    "TranscriptionConfig",
    "error_event",
    "parse_client_event",
    "session_config",
]

REALTIME_PATH = "/v1/realtime"
# OpenAI's route for ephemeral keys (GA): POST with an API key, answers a key for one /v1/realtime session
CLIENT_SECRETS_PATH = "/v1/realtime/client_secrets"
# Audio in one append, in seconds whatever the format (issue 14: 1 MiB of g711_ulaw was 131 s, decoded, resampled
# and queued in one go). 20 s is 960,000 bytes of the default format (24 kHz PCM16), within the 1 MiB of a
# /v1/listen binary frame; a third of the rate limit's 60 s burst; and far more than a streaming client sends at
# once (OpenAI's examples append 100 ms to 1 s; OpenAI's own limit is 15 MiB an event). Each format's byte limit
# is checked on the base64 before decoding.
MAX_APPEND_SECONDS = 20

_E = TypeVar("_E", bound=StrEnum)


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


class Eagerness(StrEnum):
    """``semantic_vad``'s eagerness: how soon a pause ends the turn."""

    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    AUTO = "auto"


# semantic_vad is served by the server's VAD with a fixed end-point silence per eagerness. OpenAI's semantic VAD waits
# longer when the words so far sound unfinished, up to 8 s (low), 4 s (medium, auto) and 2 s (high); a fixed pause
# cannot hear that, so each eagerness gets a pause around server_vad's 500 ms default: high ends turns sooner, low
# lets a speaker think for a second and a half
EAGERNESS_SILENCE_MS = {Eagerness.HIGH: 300, Eagerness.MEDIUM: 700, Eagerness.AUTO: 700, Eagerness.LOW: 1500}


class Delay(StrEnum):
    """``transcription.delay``: how long the model may wait before text is emitted."""

    MINIMAL = "minimal"
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    XHIGH = "xhigh"


# the core's agreement_n per delay: a word is final once this many successive hypotheses agree on it, each a decode
# step (CoreOptions.step_ms) apart; 2 is the server's default (medium)
DELAY_AGREEMENT = {Delay.MINIMAL: 1, Delay.LOW: 2, Delay.MEDIUM: 2, Delay.HIGH: 3, Delay.XHIGH: 4}
# under AlignAtt (serve --policy alignatt) the same choice scales the server's alignatt_margin_ms: how far the
# decoder's attention must have moved past a word before it is final (under --policy auto both apply, each to the
# windows that policy decides)
DELAY_MARGIN_FACTOR = {Delay.MINIMAL: 0.5, Delay.LOW: 1.0, Delay.MEDIUM: 1.0, Delay.HIGH: 2.0, Delay.XHIGH: 3.0}


class NoiseReduction(StrEnum):
    NEAR_FIELD = "near_field"
    FAR_FIELD = "far_field"


LOGPROBS = "item.input_audio_transcription.logprobs"  # the one value of session.include
MIN_IDLE_TIMEOUT_MS = 1000
MAX_IDLE_TIMEOUT_MS = 600_000


@dataclass(frozen=True)
class TranscriptionConfig:
    """The session as the client configured it (echoed in ``session.created`` / ``session.updated``)."""

    # how appended audio is encoded
    format: InputFormat = InputFormat.PCM
    # ISO 639-1 code, or None to let a multilingual model detect it
    language: str | None = None
    # text the model is conditioned on in every window (DecodeOptions.initial_prompt)
    prompt: str = ""
    # the model name the client asked for (echoed; the server transcribes with its own model)
    model: str = "whisper-1"
    # server_vad (or semantic_vad): the server ends turns at pauses; False (turn_detection null): the client commits
    server_vad: bool = True
    # pause that ends a turn under server_vad
    silence_duration_ms: int = 500
    # words and names whose spelling decoding favours (DecodeOptions.keywords)
    keywords: tuple[str, ...] = ()
    # the languages the audio may be in; one of them fixes the language as `language` does
    languages: tuple[str, ...] = ()
    # how long text may wait for agreement (DELAY_AGREEMENT); None: the server's default
    delay: Delay | None = None
    # semantic_vad's eagerness (its end point is EAGERNESS_SILENCE_MS); None: server_vad or no turn detection
    eagerness: Eagerness | None = None
    # server_vad: input_audio_buffer.timeout_triggered after this long without speech; None: never
    idle_timeout_ms: int | None = None
    # include logprobs in deltas and completed (session.include)
    logprobs: bool = False
    # accepted and echoed, not applied
    noise_reduction: NoiseReduction | None = None

    @property
    def endpoint_ms(self) -> int:
        """The pause that ends a turn: ``silence_duration_ms``, or semantic_vad's for its eagerness."""
        return self.silence_duration_ms if self.eagerness is None else EAGERNESS_SILENCE_MS[self.eagerness]

    @property
    def stream_language(self) -> str | None:
        """The language the stream is decoded in: ``language``, else the one of ``languages``, else None."""
        if self.language is not None:
            return self.language
        return self.languages[0] if len(self.languages) == 1 else None

    def decode_fields(self) -> tuple[object, ...]:
        """What the stream core is built with: none of it may change once audio was appended."""
        return (
            self.format,
            self.server_vad,
            self.endpoint_ms,
            self.stream_language,
            self.prompt,
            self.keywords,
            self.delay,
        )

    def session_object(self, session_id: str, beta: bool) -> dict[str, Any]:
        """The ``session`` object of ``session.created`` (GA) or ``transcription_session.created`` (beta)."""
        turn_detection: dict[str, Any] | None = None
        if self.server_vad and self.eagerness is not None:
            turn_detection = {"type": "semantic_vad", "eagerness": self.eagerness.value}
        elif self.server_vad:
            turn_detection = {
                "type": "server_vad",
                "silence_duration_ms": self.silence_duration_ms,
                "prefix_padding_ms": 300,
                "threshold": 0.5,
                "idle_timeout_ms": self.idle_timeout_ms,
            }
        transcription = {
            "model": self.model,
            "language": self.language,
            "prompt": self.prompt,
            "keywords": list(self.keywords) or None,
            "languages": list(self.languages) or None,
            "delay": None if self.delay is None else self.delay.value,
        }
        noise_reduction = None if self.noise_reduction is None else {"type": self.noise_reduction.value}
        include = [LOGPROBS] if self.logprobs else None
        if beta:
            return {
                "id": session_id,
                "object": "realtime.transcription_session",
                "input_audio_format": self.format.legacy_name,
                "input_audio_transcription": transcription,
                "turn_detection": turn_detection,
                "input_audio_noise_reduction": noise_reduction,
                "include": include,
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
                    "noise_reduction": noise_reduction,
                }
            },
            "include": include,
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


def _choice(enum: type[_E], value: Any, param: str) -> _E:
    try:
        return enum(value)
    except ValueError:
        allowed = ", ".join(e.value for e in enum)
        raise InvalidRequest(
            f"{param.rsplit('.', 1)[-1]} must be one of {allowed}, not {value!r}", param=param
        ) from None


def _language(value: Any, param: str) -> str:
    if not (isinstance(value, str) and 2 <= len(value) <= 3 and value.isalpha()):
        raise InvalidRequest(f"language must be an ISO 639-1 code, not {value!r}", param=param)
    return value


def _strings(value: Any, param: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidRequest(f"{param.rsplit('.', 1)[-1]} must be a list of strings", param=param)
    return tuple(value)


def _apply_transcription(config: TranscriptionConfig, value: Any, param: str) -> TranscriptionConfig:
    if value is None:
        return config
    if not isinstance(value, dict):
        raise InvalidRequest("transcription must be an object", param=param)
    language = value.get("language", config.language)
    language = None if not language else _language(language, f"{param}.language")
    languages = config.languages
    if "languages" in value:
        languages = tuple(
            _language(v, f"{param}.languages") for v in _strings(value["languages"], f"{param}.languages")
        )
    prompt = value.get("prompt", config.prompt)
    if not isinstance(prompt, str | None):
        raise InvalidRequest("prompt must be a string", param=f"{param}.prompt")
    keywords = config.keywords
    if "keywords" in value:
        keywords = tuple(k.strip() for k in _strings(value["keywords"], f"{param}.keywords"))
    delay = config.delay
    if "delay" in value:
        delay = None if value["delay"] is None else _choice(Delay, value["delay"], f"{param}.delay")
    # the bounds on a prompt and keywords are the decoder's, checked in its one place
    for field_name, options in (
        ("prompt", DecodeOptions(initial_prompt=prompt or "")),
        ("keywords", DecodeOptions(keywords=keywords)),
    ):
        try:
            options.validate()
        except ConfigError as error:
            raise InvalidRequest(error.args[0], param=f"{param}.{field_name}") from None
    model = value.get("model", config.model)
    return replace(
        config,
        language=language,
        languages=languages,
        prompt=prompt or "",
        keywords=keywords,
        delay=delay,
        model=str(model or config.model),
    )


def _apply_turn_detection(config: TranscriptionConfig, value: Any, param: str) -> TranscriptionConfig:
    if value is None:
        return replace(config, server_vad=False, eagerness=None, idle_timeout_ms=None)
    kind = value.get("type") if isinstance(value, dict) else value
    if not isinstance(value, dict) or kind not in ("server_vad", "semantic_vad"):
        raise InvalidRequest(f"turn_detection must be server_vad, semantic_vad or null, not {kind!r}", param=param)
    if kind == "semantic_vad":
        eagerness = _choice(Eagerness, value.get("eagerness") or "auto", f"{param}.eagerness")
        return replace(config, server_vad=True, eagerness=eagerness, idle_timeout_ms=None)
    silence = value.get("silence_duration_ms", config.silence_duration_ms)
    if not isinstance(silence, int) or not 100 <= silence <= 10000:
        raise InvalidRequest("silence_duration_ms must be 100 to 10000", param=f"{param}.silence_duration_ms")
    idle = value.get("idle_timeout_ms")
    if idle is not None and (not isinstance(idle, int) or not MIN_IDLE_TIMEOUT_MS <= idle <= MAX_IDLE_TIMEOUT_MS):
        raise InvalidRequest(
            f"idle_timeout_ms must be {MIN_IDLE_TIMEOUT_MS} to {MAX_IDLE_TIMEOUT_MS}", param=f"{param}.idle_timeout_ms"
        )
    return replace(config, server_vad=True, eagerness=None, silence_duration_ms=silence, idle_timeout_ms=idle)


def _apply_noise_reduction(config: TranscriptionConfig, value: Any, param: str) -> TranscriptionConfig:
    if value is None:
        return replace(config, noise_reduction=None)
    if not isinstance(value, dict):
        raise InvalidRequest("noise_reduction must be an object or null", param=param)
    return replace(config, noise_reduction=_choice(NoiseReduction, value.get("type"), f"{param}.type"))


def _apply_include(config: TranscriptionConfig, value: Any, param: str) -> TranscriptionConfig:
    wanted = _strings(value, param)
    unknown = [v for v in wanted if v != LOGPROBS]
    if unknown:
        raise InvalidRequest(f"include may only hold {LOGPROBS!r}, not {unknown[0]!r}", param=param)
    return replace(config, logprobs=LOGPROBS in wanted)


def _apply_session(config: TranscriptionConfig, session: Any, beta: bool) -> TranscriptionConfig:
    if not isinstance(session, dict):
        raise InvalidRequest("session must be an object", param="session")
    if "include" in session:
        config = _apply_include(config, session["include"], "session.include")
    if beta:
        fields = {
            "input_audio_format": lambda c, v, p: replace(c, format=_format(v, p)),
            "input_audio_transcription": _apply_transcription,
            "turn_detection": _apply_turn_detection,
            "input_audio_noise_reduction": _apply_noise_reduction,
        }
        return _apply_fields(config, session, fields, "session")
    if session.get("type", "transcription") != "transcription":
        raise InvalidRequest("this server only transcribes: session.type must be 'transcription'", param="session.type")
    audio_input = (session.get("audio") or {}).get("input") or {}
    if not isinstance(audio_input, dict):
        raise InvalidRequest("session.audio.input must be an object", param="session.audio.input")
    fields = {
        "format": lambda c, v, p: replace(c, format=_format(v, p)),
        "transcription": _apply_transcription,
        "turn_detection": _apply_turn_detection,
        "noise_reduction": _apply_noise_reduction,
    }
    return _apply_fields(config, audio_input, fields, "session.audio.input")


def _apply_fields(
    config: TranscriptionConfig,
    given: dict[str, Any],
    fields: dict[str, Callable[[TranscriptionConfig, Any, str], TranscriptionConfig]],
    prefix: str,
) -> TranscriptionConfig:
    """Apply each of ``fields`` that ``given`` names, in order, each error naming its parameter under ``prefix``."""
    for name, apply in fields.items():
        if name in given:
            config = apply(config, given[name], f"{prefix}.{name}")
    return config


def session_config(session: Any) -> TranscriptionConfig:
    """The configuration a GA ``session`` object describes (``POST /v1/realtime/client_secrets``), from the
    defaults; raise :class:`InvalidRequest` naming the bad field (``session.type`` other than ``transcription``
    included)."""
    return _apply_session(TranscriptionConfig(), session, beta=False)


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
