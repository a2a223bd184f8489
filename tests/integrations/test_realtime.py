from __future__ import annotations

import base64
import json

import pytest

from streamer.integrations.realtime import (
    MAX_APPEND_BYTES,
    MAX_APPEND_SECONDS,
    MAX_EVENT_CHARS,
    AudioAppend,
    AudioClear,
    AudioCommit,
    InputFormat,
    InvalidRequest,
    Items,
    SessionUpdate,
    TranscriptionConfig,
    error_event,
    parse_client_event,
)

MS = 16


def parse(event: dict[str, object], config: TranscriptionConfig | None = None) -> object:
    return parse_client_event(json.dumps(event), config or TranscriptionConfig())


def test_ga_session_update() -> None:
    event = parse(
        {
            "type": "session.update",
            "event_id": "e1",
            "session": {
                "type": "transcription",
                "audio": {
                    "input": {
                        "format": {"type": "audio/pcmu"},
                        "transcription": {"model": "gpt-4o-transcribe", "language": "en", "prompt": "hello"},
                        "turn_detection": None,
                    }
                },
            },
        }
    )
    assert isinstance(event, SessionUpdate) and not event.beta
    assert event.config == TranscriptionConfig(InputFormat.PCMU, "en", "hello", "gpt-4o-transcribe", False, 500)
    session = event.config.session_object("s", beta=False)
    assert session["audio"]["input"]["format"] == {"type": "audio/pcmu"}
    assert session["audio"]["input"]["turn_detection"] is None


@pytest.mark.parametrize(
    ("name", "fmt"), [("pcm16", InputFormat.PCM), ("g711_ulaw", InputFormat.PCMU), ("g711_alaw", InputFormat.PCMA)]
)
def test_beta_transcription_session_update_accepts_old_format_names(name: str, fmt: InputFormat) -> None:
    event = parse(
        {
            "type": "transcription_session.update",
            "session": {
                "input_audio_format": name,
                "turn_detection": {"type": "server_vad", "silence_duration_ms": 700},
            },
        }
    )
    assert isinstance(event, SessionUpdate) and event.beta
    assert event.config.format is fmt and event.config.server_vad and event.config.silence_duration_ms == 700
    assert event.config.session_object("s", beta=True)["input_audio_format"] == name


@pytest.mark.parametrize(
    ("event", "param"),
    [
        (
            {"type": "session.update", "session": {"audio": {"input": {"format": {"type": "audio/opus"}}}}},
            "session.audio.input.format",
        ),
        (
            {
                "type": "session.update",
                "session": {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}},
            },
            "session.audio.input.format.rate",
        ),
        ({"type": "session.update", "session": {"type": "realtime"}}, "session.type"),
        (
            {"type": "session.update", "session": {"audio": {"input": {"turn_detection": {"type": "semantic_vad"}}}}},
            "session.audio.input.turn_detection",
        ),
        ({"type": "input_audio_buffer.append", "audio": "%%%"}, "audio"),
        ({"type": "response.create"}, "type"),
    ],
)
def test_invalid_events_name_the_param(event: dict[str, object], param: str) -> None:
    with pytest.raises(InvalidRequest) as raised:
        parse({**event, "event_id": "client-7"})
    assert raised.value.param == param
    shaped = error_event("event_1", raised.value)
    assert shaped["type"] == "error"
    assert set(shaped["error"]) == {"type", "code", "message", "param", "event_id"}
    assert shaped["error"]["event_id"] == "client-7" and shaped["error"]["type"] == "invalid_request_error"


def test_not_json_is_an_error() -> None:
    with pytest.raises(InvalidRequest) as raised:
        parse_client_event("{", TranscriptionConfig())
    assert raised.value.code == "invalid_json"


def test_buffer_events() -> None:
    audio = base64.b64encode(b"\x01\x02").decode()
    assert parse({"type": "input_audio_buffer.append", "audio": audio}) == AudioAppend(None, b"\x01\x02")
    assert parse({"type": "input_audio_buffer.commit", "event_id": "x"}) == AudioCommit("x")
    assert parse({"type": "input_audio_buffer.clear"}) == AudioClear(None)


def kinds(events: list[dict[str, object]]) -> list[str]:
    return [str(e["type"]).rsplit(".", 1)[-1] for e in events]


def test_server_vad_items_complete_once_the_core_commits_the_utterance() -> None:
    items = Items(server_vad=True)
    started = items.speech_started(100 * MS)
    assert kinds(started) == ["speech_started"] and started[0]["audio_start_ms"] == 100
    item_id = started[0]["item_id"]
    assert items.final(100 * MS, 900 * MS, " hello there") == []  # held until the turn ends
    assert items.settle(100 * MS) == []  # the utterance is still being transcribed
    assert items.final(900 * MS, 1500 * MS, " general") == []
    events = items.settle(None)
    assert kinds(events) == ["speech_stopped", "committed", "delta", "delta", "completed"]
    assert all(e["item_id"] == item_id for e in events)
    assert events[0]["audio_end_ms"] == 1500
    assert "".join(str(e["delta"]) for e in events if "delta" in e) == "hello there general"
    assert events[-1]["transcript"] == "hello there general"
    assert events[1]["previous_item_id"] is None
    # the next turn points back at this one
    second = items.speech_started(3000 * MS)[0]["item_id"]
    items.final(3000 * MS, 3500 * MS, "bye")
    later = items.settle(5000 * MS)  # a third utterance is under way: the second is done
    assert later[1]["item_id"] == second and later[1]["previous_item_id"] == item_id


def test_manual_commit_items_commit_at_once_and_complete_when_the_core_catches_up() -> None:
    items = Items(server_vad=False)
    assert items.speech_started(0) == []  # no VAD events without turn detection
    items.final(0, 800 * MS, "one two")
    events = items.commit(1000 * MS)
    assert kinds(events) == ["committed", "delta"]
    item_id = events[0]["item_id"]
    assert items.settle(500 * MS) == []  # an utterance that began before the commit is still open
    assert kinds(items.final(800 * MS, 1000 * MS, "three")) == ["delta"]  # the item is committed: live deltas
    done = items.settle(None)
    assert kinds(done) == ["completed"] and done[-1]["transcript"] == "one two three"
    assert done[-1]["item_id"] == item_id
    # audio after the commit belongs to the next item
    items.final(1200 * MS, 1500 * MS, "four")
    nxt = items.commit(2000 * MS)
    assert nxt[0]["previous_item_id"] == item_id
    assert items.settle(None)[-1]["transcript"] == "four"


def test_commit_needs_100_ms_of_new_audio() -> None:
    items = Items(server_vad=False)
    with pytest.raises(InvalidRequest) as raised:
        items.commit(50 * MS)
    assert raised.value.code == "input_audio_buffer_commit_empty"


def test_clear_drops_the_uncommitted_text() -> None:
    items = Items(server_vad=False)
    items.final(0, 500 * MS, "forget me")
    assert kinds(items.clear(600 * MS)) == ["cleared"]
    assert items.settle(None) == []
    items.final(700 * MS, 900 * MS, "keep me")
    items.commit(1000 * MS)
    assert items.settle(None)[-1]["transcript"] == "keep me"


def test_end_completes_open_items() -> None:
    items = Items(server_vad=True)
    items.speech_started(0)
    items.final(0, 500 * MS, "cut short")
    assert kinds(items.end())[-1] == "completed"


# --- issue 14: limits on what one event may cost ----------------------------------------------------------------


@pytest.mark.parametrize("brackets", [1000, 100_000])
def test_deeply_nested_json_is_invalid_json_not_a_recursion_error(brackets: int) -> None:
    for frame in ("[" * brackets, '{"type": "session.update", "session": ' + '{"a": ' * brackets):
        assert len(frame) <= MAX_EVENT_CHARS  # reaches the parser: not refused for its length
        with pytest.raises(InvalidRequest) as raised:
            parse_client_event(frame, TranscriptionConfig())
        assert raised.value.code == "invalid_json"


@pytest.mark.parametrize("fmt", list(InputFormat))
def test_one_append_carries_at_most_the_same_seconds_of_audio_in_every_format(fmt: InputFormat) -> None:
    config = TranscriptionConfig(format=fmt)
    limit = fmt.sample_rate * fmt.encoding.bytes_per_sample * MAX_APPEND_SECONDS
    assert fmt.max_append_bytes == limit <= MAX_APPEND_BYTES <= 1 << 20  # within a /v1/listen frame's 1 MiB
    fits = parse({"type": "input_audio_buffer.append", "audio": base64.b64encode(bytes(limit)).decode()}, config)
    assert isinstance(fits, AudioAppend) and len(fits.audio) == limit
    # one byte over: its base64 is no longer than the limit's, so it is refused once decoded; more, before decoding
    for over in (limit + 1, limit + 3, limit + 3000):  # longer events are refused whole: invalid_json
        with pytest.raises(InvalidRequest) as raised:
            parse({"type": "input_audio_buffer.append", "audio": base64.b64encode(bytes(over)).decode()}, config)
        assert raised.value.param == "audio" and f"at most {MAX_APPEND_SECONDS} s of audio" in raised.value.message
