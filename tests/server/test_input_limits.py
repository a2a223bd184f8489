"""Issue 14 on the wire: a frame that once cost the server a RecursionError (close 1011) or gigabytes gets its
documented error and close code instead, on every endpoint that parses client JSON (docs/protocol.md, Limits)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from streamer.app import App
from streamer.engine.fake import ScriptedEngine
from streamer.integrations.twilio import TrackName, recorded_messages
from streamer.server.serve import Server
from tests.helpers import WORDS, config, exchange

HANG_SECONDS = 60  # only guards against a hang: a missed close shows as the wrong close code

DEEP = "[" * 1000  # once: RecursionError, close 1011 and a traceback in the log


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    async with App(config(), ScriptedEngine(WORDS)) as srv:
        yield srv


async def twilio(port: int, frames: list[str]) -> tuple[int | None, str | None]:
    """Send ``frames`` to /twilio; the close code and reason (Twilio gets no messages back)."""
    async with asyncio.timeout(HANG_SECONDS), ws_connect(f"ws://127.0.0.1:{port}/twilio") as ws:
        for frame in frames:
            await ws.send(frame)
        with contextlib.suppress(ConnectionClosed):
            await ws.recv()
    return ws.close_code, ws.close_reason


def twilio_start(call_sid: str) -> list[str]:
    tracks = {TrackName.INBOUND: np.zeros(160, dtype=np.float32)}
    connected, start, media, _stop = (json.dumps(m) for m in recorded_messages(tracks, call_sid=call_sid))
    return [connected, start, media]


@pytest.mark.parametrize("frame", [DEEP, '{"type": ' + DEEP])
async def test_listen_deep_json_is_bad_message_4400(server: Server, frame: str) -> None:
    async with asyncio.timeout(HANG_SECONDS):
        messages, close_code = await exchange(server, [frame])
    assert close_code == 4400
    assert messages[-1]["type"] == "error" and messages[-1]["code"] == "bad_message"


@pytest.mark.parametrize("frame", [DEEP, '{"event": "media", "media": ' + DEEP])
async def test_twilio_deep_json_closes_4400(server: Server, frame: str) -> None:
    assert await twilio(server.port, [*twilio_start("CA14a"), frame]) == (4400, "bad_message")


async def test_twilio_timestamp_far_ahead_closes_4400_media_gap_too_long(server: Server) -> None:
    far = {
        "event": "media",
        "sequenceNumber": "4",
        "media": {"track": "inbound", "timestamp": "1000000", "payload": ""},
    }
    assert await twilio(server.port, [*twilio_start("CA14b"), json.dumps(far)]) == (4400, "media_gap_too_long")


async def test_realtime_deep_json_is_invalid_json_and_the_session_goes_on(server: Server) -> None:
    url = f"ws://127.0.0.1:{server.port}/v1/realtime?intent=transcription"
    async with asyncio.timeout(HANG_SECONDS), ws_connect(url) as ws:
        await ws.recv()  # session.created
        await ws.send(DEEP)
        error: dict[str, Any] = json.loads(await ws.recv())
        assert error["type"] == "error" and error["error"]["code"] == "invalid_json"
        await ws.send('{"type": "input_audio_buffer.clear"}')
        assert json.loads(await ws.recv())["type"] == "input_audio_buffer.cleared"


async def test_twilio_audio_faster_than_the_rate_limit_closes_4429() -> None:
    """The server's one audio rate limit applies to /twilio too: a replayed call sent all at once is cut."""
    from dataclasses import replace

    from streamer.server.ratelimit import RateLimitOptions

    limited = replace(config(), session=replace(config().session, rate_limit=RateLimitOptions(2.0, 1.0)))
    async with App(limited, ScriptedEngine(WORDS)) as srv:
        tracks = {TrackName.INBOUND: np.zeros(8000 * 10, dtype=np.float32)}  # 10 s of audio, sent at once
        frames = [json.dumps(m) for m in recorded_messages(tracks, call_sid="CA14r")][:-1]  # no stop
        assert await twilio(srv.port, frames) == (4429, "rate_limited")
