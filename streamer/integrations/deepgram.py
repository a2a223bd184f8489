"""Deepgram's live transcription protocol (``/v1/listen`` of Deepgram's API), sans-I/O: the handshake's query, the
client's control messages and the server's messages, for the compatible endpoint at :data:`DEEPGRAM_PATH`.

The official ``deepgram-sdk`` builds its WebSocket URL as the environment's base plus ``/v1/listen``
(``DeepgramClientEnvironment(production="ws://HOST:PORT/deepgram", ...)``; older SDKs take ``url=`` the same way), so
an unchanged client given the base ``ws://HOST:PORT/deepgram`` lands on :data:`DEEPGRAM_PATH`, and streamer's own
protocol keeps ``/v1/listen``. Credentials (``Authorization: Token <key>``, or the subprotocols ``token, <key>``) are
the server's to check (:mod:`streamer.server.auth`), before anything here runs.

- :func:`parse_query` turns the handshake's query into :class:`DeepgramParams`, refusing what cannot be served with
  :class:`~streamer.core.errors.UnsupportedAudio` (answered with HTTP 400, as Deepgram answers a bad request) and
  keeping the names of the parameters it accepts but ignores, which :class:`Metadata` lists as warnings.
- :func:`parse_client_message` reads the client's text frames: ``KeepAlive``, ``Finalize``, ``CloseStream`` and
  ``Configure``.
- :class:`Results`, :class:`UtteranceEnd`, :class:`DeepgramSpeechStartedMessage`, :class:`Metadata`,
  :class:`ConfigureFailure` and :class:`DeepgramErrorMessage` are the server's messages, in the shape the SDK parses
  into its typed ``ListenV1*`` models; :meth:`to_json` gives the text frame.
- :func:`close_for` is how an error ends a connection: Deepgram's own code and reason where Deepgram has one for the
  case, the error's code of :mod:`streamer.core.errors` otherwise (``docs/protocol.md`` lists them).

Times on the wire are seconds of stream time from the start of the stream, as Deepgram's are.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from streamer.core.audio import AudioFormat, Encoding
from streamer.core.container import ContainerEncoding
from streamer.core.errors import (
    BadContainer,
    FrameTooLarge,
    IdleTimeout,
    InvalidState,
    MalformedMessage,
    ProtocolError,
    UnsupportedAudio,
)
from streamer.engine.types import MAX_KEYWORD_CHARS, MAX_KEYWORDS
from streamer.server.bounded_json import parse_json_object
from streamer.server.client_messages import MAX_TEXT_FRAME_CHARS

__all__ = [
    "CONTAINER_ENCODINGS",
    "DEEPGRAM_PATH",
    "DEEPGRAM_PREFIX",
    "ENCODINGS",
    "MAX_ENDPOINTING_MS",
    "MAX_UTTERANCE_END_MS",
    "MIN_ENDPOINTING_MS",
    "MIN_UTTERANCE_END_MS",
    "ClientMessage",
    "ConfigureFailure",
    "DeepgramErrorMessage",
    "DeepgramParams",
    "DeepgramSpeechStartedMessage",
    "Metadata",
    "ModelInfo",
    "QueryWarning",
    "Results",
    "UtteranceEnd",
    "WordResult",
    "close_for",
    "model_info",
    "parse_client_message",
    "parse_query",
    "plain_word",
]

# the SDK's base URL for streamer is http(s)://HOST:PORT/deepgram (ws(s):// for the WebSocket): it appends /v1/listen
DEEPGRAM_PREFIX = "/deepgram"
DEEPGRAM_PATH = f"{DEEPGRAM_PREFIX}/v1/listen"

# Deepgram's raw encodings that the wire decoder has
ENCODINGS = {"linear16": Encoding.PCM_S16LE, "mulaw": Encoding.MULAW, "alaw": Encoding.ALAW}
# Deepgram's Opus encodings: served as Opus in a container (WebM or Ogg), which is what Deepgram's older docs call
# opus ("Ogg Opus") and what ogg-opus is; raw Opus packets without a container, what its newer docs call opus, are
# not decoded (they fail as bad_container, the stream not being a container)
CONTAINER_ENCODINGS = {"opus": ContainerEncoding.OPUS, "ogg-opus": ContainerEncoding.OPUS}

# ``endpointing`` is Deepgram's end-point silence, and becomes the core's (CoreOptions.endpoint_ms). Deepgram's
# default is 10 ms and LiveKit's plug-in sends 25 ms: for Whisper a pause that short splits an utterance at every
# gap between words, and each piece is decoded without the context of the rest. 300 ms is the VAD's own hangover
# (VadOptions.pad_after_ms): shorter end-points end inside the padding of the last word. Values below are raised to
# it, with a warning in Metadata.
MIN_ENDPOINTING_MS = 300
MAX_ENDPOINTING_MS = 10000  # the core's longest end-point (CoreOptions.validate)
# ``utterance_end_ms``: Deepgram documents 1000 ms as the least useful gap between words (its interim results come
# every second or so); the longest is bounded like the end-point
MIN_UTTERANCE_END_MS = 1000
MAX_UTTERANCE_END_MS = 10000
# ignored parameters named in Metadata: at most this many, each cut to this length (the query is the client's)
_MAX_IGNORED = 32
_MAX_NAME_CHARS = 64
# parameters that are streamer's own and say nothing to the protocol (the browser token of streamer.server.auth)
_SILENT = frozenset({"token"})
# a BCP-47 tag as Deepgram takes them ("en", "en-US", "pt-BR", "zh-Hant-TW"), and "multi" for detection
_LANGUAGE = re.compile(r"[A-Za-z]{2,3}(?:-[A-Za-z0-9]{1,8}){0,3}")
# the parameters this endpoint reads (repeatable: keyterm, keywords); everything else is accepted and ignored
_SCALARS = (
    "encoding",
    "sample_rate",
    "channels",
    "multichannel",
    "language",
    "model",
    "interim_results",
    "endpointing",
    "utterance_end_ms",
    "vad_events",
    "punctuate",
    "smart_format",
    "diarize",
)
_REPEATABLE = ("keyterm", "keywords")


@dataclass(frozen=True)
class QueryWarning:
    """Something the request asked for that is served otherwise or not at all; listed in :class:`Metadata`, in the
    shape of the warnings of Deepgram's responses."""

    parameter: str
    # "ignored" (accepted, no effect) or "adjusted" (served with another value)
    type: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"parameter": self.parameter, "type": self.type, "message": self.message}


@dataclass(frozen=True)
class DeepgramParams:
    """What a client asked for in the handshake's query. Build with :func:`parse_query`."""

    # the raw encoding of the binary frames, or containerised audio whose container says it (no encoding: WebM, Ogg
    # or WAV; opus or ogg-opus: Opus in WebM or Ogg)
    encoding: Encoding | ContainerEncoding
    # samples per second per channel of raw audio; 0 for a container (its own rate, known once its header is in)
    sample_rate: int
    # interleaved channels in each frame of raw audio (1 or 2); a container's are the container's
    channels: int = 1
    # True: one transcript per channel; False: channels mixed down to one, as Deepgram does
    multichannel: bool = False
    # the ISO 639 code decoding is fixed to (the primary subtag of the BCP-47 tag); None: the server's default, or
    # detection for language=multi on a multilingual model
    language: str | None = None
    # the Deepgram model asked for (nova-3...); the loaded model serves it whatever its name
    model: str | None = None
    # send interim Results (streamer's partials) besides the finals; Deepgram's default is false
    interim_results: bool = False
    # the end-point silence in ms; None: the server's (--endpoint-ms)
    endpointing_ms: int | None = None
    # endpointing=false: no speech_final (utterances still close at MAX_ENDPOINTING_MS of silence, to bound them)
    endpointing_off: bool = False
    # send UtteranceEnd after a gap of this many ms after the last word; None: never
    utterance_end_ms: int | None = None
    # send SpeechStarted when the VAD finds speech
    vad_events: bool = False
    # transcripts keep Whisper's punctuation and case (punctuate or smart_format); else lower case without it
    punctuate: bool = False
    # words and phrases decoding should favour (keyterm, and keywords without their :boost)
    keywords: tuple[str, ...] = ()
    # label who speaks: a speaker (and speaker_confidence) on every word, per channel (streamer.core.diarization)
    diarize: bool = False
    # what the request asked for that is not served as asked
    warnings: tuple[QueryWarning, ...] = ()

    @property
    def container(self) -> ContainerEncoding | None:
        """The container the audio comes in, or None for raw samples."""
        return self.encoding if isinstance(self.encoding, ContainerEncoding) else None

    @property
    def audio_format(self) -> AudioFormat:
        """The raw samples' format (check :attr:`container` first: a container has none until its header)."""
        if isinstance(self.encoding, ContainerEncoding):
            raise InvalidState("containerised audio has no raw format: its container gives it")
        return AudioFormat(encoding=self.encoding, sample_rate=self.sample_rate, channels=self.channels)

    @property
    def transcripts(self) -> int | None:
        """How many transcripts the stream has: one per channel with multichannel, else one. None for a container
        with multichannel: one per channel of the container, known once its header is in."""
        if not self.multichannel:
            return 1
        return None if self.container is not None else self.channels


def parse_query(path: str) -> DeepgramParams:
    """Parse the request target of the handshake (``/deepgram/v1/listen?encoding=linear16&sample_rate=16000...``).

    Raises :class:`~streamer.core.errors.UnsupportedAudio` naming the first parameter that cannot be served (the
    server answers HTTP 400 with it, as Deepgram does); the language is checked against the loaded model by the
    caller. Parameters this endpoint does not read are accepted and listed in :attr:`DeepgramParams.warnings`."""
    values: dict[str, str] = {}
    repeated: dict[str, list[str]] = {name: [] for name in _REPEATABLE}
    ignored: list[str] = []
    for key, value in parse_qsl(urlsplit(path).query, keep_blank_values=True):
        if key in _REPEATABLE:
            repeated[key].append(value)
        elif key in _SCALARS:
            if key in values:
                raise UnsupportedAudio(f"query parameter {key!r} is given twice")
            values[key] = value
        elif key not in _SILENT and key[:_MAX_NAME_CHARS] not in ignored and len(ignored) < _MAX_IGNORED:
            ignored.append(key[:_MAX_NAME_CHARS])
    warnings = [QueryWarning(name, "ignored", "not supported by streamer; accepted and ignored") for name in ignored]

    # 1. The audio: a raw encoding with its rate, as Deepgram requires when encoding is given; or a container, whose
    # header gives the rate and channels (Deepgram: "omit encoding and sample_rate for containerized audio").
    encoding: Encoding | ContainerEncoding
    if "encoding" not in values or values["encoding"] in CONTAINER_ENCODINGS:
        encoding = CONTAINER_ENCODINGS.get(values.get("encoding", ""), ContainerEncoding.CONTAINER)
        sample_rate, channels = 0, 1
        for name in ("sample_rate", "channels"):
            if name in values:
                warnings.append(QueryWarning(name, "ignored", "containerised audio: the container's is used"))
    else:
        wire = ENCODINGS.get(values["encoding"])
        if wire is None:
            served = ", ".join((*ENCODINGS, *CONTAINER_ENCODINGS))
            raise UnsupportedAudio(
                f"encoding {values['encoding'][:32]!r} is not supported; use one of: {served}, or none for "
                "containerised audio (WebM, Ogg, WAV)"
            )
        if "sample_rate" not in values:
            raise UnsupportedAudio("sample_rate is required with encoding")
        sample_rate = _integer("sample_rate", values["sample_rate"])
        channels = _integer("channels", values["channels"]) if "channels" in values else 1
        AudioFormat(encoding=wire, sample_rate=sample_rate, channels=channels).validate()
        encoding = wire

    # 2. Decoding: language, model, keywords.
    language = None
    if "language" in values:
        tag = values["language"]
        if tag.lower() != "multi":
            if not _LANGUAGE.fullmatch(tag):
                raise UnsupportedAudio(f"language must be a BCP-47 tag such as en or en-US, not {tag[:32]!r}")
            language = tag.split("-")[0].lower()
    keywords = tuple(_keyword(term) for term in repeated["keyterm"]) + tuple(
        _keyword(term.rsplit(":", 1)[0] if _has_boost(term) else term) for term in repeated["keywords"]
    )
    keywords = tuple(dict.fromkeys(keywords))  # the same term twice is one term
    if len(keywords) > MAX_KEYWORDS:
        raise UnsupportedAudio(f"at most {MAX_KEYWORDS} keyterm and keywords values are served, not {len(keywords)}")
    if any(":" in term for term in repeated["keyterm"]):
        warnings.append(QueryWarning("keyterm", "ignored", "keyterm takes no boost: a ':' is part of the term"))
    if any(_has_boost(term) for term in repeated["keywords"]):
        warnings.append(
            QueryWarning("keywords", "ignored", "keyword boosts are ignored: every keyword is favoured alike")
        )

    # 3. Turn taking: the end-point, utterance ends, VAD events.
    endpointing_ms: int | None = None
    endpointing_off = False
    raw = values.get("endpointing")
    if raw is not None and raw.lower() == "false":
        endpointing_off = True
    elif raw is not None and raw.lower() != "true":
        asked = _integer("endpointing", raw)
        if asked < 0:
            raise UnsupportedAudio(f"endpointing must be a number of milliseconds or false, not {raw[:32]!r}")
        endpointing_ms = min(max(asked, MIN_ENDPOINTING_MS), MAX_ENDPOINTING_MS)
        if endpointing_ms != asked:
            warnings.append(
                QueryWarning("endpointing", "adjusted", f"{asked} ms is served as {endpointing_ms} ms of silence")
            )
    utterance_end_ms = None
    if "utterance_end_ms" in values:
        utterance_end_ms = _integer("utterance_end_ms", values["utterance_end_ms"])
        if not MIN_UTTERANCE_END_MS <= utterance_end_ms <= MAX_UTTERANCE_END_MS:
            raise UnsupportedAudio(
                f"utterance_end_ms must be between {MIN_UTTERANCE_END_MS} and {MAX_UTTERANCE_END_MS}, "
                f"not {utterance_end_ms}"
            )

    params = DeepgramParams(
        encoding=encoding,
        sample_rate=sample_rate,
        channels=channels,
        multichannel=_boolean(values, "multichannel"),
        language=language,
        model=values.get("model", "")[:_MAX_NAME_CHARS] or None,
        interim_results=_boolean(values, "interim_results"),
        endpointing_ms=endpointing_ms,
        endpointing_off=endpointing_off,
        utterance_end_ms=utterance_end_ms,
        vad_events=_boolean(values, "vad_events"),
        punctuate=_boolean(values, "punctuate") or _boolean(values, "smart_format"),
        keywords=keywords,
        diarize=_boolean(values, "diarize"),
        warnings=tuple(warnings),
    )
    return params


def _integer(name: str, value: str) -> int:
    # ASCII digits only, and few of them: int() would take "١٦٠٠٠" and thousands of digits
    text = value.strip()
    digits = text.removeprefix("-")
    if not (digits.isascii() and digits.isdigit() and len(digits) <= 9):
        raise UnsupportedAudio(f"{name} must be an integer, not {value[:32]!r}")
    return int(text)


def _boolean(values: dict[str, str], name: str) -> bool:
    value = values.get(name, "false").lower()
    if value not in ("true", "false"):
        raise UnsupportedAudio(f"{name} must be true or false, not {values[name][:32]!r}")
    return value == "true"


def _has_boost(term: str) -> bool:
    """Whether a Deepgram keyword ends in ``:<boost>`` (``word:2``, ``word:-1.5``)."""
    head, colon, boost = term.rpartition(":")
    if not colon or not head:
        return False
    try:
        float(boost)
    except ValueError:
        return False
    return True


def _keyword(term: str) -> str:
    text = " ".join(term.split())
    if not text or len(text) > MAX_KEYWORD_CHARS:
        raise UnsupportedAudio(
            f"keyterm and keywords values must be 1 to {MAX_KEYWORD_CHARS} characters, not {len(text)}"
        )
    return text


# ---------------------------------------------------------------------------------------------------------------------
# Client to server text frames


class ClientMessage(StrEnum):
    """A client's control message (its ``type``)."""

    KEEP_ALIVE = "KeepAlive"  # no audio for a while: keeps the connection from the idle timeout
    FINALIZE = "Finalize"  # make what was heard so far final now (its last Results carry from_finalize)
    CLOSE_STREAM = "CloseStream"  # no more audio: the last Results, Metadata, then the close
    CONFIGURE = "Configure"  # change keyterms mid-stream: answered with ConfigureFailure (not served)


def parse_client_message(text: str) -> ClientMessage:
    """Parse one text frame. Raises :class:`~streamer.core.errors.FrameTooLarge` for a frame over
    :data:`~streamer.server.client_messages.MAX_TEXT_FRAME_CHARS` (checked first) and
    :class:`~streamer.core.errors.MalformedMessage` for anything but a JSON object whose ``type`` is a
    :class:`ClientMessage`; the session answers the latter with an ``Error`` and goes on. Other fields are
    ignored, as Deepgram does."""
    if len(text) > MAX_TEXT_FRAME_CHARS:
        raise FrameTooLarge(f"text frames may hold at most {MAX_TEXT_FRAME_CHARS} characters, this one {len(text)}")
    kind = parse_json_object(text).get("type")
    try:
        return ClientMessage(kind if isinstance(kind, str) else "")
    except ValueError:
        allowed = ", ".join(m.value for m in ClientMessage)
        raise MalformedMessage(f'unknown message type {str(kind)[:32]!r}; "type" must be one of {allowed}') from None


# ---------------------------------------------------------------------------------------------------------------------
# Server to client text frames


@dataclass(frozen=True)
class ModelInfo:
    """The loaded model, as the ``model_info`` of Results and Metadata name it."""

    name: str
    uuid: str
    version: str = "streamer"
    arch: str = "whisper"

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "version": self.version, "arch": self.arch}


def model_info(name: str) -> ModelInfo:
    """The model ``name`` with a stable id (Deepgram names models by UUID): the same name gives the same id."""
    return ModelInfo(name=name, uuid=str(uuid.uuid5(uuid.NAMESPACE_URL, f"streamer:model:{name}")))


_PUNCTUATION = "".join(chr(c) for c in range(0x21, 0x7F) if not chr(c).isalnum() and chr(c) != "'")


def plain_word(text: str) -> str:
    """A word as Deepgram's ``word`` field has it: lower case, without the punctuation around it (an apostrophe
    inside stays: ``don't``)."""
    return text.strip(_PUNCTUATION + "'\u2018\u2019\u201c\u201d\u00bf\u00a1").lower() or text.lower()


@dataclass(frozen=True)
class WordResult:
    text: str  # as decoded, with punctuation and case
    start: float
    end: float
    confidence: float
    # with diarize=true: who said it (an integer from 0, per channel) and how sure (0 to 1)
    speaker: int | None = None
    speaker_confidence: float | None = None

    def to_dict(self, punctuate: bool) -> dict[str, Any]:
        word: dict[str, Any] = {
            "word": plain_word(self.text),
            "start": self.start,
            "end": self.end,
            "confidence": self.confidence,
        }
        if self.speaker is not None:
            word["speaker"] = self.speaker
            word["speaker_confidence"] = self.speaker_confidence if self.speaker_confidence is not None else 0.0
        if punctuate:
            word["punctuated_word"] = self.text
        return word


@dataclass(frozen=True)
class Results:
    """A transcript: interim (``is_final`` false: a partial, superseded by the next Results) or final."""

    request_id: str
    model: ModelInfo
    # [this channel, channels]
    channel_index: tuple[int, int]
    start: float
    duration: float
    words: tuple[WordResult, ...]
    is_final: bool
    # the last final of an utterance the end-point closed
    speech_final: bool = False
    # the last final of an utterance a Finalize closed
    from_finalize: bool = False
    punctuate: bool = False

    @property
    def transcript(self) -> str:
        return " ".join(w.text if self.punctuate else plain_word(w.text) for w in self.words)

    def to_json(self) -> str:
        confidence = sum(w.confidence for w in self.words) / len(self.words) if self.words else 0.0
        return json.dumps(
            {
                "type": "Results",
                "channel_index": list(self.channel_index),
                "duration": self.duration,
                "start": self.start,
                "is_final": self.is_final,
                "speech_final": self.speech_final,
                "from_finalize": self.from_finalize,
                "channel": {
                    "alternatives": [
                        {
                            "transcript": self.transcript,
                            "confidence": round(confidence, 4),
                            "words": [w.to_dict(self.punctuate) for w in self.words],
                        }
                    ]
                },
                "metadata": {
                    "request_id": self.request_id,
                    "model_info": self.model.to_dict(),
                    "model_uuid": self.model.uuid,
                },
            }
        )


@dataclass(frozen=True)
class UtteranceEnd:
    """No word for ``utterance_end_ms`` after the word that ended at ``last_word_end``."""

    channel: tuple[int, int]
    last_word_end: float

    def to_json(self) -> str:
        return json.dumps({"type": "UtteranceEnd", "channel": list(self.channel), "last_word_end": self.last_word_end})


@dataclass(frozen=True)
class DeepgramSpeechStartedMessage:
    """The VAD found speech starting at ``timestamp`` (sent with ``vad_events=true``)."""

    channel: tuple[int, int]
    timestamp: float

    def to_json(self) -> str:
        return json.dumps({"type": "SpeechStarted", "channel": list(self.channel), "timestamp": self.timestamp})


@dataclass(frozen=True)
class Metadata:
    """The summary sent once the stream has ended, before the close."""

    request_id: str
    model: ModelInfo
    # ISO 8601 UTC time the stream was opened
    created: str
    # hex SHA-256 of every audio byte received, in order
    sha256: str
    # seconds of audio received (per channel)
    duration: float
    channels: int
    warnings: Sequence[QueryWarning] = field(default_factory=tuple)

    def to_json(self) -> str:
        return json.dumps(
            {
                "type": "Metadata",
                "transaction_key": "deprecated",
                "request_id": self.request_id,
                "sha256": self.sha256,
                "created": self.created,
                "duration": self.duration,
                "channels": self.channels,
                "models": [self.model.uuid],
                "model_info": {self.model.uuid: self.model.to_dict()},
                "warnings": [w.to_dict() for w in self.warnings],
            }
        )


@dataclass(frozen=True)
class ConfigureFailure:
    """The answer to ``Configure``: mid-stream keyterm changes are not served (the cores' decode options are fixed
    when the stream opens); the stream goes on with the keyterms of the query."""

    request_id: str

    def to_json(self) -> str:
        return json.dumps(
            {
                "type": "ConfigureFailure",
                "request_id": self.request_id,
                "code": "CONFIGURE_KEYTERMS_NOT_SUPPORTED",
                "description": "keyterms cannot change mid-stream here; give them as keyterm query parameters",
            }
        )


@dataclass(frozen=True)
class DeepgramErrorMessage:
    """An error: ``variant`` is streamer's error code (:mod:`streamer.core.errors`), or ``SchemaError`` for a text frame
    that is not a control message (then ``message`` quotes its start, and the stream goes on)."""

    variant: str
    description: str
    message: str | None = None

    def to_json(self) -> str:
        body: dict[str, Any] = {"type": "Error", "variant": self.variant, "description": self.description}
        if self.message is not None:
            body["message"] = self.message
        return json.dumps(body)


# Deepgram's closes (its "STT troubleshooting" page): an idle stream (no audio or KeepAlive within the timeout) 1011
# with the payload NET-0001; audio it cannot decode (not audio, a codec it does not serve) 1008 with DATA-0000
_DATA_0000 = (1008, "DATA-0000")
_DEEPGRAM_CLOSES: dict[type[ProtocolError], tuple[int, str]] = {
    IdleTimeout: (1011, "NET-0001"),
    BadContainer: _DATA_0000,
    UnsupportedAudio: _DATA_0000,
}


def close_for(error: ProtocolError | None) -> tuple[int, str]:
    """The close code and reason ending a stream for ``error`` (None: the client's CloseStream: 1000)."""
    if error is None:
        return 1000, ""
    return _DEEPGRAM_CLOSES.get(type(error), (error.close_code, error.code))
