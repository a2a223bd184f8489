"""The call-centre endpoints, as one piece the composition root (:mod:`streamer.app`) plugs into the server:
``/twilio``, ``/v1/calls/{callSid}/events``, ``/v1/realtime`` and ``/v1/realtime/client_secrets``, with the call hub
and the delivery sinks they share (:class:`CallCentre`, a service the server runs).

The server's runner applies each route's policy (:mod:`streamer.server.routes`: origin, readiness, credentials,
admission) and then hands the request to the row's endpoint here (:mod:`streamer.server.endpoint`). Credentials:

- ``/twilio``: Twilio cannot send an API key; when a Twilio auth token is configured the handshake must carry a
  valid ``X-Twilio-Signature`` (else HTTP 403); without one the endpoint is open (keep it on a private network).
- ``/v1/calls/.../events`` and ``/v1/realtime``: the server's API keys or a token issued for the route
  (:mod:`streamer.server.auth`), checked after the handshake: an ``error`` (OpenAI's shape on ``/v1/realtime``), then
  close 4401.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit

from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from websockets.http11 import Request, Response

from streamer.core.errors import MalformedMessage, ProtocolError, Unauthorized
from streamer.integrations.call_events import CallEventsSession
from streamer.integrations.delivery import DeliveryOptions, JsonLinesSink, WebhookMetrics, WebhookSink
from streamer.integrations.hub import CallHub, HubOptions
from streamer.integrations.hub_redis import RedisCallHub
from streamer.integrations.realtime import (
    REALTIME_PATH,
    InvalidRequest,
    TranscriptionConfig,
    error_event,
    session_config,
)
from streamer.integrations.realtime_session import RealtimeOptions, RealtimeSession
from streamer.integrations.twilio_calls import TwilioCalls
from streamer.integrations.twilio_session import TwilioOptions, TwilioSession, check_signature
from streamer.server import auth
from streamer.server.auth import Authenticator
from streamer.server.bodies import RequestBody
from streamer.server.bounded_json import parse_json_object
from streamer.server.endpoint import HttpEndpoint, Opening, Refusal, WebSocketEndpoint, text_response
from streamer.server.redis_link import RedisLink
from streamer.server.static import http_response

if TYPE_CHECKING:
    from streamer.server.adapter import Adapter
    from streamer.server.serve import Server

__all__ = [
    "TWILIO_AUTH_TOKEN_ENV",
    "WEBHOOK_SECRET_ENV",
    "CallCentre",
    "CallCentreOptions",
    "CallEventsEndpoint",
    "ClientSecrets",
    "RealtimeEndpoint",
    "TwilioEndpoint",
    "client_secret_response",
    "realtime_error_frame",
]

logger = logging.getLogger(__name__)

TWILIO_AUTH_TOKEN_ENV = "TWILIO_AUTH_TOKEN"
WEBHOOK_SECRET_ENV = "STREAMER_WEBHOOK_SECRET"


@dataclass(frozen=True)
class CallCentreOptions:
    """Validated in :meth:`validate`."""

    twilio: TwilioOptions = field(default_factory=TwilioOptions)
    realtime: RealtimeOptions = field(default_factory=RealtimeOptions)
    hub: HubOptions = field(default_factory=HubOptions)
    delivery: DeliveryOptions = field(default_factory=DeliveryOptions)

    def validate(self) -> None:
        self.twilio.validate()
        self.realtime.validate()
        self.hub.validate()
        self.delivery.validate()


class CallCentre(Collector):
    """The endpoints' shared state; one per server, which runs it as a service
    (:class:`~streamer.server.serve.Service`): :meth:`start` and :meth:`stop` run the delivery sinks. It is a
    ``prometheus_client`` collector of the sinks' counters, which the server exports on ``/metrics``."""

    def __init__(self, options: CallCentreOptions, redis: RedisLink | None = None) -> None:
        options.validate()
        self.options = options
        # with Redis, followers on any replica see calls streaming into any other (streamer.integrations.hub_redis)
        self.hub = CallHub(options.hub) if redis is None else RedisCallHub(options.hub, redis)
        self.calls = TwilioCalls(self.hub, options.twilio.call_end_grace)
        self.webhook: WebhookSink | None = None
        self.webhook_metrics: WebhookMetrics | None = None
        self.jsonl: JsonLinesSink | None = None
        if options.delivery.webhook_url is not None:
            self.webhook = WebhookSink(options.delivery)
            self.webhook_metrics = WebhookMetrics(self.webhook)
            self.hub.add_listener(self.webhook)
        if options.delivery.jsonl_dir is not None:
            self.jsonl = JsonLinesSink(options.delivery.jsonl_dir)
            self.hub.add_listener(self.jsonl)

    def start(self) -> None:
        if self.webhook is not None:
            self.webhook.start()

    async def stop(self) -> None:
        self.calls.close()  # calls waiting for another stream end now: their call_ended reaches the sinks below
        if self.webhook is not None:
            await self.webhook.stop()
        if isinstance(self.hub, RedisCallHub):
            await self.hub.close()

    def describe(self) -> Iterable[Metric]:
        return [] if self.webhook_metrics is None else self.webhook_metrics.describe()

    def collect(self) -> Iterable[Metric]:
        return [] if self.webhook_metrics is None else self.webhook_metrics.collect()

    def endpoints(self) -> tuple[TwilioEndpoint, CallEventsEndpoint, RealtimeEndpoint]:
        """The WebSocket endpoints over this state, for the composition root's rows."""
        return TwilioEndpoint(self), CallEventsEndpoint(self), RealtimeEndpoint(self)


class TwilioEndpoint(WebSocketEndpoint):
    """``/twilio``: Twilio Media Streams, verified by Twilio's request signature."""

    def __init__(self, centre: CallCentre) -> None:
        self.centre = centre

    def signature_refusal(self, request: Request) -> str | None:
        """Why Twilio's signature refuses this handshake (HTTP 403), or None (valid, or no auth token set)."""
        return check_signature(self.centre.options.twilio, request)

    async def open(self, server: Server, opening: Opening) -> Adapter:
        scheduler, core = server.ready_scheduler(), server.config.core
        adapter = TwilioSession(scheduler, core, self.centre.options.twilio, self.centre.calls, opening.now)
        adapter.owner = opening.principal
        return adapter

    def refusal(self, error: ProtocolError) -> Refusal:
        """Twilio reads no error frames: the close alone."""
        return Refusal(None, error.close_code, error.code)


class CallEventsEndpoint(WebSocketEndpoint):
    """``/v1/calls/{call_sid}/events``: a follower of one call's events (the native protocol's refusals)."""

    def __init__(self, centre: CallCentre) -> None:
        self.centre = centre

    async def open(self, server: Server, opening: Opening) -> Adapter:
        adapter = CallEventsSession(self.centre.hub, opening.params["call_sid"], opening.now)
        adapter.owner = opening.principal
        return adapter


class RealtimeEndpoint(WebSocketEndpoint):
    """``/v1/realtime``: OpenAI's Realtime transcription sessions, refused in OpenAI's shape."""

    def __init__(self, centre: CallCentre) -> None:
        self.centre = centre

    def handshake_refusal(self, server: Server, request: Request) -> Response | None:
        """HTTP 400 unless the handshake asks for transcription (the only intent served)."""
        intent = dict(parse_qsl(urlsplit(request.path).query)).get("intent", "transcription")
        if intent == "transcription":
            return None
        return text_response(HTTPStatus.BAD_REQUEST, "only intent=transcription is served here")

    async def open(self, server: Server, opening: Opening) -> Adapter:
        beta = "realtime=v1" in (opening.request.headers.get("OpenAI-Beta") or "")
        scheduler, core = server.ready_scheduler(), server.config.core
        adapter = RealtimeSession(scheduler, core, self.centre.options.realtime, beta, opening.now)
        adapter.owner = opening.principal
        return adapter

    def refusal(self, error: ProtocolError) -> Refusal:
        return Refusal(realtime_error_frame(error), error.close_code, error.code)


class ClientSecrets(HttpEndpoint):
    """``POST /v1/realtime/client_secrets``: OpenAI's ephemeral keys (:func:`client_secret_response`)."""

    def respond(self, server: Server, request: Request, body: RequestBody) -> Response:
        return client_secret_response(server.authenticator, request, body)


# OpenAI's bounds on expires_after.seconds, and its default
MIN_SECRET_TTL_S = 10
MAX_SECRET_TTL_S = 7200
DEFAULT_SECRET_TTL_S = 600


def client_secret_response(authenticator: Authenticator, request: Request, body: RequestBody) -> Response:
    """Answer ``POST /v1/realtime/client_secrets`` as OpenAI does: ``{"value", "expires_at", "session"}``, ``value``
    an ephemeral key for one ``/v1/realtime`` session (an :class:`~streamer.server.auth.Authenticator` token: single
    use, wall-clock expiry, bound to the route and to the requesting page's origin, or to any allowed origin when a
    back end asks). The body's ``expires_after.seconds`` (10 to 7200, default 600) sets the expiry; its ``session``
    (a transcription session) is validated and echoed, not bound to the key: the client sends its own
    ``session.update``. Errors in OpenAI's shape: 400 bad body, 401 no API key, 403 refused origin, 405 not POST,
    413 a body over the route's limit."""
    issuer = auth.token_issuer(authenticator, request)
    if isinstance(issuer, auth.IssueRefusal):
        return _openai_http_error(issuer.status, issuer.code, issuer.message, None, issuer.headers)
    if body.too_large:
        return _openai_http_error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "invalid_request", "the body is too large", None)
    try:
        fields = parse_json_object(body.data.decode("utf-8"), "the body") if body.data.strip() else {}
        ttl = _secret_ttl(fields.get("expires_after"))
        config = session_config(fields["session"]) if fields.get("session") is not None else TranscriptionConfig()
    except UnicodeDecodeError:
        return _openai_http_error(HTTPStatus.BAD_REQUEST, "invalid_json", "the body is not UTF-8 JSON", None)
    except MalformedMessage as error:
        return _openai_http_error(HTTPStatus.BAD_REQUEST, "invalid_json", error.message, None)
    except InvalidRequest as error:
        return _openai_http_error(HTTPStatus.BAD_REQUEST, error.code, error.message, error.param)
    origin = auth.request_origin(request)
    secret = authenticator.issue_token(issuer, REALTIME_PATH, origin, ttl_s=ttl, any_origin=origin is None)
    expires_at = auth.token_expiry(secret)
    session = config.session_object(f"sess_{secrets.token_hex(8)}", beta=False) | {"expires_at": expires_at}
    answer = {"value": secret, "expires_at": expires_at, "session": session}
    return http_response(HTTPStatus.OK, json.dumps(answer).encode(), "application/json", {"Cache-Control": "no-store"})


def _secret_ttl(expires_after: Any) -> int:
    if expires_after is None:
        return DEFAULT_SECRET_TTL_S
    if not isinstance(expires_after, dict):
        raise InvalidRequest("expires_after must be an object", param="expires_after")
    if expires_after.get("anchor", "created_at") != "created_at":
        raise InvalidRequest("expires_after.anchor must be 'created_at'", param="expires_after.anchor")
    seconds = expires_after.get("seconds", DEFAULT_SECRET_TTL_S)
    if not isinstance(seconds, int) or isinstance(seconds, bool) or not MIN_SECRET_TTL_S <= seconds <= MAX_SECRET_TTL_S:
        raise InvalidRequest(
            f"expires_after.seconds must be {MIN_SECRET_TTL_S} to {MAX_SECRET_TTL_S}", param="expires_after.seconds"
        )
    return seconds


def _openai_http_error(
    status: HTTPStatus, code: str, message: str, param: str | None, headers: Mapping[str, str] | None = None
) -> Response:
    """OpenAI's HTTP error body: ``{"error": {"message", "type", "param", "code"}}``."""
    body = {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}}
    return http_response(
        status, json.dumps(body).encode(), "application/json", {"Cache-Control": "no-store", **(headers or {})}
    )


def realtime_error_frame(error: ProtocolError) -> str:
    """An error refusing a ``/v1/realtime`` connection, in OpenAI's shape (``invalid_api_key`` for credentials)."""
    code = "invalid_api_key" if isinstance(error, Unauthorized) else error.code
    kind = "invalid_request_error" if isinstance(error, Unauthorized) else "server_error"
    return json.dumps(error_event("event_refused", InvalidRequest(error.message, code=code), kind))
