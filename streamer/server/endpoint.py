"""What a route row carries besides its path and policy: the endpoint itself (uvicorn's name tables, where the row
names the implementation and nothing branches on the name).

The runner (:class:`streamer.server.serve.Server`) applies the row's policy (:mod:`streamer.server.routes`), then asks
the row's endpoint for what only it knows:

- an :class:`HttpEndpoint` answers the request (:meth:`HttpEndpoint.respond`);
- a :class:`WebSocketEndpoint` may refuse the handshake in its protocol's HTTP shape
  (:meth:`~WebSocketEndpoint.handshake_refusal`, and :meth:`~WebSocketEndpoint.signature_refusal` on a route whose
  policy takes a vendor's request signature), opens the connection's sans-I/O adapter (:meth:`~WebSocketEndpoint.open`),
  and says how a refused connection is told in its protocol (:meth:`~WebSocketEndpoint.refusal`: an error frame, a
  close code).

Adding an endpoint is a row and one of these classes: the runner has no other way in. Endpoints reach the server's
shared state (scheduler, configuration, authenticator, resume registry, metrics) through the :class:`Server` they
are handed; the endpoints of higher layers (:mod:`streamer.integrations`) are built there and put in the table by the
composition root (:mod:`streamer.app`), so the server imports none of them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING

from websockets.http11 import Request, Response

from streamer.core.errors import ProtocolError
from streamer.server.auth import Principal
from streamer.server.bodies import RequestBody
from streamer.server.server_messages import ErrorMessage, serialize
from streamer.server.static import http_response

if TYPE_CHECKING:
    from streamer.server.adapter import Adapter
    from streamer.server.serve import Server

__all__ = ["Endpoint", "HttpEndpoint", "Opening", "Refusal", "WebSocketEndpoint", "text_response"]


@dataclass(frozen=True)
class Opening:
    """A WebSocket connection whose route's policy passed, for :meth:`WebSocketEndpoint.open`."""

    # the handshake request (its path with the query, its headers)
    request: Request
    # the route's path parameters (``{call_sid}``)
    params: Mapping[str, str]
    # who the credentials named (:data:`~streamer.server.auth.ANONYMOUS` with auth off or on an open route)
    principal: Principal
    # the runner's clock when the connection was admitted
    now: float


@dataclass(frozen=True)
class Refusal:
    """How a connection refused after its handshake is told: ``frame`` (None: the protocol reads none), then the
    close."""

    frame: str | None
    close_code: int
    reason: str


class HttpEndpoint(ABC):
    """A plain HTTP route, answered from the handshake's request without an upgrade."""

    @abstractmethod
    def respond(self, server: Server, request: Request, body: RequestBody) -> Response:
        """Answer ``request`` (its row's policy has been applied, but for API keys, which each endpoint checks and
        answers in its own shape)."""


class WebSocketEndpoint(ABC):
    """A WebSocket route: its protocol's handshake checks, its adapter, its way of refusing."""

    def signature_refusal(self, request: Request) -> str | None:
        """Why the vendor's request signature refuses ``request`` (HTTP 403), or None; called by the runner on a route
        whose policy's auth is :attr:`~streamer.server.routes.AuthRule.TWILIO_SIGNATURE`."""
        raise NotImplementedError(f"{type(self).__name__} verifies no request signature")

    def handshake_refusal(self, server: Server, request: Request) -> Response | None:
        """The HTTP answer refusing this handshake in the protocol's shape (its query asks for what is not served), or
        None to go on with the handshake. Called after the policy's origin, readiness and signature steps."""
        return None

    @abstractmethod
    async def open(self, server: Server, opening: Opening) -> Adapter:
        """The connection's adapter, owned by ``opening.principal``. Raise the
        :class:`~streamer.core.errors.ProtocolError` to refuse the connection with (see :meth:`refusal`)."""

    def refusal(self, error: ProtocolError) -> Refusal:
        """The native protocol's refusal (``docs/protocol.md``): an ``error`` message, then the error's close code."""
        frame = serialize(ErrorMessage(code=error.code, message=error.message))
        return Refusal(frame, error.close_code, error.code)


Endpoint = HttpEndpoint | WebSocketEndpoint


def text_response(status: HTTPStatus, text: str) -> Response:
    """A plain-text answer, one line."""
    return http_response(status, f"{text}\n".encode(), "text/plain; charset=utf-8")
