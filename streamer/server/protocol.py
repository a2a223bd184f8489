"""Protocol v1 of ``/v1/listen``: every message as a typed dataclass, with its parser and serializer.

Sans-I/O: nothing here touches a socket or a clock. The session (:mod:`streamer.server.session`) turns wire frames into
these records with :func:`parse_listen_query` and :func:`parse_client_message`, and sends what :func:`serialize`
returns; the client (:mod:`streamer.client`) does the reverse with :func:`parse_server_message`. The full
description, with examples, is ``docs/protocol.md``.

Client to server: binary frames of audio in the format named by the query string, and JSON text frames
:class:`Finalize`, :class:`End`, :class:`KeepAlive`, :class:`Configure`.

Server to client, in order: :class:`Ready`, then any number of :class:`SpeechStartedMessage`,
:class:`SpeechEndedMessage`, :class:`PartialMessage`, :class:`FinalMessage` and :class:`ErrorMessage`, and last
:class:`Done` (on a clean end) or an :class:`ErrorMessage` followed by an error close.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import numpy as np

from streamer.core.audio import AudioFormat, Encoding
from streamer.core.container import ContainerEncoding
from streamer.core.errors import ConfigError, FrameTooLarge, MalformedMessage, UnsupportedAudio
from streamer.engine.types import DecodeOptions

__all__ = [
    "LISTEN_PATH",
    "MAX_JSON_DEPTH",
    "MAX_TEXT_FRAME_CHARS",
    "PROTOCOL_VERSION",
    "ClientMessage",
    "Configure",
    "Done",
    "End",
    "ErrorMessage",
    "FinalMessage",
    "Finalize",
    "KeepAlive",
    "LatencySummary",
    "ListenParams",
    "LostRange",
    "PartialMessage",
    "Percentiles",
    "Ready",
    "ResumeHint",
    "ResumeRequest",
    "ServerMessage",
    "SpeechEndedMessage",
    "SpeechStartedMessage",
    "WordMessage",
    "check_prompt",
    "json_depth",
    "parse_client_message",
    "parse_json_object",
    "parse_listen_query",
    "parse_resume_query",
    "parse_server_message",
    "serialize",
    "serialize_client_message",
    "split_keywords",
]

PROTOCOL_VERSION = "v1"
LISTEN_PATH = "/v1/listen"


# ---------------------------------------------------------------------------------------------------------------------
# The query string of the opening handshake


@dataclass(frozen=True)
class ListenParams:
    """What the client declared in the query string of ``/v1/listen``. Build with :func:`parse_listen_query`."""

    # rate of the audio the client sends, in Hz; the server resamples to 16 kHz. Ignored for a container
    sample_rate: int = 16000
    # how each sample is encoded in the binary frames, or a container (WebM, Ogg, WAV) that says it itself
    encoding: Encoding | ContainerEncoding = Encoding.PCM_S16LE
    # 1, or 2 for interleaved stereo with one transcript per channel (a container: mixed down to mono for 1; for 2
    # it must be stereo)
    channels: int = 1
    # ISO 639-1 code; None lets a multilingual model detect it
    language: str | None = None
    # the session's prompt: text every window is conditioned on (a domain, names, a spelling style)
    prompt: str = ""
    # words and names whose spelling decoding favours (``keywords=a,b``, or the parameter repeated)
    keywords: tuple[str, ...] = ()

    @property
    def container(self) -> ContainerEncoding | None:
        """The container the client declared, or None for raw samples."""
        return self.encoding if isinstance(self.encoding, ContainerEncoding) else None

    @property
    def audio_format(self) -> AudioFormat:
        """The raw samples' format (a container's comes from the container: use :attr:`container` first)."""
        encoding = Encoding.PCM_S16LE if isinstance(self.encoding, ContainerEncoding) else self.encoding
        return AudioFormat(encoding=encoding, sample_rate=self.sample_rate, channels=self.channels)

    def validate(self) -> None:
        """Raise :class:`~streamer.core.errors.UnsupportedAudio` naming the first value the server cannot accept."""
        if self.container is None:
            self.audio_format.validate()
        elif self.channels not in (1, 2):
            raise UnsupportedAudio(f"channels {self.channels!r} is not supported; use 1 or 2")
        if self.language is not None and not (2 <= len(self.language) <= 3 and self.language.isalpha()):
            raise UnsupportedAudio(f"language must be an ISO 639-1 code such as 'en', not {self.language!r}")
        try:
            check_prompt(self.prompt, self.keywords)
        except ConfigError as error:
            raise UnsupportedAudio(str(error)) from None

    def to_query(self) -> str:
        """The query string a client sends, without the leading ``?``."""
        pairs: list[tuple[str, str]] = [
            ("sample_rate", str(self.sample_rate)),
            ("encoding", self.encoding.value),
            ("channels", str(self.channels)),
        ]
        if self.language is not None:
            pairs.append(("language", self.language))
        if self.prompt:
            pairs.append(("prompt", self.prompt))
        # one parameter per keyword (a comma inside a value separates keywords too, so keywords hold none)
        pairs.extend(("keywords", keyword) for keyword in self.keywords)
        return urlencode(pairs)


def check_prompt(prompt: str, keywords: Sequence[str]) -> None:
    """Raise :class:`~streamer.core.errors.ConfigError` naming what is wrong with a session's prompt or keywords:
    the bounds are :class:`~streamer.engine.types.DecodeOptions`', checked there. The caller re-raises it as its
    protocol's error (``unsupported_audio`` for the query, ``bad_message`` for ``configure``)."""
    replace(DecodeOptions(), initial_prompt=prompt, keywords=tuple(keywords)).validate()


def split_keywords(values: Sequence[str]) -> tuple[str, ...]:
    """Keywords from query values, each a keyword or a comma-separated list of them: stripped, empties dropped."""
    return tuple(k.strip() for value in values for k in value.split(",") if k.strip())


_QUERY_KEYS = ("sample_rate", "encoding", "channels", "language", "prompt", "keywords")
# the query parameters that may be given more than once
_REPEATABLE_QUERY_KEYS = ("keywords",)
# query parameters of the handshake that are not about audio: consumed by the authenticator (streamer.server.auth) and
# by parse_resume_query
_IGNORED_QUERY_KEYS = ("token", "resume", "last_seq")


def _int_param(name: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise UnsupportedAudio(f"{name} must be an integer, not {value!r}") from None


def parse_listen_query(path: str) -> ListenParams:
    """Parse the request target of the opening handshake (``/v1/listen?sample_rate=...``).

    Call once the path is known to be :data:`LISTEN_PATH`. Raises :class:`~streamer.core.errors.UnsupportedAudio`
    (close 4415) for a missing-or-bad value or an unknown parameter; the caller sends the ``error`` message and
    closes. Omitted parameters take the defaults of :class:`ListenParams`.
    """
    pairs = parse_qsl(urlsplit(path).query, keep_blank_values=True)
    values: dict[str, str] = {}
    keywords: list[str] = []
    for key, value in pairs:
        if key in _IGNORED_QUERY_KEYS:
            continue
        if key not in _QUERY_KEYS:
            raise UnsupportedAudio(f"unknown query parameter {key!r}; expected one of {', '.join(_QUERY_KEYS)}")
        if key == "keywords":
            keywords.append(value)
            continue
        if key in values:
            raise UnsupportedAudio(f"query parameter {key!r} is given twice")
        values[key] = value
    defaults = ListenParams()
    name = values.get("encoding", defaults.encoding.value)
    encodings: tuple[Encoding | ContainerEncoding, ...] = (*Encoding, *ContainerEncoding)
    encoding = next((e for e in encodings if e.value == name), None)
    if encoding is None:
        allowed = ", ".join(e.value for e in encodings)
        raise UnsupportedAudio(f"encoding must be one of {allowed}, not {name!r}")
    params = ListenParams(
        sample_rate=_int_param("sample_rate", values["sample_rate"]) if "sample_rate" in values else 16000,
        encoding=encoding,
        channels=_int_param("channels", values["channels"]) if "channels" in values else 1,
        language=values.get("language") or None,
        prompt=values.get("prompt", "").strip(),
        keywords=split_keywords(keywords),
    )
    params.validate()
    return params


@dataclass(frozen=True)
class ResumeRequest:
    """``?resume=<session_id>&last_seq=<n>``: continue a session whose connection dropped. Build with
    :func:`parse_resume_query`."""

    # the session_id of the first connection's `ready`
    session_id: str
    # the seq of the last final the client received (0: none); the server replays every final after it
    last_seq: int


def parse_resume_query(path: str) -> ResumeRequest | None:
    """The resume request in a handshake's target, or None when it has no ``resume`` parameter. Raises
    :class:`~streamer.core.errors.UnsupportedAudio` (close 4415, like any bad query parameter) when ``resume`` is not a
    session id or ``last_seq`` is not a non-negative integer. The audio parameters of a resume are the first
    connection's; any given again are ignored."""
    values = dict(parse_qsl(urlsplit(path).query, keep_blank_values=True))
    if "resume" not in values:
        return None
    session_id = values["resume"]
    if not (1 <= len(session_id) <= 64 and session_id.isascii() and session_id.isalnum()):
        raise UnsupportedAudio("resume must be the session_id of an earlier ready message")
    last_seq = values.get("last_seq", "0")
    if not (last_seq.isascii() and last_seq.isdigit() and len(last_seq) <= 12):
        raise UnsupportedAudio(f"last_seq must be a non-negative integer, not {last_seq!r}")
    return ResumeRequest(session_id=session_id, last_seq=int(last_seq))


# ---------------------------------------------------------------------------------------------------------------------
# JSON from clients, parsed within bounds (every endpoint: /v1/listen, /twilio, /v1/realtime)

# Nesting of arrays and objects a client message may have ({} is 1). The deepest message any endpoint takes is a
# Realtime session.update, 5 ({session: {audio: {input: {format: {...}}}}}); 16 leaves room for fields we ignore
# while keeping the parser, which recurses once per level, far from Python's recursion limit (issue 14: a frame of
# 1000 '[' raised RecursionError, close 1011 and a traceback).
MAX_JSON_DEPTH = 16

_JSON_WHITESPACE = re.compile(r"[ \t\n\r]*")  # RFC 8259 section 2
# A string (RFC 8259 section 7), or an unterminated one up to the end. Possessive, and matching at every '"', so
# the substitution below is one pass without backtracking; brackets inside strings are not nesting.
_JSON_STRING = re.compile(r'"[^"\\]*+(?:\\.[^"\\]*+)*+(?:"|\\?\Z)', re.DOTALL)
_NESTING_STEP = np.zeros(256, dtype=np.int8)  # per byte outside strings: +1 opens a level, -1 closes one
_NESTING_STEP[[ord("["), ord("{")]] = 1
_NESTING_STEP[[ord("]"), ord("}")]] = -1
_DEPTH_BLOCK = 1 << 16  # bytes counted at a time: the running levels take 512 KiB whatever the text's length
_KIND_BY_FIRST_CHAR = {"[": "list", '"': "str", "t": "bool", "f": "bool", "n": "null"} | dict.fromkeys(
    "-0123456789", "number"
)


def json_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in ``text`` (0 for a scalar), found without parsing it: brackets
    are counted outside strings in one linear pass, in about 2 bytes per character plus a fixed block. For text
    that is not JSON the count is at least as deep as any a JSON parser would reach before it fails."""
    skeleton = _JSON_STRING.sub("", text).encode("utf-8", "surrogatepass")
    level = deepest = 0
    for start in range(0, len(skeleton), _DEPTH_BLOCK):
        codes = np.frombuffer(skeleton, dtype=np.uint8, count=min(_DEPTH_BLOCK, len(skeleton) - start), offset=start)
        levels = np.cumsum(_NESTING_STEP[codes], dtype=np.int64) + level
        deepest = max(deepest, int(levels.max()))
        level = int(levels[-1])
    return deepest


def parse_json_object(text: str, what: str = "text frames") -> dict[str, Any]:
    """Parse a client's text frame, which must hold one JSON object; ``what`` names the frames in error messages.

    Raises :class:`~streamer.core.errors.MalformedMessage` (``bad_message``, close 4400) for text that is not JSON, a
    top level other than an object, or nesting deeper than :data:`MAX_JSON_DEPTH`. The last two are checked before
    parsing, in time and memory linear in the text, so that no frame makes the parser recurse past that depth. The
    caller checks the frame's length first."""
    leading = _JSON_WHITESPACE.match(text)
    at = leading.end() if leading else 0
    first = text[at : at + 1]
    if first != "{":
        kind = _KIND_BY_FIRST_CHAR.get(first)
        if kind is None:
            raise MalformedMessage(f"{what} must be JSON objects: not JSON")
        raise MalformedMessage(f"{what} must be JSON objects, not {kind}")
    depth = json_depth(text)
    if depth > MAX_JSON_DEPTH:
        raise MalformedMessage(f"{what} may nest arrays and objects {MAX_JSON_DEPTH} deep, this one {depth}")
    try:
        # text that starts with '{' parses to an object or not at all ("Extra data" after one)
        data: dict[str, Any] = json.loads(text)
    except json.JSONDecodeError as error:
        raise MalformedMessage(f"{what} must be JSON objects: {error.msg} at position {error.pos}") from None
    except ValueError:  # a number of more digits than Python converts (sys.get_int_max_str_digits)
        raise MalformedMessage(f"{what} must be JSON objects: a number is too long") from None
    return data


# ---------------------------------------------------------------------------------------------------------------------
# Client to server text frames

# control messages are a few dozen characters, a configure at most about 6000 (the longest prompt and 100 of the
# longest keywords, as UTF-8): anything much longer is refused before it is parsed
MAX_TEXT_FRAME_CHARS = 16384


@dataclass(frozen=True)
class Finalize:
    """Commit everything received so far as finals now, without waiting for a pause; the stream goes on."""


@dataclass(frozen=True)
class End:
    """No more audio: the server sends every final, then ``done``, then closes with 1000."""


@dataclass(frozen=True)
class KeepAlive:
    """Resets the idle timeout while the client has no audio to send."""


@dataclass(frozen=True)
class Configure:
    """Change the session's prompt and keywords: every window decoded from now on uses them (a window already being
    decoded keeps the old ones). A field left out of the message keeps its value."""

    prompt: str | None = None
    keywords: tuple[str, ...] | None = None


ClientMessage = Finalize | End | KeepAlive | Configure

_CLIENT_TYPES: dict[str, ClientMessage] = {"finalize": Finalize(), "end": End(), "keepalive": KeepAlive()}
_CONFIGURE_FIELDS = ("prompt", "keywords")


def _parse_configure(data: dict[str, Any]) -> Configure:
    extra = sorted(set(data) - {"type", *_CONFIGURE_FIELDS})
    if extra:
        raise MalformedMessage(f"unexpected fields in 'configure' message: {', '.join(extra)}")
    prompt = data.get("prompt")
    if prompt is not None and not isinstance(prompt, str):
        raise MalformedMessage("configure: prompt must be a string")
    keywords = data.get("keywords")
    if keywords is not None and not (isinstance(keywords, list) and all(isinstance(k, str) for k in keywords)):
        raise MalformedMessage("configure: keywords must be a list of strings")
    message = Configure(
        prompt=None if prompt is None else prompt.strip(),
        keywords=None if keywords is None else tuple(k.strip() for k in keywords if k.strip()),
    )
    try:
        check_prompt(message.prompt or "", message.keywords or ())
    except ConfigError as error:
        raise MalformedMessage(f"configure: {error}") from None
    return message


def parse_client_message(text: str) -> ClientMessage:
    """Parse one text frame from a client; raise :class:`~streamer.core.errors.MalformedMessage` (close 4400) saying
    what is wrong with it, or :class:`~streamer.core.errors.FrameTooLarge` (close 1009) for a frame over
    :data:`MAX_TEXT_FRAME_CHARS`, checked before any parsing."""
    if len(text) > MAX_TEXT_FRAME_CHARS:
        raise FrameTooLarge(f"text frames may hold at most {MAX_TEXT_FRAME_CHARS} characters, this one {len(text)}")
    data = parse_json_object(text)
    kind = data.get("type")
    if not isinstance(kind, str):
        raise MalformedMessage('a text frame needs a string "type" field')
    if kind == "configure":
        return _parse_configure(data)
    message = _CLIENT_TYPES.get(kind)
    if message is None:
        allowed = ", ".join(repr(k) for k in (*_CLIENT_TYPES, "configure"))
        raise MalformedMessage(f"unknown message type {kind!r}; expected one of {allowed}")
    extra = sorted(set(data) - {"type"})
    if extra:
        raise MalformedMessage(f"unexpected fields in {kind!r} message: {', '.join(extra)}")
    return message


def serialize_client_message(message: ClientMessage) -> str:
    """The text frame a client sends for ``message``."""
    if isinstance(message, Configure):
        data: dict[str, Any] = {"type": "configure"}
        if message.prompt is not None:
            data["prompt"] = message.prompt
        if message.keywords is not None:
            data["keywords"] = list(message.keywords)
        return json.dumps(data, ensure_ascii=False)
    kind = next(k for k, v in _CLIENT_TYPES.items() if v == message)
    return json.dumps({"type": kind})


# ---------------------------------------------------------------------------------------------------------------------
# Server to client text frames. Times are seconds of stream time (16 kHz samples / 16000) from the stream start.


@dataclass(frozen=True)
class WordMessage:
    word: str
    start: float
    end: float
    probability: float


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
    # record in Redis has every final before it: see docs/protocol.md, Resume)
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
class Done:
    """Last message before a normal close (1000). Seconds are summed over channels, so that
    ``audio_seconds_transcribed + non_speech_seconds + lost_seconds == audio_seconds_received``."""

    audio_seconds_received: float
    audio_seconds_transcribed: float
    non_speech_seconds: float
    lost_seconds: float
    latency: LatencySummary
    type: str = "done"


ServerMessage = Ready | SpeechStartedMessage | SpeechEndedMessage | PartialMessage | FinalMessage | ErrorMessage | Done


def _to_json(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_to_json(v) for v in value]
    if hasattr(value, "__dataclass_fields__"):
        return {name: _to_json(getattr(value, name)) for name in value.__dataclass_fields__}
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
            return Done(**fields)
    except (ValueError, KeyError, TypeError) as error:
        raise MalformedMessage(f"not a v1 server message: {error}") from None
    raise MalformedMessage(f"unknown server message type {kind!r}")
