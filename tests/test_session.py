from __future__ import annotations

import json
from dataclasses import replace

import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from streamer.engine.fake import ScriptedEngine, words_from_text
from streamer.errors import ConfigError, SlowReader
from streamer.events import Final, Partial
from streamer.protocol import ErrorMessage
from streamer.server import Server, ServerConfig
from streamer.session import SessionOptions, _Close, _Outbox, _Transcript

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
