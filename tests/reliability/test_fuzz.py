"""Property-based fuzzing of every decoder of client input: whatever the bytes, each either parses or raises one of
its documented errors (a :class:`~streamer.core.errors.ProtocolError` subclass; the Realtime API's
:class:`~streamer.integrations.realtime.InvalidRequest`), never anything else."""

from __future__ import annotations

import contextlib
import functools
import json
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamer.core.audio import AudioFormat, Encoding, WireDecoder
from streamer.core.container import ContainerDecoder
from streamer.core.errors import BadContainer, ProtocolError
from streamer.integrations.realtime import InvalidRequest, TranscriptionConfig, parse_client_event
from streamer.integrations.twilio import parse_message
from streamer.server.client_messages import parse_client_message
from streamer.server.listen_query import parse_listen_query, parse_resume_query
from tests.reliability.tally import TALLY

pytestmark = pytest.mark.reliability

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# JSON values, nested, with the keys the parsers look for so that the fuzz gets past the first check
KEYS = st.sampled_from(
    [
        "type",
        "event",
        "start",
        "media",
        "payload",
        "track",
        "timestamp",
        "mediaFormat",
        "encoding",
        "sampleRate",
        "channels",
        "tracks",
        "callSid",
        "streamSid",
        "customParameters",
        "sequenceNumber",
        "chunk",
        "stop",
        "mark",
        "name",
        "dtmf",
        "digit",
        "session",
        "audio",
        "input",
        "format",
        "rate",
        "transcription",
        "turn_detection",
        "language",
        "prompt",
        "model",
        "silence_duration_ms",
        "input_audio_format",
        "input_audio_transcription",
        "event_id",
        "x",
    ]  # fmt: skip
)
SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20)
VALUES = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=6), max_leaves=20
)
TYPES = st.sampled_from(
    [
        "finalize",
        "end",
        "keepalive",
        "connected",
        "start",
        "media",
        "dtmf",
        "mark",
        "stop",
        "session.update",
        "transcription_session.update",
        "input_audio_buffer.append",
        "input_audio_buffer.commit",
        "input_audio_buffer.clear",
        "unknown",
    ]  # fmt: skip
)


@st.composite
def messages(draw: st.DrawFn) -> str:
    """A JSON object with a plausible type or event and random fields."""
    body: dict[str, Any] = draw(st.dictionaries(KEYS, VALUES, max_size=6))
    body[draw(st.sampled_from(["type", "event"]))] = draw(TYPES)
    return json.dumps(body)


TEMPLATES: list[dict[str, Any]] = [
    {"event": "connected", "protocol": "Call", "version": "1.0.0"},
    {
        "event": "start",
        "sequenceNumber": "1",
        "streamSid": "MZ1",
        "start": {
            "streamSid": "MZ1",
            "callSid": "CA1",
            "accountSid": "AC1",
            "tracks": ["inbound", "outbound"],
            "customParameters": {"a": "b"},
            "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
        },
    },
    {
        "event": "media",
        "sequenceNumber": "3",
        "media": {"track": "inbound", "chunk": "1", "timestamp": "5", "payload": "AAAA"},
    },  # fmt: skip
    {"event": "dtmf", "sequenceNumber": "4", "dtmf": {"track": "inbound_track", "digit": "1"}},
    {"event": "mark", "sequenceNumber": "5", "mark": {"name": "m"}},
    {"event": "stop", "sequenceNumber": "6", "stop": {"callSid": "CA1"}},
    {
        "type": "session.update",
        "event_id": "e1",
        "session": {
            "type": "transcription",
            "audio": {
                "input": {
                    "format": {"type": "audio/pcm", "rate": 24000},
                    "transcription": {"model": "whisper-1", "language": "en", "prompt": "p"},
                    "turn_detection": {"type": "server_vad", "silence_duration_ms": 500},
                }
            },
        },
    },  # fmt: skip
    {
        "type": "transcription_session.update",
        "session": {
            "input_audio_format": "g711_ulaw",
            "input_audio_transcription": {"model": "m", "language": "en"},
            "turn_detection": None,
        },
    },  # fmt: skip
    {"type": "input_audio_buffer.append", "event_id": "e2", "audio": "AAAA"},
    {"type": "input_audio_buffer.commit"},
    {"type": "input_audio_buffer.clear"},
]


@st.composite
def mutated(draw: st.DrawFn) -> str:
    """A valid message with random parts replaced by random JSON values: the parsers' every branch is reached."""

    def mutate(value: Any) -> Any:
        if draw(st.integers(0, 5)) == 0:
            return draw(VALUES)
        if isinstance(value, dict):
            return {k: mutate(v) for k, v in value.items() if draw(st.integers(0, 9))}
        if isinstance(value, list):
            return [mutate(v) for v in value]
        return value

    return json.dumps(mutate(draw(st.sampled_from(TEMPLATES))))


FRAMES = st.text(max_size=200) | messages() | st.binary(max_size=200)
# the call-centre parsers walk deep structures: most examples go to mutated messages, and there are more of them
DEEP = settings(FUZZ, max_examples=1500)


def count(name: str) -> None:
    TALLY[f"fuzz examples: {name}"] += 1


@FUZZ
@given(st.text(max_size=300) | messages())
def test_parse_client_message(text: str) -> None:
    count("parse_client_message")
    with contextlib.suppress(ProtocolError):
        parse_client_message(text)


QUERY_KEYS = st.sampled_from(["sample_rate", "encoding", "channels", "language", "token", "resume", "last_seq", "x"])
QUERY_VALUES = st.text(max_size=12) | st.integers(-5, 100000).map(str) | st.sampled_from([e.value for e in Encoding])


@st.composite
def listen_paths(draw: st.DrawFn) -> str:
    pairs = draw(st.lists(st.tuples(QUERY_KEYS, QUERY_VALUES), max_size=5))
    tail = draw(st.text(max_size=20))
    return "/v1/listen?" + "&".join(f"{k}={v}" for k, v in pairs) + tail


@FUZZ
@given(listen_paths() | st.text(max_size=100))
def test_parse_listen_and_resume_query(path: str) -> None:
    count("parse_listen_query + parse_resume_query")
    try:
        params = parse_listen_query(path)
    except ProtocolError:
        pass
    else:
        params.validate()  # what parsed is valid
    with contextlib.suppress(ProtocolError):
        parse_resume_query(path)


@FUZZ
@given(
    st.sampled_from(list(Encoding)),
    st.sampled_from([8000, 16000, 44100, 48000]),
    st.sampled_from([1, 2]),
    st.lists(st.binary(max_size=64), max_size=6),
)
def test_wire_decoder(encoding: Encoding, rate: int, channels: int, frames: list[bytes]) -> None:
    count("WireDecoder.decode")
    decoder = WireDecoder(AudioFormat(encoding=encoding, sample_rate=rate, channels=channels))
    decoded = 0
    for frame in frames:
        try:
            samples = decoder.decode(frame)
        except ProtocolError:
            continue  # NaN or infinite floats: refused, and the carried bytes with them
        assert samples.shape[0] == channels and samples.dtype == np.float32
        assert (
            np.all(np.isfinite(samples)) and np.all(np.abs(samples) <= 1.0 + 1e-6)
        ) or encoding is Encoding.PCM_F32LE
        decoded += samples.shape[1]
    assert 0 <= decoder.flush() < AudioFormat(encoding=encoding, sample_rate=rate, channels=channels).frame_bytes


@DEEP
@given(mutated() | FRAMES)
def test_twilio_parse_message(frame: str | bytes) -> None:
    count("twilio.parse_message")
    with contextlib.suppress(ProtocolError):
        parse_message(frame)


@DEEP
@given(mutated() | FRAMES, st.booleans())
def test_realtime_parse_client_event(frame: str | bytes, server_vad: bool) -> None:
    count("realtime.parse_client_event")
    with contextlib.suppress(InvalidRequest):
        parse_client_event(frame, TranscriptionConfig(server_vad=server_vad))


@functools.cache
def container_seed(container: str) -> bytes:
    """A small real file of each container (0.5 s of speech), made once: the fuzz mutates it."""
    from tests.conftest import load_clip
    from tests.containers import encode

    codec = "pcm_s16le" if container == "wav" else "libopus"
    return encode(load_clip("1089-134686-0001.flac")[:8000], 16000, container, codec)


@FUZZ
@given(
    st.sampled_from(["webm", "ogg", "wav"]),
    st.lists(st.tuples(st.floats(0, 1), st.binary(min_size=1, max_size=8), st.booleans()), max_size=4),
    st.floats(0, 1),
    st.integers(1, 4096),
)
def test_container_decoder(container: str, edits: list[tuple[float, bytes, bool]], cut: float, chunk: int) -> None:
    count("ContainerDecoder")
    data = bytearray(container_seed(container))
    for where, what, insert in edits:  # bytes overwritten or inserted anywhere, header included
        at = int(where * len(data))
        data[at : at if insert else at + len(what)] = what
    data = data[: max(1, int(cut * len(data)))] if cut < 0.9 else data
    decoder = ContainerDecoder()
    frames = 0
    try:
        for start in range(0, len(data), chunk):
            frames += decoder.receive(bytes(data[start : start + chunk])).frames
    except ProtocolError:
        pass
    tail = decoder.flush()  # never raises: the audio before any fault
    frames += tail.frames
    with contextlib.suppress(BadContainer):
        decoder.check_complete()
    # linear in the input: at most one packet per byte, and an Opus packet is at most 120 ms (RFC 6716 section 3.2)
    assert frames <= len(data) * 5760
    assert tail.audio.dtype == np.float32 and np.all(np.isfinite(tail.audio))
