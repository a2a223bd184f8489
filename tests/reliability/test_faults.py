"""Faults: a drain with live streams, an engine that fails one batch in ten, connections reset mid-stream (and
resumed, with no final lost), sessions nobody comes back for (cleaned up)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from streamer.app import App
from streamer.engine.fake import FakeEngineError, ScriptedEngine
from streamer.engine.types import DecodeRequest, DecodeResult, EngineInfo, StreamId
from streamer.server.resume import ResumeRegistry
from streamer.server.serve import Server, ServerConfig
from streamer.server.session_options import SessionOptions
from tests.helpers import ManualTimers, pcm16, received_by_session, until
from tests.reliability.helpers import LONG_WORDS, StreamOutcome, looped_speech, stream
from tests.reliability.tally import TALLY

pytestmark = pytest.mark.reliability


class CudaOutOfMemory(FakeEngineError):
    """What torch raises when the GPU runs out of memory: a RuntimeError."""


class FlakyEngine:
    """The scripted engine, failing every ``every``-th call like a GPU that runs out of memory now and then, and the
    ``burst - 1`` calls after it too (the scheduler's retry of a failed batch's first window alone, when the failed
    call held several)."""

    def __init__(self, inner: ScriptedEngine, every: int, burst: int = 1) -> None:
        self.inner = inner
        self.every = every
        self.burst = burst
        self.calls = 0
        self.failures = 0

    @property
    def info(self) -> EngineInfo:
        return self.inner.info

    def decode(self, requests: Sequence[DecodeRequest]) -> list[DecodeResult]:
        self.calls += 1
        if self.calls % self.every < self.burst and self.calls >= self.every:
            self.failures += 1
            raise CudaOutOfMemory("CUDA out of memory. Tried to allocate 2.00 GiB")
        return self.inner.decode(requests)

    def forget_stream(self, stream_id: StreamId) -> None:
        self.inner.forget_stream(stream_id)

    def close(self) -> None:
        self.inner.close()


def config(**session: Any) -> ServerConfig:
    # a shutdown_timeout no flush on a busy machine comes near: the tests check that sessions end by themselves
    return ServerConfig(port=0, shutdown_timeout=60.0, session=replace(SessionOptions(), **session))


async def test_shutdown_with_live_streams_flushes_them_and_says_where_each_stood(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="streamer.server.serve")
    srv = App(config(), ScriptedEngine(LONG_WORDS))
    await srv.start()
    streams = [asyncio.create_task(stream(srv.port, looped_speech(30.0), speed=3.0)) for _ in range(6)]
    # mid-stream: every session past the first utterance (10.4 s) and its pause, into the second
    await until(lambda: len(heard := received_by_session(srv)) == 6 and min(heard.values()) >= 12.0)
    await srv.shutdown()  # what SIGTERM runs in `streamer serve`
    outcomes: list[StreamOutcome] = await asyncio.gather(*streams)
    assert "event=stopped" in caplog.text
    assert "event=shutdown_timeout" not in caplog.text  # every session flushed and closed by itself
    for outcome in outcomes:
        assert outcome.close_code == 1001
        error = outcome.messages[-1]
        assert error["code"] == "shutting_down"
        assert error["resume"] == {"session_id": outcome.messages[0]["session_id"], "last_seq": len(outcome.finals)}
        assert outcome.seqs_in_order() and len(outcome.finals) >= 2
        assert not [m for m in outcome.messages if m.get("code") == "engine_failure"]  # every final was flushed
    TALLY["streams drained on shutdown"] += len(outcomes)


async def test_an_engine_failure_on_one_batch_in_ten_costs_only_its_windows() -> None:
    # the call after each failure fails too, so that a window is lost whatever the failed batch held: a batch of
    # several is retried window by window and its first retry fails, a batch of one is not retried
    engine = FlakyEngine(ScriptedEngine(LONG_WORDS), every=10, burst=2)
    async with App(config(), engine) as srv:
        # enough audio that even fully batched (4 windows a call) the engine is called well over 20 times
        outcomes = await asyncio.gather(*(stream(srv.port, looped_speech(32.0), speed=4.0) for _ in range(4)))
        after = await stream(srv.port, looped_speech(4.0), speed=0)  # the server is still up and serving
        failures = srv.metrics.batch_failures.value
    assert engine.failures >= 2 and failures == engine.failures
    lost_total = 0.0
    for outcome in [*outcomes, after]:
        assert outcome.close_code == 1000 and outcome.seqs_in_order()
        assert outcome.unaccounted_samples() == 0  # lost ranges are accounted, not missing
        errors = [m for m in outcome.messages if m["type"] == "error"]
        for error in errors:
            assert error["code"] == "engine_failure" and error["lost"]["start"] < error["lost"]["end"]
            assert "CUDA" not in error["message"]  # internals stay in the log
        assert outcome.done is not None
        lost = sum(e["lost"]["end"] - e["lost"]["start"] for e in errors)
        assert outcome.done["lost_seconds"] == pytest.approx(lost, abs=1e-3)
        lost_total += lost
    assert lost_total > 0
    TALLY["engine failures injected"] += engine.failures
    TALLY["samples unaccounted"] += sum(o.unaccounted_samples() for o in [*outcomes, after])


async def until_heard(srv: Server, session_id: str, seconds: float) -> None:
    """Wait until session ``session_id`` has received ``seconds`` of audio in all."""
    await until(lambda: received_by_session(srv).get(session_id, 0.0) == pytest.approx(seconds, abs=1e-3))


async def until_parked(srv: Server, session_id: str) -> None:
    """Wait until session ``session_id`` waits in the registry for a resume."""
    await until(lambda: session_id in srv.resumable)


async def resuming_client(srv: Server, data: bytes, resets: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Stream ``data`` (PCM16) at 4x real time, resetting the TCP connection ``resets`` times mid-stream and
    resuming each time from what the server says it has; return every final (by seq) and ``done``."""
    port = srv.port
    finals: dict[int, dict[str, Any]] = {}
    session_id: str | None = None
    frame = 3200
    per_connection = len(data) // frame // (resets + 1) + 1
    for attempt in range(resets + 1):
        last_seq = max(finals, default=0)
        query = "" if session_id is None else f"?resume={session_id}&last_seq={last_seq}"
        ws = await ws_connect(f"ws://127.0.0.1:{port}/v1/listen{query}", max_queue=None)
        ready = json.loads(await ws.recv())
        assert ready["type"] == "ready" and ready["resumed"] is (session_id is not None), ready
        session_id = ready["session_id"]
        offset = round(ready["audio_seconds_received"] * 16000) * 2

        async def read(ws: Any = ws) -> dict[str, Any] | None:
            try:
                async for message in ws:
                    item = json.loads(message)
                    if item["type"] == "final":
                        assert item["seq"] not in finals, f"final {item['seq']} sent twice"
                        finals[item["seq"]] = item
                    if item["type"] == "done":
                        return item
            except ConnectionClosed:
                pass
            return None

        reader = asyncio.create_task(read())
        chunks = [data[i : i + frame] for i in range(offset, len(data), frame)]
        last = attempt == resets
        sent = offset
        for chunk in chunks if last else chunks[:per_connection]:
            await ws.send(chunk)
            sent += len(chunk)
            await asyncio.sleep(frame / 2 / 16000 / 4)  # paces the audio at 4x real time
        if last:
            await ws.send('{"type":"end"}')
            done = await asyncio.wait_for(reader, 30)
            assert done is not None and ws.close_code == 1000
            return [finals[s] for s in sorted(finals)], done
        # the server has all of it: finals for the newest audio are being made or in flight when the connection breaks
        await until_heard(srv, session_id, sent / 2 / 16000)
        ws.transport.abort()  # a reset: no close frame, like a phone leaving Wi-Fi
        await reader
        await until_parked(srv, session_id)  # the server noticed the reset
    raise AssertionError("unreachable")


async def test_connections_reset_mid_stream_resume_with_no_final_lost() -> None:
    audio = looped_speech(24.0)
    async with App(config(resume_grace_seconds=10.0), ScriptedEngine(LONG_WORDS)) as srv:
        results = await asyncio.gather(*(resuming_client(srv, pcm16(audio), resets=3) for _ in range(3)))
        resumed = srv.resumable.resumed
    assert resumed == 9
    for finals, done in results:
        assert [f["seq"] for f in finals] == list(range(1, len(finals) + 1))  # none missing, none twice
        assert done["audio_seconds_received"] == pytest.approx(len(audio) / 16000, abs=1e-4)
        accounted = done["audio_seconds_transcribed"] + done["non_speech_seconds"] + done["lost_seconds"]
        assert accounted == pytest.approx(done["audio_seconds_received"], abs=1e-4)
        assert sum(f["end"] - f["start"] for f in finals) == pytest.approx(done["audio_seconds_transcribed"], abs=1e-3)
        words = [int(w[1:]) for f in finals for w in f["text"].split()]
        assert words == sorted(set(words))  # in order, none repeated across the resumes
    TALLY["connections reset and resumed"] += resumed


async def test_a_reset_nobody_resumes_is_cleaned_up_after_the_grace_period() -> None:
    engine = ScriptedEngine(LONG_WORDS)
    timers = ManualTimers()
    srv = App(config(resume_grace_seconds=0.5), engine)
    srv.resumable = ResumeRegistry(timers.call_later)  # the grace period ends when the test says so
    async with srv:
        ws = await ws_connect(f"ws://127.0.0.1:{srv.port}/v1/listen")
        session_id = json.loads(await ws.recv())["session_id"]
        for chunk in range(20):
            await ws.send(pcm16(looped_speech(2.0))[chunk * 3200 : (chunk + 1) * 3200])
        ws.transport.abort()
        await until(lambda: session_id in srv.resumable and not srv.sessions)  # parked, its connection handler gone
        assert srv.scheduler is not None and srv.scheduler.active_sessions == 0  # a parked session holds no slot
        timers.advance(0.5)
        assert session_id not in srv.resumable and srv.resumable.expired == 1
        await until(lambda: StreamId(f"{session_id}/0") in engine.forgotten)  # on the engine thread
