"""The connection runner: the one asyncio loop between a WebSocket and an endpoint's sans-I/O adapter.

The server applies a route's policy (:mod:`streamer.server.routes`), builds the route's
:class:`~streamer.server.adapter.Adapter` and hands both to a :class:`Connection`, whatever the endpoint. The connection
is the only code that awaits the socket and reads the clock for an adapter:

- frames are read while the adapter is :attr:`~streamer.server.adapter.Adapter.reading`, and each is fed with
  ``now = time.monotonic()``;
- the adapter's timer fires at its :meth:`~streamer.server.adapter.Adapter.next_deadline` (idle timeouts, session
  length, the bound on flushing the last transcripts);
- its messages go out one at a time, as fast as the client reads them: what the client has not taken stays in the
  adapter, which may drop stale ones; a frame that cannot go out within ``send_timeout`` is a slow reader, whose
  last words (the adapter's error) are written behind the buffers for it to find if it reads again;
- a server shutdown and a lost connection are inputs like frames;
- once the adapter has a close action, reading stops, what is queued goes out (within ``flush_timeout``), the close
  is sent, and the adapter is released.

Engine and hub outcomes reach an adapter outside the runner (the scheduler's and the hub's callbacks); the adapter
then calls its ``wakeup``, which is this connection's, and the runner looks at its outputs again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed
from websockets.frames import Close

from streamer.server.adapter import Adapter

__all__ = ["Connection"]

logger = logging.getLogger(__name__)

# close codes the server sends for a protocol violation (RFC 6455 section 7.4.1: protocol error, invalid data, too
# big): a connection closed with one was not dropped by the network, its client is broken
_VIOLATIONS = (1002, 1007, 1009)


class Connection:
    """Serve one WebSocket with one adapter: :meth:`run` is the whole story, :meth:`shutdown` cuts it short."""

    def __init__(self, ws: ServerConnection, adapter: Adapter) -> None:
        self.ws = ws
        self.adapter = adapter
        # something the main loop must look at: an input went in, or the adapter woke it
        self._changed = asyncio.Event()
        # the adapter may have messages to send
        self._sendable = asyncio.Event()
        self._lost = False
        # the sender found the connection closed; the reader still hands over the frames that arrived before
        self._send_closed = False
        adapter.wakeup = self._wake

    def shutdown(self) -> None:
        """The server is stopping: the adapter decides how its connection ends (most flush, then close 1001)."""
        self.adapter.receive_shutdown(time.monotonic())
        self._wake()

    async def run(self) -> None:
        """Serve until the adapter's close action is performed or the connection is lost; then release the
        adapter. Raises only what an adapter raised by mistake (and cancellation)."""
        adapter = self.adapter
        limits = adapter.send_limits
        _bound_socket_send_buffer(self.ws, limits.socket_send_buffer)
        reader = asyncio.create_task(self._read(), name="connection-read")
        sender = asyncio.create_task(self._send(), name="connection-send")
        self._sendable.set()  # what the adapter said on opening (ready, session.created)
        try:
            # 1. Until the adapter says how the connection ends: frames go in as they come (the reader), messages
            #    out as fast as the client takes them (the sender), and the adapter's timer fires here.
            while (close := adapter.close_action()) is None:
                self._changed.clear()
                if not adapter.reading:
                    reader.cancel()  # safe: websockets keeps a message that arrives for the next recv()
                deadline = adapter.next_deadline()
                await self._wait(deadline)
                _raise_failure(reader, sender)
                if self._send_closed and reader.done():
                    self._connection_lost()
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    adapter.receive_timer(now)
                    self._sendable.set()
            # 2. No more frames.
            reader.cancel()
            # 3. The sender sends what is queued, then the close right behind it; bounded, since a reader that stalls
            #    must not hold the close (after a send timed out, the adapter's last words and the close are written
            #    behind what is in the buffers: they go out once the client reads).
            if not self._lost and not self._send_closed:
                done, _ = await asyncio.wait({sender}, timeout=limits.flush_timeout)
                if not done:
                    logger.warning("event=send_timeout close=%d", close.code)
                with contextlib.suppress(ConnectionClosed):
                    await self.ws.close(close.code, close.reason)  # idempotent once the sender closed
        finally:
            # 4. Let go of everything, whatever happened above.
            adapter.release()
            for task in (reader, sender):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.gather(reader, sender, return_exceptions=True)

    # -- the parts --------------------------------------------------------------------------------------------------

    def _wake(self) -> None:
        self._changed.set()
        self._sendable.set()

    async def _wait(self, deadline: float | None) -> None:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._changed.wait()

    async def _read(self) -> None:
        """Feed every frame to the adapter while it reads."""
        try:
            while self.adapter.reading and not self._lost:
                try:
                    frame = await self.ws.recv()
                except ConnectionClosed:
                    self._connection_lost()
                    return
                now = time.monotonic()
                if isinstance(frame, str):
                    self.adapter.receive_text(frame, now)
                else:
                    self.adapter.receive_bytes(frame, now)
                self._wake()
                # recv() returns at once while frames are buffered: one turn of the loop per frame, so that a client
                # sending ahead of real time cannot keep the scheduler (and every other connection) waiting
                await asyncio.sleep(0)
        finally:
            self._changed.set()

    async def _send(self) -> None:
        """Send the adapter's messages one at a time, each as of the moment it goes out; once the adapter has a
        close action and nothing is left to send, the close."""
        timeout = self.adapter.send_limits.send_timeout
        try:
            while not self._lost:
                await self._sendable.wait()
                self._sendable.clear()
                while not self._lost and (frames := self.adapter.messages_to_send(time.monotonic(), 1)):
                    # the frame is written at once; only the wait for the connection's buffers to drain can time out
                    async with asyncio.timeout(timeout):
                        await self.ws.send(frames[0])
                close = self.adapter.close_action()
                if close is not None and not self._lost:
                    # right behind the last message, in the same turn of the loop: a client that reads the last
                    # message (done, call_ended) finds the close with it
                    await self.ws.close(close.code, close.reason)
                    return
        except ConnectionClosed:
            # the reader tells the adapter, once it has fed the frames that arrived before the close (or the main
            # loop does, if the adapter reads no more)
            self._send_closed = True
        except TimeoutError:
            self.adapter.receive_send_timeout(time.monotonic())  # the adapter says why (slow_reader), and logs it
            await self._write_behind(self.adapter.messages_to_send(time.monotonic()))
        finally:
            self._changed.set()

    async def _write_behind(self, frames: list[str]) -> None:
        """Write the adapter's last words (why it ends) behind what the connection's buffers hold, without waiting
        for them to drain: a client that stopped reading gets them, and the close after them, if it ever reads
        again; one that never does costs the server only these few frames until the close gives up on it."""
        for frame in frames:
            # websockets writes the frame before its first await (the wait for the buffers to drain), so a
            # deadline that has already passed cancels the wait and not the write
            with contextlib.suppress(TimeoutError, ConnectionClosed):
                async with asyncio.timeout(0):
                    await self.ws.send(frame)

    def _connection_lost(self) -> None:
        if self._lost:
            return
        self._lost = True
        dropped = _dropped(self.ws)
        # one line for every endpoint, with why (a keepalive ping unanswered is close_sent=1011 here)
        logger.info(
            "event=connection_lost adapter=%s dropped=%s close_sent=%s close_received=%s",
            type(self.adapter).__name__,
            dropped,
            _close_text(self.ws.protocol.close_sent),
            _close_text(self.ws.protocol.close_rcvd),
        )
        self.adapter.receive_connection_lost(time.monotonic(), dropped=dropped)
        self._wake()


def _raise_failure(*tasks: asyncio.Task[None]) -> None:
    """Raise what a reader or sender raised: an adapter's bug, which must not leave the connection hanging."""
    for task in tasks:
        if task.done() and not task.cancelled() and (error := task.exception()) is not None:
            raise error


def _dropped(ws: ServerConnection) -> bool:
    """Whether the connection broke (a network fault the client may recover from), rather than being closed: by
    the client (it is done), or by the server for a protocol violation (that client is broken, not its network)."""
    protocol = ws.protocol
    if protocol.close_rcvd is not None:
        return False
    return protocol.close_sent is None or protocol.close_sent.code not in _VIOLATIONS


def _close_text(frame: Close | None) -> str:
    return "-" if frame is None else f"{frame.code}:{frame.reason}"


def _bound_socket_send_buffer(ws: ServerConnection, size: int) -> None:
    sock = ws.transport.get_extra_info("socket")
    if size > 0 and sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)
