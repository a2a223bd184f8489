"""RFC 6455 violations sent as raw bytes, each beside a healthy stream that must not notice.

Every case gets the close code RFC 6455 asks for (1002 protocol error, 1007 invalid payload, 1009 too big) or the
handshake's HTTP error, at once rather than by a timeout (which would close with another code: 4408 idle_timeout,
or no answer); the server stays up, and the healthy stream's finals all arrive with every sample accounted for.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace

import pytest

from streamer.app import App
from streamer.engine.fake import ScriptedEngine
from streamer.server.serve import ServerConfig
from streamer.server.session_options import SessionOptions
from tests.reliability.helpers import LONG_WORDS, looped_speech, stream
from tests.reliability.tally import TALLY
from tests.reliability.wsframes import (
    BINARY,
    CLOSE,
    CONT,
    PING,
    PONG,
    TEXT,
    RawConnection,
    close_payload,
    frame,
    handshake,
)

pytestmark = pytest.mark.reliability

MAX_FRAME = 1 << 16
MAX_MESSAGE = 4 * MAX_FRAME  # ServerConfig.max_message_bytes
KEEPALIVE = b'{"type":"keepalive"}'
# hang guard: an answer this late means none came (past SessionOptions.idle_timeout, so a violation the server
# missed shows as 4408 idle_timeout, not as a timeout here)
HANG_SECONDS = 30.0


@dataclass(frozen=True)
class Violation:
    """Bytes sent after a good handshake, and the close code they must earn."""

    name: str
    data: bytes
    close_code: int


@dataclass(frozen=True)
class BadHandshake:
    """A handshake request, and the HTTP status it must earn (None: the server closes without an answer)."""

    name: str
    data: bytes
    status: int | None


VIOLATIONS = [
    Violation("unmasked text frame", frame(TEXT, KEEPALIVE, masked=False), 1002),
    Violation("unmasked binary frame", frame(BINARY, b"\0\0", masked=False), 1002),
    Violation("RSV1 (compression bit without the extension)", frame(TEXT, KEEPALIVE, rsv=4), 1002),
    Violation("RSV2", frame(BINARY, b"\0\0", rsv=2), 1002),
    Violation("RSV3", frame(BINARY, b"\0\0", rsv=1), 1002),
    Violation("RSV1 on a ping", frame(PING, b"x", rsv=4), 1002),
    *(Violation(f"reserved opcode {op:#x}", frame(op, b"x"), 1002) for op in (3, 4, 5, 6, 7, 0xB, 0xC, 0xD, 0xE, 0xF)),
    Violation("fragmented ping", frame(PING, b"x", fin=False), 1002),
    Violation("fragmented close", frame(CLOSE, close_payload(1000), fin=False), 1002),
    Violation("ping over 125 bytes", frame(PING, b"x" * 126), 1002),
    Violation("pong over 125 bytes", frame(PONG, b"x" * 200), 1002),
    Violation("close over 125 bytes", frame(CLOSE, close_payload(1000, b"r" * 124)), 1002),
    Violation("close with a one-byte payload", frame(CLOSE, b"\x03"), 1002),
    *(
        Violation(f"close code {code}", frame(CLOSE, close_payload(code)), 1002)
        for code in (0, 999, 1004, 1005, 1006, 1015, 1016, 2999, 5000)
    ),
    Violation("invalid UTF-8 in a text frame", frame(TEXT, b'{"type":"\xff"}'), 1007),
    Violation("overlong UTF-8 encoding", frame(TEXT, b"\xc0\xaf"), 1007),
    Violation("UTF-16 surrogate in UTF-8", frame(TEXT, b"\xed\xa0\x80"), 1007),
    Violation("invalid UTF-8 split across fragments", frame(TEXT, b"\xe2\x82", fin=False) + frame(CONT, b"("), 1007),
    Violation("truncated UTF-8 at the end of a message", frame(TEXT, b"ok\xe2\x82"), 1007),
    Violation("invalid UTF-8 in a close reason", frame(CLOSE, close_payload(1000, b"\xff\xfe")), 1007),
    Violation("continuation without a start", frame(CONT, b"abc"), 1002),
    Violation("text inside a fragmented text", frame(TEXT, b'{"ty', fin=False) + frame(TEXT, b"x"), 1002),
    Violation("binary inside a fragmented binary", frame(BINARY, b"\0", fin=False) + frame(BINARY, b"\0"), 1002),
    Violation("text inside a fragmented binary", frame(BINARY, b"\0", fin=False) + frame(TEXT, KEEPALIVE), 1002),
    Violation("frame over max_size", frame(BINARY, b"", declared_length=MAX_MESSAGE + 1), 1009),
    Violation("64-bit length with its top bit set", frame(BINARY, b"", declared_length=1 << 63), 1009),
    Violation(
        "fragments adding up past max_size",
        frame(BINARY, b"\0" * 60000, fin=False)
        + b"".join(frame(CONT, b"\0" * 60000, fin=False) for _ in range(3))
        + frame(CONT, b"\0" * 60000),
        1009,
    ),
]

HANDSHAKES = [
    BadHandshake("Sec-WebSocket-Key not 16 bytes of base64", handshake(key="abc"), 400),
    BadHandshake("Sec-WebSocket-Key not base64", handshake(key="!!!!!!!!!!!!!!!!!!!!!!=="), 400),
    BadHandshake("no Sec-WebSocket-Key", handshake(key=""), 400),
    BadHandshake("Sec-WebSocket-Version 8", handshake(version="8"), 400),
    BadHandshake("no Sec-WebSocket-Version", handshake(version=None), 400),
    BadHandshake("POST", handshake(method="POST"), 405),
    BadHandshake("no Upgrade header", handshake(upgrade=None), 426),
    BadHandshake("Connection: keep-alive", handshake(connection="keep-alive"), 426),
    BadHandshake("HTTP/1.0", handshake(http="HTTP/1.0"), 505),
    BadHandshake("a header line over 8 KiB", handshake(extra="X-A: " + "a" * 9000 + "\r\n"), 431),
    BadHandshake("200 headers", handshake(extra="".join(f"X-{i}: a\r\n" for i in range(200))), 431),
    BadHandshake("not HTTP at all", b"HELLO\r\n\r\n", None),
    BadHandshake("unknown path", handshake(path="/v2/listen"), 404),
]


async def check_violation(port: int, case: Violation) -> str | None:
    async with RawConnection(port) as raw:
        await raw.upgrade()
        await raw.send(case.data)
        try:
            close = await asyncio.wait_for(raw.read_close(), timeout=HANG_SECONDS)
        except TimeoutError:
            return f"{case.name}: no close at all"
        if close.code != case.close_code:
            return f"{case.name}: close {close.code} ({close.reason!r}), expected {case.close_code}"
    return None


async def check_handshake(port: int, case: BadHandshake) -> str | None:
    async with RawConnection(port) as raw:
        await raw.send(case.data)
        try:
            status = await asyncio.wait_for(raw.http_status(), timeout=HANG_SECONDS)
        except TimeoutError:
            return f"{case.name}: no answer at all"
        if status != case.status:
            return f"{case.name}: HTTP {status}, expected {case.status}"
    return None


async def half_open_handshake(port: int, timeout: float) -> str | None:
    """Send half an upgrade request and stall: the server must hang up, and not before its handshake timeout."""
    started = time.monotonic()  # before the connection: the server's timer cannot have started earlier
    async with RawConnection(port) as raw:
        await raw.send(handshake()[:40])
        try:
            status = await asyncio.wait_for(raw.http_status(), timeout=timeout + HANG_SECONDS)
        except TimeoutError:
            return "half-open handshake: never closed"
        if status is not None:
            return f"half-open handshake: answered HTTP {status}"
        return None if time.monotonic() - started >= timeout else "half-open handshake: closed before its timeout"


async def test_protocol_violations_get_their_close_codes_beside_a_healthy_stream() -> None:
    config = ServerConfig(port=0, handshake_timeout=1.0, session=replace(SessionOptions(), max_frame_bytes=MAX_FRAME))
    async with App(config, ScriptedEngine(LONG_WORDS)) as srv:
        healthy = asyncio.create_task(stream(srv.port, looped_speech(24.0), speed=4.0))
        stalled = asyncio.create_task(half_open_handshake(srv.port, config.handshake_timeout))
        problems = [await check_violation(srv.port, case) for case in VIOLATIONS]
        problems += [await check_handshake(srv.port, case) for case in HANDSHAKES]
        problems.append(await stalled)
        outcome = await healthy
        # the server is still up and serving: a fresh stream works after it all
        after = await stream(srv.port, looped_speech(3.0), speed=0)
    tried = len(VIOLATIONS) + len(HANDSHAKES) + 1
    TALLY["protocol violations tried"] += tried
    assert tried >= 40
    assert [p for p in problems if p] == []
    assert outcome.close_code == 1000 and outcome.seqs_in_order() and len(outcome.finals) >= 4
    assert outcome.unaccounted_samples() == 0
    assert not [m for m in outcome.messages if m["type"] == "error"]
    assert after.close_code == 1000 and after.unaccounted_samples() == 0
    TALLY["samples unaccounted"] += outcome.unaccounted_samples() + after.unaccounted_samples()
