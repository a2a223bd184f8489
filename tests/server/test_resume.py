from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from streamer.app import App
from streamer.core.audio import Encoding
from streamer.core.container import ContainerEncoding
from streamer.core.errors import UnknownSession
from streamer.engine.fake import ScriptedEngine
from streamer.engine.types import StreamId
from streamer.server.auth import ANONYMOUS, Principal
from streamer.server.listen_query import ListenParams
from streamer.server.resume import ChannelRecord, RedisSessionStore, ResumeRegistry, SessionRecord
from streamer.server.takeover import Takeover
from tests.helpers import WORDS, ManualTimers, chunks, config, exchange, pcm16, received_seconds, speech, until


@dataclass
class FakeSession:
    id: str
    last_seq: int = 5
    expired: int = 0
    kept_from: int = 0
    log: list[str] = field(default_factory=list)
    owner: Principal = ANONYMOUS

    def check_resume(self, last_seq: int) -> None:
        if not self.kept_from <= last_seq <= self.last_seq:
            raise UnknownSession("gone")

    def expire(self) -> None:
        self.expired += 1


def test_a_parked_session_is_claimed_once() -> None:
    registry = ResumeRegistry(ManualTimers().call_later)
    session = FakeSession("a")
    registry.park(session, grace_seconds=10)
    assert "a" in registry and len(registry) == 1
    assert registry.claim("a", 3) is session
    with pytest.raises(UnknownSession) as info:
        registry.claim("a", 3)
    assert info.value.close_code == 4404
    assert session.expired == 0 and registry.resumed == 1


def test_unclaimed_sessions_expire_after_the_grace_period() -> None:
    timers = ManualTimers()
    registry = ResumeRegistry(timers.call_later)
    session = FakeSession("a")
    registry.park(session, grace_seconds=10)
    timers.advance(9.99)
    assert session.expired == 0 and "a" in registry
    timers.advance(0.01)
    assert session.expired == 1 and "a" not in registry and registry.expired == 1
    with pytest.raises(UnknownSession):
        registry.claim("a", 0)


def test_a_claimed_session_does_not_expire_later() -> None:
    timers = ManualTimers()
    registry = ResumeRegistry(timers.call_later)
    session = FakeSession("a")
    registry.park(session, grace_seconds=10)
    registry.claim("a", 5)
    assert timers.pending == 0  # its timer is cancelled
    timers.advance(60)
    assert session.expired == 0 and registry.expired == 0


def test_a_refused_last_seq_leaves_the_session_parked() -> None:
    registry = ResumeRegistry(ManualTimers().call_later)
    session = FakeSession("a", last_seq=5, kept_from=2)
    registry.park(session, grace_seconds=10)
    for bad in (1, 6):
        with pytest.raises(UnknownSession):
            registry.claim("a", bad)
    assert "a" in registry
    registry.close()
    assert session.expired == 1 and len(registry) == 0


# -- over the wire: a real server, a connection that drops, and the client that comes back ---------------------------


async def read_until(ws: ClientConnection, predicate: Any, timeout: float = 30.0) -> list[dict[str, Any]]:
    """Messages up to and including the first that satisfies ``predicate`` (or every one until the close)."""
    messages: list[dict[str, Any]] = []
    async with asyncio.timeout(timeout):
        try:
            while True:
                messages.append(json.loads(await ws.recv()))
                if predicate(messages[-1]):
                    return messages
        except ConnectionClosed:
            return messages


async def test_a_dropped_connection_resumes_with_every_missed_final() -> None:
    audio = pcm16(speech())
    frames = chunks(audio)
    half = len(frames) // 2
    async with App(config(resume_grace_seconds=5.0), ScriptedEngine(WORDS)) as srv:
        url = f"ws://127.0.0.1:{srv.port}/v1/listen"
        # 1. First connection: half the audio; keep only the first final, as if the rest were lost in flight.
        first = await ws_connect(url, max_queue=None)
        ready = json.loads(await first.recv())
        for frame in frames[:half]:
            await first.send(frame)
        seen = await read_until(first, lambda m: m["type"] == "final")
        kept = [m for m in seen if m["type"] == "final"]
        assert kept and kept[0]["seq"] == 1
        # finals 2 and 3 reach the client too, and are lost with the connection
        lost = await read_until(first, lambda m: m["type"] == "final" and m["seq"] == 3)
        assert [m["seq"] for m in lost if m["type"] == "final"] == [2, 3]
        first.transport.abort()  # a reset: no close frame
        await until(lambda: ready["session_id"] in srv.resumable)  # the server notices and parks the session
        # 2. Second connection: resume after the one final we kept; the server says how much audio it has.
        async with ws_connect(f"{url}?resume={ready['session_id']}&last_seq=1", max_queue=None) as second:
            again = json.loads(await second.recv())
            assert again["type"] == "ready" and again["resumed"] is True
            assert again["session_id"] == ready["session_id"]
            # what it had read when the connection dropped: at most what was sent (frames still in flight when
            # final 3 arrived are lost with the connection); the client resends from there
            received = round(again["audio_seconds_received"] * 16000) * 2
            assert 0 < received <= half * 3200
            for frame in chunks(audio[received:]):
                await second.send(frame)
            await second.send('{"type":"end"}')
            rest = await read_until(second, lambda m: m["type"] == "done")
        assert second.close_code == 1000
    finals = kept[:1] + [m for m in rest if m["type"] == "final"]
    # every final exactly once, in order, numbered without a gap
    assert [m["seq"] for m in finals] == list(range(1, len(finals) + 1))
    assert len(finals) >= 3
    numbers = [int(word[1:]) for m in finals for word in m["text"].split()]
    assert numbers == sorted(set(numbers))
    done = rest[-1]
    assert done["audio_seconds_received"] == pytest.approx(len(audio) / 2 / 16000, abs=1e-4)
    accounted = done["audio_seconds_transcribed"] + done["non_speech_seconds"] + done["lost_seconds"]
    assert accounted == pytest.approx(done["audio_seconds_received"], abs=1e-4)
    assert sum(f["end"] - f["start"] for f in finals) == pytest.approx(done["audio_seconds_transcribed"], abs=1e-3)


async def test_an_unknown_or_expired_session_gets_4404() -> None:
    timers = ManualTimers()
    engine = ScriptedEngine(WORDS)
    srv = App(config(resume_grace_seconds=5.0), engine)
    srv.resumable = ResumeRegistry(timers.call_later)  # the grace period ends when the test says so
    async with srv:
        url = f"ws://127.0.0.1:{srv.port}/v1/listen"
        async with ws_connect(f"{url}?resume=nosuchsession&last_seq=0") as ws:
            refused = await read_until(ws, lambda m: False)
        assert ws.close_code == 4404 and refused[0]["code"] == "unknown_session"
        first = await ws_connect(url)
        session_id = json.loads(await first.recv())["session_id"]
        await first.send(pcm16(speech())[:32000])
        first.transport.abort()
        await until(lambda: session_id in srv.resumable)
        # parked, it holds no slot: the runner gives the dropped connection's back as its adapter lets go
        await until(lambda: srv.scheduler is not None and srv.scheduler.active_sessions == 0)
        stream = StreamId(f"{session_id}/0")
        timers.advance(4.99)
        assert session_id in srv.resumable and stream not in engine.forgotten  # its stream is kept for a resume
        timers.advance(0.01)  # the grace period is over
        assert session_id not in srv.resumable and srv.resumable.expired == 1
        await until(lambda: stream in engine.forgotten)  # the engine lets go of it (on its worker thread)
        async with ws_connect(f"{url}?resume={session_id}&last_seq=0") as ws:
            refused = await read_until(ws, lambda m: False)
        assert ws.close_code == 4404


async def test_a_clean_close_or_an_error_close_does_not_park() -> None:
    async with App(config(), ScriptedEngine(WORDS)) as srv:
        async with ws_connect(f"ws://127.0.0.1:{srv.port}/v1/listen") as ws:
            await ws.recv()
            await ws.send('{"type":"nonsense"}')
            await read_until(ws, lambda m: False)
        assert ws.close_code == 4400
        assert len(srv.resumable) == 0


async def test_shutdown_says_where_the_session_stood() -> None:
    srv = App(config(), ScriptedEngine(WORDS))
    await srv.start()
    async with ws_connect(f"ws://127.0.0.1:{srv.port}/v1/listen", max_queue=None) as ws:
        ready = json.loads(await ws.recv())
        for frame in chunks(pcm16(speech()))[:40]:
            await ws.send(frame)
        await until(lambda: received_seconds(srv) == pytest.approx(4.0))  # all 40 frames of 100 ms are in
        shutdown = asyncio.create_task(srv.shutdown())
        messages = await read_until(ws, lambda m: False)
        await shutdown
    assert ws.close_code == 1001
    finals = [m for m in messages if m["type"] == "final"]
    error = messages[-1]
    assert error["code"] == "shutting_down"
    assert error["resume"] == {"session_id": ready["session_id"], "last_seq": len(finals)}


def test_the_oldest_parked_session_expires_when_the_registry_is_full() -> None:
    registry = ResumeRegistry(ManualTimers().call_later)
    sessions = [FakeSession(name) for name in "abc"]
    for session in sessions:
        registry.park(session, grace_seconds=10, limit=2)
    assert [s.expired for s in sessions] == [1, 0, 0]
    assert "a" not in registry and "c" in registry
    registry.close()


async def test_a_long_session_keeps_a_bounded_arrival_log_while_finals_are_kept_for_resume() -> None:
    from streamer.server.ratelimit import RateLimitOptions

    audio = pcm16(np.concatenate([speech()] * 20))  # about 4 minutes, many utterances and finals
    frames = chunks(audio)  # 100 ms each
    srv = App(config(rate_limit=RateLimitOptions(max_rate=0.0)), ScriptedEngine(WORDS))
    async with srv, ws_connect(f"ws://127.0.0.1:{srv.port}/v1/listen", max_queue=None) as ws:
        await ws.recv()  # ready
        for frame in frames:
            await ws.send(frame)
        await ws.send('{"type":"end"}')
        [session] = srv.sessions
        messages = await read_until(ws, lambda m: m["type"] == "done", timeout=60)
        kept = len(session.finals)  # type: ignore[attr-defined]
        logged = len(session._arrivals)  # type: ignore[attr-defined]
    finals = [m for m in messages if m["type"] == "final"]
    assert kept >= 10 and len(finals) >= 10  # finals were kept for a resume all along
    # 2400 frames arrived; the log holds the last 30 s (300 frames), the live audio and one pruning period at most
    assert len(frames) > 2000 and logged < 1000


# -- across replicas: the same resume against the in-process store (4404) and Redis (taken over, exactly) -----------


async def test_a_resume_on_another_replica_is_taken_over_exactly_with_redis(shared: str | None) -> None:
    audio = pcm16(speech())
    frames = chunks(audio)  # 100 ms each
    reference, _ = await transcribe_once(frames, shared)
    options = config(shared, resume_grace_seconds=30.0)
    async with App(options, ScriptedEngine(WORDS)) as one, App(options, ScriptedEngine(WORDS)) as other:
        # 1. On one replica: half the audio, finals 1 and 2 arrive; the client keeps only the first.
        first = await ws_connect(f"ws://127.0.0.1:{one.port}/v1/listen", max_queue=None)
        ready = json.loads(await first.recv())
        for frame in frames[: len(frames) // 2]:
            await first.send(frame)
        await read_until(first, lambda m: m["type"] == "final" and m["seq"] == 2)
        kept = 1
        if one.redis is not None:
            await until(lambda: one.redis is not None and one.redis.settled)  # the record is in Redis
        first.transport.abort()
        await until(lambda: ready["session_id"] in one.resumable)
        # 2. The reconnect lands on the other replica.
        url = f"ws://127.0.0.1:{other.port}/v1/listen?resume={ready['session_id']}&last_seq={kept}"
        async with ws_connect(url, max_queue=None) as second:
            again = json.loads(await second.recv())
            if shared is None:  # nothing leaves the process: the other replica knows nothing of the session
                assert again["code"] == "unknown_session"
                await read_until(second, lambda m: False)
                assert second.close_code == 4404
                return
            assert again["type"] == "ready" and again["resumed"] is True
            assert again["session_id"] == ready["session_id"]
            assert isinstance(other.session_store, RedisSessionStore) and other.session_store.taken_over == 1
            # 3. It resends its audio from resume_from: at or before what the first replica had (the context before
            # the utterance under way, up to 10 s, reaches the start of this short stream)
            frame_index = round(again["resume_from"] * 16000)
            assert 0 <= frame_index <= len(audio) // 4
            rest = audio[2 * frame_index :]
            for frame in chunks(rest):
                await second.send(frame)
            await second.send('{"type":"end"}')
            messages = await read_until(second, lambda m: m["type"] == "done")
        assert second.close_code == 1000
    finals = [m for m in reference if m["type"] == "final"][:kept] + [m for m in messages if m["type"] == "final"]
    # every final once, numbered without a gap; the words are the no-fault run's, none lost or repeated
    assert [m["seq"] for m in finals] == list(range(1, len(finals) + 1))
    assert words_of(finals) == words_of([m for m in reference if m["type"] == "final"])
    done = messages[-1]
    assert done["audio_seconds_received"] == pytest.approx(len(audio) / 2 / 16000, abs=1e-3)
    accounted = done["audio_seconds_transcribed"] + done["non_speech_seconds"] + done["lost_seconds"]
    assert accounted == pytest.approx(done["audio_seconds_received"], abs=1e-3)


async def transcribe_once(frames: list[bytes], shared: str | None) -> tuple[list[dict[str, Any]], int | None]:
    """The no-fault run: every frame on one connection."""
    async with App(config(shared), ScriptedEngine(WORDS)) as srv:
        return await exchange(srv, [*frames, '{"type":"end"}'])


def words_of(finals: list[dict[str, Any]]) -> list[str]:
    return [word for m in finals for word in m["text"].split()]


# -- where a takeover asks the client to resend from (issue 18) --------------------------------------------------------

SR = 16000


def taken(
    *channels: ChannelRecord,
    rate: int = SR,
    encoding: Encoding | ContainerEncoding = Encoding.PCM_S16LE,
    resend_from: int = 0,
) -> Takeover:
    params = ListenParams(rate, encoding, len(channels))
    record = SessionRecord("s1", ANONYMOUS, params.to_query(), 3, channels)
    return Takeover(record, 3, params, resend_from)


def test_a_takeover_asks_for_the_open_utterances_context_from_where_the_client_still_holds_it() -> None:
    channel = ChannelRecord(5 * SR, 4, context_start=2 * SR)
    # the context the old core's next window would have re-read
    assert taken(channel).resume_frame == 2 * SR and taken(channel).replay_from(0) == 2 * SR
    # the client kept less: from its oldest frame, a shorter context
    later = taken(channel, resend_from=3 * SR)
    assert later.resume_frame == 3 * SR and later.replay_from(0) == 3 * SR
    # the client lacks audio no final covers: from the accounted position (it sends the rest as silence, lost)
    assert taken(channel, resend_from=6 * SR).resume_frame == 5 * SR
    # never more than one model window of context
    assert taken(ChannelRecord(40 * SR, 4, context_start=0)).resume_frame == 10 * SR


def test_a_takeover_resumes_on_a_frame_of_the_grid_that_the_client_holds() -> None:
    channel = ChannelRecord(5 * SR, 4, context_start=2 * SR + 7)
    frame = taken(channel, rate=44100, resend_from=2 * 44100 + 1).resume_frame
    assert frame * SR % 44100 == 0  # it falls on a 16 kHz sample
    assert frame >= 2 * 44100 + 1 and 2 * SR + 7 <= frame * SR // 44100 <= 5 * SR
    assert frame * SR // 44100 - (2 * SR + 7) < SR // 100  # within 10 ms of the context start


def test_a_stereo_takeover_resends_from_the_earlier_context_and_each_core_takes_its_own() -> None:
    takeover = taken(ChannelRecord(5 * SR, 4, context_start=4 * SR), ChannelRecord(6 * SR, 2, context_start=SR))
    assert takeover.resume_frame == SR
    assert (takeover.replay_from(0), takeover.replay_from(1)) == (4 * SR, SR)


def test_a_container_takeover_resends_nothing_before_the_accounted_position() -> None:
    takeover = taken(ChannelRecord(5 * SR, 4, context_start=2 * SR), encoding=ContainerEncoding.OPUS)
    assert takeover.resume_frame == 5 * SR and takeover.replay_from(0) == 5 * SR


def test_the_record_keeps_the_context_start_and_reads_one_written_without_it() -> None:
    record = taken(ChannelRecord(5 * SR, 4, 3 * SR, SR, 0, context_start=2 * SR)).record
    assert SessionRecord.from_json(record.state_json(), []).channels[0].replay_from == 2 * SR
    older = json.loads(record.state_json())
    older["channels"][0] = older["channels"][0][:5]
    assert SessionRecord.from_json(json.dumps(older), []).channels[0].replay_from == 5 * SR
