"""A client that stops reading is closed with slow_reader (4408) within its bound, not left to time out."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from dataclasses import replace

import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from streamer.app import App
from streamer.engine.fake import ScriptedEngine
from streamer.server.serve import ServerConfig
from streamer.server.session_options import SessionOptions
from tests.helpers import pcm16, until
from tests.reliability.helpers import LONG_WORDS, looped_speech
from tests.reliability.tally import TALLY

pytestmark = pytest.mark.reliability

BOUND_SECONDS = 1.0  # the configured slow_reader_seconds


async def test_a_reader_that_stops_reading_is_closed_with_slow_reader(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="streamer.server.session")
    options = replace(SessionOptions(), slow_reader_seconds=BOUND_SECONDS, socket_send_buffer=4096, idle_timeout=60.0)
    async with App(ServerConfig(port=0, session=options), ScriptedEngine(LONG_WORDS)) as server:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", server.port))
        ws = await ws_connect(f"ws://127.0.0.1:{server.port}/v1/listen", sock=sock, max_queue=4)
        data = pcm16(looped_speech(60.0))
        started = time.monotonic()
        detected = None
        for offset in range(0, len(data), 3200):  # 100 ms of audio and a final for it, 8x faster than real time
            await ws.send(data[offset : offset + 3200])
            await ws.send('{"type":"finalize"}')
            await asyncio.sleep(0.0125)  # paces the audio
            if "event=slow_reader" in caplog.text:
                detected = time.monotonic() - started
                break
        # while the client still streams: the buffers (socket and the 32 KiB write buffer) fill, then the bound applies
        assert detected is not None, "the server never noticed that the client stopped reading"
        # the client reads again: what was buffered arrives, then the close the server chose
        try:
            async with asyncio.timeout(60):  # a hang guard
                async for _ in ws:
                    pass
        except ConnectionClosed:
            pass
        assert ws.close_code == 4408 and ws.close_reason == "slow_reader"
        await ws.close()
        await until(lambda: not server.sessions)  # the server lets go of the session once its close handshake is over
    TALLY["slow readers closed with 4408"] += 1
    TALLY["slow reader noticed after ms"] = int(detected * 1000)
