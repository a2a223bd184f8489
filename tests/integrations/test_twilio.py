from __future__ import annotations

import base64
import json
import tracemalloc

import numpy as np
import pytest

from streamer.core.audio import encode_mulaw
from streamer.core.errors import InvalidState, MalformedMessage, MediaGapTooLong, UnsupportedAudio
from streamer.integrations.twilio import (
    LABEL_PARAMETERS,
    MAX_GAP_MS,
    MAX_MESSAGE_CHARS,
    CallTimeline,
    Connected,
    Dtmf,
    Mark,
    Media,
    Start,
    Stop,
    TrackName,
    parse_message,
    recorded_messages,
    signature_matches,
    track_labels,
    twilio_signature,
)

# Twilio's documented example (the "Validating requests" guide): this token, URL and POST params give this signature
TOKEN = "12345"
DOC_URL = "https://mycompany.com/myapp.php?foo=1&bar=2"
DOC_PARAMS = {
    "CallSid": "CA1234567890ABCDE",
    "Caller": "+12349013030",
    "Digits": "1234",
    "From": "+12349013030",
    "To": "+18005551212",
}


def tone(seconds: float, rate: int = 8000) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


def test_signature_matches_twilios_documented_example() -> None:
    assert twilio_signature(TOKEN, DOC_URL, DOC_PARAMS) == "0/KCTR6DLpKmkAf8muzZqo1nDgQ="


def test_signature_over_websocket_url_has_no_params_and_tolerates_default_port() -> None:
    url = "wss://calls.example.com/twilio"
    signature = twilio_signature(TOKEN, url)
    assert signature_matches(TOKEN, url, signature)
    assert signature_matches(TOKEN, "wss://calls.example.com:443/twilio", signature)
    assert not signature_matches(TOKEN, url, twilio_signature("other-token", url))
    assert not signature_matches(TOKEN, "wss://evil.example.com/twilio", signature)
    assert not signature_matches(TOKEN, url, None)


def test_recorded_messages_parse_back_in_twilio_order() -> None:
    frames = list(recorded_messages({TrackName.INBOUND: tone(0.1), TrackName.OUTBOUND: tone(0.06)}, call_sid="CA9"))
    messages = [parse_message(json.dumps(f)) for f in frames]
    assert isinstance(messages[0], Connected)
    start = messages[1]
    assert (
        isinstance(start, Start) and start.call_sid == "CA9" and start.tracks == (TrackName.INBOUND, TrackName.OUTBOUND)
    )
    assert start.encoding == "audio/x-mulaw" and start.sample_rate == 8000
    media = [m for m in messages if isinstance(m, Media)]
    assert len(media) == 5 + 3  # 20 ms chunks
    assert all(len(m.payload) == 160 for m in media)
    assert [m.timestamp_ms for m in media if m.track is TrackName.INBOUND] == [0, 20, 40, 60, 80]
    assert isinstance(messages[-1], Stop) and messages[-1].call_sid == "CA9"
    seqs = [m.sequence_number for m in messages[1:]]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


def test_parse_dtmf_mark_and_unknown_events() -> None:
    dtmf = parse_message('{"event":"dtmf","sequenceNumber":"5","dtmf":{"track":"inbound_track","digit":"7"}}')
    assert dtmf == Dtmf(5, TrackName.INBOUND, "7")
    assert parse_message('{"event":"mark","sequenceNumber":"6","mark":{"name":"x"}}') == Mark(6, "x")
    assert parse_message('{"event":"something_new"}') is None
    for digit in ("77", "x", ""):  # one DTMF key per message, from the sixteen there are
        with pytest.raises(MalformedMessage, match="dtmf digit"):
            parse_message(json.dumps({"event": "dtmf", "dtmf": {"track": "inbound_track", "digit": digit}}))


def test_recorded_messages_press_keys_after_the_chunk_they_name() -> None:
    frames = list(recorded_messages({TrackName.INBOUND: tone(0.1)}, dtmf={2: "5", 5: "#"}))
    kinds = [f["event"] for f in frames]
    assert kinds == ["connected", "start", "media", "media", "dtmf", "media", "media", "media", "dtmf", "stop"]
    assert [parse_message(json.dumps(f)) for f in frames if f["event"] == "dtmf"] == [
        Dtmf(4, TrackName.INBOUND, "5"),
        Dtmf(8, TrackName.INBOUND, "#"),
    ]


def _start(**parameters: str) -> Start:
    frame = list(recorded_messages({TrackName.INBOUND: tone(0.02), TrackName.OUTBOUND: tone(0.02)}))[1]
    frame["start"]["customParameters"] = parameters
    start = parse_message(json.dumps(frame))
    assert isinstance(start, Start)
    return start


def test_track_labels_are_customer_and_agent_unless_the_stream_s_parameters_say_otherwise() -> None:
    assert track_labels(_start()) == {TrackName.INBOUND: "customer", TrackName.OUTBOUND: "agent"}
    # an outbound campaign: the callee is on the inbound track, the campaign's agent on the outbound one
    labels = track_labels(_start(inbound_label=" callee ", outbound_label="Agent 42", campaign="spring"))
    assert labels == {TrackName.INBOUND: "callee", TrackName.OUTBOUND: "Agent 42"}
    assert track_labels(_start(outbound_label="supervisor"))[TrackName.INBOUND] == "customer"
    assert LABEL_PARAMETERS == {TrackName.INBOUND: "inbound_label", TrackName.OUTBOUND: "outbound_label"}
    for bad in ("", "   ", "x" * 65, "new\nline"):
        with pytest.raises(MalformedMessage, match="inbound_label must be 1 to 64 printable characters"):
            track_labels(_start(inbound_label=bad))


@pytest.mark.parametrize(
    "frame",
    [
        "not json",
        "[]",
        '{"no":"event"}',
        '{"event":"media","media":{"timestamp":"0","payload":"***"}}',
        '{"event":"media","media":{"track":"sideways","timestamp":"0","payload":""}}',
        '{"event":"media","media":{"timestamp":"soon","payload":""}}',
        '{"event": "media", "sequenceNumber": Infinity}',  # found by tests/reliability/test_fuzz.py: OverflowError
    ],
)
def test_malformed_frames_raise(frame: str) -> None:
    with pytest.raises(MalformedMessage):
        parse_message(frame)


def _timeline(*tracks: TrackName) -> CallTimeline:
    timeline = CallTimeline()
    frames = list(recorded_messages({t: tone(0.02) for t in tracks}))
    start = parse_message(json.dumps(frames[1]))
    assert start is not None
    timeline.receive(start)
    return timeline


def _media(seq: int, ms: int, samples: int = 160, track: TrackName = TrackName.INBOUND) -> Media:
    return Media(seq, track, seq, ms, encode_mulaw(np.full(samples, 0.1, dtype=np.float32)))


def test_gap_in_timestamps_is_filled_with_silence_and_counted() -> None:
    timeline = _timeline(TrackName.INBOUND)
    first = timeline.receive(_media(2, 0))
    assert first is not None and first.gap_samples == 0 and len(first.samples) == 160
    # chunks at 20 and 40 ms never came: the one at 60 ms starts 320 samples late
    placed = timeline.receive(_media(5, 60))
    assert placed is not None and placed.gap_samples == 320 and placed.start == 160
    assert len(placed.samples) == 480 and not placed.samples[:320].any()
    stats = timeline.stats[TrackName.INBOUND]
    assert stats.gaps == 1 and stats.gap_samples == 320 and stats.samples == 640
    assert stats.missing_sequence_numbers == 2


def test_late_or_duplicate_audio_is_trimmed_not_doubled() -> None:
    timeline = _timeline(TrackName.INBOUND)
    timeline.receive(_media(2, 0))
    placed = timeline.receive(_media(3, 10))  # overlaps the first chunk by 80 samples
    assert placed is not None and len(placed.samples) == 80
    assert timeline.stats[TrackName.INBOUND].late_samples == 80
    assert timeline.stats[TrackName.INBOUND].samples == 240


def test_small_jitter_is_not_a_gap() -> None:
    timeline = _timeline(TrackName.INBOUND)
    timeline.receive(_media(2, 0))
    placed = timeline.receive(_media(3, 21))
    assert placed is not None and placed.gap_samples == 0


def test_timeline_rules() -> None:
    timeline = CallTimeline()
    with pytest.raises(MalformedMessage, match="before start"):
        timeline.receive(_media(1, 0))
    timeline = _timeline(TrackName.INBOUND)
    with pytest.raises(MalformedMessage, match="outbound"):
        timeline.receive(_media(2, 0, track=TrackName.OUTBOUND))
    timeline.receive(Stop(3, "CA"))
    with pytest.raises(InvalidState):
        timeline.receive(_media(4, 20))


def test_start_with_another_media_format_is_refused() -> None:
    frame = list(recorded_messages({TrackName.INBOUND: tone(0.02)}))[1]
    frame["start"]["mediaFormat"]["sampleRate"] = 16000
    start = parse_message(json.dumps(frame))
    assert start is not None
    with pytest.raises(UnsupportedAudio, match="8000 Hz"):
        CallTimeline().receive(start)


def test_payload_round_trips_through_mulaw() -> None:
    audio = tone(0.02)
    frame = list(recorded_messages({TrackName.INBOUND: audio}))[2]
    payload = base64.b64decode(frame["media"]["payload"])
    assert payload == encode_mulaw(audio)


# --- issue 14: no message costs memory out of proportion to its size --------------------------------------------


def test_a_gap_up_to_the_limit_is_filled_with_silence() -> None:
    timeline = _timeline(TrackName.INBOUND)
    timeline.receive(_media(2, 0))
    placed = timeline.receive(_media(3, 20 + MAX_GAP_MS))
    assert placed is not None and placed.gap_samples == MAX_GAP_MS * 8 and len(placed.samples) == MAX_GAP_MS * 8 + 160


def test_a_timestamp_far_ahead_is_refused_without_allocating_the_gap() -> None:
    timeline = _timeline(TrackName.INBOUND)
    timeline.receive(_media(2, 0))
    # one ~300-byte message with "timestamp": "1000000" once cost 14 GiB: 1000 s of zeros, resampled as one matrix
    frame = json.dumps(
        {"event": "media", "sequenceNumber": "3", "media": {"track": "inbound", "timestamp": "1000000", "payload": ""}}
    )
    tracemalloc.start()
    try:
        with pytest.raises(MediaGapTooLong) as raised:
            message = parse_message(frame)
            assert message is not None
            timeline.receive(message)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024
    assert raised.value.code == "media_gap_too_long" and raised.value.close_code == 4400
    assert "gap of 999980 ms" in raised.value.message and f"at most {MAX_GAP_MS} ms" in raised.value.message
    # just over the limit is refused too; nothing of the refused chunk is placed
    with pytest.raises(MediaGapTooLong):
        timeline.receive(_media(4, 20 + MAX_GAP_MS + 1))
    assert timeline.stats[TrackName.INBOUND].samples == 160 and timeline.stats[TrackName.INBOUND].gaps == 0


@pytest.mark.parametrize("brackets", [1000, 60_000, 100_000])
def test_deeply_nested_json_is_malformed_not_a_recursion_error(brackets: int) -> None:
    # 1000 '[' once raised RecursionError: close 1011 and a traceback; 100000 is refused by length first
    for frame in ("[" * brackets, '{"event": "media", "media": ' + "[" * brackets):
        with pytest.raises(MalformedMessage) as raised:
            parse_message(frame)
        assert raised.value.close_code == 4400
        if len(frame) <= MAX_MESSAGE_CHARS:
            assert "not list" in raised.value.message or "deep" in raised.value.message
