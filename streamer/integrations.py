"""The call-centre endpoints, as one piece the server plugs in: ``/twilio``, ``/v1/calls/{callSid}/events`` and
``/v1/realtime``, with the call hub and the delivery sinks they share.

The server asks :meth:`Integrations.route` about every HTTP request (before its own 404) and hands every
WebSocket on one of these paths to :meth:`Integrations.open_session`. Credentials:

- ``/twilio``: Twilio cannot send an API key; when a Twilio auth token is configured the handshake must carry a
  valid ``X-Twilio-Signature`` (else HTTP 403); without one the endpoint is open (keep it on a private network).
- ``/v1/calls/.../events`` and ``/v1/realtime``: the server's API keys (:mod:`streamer.auth`), checked after the
  handshake: an ``error`` (OpenAI's shape on ``/v1/realtime``), then close 4401.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Protocol
from urllib.parse import parse_qsl, urlsplit

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from streamer.call_events import CallEventsSession, call_sid_from_path
from streamer.core import CoreOptions
from streamer.delivery import DeliveryOptions, JsonLinesSink, WebhookSink
from streamer.errors import Unauthorized
from streamer.hub import CallHub, HubOptions
from streamer.protocol import ErrorMessage, serialize
from streamer.realtime import REALTIME_PATH, InvalidRequest, error_event
from streamer.realtime_session import RealtimeOptions, RealtimeSession
from streamer.scheduler import Scheduler
from streamer.twilio import TWILIO_PATH
from streamer.twilio_session import TwilioOptions, TwilioSession, check_signature

__all__ = [
    "TWILIO_AUTH_TOKEN_ENV",
    "WEBHOOK_SECRET_ENV",
    "IntegrationOptions",
    "Integrations",
    "configure_parser",
    "options_from_args",
]

logger = logging.getLogger(__name__)

TWILIO_AUTH_TOKEN_ENV = "TWILIO_AUTH_TOKEN"
WEBHOOK_SECRET_ENV = "STREAMER_WEBHOOK_SECRET"


class Checker(Protocol):
    """What the server's authenticator offers (:class:`streamer.auth.Authenticator`)."""

    def check(self, request: Request) -> None: ...


class Servable(Protocol):
    async def run(self) -> None: ...

    def shutdown(self) -> None: ...


@dataclass(frozen=True)
class IntegrationOptions:
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


class Integrations:
    """The endpoints' shared state; one per server. :meth:`start` and :meth:`stop` run the delivery sinks."""

    def __init__(self, options: IntegrationOptions) -> None:
        options.validate()
        self.options = options
        self.hub = CallHub(options.hub)
        self.webhook: WebhookSink | None = None
        self.jsonl: JsonLinesSink | None = None
        if options.delivery.webhook_url is not None:
            self.webhook = WebhookSink(options.delivery)
            self.hub.add_listener(self.webhook)
        if options.delivery.jsonl_dir is not None:
            self.jsonl = JsonLinesSink(options.delivery.jsonl_dir)
            self.hub.add_listener(self.jsonl)

    def start(self) -> None:
        if self.webhook is not None:
            self.webhook.start()

    async def stop(self) -> None:
        if self.webhook is not None:
            await self.webhook.stop()

    @staticmethod
    def owns(path: str) -> bool:
        path = urlsplit(path).path
        return path in (TWILIO_PATH, REALTIME_PATH) or call_sid_from_path(path) is not None

    def route(self, connection: ServerConnection, request: Request, healthy: bool) -> Response | None:
        """For a path :meth:`owns`: the HTTP answer refusing the handshake, or None to let it go on."""
        path = urlsplit(request.path).path
        if path == TWILIO_PATH:
            refusal = check_signature(self.options.twilio, request)
            if refusal is not None:
                logger.warning("event=twilio_refused reason=%r remote=%s", refusal, connection.remote_address)
                return connection.respond(HTTPStatus.FORBIDDEN, f"{refusal}\n")
        if path != TWILIO_PATH and call_sid_from_path(path) is not None:
            return None  # followers need no model
        if not healthy:
            return connection.respond(HTTPStatus.SERVICE_UNAVAILABLE, "the server is not ready\n")
        if path == REALTIME_PATH:
            intent = dict(parse_qsl(urlsplit(request.path).query)).get("intent", "transcription")
            if intent != "transcription":
                return connection.respond(HTTPStatus.BAD_REQUEST, "only intent=transcription is served here\n")
        return None

    async def open_session(
        self,
        ws: ServerConnection,
        scheduler: Scheduler | None,
        core_options: CoreOptions,
        checker: Checker | None,
    ) -> Servable | None:
        """The session for this connection, or None after refusing it (error, then close 4401)."""
        assert ws.request is not None
        path = urlsplit(ws.request.path).path
        if path == TWILIO_PATH:
            assert scheduler is not None
            return TwilioSession(ws, scheduler, core_options, self.options.twilio, self.hub)
        if checker is not None:
            try:
                checker.check(ws.request)
            except Unauthorized as refusal:
                await self._refuse(ws, path, refusal)
                return None
        call_sid = call_sid_from_path(path)
        if call_sid is not None:
            return CallEventsSession(ws, self.hub, call_sid)
        assert scheduler is not None
        beta = "realtime=v1" in (ws.request.headers.get("OpenAI-Beta") or "")
        return RealtimeSession(ws, scheduler, core_options, self.options.realtime, beta)

    @staticmethod
    async def _refuse(ws: ServerConnection, path: str, refusal: Unauthorized) -> None:
        logger.info("event=unauthorized path=%s remote=%s", path, ws.remote_address)
        if path == REALTIME_PATH:
            error = InvalidRequest(refusal.message, code="invalid_api_key")
            frame = json.dumps(error_event("event_unauthorized", error, "invalid_request_error"))
        else:
            frame = serialize(ErrorMessage(code=refusal.code, message=refusal.message))
        with contextlib.suppress(ConnectionClosed):
            await ws.send(frame)
            await ws.close(refusal.close_code, refusal.code)


# ---------------------------------------------------------------------------------------------------------------------
# The command line of `streamer serve`


def configure_parser(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("call centre (Twilio, OpenAI Realtime, transcript delivery)")
    group.add_argument(
        "--twilio-auth-token",
        help=f"validate X-Twilio-Signature on /twilio with this auth token (or ${TWILIO_AUTH_TOKEN_ENV})",
    )
    group.add_argument("--twilio-public-url", help="the wss:// base URL Twilio connects to, if a proxy rewrites it")
    group.add_argument("--webhook-url", help="POST every call's finals here as signed JSON")
    group.add_argument("--webhook-secret", help=f"HMAC key of X-Streamer-Signature (or ${WEBHOOK_SECRET_ENV})")
    group.add_argument("--transcripts-dir", type=Path, help="append every call's finals to DIR/<callSid>.jsonl")


def options_from_args(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> IntegrationOptions:
    env = os.environ if env is None else env
    options = IntegrationOptions(
        twilio=TwilioOptions(
            auth_token=getattr(args, "twilio_auth_token", None) or env.get(TWILIO_AUTH_TOKEN_ENV) or None,
            public_url=getattr(args, "twilio_public_url", None),
        ),
        delivery=DeliveryOptions(
            webhook_url=getattr(args, "webhook_url", None),
            webhook_secret=getattr(args, "webhook_secret", None) or env.get(WEBHOOK_SECRET_ENV) or None,
            jsonl_dir=getattr(args, "transcripts_dir", None),
        ),
    )
    options.validate()
    return options
