from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from streamer.engine.fake import FakeBehaviour, ScriptedEngine, words_from_text
from streamer.engine.types import EngineInfo
from streamer.errors import ConfigError, SlowReader
from streamer.events import Final, Partial
from streamer.protocol import ErrorMessage
from streamer.server import Server, ServerConfig
from streamer.session import SessionOptions, _Close, _Outbox, _Transcript
from tests.helpers import chunks, exchange, pcm16, speech, until

WORDS = words_from_text(" ".join(f"w{i}" for i in range(200)), 0, 4000, 800)


def partial(channel: int, segment: int, text: str) -> _Transcript:
    return _Transcript(channel, Partial(segment, text, 0, 1, (), 1))


def final(channel: int, segment: int, text: str) -> _Transcript:
    return _Transcript(channel, Final(segment, text, 0, 1, (), 1))


def test_a_newer_partial_replaces_the_queued_one_of_its_channel() -> None:
    outbox = _Outbox(capacity=8)
    outbox.put(partial(0, 0, "a"))
    outbox.put(partial(1, 0, "x"))
    outbox.put(partial(0, 0, "a b"))
    assert list(outbox.items) == [partial(1, 0, "x"), partial(0, 0, "a b")]
    assert outbox.dropped_partials == 1


def test_a_full_buffer_drops_stale_partials_before_finals() -> None:
    outbox = _Outbox(capacity=3)
    outbox.put(final(0, 0, "one"))
    outbox.put(partial(1, 0, "two"))
    outbox.put(final(0, 1, "three"))
    outbox.put(final(0, 2, "four"))  # full: the partial goes
    assert [item.event.text for item in outbox.items if isinstance(item, _Transcript)] == ["one", "three", "four"]


def test_when_only_finals_fill_the_buffer_the_reader_is_too_slow() -> None:
    outbox = _Outbox(capacity=2)
    outbox.put(final(0, 0, "one"))
    outbox.put(ErrorMessage(code="engine_failure", message="m"))
    with pytest.raises(SlowReader) as info:
        outbox.put(final(0, 1, "two"))
    assert info.value.close_code == 4408
    outbox.put(_Close(4408, "slow_reader"))  # a close always fits


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_frame_bytes", 1),
        ("idle_timeout", 0),
        ("max_session_seconds", -1),
        ("send_buffer", 1),
        ("flush_timeout", 0),
    ],
)
def test_options_are_validated(field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=field):
        replace(SessionOptions(), **{field: value}).validate()


async def test_max_session_seconds_closes_with_session_too_long() -> None:
    srv = Server(
        ServerConfig(port=0, session=replace(SessionOptions(), max_session_seconds=0.3)), ScriptedEngine(WORDS)
    )
    async with srv:
        ws = await ws_connect(f"ws://127.0.0.1:{srv.port}/v1/listen")
        async with ws:
            messages = []
            with pytest.raises(ConnectionClosed):
                while True:
                    await ws.send(b"\0\0" * 1600)
                    messages.append(json.loads(await ws.recv()))
    assert ws.close_code == 4408
    assert messages[-1]["code"] == "session_too_long"


async def test_an_odd_trailing_byte_is_carried_into_the_next_frame() -> None:
    srv = Server(ServerConfig(port=0), ScriptedEngine(WORDS))
    async with srv:
        ws = await ws_connect(f"ws://127.0.0.1:{srv.port}/v1/listen")
        async with ws:
            await ws.recv()
            for _ in range(10):
                await ws.send(b"\0" * 3201)  # 1600.5 samples each
            await ws.send('{"type":"end"}')
            messages = []
            with pytest.raises(ConnectionClosed):
                while True:
                    messages.append(json.loads(await ws.recv()))
    assert messages[-1]["audio_seconds_received"] == pytest.approx(16005 / 16000)


TINY_EN = EngineInfo(model="tiny.en", multilingual=False, encoder="fake", decoder="fake")


async def test_a_language_the_model_cannot_serve_is_refused_at_connect_with_4415_and_the_reason() -> None:
    async with Server(ServerConfig(port=0), ScriptedEngine(WORDS, info=TINY_EN)) as srv:
        for language, reason in (
            ("xx", "language 'xx' is not supported by tiny.en"),
            ("de", "language 'de' is not supported by tiny.en (English-only model)"),
        ):
            messages, code = await exchange(srv, [], query=f"?language={language}")
            assert code == 4415
            assert messages == [{"type": "error", "code": "unsupported_audio", "message": reason}]  # no ready
        # refused before any audio; the runner gives the connection's slot back as it ends
        await until(lambda: srv.scheduler is not None and srv.scheduler.active_sessions == 0)
        messages, code = await exchange(srv, [*chunks(pcm16(speech())), '{"type":"end"}'], query="?language=en")
    assert code == 1000 and messages[0]["type"] == "ready" and messages[-1]["lost_seconds"] == 0


async def test_a_stream_the_engine_fails_on_loses_its_own_audio_and_no_one_else_s() -> None:
    # the model claims German but fails on it: the connect check lets it through, the engine raises on every batch
    # holding a German window, and the scheduler decodes the others of that batch again alone
    info = replace(TINY_EN, multilingual=True, languages=frozenset({"en", "de"}))
    behaviour = FakeBehaviour(fail_languages=frozenset({"de"}), real_time_factor=0.05)  # slow enough to batch
    async with Server(ServerConfig(port=0), ScriptedEngine(WORDS, behaviour, info=info)) as srv:
        frames = [*chunks(pcm16(speech())), '{"type":"end"}']
        (english, english_code), (german, german_code) = await asyncio.gather(
            exchange(srv, frames), exchange(srv, frames, query="?language=de")
        )
        assert srv.metrics.windows_retried.value > 0  # they did share a batch that raised
    assert english_code == german_code == 1000
    # the English stream: every final, nothing lost
    assert not [m for m in english if m["type"] == "error"]
    done = english[-1]
    assert done["lost_seconds"] == 0 and [m for m in english if m["type"] == "final" and m["text"]]
    assert done["audio_seconds_transcribed"] + done["non_speech_seconds"] == pytest.approx(
        done["audio_seconds_received"], abs=1e-4
    )
    # the German one: engine_failure errors naming every range it lost, and they account for all its speech
    errors = [m for m in german if m["type"] == "error"]
    assert errors and all(e["code"] == "engine_failure" and e["lost"]["start"] < e["lost"]["end"] for e in errors)
    done = german[-1]
    assert done["audio_seconds_transcribed"] == 0 and not [m for m in german if m["type"] == "final" and m["text"]]
    assert done["lost_seconds"] == pytest.approx(sum(e["lost"]["end"] - e["lost"]["start"] for e in errors), abs=1e-3)
    assert done["non_speech_seconds"] + done["lost_seconds"] == pytest.approx(done["audio_seconds_received"], abs=1e-4)
