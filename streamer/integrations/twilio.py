"""Twilio Media Streams, sans-I/O: the messages, the request signature, and one call's audio timeline per track.

Twilio opens a WebSocket to ``/twilio`` and sends JSON text frames (Twilio's "Media Streams - WebSocket
Messages" reference): ``connected``, ``start`` (``streamSid``, ``callSid``, ``tracks``, ``customParameters``,
``mediaFormat`` = ``audio/x-mulaw`` at 8000 Hz mono), then ``media`` (``track``, ``chunk``, ``timestamp`` in ms from
the start of the stream, base64 mu-law ``payload`` of about 20 ms), ``dtmf``, ``mark``, and last ``stop``. Numbers
arrive as strings. :func:`parse_message` turns a frame into one of the dataclasses below.

:class:`CallTimeline` places each track's media on its own clock: a chunk whose timestamp lies past the end of the
audio so far means lost packets, and the gap is filled with silence so that stream time stays true to call time
(counted in :class:`TrackStats`), up to :data:`MAX_GAP_MS`; a longer jump is refused with
:class:`~streamer.core.errors.MediaGapTooLong`. A chunk that overlaps audio already placed is trimmed (late or
duplicate). Missing ``sequenceNumber`` values are counted too.

:func:`twilio_signature` / :func:`signature_matches` implement Twilio's request validation: base64 of HMAC-SHA1,
keyed with the account's auth token, over the full URL followed by the sorted POST parameters (none for the
WebSocket GET).

:func:`recorded_messages` is the reverse, for replay tools and tests: audio to the messages Twilio would send.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import numpy.typing as npt

from streamer.core.audio import decode_mulaw, encode_mulaw
from streamer.core.errors import InvalidState, MalformedMessage, MediaGapTooLong, UnsupportedAudio
from streamer.server.bounded_json import parse_json_object

__all__ = [
    "LABEL_PARAMETERS",
    "MAX_GAP_MS",
    "MAX_LABEL_CHARS",
    "TWILIO_PATH",
    "TWILIO_RATE",
    "CallTimeline",
    "Connected",
    "Dtmf",
    "Mark",
    "Media",
    "PlacedAudio",
    "Start",
    "Stop",
    "TrackName",
    "TrackStats",
    "TwilioMessage",
    "parse_message",
    "recorded_messages",
    "signature_matches",
    "track_labels",
    "twilio_signature",
]

TWILIO_PATH = "/twilio"
TWILIO_RATE = 8000  # Media Streams always carry 8 kHz mu-law
_SAMPLES_PER_MS = TWILIO_RATE // 1000
CHUNK_MS = 20  # Twilio sends 20 ms of audio per media message (160 bytes)
# a media message is about 300 characters (216 of base64) and a start message a few KiB with custom parameters:
# longer frames are refused before any JSON or base64 decoding
MAX_MESSAGE_CHARS = 64 * 1024
# Longest gap in a track's media filled with silence. Twilio sends media continuously, silence included, 20 ms per
# message: a gap is lost messages, a few frames of packet loss. The silence costs memory and VAD time while the
# message asking for it is a hundred bytes, so each gap is bounded (issue 14: one media message with "timestamp":
# "1000000" cost 14 GiB, 1000 s of zeros then resampled). 10 s is /twilio's idle timeout: a stream that sent nothing
# for longer would have been closed. A longer jump is refused (MediaGapTooLong, close 4400), not filled in part: it
# is no loss a call has, and a partial fill would leave the track's clock behind the call's for good.
MAX_GAP_MS = 10_000


class TrackName(StrEnum):
    """Twilio's tracks, and who speaks on each in a contact-centre call."""

    INBOUND = "inbound"  # audio from the caller to Twilio: the customer
    OUTBOUND = "outbound"  # audio Twilio sends to the caller: the agent (or IVR)

    @property
    def label(self) -> str:
        """Who speaks on the track unless the stream says otherwise (:func:`track_labels`)."""
        return "customer" if self is TrackName.INBOUND else "agent"


# The custom parameters (TwiML <Parameter name=... value=...> of the <Stream>) that name who speaks on a track, for a
# call where the inbound track is not a customer (an outbound campaign: the callee; an agent's own leg: the agent)
LABEL_PARAMETERS = {TrackName.INBOUND: "inbound_label", TrackName.OUTBOUND: "outbound_label"}
MAX_LABEL_CHARS = 64


# ---------------------------------------------------------------------------------------------------------------------
# Messages


@dataclass(frozen=True)
class Connected:
    protocol: str
    version: str


@dataclass(frozen=True)
class Start:
    sequence_number: int
    stream_sid: str
    call_sid: str
    account_sid: str
    tracks: tuple[TrackName, ...]
    custom_parameters: Mapping[str, str]
    encoding: str  # always audio/x-mulaw today; checked by CallTimeline
    sample_rate: int
    channels: int


@dataclass(frozen=True)
class Media:
    sequence_number: int
    track: TrackName
    chunk: int  # per track, from 1
    timestamp_ms: int  # from the start of the stream
    payload: bytes  # mu-law bytes, one per sample


@dataclass(frozen=True)
class Dtmf:
    sequence_number: int
    track: TrackName
    digit: str  # one of 0-9 * # A-D


@dataclass(frozen=True)
class Mark:
    sequence_number: int
    name: str


@dataclass(frozen=True)
class Stop:
    sequence_number: int
    call_sid: str


TwilioMessage = Connected | Start | Media | Dtmf | Mark | Stop


_DTMF_DIGITS = "0123456789*#ABCD"  # the sixteen DTMF keys (ITU-T Q.23)


def _get(obj: Mapping[str, Any], key: str, where: str) -> Any:
    if not isinstance(obj, Mapping) or key not in obj:
        raise MalformedMessage(f"Twilio {where} message lacks {key!r}")
    return obj[key]


def _int(value: Any, name: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: Infinity, which Python's json reads as a float
        raise MalformedMessage(f"Twilio field {name!r} must be an integer, not {value!r}") from None


def _track(value: Any) -> TrackName:
    # dtmf messages say "inbound_track"; media messages say "inbound"
    text = str(value).removesuffix("_track")
    try:
        return TrackName(text)
    except ValueError:
        raise MalformedMessage(f"unknown Twilio track {value!r}; expected inbound or outbound") from None


def parse_message(frame: str | bytes) -> TwilioMessage | None:
    """Parse one text frame. Returns None for an event this server ignores; raises
    :class:`~streamer.core.errors.MalformedMessage` for a frame that is not a Twilio message (binary frames, and text
    over :data:`MAX_MESSAGE_CHARS`, are refused before they are decoded)."""
    if not isinstance(frame, str):
        raise MalformedMessage("Twilio frames must be JSON text, not binary")
    if len(frame) > MAX_MESSAGE_CHARS:
        raise MalformedMessage(f"Twilio messages are at most {MAX_MESSAGE_CHARS} characters, this one {len(frame)}")
    data = parse_json_object(frame, "Twilio messages")
    if not isinstance(data.get("event"), str):
        raise MalformedMessage("a Twilio message is a JSON object with an 'event'")
    event = data["event"]
    try:
        return _parse_event(event, data)
    except (AttributeError, TypeError, ValueError, KeyError):
        # a field of the wrong JSON type where an object or a list belongs (found by tests/reliability/test_fuzz.py)
        raise MalformedMessage(f"Twilio {event} message has fields of the wrong type") from None


def _parse_event(event: str, data: dict[str, Any]) -> TwilioMessage | None:
    seq = _int(data.get("sequenceNumber", 0), "sequenceNumber")
    if event == "connected":
        return Connected(str(data.get("protocol", "")), str(data.get("version", "")))
    if event == "start":
        start = _get(data, "start", "start")
        fmt = _get(start, "mediaFormat", "start")
        tracks = tuple(_track(t) for t in start.get("tracks", ["inbound"]))
        params = start.get("customParameters") or {}
        return Start(
            sequence_number=seq,
            stream_sid=str(data.get("streamSid") or _get(start, "streamSid", "start")),
            call_sid=str(_get(start, "callSid", "start")),
            account_sid=str(start.get("accountSid", "")),
            tracks=tracks or (TrackName.INBOUND,),
            custom_parameters={str(k): str(v) for k, v in params.items()} if isinstance(params, dict) else {},
            encoding=str(_get(fmt, "encoding", "start.mediaFormat")),
            sample_rate=_int(_get(fmt, "sampleRate", "start.mediaFormat"), "sampleRate"),
            channels=_int(fmt.get("channels", 1), "channels"),
        )
    if event == "media":
        media = _get(data, "media", "media")
        try:
            payload = base64.b64decode(_get(media, "payload", "media"), validate=True)
        except (binascii.Error, TypeError, ValueError):
            raise MalformedMessage("Twilio media payload is not base64") from None
        return Media(
            sequence_number=seq,
            track=_track(media.get("track", "inbound")),
            chunk=_int(media.get("chunk", 0), "chunk"),
            timestamp_ms=_int(_get(media, "timestamp", "media"), "timestamp"),
            payload=payload,
        )
    if event == "dtmf":
        dtmf = _get(data, "dtmf", "dtmf")
        digit = str(_get(dtmf, "digit", "dtmf"))
        if len(digit) != 1 or digit not in _DTMF_DIGITS:
            raise MalformedMessage(f"Twilio dtmf digit must be one of {_DTMF_DIGITS}, not {digit[:16]!r}")
        return Dtmf(seq, _track(dtmf.get("track", "inbound_track")), digit)
    if event == "mark":
        return Mark(seq, str(_get(_get(data, "mark", "mark"), "name", "mark")))
    if event == "stop":
        stop = data.get("stop") or {}
        return Stop(seq, str(stop.get("callSid", "")) if isinstance(stop, dict) else "")
    return None


def track_labels(start: Start) -> dict[TrackName, str]:
    """Who speaks on each track of the stream: :attr:`TrackName.label`, unless the stream's ``customParameters``
    name it (:data:`LABEL_PARAMETERS`: ``inbound_label``, ``outbound_label``). Raises
    :class:`~streamer.core.errors.MalformedMessage` for a label that is blank or longer than
    :data:`MAX_LABEL_CHARS`."""
    labels = {}
    for track in start.tracks:
        given = start.custom_parameters.get(LABEL_PARAMETERS[track])
        if given is None:
            labels[track] = track.label
            continue
        label = given.strip()
        if not 0 < len(label) <= MAX_LABEL_CHARS or not label.isprintable():
            raise MalformedMessage(
                f"customParameters {LABEL_PARAMETERS[track]} must be 1 to {MAX_LABEL_CHARS} printable characters"
            )
        labels[track] = label
    return labels


# ---------------------------------------------------------------------------------------------------------------------
# Request validation


def twilio_signature(auth_token: str, url: str, params: Mapping[str, str] | None = None) -> str:
    """The ``X-Twilio-Signature`` Twilio computes: base64(HMAC-SHA1(auth token, URL + sorted key+value pairs))."""
    fields = params or {}
    data = url + "".join(f"{key}{fields[key]}" for key in sorted(fields))
    digest = hmac.new(auth_token.encode(), data.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode()


def _url_variants(url: str) -> Iterator[str]:
    # Twilio signs the URL as configured; a proxy may add or drop the default port (as Twilio's own helper libraries
    # try both forms)
    yield url
    parts = urlsplit(url)
    default = {"https": 443, "wss": 443, "http": 80, "ws": 80}.get(parts.scheme)
    host = parts.hostname or ""
    if parts.port is None and default is not None:
        yield urlunsplit((parts.scheme, f"{host}:{default}", parts.path, parts.query, parts.fragment))
    elif parts.port == default:
        yield urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


def signature_matches(auth_token: str, url: str, signature: str | None) -> bool:
    """Whether ``signature`` is Twilio's for ``url`` (compared in constant time)."""
    if not signature:
        return False
    return any(hmac.compare_digest(twilio_signature(auth_token, u), signature) for u in _url_variants(url))


# ---------------------------------------------------------------------------------------------------------------------
# The timeline of one call


@dataclass
class TrackStats:
    """What a track's media looked like; reported in logs and in the call's ``call_ended`` event."""

    chunks: int = 0
    samples: int = 0  # placed, at 8 kHz, silence included
    gaps: int = 0  # times a chunk started after the end of the audio so far
    gap_samples: int = 0  # silence inserted for them
    late_samples: int = 0  # samples dropped because they overlapped audio already placed
    missing_sequence_numbers: int = 0  # messages of the whole stream never seen (counted on the track they arrived)


@dataclass(frozen=True)
class PlacedAudio:
    """Samples (8 kHz float32) to append to ``track``: possibly silence for a gap, then the chunk's audio."""

    track: TrackName
    start: int  # where the samples begin on the track's clock (8 kHz samples from the start of the stream)
    samples: npt.NDArray[np.float32]
    gap_samples: int  # how many of the leading samples are inserted silence


@dataclass
class CallTimeline:
    """One Media Stream's audio, placed on each track's clock. Feed every parsed message to :meth:`receive`."""

    # a chunk this far past the end of the audio so far is a gap (jitter below it is ignored)
    gap_tolerance_ms: int = 2
    start: Start | None = None
    stopped: bool = False
    stats: dict[TrackName, TrackStats] = field(default_factory=dict)
    _last_sequence: int = 0

    def receive(self, message: TwilioMessage) -> PlacedAudio | None:
        """Update the timeline; for a ``media`` message, the audio to append to its track. Raises
        :class:`~streamer.core.errors.MediaGapTooLong` for media more than :data:`MAX_GAP_MS` past the track's audio so
        far (nothing is placed; the caller ends the stream), :class:`~streamer.core.errors.MalformedMessage` for media
        out of order with start or stop."""
        if self.stopped:
            raise InvalidState("the stream has stopped")
        if isinstance(message, Start):
            self._receive_start(message)
            return None
        self._sequence(message)
        if isinstance(message, Stop):
            self.stopped = True
            return None
        if not isinstance(message, Media):
            return None
        if self.start is None:
            raise MalformedMessage("Twilio sent media before start")
        stats = self.stats.get(message.track)
        if stats is None:
            raise MalformedMessage(f"Twilio sent {message.track} media, but start named only {self.start.tracks}")
        return self._place(message, stats)

    def _receive_start(self, start: Start) -> None:
        if self.start is not None:
            raise MalformedMessage("Twilio sent start twice")
        if start.encoding != "audio/x-mulaw" or start.sample_rate != TWILIO_RATE or start.channels != 1:
            raise UnsupportedAudio(
                f"Media Streams carry audio/x-mulaw at 8000 Hz mono, not {start.encoding} at {start.sample_rate} Hz "
                f"with {start.channels} channels"
            )
        self.start = start
        self.stats = {track: TrackStats() for track in start.tracks}
        self._last_sequence = start.sequence_number

    def _sequence(self, message: TwilioMessage) -> None:
        seq = getattr(message, "sequence_number", 0)
        if not seq:
            return
        if seq > self._last_sequence + 1 and self._last_sequence and isinstance(message, Media):
            self.stats[message.track].missing_sequence_numbers += seq - self._last_sequence - 1
        self._last_sequence = max(self._last_sequence, seq)

    def _place(self, media: Media, stats: TrackStats) -> PlacedAudio:
        at = media.timestamp_ms * _SAMPLES_PER_MS  # where this chunk belongs on the track's clock
        if at - stats.samples > MAX_GAP_MS * _SAMPLES_PER_MS:
            # refused before anything of the gap's size exists
            raise MediaGapTooLong(
                f"Twilio {media.track} media at {media.timestamp_ms} ms leaves a gap of "
                f"{media.timestamp_ms - stats.samples // _SAMPLES_PER_MS} ms after the track's audio so far; "
                f"at most {MAX_GAP_MS} ms of lost media is filled with silence"
            )
        audio = decode_mulaw(media.payload)
        stats.chunks += 1
        gap = 0
        if at > stats.samples + self.gap_tolerance_ms * _SAMPLES_PER_MS:
            gap = at - stats.samples
            stats.gaps += 1
            stats.gap_samples += gap
        elif at < stats.samples:
            overlap = min(stats.samples - at, len(audio))
            stats.late_samples += overlap
            audio = audio[overlap:]
        samples = np.concatenate([np.zeros(gap, dtype=np.float32), audio]) if gap else audio
        placed = PlacedAudio(media.track, stats.samples, samples, gap)
        stats.samples += len(samples)
        return placed


# ---------------------------------------------------------------------------------------------------------------------
# Recording: audio to messages (replay tools, tests)


def recorded_messages(
    tracks: Mapping[TrackName, npt.NDArray[np.float32]],
    *,
    call_sid: str = "CA00000000000000000000000000000000",
    stream_sid: str = "MZ00000000000000000000000000000000",
    custom_parameters: Mapping[str, str] | None = None,
    drop_chunks: frozenset[int] = frozenset(),
    dtmf: Mapping[int, str] | None = None,
) -> Iterator[dict[str, Any]]:
    """The messages Twilio would send for ``tracks`` (8 kHz float audio per track), in Twilio's order: connected,
    start, media of every track interleaved 20 ms at a time, stop. Chunk numbers in ``drop_chunks`` (per track, from
    1) are left out, as lost packets would be, for testing gap handling. ``dtmf`` maps a chunk number to a key
    pressed on the inbound track: its ``dtmf`` message follows that chunk's media."""
    seq = 0

    def next_seq() -> str:
        nonlocal seq
        seq += 1
        return str(seq)

    account = "AC00000000000000000000000000000000"
    yield {"event": "connected", "protocol": "Call", "version": "1.0.0"}
    yield {
        "event": "start",
        "sequenceNumber": next_seq(),
        "start": {
            "accountSid": account,
            "streamSid": stream_sid,
            "callSid": call_sid,
            "tracks": [t.value for t in tracks],
            "customParameters": dict(custom_parameters or {}),
            "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": TWILIO_RATE, "channels": 1},
        },
        "streamSid": stream_sid,
    }
    step = CHUNK_MS * _SAMPLES_PER_MS
    longest = max((len(a) for a in tracks.values()), default=0)
    for index, offset in enumerate(range(0, longest, step)):
        for track, audio in tracks.items():
            piece = audio[offset : offset + step]
            if not len(piece):
                continue
            sequence = next_seq()
            if index + 1 in drop_chunks:
                continue
            yield {
                "event": "media",
                "sequenceNumber": sequence,
                "media": {
                    "track": track.value,
                    "chunk": str(index + 1),
                    "timestamp": str(offset // _SAMPLES_PER_MS),
                    "payload": base64.b64encode(encode_mulaw(piece)).decode(),
                },
                "streamSid": stream_sid,
            }
        if dtmf and index + 1 in dtmf:
            yield {
                "event": "dtmf",
                "sequenceNumber": next_seq(),
                "dtmf": {"track": "inbound_track", "digit": dtmf[index + 1]},
                "streamSid": stream_sid,
            }
    yield {
        "event": "stop",
        "sequenceNumber": next_seq(),
        "stop": {"accountSid": account, "callSid": call_sid},
        "streamSid": stream_sid,
    }
