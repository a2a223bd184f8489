"""Request bodies for the HTTP routes whose row takes one (websockets' HTTP layer reads none).

websockets parses every request as a WebSocket handshake, and a handshake has no body: a request with a
``Content-Length`` other than 0 is dropped before ``process_request`` sees it. A few HTTP routes are called with a
JSON body by clients we do not control (``POST /v1/realtime/client_secrets``: the ``openai`` SDK always sends one).
For those, :class:`BodyReader` reads the body between the request's head and the handshake logic, up to the route's
``max_body_bytes`` (:class:`~streamer.server.routes.Policy`), and hides ``Content-Length`` from websockets; a longer
body is dropped as it arrives (memory bounded whatever its length) and the request flagged, so that the route
answers 413 and the connection closes after it.

Every other route sees requests exactly as before: the reader changes nothing unless the request line names a route
with a body limit.

Use: ``serve(..., create_connection=body_connection(limit_of))``, then :func:`request_body` in ``process_request``.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any
from urllib.parse import urlsplit

from websockets.asyncio.server import ServerConnection
from websockets.streams import StreamReader

__all__ = ["BodyReader", "RequestBody", "body_connection", "request_body"]


class RequestBody:
    """What :class:`BodyReader` found after the head: the body, or that it was over the limit."""

    def __init__(self) -> None:
        self.data = b""
        self.too_large = False


class BodyReader(StreamReader):
    """A websockets stream reader that, for a request whose path has a body limit (``limit_of(path) > 0``), reads
    the body right after the head into :attr:`body` and drops ``Content-Length`` from the head websockets parses."""

    def __init__(self, limit_of: Callable[[str], int]) -> None:
        super().__init__()
        self.body = RequestBody()
        self._limit_of = limit_of
        self._lines = 0  # lines of the head read so far: the first is the request line
        self._limit = 0  # the route's body limit, once the request line is read
        self._length: int | None = None  # the Content-Length taken out of the head
        self._head_done = False

    def read_line(self, m: int, too_long_exc_type: type[Exception] = RuntimeError) -> Generator[None, None, bytearray]:
        line = yield from super().read_line(m, too_long_exc_type)
        if self._head_done:
            return line
        self._lines += 1
        if self._lines == 1:
            parts = line.split(b" ")
            path = parts[1].decode("ascii", "replace") if len(parts) == 3 else ""
            self._limit = self._limit_of(urlsplit(path).path)
            return line
        if not line.rstrip(b"\r\n"):  # the empty line that ends the head
            self._head_done = True
            if self._length:
                if self._length <= self._limit:
                    self.body.data = bytes((yield from self.read_exact(self._length)))
                else:
                    # never read: dropped as it comes, so that websockets does not take it for frames, until the
                    # answer (413) goes out and the connection closes
                    self.body.too_large = True
                    self.buffer.clear()
            return line
        name, _, value = line.partition(b":")
        if self._limit and name.strip().lower() == b"content-length" and self._length is None:
            text = value.strip()
            if text.isdigit() and len(text) <= 12:
                self._length = int(text)
                # websockets refuses a request with a body: it never sees this header, it gets the next line
                return (yield from self.read_line(m, too_long_exc_type))
        return line

    def feed_data(self, data: bytes | bytearray) -> None:
        if not self.body.too_large:
            super().feed_data(data)


def body_connection(
    limit_of: Callable[[str], int],
    on_open: Callable[[ServerConnection], None] | None = None,
    on_close: Callable[[ServerConnection], None] | None = None,
) -> type[ServerConnection]:
    """A ``ServerConnection`` class for websockets' ``serve(create_connection=...)`` whose requests are read by a
    :class:`BodyReader` with ``limit_of`` (a path's body limit in bytes, 0 for none). ``on_open`` is called as each
    connection is made (inside the event loop's accept, before any byte is read) and ``on_close`` once its transport
    is gone: the server counts its connections with them."""

    class BodyServerConnection(ServerConnection):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            # no byte has arrived yet: the parser waiting on the first line restarts on the new reader
            self.protocol.reader = BodyReader(limit_of)
            self.protocol.parser = self.protocol.parse()
            next(self.protocol.parser)
            if on_open is not None:
                on_open(self)

        def connection_lost(self, exc: Exception | None) -> None:
            super().connection_lost(exc)
            if on_close is not None:
                on_close(self)

    return BodyServerConnection


def request_body(connection: ServerConnection) -> RequestBody:
    """The body of the request ``connection`` received (empty for a route without a body limit)."""
    reader = connection.protocol.reader
    return reader.body if isinstance(reader, BodyReader) else RequestBody()
