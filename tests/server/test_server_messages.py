from __future__ import annotations

import json

import pytest

from streamer.core.errors import MalformedMessage
from streamer.server.server_messages import (
    Done,
    ErrorMessage,
    FinalMessage,
    LatencySummary,
    LostRange,
    PartialMessage,
    Percentiles,
    Ready,
    ResumeHint,
    SpeechEndedMessage,
    SpeechStartedMessage,
    WordMessage,
    parse_server_message,
    serialize,
)

WORDS = (WordMessage(word="hello", start=0.5, end=0.8, probability=0.9),)
SERVER_MESSAGES = [
    Ready(session_id="s1", model="tiny.en", sample_rate=8000, encoding="mulaw", channels=2),
    SpeechStartedMessage(channel=1, start=0.25),
    SpeechEndedMessage(channel=1, start=0.25, end=2.5, reason="vad"),
    PartialMessage(channel=0, segment_id=3, text="hel", start=0.5, end=0.8, words=WORDS, latency_ms=120.5),
    PartialMessage(0, 3, "hal", 0.5, 0.8, WORDS, latency_ms=120.5, language="de"),
    FinalMessage(channel=0, segment_id=3, text="hello", start=0.5, end=0.8, words=WORDS, latency_ms=300.0, seq=7),
    FinalMessage(0, 3, "hallo", 0.5, 0.8, WORDS, latency_ms=300.0, seq=7, language="de"),
    ErrorMessage(code="engine_failure", message="decode failed", lost=LostRange(1.0, 2.5), channel=1),
    ErrorMessage(code="shutting_down", message="stopping", resume=ResumeHint(session_id="s1", last_seq=7)),
    Ready(
        session_id="s1",
        model="m",
        sample_rate=16000,
        encoding="pcm_s16le",
        channels=1,
        resumed=True,
        audio_seconds_received=2.5,
    ),
    ErrorMessage(code="idle_timeout", message="no data for 10 s"),
    Done(
        audio_seconds_received=3.0,
        audio_seconds_transcribed=2.0,
        non_speech_seconds=0.5,
        lost_seconds=0.5,
        latency=LatencySummary(partial=Percentiles(100.0, 200.0), final=Percentiles(None, None)),
    ),
]


class TestServerMessages:
    @pytest.mark.parametrize("message", SERVER_MESSAGES, ids=lambda m: type(m).__name__)
    def test_round_trip(self, message: object) -> None:
        assert parse_server_message(serialize(message)) == message  # type: ignore[arg-type]

    def test_wire_shape_of_final(self) -> None:
        data = json.loads(serialize(SERVER_MESSAGES[6]))  # type: ignore[arg-type]
        assert data == {
            "channel": 0,
            "segment_id": 3,
            "text": "hallo",
            "start": 0.5,
            "end": 0.8,
            "words": [{"word": "hello", "start": 0.5, "end": 0.8, "probability": 0.9}],
            "latency_ms": 300.0,
            "seq": 7,
            "language": "de",
            "type": "final",
        }

    def test_wire_shape_of_speech_ended(self) -> None:
        data = json.loads(serialize(SERVER_MESSAGES[2]))  # type: ignore[arg-type]
        assert data == {"channel": 1, "start": 0.25, "end": 2.5, "reason": "vad", "type": "speech_ended"}

    def test_ready_names_the_protocol(self) -> None:
        assert json.loads(serialize(SERVER_MESSAGES[0]))["protocol"] == "v1"  # type: ignore[arg-type]

    def test_error_without_lost_leaves_it_out(self) -> None:
        assert json.loads(serialize(ErrorMessage(code="x", message="y"))) == {
            "code": "x",
            "message": "y",
            "type": "error",
        }

    @pytest.mark.parametrize("text", ["nope", '{"type": "gossip"}', '{"type": "final"}', "[]"])
    def test_garbage_from_server(self, text: str) -> None:
        with pytest.raises(MalformedMessage):
            parse_server_message(text)
