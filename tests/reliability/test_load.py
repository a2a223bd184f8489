"""Load: many paced streams for minutes on the scripted engine, with the limits tried beside them.

``STREAMER_LOAD_SECONDS`` (default 120) sets how long the streams last, ``STREAMER_LOAD_STREAMS`` (default 16) how
many, ``STREAMER_LOAD_RTF`` (default 0.002) the engine's seconds per second of audio. The streams run concurrently,
so the test takes about ``STREAMER_LOAD_SECONDS`` of wall time.

The test asserts behaviour only: every stream ends 1000 with all of its audio accounted for, the excess is refused
with 1013, the limits close the clients that break them. Latency, refusal time and memory are reported in the
reliability counts, not asserted: on a shared machine they measure the machine, and ``streamer bench`` (stream,
capacity, soak) measures them under control.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from dataclasses import replace

import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from streamer.app import App
from streamer.engine.fake import FakeBehaviour, ScriptedEngine
from streamer.server.metrics import percentile
from streamer.server.scheduler import SchedulerOptions
from streamer.server.serve import Server, ServerConfig
from streamer.server.session_options import SessionOptions
from tests.helpers import pcm16, until
from tests.reliability.helpers import LONG_WORDS, looped_speech, stream
from tests.reliability.tally import TALLY

pytestmark = pytest.mark.reliability

SECONDS = float(os.environ.get("STREAMER_LOAD_SECONDS", "120"))
STREAMS = int(os.environ.get("STREAMER_LOAD_STREAMS", "16"))
RTF = float(os.environ.get("STREAMER_LOAD_RTF", "0.002"))
# how much audio the slow reader offers; it is let go of long before the end (its buffers fill, or it idles out)
SLOW_READER_SECONDS = 60.0
# hang guards: waits this long mean the server never answered, not that it was slow
HANG_SECONDS = 60.0


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def sample_rss(samples: list[tuple[float, int]], stop: asyncio.Event) -> None:
    started = time.monotonic()
    while not stop.is_set():
        samples.append((time.monotonic() - started, rss_bytes()))
        await asyncio.sleep(1.0)


async def refused(port: int) -> tuple[int | None, str | None, float]:
    """An over-capacity connection: its close code, the error code of its one message, and the seconds it took."""
    started = time.monotonic()
    message: dict[str, str] = {}
    async with ws_connect(f"ws://127.0.0.1:{port}/v1/listen") as ws:
        try:
            message = json.loads(await asyncio.wait_for(ws.recv(), HANG_SECONDS))
            await asyncio.wait_for(ws.wait_closed(), HANG_SECONDS)
        except ConnectionClosed:
            pass
    return ws.close_code, message.get("code"), time.monotonic() - started


async def slow_reader(srv: Server) -> float:
    """A client that streams and asks for finals but never reads; returns once the server has let go of it (the
    seconds it took, for the report)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", srv.port))
    started = time.monotonic()
    ws = await ws_connect(f"ws://127.0.0.1:{srv.port}/v1/listen", sock=sock, max_queue=4)
    data = pcm16(looped_speech(SLOW_READER_SECONDS))
    try:
        for index, offset in enumerate(range(0, len(data), 3200)):
            await ws.send(data[offset : offset + 3200])
            await ws.send('{"type":"finalize"}')  # a final for every 100 ms of audio: more than the reader takes
            await asyncio.sleep(0.025)  # paces the audio at 4x real time, within the rate limit's burst
            if index > 10 and not srv.sessions:
                break
    except ConnectionClosed:
        pass
    await until(lambda: not srv.sessions, timeout=3 * SLOW_READER_SECONDS)  # the server let go of it
    ws.transport.abort()
    return time.monotonic() - started


async def idle_client(port: int) -> tuple[int | None, str | None, float]:
    """A client that connects and sends nothing: its close code, the last error code, and the seconds it took."""
    started = time.monotonic()
    async with ws_connect(f"ws://127.0.0.1:{port}/v1/listen") as ws:
        messages = []
        try:
            async with asyncio.timeout(HANG_SECONDS):
                async for message in ws:
                    messages.append(json.loads(message))
        except ConnectionClosed:
            pass
    return ws.close_code, messages[-1].get("code"), time.monotonic() - started


async def test_paced_streams_for_minutes_with_the_limits_tried_beside_them() -> None:
    engine = ScriptedEngine(LONG_WORDS, FakeBehaviour(real_time_factor=RTF))
    loaded = ServerConfig(port=0, scheduler=SchedulerOptions(max_sessions=STREAMS))
    limits = ServerConfig(
        port=0,
        session=replace(SessionOptions(), send_buffer=4, socket_send_buffer=4096, idle_timeout=2.0, flush_timeout=2.0),
    )
    rss: list[tuple[float, int]] = []
    stop = asyncio.Event()
    async with App(loaded, engine) as srv, App(limits, ScriptedEngine(LONG_WORDS)) as side:
        sampler = asyncio.create_task(sample_rss(rss, stop))
        streams = [asyncio.create_task(stream(srv.port, looped_speech(SECONDS), speed=1.0)) for _ in range(STREAMS)]
        await until(lambda: srv.scheduler is not None and srv.scheduler.active_sessions == STREAMS)  # all admitted
        # twice capacity: every connection beyond max_sessions is refused, the admitted ones go on
        refusals = await asyncio.gather(*(refused(srv.port) for _ in range(STREAMS)))
        # beside them, on a server with tight limits: a reader that stops reading, a client that sends nothing
        idle, slow = await asyncio.gather(idle_client(side.port), slow_reader(side))
        outcomes = await asyncio.gather(*streams)
        stop.set()
        await sampler
    # every stream: closed normally, all of its audio accounted for, every final in order, no error
    unaccounted = sum(o.unaccounted_samples() for o in outcomes)
    assert [o.close_code for o in outcomes] == [1000] * STREAMS
    assert all(o.seqs_in_order() and o.finals for o in outcomes)
    assert unaccounted == 0
    assert not [m for o in outcomes for m in o.messages if m["type"] == "error"]
    # the excess was refused, each with at_capacity and 1013
    assert [r[:2] for r in refusals] == [(1013, "at_capacity")] * STREAMS
    # the limits held: the idle client was closed for idling, not before its timeout; the slow reader was let go of
    # (slow_reader returns only then, and fails after its hang guard otherwise)
    assert idle[:2] == (4408, "idle_timeout") and idle[2] >= limits.session.idle_timeout
    # figures for the report only (streamer bench measures them under control)
    p95 = percentile([f["latency_ms"] for o in outcomes for f in o.finals], 95)
    warm = [b for t, b in rss if t >= SECONDS / 4]
    TALLY["streams held"] += STREAMS
    TALLY["stream seconds"] += int(STREAMS * SECONDS)
    TALLY["over-capacity connections refused"] += len(refusals)
    TALLY["samples unaccounted"] += unaccounted
    TALLY["final latency p95 ms"] = int(p95 or 0)
    TALLY["slowest refusal ms"] = int(max(r[2] for r in refusals) * 1000)
    TALLY["slow reader let go of after ms"] = int(slow * 1000)
    TALLY["RSS growth after warm-up KiB"] = (max(warm) - warm[0]) // 1024 if warm else 0
