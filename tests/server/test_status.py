from __future__ import annotations

import asyncio
import json
from http import HTTPStatus

import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.datastructures import Headers
from websockets.http11 import Request, Response
from websockets.server import ServerProtocol

from streamer.app import App
from streamer.engine.fake import ScriptedEngine
from streamer.server.status import LoadMeter, latency_percentiles
from tests.helpers import WORDS, chunks, config, http_get, pcm16, received_seconds, speech, until


def test_load_meter_measures_busy_time_over_the_recent_window() -> None:
    meter = LoadMeter(started=0.0, window=10.0)
    assert meter.sample(2.0, 1.0) == 0.5  # busy 1 s of the first 2
    assert meter.sample(4.0, 1.0) == 0.25  # idle since: 1 s of 4
    # idle for 16 s: the samples older than the window fall out, and the load is the recent one
    assert meter.sample(20.0, 1.0) == 0.0
    assert meter.sample(34.0, 15.0) == 1.0  # busy all of the last 14 s
    assert meter.sample(34.0, 15.0) == 1.0  # a second poller at the same instant sees the same
    assert LoadMeter(started=5.0).sample(5.0, 0.0) == 0.0


def test_latency_percentiles_round_and_say_none_when_empty() -> None:
    assert latency_percentiles([]).p50 is None
    summary = latency_percentiles([100.0, 200.04, 300.0])
    assert (summary.p50, summary.p95) == (200.0, 290.0)


async def test_status_lists_the_live_session_and_the_engine() -> None:
    async with App(config(), ScriptedEngine(WORDS)) as srv:
        status, headers, body = await http_get(srv.port, "/status")
        assert status == 200
        assert headers["content-type"] == "application/json"
        idle = json.loads(body)
        assert idle["ready"] is True and idle["draining"] is False and idle["sessions"] == []
        assert idle["engine"]["active_sessions"] == 0 and idle["engine"]["max_sessions"] == 16
        audio = speech()
        async with ws_connect(f"ws://127.0.0.1:{srv.port}/v1/listen") as ws:
            ready = json.loads(await ws.recv())
            for frame in chunks(pcm16(audio[: 5 * 16000])):
                await ws.send(frame)
            await until(lambda: received_seconds(srv) >= 5)
            _, _, body = await http_get(srv.port, "/status")
        report = json.loads(body)
        (session,) = report["sessions"]
        assert session["id"] == ready["session_id"]
        assert session["kind"] == "listen" and session["channels"] == 1
        assert session["audio_seconds"] == pytest.approx(5.0)
        assert session["age_seconds"] > 0
        assert 0 <= session["lag_seconds"] <= session["audio_seconds"]
        assert 0 <= session["uncommitted_seconds"] <= session["audio_seconds"]
        assert set(session["final_latency_ms"]) == {"p50", "p95"}
        engine = report["engine"]
        assert engine["active_sessions"] == 1
        assert engine["batches"] > 0
        assert 0 <= engine["load"] <= 1
        assert engine["gpu_memory_bytes"] is None  # the scripted engine never touches a GPU


async def test_status_before_the_model_is_loaded_has_no_engine() -> None:
    async with App(config(), engine=None) as srv:
        _, _, body = await http_get(srv.port, "/status")
    report = json.loads(body)
    assert (report["ready"], report["engine"], report["model"]) == (False, None, "tiny.en")


class _Connection:
    """Just enough of a ServerConnection for Server._route's answers: a protocol whose reader read no body."""

    protocol = ServerProtocol()

    def respond(self, status: HTTPStatus, text: str) -> Response:
        return ServerProtocol().reject(status, text)


async def test_readyz_says_draining_during_shutdown_while_healthz_stays_ok() -> None:
    srv = App(config(), ScriptedEngine(WORDS))
    await srv.start()
    async with ws_connect(f"ws://127.0.0.1:{srv.port}/v1/listen") as ws:
        await ws.recv()  # ready
        await ws.send(pcm16(speech()[:16000]))
        stopping = asyncio.create_task(srv.shutdown())
        await until(lambda: srv.status().draining)  # the session is flushing its finals: the server drains

        def get(path: str) -> Response:
            response = srv._route(_Connection(), Request(path, Headers()))  # type: ignore[arg-type]
            assert response is not None
            return response

        ready = get("/readyz")
        assert (ready.status_code, ready.body) == (503, b"draining\n")
        assert get("/healthz").status_code == 200
        assert json.loads(get("/status").body)["draining"] is True
        async with asyncio.timeout(30):  # a hang guard
            while True:
                try:
                    await ws.recv()
                except Exception:
                    break
    await stopping
    assert ws.close_code == 1001
