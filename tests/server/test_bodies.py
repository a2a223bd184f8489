from __future__ import annotations

from websockets.http11 import Request
from websockets.server import ServerProtocol

from streamer.server.bodies import BodyReader, RequestBody


def receive(data: bytes, limit: int = 64, chunk: int = 0) -> tuple[Request | None, BodyReader]:
    """What websockets' sans-I/O server makes of ``data`` read through a :class:`BodyReader` (``/body`` takes
    ``limit`` bytes), fed at once or ``chunk`` bytes at a time."""
    protocol = ServerProtocol()
    reader = BodyReader(lambda path: limit if path == "/body" else 0)
    protocol.reader = reader
    protocol.parser = protocol.parse()
    next(protocol.parser)
    for i in range(0, len(data), chunk or len(data) or 1):
        protocol.receive_data(data[i : i + (chunk or len(data))])
    requests = [e for e in protocol.events_received() if isinstance(e, Request)]
    return (requests[0] if requests else None), reader


def post(path: str, body: bytes) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


def test_a_body_within_the_routes_limit_is_read_whatever_the_pieces_it_comes_in() -> None:
    body = b'{"expires_after": {"seconds": 60}}'
    for chunk in (0, 1, 7):
        request, reader = receive(post("/body", body), chunk=chunk)
        assert request is not None and request.method == "POST" and request.path == "/body"
        assert reader.body.data == body and not reader.body.too_large
        assert "Content-Length" not in request.headers and request.headers["Content-Type"] == "application/json"
        assert not reader.buffer  # nothing left for websockets to take for frames


def test_other_routes_refuse_bodies_as_websockets_does() -> None:
    request, reader = receive(post("/v1/token", b"{}"))
    assert request is None and reader.body.data == b""
    request, _ = receive(b"GET /v1/listen HTTP/1.1\r\nHost: x\r\n\r\n")
    assert request is not None and request.method == "GET"


def test_a_body_over_the_limit_is_dropped_as_it_comes_and_flagged() -> None:
    request, reader = receive(post("/body", b"x" * 1000), chunk=100)
    assert request is not None and reader.body.too_large and reader.body.data == b""
    assert not reader.buffer  # memory stays bounded whatever the client sends
    reader.feed_data(b"y" * 10_000)
    assert not reader.buffer


def test_no_body_is_an_empty_body() -> None:
    request, reader = receive(b"POST /body HTTP/1.1\r\nHost: x\r\n\r\n")
    assert request is not None and reader.body.data == b"" and not reader.body.too_large
    assert RequestBody().data == b""
