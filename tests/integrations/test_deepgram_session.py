"""The Deepgram-compatible endpoint: the adapter alone (frames and ``now`` in, messages and a close out), then the
official ``deepgram-sdk`` live client against a real server, on the scripted engine and on tiny.en."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import warnings
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from streamer.app import App
from streamer.core.audio import encode_mulaw, resample
from streamer.core.options import CoreOptions
from streamer.engine.fake import ScriptedEngine, synthetic_silence, synthetic_voice
from streamer.integrations.deepgram import DEEPGRAM_PATH, DEEPGRAM_PREFIX
from streamer.integrations.deepgram_session import open_deepgram_session
from streamer.server.adapter import LOST, Close
from streamer.server.auth import AuthOptions
from streamer.server.lifecycle import Phase
from streamer.server.ratelimit import RateLimitOptions
from streamer.server.scheduler import Scheduler, SchedulerOptions
from streamer.server.serve import Server, ServerConfig
from streamer.server.session_options import SessionOptions
from tests.helpers import WORDS, chunks, pcm16, pump

KEY = "dg-streamer-test-key-0123456789"
QUERY = "encoding=linear16&sample_rate=16000&interim_results=true&utterance_end_ms=1000&vad_events=true"


def utterances(*seconds: float) -> npt.NDArray[np.float32]:
    """Synthetic speech of each length, each followed by 2 s of silence (past the end point and utterance_end_ms)."""
    parts = []
    for seed, length in enumerate(seconds):
        parts += [synthetic_voice(int(length * 16000), seed), synthetic_silence(2 * 16000, seed)]
    return np.concatenate(parts)


class Deepgram:
    """A Deepgram adapter over a scheduler the test runs by hand (:func:`tests.helpers.pump`)."""

    def __init__(self, query: str = QUERY, options: SessionOptions | None = None) -> None:
        self.engine = ScriptedEngine(WORDS)
        self.scheduler = Scheduler(self.engine, SchedulerOptions())
        self.adapter = open_deepgram_session(
            f"{DEEPGRAM_PATH}?{query}",
            self.scheduler,
            CoreOptions(),
            options or SessionOptions(),
            "tiny.en",
            "2026-01-01T00:00:00.000Z",
            now=0.0,
        )

    def audio(self, data: bytes, now: float = 0.0, frame: int = 3200) -> list[dict[str, Any]]:
        """Send ``data`` in frames of ``frame`` bytes, decoding as a live server would between them."""
        for piece in chunks(data, frame):
            self.adapter.receive_bytes(piece, now)
            pump(self.scheduler, self.engine)
        return self.messages(now)

    def text(self, message: dict[str, Any] | str, now: float = 0.0) -> list[dict[str, Any]]:
        self.adapter.receive_text(message if isinstance(message, str) else json.dumps(message), now)
        pump(self.scheduler, self.engine)
        return self.messages(now)

    def messages(self, now: float = 0.0) -> list[dict[str, Any]]:
        return [json.loads(frame) for frame in self.adapter.messages_to_send(now)]


def finals(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [m for m in messages if m["type"] == "Results" and m["is_final"]]


def types(messages: list[dict[str, Any]]) -> list[str]:
    return [m["type"] if m["type"] != "Results" else ("final" if m["is_final"] else "interim") for m in messages]


# -- the adapter alone -------------------------------------------------------------------------------------------------


def test_an_utterance_gives_interims_finals_speech_final_then_utterance_end() -> None:
    deepgram = Deepgram()
    messages = deepgram.audio(pcm16(utterances(2.0, 1.5)))
    messages += deepgram.text({"type": "CloseStream"}, 1.0)
    kinds = types(messages)
    assert kinds[0] == "SpeechStarted" and "interim" in kinds
    assert kinds.count("SpeechStarted") == 2 and kinds.count("UtteranceEnd") == 2
    assert kinds[-1] == "Metadata" and deepgram.adapter.close_action() == Close(1000, "")
    # each utterance: its last final says speech_final, and its UtteranceEnd follows it, at its last word's end
    for end in (i for i, kind in enumerate(kinds) if kind == "UtteranceEnd"):
        last = next(m for m in reversed(messages[:end]) if m["type"] == "Results" and m["is_final"])
        assert last["speech_final"] and not last["from_finalize"]
        words = [w for m in finals(messages[:end]) for w in m["channel"]["alternatives"][0]["words"]]
        assert messages[end]["last_word_end"] == words[-1]["end"] and messages[end]["channel"] == [0, 1]
    said = " ".join(m["channel"]["alternatives"][0]["transcript"] for m in finals(messages)).split()
    numbers = [int(word[1:]) for word in said]
    assert numbers == sorted(set(numbers)) and numbers[0] == 0 and len(numbers) >= 8  # each word once, in order
    metadata = messages[-1]
    assert metadata["duration"] == pytest.approx(len(utterances(2.0, 1.5)) / 16000) and metadata["channels"] == 1
    assert metadata["request_id"] == deepgram.adapter.id == messages[1]["metadata"]["request_id"]


def test_without_interim_results_only_finals_are_sent() -> None:
    deepgram = Deepgram("encoding=linear16&sample_rate=16000")
    kinds = set(types(deepgram.audio(pcm16(utterances(2.0)))))
    assert kinds == {"final"}  # no interims, no SpeechStarted, no UtteranceEnd unless asked for


def test_finalize_makes_the_open_utterance_final_from_finalize() -> None:
    deepgram = Deepgram()
    deepgram.audio(pcm16(synthetic_voice(2 * 16000)))
    messages = deepgram.text({"type": "Finalize"})
    last = finals(messages)[-1]
    assert last["from_finalize"] and not last["speech_final"] and last["channel"]["alternatives"][0]["transcript"]
    # with nothing open, Finalize still answers with a final marked from_finalize (an empty one)
    deepgram.audio(pcm16(synthetic_silence(16000)))
    [empty] = finals(deepgram.text({"type": "Finalize"}))
    assert empty["from_finalize"] and empty["channel"]["alternatives"][0]["transcript"] == ""
    assert deepgram.adapter.reading  # the stream goes on


def test_multichannel_transcribes_each_channel_and_mixes_down_otherwise() -> None:
    left, right = synthetic_voice(2 * 16000), synthetic_silence(2 * 16000)
    stereo = pcm16(np.stack([np.concatenate([left, right]), np.concatenate([right, right])]).T.reshape(-1))
    separate = Deepgram("encoding=linear16&sample_rate=16000&channels=2&multichannel=true")
    indexes = {tuple(m["channel_index"]) for m in finals(separate.audio(stereo))}
    assert indexes == {(0, 2)}  # only the left channel spoke
    assert len(separate.adapter.channels) == 2
    mixed = Deepgram("encoding=linear16&sample_rate=16000&channels=2")
    assert {tuple(m["channel_index"]) for m in finals(mixed.audio(stereo))} == {(0, 1)}


def test_g711_at_8k_is_resampled() -> None:
    deepgram = Deepgram("encoding=mulaw&sample_rate=8000")
    messages = deepgram.audio(encode_mulaw(resample(utterances(2.0), 16000, 8000)), frame=800)
    assert " ".join(m["channel"]["alternatives"][0]["transcript"] for m in finals(messages)).startswith("w0")


def test_the_query_reaches_the_cores() -> None:
    deepgram = Deepgram("encoding=linear16&sample_rate=16000&endpointing=900&keyterm=Helstone&keywords=kine:3")
    core = deepgram.adapter.transcriber.track("0").core if deepgram.adapter.transcriber else None
    assert core is not None
    assert core.options.endpoint_ms == 900 and core.options.decode.keywords == ("Helstone", "kine")
    off = Deepgram("encoding=linear16&sample_rate=16000&endpointing=false")
    assert not any(m["speech_final"] for m in finals(off.audio(pcm16(utterances(1.5)) + pcm16(utterances(1.0)))))


def test_unknown_json_gets_a_schema_error_and_the_stream_goes_on() -> None:
    deepgram = Deepgram()
    for frame in ("{", '{"type": "Shout"}', "[1]"):
        [error] = deepgram.text(frame)
        assert error["type"] == "Error" and error["variant"] == "SchemaError" and error["message"] == frame
    assert deepgram.adapter.reading and deepgram.adapter.close_action() is None
    assert finals(deepgram.audio(pcm16(utterances(1.5))))  # audio after them is transcribed


def test_configure_is_answered_with_configure_failure() -> None:
    [answer] = Deepgram().text({"type": "Configure", "keyterms": ["x"]})
    assert answer["type"] == "ConfigureFailure" and answer["code"] == "CONFIGURE_KEYTERMS_NOT_SUPPORTED"


def test_keepalive_holds_off_the_idle_timeout_which_then_closes_1011_net_0001() -> None:
    deepgram = Deepgram(options=SessionOptions(idle_timeout=10.0))
    deepgram.audio(pcm16(synthetic_voice(16000)), now=1.0)
    deepgram.text({"type": "KeepAlive"}, 9.0)
    assert deepgram.adapter.next_deadline() == 19.0
    deepgram.adapter.receive_timer(19.0)
    assert deepgram.adapter.phase is Phase.DRAINING  # the last finals first
    pump(deepgram.scheduler, deepgram.engine)
    messages = deepgram.messages()
    assert "final" in types(messages) and types(messages)[-2:] == ["Metadata", "Error"]
    assert messages[-1]["variant"] == "idle_timeout"
    assert deepgram.adapter.close_action() == Close(1011, "NET-0001")


def test_a_flush_that_gets_nowhere_names_the_audio_it_gave_up_on() -> None:
    deepgram = Deepgram(options=SessionOptions(flush_timeout=10.0))
    deepgram.messages()
    for piece in chunks(pcm16(synthetic_voice(32000)), 3200):
        deepgram.adapter.receive_bytes(piece, 1.0)  # nobody decodes
    deepgram.adapter.receive_text(json.dumps({"type": "CloseStream"}), 2.0)
    assert deepgram.adapter.next_deadline() == 12.0
    deepgram.adapter.receive_timer(12.0)
    messages = deepgram.messages()
    [lost] = [m for m in messages if m["type"] == "Error"]
    assert lost["variant"] == "engine_failure"
    assert lost["description"] == (
        "the engine did not finish this audio in time: 0.0-2.0 s of channel 0 is not transcribed"
    )
    assert types(messages)[-1] == "Metadata" and deepgram.adapter.close_action() == Close(1000, "")


def test_an_oversize_frame_closes_1009_after_what_was_accepted() -> None:
    deepgram = Deepgram(options=SessionOptions(max_frame_bytes=64000))
    deepgram.audio(pcm16(synthetic_voice(16000)))
    deepgram.adapter.receive_bytes(b"\0" * 64001, 2.0)
    pump(deepgram.scheduler, deepgram.engine)
    messages = deepgram.messages()
    assert finals(messages)[0]["channel"]["alternatives"][0]["transcript"].startswith("w0")  # nothing accepted is lost
    assert messages[-1]["variant"] == "frame_too_large" and messages[-2]["type"] == "Metadata"
    assert deepgram.adapter.close_action() == Close(1009, "frame_too_large")


def test_an_empty_binary_frame_is_close_stream() -> None:
    deepgram = Deepgram()
    deepgram.audio(pcm16(synthetic_voice(16000)))
    deepgram.adapter.receive_bytes(b"", 1.0)
    pump(deepgram.scheduler, deepgram.engine)
    messages = deepgram.messages()
    assert (
        "final" in types(messages)
        and types(messages)[-1] == "Metadata"
        and deepgram.adapter.close_action() == Close(1000, "")
    )


def test_audio_beyond_the_rate_limit_closes_4429() -> None:
    options = SessionOptions(rate_limit=RateLimitOptions(max_rate=1.0, burst_seconds=1.0))
    deepgram = Deepgram(options=options)
    messages = deepgram.audio(pcm16(synthetic_voice(2 * 16000)))  # twice the burst, at once
    assert "final" in types(messages)  # the second accepted before the refusal is transcribed
    assert messages[-1]["variant"] == "rate_limited"
    assert deepgram.adapter.close_action() == Close(4429, "rate_limited")


def test_a_client_that_does_not_read_is_cut_with_slow_reader() -> None:
    deepgram = Deepgram(options=SessionOptions(send_buffer=4))
    for _ in range(6):
        deepgram.adapter.receive_text("{", 1.0)  # a SchemaError each, none read
    [error] = deepgram.messages()
    assert error["variant"] == "slow_reader" and deepgram.adapter.close_action() == Close(4408, "slow_reader")


def test_a_client_that_leaves_ends_the_stream_at_once() -> None:
    deepgram = Deepgram()
    deepgram.adapter.receive_bytes(pcm16(synthetic_voice(16000)), 1.0)
    deepgram.adapter.receive_connection_lost(2.0)
    assert deepgram.adapter.close_action() == LOST and deepgram.adapter.next_deadline() is None
    deepgram.adapter.release()
    assert deepgram.scheduler.next_batch() is None  # it let go of the scheduler


# -- over a real server, with the official client ----------------------------------------------------------------------


def sdk() -> Any:
    """The official SDK's modules. Its async live client imports websockets' legacy API, which warns on import."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        deepgram = pytest.importorskip("deepgram")
        from deepgram.listen.v1 import raw_client

    return deepgram, raw_client


def client(port: int, key: str = KEY) -> Any:
    """An SDK client with nothing changed but the base URL and the key."""
    deepgram, _ = sdk()
    base = f"127.0.0.1:{port}{DEEPGRAM_PREFIX}"
    environment = deepgram.DeepgramClientEnvironment(
        base=f"http://{base}", production=f"ws://{base}", agent=f"ws://{base}", agent_rest=f"http://{base}"
    )
    return deepgram.AsyncDeepgramClient(api_key=key, environment=environment)


async def received(connection: Any, until: str = "Metadata") -> list[Any]:
    """Every message the SDK parses until ``until`` or the close (the timeout only guards against a hang)."""
    messages: list[Any] = []
    with contextlib.suppress(ConnectionClosed):
        async with asyncio.timeout(120):
            while not messages or getattr(messages[-1], "type", None) != until:
                messages.append(await connection.recv())
    return messages


def two_utterances(messages: list[Any]) -> list[Any]:
    """Check what the SDK parsed of a stream of two utterances, with interim results, utterance_end_ms and vad_events:
    speech started, interims, one speech_final and one UtteranceEnd each, Metadata last. Returns the Results."""
    kinds = [type(m).__name__ for m in messages]
    assert {"ListenV1SpeechStarted", "ListenV1Results", "ListenV1UtteranceEnd"} <= set(kinds)
    assert kinds[-1] == "ListenV1Metadata" and kinds.count("ListenV1UtteranceEnd") == 2
    results = [m for m in messages if type(m).__name__ == "ListenV1Results"]
    assert any(not r.is_final for r in results) and sum(bool(r.speech_final) for r in results) == 2
    return results


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    config = ServerConfig(port=0, auth=AuthOptions(api_keys=frozenset({KEY})))
    async with App(config, ScriptedEngine(WORDS)) as srv:
        yield srv


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
async def test_the_sdk_streams_and_gets_typed_results_and_metadata(server: Server) -> None:
    async with client(server.port).listen.v1.connect(
        model="nova-3", encoding="linear16", sample_rate=16000, interim_results="true", utterance_end_ms="1000",
        vad_events="true", smart_format="true", redact="pci",
    ) as connection:  # fmt: skip
        for frame in chunks(pcm16(utterances(2.0, 1.5)), 3200):
            await connection.send_media(frame)
        await connection.send_close_stream()
        messages = await received(connection)
    results = two_utterances(messages)
    text = " ".join(r.channel.alternatives[0].transcript for r in results if r.is_final)
    assert text.split()[:3] == ["w0", "w1", "w2"]
    warnings_ = {w["parameter"]: w["type"] for w in messages[-1].model_extra["warnings"]}
    assert warnings_ == {"redact": "ignored", "model": "adjusted"}  # nova-3 is served by the loaded model


@pytest.mark.skipif(
    importlib.util.find_spec("resemblyzer") is None,
    reason="the Resemblyzer package is not installed (pip install --no-deps Resemblyzer==0.1.4)",
)
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
async def test_the_sdk_asks_diarize_and_reads_each_reader_s_speaker_on_the_words(server: Server) -> None:
    """Two readers (the committed clips) through the real voice encoder: the SDK's typed words carry speakers."""
    from tests.server.test_speaker_worker import AUDIO, B_STARTS

    async with client(server.port).listen.v1.connect(
        model="nova-3", encoding="linear16", sample_rate=16000, diarize="true"
    ) as connection:
        for frame in chunks(pcm16(AUDIO), 3200):
            await connection.send_media(frame)
        await connection.send_close_stream()
        messages = await received(connection)
    words = [w for m in messages if type(m).__name__ == "ListenV1Results" for w in m.channel.alternatives[0].words]
    assert words and all(w.speaker is not None for w in words)
    first = {w.speaker for w in words if w.end * 16000 < B_STARTS - 16000}
    second = {w.speaker for w in words if w.start * 16000 > B_STARTS + 16000}
    assert len(first) == 1 and len(second) == 1 and first != second


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
async def test_a_bad_query_is_refused_with_http_400_naming_why(server: Server) -> None:
    deepgram, _ = sdk()
    with pytest.raises(deepgram.core.api_error.ApiError) as refused:
        async with client(server.port).listen.v1.connect(model="nova-3", encoding="flac", sample_rate=48000):
            pass
    assert refused.value.status_code == 400
    with pytest.raises(InvalidStatus) as raw:
        async with ws_connect(f"ws://127.0.0.1:{server.port}{DEEPGRAM_PATH}?model=nova-3&encoding=speex"):
            pass
    assert raw.value.response.status_code == 400
    assert "encoding 'speex' is not supported" in raw.value.response.headers["dg-error"]
    assert json.loads(raw.value.response.body)["err_code"] == "unsupported_audio"


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
async def test_a_bad_key_gets_an_error_and_4401(server: Server) -> None:
    async with client(server.port, key="not-the-key-0123456789").listen.v1.connect(
        model="nova-3", encoding="linear16", sample_rate=16000
    ) as connection:
        [error] = await received(connection, until="Error")
    assert error.variant == "unauthorized"


async def test_the_key_as_the_token_subprotocol_of_browsers(server: Server) -> None:
    url = f"ws://127.0.0.1:{server.port}{DEEPGRAM_PATH}?encoding=linear16&sample_rate=16000"
    async with ws_connect(url, subprotocols=["token", KEY]) as ws:  # type: ignore[list-item]
        assert ws.subprotocol == "token"  # selected, never the key
        await ws.send(pcm16(utterances(1.5)))
        await ws.send(json.dumps({"type": "CloseStream"}))
        messages = [json.loads(m) async for m in ws]
    assert messages[-1]["type"] == "Metadata" and ws.close_code == 1000
    async with ws_connect(url, subprotocols=["token", "wrong-key-0123456789"]) as ws:  # type: ignore[list-item]
        with pytest.raises(ConnectionClosed):
            await ws.recv()
            await ws.recv()
    assert ws.close_code == 4401


async def test_an_oversize_frame_over_the_wire_closes_1009() -> None:
    config = ServerConfig(port=0, session=replace(SessionOptions(), max_frame_bytes=64000))
    async with App(config, ScriptedEngine(WORDS)) as srv:
        url = f"ws://127.0.0.1:{srv.port}{DEEPGRAM_PATH}?encoding=linear16&sample_rate=16000"
        async with ws_connect(url) as ws:
            await ws.send(b"\0" * 64002)
            messages = []
            with contextlib.suppress(ConnectionClosed):
                async for message in ws:
                    messages.append(json.loads(message))
    assert messages[-1]["variant"] == "frame_too_large" and ws.close_code == 1009


# -- tiny.en on LibriSpeech: the SDK against the native endpoint ------------------------------------------------------

# the ten test-other utterances of speaker 1688 (one chapter, read in order, 67 s), with their references
UTTERANCES = [f"test-other/1688/142285/1688-142285-000{i}.flac" for i in range(10)]


def librispeech(shared: Path) -> tuple[npt.NDArray[np.float32], list[str]]:
    """The utterances one after another, each followed by 2 s of silence, and their references."""
    import soundfile as sf

    references = dict(
        line.split("\t", 1) for line in (shared / "librispeech" / "transcripts.tsv").read_text().splitlines()[1:]
    )
    parts: list[npt.NDArray[np.float32]] = []
    for name in UTTERANCES:
        audio, rate = sf.read(shared / "librispeech" / name, dtype="float32")
        assert rate == 16000
        parts += [audio, np.zeros(2 * 16000, dtype=np.float32)]
    return np.concatenate(parts), [references[name] for name in UTTERANCES]


async def native_transcript(port: int, audio: bytes) -> str:
    async with ws_connect(f"ws://127.0.0.1:{port}/v1/listen?sample_rate=16000", max_queue=None) as ws:
        for frame in chunks(audio, 3200):
            await ws.send(frame)
        await ws.send(json.dumps({"type": "end"}))
        messages = [json.loads(m) async for m in ws]
    return " ".join(m["text"] for m in messages if m["type"] == "final")


@pytest.mark.model
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
async def test_the_sdk_on_tiny_en_matches_the_native_endpoints_wer(shared_data: Path, tiny_engine: Any) -> None:
    from streamer.offline.normalize import normalize_english, word_error_rate

    audio, references = librispeech(shared_data)
    data = pcm16(audio)

    async def deepgram_messages(port: int) -> list[Any]:
        async with client(port, key="any").listen.v1.connect(
            model="nova-3", encoding="linear16", sample_rate=16000, interim_results="true",
            utterance_end_ms="1000", punctuate="true", smart_format="true",
        ) as connection:  # fmt: skip
            for frame in chunks(data, 3200):
                await connection.send_media(frame)
            await connection.send_close_stream()
            return await received(connection)

    # both streams at once on one server: their windows share the engine's batches, so both see the same load. The
    # 87 s are sent at once, faster than a shared CPU decodes them: no audio rate limit, and all the time the
    # transcripts take after CloseStream (the flush would otherwise cut them at 10 s)
    patient = replace(SessionOptions(), rate_limit=RateLimitOptions(max_rate=0), flush_timeout=600.0)
    async with App(ServerConfig(port=0, session=patient), tiny_engine) as srv:
        messages, native = await asyncio.gather(deepgram_messages(srv.port), native_transcript(srv.port, data))
    results = [m for m in messages if type(m).__name__ == "ListenV1Results"]
    # (no interims need arrive: sent at once, each utterance is whole before its first window is decoded; interims
    # are tested on paced audio in test_an_utterance_gives_interims_finals_speech_final_then_utterance_end)
    ends = [m for m in messages if type(m).__name__ == "ListenV1UtteranceEnd"]
    assert len(ends) == len(UTTERANCES)  # one after each utterance
    deepgram_text = " ".join(r.channel.alternatives[0].transcript for r in results if r.is_final)
    reference = normalize_english(" ".join(references))
    ours = word_error_rate([reference], [normalize_english(deepgram_text)]).wer
    theirs = word_error_rate([reference], [normalize_english(native)]).wer
    print(f"deepgram endpoint WER {ours:.4f}, native /v1/listen WER {theirs:.4f}")
    # sent faster than real time, the two streams' windows fall where the shared engine's load puts them (a stream's
    # windows coalesce while one is outstanding), so a word or two can differ either way: within 2 % of 177 words
    assert abs(ours - theirs) <= 0.02, (deepgram_text, native)
    assert ours < 0.25


# -- speakers (diarize=true) -------------------------------------------------------------------------------------------


def test_diarize_labels_every_word_with_its_reader_and_speaker_confidence() -> None:
    from streamer.server.metrics import ServerMetrics
    from streamer.server.speaker_worker import SpeakerWorker
    from tests.server.test_speaker_worker import AUDIO, B_STARTS, by_reader

    engine = ScriptedEngine(WORDS)
    scheduler = Scheduler(engine, SchedulerOptions())
    speakers = SpeakerWorker(ServerMetrics(), load=lambda: pytest.fail("the test embeds"), available=True)
    adapter = open_deepgram_session(
        f"{DEEPGRAM_PATH}?encoding=linear16&sample_rate=16000&diarize=true",
        scheduler,
        CoreOptions(),
        SessionOptions(),
        "tiny.en",
        "2026-01-01T00:00:00.000Z",
        now=0.0,
        speakers=speakers,
    )

    def run() -> None:
        while True:
            batch = speakers.next_batch()
            if batch:
                speakers.deliver(batch, by_reader([r for _, rs in batch for r in rs]))
            if not pump(scheduler, engine) and not batch:
                return

    for piece in chunks(pcm16(AUDIO)):
        adapter.receive_bytes(piece, 0.0)
        run()
    adapter.receive_text('{"type": "CloseStream"}', 0.0)
    run()
    out = [json.loads(frame) for frame in adapter.messages_to_send(0.0)]
    words = [w for m in finals(out) for w in m["channel"]["alternatives"][0]["words"]]
    assert words and all(w["speaker"] in (0, 1) and 0.0 <= w["speaker_confidence"] <= 1.0 for w in words)
    assert {w["speaker"] for w in words if w["end"] * 16000 < B_STARTS - 8000} == {0}
    assert {w["speaker"] for w in words if w["start"] * 16000 > B_STARTS + 8000} == {1}


def test_diarize_on_a_server_without_the_speaker_model_is_refused_at_the_handshake() -> None:
    from streamer.integrations.deepgram_session import handshake_refusal
    from streamer.server.metrics import ServerMetrics
    from streamer.server.speaker_worker import SpeakerWorker

    unavailable = SpeakerWorker(ServerMetrics(), available=False)
    path = f"{DEEPGRAM_PATH}?encoding=linear16&sample_rate=16000&diarize=true"
    refusal = handshake_refusal(path, ScriptedEngine(WORDS).info, CoreOptions(), unavailable)
    assert refusal is not None and refusal.status_code == 400
    assert json.loads(refusal.body)["err_code"] == "diarization_unavailable"
    assert (
        handshake_refusal(path.replace("&diarize=true", ""), ScriptedEngine(WORDS).info, CoreOptions(), unavailable)
        is None
    )
