from __future__ import annotations

import base64
import json

import pytest

from streamer.integrations.realtime import (
    DELAY_AGREEMENT,
    EAGERNESS_SILENCE_MS,
    MAX_APPEND_BYTES,
    MAX_APPEND_SECONDS,
    MAX_EVENT_CHARS,
    AudioAppend,
    AudioClear,
    AudioCommit,
    Delay,
    Eagerness,
    InputFormat,
    InvalidRequest,
    NoiseReduction,
    SessionUpdate,
    TranscriptionConfig,
    error_event,
    parse_client_event,
)


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


def test_ga_transcription_options_reach_the_config_and_are_echoed() -> None:
    event = parse(
        {
            "type": "session.update",
            "session": {
                "type": "transcription",
                "include": ["item.input_audio_transcription.logprobs"],
                "audio": {
                    "input": {
                        "transcription": {
                            "model": "gpt-transcribe",
                            "prompt": "Names: Aoife, Siobhan.",
                            "keywords": ["Aoife", " Siobhan "],
                            "languages": ["en"],
                            "delay": "high",
                        },
                        "turn_detection": {"type": "server_vad", "silence_duration_ms": 800, "idle_timeout_ms": 5000},
                        "noise_reduction": {"type": "far_field", "strength": 0.5},
                    }
                },
            },
        }
    )
    assert isinstance(event, SessionUpdate)
    config = event.config
    assert config.prompt == "Names: Aoife, Siobhan." and config.keywords == ("Aoife", "Siobhan")
    assert config.languages == ("en",) and config.language is None and config.stream_language == "en"
    assert config.delay is Delay.HIGH and DELAY_AGREEMENT[config.delay] == 3
    assert config.endpoint_ms == 800 and config.idle_timeout_ms == 5000
    assert config.logprobs and config.noise_reduction is NoiseReduction.FAR_FIELD
    session = config.session_object("s", beta=False)
    audio_input = session["audio"]["input"]
    assert session["include"] == ["item.input_audio_transcription.logprobs"]
    assert audio_input["transcription"]["keywords"] == ["Aoife", "Siobhan"]
    assert audio_input["transcription"]["delay"] == "high"
    assert audio_input["turn_detection"]["idle_timeout_ms"] == 5000
    assert audio_input["noise_reduction"] == {"type": "far_field"}
    # what the stream core is built with changes with every one of them
    assert config.decode_fields() != TranscriptionConfig().decode_fields()


@pytest.mark.parametrize(
    ("eagerness", "silence_ms"), [(None, 700), ("auto", 700), ("low", 1500), ("medium", 700), ("high", 300)]
)
def test_semantic_vad_is_served_by_the_vad_with_an_end_point_per_eagerness(
    eagerness: str | None, silence_ms: int
) -> None:
    turn_detection = {"type": "semantic_vad"} | ({} if eagerness is None else {"eagerness": eagerness})
    event = parse({"type": "session.update", "session": {"audio": {"input": {"turn_detection": turn_detection}}}})
    assert isinstance(event, SessionUpdate)
    assert event.config.server_vad and event.config.endpoint_ms == silence_ms
    assert EAGERNESS_SILENCE_MS[Eagerness(eagerness or "auto")] == silence_ms
    echoed = event.config.session_object("s", beta=False)["audio"]["input"]["turn_detection"]
    assert echoed == {"type": "semantic_vad", "eagerness": eagerness or "auto"}


def test_beta_include_and_noise_reduction() -> None:
    event = parse(
        {
            "type": "transcription_session.update",
            "session": {
                "include": ["item.input_audio_transcription.logprobs"],
                "input_audio_noise_reduction": {"type": "near_field"},
                "input_audio_transcription": {"keywords": ["Kubernetes"]},
            },
        }
    )
    assert isinstance(event, SessionUpdate) and event.beta
    assert event.config.logprobs and event.config.keywords == ("Kubernetes",)
    session = event.config.session_object("s", beta=True)
    assert session["include"] == ["item.input_audio_transcription.logprobs"]
    assert session["input_audio_noise_reduction"] == {"type": "near_field"}


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
            {"type": "session.update", "session": {"audio": {"input": {"turn_detection": {"type": "client_vad"}}}}},
            "session.audio.input.turn_detection",
        ),
        (
            {
                "type": "session.update",
                "session": {"audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "eager"}}}},
            },
            "session.audio.input.turn_detection.eagerness",
        ),
        (
            {
                "type": "session.update",
                "session": {"audio": {"input": {"turn_detection": {"type": "server_vad", "idle_timeout_ms": 10}}}},
            },
            "session.audio.input.turn_detection.idle_timeout_ms",
        ),
        (
            {"type": "session.update", "session": {"audio": {"input": {"transcription": {"keywords": "a,b"}}}}},
            "session.audio.input.transcription.keywords",
        ),
        (
            {"type": "session.update", "session": {"audio": {"input": {"transcription": {"keywords": ["ok", " "]}}}}},
            "session.audio.input.transcription.keywords",
        ),
        (
            {"type": "session.update", "session": {"audio": {"input": {"transcription": {"prompt": "x" * 801}}}}},
            "session.audio.input.transcription.prompt",
        ),
        (
            {"type": "session.update", "session": {"audio": {"input": {"transcription": {"languages": ["en", "x1"]}}}}},
            "session.audio.input.transcription.languages",
        ),
        (
            {"type": "session.update", "session": {"audio": {"input": {"transcription": {"delay": "soon"}}}}},
            "session.audio.input.transcription.delay",
        ),
        (
            {"type": "session.update", "session": {"audio": {"input": {"noise_reduction": {"type": "studio"}}}}},
            "session.audio.input.noise_reduction.type",
        ),
        ({"type": "session.update", "session": {"include": ["item.audio"]}}, "session.include"),
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
