"""The ``streamer serve`` command: the WebSocket server around one shared engine.

Routes (all through websockets' ``process_request``):

- ``/v1/listen``: the streaming protocol (:mod:`streamer.server.protocol`, ``docs/protocol.md``), one
  :class:`~streamer.server.session.Session` per connection; 503 until the model is loaded.
- ``/healthz``: liveness: 200 whenever the process answers (loading the model and draining included).
- ``/readyz``: readiness: 200 while serving, 503 before the model is loaded and while draining.
- ``/metrics``: Prometheus text exposition (:mod:`streamer.server.metrics`).
- ``/status``: a JSON snapshot of the live sessions and the engine (:mod:`streamer.server.status`, ``streamer top``).
- ``/v1/token``: ``POST`` with an API key, answers a short-lived token for browsers (:mod:`streamer.server.auth`).
- ``/v1/realtime/client_secrets``: ``POST`` with an API key and OpenAI's JSON body, answers an ephemeral key for one
  ``/v1/realtime`` session (:func:`streamer.integrations.endpoints.client_secret_response`).
- ``/`` and the page's files: the browser client (:mod:`streamer.server.static`).
- ``/twilio``, ``/v1/calls/{callSid}/events``, ``/v1/realtime``: the call-centre endpoints
  (:mod:`streamer.integrations.endpoints`).
- ``/deepgram/v1/listen``: Deepgram's live protocol (:mod:`streamer.integrations.deepgram_session`).
- anything else: 404.

Every route is a row of :mod:`streamer.server.routes`, whose policy :meth:`Server._route` and :meth:`Server._handle`
apply before anything else; a WebSocket route then gets its sans-I/O adapter (:mod:`streamer.server.adapter`), and one
:class:`~streamer.server.runner.Connection` drives it, whatever the route.

:class:`Server` is usable from tests: ``async with Server(config, engine) as server: server.port``, with port 0
for a free port; :func:`run` is the command, which loads the real engine lazily.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import logging
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from prometheus_client.registry import Collector
from websockets.asyncio.server import Server as WebSocketServer
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response
from websockets.typing import Subprotocol

from streamer.core.agreement import Policy
from streamer.core.errors import ConfigError, InvalidState, ProtocolError, Unauthorized
from streamer.core.stream import CoreOptions
from streamer.core.vad import VadBackend
from streamer.engine import EngineOptions
from streamer.engine.types import MIN_ENCODER_PAD_SECONDS
from streamer.integrations import deepgram_session
from streamer.integrations import endpoints as integrations
from streamer.integrations.deepgram import ErrorMessage as DeepgramError
from streamer.integrations.deepgram import close_for as deepgram_close
from streamer.integrations.endpoints import IntegrationOptions, Integrations
from streamer.offline.transcribe import add_engine_arguments, engine_options_from
from streamer.server import auth, logs
from streamer.server.adapter import Adapter
from streamer.server.auth import ANONYMOUS, Authenticator, AuthOptions, OriginRefused, Principal
from streamer.server.bodies import RequestBody, body_connection, request_body
from streamer.server.metrics import ServerMetrics
from streamer.server.protocol import LISTEN_PATH, ErrorMessage, parse_resume_query, serialize
from streamer.server.ratelimit import RateLimitOptions
from streamer.server.resume import LocalSessionStore, RedisSessionStore, ResumeRegistry, SessionRecord, SessionStore
from streamer.server.routes import ROUTES, TOKEN_ROUTES, Admission, AdmissionGate, AuthRule, duplicated_header
from streamer.server.runner import Connection
from streamer.server.scheduler import Scheduler, SchedulerOptions
from streamer.server.session import SessionOptions, open_listen_session
from streamer.server.shared import REDIS_URL_ENV, RedisLink, RedisMetrics, RedisOnce, RedisOptions
from streamer.server.static import StaticFiles, http_response
from streamer.server.status import EngineSnapshot, LoadMeter, Observable, StatusReport
from streamer.server.tracing import NO_TRACING, Tracer, otel_tracer

if TYPE_CHECKING:
    from streamer.engine.types import Engine

__all__ = [
    "Server",
    "ServerConfig",
    "add_policy_arguments",
    "configure_parser",
    "core_options_from",
    "load_vad",
    "run",
]

logger = logging.getLogger(__name__)

# seconds a shutdown waits beyond the flush bound, for each session's last messages (its finals, what it gave up on,
# the error with the resume hint) and its close to go out
SHUTDOWN_SEND_SECONDS = 5.0

METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
JSON_CONTENT_TYPE = "application/json"


@dataclass(frozen=True)
class ServerConfig:
    """Everything ``streamer serve`` can be told. Validated in :meth:`validate`."""

    # interface to listen on; 0.0.0.0 for every interface
    host: str = "127.0.0.1"
    # TCP port; 0 picks a free one (see Server.port)
    port: int = 8765
    # the model name reported in `ready` and handed to streamer.engine.load_engine
    model: str = "tiny.en"
    # batching and admission control
    scheduler: SchedulerOptions = field(default_factory=SchedulerOptions)
    # per-session limits
    session: SessionOptions = field(default_factory=SessionOptions)
    # how each channel's stream core windows, agrees and commits (step_ms, endpoint_ms, VAD, decode options)
    core: CoreOptions = field(default_factory=CoreOptions)
    # seconds sessions get to flush their finals on shutdown before they are closed regardless; at least the flush
    # bound and SHUTDOWN_SEND_SECONDS (see shutdown_wait): a shutdown caps each flush at session.flush_timeout
    shutdown_timeout: float = 15.0
    # seconds a client gets to complete the opening handshake (a half-open one holds a socket until then)
    handshake_timeout: float = 10.0
    # API keys, browser tokens and allowed origins; auth is off without keys
    auth: AuthOptions = field(default_factory=AuthOptions)
    # /twilio, /v1/realtime, /v1/calls/{callSid}/events and the delivery of call transcripts
    integrations: IntegrationOptions = field(default_factory=IntegrationOptions)
    # precision and placement of the model's encoder and decoder (None fields: the machine's defaults)
    engine: EngineOptions = field(default_factory=EngineOptions)
    # identical windows (same audio, options and prompt) answered from memory: this many results are kept
    cache_entries: int = 256
    # state shared with the other replicas (resume, call followers, single-use tokens); no URL: this process only
    redis: RedisOptions = field(default_factory=RedisOptions)

    def validate(self) -> None:
        """Raise :class:`~streamer.core.errors.ConfigError` naming the first invalid field."""
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be between 0 and 65535, not {self.port}")
        if self.shutdown_timeout <= 0:
            raise ConfigError("shutdown_timeout must be > 0")
        if self.handshake_timeout <= 0:
            raise ConfigError("handshake_timeout must be > 0")
        self.scheduler.validate()
        self.engine.validate()
        if self.cache_entries < 0:
            raise ConfigError("cache_entries must be >= 0")
        self.session.validate()
        self.core.validate()
        self.auth.validate()
        self.integrations.validate()
        self.redis.validate()

    @property
    def shutdown_wait(self) -> float:
        """How long a shutdown waits for its sessions: ``shutdown_timeout``, or longer when the flush bound is (each
        session gives up on its tail at ``flush_timeout`` after the shutdown, then says so: that must get out)."""
        return max(self.shutdown_timeout, self.session.flush_timeout + SHUTDOWN_SEND_SECONDS)

    @property
    def max_message_bytes(self) -> int:
        # websockets refuses larger messages itself, with close 1009 but no error message; frames between
        # max_frame_bytes and this get the protocol's error message first (see Session)
        return 4 * self.session.max_frame_bytes


class Server:
    """The running server. ``async with Server(config, engine)`` starts listening and the scheduler; leaving the
    block runs :meth:`shutdown`. Pass ``engine=None`` to listen before the model is loaded (``/readyz`` says 503)
    and call :meth:`set_engine` once it is. ``tracer`` records a span per session and per batch
    (:mod:`streamer.server.tracing`; none by default).
    """

    def __init__(self, config: ServerConfig, engine: Engine | None, tracer: Tracer = NO_TRACING) -> None:
        config.validate()
        self.config = config
        self.metrics = ServerMetrics()
        self.tracer = tracer
        self._started_at = time.monotonic()
        self._load = LoadMeter(self._started_at)
        self.scheduler: Scheduler | None = None
        # the connections being served, each with its route's adapter (see streamer.server.runner)
        self._served: set[Connection] = set()
        # /v1/listen sessions whose connection dropped, waiting for a resume (streamer.server.resume)
        self.resumable = ResumeRegistry()
        # what the replicas share through Redis (streamer.server.shared), when --redis is given: sessions' records
        # for a resume on any replica, call events for followers on any replica, tokens used up on every replica
        self.redis: RedisLink | None = None
        self.session_store: SessionStore = LocalSessionStore()
        self.authenticator = Authenticator(config.auth)
        if config.redis.enabled:
            self.redis = RedisLink(config.redis)
            grace = config.session.resume_grace_seconds
            self.session_store = RedisSessionStore(
                self.redis, grace, config.session.resume_finals, superseded=self.resumable.forget
            )
            self.authenticator.tokens = RedisOnce(self.redis, "token")
        # one audio rate limit (--max-audio-rate) and one flush bound (--flush-timeout) for every route that takes
        # audio (the routes' policy says which; Deepgram's adapter takes the session options as they are)
        rate, flush = config.session.rate_limit, config.session.flush_timeout
        integration_options = dataclasses.replace(
            config.integrations,
            twilio=dataclasses.replace(config.integrations.twilio, rate_limit=rate, flush_timeout=flush),
            realtime=dataclasses.replace(config.integrations.realtime, rate_limit=rate, flush_timeout=flush),
        )
        self.integrations = Integrations(integration_options, self.redis)
        self._handlers: set[asyncio.Task[Any]] = set()
        self._ws: WebSocketServer | None = None
        self._shutting_down = False
        self._closed = asyncio.Event()
        # followers' admission slots (streams take theirs from the scheduler, which counts them for the engine)
        self.followers = AdmissionGate("followers", config.integrations.hub.max_followers)
        self._tickets = itertools.count(1)
        self.static = StaticFiles()
        self._redis_collector: RedisMetrics | None = None
        if engine is not None:
            self.set_engine(engine)

    # -- lifecycle --------------------------------------------------------------------------------------------------

    async def __aenter__(self) -> Server:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.shutdown()

    async def start(self) -> None:
        """Start listening (and scheduling, if the engine is set)."""
        if self._ws is not None:
            raise InvalidState("the server is already started")
        self._ws = await serve(
            self._handle,
            self.config.host,
            self.config.port,
            process_request=self._route,
            select_subprotocol=self._select_subprotocol,
            # the few HTTP routes whose row takes a body get it read (websockets' HTTP layer reads none)
            create_connection=body_connection(ROUTES.body_limit),
            logger=auth.redacted_logger(),  # websockets logs request headers at DEBUG level
            max_size=self.config.max_message_bytes,
            # audio does not compress, and an inflated message could dwarf max_size on the wire (a compression
            # bomb): no permessage-deflate, whatever the client offers (websockets' default is to accept it)
            compression=None,
            open_timeout=self.config.handshake_timeout,
        )
        if self.scheduler is not None:
            self.scheduler.start()
        self.integrations.start()
        if self.redis is not None:
            await self.redis.start()
        logger.info("event=listening url=ws://%s:%d%s", self.config.host, self.port, LISTEN_PATH)

    def set_engine(self, engine: Engine) -> None:
        """The model is loaded and warmed up: start serving ``/v1/listen`` and report healthy."""
        if self.scheduler is not None:
            raise InvalidState("the engine is already set")
        self.scheduler = Scheduler(engine, self.config.scheduler, self.metrics, tracer=self.tracer)
        if self._ws is not None:
            self.scheduler.start()
        logger.info("event=ready model=%s", self.config.model)

    @property
    def port(self) -> int:
        """The port actually listened on (useful with ``port=0``)."""
        if self._ws is None:
            raise InvalidState("the server is not started")
        port: int = self._ws.sockets[0].getsockname()[1]
        return port

    @property
    def sessions(self) -> frozenset[Adapter]:
        """The adapters of the connections being served now (a parked /v1/listen session is in :attr:`resumable`)."""
        return frozenset(c.adapter for c in self._served)

    @property
    def healthy(self) -> bool:
        """Ready: serving ``/v1/listen`` (the model is loaded and the server is not draining)."""
        return self.scheduler is not None and not self._shutting_down

    def status(self, principal: Principal = ANONYMOUS) -> StatusReport:
        """What ``GET /status`` answers: the engine and every live session that can describe itself and that
        ``principal`` owns (an admin, or anyone with auth off, sees them all)."""
        now = time.monotonic()
        engine: EngineSnapshot | None = None
        if self.scheduler is not None:
            m = self.metrics
            gpu = m.gpu_memory.read()
            engine = EngineSnapshot(
                load=self._load.sample(now, m.engine_busy_seconds.value),
                real_time_factor=round(m.real_time_factor.read() or 0.0, 4),
                queue_depth=self.scheduler.queue_depth(),
                active_sessions=self.scheduler.active_sessions,
                max_sessions=self.config.scheduler.max_sessions,
                batches=int(m.batches.value),
                gpu_memory_bytes=None if gpu is None else int(gpu),
            )
        visible = (s for s in self.sessions if isinstance(s, Observable) and principal.owns(s.owner))
        sessions = sorted((s.snapshot(now) for s in visible), key=lambda s: -s.age_seconds)
        return StatusReport(
            model=self.config.model,
            ready=self.healthy,
            draining=self._shutting_down,
            uptime_seconds=round(now - self._started_at, 3),
            engine=engine,
            sessions=tuple(sessions),
        )

    async def shutdown(self) -> None:
        """Stop gracefully; idempotent. The story, step by step:"""
        if self._shutting_down:
            await self._closed.wait()
            return
        self._shutting_down = True
        logger.info("event=shutdown sessions=%d", len(self.sessions))
        # 1. Stop accepting: close the listening socket; /readyz and new handshakes now get 503 (on connections
        #    already accepted; new ones are refused, which load balancers and probes also read as not ready).
        if self._ws is not None:
            self._ws.server.close()
        # 2. Tell every session to stop receiving and flush its finals; each then closes with 1001.
        for served in list(self._served):
            served.shutdown()
        self.resumable.close()  # parked sessions have nobody to flush to, and cannot be resumed after the stop
        # 3. Wait for them, bounded: a session stuck on a dead reader must not hold the process.
        if self._handlers:
            _, pending = await asyncio.wait(self._handlers, timeout=self.config.shutdown_wait)
            if pending:
                logger.warning("event=shutdown_timeout sessions=%d", len(pending))
        self.resumable.close()  # sessions whose connection dropped while they flushed
        # 4. Stop the scheduler (sessions needed it to flush); a batch in flight finishes on its thread.
        if self.scheduler is not None:
            await self.scheduler.stop()
        await self.integrations.stop()  # the webhook gets a few seconds to deliver the last finals
        if self.redis is not None:
            await self.redis.stop()  # the last records and events, within a few command timeouts
        # 5. Close what is left: stragglers get 1001 from websockets, and every handler returns.
        if self._ws is not None:
            self._ws.close(code=1001)
            await self._ws.wait_closed()
        self._closed.set()
        logger.info("event=stopped")

    # -- HTTP and WebSocket ---------------------------------------------------------------------------------------

    def _route(self, connection: ServerConnection, request: Request) -> Response | None:
        """The runner's first half, for every request: steps 1-4 of :mod:`streamer.server.routes` that HTTP can answer.
        An HTTP route is answered here; a WebSocket route goes on to the handshake, then :meth:`_handle`."""
        path = urlsplit(request.path).path
        found = ROUTES.match(path)
        if found is None:
            return _text(HTTPStatus.NOT_FOUND, f"no route for {path}")
        route, policy = found.route, found.route.policy
        # 1. One Host, Origin, Authorization: duplicates would let two layers read two different values. A body
        #    only where the row takes one, within its limit (else it was left unread: 413, and the socket closes).
        duplicate = duplicated_header(request.headers)
        if duplicate is not None:
            return _text(HTTPStatus.BAD_REQUEST, f"the {duplicate} header may appear once")
        body = request_body(connection)
        if body.too_large:
            return _text(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"bodies are at most {policy.max_body_bytes} bytes here")
        # 2. The origin rule, on every route a browser can reach.
        if policy.check_origin:
            try:
                self.authenticator.check_origin(request)
            except OriginRefused:
                return _text(HTTPStatus.FORBIDDEN, "origin not allowed")
        # 3. Readiness.
        if policy.needs_model and not self.healthy:
            return _text(HTTPStatus.SERVICE_UNAVAILABLE, "the server is not ready")
        # 4. Credentials that HTTP can refuse: Twilio's signature (Twilio reads HTTP statuses, not error frames).
        if policy.auth is AuthRule.TWILIO_SIGNATURE:
            refusal = self.integrations.twilio_refusal(request)
            if refusal is not None:
                logger.warning("event=twilio_refused reason=%r remote=%s", refusal, connection.remote_address)
                return _text(HTTPStatus.FORBIDDEN, refusal)
        if route.websocket:
            if route.name == "realtime":
                refusal = self.integrations.realtime_refusal(request)
                if refusal is not None:
                    return _text(HTTPStatus.BAD_REQUEST, refusal)
            if route.name == "deepgram":
                assert self.scheduler is not None  # readiness
                return deepgram_session.handshake_refusal(request.path, self.scheduler.engine.info, self.config.core)
            return None  # the handshake goes on; API keys and tokens are checked in _handle
        return self._http(route.name, request, body)

    def _http(self, name: str, request: Request, body: RequestBody) -> Response:
        """Answer an HTTP route (its policy has been applied, but for API keys, which each answer in its shape)."""
        if name == "healthz":
            # liveness: the event loop answers. Never 503 while loading or draining, or an orchestrator would
            # restart a process that is only busy (readiness is /readyz)
            return _text(HTTPStatus.OK, "ok")
        if name == "readyz":
            # Redis down is not an outage: still ready, serving from this process alone, and the body says so
            shared = "" if self.redis is None else f"; {self.redis.status}"
            if self.healthy:
                return _text(HTTPStatus.OK, f"ready{shared}")
            return _text(HTTPStatus.SERVICE_UNAVAILABLE, "draining" if self._shutting_down else "loading the model")
        if name == "metrics":
            sources: list[Collector] = [self.integrations]
            if self.redis is not None:
                sources.append(self._redis_metrics(self.redis))
            return http_response(HTTPStatus.OK, self.metrics.render(*sources).encode(), METRICS_CONTENT_TYPE)
        if name == "status":
            return self._status_response(request)
        if name == "token":
            return auth.token_response(self.authenticator, request, TOKEN_ROUTES)
        if name == "client_secrets":
            return integrations.client_secret_response(self.authenticator, request, body)
        static = self.static.respond(request)
        if static is not None:
            return static
        return _text(HTTPStatus.NOT_FOUND, f"no route for {urlsplit(request.path).path}")

    def _redis_metrics(self, link: RedisLink) -> RedisMetrics:
        if self._redis_collector is None:
            self._redis_collector = RedisMetrics(link)
        return self._redis_collector

    def _status_response(self, request: Request) -> Response:
        # session ids are what a resume presents: with auth on, only holders of an API key see them, each its own
        try:
            principal = self.authenticator.check_api_key(request.headers)
        except Unauthorized as refusal:
            body = f"{refusal.message}\n".encode()
            return http_response(HTTPStatus.UNAUTHORIZED, body, "text/plain", {"WWW-Authenticate": "Bearer"})
        body = self.status(principal).to_json().encode()
        return http_response(HTTPStatus.OK, body, JSON_CONTENT_TYPE, {"Cache-Control": "no-store"})

    def _select_subprotocol(self, connection: ServerConnection, offered: Sequence[Subprotocol]) -> Subprotocol | None:
        return auth.select_token_subprotocol(offered)

    async def _handle(self, ws: ServerConnection) -> None:
        """The runner's second half, after the handshake: steps 4-5 of :mod:`streamer.server.routes` (credentials, then
        an admission slot of the route's class), then the route's adapter, driven by one
        :class:`~streamer.server.runner.Connection` whatever the route, then the slot back."""
        assert ws.request is not None  # the handshake is over
        found = ROUTES.match(urlsplit(ws.request.path).path)
        assert found is not None and found.route.websocket  # _route let only these through
        route, policy = found.route, found.route.policy
        # 4. Credentials, after the handshake rather than with HTTP 401 before it: a browser learns nothing about a
        #    refused handshake (its close code is 1006, as when the server is down), but it sees an error + 4401.
        principal = ANONYMOUS
        try:
            if policy.auth is AuthRule.KEY_OR_TOKEN:
                principal = await self.authenticator.authenticate(ws.request, route.path)
            # 5. A slot of the route's admission class, or an error + 1013.
            ticket = f"{route.name}-{next(self._tickets)}"
            gate = self._gate(policy.admission)
            gate.admit(ticket, route.name)
        except ProtocolError as refusal:
            logger.info("event=refused route=%s code=%s remote=%s", route.name, refusal.code, ws.remote_address)
            await _refuse(ws, route.name, refusal)
            return
        try:
            # 6. The route's adapter: a request it cannot serve (bad parameters, a session it cannot resume) is
            #    refused like the steps above. Then the one runner serves it, whatever the route.
            try:
                record = await self._take_over(ws.request, principal) if route.name == "listen" else None
                adapter = self._open(route.name, ws.request, found.params, principal, time.monotonic(), record)
            except ProtocolError as refusal:
                await _refuse(ws, route.name, refusal)
                return
            await self._serve(Connection(ws, adapter))
        finally:
            gate.release(ticket)

    def _gate(self, admission: Admission) -> Gate:
        if admission is Admission.FOLLOWER:
            return self.followers
        assert admission is Admission.STREAM and self.scheduler is not None  # _route checked readiness
        return self.scheduler

    async def _take_over(self, request: Request, principal: Principal) -> SessionRecord | None:
        """The record of the session a ``/v1/listen`` resume names, taken over from the shared store, when this process
        does not hold it parked (or holds a stale copy: another replica took it over since); None when the request
        is no resume or the session is parked here. Raise :class:`~streamer.core.errors.UnknownSession` when nobody
        can resume it for ``principal``."""
        resume = parse_resume_query(request.path)
        if resume is None:
            return None
        if resume.session_id in self.resumable:
            if not await self.session_store.elsewhere(resume.session_id):
                return None
            self.resumable.forget(resume.session_id)
        return await self.session_store.take_over(resume.session_id, resume.last_seq, principal)

    def _open(
        self,
        name: str,
        request: Request,
        params: Mapping[str, str],
        principal: Principal,
        now: float,
        record: SessionRecord | None = None,
    ) -> Adapter:
        """The adapter of a WebSocket route for ``request`` by ``principal``, opened at ``now`` (a ``/v1/listen``
        session taken over from ``record``, if given). A resumed ``/v1/listen`` session keeps the owner that opened
        it (an admin may resume it without taking it over)."""
        if name == "listen":
            assert self.scheduler is not None
            c = self.config
            return open_listen_session(
                request.path,
                principal,
                self.scheduler,
                c.core,
                c.session,
                c.model,
                self.metrics,
                self.resumable,
                now,
                self.session_store,
                record,
            )
        adapter: Adapter
        if name == "deepgram":
            assert self.scheduler is not None
            c = self.config
            created = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
            adapter = deepgram_session.open_deepgram_session(
                request.path, self.scheduler, c.core, c.session, c.model, created, now
            )
        elif name == "call_events":
            adapter = self.integrations.open_call_events(params["call_sid"], now)
        else:
            assert self.scheduler is not None
            if name == "twilio":
                adapter = self.integrations.open_twilio(self.scheduler, self.config.core, now)
            else:
                assert name == "realtime", name
                adapter = self.integrations.open_realtime(request, self.scheduler, self.config.core, now)
        adapter.owner = principal
        return adapter

    async def _serve(self, connection: Connection) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._served.add(connection)
        self._handlers.add(task)
        if self._shutting_down:  # accepted in the instant before the socket closed
            connection.shutdown()
        session_id = str(getattr(connection.adapter, "id", ""))
        # this task serves only this session: every record it (and the tasks it starts) logs carries the id
        logs.SESSION_ID.set(session_id or None)
        ws = connection.ws
        path = urlsplit(ws.request.path).path if ws.request is not None else ""
        attributes = {"streamer.session_id": session_id, "streamer.path": path}
        try:
            with self.tracer.span("streamer.server.session", attributes) as span:
                await connection.run()
                if ws.close_code is not None:
                    span.set("streamer.close_code", ws.close_code)
        finally:
            self._served.discard(connection)
            self._handlers.discard(task)


class Gate(Protocol):
    """An admission class's slots: the scheduler's for streams, an :class:`~streamer.server.routes.AdmissionGate`
    else."""

    def admit(self, ticket: str, route: str) -> None: ...

    def release(self, ticket: str) -> None: ...


def _text(status: HTTPStatus, text: str) -> Response:
    return http_response(status, f"{text}\n".encode(), "text/plain; charset=utf-8")


async def _refuse(ws: ServerConnection, route: str, refusal: ProtocolError) -> None:
    """Refuse a connection in its protocol's shape: an error frame (none to Twilio, which reads none), then the
    error's close code."""
    frame: str | None
    close_code, reason = refusal.close_code, refusal.code
    if route == "realtime":
        frame = integrations.realtime_error_frame(refusal)
    elif route == "deepgram":
        frame = DeepgramError(refusal.code, refusal.message).to_json()
        close_code, reason = deepgram_close(refusal)
    elif route == "twilio":
        frame = None
    else:
        frame = serialize(ErrorMessage(code=refusal.code, message=refusal.message))
    with contextlib.suppress(ConnectionClosed):
        if frame is not None:
            await ws.send(frame)
        await ws.close(close_code, reason)


# ---------------------------------------------------------------------------------------------------------------------
# The command


def configure_parser(parser: argparse.ArgumentParser) -> None:
    s = SessionOptions()
    q = SchedulerOptions()
    c = CoreOptions()
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: %(default)s)")
    parser.add_argument("--port", type=int, default=8765, help="TCP port (default: %(default)s)")
    parser.add_argument("--model", default="tiny.en", help="model name or directory (default: %(default)s)")
    parser.add_argument("--max-sessions", type=int, default=q.max_sessions, help="refuse sessions beyond this")
    parser.add_argument("--max-batch-size", type=int, default=q.max_batch_size, help="windows per engine call")
    parser.add_argument(
        "--round-robin",
        action="store_true",
        help="schedule windows in strict rotation (default: windows that close an utterance go first)",
    )
    parser.add_argument("--max-frame-bytes", type=int, default=s.max_frame_bytes, help="largest binary frame")
    parser.add_argument("--idle-timeout", type=float, default=s.idle_timeout, help="seconds without a frame")
    parser.add_argument(
        "--max-session-seconds", type=float, default=s.max_session_seconds, help="wall-clock limit of a session"
    )
    parser.add_argument(
        "--max-audio-rate",
        type=float,
        default=s.rate_limit.max_rate,
        help="sustained audio per wall-clock second, as a multiple of real time; 0: no limit (default: %(default)s)",
    )
    parser.add_argument(
        "--audio-burst-seconds",
        type=float,
        default=s.rate_limit.burst_seconds,
        help="seconds of audio a client may send ahead of --max-audio-rate (default: %(default)s)",
    )
    parser.add_argument(
        "--flush-timeout",
        type=float,
        default=s.flush_timeout,
        help="once a stream has ended, seconds the engine may go without progress (on it or any stream) before the "
        "rest of its audio is reported lost; it waits while the engine works. Every endpoint (default: %(default)s)",
    )
    parser.add_argument(
        "--resume-grace-seconds",
        type=float,
        default=s.resume_grace_seconds,
        help="how long a dropped session waits for its client to resume it; 0: no resume (default: %(default)s)",
    )
    parser.add_argument("--step-ms", type=int, default=c.step_ms, help="new speech between decodes (partials)")
    parser.add_argument("--endpoint-ms", type=int, default=c.endpoint_ms, help="pause that makes text final")
    add_policy_arguments(parser)
    parser.add_argument("--cache-entries", type=int, default=256, help="decode results kept for identical windows")
    parser.add_argument(
        "--log-format", choices=logs.LOG_FORMATS, default="text", help="json: one object per line (default: text)"
    )
    parser.add_argument(
        "--otel", action="store_true", help="OpenTelemetry spans per session and batch (needs the otel extra)"
    )
    parser.add_argument(
        "--redis",
        metavar="URL",
        default=None,
        help=f"share resume, call followers and single-use tokens with other replicas through this Redis "
        f"(redis://host:6379/0; also ${REDIS_URL_ENV}); without it, all of that is per process",
    )
    add_engine_arguments(parser, model=False)
    auth.configure_parser(parser)
    integrations.configure_parser(parser)


def add_policy_arguments(parser: argparse.ArgumentParser) -> None:
    """``--policy``, ``--alignatt-margin-ms``, ``--agreement-margin-ms``, ``--commit-hold-ms``, ``--resume-after-ms``,
    ``--context-ms``, ``--first-step-ms``, the webrtc gate and ``--vad``: how a stream finds speech, cuts windows and
    commits words (``serve`` and the benchmarks)."""
    defaults = CoreOptions()
    parser.add_argument(
        "--policy",
        type=Policy,
        choices=list(Policy),
        default=defaults.policy,
        help="commit policy: local-agreement (words two successive windows agree on), alignatt (words the decoder's"
        " attention has moved past) or auto (local-agreement, alignatt for a window that waited for a busy engine);"
        " default: %(default)s",
    )
    parser.add_argument(
        "--auto-wait-ms",
        type=int,
        default=defaults.auto_wait_ms,
        help="auto: a window that ends more than a step and this much after the stream's previous one (it waited"
        " for a busy engine) commits by alignatt (default: %(default)s)",
    )
    parser.add_argument(
        "--alignatt-margin-ms",
        type=int,
        default=defaults.alignatt_margin_ms,
        help="alignatt: a word is final once its alignment ends this long before the decoded audio"
        " (default: %(default)s)",
    )
    parser.add_argument(
        "--agreement-margin-ms",
        type=int,
        default=defaults.agreement_margin_ms,
        help="local-agreement: an agreed word is final once it also ends this long before the decoded audio"
        " (default: %(default)s)",
    )
    parser.add_argument(
        "--commit-hold-ms",
        type=int,
        default=defaults.commit_hold_ms,
        help="words settled while an utterance goes on stay partial until its uncommitted speech is longer than this;"
        " the end point then commits it from one decode of the whole utterance (0: commit at once; default:"
        " %(default)s)",
    )
    parser.add_argument(
        "--resume-after-ms",
        type=int,
        default=defaults.resume_after_ms,
        help="the window that closes an utterance and whose words stop this long before its speech does is decoded"
        " again from its last word but one, rather than committing the rest without words (0: never; default:"
        " %(default)s)",
    )
    parser.add_argument(
        "--context-ms",
        type=int,
        default=defaults.context_ms,
        help="an utterance's windows start up to this long before it, at a word already committed, so the model hears"
        " what led up to it (0: at the utterance; default: %(default)s)",
    )
    parser.add_argument(
        "--first-step-ms",
        type=int,
        default=defaults.first_step_ms,
        help="windows come after this much new speech until the segment shows words (default: the step)",
    )
    parser.add_argument(
        "--vad-gate-db",
        type=float,
        default=defaults.vad.energy_gate_db,
        help="webrtc: a voiced frame must stand this many dB above the noise floor (default: %(default)s)",
    )
    parser.add_argument(
        "--vad-floor-ms",
        type=int,
        default=defaults.vad.noise_floor_ms,
        help="webrtc: the noise floor is the 10th percentile of this much recent audio (default: %(default)s)",
    )
    parser.add_argument(
        "--vad",
        type=VadBackend,
        choices=list(VadBackend),
        default=defaults.vad.backend,
        help="voice activity detector: webrtc (WebRTC's GMM detector) or silero (Silero's neural network; pip install"
        " 'streamer[silero]'), under the same hysteresis and padding; default: %(default)s",
    )
    parser.add_argument(
        "--encoder-pad-seconds",
        type=float,
        default=defaults.decode.encoder_pad_seconds,
        metavar="S",
        help=f"the encoder reads each window's audio and S s of the silence after it ({MIN_ENCODER_PAD_SECONDS:g} to"
        " 30; 30 is Whisper's whole window): fewer frames to encode, sooner partials; default:"
        " %(default)s",
    )


def core_options_from(args: argparse.Namespace) -> CoreOptions:
    """The stream core's options from ``--step-ms``, ``--endpoint-ms`` and :func:`add_policy_arguments`' options."""
    defaults = CoreOptions()
    return dataclasses.replace(
        defaults,
        step_ms=args.step_ms,
        endpoint_ms=args.endpoint_ms,
        policy=getattr(args, "policy", defaults.policy),
        alignatt_margin_ms=getattr(args, "alignatt_margin_ms", defaults.alignatt_margin_ms),
        auto_wait_ms=getattr(args, "auto_wait_ms", defaults.auto_wait_ms),
        agreement_margin_ms=getattr(args, "agreement_margin_ms", defaults.agreement_margin_ms),
        commit_hold_ms=getattr(args, "commit_hold_ms", defaults.commit_hold_ms),
        resume_after_ms=getattr(args, "resume_after_ms", defaults.resume_after_ms),
        first_step_ms=getattr(args, "first_step_ms", defaults.first_step_ms),
        context_ms=getattr(args, "context_ms", defaults.context_ms),
        vad=dataclasses.replace(
            defaults.vad,
            backend=getattr(args, "vad", defaults.vad.backend),
            energy_gate_db=getattr(args, "vad_gate_db", defaults.vad.energy_gate_db),
            noise_floor_ms=getattr(args, "vad_floor_ms", defaults.vad.noise_floor_ms),
        ),
        decode=dataclasses.replace(
            defaults.decode,
            encoder_pad_seconds=getattr(args, "encoder_pad_seconds", defaults.decode.encoder_pad_seconds),
        ),
    )


def load_vad(options: CoreOptions) -> None:
    """Load the voice activity detector's model now, if it has one (``--vad silero``), so that a missing package is a
    :class:`~streamer.core.errors.ConfigError` at start-up rather than in every stream; the streams share it."""
    if options.vad.backend is VadBackend.SILERO:
        from streamer.engine.silero_vad import load_model

        load_model()


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    config = ServerConfig(
        host=args.host,
        port=args.port,
        model=args.model,
        scheduler=SchedulerOptions(
            max_batch_size=args.max_batch_size, max_sessions=args.max_sessions, finals_first=not args.round_robin
        ),
        session=dataclasses.replace(
            SessionOptions(),
            max_frame_bytes=args.max_frame_bytes,
            idle_timeout=args.idle_timeout,
            max_session_seconds=args.max_session_seconds,
            rate_limit=RateLimitOptions(max_rate=args.max_audio_rate, burst_seconds=args.audio_burst_seconds),
            resume_grace_seconds=args.resume_grace_seconds,
            flush_timeout=args.flush_timeout,
        ),
        core=core_options_from(args),
        auth=auth.options_from_args(args, os.environ),
        integrations=integrations.options_from_args(args, os.environ),
        engine=engine_options_from(args),
        cache_entries=args.cache_entries,
        redis=RedisOptions(url=getattr(args, "redis", None) or os.environ.get(REDIS_URL_ENV) or None),
    )
    config.validate()
    return config


def run(args: argparse.Namespace) -> int:
    """``streamer serve``: listen at once, load the model, serve until SIGTERM or SIGINT, then shut down."""
    config = config_from_args(args)
    load_vad(config.core)
    logs.configure(args.log_format)
    tracer = otel_tracer() if args.otel else NO_TRACING
    try:
        import uvloop
    except ImportError:
        asyncio.run(_serve(config, tracer))
    else:
        uvloop.run(_serve(config, tracer))
    return 0


def _load_engine(config: ServerConfig) -> Engine:
    """Load and warm up the model (blocks for seconds: run it off the event loop)."""
    from streamer.engine import load_engine  # heavy: torch and the model
    from streamer.engine.cache import CachingEngine

    engine = load_engine(config.model, config.engine)
    return CachingEngine(engine, max_entries=config.cache_entries) if config.cache_entries else engine


async def _serve(config: ServerConfig, tracer: Tracer = NO_TRACING) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    engine: Engine | None = None
    async with Server(config, engine=None, tracer=tracer) as server:
        print(f"streamer: listening on ws://{config.host}:{server.port}{LISTEN_PATH}", file=sys.stderr)
        print(f"streamer: browser client at http://{config.host}:{server.port}/", file=sys.stderr)
        loading = asyncio.ensure_future(loop.run_in_executor(None, _load_engine, config))
        stopping = asyncio.ensure_future(stop.wait())
        waiting: set[asyncio.Future[Any]] = {loading, stopping}
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        if loading.done():
            engine = loading.result()
            server.set_engine(engine)
            print(f"streamer: model {config.model} loaded; serving", file=sys.stderr)
            await stopping
        print("streamer: shutting down", file=sys.stderr)
    stopping.cancel()
    if engine is not None:
        engine.close()
    elif not loading.done():
        with contextlib.suppress(Exception):
            loading.cancel()
