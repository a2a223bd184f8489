from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus

from streamer.app import App
from streamer.bench.server_process import free_port
from streamer.cli.terminal import paced_chunks
from streamer.client import (
    ReconnectOptions,
    StreamerClient,
    SyncStreamerClient,
    connect,
    encode_audio,
    listen_url,
    transcribe,
)
from streamer.core.audio import Encoding, decode_alaw, decode_mulaw
from streamer.core.errors import SessionLost
from streamer.engine.fake import ScriptedEngine, words_from_text
from streamer.offline.normalize import normalize_english, word_error_rate
from streamer.server.listen_query import ListenParams
from streamer.server.resume import RedisSessionStore
from streamer.server.scheduler import SchedulerOptions
from streamer.server.serve import Server, ServerConfig
from streamer.server.server_messages import Done, FinalMessage, LostRange, Ready, SpeechEndedMessage
from tests.conftest import CLIPS, load_clip
from tests.helpers import config, received_seconds, until
from tests.reliability.helpers import looped_speech
from tests.tcp_proxy import TcpProxy, tcp_proxy

if TYPE_CHECKING:
    from streamer.engine.whisper import WhisperEngine

# 9.9 s that tiny.en transcribes the same way from run to run when streamed (tests/test_web.py)
REAL_CLIP = "121-127105-0000.flac"
WORDS = words_from_text(" ".join(f"w{i}" for i in range(200)), 0, 4000, 800)


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    async with App(ServerConfig(port=0), ScriptedEngine(WORDS)) as srv:
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


@dataclass
class LogicalClock:
    """The client's clock, set by the test: the speaker-felt delays come out exact."""

    now: float = 0.0

    def __call__(self) -> float:
        return self.now


def chunk_sent_at(seconds: float, chunk: int = 1600) -> float:
    """When a test that sends chunk i at i * 0.1 s sent the frame just before ``seconds``."""
    return (max(0, round(seconds * 16000) - 1) // chunk) * 0.1


async def test_the_summary_gives_the_speaker_felt_final_delay_beside_the_servers_share(server: Server) -> None:
    audio = load_clip("1089-134686-0001.flac")
    clock = LogicalClock()
    async with connect(f"ws://127.0.0.1:{server.port}", clock=clock) as client:
        for i, start in enumerate(range(0, len(audio), 1600)):
            clock.now = i * 0.1  # chunk i is spoken and sent at its real-time moment
            await client.send_audio(audio[start : start + 1600])
        clock.now = 100.0  # every final arrives now
        await client.end()
        finals = [m async for m in client if isinstance(m, FinalMessage) and m.text.strip()]
    assert finals and len(client.final_delays) == len(finals)
    expected = [1000 * (100.0 - chunk_sent_at(f.words[-1].end)) for f in finals]
    assert [d.felt_ms for d in client.final_delays] == pytest.approx(expected)
    assert [(d.seq, d.server_ms) for d in client.final_delays] == [(f.seq, f.latency_ms) for f in finals]
    summary = client.summary
    assert summary.done == client.done and summary.finals_measured == len(finals)
    assert summary.final_delay_ms.p50 == pytest.approx(float(np.percentile(expected, 50)))
    assert summary.final_delay_ms.p95 == pytest.approx(float(np.percentile(expected, 95)))
    server_ms = [f.latency_ms for f in finals]
    assert summary.server_final_latency_ms.p95 == pytest.approx(float(np.percentile(server_ms, 95)))


async def test_a_container_stream_has_no_speaker_felt_delay_to_measure() -> None:
    client = connect("ws://127.0.0.1:1", encoding="opus")
    summary = client.summary
    assert summary.finals_measured == 0 and summary.final_delay_ms.p50 is None and summary.done is None


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
    from streamer.server.serve import ServerConfig

    async with App(ServerConfig(port=0), ScriptedEngine([])) as srv:

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
        App(ServerConfig(port=0), engine) as srv,
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


def wer(reference: str, hypothesis: str) -> float:
    return word_error_rate([normalize_english(reference)], [normalize_english(hypothesis)]).wer


# -- across dropped connections: a proxy the test controls cuts the TCP connections mid-stream -----------------------


@dataclass
class Streamed:
    """What one client streamed through the proxy and got back."""

    client: StreamerClient
    finals: list[FinalMessage]
    arrived: list[float]  # the client's (logical) clock when each final arrived

    def felt_ms(self) -> list[float]:
        """The speaker-felt delay of each final with text, worked out from when its last word's chunk was sent."""
        pairs = zip(self.finals, self.arrived, strict=True)
        return [1000 * (now - chunk_sent_at(f.words[-1].end)) for f, now in pairs if f.text.strip()]

    @property
    def text(self) -> str:
        return " ".join(f.text.strip() for f in self.finals if f.text.strip())


async def stream_through(
    proxy: TcpProxy,
    srv: Server,
    audio: npt.NDArray[np.float32],
    cut_after: Sequence[int] = (),
    speed: float = 4.0,
    options: ReconnectOptions | None = None,
    restart: Callable[[], Awaitable[None]] | None = None,
    clock: LogicalClock | None = None,
) -> Streamed:
    """Stream ``audio`` through ``proxy`` at ``speed`` times real time; after the ``n``-th final for each ``n`` in
    ``cut_after``, cut the connection and let the client back once the server has parked the session (or, with
    ``restart``, once that has run: the session is then gone). With ``clock``, chunk i is sent at ``i * 0.1``."""
    clock = clock or LogicalClock()
    url = f"ws://127.0.0.1:{proxy.port}"
    client = connect(url, reconnect=options or ReconnectOptions(), rng=random.Random(3), clock=clock)
    finals: list[FinalMessage] = []
    arrived: list[float] = []
    async with client:

        async def send() -> None:
            i = 0
            async for piece in paced_chunks(audio, 1600, speed):
                clock.now = i * 0.1
                i += 1
                await client.send_audio(piece)
            await client.end()

        sender = asyncio.create_task(send())
        async for message in client:
            if not isinstance(message, FinalMessage):
                continue
            finals.append(message)
            arrived.append(clock.now)
            if len(finals) in cut_after:
                proxy.hold()
                proxy.cut()
                if restart is None:
                    await until(lambda sid=client.session_id: sid in srv.resumable)
                else:
                    await restart()
                proxy.release()
        await sender
    return Streamed(client, finals, arrived)


async def test_a_stream_cut_twice_gets_the_uncut_transcript_with_nothing_lost_or_repeated() -> None:
    audio = looped_speech(16.0)
    async with App(config(resume_grace_seconds=30.0), ScriptedEngine(WORDS)) as srv, tcp_proxy(srv.port) as proxy:
        uncut = await stream_through(proxy, srv, audio)
        cut = await stream_through(proxy, srv, audio, cut_after=(2, 5))
        assert srv.resumable.resumed == 2
    assert cut.client.reconnects == 2
    assert cut.text == uncut.text and len(cut.finals) >= 6
    assert [f.seq for f in cut.finals] == list(range(1, len(cut.finals) + 1))  # none missing, none twice
    assert cut.client.cursor.lost == []
    done = cut.client.done
    assert done is not None and done.lost_seconds == 0
    assert done.audio_seconds_received == pytest.approx(len(audio) / 16000, abs=1e-4)  # every sample exactly once
    # every final's delay runs from the first sending of its last word, not from the resend after a resume
    assert [d.felt_ms for d in cut.client.final_delays] == pytest.approx(cut.felt_ms())


async def test_a_session_the_server_lost_goes_on_as_a_new_one_from_the_last_final() -> None:
    audio = looped_speech(16.0)
    first = App(config(resume_grace_seconds=30.0), ScriptedEngine(WORDS))
    second = App(config(), ScriptedEngine(WORDS))
    async with first, second, tcp_proxy(first.port) as proxy:

        async def restart() -> None:  # the replica dies with the session; the proxy sends the client elsewhere
            await first.shutdown()
            proxy.target_port = second.port

        cut = await stream_through(proxy, first, audio, cut_after=(3,), restart=restart)
    before, after = cut.finals[:3], cut.finals[3:]
    assert after and [f.seq for f in cut.finals] == list(range(1, len(cut.finals) + 1))
    assert after[0].start >= before[-1].end  # the new session's times continue the first one's
    done = cut.client.done
    assert done is not None and cut.client.cursor.lost == [] and done.lost_seconds == 0
    # the new session got the audio from the end of the last final on, and nothing before it
    assert done.audio_seconds_received == pytest.approx(len(audio) / 16000 - before[-1].end, abs=1e-3)
    # its finals' delays are measured on the stream's clock, not the new session's
    assert [d.felt_ms for d in cut.client.final_delays] == pytest.approx(cut.felt_ms())
    assert all(d >= 0 for d in cut.felt_ms())


async def test_a_full_ring_reports_the_audio_a_resume_could_not_send_as_lost() -> None:
    audio = looped_speech(8.0)
    options = ReconnectOptions(buffer_seconds=1.0)
    async with App(config(resume_grace_seconds=30.0), ScriptedEngine(WORDS)) as srv, tcp_proxy(srv.port) as proxy:
        client = connect(f"ws://127.0.0.1:{proxy.port}", reconnect=options)
        async with client:
            await client.send_audio(audio[:16000])  # one second goes through
            await until(lambda: received_seconds(srv) == pytest.approx(1.0))
            proxy.hold()
            proxy.cut()
            await until(lambda: client.session_id in srv.resumable)
            await client.send_audio(audio[16000:])  # 7 s more while cut off: the ring keeps the last second
            await client.end()
            proxy.release()
            messages = [m async for m in client]
    assert client.reconnects == 1
    assert client.cursor.lost == [LostRange(1.0, 7.0)]  # what the ring dropped, sent as silence
    done = messages[-1]
    assert isinstance(done, Done) and done.audio_seconds_received == pytest.approx(8.0)


async def test_the_client_gives_up_past_its_bounds() -> None:
    options = ReconnectOptions(first_delay=0.01, max_delay=0.02, max_attempts=3)
    async with App(config(), ScriptedEngine(WORDS)) as srv, tcp_proxy(srv.port) as proxy:
        client = connect(f"ws://127.0.0.1:{proxy.port}", reconnect=options)
        async with client:
            await client.send_audio(looped_speech(1.0))
            proxy.target_port = free_port()  # nothing listens there any more
            proxy.cut()
            with pytest.raises(SessionLost, match="gave up after 3 attempts"):
                _ = [m async for m in client]


async def test_the_first_connection_waits_for_a_server_still_loading_its_model() -> None:
    # HTTP 503 while the model loads (or no replica is ready behind a balancer): with reconnection on, the client asks
    # again within its back-off's bounds, and the session starts once the server is ready; none of the audio is lost
    options = ReconnectOptions(first_delay=0.01, max_delay=0.02, max_attempts=10_000, max_seconds=600.0)
    async with App(config(), engine=None) as srv, tcp_proxy(srv.port) as proxy:
        client = connect(f"ws://127.0.0.1:{proxy.port}", reconnect=options)
        opening = asyncio.create_task(client.__aenter__())
        await until(lambda: proxy.connections >= 3)  # refused, and asked again
        assert not opening.done()
        srv.set_engine(ScriptedEngine(WORDS))
        assert await opening is client and isinstance(client.ready, Ready)
        try:
            await client.send_audio(looped_speech(2.0))
            await client.end()
            messages = [m async for m in client]
        finally:
            await client.close()
    assert isinstance(messages[-1], Done) and messages[-1].lost_seconds == 0
    assert messages[-1].audio_seconds_received == pytest.approx(2.0, abs=1e-3)


async def test_the_first_connection_gives_up_on_a_server_not_ready_past_the_bounds_or_without_reconnect() -> None:
    options = ReconnectOptions(first_delay=0.01, max_delay=0.02, max_attempts=2)
    async with App(config(), engine=None) as srv, tcp_proxy(srv.port) as proxy:
        with pytest.raises(InvalidStatus) as refused:
            async with connect(f"ws://127.0.0.1:{proxy.port}", reconnect=options):
                pass
        assert refused.value.response.status_code == 503 and proxy.connections == 3  # the first and 2 more
        with pytest.raises(InvalidStatus):
            async with connect(f"ws://127.0.0.1:{proxy.port}", reconnect=None):
                pass
        assert proxy.connections == 4  # without reconnection: refused at once


async def test_the_first_connection_waits_for_a_slot_at_a_full_server() -> None:
    # at_capacity says "later" too: the client takes the slot once it frees, or past its bounds says it was refused
    options = ReconnectOptions(first_delay=0.01, max_delay=0.02, max_attempts=10_000, max_seconds=600.0)
    cfg = replace(config(), scheduler=SchedulerOptions(max_sessions=1))
    async with App(cfg, ScriptedEngine(WORDS)) as srv, tcp_proxy(srv.port) as proxy:
        first = connect(f"ws://127.0.0.1:{srv.port}", reconnect=None)
        await first.__aenter__()
        second = connect(f"ws://127.0.0.1:{proxy.port}", reconnect=options)
        opening = asyncio.create_task(second.__aenter__())
        await until(lambda: proxy.connections >= 3)  # at_capacity, and asked again
        assert not opening.done()
        await first.end()
        assert isinstance([m async for m in first][-1], Done)
        await first.close()
        await opening
        try:
            with pytest.raises(SessionLost, match="the server refused the session") as refused:
                async with connect(f"ws://127.0.0.1:{proxy.port}", reconnect=replace(options, max_attempts=2)):
                    pass
            assert refused.value.code == "at_capacity" and proxy.connections >= 6  # the first and 2 more
            await second.end()
            assert isinstance([m async for m in second][-1], Done)
        finally:
            await second.close()


async def test_without_reconnect_a_cut_ends_the_session() -> None:
    async with (
        App(config(), ScriptedEngine(WORDS)) as srv,
        tcp_proxy(srv.port) as proxy,
        connect(f"ws://127.0.0.1:{proxy.port}", reconnect=None) as client,
    ):
        proxy.cut()
        assert [m async for m in client] == []
        assert client.close_code == 1006
        with pytest.raises(ConnectionClosed):
            await client.send_audio(looped_speech(0.1))


@pytest.mark.model
async def test_real_speech_cut_mid_stream_gets_the_uncut_transcript(tiny_engine: WhisperEngine) -> None:
    audio = np.concatenate([load_clip(REAL_CLIP), np.zeros(16000, dtype=np.float32)])
    async with App(config(resume_grace_seconds=30.0), tiny_engine) as srv, tcp_proxy(srv.port) as proxy:
        uncut = await stream_through(proxy, srv, audio, speed=2.0)
        cut = await stream_through(proxy, srv, audio, cut_after=(1,), speed=2.0)
    assert cut.client.reconnects == 1 and len(uncut.finals) >= 2
    assert [f.seq for f in cut.finals] == list(range(1, len(cut.finals) + 1))
    assert cut.client.cursor.lost == [] and cut.client.done is not None and cut.client.done.lost_seconds == 0
    # the server's session went on through the cut: the words are the uncut run's (streamed finals may differ by
    # the moment windows were cut, so the bound is a word, not equality)
    assert wer(uncut.text, cut.text) <= 1 / len(uncut.text.split()), (uncut.text, cut.text)
    assert wer(CLIPS[REAL_CLIP], cut.text) <= 0.15


async def test_a_resume_through_another_replica_gets_the_uncut_transcript(redis_url: str) -> None:
    audio = looped_speech(16.0)
    options = config(redis_url, resume_grace_seconds=30.0)
    async with (
        App(options, ScriptedEngine(WORDS)) as one,
        App(options, ScriptedEngine(WORDS)) as other,
        tcp_proxy(one.port) as proxy,
    ):
        uncut = await stream_through(proxy, one, audio)

        async def elsewhere() -> None:  # the reconnect lands on the other replica, which takes the session over
            await until(lambda: one.redis is not None and one.redis.settled)
            proxy.target_port = other.port

        cut = await stream_through(proxy, one, audio, cut_after=(3,), restart=elsewhere)
        assert isinstance(other.session_store, RedisSessionStore) and other.session_store.taken_over == 1
    assert cut.client.reconnects == 1 and cut.client.ready is not None and cut.client.ready.resumed
    assert cut.text == uncut.text
    assert [f.seq for f in cut.finals] == list(range(1, len(cut.finals) + 1))
    assert cut.client.cursor.lost == [] and cut.client.cursor.duplicates == 0
    done = cut.client.done
    assert done is not None and done.lost_seconds == 0


@pytest.mark.model
async def test_real_speech_resumed_on_another_replica_gets_the_uncut_transcript(
    tiny_engine: WhisperEngine, redis_url: str
) -> None:
    audio = np.concatenate([load_clip(REAL_CLIP), np.zeros(16000, dtype=np.float32)])
    options = config(redis_url, resume_grace_seconds=30.0)
    async with (
        App(options, tiny_engine) as one,
        App(options, tiny_engine) as other,
        tcp_proxy(one.port) as proxy,
    ):
        uncut = await stream_through(proxy, one, audio, speed=2.0)

        async def elsewhere() -> None:
            await until(lambda: one.redis is not None and one.redis.settled)
            proxy.target_port = other.port

        cut = await stream_through(proxy, one, audio, cut_after=(1,), speed=2.0, restart=elsewhere)
    assert cut.client.ready is not None and cut.client.ready.resumed
    assert [f.seq for f in cut.finals] == list(range(1, len(cut.finals) + 1))
    assert cut.client.cursor.lost == [] and cut.client.done is not None and cut.client.done.lost_seconds == 0
    details = [(f.start, f.end, f.text) for f in cut.finals]
    assert wer(uncut.text, cut.text) <= 1 / len(uncut.text.split()), (uncut.text, details)
