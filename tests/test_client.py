from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
import pytest

from streamer.client import SyncStreamerClient, connect, encode_audio, listen_url, transcribe
from streamer.core.audio import Encoding, decode_alaw, decode_mulaw
from streamer.engine.fake import ScriptedEngine, words_from_text
from streamer.server.protocol import Done, FinalMessage, ListenParams, Ready, SpeechEndedMessage
from streamer.server.serve import Server, ServerConfig
from tests.conftest import load_clip

WORDS = words_from_text(" ".join(f"w{i}" for i in range(200)), 0, 4000, 800)


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    async with Server(ServerConfig(port=0), ScriptedEngine(WORDS)) as srv:
        yield srv


def test_listen_url_adds_path_and_query() -> None:
    params = ListenParams(8000, Encoding.MULAW, 2, "en")
    expected = "ws://h:1/v1/listen?sample_rate=8000&encoding=mulaw&channels=2&language=en"
    assert listen_url("ws://h:1", params) == expected
    assert listen_url("ws://h:1/", params) == expected


@pytest.mark.parametrize("encoding", list(Encoding))
def test_encode_audio_round_trips_floats(encoding: Encoding) -> None:
    x = np.sin(np.linspace(0, 20, 800)).astype(np.float32) * 0.5
    data = encode_audio(x, encoding)
    assert len(data) == len(x) * encoding.bytes_per_sample
    decoded = {
        Encoding.PCM_S16LE: lambda b: np.frombuffer(b, "<i2") / 32768,
        Encoding.PCM_F32LE: lambda b: np.frombuffer(b, "<f4"),
        Encoding.MULAW: decode_mulaw,
        Encoding.ALAW: decode_alaw,
    }[encoding](data)
    assert np.max(np.abs(decoded - x)) < 0.02
    assert encode_audio(b"\x01\x02", encoding) == b"\x01\x02"  # bytes pass through


async def test_async_round_trip(server: Server) -> None:
    audio = load_clip("1089-134686-0001.flac")
    async with connect(f"ws://127.0.0.1:{server.port}") as client:
        assert isinstance(client.ready, Ready)
        for start in range(0, len(audio), 1600):
            await client.send_audio(audio[start : start + 1600])
        await client.finalize()
        await client.end()
        messages = [message async for message in client]
    assert isinstance(messages[-1], Done)
    assert client.done == messages[-1]
    assert client.close_code == 1000
    assert any(isinstance(m, FinalMessage) and m.text for m in messages)
    assert client.errors == []


async def test_sync_wrapper_and_transcribe(server: Server) -> None:
    audio = load_clip("1089-134686-0001.flac")
    url = f"ws://127.0.0.1:{server.port}"

    def blocking() -> tuple[str, Done | None]:
        with SyncStreamerClient(url) as client:
            client.send_audio(audio)
            client.end()
            list(client)
            done = client.done
        return transcribe(url, audio), done

    text, done = await asyncio.to_thread(blocking)
    assert text.startswith("w")
    assert done is not None and done.audio_seconds_received == pytest.approx(len(audio) / 16000, abs=1e-3)


async def test_sync_client_keepalive_and_close() -> None:
    import asyncio

    from streamer.client import SyncStreamerClient
    from streamer.engine.fake import ScriptedEngine
    from streamer.server.serve import Server, ServerConfig

    async with Server(ServerConfig(port=0), ScriptedEngine([])) as srv:

        def use() -> int | None:
            with SyncStreamerClient(f"ws://127.0.0.1:{srv.port}") as client:
                client.keepalive()
                client.close()
                return client._client.close_code

        assert await asyncio.get_running_loop().run_in_executor(None, use) == 1000


async def test_prompt_keywords_and_configure_reach_the_engine_and_speech_ended_is_parsed() -> None:
    seen: list[tuple[str, tuple[str, ...]]] = []
    engine = ScriptedEngine(lambda r: seen.append((r.options.initial_prompt, r.options.keywords)) or WORDS)
    audio = load_clip("1089-134686-0001.flac")
    async with (
        Server(ServerConfig(port=0), engine) as srv,
        connect(f"ws://127.0.0.1:{srv.port}", prompt="Belly talk.", keywords=["counselled", "a,b"]) as client,
    ):
        await client.send_audio(audio[: len(audio) // 2])
        await client.configure(keywords=["Zoë"])
        await client.send_audio(audio[len(audio) // 2 :])
        await client.end()
        messages = [message async for message in client]
    assert ("Belly talk.", ("counselled", "a", "b")) in seen  # a comma separates keywords in the query
    assert seen[-1] == ("Belly talk.", ("Zoë",))  # configure applied to the windows after it
    ended = [m for m in messages if isinstance(m, SpeechEndedMessage)]
    assert ended and ended[-1].reason == "end_of_stream"
    assert isinstance(messages[-1], Done)
