"""The connection runner (:mod:`streamer.server.runner`) over real WebSockets, driving a scripted adapter: frames in
with the clock, the adapter's messages out one at a time, its timer, shutdown, connection loss, slow readers and the
close."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field

import pytest
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from streamer.server.adapter import LOST, Adapter, SendLimits
from streamer.server.runner import Connection
from tests.helpers import until


class Scripted(Adapter):
    """Echoes text frames; ``close`` closes 1000; ``stop`` stops reading; binary frames are counted; the timer
    closes with 4408 once ``deadline`` passes; shutdown 1001; a send timeout 4408 slow_reader."""

    def __init__(self, limits: SendLimits | None = None, deadline: float | None = None) -> None:
        super().__init__()
        self.send_limits = limits or SendLimits()
        self.deadline = deadline
        self.inputs: list[tuple[str, object]] = []
        self.released = 0
        self.stopped = asyncio.Event()  # set once "stop" went in: no frame after it is read
        self._reading = True

    @property
    def reading(self) -> bool:
        return self._reading and super().reading

    def receive_text(self, frame: str, now: float) -> None:
        self.inputs.append(("text", frame))
        if frame == "close":
            self._queue("bye")
            self._close_with(1000, "done")
        elif frame == "stop":
            self._reading = False
            self.stopped.set()
        elif frame == "bug":
            raise RuntimeError("an adapter's bug")
        elif frame.startswith("many"):
            for i in range(int(frame[4:])):
                self._queue(f"m{i}")
        elif frame.startswith("big"):
            for _ in range(int(frame[3:])):
                self._queue("x" * 10000)
        else:
            self._queue(frame)

    def receive_bytes(self, frame: bytes, now: float) -> None:
        self.inputs.append(("bytes", len(frame)))

    def receive_timer(self, now: float) -> None:
        self.inputs.append(("timer", now))
        assert self.deadline is not None and now >= self.deadline
        self.deadline = None
        self._queue("idle")
        self._close_with(4408, "idle_timeout")

    def next_deadline(self) -> float | None:
        return self.deadline

    def receive_shutdown(self, now: float) -> None:
        self.inputs.append(("shutdown", now))
        self._queue("going")
        self._close_with(1001, "shutting_down")

    def receive_connection_lost(self, now: float, dropped: bool = True) -> None:
        self.inputs.append(("lost", dropped))
        self._close_with(LOST.code, LOST.reason)

    def receive_send_timeout(self, now: float) -> None:
        self.inputs.append(("send_timeout", now))
        self._close_with(4408, "slow_reader")

    def release(self) -> None:
        self.released += 1


@dataclass
class Harness:
    """A WebSocket server whose every connection is run with the next adapter of ``adapters``."""

    adapters: list[Scripted] = field(default_factory=list)
    connections: list[Connection] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    port: int = 0

    async def handle(self, ws: ServerConnection) -> None:
        connection = Connection(ws, self.adapters[len(self.connections)])
        self.connections.append(connection)
        try:
            await connection.run()
        except Exception as error:
            self.errors.append(error)
            raise

    def client(self, **kwargs: object) -> Awaitable[ClientConnection]:
        return ws_connect(f"ws://127.0.0.1:{self.port}", **kwargs)  # type: ignore[arg-type]


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    harness = Harness()
    async with serve(harness.handle, "127.0.0.1", 0, compression=None) as server:
        harness.port = server.sockets[0].getsockname()[1]
        yield harness


async def read_all(ws: ClientConnection) -> list[str]:
    frames: list[str] = []
    with pytest.raises(ConnectionClosed):
        async with asyncio.timeout(30):  # a hang guard
            while True:
                frame = await ws.recv()
                assert isinstance(frame, str)
                frames.append(frame)
    return frames


async def test_frames_go_in_with_the_clock_and_messages_come_out_then_the_adapter_s_close(harness: Harness) -> None:
    adapter = Scripted()
    harness.adapters.append(adapter)
    async with await harness.client() as ws:
        await ws.send("hello")
        await ws.send(b"\0" * 10)
        await ws.send("close")
        assert await read_all(ws) == ["hello", "bye"]
    assert (ws.close_code, ws.close_reason) == (1000, "done")
    assert adapter.inputs == [("text", "hello"), ("bytes", 10), ("text", "close")]
    await until(lambda: adapter.released == 1)


async def test_the_adapter_s_timer_fires_at_its_deadline(harness: Harness) -> None:
    loop = asyncio.get_running_loop()
    adapter = Scripted(deadline=loop.time() + 0.2)  # the runner's clock is time.monotonic, as the loop's
    harness.adapters.append(adapter)
    async with await harness.client() as ws:
        assert await read_all(ws) == ["idle"]
    assert ws.close_code == 4408
    [(kind, when)] = adapter.inputs
    assert kind == "timer" and isinstance(when, float)


async def test_an_adapter_that_stops_reading_leaves_frames_unread(harness: Harness) -> None:
    adapter = Scripted()
    harness.adapters.append(adapter)
    async with await harness.client() as ws:
        await ws.send("stop")
        await ws.send("unread")
        async with asyncio.timeout(30):  # a hang guard
            # the pong comes back after the server took in every frame sent before the ping: "unread" is there to read
            await (await ws.ping())
            await adapter.stopped.wait()
        harness.connections[0].shutdown()
        assert await read_all(ws) == ["going"]
    assert [kind for kind, _ in adapter.inputs] == ["text", "shutdown"]
    assert ws.close_code == 1001


async def test_shutdown_is_an_input_like_a_frame(harness: Harness) -> None:
    adapter = Scripted()
    harness.adapters.append(adapter)
    async with await harness.client() as ws:
        await ws.send("x")
        assert await ws.recv() == "x"
        harness.connections[0].shutdown()
        assert await read_all(ws) == ["going"]
    assert (ws.close_code, ws.close_reason) == (1001, "shutting_down")


@pytest.mark.parametrize(
    ("clean", "dropped", "logged"),
    [
        (True, False, "dropped=False close_sent=1000: close_received=1000:"),
        (False, True, "dropped=True close_sent=- close_received=-"),
    ],
)
async def test_a_lost_connection_says_whether_the_client_closed_it_or_it_dropped(
    harness: Harness, clean: bool, dropped: bool, logged: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="streamer.server.runner")
    adapter = Scripted()
    harness.adapters.append(adapter)
    ws = await harness.client()
    await ws.send("x")
    await ws.recv()
    if clean:
        await ws.close()
    else:
        ws.transport.abort()  # no close frame: as a network fault looks to the server
    await until(lambda: adapter.released == 1)
    assert adapter.inputs[-1] == ("lost", dropped)
    # the operator sees the loss and why, whatever the endpoint
    (line,) = [r.getMessage() for r in caplog.records if "event=connection_lost" in r.getMessage()]
    assert line.endswith(f"adapter=Scripted {logged}"), line


async def test_a_reader_that_stops_reading_is_cut_after_the_send_timeout(harness: Harness) -> None:
    adapter = Scripted(SendLimits(send_timeout=0.3, socket_send_buffer=4096))
    harness.adapters.append(adapter)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", harness.port))
    ws = await harness.client(sock=sock, max_queue=1)
    await ws.send("big200")  # 2 MB: far more than the buffers hold
    await until(lambda: adapter.close_action() is not None)
    ws.transport.abort()  # a reader that never reads again
    assert [kind for kind, _ in adapter.inputs] == ["text", "send_timeout"]
    await until(lambda: adapter.released == 1)


async def test_messages_are_taken_one_at_a_time_so_the_rest_stay_with_the_adapter(harness: Harness) -> None:
    adapter = Scripted()
    harness.adapters.append(adapter)
    taken: list[int | None] = []
    take = adapter.messages_to_send

    def spy(now: float, limit: int | None = None) -> list[str]:
        taken.append(limit)
        return take(now, limit)

    adapter.messages_to_send = spy  # type: ignore[method-assign]
    async with await harness.client() as ws:
        await ws.send("many3")
        await ws.send("close")
        assert await read_all(ws) == ["m0", "m1", "m2", "bye"]
    assert set(taken) == {1}


async def test_an_adapter_s_bug_ends_the_connection_and_still_releases_it(harness: Harness) -> None:
    adapter = Scripted()
    harness.adapters.append(adapter)
    async with await harness.client() as ws:
        await ws.send("bug")
        with pytest.raises(ConnectionClosed):
            await ws.recv()
    assert ws.close_code == 1011  # websockets' answer to a handler that raised
    assert [str(e) for e in harness.errors] == ["an adapter's bug"]
    assert adapter.released == 1
