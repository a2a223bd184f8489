"""Plain helpers shared by the test modules: audio to send, a client exchange over ``/v1/listen``, an HTTP GET, and
stand-ins for the clock and the event loop's timers. Fixtures live in ``conftest.py``."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from streamer.engine.fake import words_from_text
from streamer.engine.types import Engine
from streamer.server.redis_link import RedisOptions
from streamer.server.scheduler import Scheduler
from streamer.server.serve import Server, ServerConfig
from streamer.server.session import Session
from streamer.server.session_options import SessionOptions
from tests.conftest import load_clip

__all__ = [
    "CLIP",
    "WORDS",
    "FakeClock",
    "ManualTimers",
    "chunks",
    "config",
    "exchange",
    "http_get",
    "kinds",
    "pcm16",
    "pump",
    "received_by_session",
    "received_seconds",
    "speech",
    "until",
]

CLIP = "1089-134686-0000.flac"
# a word every 0.3 s for as long as any test streams: the fake engine answers each window with the words inside it
WORDS = words_from_text(" ".join(f"w{i}" for i in range(400)), 0, 4000, 800)


def pcm16(samples: npt.NDArray[np.float32]) -> bytes:
    return np.clip(np.round(samples * 32768), -32768, 32767).astype("<i2").tobytes()


def speech(seconds_of_silence_between: float = 1.0) -> npt.NDArray[np.float32]:
    """The committed clip twice with a pause between: two utterances, some non-speech."""
    clip = load_clip(CLIP)
    pause = np.zeros(int(seconds_of_silence_between * 16000), dtype=np.float32)
    return np.concatenate([clip, pause, clip[: 3 * 16000]])


def config(redis: str | None = None, **session: Any) -> ServerConfig:
    """A server on a free port with these session options, sharing state through the Redis at ``redis``, if any."""
    shared = RedisOptions(url=redis, retry_seconds=0.05)
    return ServerConfig(port=0, session=replace(SessionOptions(), **session), redis=shared)


async def exchange(
    srv: Server, frames: Sequence[bytes | str], query: str = "", pause: float = 0.0
) -> tuple[list[dict[str, Any]], int | None]:
    """Send ``frames`` (``pause`` seconds apart), then read every message until the server closes; return them and
    the close code."""
    url = f"ws://127.0.0.1:{srv.port}/v1/listen{query}"
    async with ws_connect(url, max_queue=None) as ws:
        messages: list[dict[str, Any]] = []
        try:
            for frame in frames:
                await ws.send(frame)
                if pause:
                    await asyncio.sleep(pause)
            while True:
                messages.append(json.loads(await ws.recv()))
        except ConnectionClosed:
            pass
        return messages, ws.close_code


def pump(scheduler: Scheduler, engine: Engine) -> int:
    """Decode every window the scheduler's streams offer, by hand and without an event loop, until none is left
    (what :meth:`Scheduler.run` does on its worker thread); returns the number of batches."""
    batches = 0
    while (batch := scheduler.next_batch()) is not None:
        scheduler.deliver(batch, engine.decode(batch.requests))
        batches += 1
    return batches


def chunks(data: bytes, size: int = 3200) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def kinds(messages: list[dict[str, Any]]) -> list[str]:
    return [m["type"] for m in messages]


async def http_get(port: int, path: str) -> tuple[int, dict[str, str], str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    raw = await reader.read()
    writer.close()
    head, _, body = raw.decode().partition("\r\n\r\n")
    status_line, *header_lines = head.split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
    return int(status_line.split()[1]), headers, body


async def until(condition: Callable[[], object], timeout: float = 30.0) -> None:
    """Return as soon as ``condition()`` is true, polling the event loop; fail after ``timeout`` seconds.

    The timeout only guards against a hang: it is no bound on how fast the condition comes true."""
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.005)


def received_seconds(srv: Server) -> float:
    """Seconds of audio the server's ``/v1/listen`` sessions have received in all (what ``GET /status`` reports)."""
    return sum(received_by_session(srv).values())


def received_by_session(srv: Server) -> dict[str, float]:
    """Seconds of audio each live ``/v1/listen`` session has received, by session id (resumed ones included)."""
    return {s.id: s.snapshot(0.0).audio_seconds for s in srv.sessions if isinstance(s, Session)}


class FakeClock:
    """A clock that moves only when slept on: ``clock()`` stands in for ``time.monotonic`` and ``clock.sleep`` for
    ``asyncio.sleep`` (it still yields to the event loop once). ``sleeps`` records every sleep asked for."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Time passes without a sleep (a slow consumer, a busy machine)."""
        self.now += seconds

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += max(0.0, seconds)
        await asyncio.sleep(0)


@dataclass(order=True)
class _Timer:
    when: float
    order: int
    callback: Callable[..., object] = field(compare=False)
    args: tuple[Any, ...] = field(compare=False)
    cancelled: bool = field(default=False, compare=False)

    def cancel(self) -> None:
        self.cancelled = True


class ManualTimers:
    """Stands in for ``loop.call_later``: a timer fires only when :meth:`advance` moves time past it."""

    def __init__(self) -> None:
        self.now = 0.0
        self._timers: list[_Timer] = []
        self._order = itertools.count()

    def call_later(self, delay: float, callback: Callable[..., object], *args: Any) -> _Timer:
        timer = _Timer(self.now + delay, next(self._order), callback, args)
        heapq.heappush(self._timers, timer)
        return timer

    @property
    def pending(self) -> int:
        """Timers neither fired nor cancelled."""
        return sum(not t.cancelled for t in self._timers)

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``, firing every timer that falls due on the way, in order."""
        self.now += seconds
        while self._timers and self._timers[0].when <= self.now:
            timer = heapq.heappop(self._timers)
            if not timer.cancelled:
                timer.callback(*timer.args)
