from __future__ import annotations

import json
import tracemalloc

import pytest

from streamer.core.audio import Encoding
from streamer.core.container import ContainerEncoding
from streamer.core.errors import FrameTooLarge, MalformedMessage, UnsupportedAudio
from streamer.server.protocol import (
    MAX_JSON_DEPTH,
    MAX_TEXT_FRAME_CHARS,
    Configure,
    Done,
    End,
    ErrorMessage,
    Finalize,
    FinalMessage,
    KeepAlive,
    LatencySummary,
    ListenParams,
    LostRange,
    PartialMessage,
    Percentiles,
    Ready,
    ResumeHint,
    ResumeRequest,
    SpeechEndedMessage,
    SpeechStartedMessage,
    WordMessage,
    json_depth,
    parse_client_message,
    parse_json_object,
    parse_listen_query,
    parse_resume_query,
    parse_server_message,
    serialize,
    serialize_client_message,
)


class TestListenQuery:
    def test_defaults(self) -> None:
        assert parse_listen_query("/v1/listen") == ListenParams(16000, Encoding.PCM_S16LE, 1, None)

    def test_every_field(self) -> None:
        params = parse_listen_query("/v1/listen?sample_rate=8000&encoding=mulaw&channels=2&language=de")
        assert params == ListenParams(8000, Encoding.MULAW, 2, "de")

    @pytest.mark.parametrize("encoding", [e.value for e in (*Encoding, *ContainerEncoding)])
    def test_every_encoding(self, encoding: str) -> None:
        assert parse_listen_query(f"/v1/listen?encoding={encoding}").encoding.value == encoding

    def test_a_container_takes_its_rate_from_the_stream_and_channels_from_the_query(self) -> None:
        params = parse_listen_query("/v1/listen?encoding=opus&sample_rate=48000&channels=2")
        assert params.container is ContainerEncoding.OPUS and params.channels == 2
        assert parse_listen_query("/v1/listen?encoding=container").container is ContainerEncoding.CONTAINER
        assert parse_listen_query("/v1/listen").container is None
        with pytest.raises(UnsupportedAudio, match="channels 3"):
            parse_listen_query("/v1/listen?encoding=container&channels=3")

    def test_round_trip_through_to_query(self) -> None:
        params = ListenParams(44100, Encoding.PCM_F32LE, 2, "en")
        assert parse_listen_query(f"/v1/listen?{params.to_query()}") == params

    def test_prompt_and_keywords(self) -> None:
        params = parse_listen_query("/v1/listen?prompt=A+talk+on+Kubernetes.&keywords=kubectl,%20etcd,&keywords=Istio")
        assert params.prompt == "A talk on Kubernetes."
        assert params.keywords == ("kubectl", "etcd", "Istio")  # commas and repeats both list; empties dropped

    def test_prompt_and_keywords_round_trip_through_to_query(self) -> None:
        params = ListenParams(prompt="Names: Zoë & Ådne, 100% sure?", keywords=("Zoë", "C++", "a b"))
        assert parse_listen_query(f"/v1/listen?{params.to_query()}") == params

    @pytest.mark.parametrize(
        ("query", "complaint"),
        [
            ("sample_rate=7999", "from 8000 to 48000 Hz"),
            ("sample_rate=48001", "from 8000 to 48000 Hz"),
            ("sample_rate=fast", "must be an integer"),
            ("encoding=mp3", "encoding must be one of pcm_s16le, pcm_f32le, mulaw, alaw, opus, container, not 'mp3'"),
            ("channels=3", "channels 3 is not supported; use 1 or 2"),
            ("channels=0", "use 1 or 2"),
            ("language=english", "ISO 639-1"),
            ("samplerate=8000", "unknown query parameter 'samplerate'"),
            ("channels=1&channels=2", "given twice"),
            ("prompt=a&prompt=b", "given twice"),
            ("prompt=" + "x" * 801, "initial_prompt must be at most 800 characters"),
            ("keywords=" + "y" * 51, "at most 50 characters each"),
            ("keywords=" + ",".join(f"k{i}" for i in range(101)), "keywords: at most 100"),
        ],
    )
    def test_bad_values_are_unsupported_audio(self, query: str, complaint: str) -> None:
        with pytest.raises(UnsupportedAudio, match=complaint) as info:
            parse_listen_query(f"/v1/listen?{query}")
        assert info.value.close_code == 4415
        assert info.value.code == "unsupported_audio"


class TestClientMessages:
    @pytest.mark.parametrize(
        ("text", "message"),
        [('{"type":"finalize"}', Finalize()), ('{"type": "end"}', End()), ('{"type":"keepalive"}', KeepAlive())],
    )
    def test_known_types(self, text: str, message: object) -> None:
        assert parse_client_message(text) == message

    @pytest.mark.parametrize(
        "message",
        [
            Finalize(),
            End(),
            KeepAlive(),
            Configure(prompt="A talk.", keywords=("Zoë", "kubectl")),
            Configure(keywords=()),
            Configure(prompt=""),
            Configure(),
        ],
    )
    def test_round_trip(self, message: Finalize | End | KeepAlive | Configure) -> None:
        assert parse_client_message(serialize_client_message(message)) == message

    def test_configure_keeps_what_it_leaves_out_and_trims(self) -> None:
        message = parse_client_message('{"type": "configure", "keywords": [" etcd ", "", "Istio"]}')
        assert message == Configure(prompt=None, keywords=("etcd", "Istio"))

    def test_the_largest_configure_fits_in_a_text_frame(self) -> None:
        text = serialize_client_message(Configure(prompt="é" * 800, keywords=tuple("ß" * 50 for _ in range(100))))
        assert len(text) <= MAX_TEXT_FRAME_CHARS
        assert parse_client_message(text) == Configure(prompt="é" * 800, keywords=tuple("ß" * 50 for _ in range(100)))

    @pytest.mark.parametrize(
        ("text", "complaint"),
        [
            ("not json", "must be JSON objects"),
            ("[1, 2]", "JSON objects, not list"),
            ('"end"', "JSON objects, not str"),
            ("{}", 'needs a string "type"'),
            ('{"type": 3}', 'needs a string "type"'),
            ('{"type": "flush"}', "unknown message type 'flush'"),
            ('{"type": "end", "now": true}', "unexpected fields in 'end' message: now"),
            ('{"type": "configure", "prompts": "x"}', "unexpected fields in 'configure' message: prompts"),
            ('{"type": "configure", "prompt": 3}', "prompt must be a string"),
            ('{"type": "configure", "keywords": "a,b"}', "keywords must be a list of strings"),
            ('{"type": "configure", "keywords": [1]}', "keywords must be a list of strings"),
            ('{"type": "configure", "keywords": ["' + "z" * 51 + '"]}', "at most 50 characters each"),
            ('{"type": "configure", "prompt": "' + "p" * 801 + '"}', "at most 800 characters"),
        ],
    )
    def test_malformed(self, text: str, complaint: str) -> None:
        with pytest.raises(MalformedMessage, match=complaint) as info:
            parse_client_message(text)
        assert info.value.close_code == 4400
        assert info.value.code == "bad_message"


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


class TestResumeQuery:
    def test_no_resume_parameter_is_a_new_session(self) -> None:
        assert parse_resume_query("/v1/listen?sample_rate=8000") is None

    def test_session_and_last_seq(self) -> None:
        assert parse_resume_query("/v1/listen?resume=3f9a1c0b2e4d&last_seq=12") == ResumeRequest("3f9a1c0b2e4d", 12)
        assert parse_resume_query("/v1/listen?resume=abc") == ResumeRequest("abc", 0)

    def test_the_listen_query_ignores_the_resume_parameters(self) -> None:
        assert parse_listen_query("/v1/listen?resume=abc&last_seq=3").sample_rate == 16000

    @pytest.mark.parametrize("query", ["resume=", "resume=a/b", "resume=abc&last_seq=-1", "resume=abc&last_seq=x"])
    def test_bad_values_are_refused_like_any_bad_parameter(self, query: str) -> None:
        with pytest.raises(UnsupportedAudio):
            parse_resume_query(f"/v1/listen?{query}")


def test_an_oversized_text_frame_is_refused_before_parsing() -> None:
    with pytest.raises(FrameTooLarge) as info:
        parse_client_message('{"type": "end"' + " " * MAX_TEXT_FRAME_CHARS + "}")
    assert info.value.close_code == 1009


# --- issue 14: JSON nested past the parser's recursion limit ---------------------------------------------------


def nested(depth: int) -> str:
    """An object whose one field holds arrays nested to ``depth`` in all."""
    return '{"type": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}"


@pytest.mark.parametrize("brackets", [1000, 100_000])
def test_deeply_nested_json_is_a_bad_message_not_a_recursion_error(brackets: int) -> None:
    # 1000 '[' in one frame raised RecursionError: close 1011 and a traceback in the log
    for text in ("[" * brackets, '{"type": ' + "[" * brackets, nested(brackets)):
        with pytest.raises(MalformedMessage) as info:
            parse_json_object(text)
        assert info.value.code == "bad_message" and info.value.close_code == 4400
    with pytest.raises(MalformedMessage, match="not list"):
        parse_json_object("[" * brackets)
    with pytest.raises(MalformedMessage, match=f"{MAX_JSON_DEPTH} deep, this one {brackets}"):
        parse_json_object(nested(brackets))


def test_a_listen_text_frame_of_1000_brackets_is_a_bad_message() -> None:
    for text in ("[" * 1000, '{"type": ' + "[" * 1000):
        with pytest.raises(MalformedMessage):
            parse_client_message(text)


def test_nesting_up_to_the_limit_parses_and_brackets_in_strings_do_not_count() -> None:
    value, levels = parse_json_object(nested(MAX_JSON_DEPTH))["type"], 1
    while isinstance(value, list):
        value, levels = value[0] if value else None, levels + 1
    assert levels == MAX_JSON_DEPTH
    assert json_depth(nested(MAX_JSON_DEPTH)) == MAX_JSON_DEPTH
    with pytest.raises(MalformedMessage, match="deep"):
        parse_json_object(nested(MAX_JSON_DEPTH + 1))
    quoted = json.dumps({"type": "[" * 10_000 + '\\"{' * 100, "x": [{"y": "]]]"}]})
    assert json_depth(quoted) == 3
    assert parse_json_object(quoted)["x"] == [{"y": "]]]"}]


@pytest.mark.parametrize(
    ("text", "depth"),
    [("{}", 1), ("3", 0), ('"[[["', 0), ('"unterminated [[[', 0), ("[[]]]][[", 2), ("[[" + '"\\' * 5, 2), ("", 0)],
)
def test_depth_is_counted_outside_strings_even_in_text_that_is_not_json(text: str, depth: int) -> None:
    assert json_depth(text) == depth


def test_depth_is_counted_in_memory_linear_in_the_text() -> None:
    # not wall-clock: what the count allocates, for a frame as long as a Realtime event may be
    text = '{"a": ' + "[" * 1_400_000
    tracemalloc.start()
    try:
        assert json_depth(text) == 1_400_001
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= 2 * len(text) + 2**20  # the text without its strings, as str and bytes, and one block of levels
