from __future__ import annotations

import asyncio
import itertools
import json
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from streamer.app import App
from streamer.core.errors import ConfigError, UnknownSession, UnsupportedAudio
from streamer.core.events import Final, Partial
from streamer.core.options import CoreOptions
from streamer.engine.fake import FakeBehaviour, ScriptedEngine, words_from_text
from streamer.engine.types import EngineInfo
from streamer.server.adapter import FLUSH_CEILING_FLOOR_SECONDS, FLUSH_CEILING_PER_SECOND, LOST, Close
from streamer.server.auth import ANONYMOUS, Principal
from streamer.server.lifecycle import Phase
from streamer.server.listen_transcripts import QueuedTranscript
from streamer.server.metrics import ServerMetrics
from streamer.server.resume import ResumeRegistry
from streamer.server.scheduler import Batch, Scheduler, SchedulerOptions
from streamer.server.serve import ServerConfig
from streamer.server.server_messages import ErrorMessage
from streamer.server.session import Session
from streamer.server.session_options import SessionOptions
from streamer.server.takeover import open_listen_session
from tests.conftest import load_clip
from tests.helpers import CLIP, ManualTimers, chunks, exchange, pcm16, pump, speech, until

WORDS = words_from_text(" ".join(f"w{i}" for i in range(200)), 0, 4000, 800)


def partial(channel: int, segment: int, text: str) -> QueuedTranscript:
    return QueuedTranscript(channel, Partial(segment, text, 0, 1, (), 1))


def final(channel: int, segment: int, text: str) -> QueuedTranscript:
    return QueuedTranscript(channel, Final(segment, text, 0, 1, (), 1))


# -- the adapter alone: frames and `now` in, protocol messages and a close out --------------------------------------


class Listen:
    """``/v1/listen`` adapters over a scheduler the test runs by hand (:func:`tests.helpers.pump`) and a registry
    whose grace periods end when the test says."""

    def __init__(
        self, engine: ScriptedEngine | None = None, *, core: CoreOptions | None = None, **options: object
    ) -> None:
        self.engine = engine or ScriptedEngine(WORDS)
        self.core = core or CoreOptions()
        self.scheduler = Scheduler(self.engine, SchedulerOptions())
        self.options = replace(SessionOptions(), **options)
        self.timers = ManualTimers()
        self.registry = ResumeRegistry(self.timers.call_later)

    def open(self, path: str = "/v1/listen", now: float = 0.0, owner: Principal = ANONYMOUS) -> Session:
        return open_listen_session(
            path, owner, self.scheduler, self.core, self.options, "tiny.en", ServerMetrics(), self.registry, now
        )

    def decode_all_but(self, session: Session) -> list[Batch]:
        """Decode every window the streams offer except ``session``'s, which stay in the engine's queue (a busy
        engine serving the other streams first); returns those held."""
        held = []
        while (batch := self.scheduler.next_batch()) is not None:
            if any(c in session.channels for c in batch.clients):
                held.append(batch)
            else:
                self.scheduler.deliver(batch, self.engine.decode(batch.requests))
        return held

    def decode_held(self, held: list[Batch]) -> None:
        """The engine gets to the windows :meth:`decode_all_but` held, then to everything after them."""
        for batch in held:
            self.scheduler.deliver(batch, self.engine.decode(batch.requests))
        pump(self.scheduler, self.engine)

    def stream(self, session: Session, frames: list[bytes], start: float = 0.0, step: float = 0.1) -> float:
        """Feed ``frames`` ``step`` seconds apart from ``start``, decoding as they come; the time after the last."""
        now = start
        for frame in frames:
            session.receive_bytes(frame, now)
            pump(self.scheduler, self.engine)
            now += step
        return now


def messages(session: Session, now: float = 0.0) -> list[dict[str, Any]]:
    return [json.loads(frame) for frame in session.messages_to_send(now)]


def test_the_adapter_says_ready_then_transcribes_and_accounts_for_every_sample() -> None:
    listen = Listen()
    session = listen.open()
    [ready] = messages(session)
    assert ready["type"] == "ready" and ready["session_id"] == session.id and not ready["resumed"]
    now = listen.stream(session, chunks(pcm16(speech())))
    session.receive_text('{"type":"end"}', now)
    assert session.phase is Phase.DRAINING and not session.reading
    pump(listen.scheduler, listen.engine)
    out = messages(session, now)
    assert session.close_action() == Close(1000, "done")
    finals = [m for m in out if m["type"] == "final"]
    assert finals and [m["seq"] for m in finals] == list(range(1, len(finals) + 1))
    done = out[-1]
    assert done["type"] == "done" and done["lost_seconds"] == 0
    accounted = done["audio_seconds_transcribed"] + done["non_speech_seconds"]
    assert accounted == pytest.approx(done["audio_seconds_received"], abs=1e-4)
    assert done["audio_seconds_received"] == pytest.approx(len(speech()) / 16000, abs=1e-4)
    assert session.phase is Phase.CLOSED and listen.scheduler.next_batch() is None  # it let go


def test_latency_is_measured_when_a_transcript_goes_out() -> None:
    listen = Listen()
    session = listen.open()
    messages(session)
    now = listen.stream(session, chunks(pcm16(speech())), start=100.0)
    session.receive_text('{"type":"end"}', now)
    pump(listen.scheduler, listen.engine)
    out = messages(session, now + 5.0)  # the client took them 5 s after the last audio arrived
    finals = [m for m in out if m["type"] == "final"]
    assert min(m["latency_ms"] for m in finals) >= 5000
    assert out[-1]["latency"]["final"]["p50"] >= 5000  # done sums up what went out before it


def test_a_frame_over_the_limit_gets_frame_too_large_and_1009() -> None:
    listen = Listen(max_frame_bytes=3200)
    session = listen.open()
    messages(session)
    session.receive_bytes(b"\0" * 3202, 1.0)
    pump(listen.scheduler, listen.engine)
    assert messages(session)[-1]["code"] == "frame_too_large"
    assert session.close_action() == Close(1009, "frame_too_large")


def test_the_idle_timeout_and_the_session_length_come_from_now() -> None:
    listen = Listen(idle_timeout=10.0, max_session_seconds=25.0)
    session = listen.open(now=100.0)
    assert session.next_deadline() == 110.0
    session.receive_text('{"type":"keepalive"}', 109.0)
    assert session.next_deadline() == 119.0
    session.receive_timer(118.0)  # early: nothing happens
    assert session.close_action() is None
    for now in (118.0, 122.0):
        session.receive_text('{"type":"keepalive"}', now)
    assert session.next_deadline() == 125.0  # the session's length comes first
    session.receive_timer(125.0)
    assert session.close_action() == Close(4408, "session_too_long")
    assert messages(session)[-1]["code"] == "session_too_long"
    idle = Listen(idle_timeout=10.0).open(now=0.0)
    idle.receive_timer(10.0)
    assert idle.close_action() == Close(4408, "idle_timeout")


def test_a_flush_that_takes_too_long_names_the_lost_audio() -> None:
    listen = Listen(flush_timeout=10.0)
    session = listen.open()
    messages(session)
    for frame in chunks(pcm16(speech()))[:20]:
        session.receive_bytes(frame, 1.0)  # nobody decodes
    session.receive_text('{"type":"end"}', 2.0)
    assert session.next_deadline() == 12.0
    session.receive_timer(12.0)
    out = messages(session)
    errors = [m for m in out if m["type"] == "error"]
    assert errors and all(e["code"] == "engine_failure" and e["lost"]["start"] < e["lost"]["end"] for e in errors)
    done = out[-1]
    assert done["lost_seconds"] == pytest.approx(sum(e["lost"]["end"] - e["lost"]["start"] for e in errors), abs=1e-3)
    assert done["lost_seconds"] + done["non_speech_seconds"] + done["audio_seconds_transcribed"] == pytest.approx(
        done["audio_seconds_received"], abs=1e-4
    )
    assert session.close_action() == Close(1000, "done")


def test_a_flush_that_makes_progress_outlasts_flush_timeout_and_a_stall_after_it_names_the_rest() -> None:
    # a busy replica finishing the tail of a stream: each flush_timeout it accounts for more, so it goes on waiting
    # (a fixed deadline from the end gave up on audio the engine was still working through; the replica test's flake)
    listen = Listen(flush_timeout=10.0)
    session = listen.open()
    messages(session)
    for frame in chunks(pcm16(speech())):
        session.receive_bytes(frame, 1.0)  # nobody decodes yet
    session.receive_text('{"type":"end"}', 2.0)
    assert session.next_deadline() == 12.0
    batch = listen.scheduler.next_batch()
    assert batch is not None
    listen.scheduler.deliver(batch, listen.engine.decode(batch.requests))  # the first utterance's final, late
    session.receive_timer(12.0)
    assert session.close_action() is None and session.next_deadline() == 22.0
    first = messages(session, 12.0)
    assert [m["type"] for m in first if m["type"] in ("final", "error", "done")] == ["final"]
    accounted = session.channels[0].accounted / 16000
    session.receive_timer(21.9)
    assert session.close_action() is None
    session.receive_timer(22.0)  # nothing more for a whole flush_timeout: the rest is lost, and named
    out = messages(session, 22.0)
    [error] = [m for m in out if m["type"] == "error"]
    # the loss starts where the first utterance's final and the pause after it left off, and runs to the end
    assert error["code"] == "engine_failure" and accounted >= first[-1]["end"]
    assert (error["lost"]["start"], error["lost"]["end"]) == pytest.approx((accounted, len(speech()) / 16000), abs=1e-3)
    done = out[-1]
    assert done["type"] == "done" and done["lost_seconds"] == pytest.approx(
        error["lost"]["end"] - error["lost"]["start"], abs=1e-3
    )
    assert done["lost_seconds"] + done["non_speech_seconds"] + done["audio_seconds_transcribed"] == pytest.approx(
        done["audio_seconds_received"], abs=1e-4
    )
    assert session.close_action() == Close(1000, "done")


def test_a_flush_waits_while_the_engine_serves_other_streams_first() -> None:
    # a busy replica: the ended stream's window waits behind other streams' windows (and under load a window of a long
    # utterance may commit nothing on its own), so its own accounting stands still for a whole flush_timeout while
    # the engine works; the engine's outcomes for anyone keep it waiting, and every sample ends in a final
    listen = Listen(flush_timeout=10.0)
    listen.scheduler.options = SchedulerOptions(max_batch_size=1)
    ended, other = listen.open(), listen.open()
    for session in (ended, other):
        messages(session)
        for frame in chunks(pcm16(speech())):
            session.receive_bytes(frame, 1.0)
    ended.receive_text('{"type":"end"}', 2.0)
    held = listen.decode_all_but(ended)  # the engine decodes the other stream's windows
    assert held and ended.channels[0].accounted == 0  # nothing of the ended stream is accounted for yet
    ended.receive_timer(12.0)
    assert ended.close_action() is None and ended.next_deadline() == 22.0  # the engine is alive: it waits
    listen.decode_held(held)
    out = messages(ended, 15.0)
    assert ended.close_action() == Close(1000, "done") and out[-1]["type"] == "done"
    assert out[-1]["lost_seconds"] == 0 and "error" not in [m["type"] for m in out]


def test_a_short_tail_waits_its_turn_behind_a_busy_engine_for_longer_than_its_length_would_allow() -> None:
    # a stream that ends with a second or two left still waits for its turn behind the other streams' windows, for as
    # long as the load says; the ceiling counts at least FLUSH_CEILING_FLOOR_SECONDS left, so the tail is not given up
    # on 10 s per second of it after the first look
    listen = Listen(flush_timeout=10.0)
    listen.scheduler.options = SchedulerOptions(max_batch_size=1)
    ended, other = listen.open(), listen.open()
    messages(ended), messages(other)
    clip = load_clip(CLIP)
    audio = np.concatenate([speech()[: len(clip) + 16000], clip[16000 : 16000 + 9600]])  # an utterance, a pause, 0.6 s
    listen.stream(ended, chunks(pcm16(audio)))
    left = (ended.channels[0].core.samples_received - ended.channels[0].accounted) / 16000
    assert 0 < left < 2.0  # the first utterance is final: what is left is the short tail
    ended.receive_text('{"type":"end"}', 9.0)
    held: list[Batch] = []
    others = chunks(pcm16(np.concatenate([speech()] * 3)))
    for look in (19.0, 29.0, 39.0, 49.0):  # a whole flush_timeout between looks: the engine serves the other stream
        for frame in others[: len(others) // 4]:
            other.receive_bytes(frame, look - 1.0)
            held += listen.decode_all_but(ended)  # the ended stream's last window stays in the engine's queue
        others = others[len(others) // 4 :]
        ended.receive_timer(look)
        assert ended.close_action() is None, look  # 10 s per second left is past by 39: it still waits
    assert held and 9.0 + 10.0 + 10.0 * left < 49.0
    listen.decode_held(held)
    out = messages(ended, 50.0)
    assert ended.close_action() == Close(1000, "done") and out[-1]["type"] == "done"
    assert out[-1]["lost_seconds"] == 0 and "error" not in [m["type"] for m in out]
    assert out[-1]["audio_seconds_received"] == pytest.approx(len(audio) / 16000, abs=1e-3)


def test_a_flush_that_progresses_only_for_others_gives_up_at_the_ceiling() -> None:
    # a core that never finishes while the engine serves everyone else: the wait ends at the ceiling, 10 s per second
    # left and at least FLUSH_CEILING_FLOOR_SECONDS' worth. The other stream gets 2 s of audio between looks, so
    # that the engine hands back one of its windows before each look, wherever its pauses fall
    listen = Listen(flush_timeout=10.0)
    listen.scheduler.options = SchedulerOptions(max_batch_size=1)
    ended, other = listen.open(), listen.open()
    messages(ended), messages(other)
    audio = speech()[:16000]
    for frame in chunks(pcm16(audio)):
        ended.receive_bytes(frame, 1.0)  # nobody decodes
    ended.receive_text('{"type":"end"}', 2.0)
    ceiling = 2.0 + 10.0 + FLUSH_CEILING_PER_SECOND * FLUSH_CEILING_FLOOR_SECONDS
    others = itertools.cycle(chunks(pcm16(speech())))
    now = 2.0
    while ended.close_action() is None:
        now = ended.next_deadline() or now
        assert now <= ceiling
        for frame in itertools.islice(others, 20):
            other.receive_bytes(frame, now)
        listen.decode_all_but(ended)  # the ended stream's windows never come back
        ended.receive_timer(now)
    assert now == ceiling
    out = messages(ended, now)
    [error] = [m for m in out if m["type"] == "error"]
    assert error["code"] == "engine_failure" and error["lost"]["end"] == pytest.approx(1.0, abs=1e-3)
    assert out[-1]["type"] == "done" and out[-1]["lost_seconds"] == pytest.approx(1.0, abs=1e-3)


def test_a_shutdown_caps_a_flush_that_is_still_making_progress() -> None:
    # the server waits for its sessions for a bounded time: each must say what it gave up on before that runs out
    listen = Listen(flush_timeout=10.0)
    session = listen.open()
    messages(session)
    for frame in chunks(pcm16(np.concatenate([speech(), speech()]))):  # four utterances
        session.receive_bytes(frame, 1.0)
    session.receive_text('{"type":"end"}', 2.0)  # the client's end: the flush is under way

    def one_batch() -> None:
        batch = listen.scheduler.next_batch()
        assert batch is not None
        listen.scheduler.deliver(batch, listen.engine.decode(batch.requests))

    one_batch()
    session.receive_timer(12.0)  # progress: the next look at 22
    session.receive_shutdown(15.0)  # the cap: 25
    one_batch()
    session.receive_timer(22.0)  # progress again: the next look would be at 32, the cap comes first
    assert session.close_action() is None and session.next_deadline() == 25.0
    session.receive_timer(25.0)
    out = messages(session, 25.0)
    [lost] = [m for m in out if m["type"] == "error"]
    assert lost["code"] == "engine_failure"
    assert lost["lost"]["end"] == pytest.approx(2 * len(speech()) / 16000, abs=1e-3)
    assert out[-1]["type"] == "done" and session.close_action() == Close(1000, "done")  # the client had ended it


def test_a_shutdown_cuts_a_flush_at_the_cap_even_while_it_progresses() -> None:
    listen = Listen(flush_timeout=10.0)
    session = listen.open()
    messages(session)
    for frame in chunks(pcm16(speech())):
        session.receive_bytes(frame, 1.0)
    session.receive_shutdown(2.0)  # the cap: 12
    assert session.next_deadline() == 12.0
    batch = listen.scheduler.next_batch()
    assert batch is not None
    listen.scheduler.deliver(batch, listen.engine.decode(batch.requests))  # progress, which would buy a look at 22
    session.receive_timer(12.0)
    out = messages(session, 12.0)
    assert [m["type"] for m in out].count("final") >= 1
    lost = [m for m in out if m["type"] == "error" and m["code"] == "engine_failure"]
    assert lost and out[-1]["code"] == "shutting_down" and session.close_action() == Close(1001, "shutting_down")


def test_a_reader_that_takes_nothing_is_cut_with_slow_reader_and_only_that_is_left_to_send() -> None:
    listen = Listen(send_buffer=2)
    session = listen.open()  # ready is queued and never taken
    for frame in chunks(pcm16(speech())):
        session.receive_bytes(frame, 1.0)
        pump(listen.scheduler, listen.engine)
    assert session.close_action() == Close(4408, "slow_reader")
    [error] = messages(session)
    assert error["code"] == "slow_reader"


def test_a_send_timeout_is_a_slow_reader_too() -> None:
    listen = Listen(slow_reader_seconds=3.0)
    session = listen.open()
    assert session.send_limits.send_timeout == 3.0
    session.receive_send_timeout(5.0)
    assert session.close_action() == Close(4408, "slow_reader")
    assert "3 s" in messages(session)[-1]["message"]


def test_shutdown_flushes_then_says_how_to_resume_and_closes_1001() -> None:
    listen = Listen()
    session = listen.open()
    messages(session)
    listen.stream(session, chunks(pcm16(speech()))[:30])
    session.receive_shutdown(4.0)
    pump(listen.scheduler, listen.engine)
    out = messages(session)
    assert out[-1]["code"] == "shutting_down" and out[-1]["resume"]["session_id"] == session.id
    finals = [m for m in out if m["type"] == "final"]
    assert out[-1]["resume"]["last_seq"] == finals[-1]["seq"]
    assert session.close_action() == Close(1001, "shutting_down")


def test_a_dropped_connection_parks_the_session_and_a_resume_by_its_owner_replays_the_finals() -> None:
    owner = Principal("key-a")
    listen = Listen(resume_grace_seconds=30.0)
    session = listen.open(owner=owner)
    messages(session)
    now = listen.stream(session, chunks(pcm16(speech()))[:60])
    sent = [m for m in messages(session, now) if m["type"] == "final"]
    assert len(sent) >= 2
    session.receive_connection_lost(now, dropped=True)
    assert session.phase is Phase.PARKED and session.close_action() == LOST and session.id in listen.registry
    session.release()  # what the runner does as its run ends: a parked session keeps its cores
    assert session.phase is Phase.PARKED
    with pytest.raises(UnknownSession):  # another key's resume is refused as if there were no such session
        listen.open(f"/v1/listen?resume={session.id}&last_seq=1", now, owner=Principal("key-b"))
    resumed = listen.open(f"/v1/listen?resume={session.id}&last_seq=1", now + 1.0, owner=owner)
    assert resumed is session and session.close_action() is None and session.reading
    out = messages(session, now + 1.0)
    assert out[0]["type"] == "ready" and out[0]["resumed"] and out[0]["session_id"] == session.id
    assert [m["seq"] for m in out[1:] if m["type"] == "final"] == [m["seq"] for m in sent[1:]]


def test_a_connection_the_client_closed_ends_the_session_without_parking() -> None:
    listen = Listen(resume_grace_seconds=30.0)
    session = listen.open()
    session.receive_connection_lost(1.0, dropped=False)
    assert session.phase is Phase.CLOSED and session.close_action() == LOST
    assert session.id not in listen.registry and listen.scheduler.next_batch() is None


def test_a_parked_session_nobody_resumes_expires_after_the_grace_period() -> None:
    listen = Listen(resume_grace_seconds=30.0)
    session = listen.open()
    session.receive_connection_lost(1.0)
    listen.timers.advance(30.0)
    assert session.phase is Phase.CLOSED and session.id not in listen.registry


@pytest.mark.parametrize(
    ("path", "refusal"),
    [
        ("/v1/listen?encoding=mp3", UnsupportedAudio),
        ("/v1/listen?language=xx", UnsupportedAudio),
        ("/v1/listen?resume=abc123&last_seq=0", UnknownSession),
        ("/v1/listen?resume=not-an-id&last_seq=0", UnsupportedAudio),
    ],
)
def test_a_request_the_session_cannot_serve_is_refused_before_it_exists(path: str, refusal: type[Exception]) -> None:
    tiny_en = ScriptedEngine(WORDS, info=EngineInfo(model="tiny.en", multilingual=False, encoder="f", decoder="f"))
    listen = Listen(tiny_en)
    with pytest.raises(refusal):
        listen.open(path)
    assert listen.scheduler.next_batch() is None


def test_a_last_word_that_does_not_fit_is_slow_reader() -> None:
    listen = Listen(send_buffer=2, idle_timeout=10.0)
    session = listen.open()  # ready, never taken
    session.receive_text('{"type":"keepalive"}', 1.0)
    session._outbox.put(ErrorMessage(code="engine_failure", message="m"))  # the buffer is full of must-sends
    session.receive_timer(11.0)  # idle: the idle_timeout error cannot fit
    assert session.close_action() == Close(4408, "slow_reader")
    assert [m["code"] for m in messages(session)] == ["slow_reader"]


# -- over a real server ---------------------------------------------------------------------------------------------


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
    srv = App(ServerConfig(port=0, session=replace(SessionOptions(), max_session_seconds=0.3)), ScriptedEngine(WORDS))
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
    srv = App(ServerConfig(port=0), ScriptedEngine(WORDS))
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
    async with App(ServerConfig(port=0), ScriptedEngine(WORDS, info=TINY_EN)) as srv:
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
    async with App(ServerConfig(port=0), ScriptedEngine(WORDS, behaviour, info=info)) as srv:
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


@pytest.mark.parametrize("close_ahead", [False, True])
def test_speech_ended_goes_out_at_the_end_point_before_the_utterance_s_last_final(close_ahead: bool) -> None:
    """speech_ended names the VAD's end point and goes out before the last final of its utterance. Without
    close_ahead that final needs one more decode: with the engine not yet run, the end point is known and out, its
    final is not. With it, the window decoded when the speech paused is that decode: the final follows at once."""
    listen = Listen(core=CoreOptions(close_ahead=close_ahead))
    session = listen.open()
    messages(session)
    clip = pcm16(speech(seconds_of_silence_between=1.5))
    now = 0.0
    out: list[dict[str, Any]] = []
    for frame in chunks(clip):
        session.receive_bytes(frame, now)
        out += messages(session, now)
        if any(m["type"] == "speech_ended" for m in out):
            break  # the end point is out: the engine has not run since
        pump(listen.scheduler, listen.engine)
        out += messages(session, now)
        now += 0.1
    [ended] = [m for m in out if m["type"] == "speech_ended"]
    assert ended["channel"] == 0 and ended["reason"] == "vad" and ended["start"] < ended["end"]
    if close_ahead:
        after = out[out.index(ended) + 1 :]
    else:
        assert out.index(ended) == len(out) - 1  # nothing of its last final yet
        pump(listen.scheduler, listen.engine)
        after = messages(session, now)
    last = [m for m in after if m["type"] == "final"][-1]
    assert last["end"] == pytest.approx(ended["end"], abs=1e-3)  # its final accounts up to the end point
    assert all(m["language"] == "en" for m in out + after if m["type"] in ("partial", "final"))


def test_prompt_and_keywords_from_the_query_then_a_configure_reach_the_engine() -> None:
    seen: list[tuple[str, tuple[str, ...]]] = []
    engine = ScriptedEngine(lambda r: seen.append((r.options.initial_prompt, r.options.keywords)) or WORDS)
    listen = Listen(engine)
    session = listen.open("/v1/listen?prompt=Cooking+show.&keywords=roux,bechamel")
    messages(session)
    frames = chunks(pcm16(speech()))
    now = listen.stream(session, frames[:20])
    assert seen and set(seen) == {("Cooking show.", ("roux", "bechamel"))}
    session.receive_text('{"type": "configure", "keywords": ["Zoë"]}', now)  # the prompt is left as it was
    seen.clear()
    now = listen.stream(session, frames[20:], start=now)
    assert seen and set(seen) == {("Cooking show.", ("Zoë",))}
    session.receive_text('{"type": "configure", "prompt": ""}', now)
    assert session.channels[0].core.options.decode.initial_prompt == ""
    assert session.phase is Phase.RECEIVING


@pytest.mark.parametrize(
    ("frame", "complaint"),
    [
        ('{"type": "configure", "keywords": "a"}', "keywords must be a list of strings"),
        ('{"type": "configure", "prompt": "' + "p" * 801 + '"}', "initial_prompt must be at most 800 characters"),
    ],
)
def test_a_bad_configure_is_a_bad_message_and_the_audio_before_it_is_transcribed(frame: str, complaint: str) -> None:
    listen = Listen()
    session = listen.open()
    messages(session)
    now = listen.stream(session, chunks(pcm16(speech())))
    session.receive_text(frame, now)
    pump(listen.scheduler, listen.engine)
    out = messages(session, now)
    assert session.close_action() == Close(4400, "bad_message")
    error = out[-1]
    assert error["type"] == "error" and error["code"] == "bad_message" and complaint in error["message"]
    assert any(m["type"] == "final" for m in out)  # flushed before the close


def test_a_bad_prompt_in_the_query_is_refused_with_4415() -> None:
    with pytest.raises(UnsupportedAudio, match="keywords"):
        Listen().open("/v1/listen?keywords=" + "k" * 51)
