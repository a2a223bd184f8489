"""The composition root: the server ``streamer serve`` runs, with every endpoint of every layer in one table.

The layers point one way (core ← engine ← server ← integrations ← this module, the command line and the
benchmarks): the server (:mod:`streamer.server`) knows only its own endpoints and the shape of a row
(:mod:`streamer.server.endpoint`); the integrations build theirs over the server; this module, above both, puts their
rows into one table and hands it, with the services they run, to the server. Adding an endpoint is a row here and an
endpoint class.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from streamer.integrations.call_centre import CallCentre, CallCentreOptions, ClientSecrets
from streamer.integrations.deepgram import DEEPGRAM_PATH
from streamer.integrations.deepgram_session import DeepgramEndpoint
from streamer.integrations.realtime import CLIENT_SECRETS_PATH, REALTIME_PATH
from streamer.integrations.twilio import TWILIO_PATH
from streamer.server.endpoints import LISTEN_ROUTE, PAGE_FILE_ROUTE, PAGE_ROUTE, PROBE_ROUTES
from streamer.server.redis_link import RedisLink
from streamer.server.routes import STREAM_POLICY, Admission, AdmissionGate, AuthRule, Route, RoutePolicy, RouteTable
from streamer.server.serve import Server, ServerConfig
from streamer.server.tracing import NO_TRACING, Tracer

if TYPE_CHECKING:
    from streamer.engine.types import Engine

__all__ = ["CALL_EVENTS_PATH", "App", "route_table"]

CALL_EVENTS_PATH = "/v1/calls/{call_sid}/events"


def route_table(centre: CallCentre) -> RouteTable:
    """Every endpoint of ``streamer serve``, in match order, the call-centre ones over ``centre``.
    docs/protocol.md and docs/operations.md describe each."""
    twilio, call_events, realtime = centre.endpoints()
    return RouteTable(
        [
            *PROBE_ROUTES,
            # OpenAI's ephemeral keys: the token route's policy, and a JSON body (the SDK's expires_after and session,
            # a few hundred bytes; 64 KiB is far more than any session configuration)
            Route(
                "client_secrets",
                CLIENT_SECRETS_PATH,
                RoutePolicy(AuthRule.API_KEY, Admission.NONE, max_body_bytes=64 * 1024),
                ClientSecrets(),
            ),
            LISTEN_ROUTE,
            Route("realtime", REALTIME_PATH, STREAM_POLICY, realtime),
            # Deepgram's live protocol, where an unchanged Deepgram SDK given the base URL .../deepgram connects:
            # refused and limited exactly as the native stream
            Route("deepgram", DEEPGRAM_PATH, STREAM_POLICY, DeepgramEndpoint()),
            Route(
                "twilio",
                TWILIO_PATH,
                RoutePolicy(AuthRule.TWILIO_SIGNATURE, Admission.STREAM, needs_model=True, audio_rate_limit=True),
                twilio,
            ),
            Route("call_events", CALL_EVENTS_PATH, RoutePolicy(AuthRule.KEY_OR_TOKEN, Admission.FOLLOWER), call_events),
            # the browser page and its files (streamer.server.static answers 404 for names it does not have)
            PAGE_ROUTE,
            PAGE_FILE_ROUTE,
        ]
    )


class App(Server):
    """``streamer serve``'s server: :class:`~streamer.server.serve.Server` with the call centre (``/twilio``,
    ``/v1/realtime``, the call followers, transcript delivery; ``call_centre`` configures it) and Deepgram's
    endpoint. Used as the server is: ``async with App(config, engine) as app: app.port``."""

    def __init__(
        self,
        config: ServerConfig,
        engine: Engine | None,
        tracer: Tracer = NO_TRACING,
        call_centre: CallCentreOptions | None = None,
    ) -> None:
        options = call_centre or CallCentreOptions()
        # one audio rate limit (--max-audio-rate) and one flush bound (--flush-timeout) for every route that takes
        # audio (the routes' policy says which; Deepgram's adapter takes the session options as they are)
        rate, flush = config.session.rate_limit, config.session.flush_timeout
        options = dataclasses.replace(
            options,
            twilio=dataclasses.replace(options.twilio, rate_limit=rate, flush_timeout=flush),
            realtime=dataclasses.replace(options.realtime, rate_limit=rate, flush_timeout=flush),
        )
        # the call hub shares the server's Redis link: followers on any replica see calls on any other
        config.validate()
        redis = RedisLink(config.redis) if config.redis.enabled else None
        self.call_centre = CallCentre(options, redis)
        super().__init__(
            config,
            engine,
            tracer,
            routes=route_table(self.call_centre),
            redis=redis,
            services=(self.call_centre,),
            collectors=(self.call_centre,),
            # followers cost no engine time but a socket and a queue: a slot of --max-followers each
            gates={Admission.FOLLOWER: AdmissionGate("followers", options.hub.max_followers)},
        )
