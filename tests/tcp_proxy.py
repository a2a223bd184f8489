"""A TCP proxy the test controls, to break a client's connections the way a network does.

:meth:`TcpProxy.cut` resets every connection through it at once (both sides see the socket die, no WebSocket close
frame), like a dead load balancer or a phone leaving Wi-Fi. While :meth:`TcpProxy.hold` is on, new connections are
accepted but not forwarded until :meth:`TcpProxy.release`, so a test can let the server notice the drop before the
client comes back (no sleep: the test waits for what it needs, then releases).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

__all__ = ["TcpProxy", "tcp_proxy"]


class TcpProxy:
    """Forwards ``127.0.0.1:port`` to ``target_port``. Start with :func:`tcp_proxy`."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.connections = 0  # accepted in all
        self.cuts = 0
        self._open: set[asyncio.StreamWriter] = set()
        self._released = asyncio.Event()
        self._released.set()
        self._tasks: set[asyncio.Task[None]] = set()

    def cut(self) -> None:
        """Reset every connection now: the client and the server each see theirs die without a close frame."""
        self.cuts += 1
        for writer in list(self._open):
            writer.transport.abort()
        self._open.clear()

    def hold(self) -> None:
        """Accept new connections but forward nothing until :meth:`release`."""
        self._released.clear()

    def release(self) -> None:
        self._released.set()

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._open.add(client_writer)
        await self._released.wait()
        try:
            server_reader, server_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            client_writer.transport.abort()
            return
        self._open.add(server_writer)
        pumps = [
            asyncio.create_task(self._pump(client_reader, server_writer)),
            asyncio.create_task(self._pump(server_reader, client_writer)),
        ]
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for writer in (client_writer, server_writer):
            self._open.discard(writer)
            writer.transport.abort()
        for pump in pumps:
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await pump

    @staticmethod
    async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()


@contextlib.asynccontextmanager
async def tcp_proxy(target_port: int) -> AsyncIterator[TcpProxy]:
    """A running :class:`TcpProxy` to ``target_port`` on a free loopback port, closed on the way out."""
    proxy = TcpProxy(target_port)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        proxy._tasks.add(task)
        try:
            await proxy._serve(reader, writer)
        finally:
            proxy._tasks.discard(task)

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    proxy.port = server.sockets[0].getsockname()[1]
    try:
        yield proxy
    finally:
        server.close()
        proxy.release()
        proxy.cut()
        for task in list(proxy._tasks):
            task.cancel()
        await asyncio.gather(*proxy._tasks, return_exceptions=True)
        await server.wait_closed()
