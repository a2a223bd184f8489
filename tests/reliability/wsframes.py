"""A minimal WebSocket client over a raw TCP socket, able to send what no library will: frames that break
RFC 6455 on purpose, and handshakes that are wrong or never finish.

Only what the reliability tests need: :func:`frame` builds one frame (any opcode, RSV bits, mask or none, any
declared length), :func:`handshake` one upgrade request, :class:`RawConnection` sends bytes and reads the server's
answer (an HTTP status, or frames up to a close).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import struct
from dataclasses import dataclass

__all__ = ["CloseFrame", "RawConnection", "frame", "handshake"]

# RFC 6455 section 5.2 opcodes
CONT, TEXT, BINARY, CLOSE, PING, PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA


def frame(
    opcode: int,
    payload: bytes = b"",
    *,
    fin: bool = True,
    rsv: int = 0,
    masked: bool = True,
    declared_length: int | None = None,
) -> bytes:
    """One frame. ``rsv`` is the three RSV bits as a number 0-7 (4 = RSV1); ``declared_length`` lies about the
    payload length in the header (the payload sent is still ``payload``)."""
    length = len(payload) if declared_length is None else declared_length
    head = bytes([(0x80 if fin else 0) | (rsv & 7) << 4 | (opcode & 0xF)])
    mask_bit = 0x80 if masked else 0
    if length < 126:
        head += bytes([mask_bit | length])
    elif length < 1 << 16:
        head += bytes([mask_bit | 126]) + struct.pack("!H", length)
    else:
        head += bytes([mask_bit | 127]) + struct.pack("!Q", length)
    if not masked:
        return head + payload
    key = os.urandom(4)
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


def close_payload(code: int, reason: bytes = b"") -> bytes:
    return struct.pack("!H", code) + reason


def handshake(
    path: str = "/v1/listen",
    *,
    method: str = "GET",
    version: str | None = "13",
    key: str | None = None,
    upgrade: str | None = "websocket",
    connection: str | None = "Upgrade",
    http: str = "HTTP/1.1",
    extra: str = "",
) -> bytes:
    """An opening handshake request; a None header is left out."""
    key = base64.b64encode(os.urandom(16)).decode() if key is None else key
    lines = [f"{method} {path} {http}", "Host: 127.0.0.1"]
    if upgrade is not None:
        lines.append(f"Upgrade: {upgrade}")
    if connection is not None:
        lines.append(f"Connection: {connection}")
    if key:
        lines.append(f"Sec-WebSocket-Key: {key}")
    if version is not None:
        lines.append(f"Sec-WebSocket-Version: {version}")
    return ("\r\n".join(lines) + "\r\n" + extra + "\r\n").encode()


@dataclass(frozen=True)
class CloseFrame:
    code: int | None  # None: the connection ended without a close frame
    reason: bytes


class RawConnection:
    """A TCP connection to the server. Use as ``async with RawConnection(port) as raw``."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader
        self.writer: asyncio.StreamWriter
        self._rest = b""  # bytes read past the end of the handshake answer: the first frames

    async def __aenter__(self) -> RawConnection:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.writer.close()
        with contextlib.suppress(OSError):  # the server may have reset the connection
            await self.writer.wait_closed()

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def http_status(self) -> int | None:
        """The status code of the server's answer to the handshake; None if it closed without one."""
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = await self.reader.read(4096)
            if not chunk:
                break
            head += chunk
        if not head.startswith(b"HTTP/1.1 "):
            return None
        self._rest = head.partition(b"\r\n\r\n")[2]
        return int(head.split(b" ", 2)[1])

    async def upgrade(self, path: str = "/v1/listen") -> None:
        """Complete a good handshake; raise AssertionError if the server does not switch protocols."""
        await self.send(handshake(path))
        status = await self.http_status()
        assert status == 101, f"handshake answered {status}"

    async def _read_exactly(self, n: int) -> bytes:
        if self._rest:
            taken, self._rest = self._rest[:n], self._rest[n:]
            if len(taken) == n:
                return taken
            return taken + await self.reader.readexactly(n - len(taken))
        return await self.reader.readexactly(n)

    async def read_close(self) -> CloseFrame:
        """Read the server's frames (unmasked) until its close frame; skip data and control frames before it."""
        try:
            while True:
                b0, b1 = await self._read_exactly(2)
                length = b1 & 0x7F
                if length == 126:
                    (length,) = struct.unpack("!H", await self._read_exactly(2))
                elif length == 127:
                    (length,) = struct.unpack("!Q", await self._read_exactly(8))
                payload = await self._read_exactly(length)
                if b0 & 0xF == CLOSE:
                    code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else None
                    return CloseFrame(code, payload[2:])
        except (asyncio.IncompleteReadError, ConnectionError):
            return CloseFrame(None, b"")

    async def at_eof(self) -> bool:
        """Whether the server closed the TCP connection (reads whatever is left first)."""
        with contextlib.suppress(ConnectionError):
            while await self.reader.read(4096):
                pass
        return True
