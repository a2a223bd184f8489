"""Load: many paced streams for minutes on the scripted engine, with the limits tried beside them.

``STREAMER_LOAD_SECONDS`` (default 120) sets how long the streams last, ``STREAMER_LOAD_STREAMS`` (default 16) how
many, ``STREAMER_LOAD_RTF`` (default 0.002) the engine's seconds per second of audio. The streams run concurrently,
so the test takes about ``STREAMER_LOAD_SECONDS`` of wall time.
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

from streamer.engine.fake import FakeBehaviour, ScriptedEngine
from streamer.metrics import percentile
from streamer.scheduler import SchedulerOptions
from streamer.server import Server, ServerConfig
from streamer.session import SessionOptions
from tests.helpers import pcm16
from tests.reliability.helpers import LONG_WORDS, looped_speech, stream
from tests.reliability.tally import TALLY

pytestmark = pytest.mark.reliability

SECONDS = float(os.environ.get("STREAMER_LOAD_SECONDS", "120"))
STREAMS = int(os.environ.get("STREAMER_LOAD_STREAMS", "16"))
RTF = float(os.environ.get("STREAMER_LOAD_RTF", "0.002"))
# bounds a user would notice
FINAL_LATENCY_P95_MS = 2500.0
RSS_GROWTH_BYTES = 40 << 20  # after warm-up: the server keeps no per-second state that grows
REFUSAL_SECONDS = 1.0
# a client that streams but never reads is let go of within this: its socket and send buffers fill, or it stops
# sending and idles out; then flush_timeout, then the close handshake's timeout
SLOW_READER_SECONDS = 60.0


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def sample_rss(samples: list[tuple[float, int]], stop: asyncio.Event) -> None:
    started = time.monotonic()
    while not stop.is_set():
        samples.append((time.monotonic() - started, rss_bytes()))
        await asyncio.sleep(1.0)


async def refused_promptly(port: int) -> float | None:
    """Seconds until an over-capacity connection is refused with 1013, or None if it was not."""
    started = time.monotonic()
    async with ws_connect(f"ws://127.0.0.1:{port}/v1/listen") as ws:
        try:
            message = json.loads(await asyncio.wait_for(ws.recv(), 5))
            await asyncio.wait_for(ws.wait_closed(), 5)
        except ConnectionClosed:
            pass
    if ws.close_code != 1013 or message.get("code") != "at_capacity":
        return None
    return time.monotonic() - started


async def slow_reader(srv: Server) -> float:
    """A client that streams and asks for finals but never reads: seconds until the server let go of it."""
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
            await asyncio.sleep(0.025)  # 4x real time, within the rate limit's burst
            if index > 10 and not srv.sessions:
                break
    except ConnectionClosed:
        pass
    while srv.sessions and time.monotonic() - started < 3 * SLOW_READER_SECONDS:
        await asyncio.sleep(0.1)
    ws.transport.abort()
    return time.monotonic() - started


async def idle_client(port: int, timeout: float) -> tuple[int | None, str | None, float]:
    started = time.monotonic()
    async with ws_connect(f"ws://127.0.0.1:{port}/v1/listen") as ws:
        messages = []
        try:
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
    async with Server(loaded, engine) as srv, Server(limits, ScriptedEngine(LONG_WORDS)) as side:
        sampler = asyncio.create_task(sample_rss(rss, stop))
        streams = [asyncio.create_task(stream(srv.port, looped_speech(SECONDS), speed=1.0)) for _ in range(STREAMS)]
        await asyncio.sleep(min(10.0, SECONDS / 4))
        # twice capacity: every connection beyond max_sessions is refused at once, the admitted ones go on
        refusals = await asyncio.gather(*(refused_promptly(srv.port) for _ in range(STREAMS)))
        # beside them, on a server with tight limits: a reader that stops reading, a client that sends nothing
        idle, slow = await asyncio.gather(idle_client(side.port, limits.session.idle_timeout), slow_reader(side))
        outcomes = await asyncio.gather(*streams)
        stop.set()
        await sampler
    # every stream: all of its audio accounted for, every final in order, latency bounded
    unaccounted = sum(o.unaccounted_samples() for o in outcomes)
    latencies = [f["latency_ms"] for o in outcomes for f in o.finals]
    p95 = percentile(latencies, 95)
    assert [o.close_code for o in outcomes] == [1000] * STREAMS
    assert all(o.seqs_in_order() and o.finals for o in outcomes)
    assert unaccounted == 0
    assert p95 is not None and p95 < FINAL_LATENCY_P95_MS, f"final latency p95 {p95:.0f} ms"
    assert not [m for o in outcomes for m in o.messages if m["type"] == "error"]
    # the excess was refused promptly
    assert all(r is not None and r < REFUSAL_SECONDS for r in refusals), refusals
    # the limits held
    assert idle[:2] == (4408, "idle_timeout") and limits.session.idle_timeout <= idle[2] < idle[2] + 1.5
    assert slow < SLOW_READER_SECONDS
    # memory flat after warm-up
    warm = [b for t, b in rss if t >= SECONDS / 4]
    growth = max(warm) - warm[0] if warm else 0
    assert growth < RSS_GROWTH_BYTES, f"RSS grew {growth / 2**20:.1f} MiB after warm-up"
    TALLY["streams held"] += STREAMS
    TALLY["stream seconds"] += int(STREAMS * SECONDS)
    TALLY["over-capacity connections refused"] += len(refusals)
    TALLY["samples unaccounted"] += unaccounted
    TALLY["final latency p95 ms"] = int(p95)
    TALLY["RSS growth after warm-up KiB"] = growth // 1024
