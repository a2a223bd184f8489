"""Deepgram's live protocol without a server: the handshake's query, control messages, the server's messages."""

from __future__ import annotations

import json

import pytest

from streamer.core.audio import Encoding
from streamer.core.container import ContainerEncoding
from streamer.core.errors import (
    BadContainer,
    FrameTooLarge,
    IdleTimeout,
    InvalidState,
    MalformedMessage,
    RateLimited,
    UnsupportedAudio,
)
from streamer.engine.types import MAX_KEYWORD_CHARS, MAX_KEYWORDS
from streamer.integrations.deepgram import (
    DEEPGRAM_PATH,
    MAX_ENDPOINTING_MS,
    MIN_ENDPOINTING_MS,
    ClientMessage,
    DeepgramErrorMessage,
    Metadata,
    QueryWarning,
    Results,
    UtteranceEnd,
    WordResult,
    close_for,
    model_info,
    parse_client_message,
    parse_query,
    plain_word,
)
from streamer.server.client_messages import MAX_TEXT_FRAME_CHARS

deepgram_types = pytest.importorskip("deepgram.listen.v1.types")


def query(text: str) -> str:
    return f"{DEEPGRAM_PATH}?{text}"


def test_the_parameters_the_sdk_sends_are_read() -> None:
    params = parse_query(
        query(
            "model=nova-3&encoding=mulaw&sample_rate=8000&channels=2&multichannel=true&language=en-US"
            "&interim_results=true&endpointing=800&utterance_end_ms=1500&vad_events=true&smart_format=true"
            "&keyterm=Zarathustra&keyterm=Helstone&keywords=Thornton:2.5&keywords=kine"
        )
    )
    assert (params.encoding, params.sample_rate, params.channels) == (Encoding.MULAW, 8000, 2)
    assert params.multichannel and params.transcripts == 2
    assert params.language == "en" and params.model == "nova-3"
    assert params.interim_results and params.vad_events and params.punctuate
    assert (params.endpointing_ms, params.utterance_end_ms, params.endpointing_off) == (800, 1500, False)
    assert params.keywords == ("Zarathustra", "Helstone", "Thornton", "kine")  # the boost is stripped


def test_defaults_are_deepgrams() -> None:
    params = parse_query(query("encoding=linear16&sample_rate=16000"))
    assert not (params.interim_results or params.vad_events or params.punctuate or params.multichannel)
    assert params.endpointing_ms is None and params.utterance_end_ms is None and params.language is None
    assert params.transcripts == 1 and params.warnings == ()


def test_unknown_parameters_are_accepted_and_named_as_ignored() -> None:
    params = parse_query(query("encoding=alaw&sample_rate=8000&redact=pci&tag=a&tag=b&mip_opt_out=true&token=t"))
    assert [w.parameter for w in params.warnings] == ["redact", "tag", "mip_opt_out"]  # token is streamer's own
    assert all(w.type == "ignored" for w in params.warnings)


def test_the_ignored_list_is_bounded_whatever_the_query() -> None:
    params = parse_query(query("encoding=linear16&sample_rate=16000&" + "&".join(f"p{i}={i}" for i in range(500))))
    assert len(params.warnings) == 32


@pytest.mark.parametrize(
    ("text", "named"),
    [
        (
            "encoding=flac&sample_rate=48000",
            "encoding 'flac' is not supported; use one of: linear16, mulaw, alaw, opus",
        ),
        ("encoding=linear16", "sample_rate is required"),
        ("encoding=linear16&sample_rate=4000", "sample_rate 4000"),
        ("encoding=linear16&sample_rate=1e5", "sample_rate must be an integer"),
        ("encoding=linear16&sample_rate=١٦٠٠٠", "sample_rate must be an integer"),
        ("encoding=linear16&sample_rate=16000&channels=3", "channels 3"),
        ("encoding=linear16&sample_rate=16000&interim_results=yes", "interim_results must be true or false"),
        ("encoding=linear16&sample_rate=16000&endpointing=-5", "endpointing"),
        ("encoding=linear16&sample_rate=16000&utterance_end_ms=500", "utterance_end_ms must be between"),
        ("encoding=linear16&sample_rate=16000&language=english!", "language must be a BCP-47 tag"),
        ("encoding=linear16&sample_rate=16000&sample_rate=8000", "given twice"),
        ("encoding=linear16&sample_rate=16000&keyterm=", "keyterm and keywords values must be"),
        (f"encoding=linear16&sample_rate=16000&keyterm={'x' * (MAX_KEYWORD_CHARS + 1)}", "must be 1 to"),
        (
            "encoding=linear16&sample_rate=16000&" + "&".join(f"keyterm=k{i}" for i in range(MAX_KEYWORDS + 1)),
            f"at most {MAX_KEYWORDS}",
        ),
    ],
)
def test_what_cannot_be_served_is_refused_naming_why(text: str, named: str) -> None:
    with pytest.raises(UnsupportedAudio, match=named):
        parse_query(query(text))


@pytest.mark.parametrize(
    ("text", "encoding"),
    [
        ("model=nova-3", ContainerEncoding.CONTAINER),  # no encoding: WebM, Ogg or WAV, as Deepgram reads them
        ("encoding=opus&sample_rate=48000", ContainerEncoding.OPUS),  # Opus in WebM or Ogg
        ("encoding=ogg-opus&sample_rate=16000", ContainerEncoding.OPUS),
    ],
)
def test_containerised_audio_takes_its_rate_and_channels_from_the_container(
    text: str, encoding: ContainerEncoding
) -> None:
    params = parse_query(query(text))
    assert params.container is encoding and params.sample_rate == 0
    assert params.transcripts == 1  # mixed down, whatever the container holds
    assert [w.parameter for w in params.warnings] == (["sample_rate"] if "sample_rate" in text else [])
    assert parse_query(query(f"{text}&multichannel=true")).transcripts is None  # one per channel of the container
    with pytest.raises(InvalidState):
        params.audio_format  # noqa: B018 (a container has no raw format)


def test_endpointing_maps_onto_the_cores_end_point() -> None:
    def endpointing(value: str) -> tuple[int | None, bool, tuple[QueryWarning, ...]]:
        params = parse_query(query(f"encoding=linear16&sample_rate=16000&endpointing={value}"))
        return params.endpointing_ms, params.endpointing_off, params.warnings

    assert endpointing("700") == (700, False, ())
    assert endpointing("true") == (None, False, ())
    assert endpointing("false") == (None, True, ())
    short, _, [warning] = endpointing("10")  # Deepgram's default: raised to what Whisper can use, and said so
    assert short == MIN_ENDPOINTING_MS and warning.type == "adjusted" and "10 ms" in warning.message
    assert endpointing("60000")[0] == MAX_ENDPOINTING_MS


def test_language_multi_and_regional_tags() -> None:
    assert parse_query(query("encoding=linear16&sample_rate=16000&language=multi")).language is None
    assert parse_query(query("encoding=linear16&sample_rate=16000&language=pt-BR")).language == "pt"


@pytest.mark.parametrize("kind", list(ClientMessage))
def test_control_messages(kind: ClientMessage) -> None:
    assert parse_client_message(json.dumps({"type": kind.value, "keyterms": ["x"]})) is kind  # extra fields ignored


@pytest.mark.parametrize("text", ["{", "[]", '{"type": "finalize"}', '{"type": 3}', '{"kind": "KeepAlive"}', "[" * 99])
def test_anything_else_is_malformed(text: str) -> None:
    with pytest.raises(MalformedMessage):
        parse_client_message(text)


def test_an_oversize_text_frame_is_refused_before_parsing() -> None:
    with pytest.raises(FrameTooLarge):
        parse_client_message(" " * (MAX_TEXT_FRAME_CHARS + 1))


def test_plain_words_are_deepgrams() -> None:
    assert [plain_word(w) for w in ("Hello,", "don't", "U.S.", "'Tis", "well...", "?")] == [
        "hello",
        "don't",
        "u.s",
        "tis",
        "well",
        "?",
    ]


def test_results_parse_into_the_sdks_typed_model() -> None:
    words = (WordResult("Hello,", 1.0, 1.4, 0.9), WordResult("world.", 1.5, 1.9, 0.7))
    results = Results("req", model_info("tiny.en"), (0, 1), 1.0, 0.9, words, True, speech_final=True, punctuate=True)
    parsed = deepgram_types.ListenV1Results.model_validate(json.loads(results.to_json()))
    alternative = parsed.channel.alternatives[0]
    assert alternative.transcript == "Hello, world." and alternative.confidence == pytest.approx(0.8)
    assert [(w.word, w.punctuated_word) for w in alternative.words] == [("hello", "Hello,"), ("world", "world.")]
    assert parsed.is_final and parsed.speech_final and not parsed.from_finalize and parsed.channel_index == [0, 1]
    assert parsed.metadata.request_id == "req" and parsed.metadata.model_info.name == "tiny.en"
    plain = Results("req", model_info("tiny.en"), (0, 1), 1.0, 0.9, words, False)
    assert json.loads(plain.to_json())["channel"]["alternatives"][0]["transcript"] == "hello world"
    assert "punctuated_word" not in json.loads(plain.to_json())["channel"]["alternatives"][0]["words"][0]


def test_the_other_messages_parse_into_the_sdks_models() -> None:
    end = deepgram_types.ListenV1UtteranceEnd.model_validate(json.loads(UtteranceEnd((1, 2), 3.25).to_json()))
    assert end.channel == [1, 2] and end.last_word_end == 3.25
    warnings = (QueryWarning("diarize", "ignored", "not supported"),)
    metadata = Metadata("req", model_info("tiny.en"), "2026-01-01T00:00:00.000Z", "00" * 32, 2.5, 1, warnings)
    parsed = deepgram_types.ListenV1Metadata.model_validate(json.loads(metadata.to_json()))
    assert parsed.duration == 2.5 and parsed.channels == 1 and parsed.request_id == "req"
    assert json.loads(metadata.to_json())["warnings"] == [
        {"parameter": "diarize", "type": "ignored", "message": "not supported"}
    ]
    error = deepgram_types.ListenV1Error.model_validate(
        json.loads(DeepgramErrorMessage("SchemaError", "bad", "{").to_json())
    )
    assert (error.variant, error.description, error.message) == ("SchemaError", "bad", "{")


def test_model_ids_are_stable() -> None:
    assert model_info("tiny.en").uuid == model_info("tiny.en").uuid != model_info("base").uuid


def test_closes_are_deepgrams_where_it_has_one() -> None:
    assert close_for(None) == (1000, "")
    assert close_for(IdleTimeout("idle")) == (1011, "NET-0001")
    assert close_for(RateLimited("fast")) == (4429, "rate_limited")
    assert close_for(FrameTooLarge("big")) == (1009, "frame_too_large")
    # audio it cannot decode: Deepgram's DATA-0000
    assert close_for(BadContainer("cut short")) == close_for(UnsupportedAudio("AAC")) == (1008, "DATA-0000")


def test_diarize_is_read_and_words_carry_the_speaker_the_sdk_reads() -> None:
    assert parse_query(f"{DEEPGRAM_PATH}?encoding=linear16&sample_rate=16000&diarize=true").diarize
    assert not parse_query(f"{DEEPGRAM_PATH}?encoding=linear16&sample_rate=16000").diarize
    with pytest.raises(UnsupportedAudio, match="diarize must be true or false"):
        parse_query(f"{DEEPGRAM_PATH}?encoding=linear16&sample_rate=16000&diarize=maybe")
    words = (WordResult("Hello,", 1.0, 1.4, 0.9, 0, 0.83), WordResult("world.", 1.5, 1.9, 0.7, 1, 0.91))
    results = Results("req", model_info("tiny.en"), (0, 1), 1.0, 0.9, words, True)
    raw = json.loads(results.to_json())["channel"]["alternatives"][0]["words"]
    assert [(w["speaker"], w["speaker_confidence"]) for w in raw] == [(0, 0.83), (1, 0.91)]
    parsed = deepgram_types.ListenV1Results.model_validate(json.loads(results.to_json()))
    assert [w.speaker for w in parsed.channel.alternatives[0].words] == [0, 1]
    plain = Results("req", model_info("tiny.en"), (0, 1), 1.0, 0.9, (WordResult("a", 1.0, 1.2, 0.9),), True)
    assert "speaker" not in json.loads(plain.to_json())["channel"]["alternatives"][0]["words"][0]
