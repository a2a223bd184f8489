"""The server around one shared engine: the connection runner that applies every route's row.

A :class:`Server` serves one :class:`~streamer.server.routes.RouteTable` (all through websockets'
``process_request``): for every request it applies the row's policy (:mod:`streamer.server.routes`) in
:meth:`Server._route` and :meth:`Server._handle`, then hands the request to the row's endpoint
(:mod:`streamer.server.endpoint`): an HTTP endpoint answers; a WebSocket endpoint opens its sans-I/O adapter
(:mod:`streamer.server.adapter`), and one :class:`~streamer.server.runner.Connection` drives it, whatever the route.
Nothing here branches on a route's name.

Without a table it serves its own endpoints (:data:`streamer.server.endpoints.SERVER_ROUTES`: the probes,
``/metrics``, ``/status``, ``/v1/token``, ``/v1/listen`` and the page); ``streamer serve`` serves the composition
root's table with the integrations' endpoints too (:class:`streamer.app.App`). The command line is
:mod:`streamer.cli.serve`.

:class:`Server` is usable from tests: ``async with Server(config, engine) as server: server.port``, with port 0
for a free port.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
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

from streamer.core.errors import ConfigError, InvalidState, ProtocolError
from streamer.core.options import CoreOptions
from streamer.engine import EngineOptions
from streamer.server import auth, logs
from streamer.server.adapter import Adapter
from streamer.server.auth import ANONYMOUS, Authenticator, AuthOptions, OriginRefused, Principal
from streamer.server.balance import LOADING, WorkerBoard, WorkerPlace
from streamer.server.bodies import body_connection, request_body
from streamer.server.endpoint import HttpEndpoint, Opening, Refusal, WebSocketEndpoint, text_response
from streamer.server.endpoints import SERVER_ROUTES
from streamer.server.listen_query import LISTEN_PATH
from streamer.server.listener import (
    Balancer,
    Listener,
    SharedListener,
    read_metrics_snapshots,
    websocket_connection,
)
from streamer.server.metrics import ServerMetrics
from streamer.server.metrics_merge import merge_expositions
from streamer.server.redis_link import RedisLink, RedisMetrics, RedisOnce, RedisOptions
from streamer.server.resume import LocalSessionStore, RedisSessionStore, ResumeRegistry, SessionStore
from streamer.server.routes import Admission, AdmissionGate, AuthRule, RouteTable, duplicated_header
from streamer.server.runner import Connection
from streamer.server.scheduler import Scheduler, SchedulerOptions
from streamer.server.session_options import SessionOptions
from streamer.server.speaker_worker import SpeakerWorker
from streamer.server.status import EngineSnapshot, LoadMeter, Observable, StatusReport
from streamer.server.tracing import NO_TRACING, Tracer

if TYPE_CHECKING:
    from streamer.engine.types import Engine

__all__ = ["SHUTDOWN_SEND_SECONDS", "Gate", "Server", "ServerConfig", "Service"]

logger = logging.getLogger(__name__)

# seconds a shutdown waits beyond the flush bound, for each session's last messages (its finals, what it gave up on,
# the error with the resume hint) and its close to go out
SHUTDOWN_SEND_SECONDS = 5.0


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
    # precision and placement of the model's encoder and decoder (None fields: the machine's defaults)
    engine: EngineOptions = field(default_factory=EngineOptions)
    # identical windows (same audio, options and prompt) answered from memory: this many results are kept
    cache_entries: int = 256
    # state shared with the other replicas (resume, call followers, single-use tokens); no URL: this process only
    redis: RedisOptions = field(default_factory=RedisOptions)
    # speaker labels on request (diarize=true), when the voice encoder's weights are installed; False refuses them
    diarization: bool = True
    # one of `streamer serve --workers N`'s workers: listen on the socket the supervisor bound (this descriptor, not
    # host and port) while the balancing says so (streamer.server.balance), and merge the siblings' /metrics
    listen_fd: int | None = None
    worker: WorkerPlace | None = None

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
        self.redis.validate()
        if (self.listen_fd is None) != (self.worker is None):
            raise ConfigError("a worker listens on the descriptor its supervisor gives it: both or neither")
        if self.worker is not None:
            self.worker.validate()

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


class Service(Protocol):
    """Something a server runs beside its endpoints (the integrations' call hub and delivery sinks): started with the
    server, stopped after its sessions have flushed (step 4 of :meth:`Server.shutdown`)."""

    def start(self) -> None: ...

    async def stop(self) -> None: ...


class Server:
    """The running server. ``async with Server(config, engine)`` starts listening and the scheduler; leaving the
    block runs :meth:`shutdown`. Pass ``engine=None`` to listen before the model is loaded (``/readyz`` says 503)
    and call :meth:`set_engine` once it is. ``tracer`` records a span per session and per batch
    (:mod:`streamer.server.tracing`; none by default).

    The composition root hands it what the layers above the server add: ``routes``, the table to serve (the server's
    own endpoints by default); ``redis``, the link to the other replicas when it made one to share with its
    services (else the server makes it from ``config.redis``); ``services`` run beside the endpoints; ``gates``, the
    slots of the admission classes other than streams (which take the scheduler's).
    """

    def __init__(
        self,
        config: ServerConfig,
        engine: Engine | None,
        tracer: Tracer = NO_TRACING,
        *,
        routes: RouteTable = SERVER_ROUTES,
        redis: RedisLink | None = None,
        services: Sequence[Service] = (),
        collectors: Sequence[Collector] = (),
        gates: Mapping[Admission, AdmissionGate] | None = None,
    ) -> None:
        config.validate()
        self.config = config
        self.routes = routes
        self.metrics = ServerMetrics(routes.stream_names)
        self.tracer = tracer
        self._started_at = time.monotonic()
        self._load = LoadMeter(self._started_at)
        self.scheduler: Scheduler | None = None
        # the connections being served, each with its route's adapter (see streamer.server.runner)
        self._served: set[Connection] = set()
        # /v1/listen sessions whose connection dropped, waiting for a resume (streamer.server.resume)
        self.resumable = ResumeRegistry()
        # what the replicas share through Redis (streamer.server.redis_link), when --redis is given: sessions' records
        # for a resume on any replica, call events for followers on any replica, tokens used up on every replica
        if redis is None and config.redis.enabled:
            redis = RedisLink(config.redis)
        self.redis = redis
        self.session_store: SessionStore = LocalSessionStore()
        self.authenticator = Authenticator(config.auth)
        if self.redis is not None:
            grace = config.session.resume_grace_seconds
            self.session_store = RedisSessionStore(
                self.redis, grace, config.session.resume_finals, superseded=self.resumable.forget
            )
            self.authenticator.tokens = RedisOnce(self.redis, "token")
        self.services = tuple(services)
        self._collectors = tuple(collectors)
        self._handlers: set[asyncio.Task[Any]] = set()
        self._listener: Listener | SharedListener = Listener(self._open_listener)
        # the connections open now, from their accept to their transport's loss (a worker's load); weak, so that
        # one whose transport never came up is forgotten with it
        self._connections: weakref.WeakSet[ServerConnection] = weakref.WeakSet()
        self._balancer: Balancer | None = None
        if config.worker is not None:
            board = WorkerBoard(config.worker.board, config.worker.workers)
            assert config.listen_fd is not None  # validate() checked both are given
            connection = websocket_connection(
                self._connection_class(), self._select_subprotocol, config.max_message_bytes, auth.redacted_logger()
            )
            shared = SharedListener(self._open_listener, config.listen_fd, connection)
            self._listener = shared
            self._balancer = Balancer(shared, config.worker, board, self._worker_load)
        self._started = False
        self._balancing: asyncio.Task[None] | None = None
        self._shutting_down = False
        self._stopping = asyncio.Event()
        self._closed = asyncio.Event()
        # the admission classes' slots other than streams', which the scheduler counts for the engine
        self.gates: dict[Admission, AdmissionGate] = dict(gates or {})
        self._tickets = itertools.count(1)
        self._redis_collector: RedisMetrics | None = None
        # the voice encoder behind diarize=true (streamer.server.speaker_worker); unavailable when turned off
        self.speakers = SpeakerWorker(self.metrics, available=False if not config.diarization else None)
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
        if self._started:
            raise InvalidState("the server is already started")
        self._started = True
        await self._listener.start()  # a worker's balancing starts its accepting
        if self.scheduler is not None:
            self.scheduler.start()
        self.speakers.start()
        for service in self.services:
            service.start()
        if self.redis is not None:
            await self.redis.start()
        if self._balancer is not None:
            self._balancing = asyncio.create_task(self._balancer.run(self._render_own_metrics, self._stopping))
        logger.info("event=listening url=ws://%s:%d%s", self.config.host, self.port, LISTEN_PATH)

    async def _open_listener(self, sock: socket.socket | None) -> WebSocketServer:
        """A websockets server listening on host and port; or, given ``sock``, on it: a worker's, to which it hands the
        connections it takes from the shared socket (streamer.server.listener.SharedListener)."""
        where: dict[str, Any] = {"sock": sock} if sock is not None else {}
        return await serve(
            self._handle,
            None if sock is not None else self.config.host,
            None if sock is not None else self.config.port,
            process_request=self._route,
            select_subprotocol=self._select_subprotocol,
            create_connection=self._connection_class(),
            logger=auth.redacted_logger(),  # websockets logs request headers at DEBUG level
            max_size=self.config.max_message_bytes,
            # audio does not compress, and an inflated message could dwarf max_size on the wire (a compression
            # bomb): no permessage-deflate, whatever the client offers (websockets' default is to accept it)
            compression=None,
            open_timeout=self.config.handshake_timeout,
            **where,
        )

    def _connection_class(self) -> type[ServerConnection]:
        """The connections' class: the few HTTP routes whose row takes a body get it read (websockets' HTTP layer reads
        none), and every connection is counted from its accept to its close."""
        return body_connection(self.routes.body_limit, self._connections.add, self._connections.discard)

    @property
    def open_connections(self) -> int:
        """Connections open now, accepted and not yet gone (streams, followers and HTTP requests alike)."""
        return len(self._connections)

    def _worker_load(self) -> int:
        """What a worker publishes for the balancing: its open connections (and those it has taken and not yet made)
        once its model is loaded, else LOADING."""
        if not self.healthy:
            return LOADING
        pending = self._listener.pending if isinstance(self._listener, SharedListener) else 0
        return self.open_connections + pending

    def _render_own_metrics(self) -> str:
        return self.metrics.render(*self.collectors())

    def render_metrics(self) -> str:
        """The body of ``GET /metrics``: this server's metrics; a worker's are every worker's, each sample labelled
        ``worker`` (its own read now, its siblings' as of their last snapshot)."""
        own = self._render_own_metrics()
        if self.config.worker is None:
            return own
        return merge_expositions(read_metrics_snapshots(self.config.worker, own))

    def set_engine(self, engine: Engine) -> None:
        """The model is loaded and warmed up: start serving ``/v1/listen`` and report healthy."""
        if self.scheduler is not None:
            raise InvalidState("the engine is already set")
        # a worker's engine threads follow its siblings' load where the supervisor shares the cores out
        threads = self._balancer.engine_threads if self._balancer is not None else None
        self.scheduler = Scheduler(engine, self.config.scheduler, self.metrics, tracer=self.tracer, threads=threads)
        self.metrics.ready.set(1)
        if self._started:
            self.scheduler.start()
        logger.info("event=ready model=%s", self.config.model)

    @property
    def port(self) -> int:
        """The port actually listened on (useful with ``port=0``)."""
        return self._listener.port

    @property
    def accepting(self) -> bool:
        """Whether it takes new connections now (a worker of ``--workers`` takes them in turn with its siblings)."""
        return self._listener.accepting

    @property
    def sessions(self) -> frozenset[Adapter]:
        """The adapters of the connections being served now (a parked /v1/listen session is in :attr:`resumable`)."""
        return frozenset(c.adapter for c in self._served)

    @property
    def draining(self) -> bool:
        """A shutdown has begun: no new sessions, the live ones flush."""
        return self._shutting_down

    def ready_scheduler(self) -> Scheduler:
        """The scheduler, for an endpoint of a route that needs the model (whose readiness the runner checked)."""
        if self.scheduler is None:
            raise InvalidState("the model is not loaded")
        return self.scheduler

    def collectors(self) -> list[Collector]:
        """What ``/metrics`` exports besides :attr:`metrics`: the collectors it was given, and Redis's link."""
        sources = list(self._collectors)
        if self.redis is not None:
            if self._redis_collector is None:
                self._redis_collector = RedisMetrics(self.redis)
            sources.append(self._redis_collector)
        return sources

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
        self.metrics.ready.set(0)
        logger.info("event=shutdown sessions=%d", len(self.sessions))
        # 1. Stop accepting: close the listening socket; /readyz and new handshakes now get 503 (on connections
        #    already accepted; new ones are refused, which load balancers and probes also read as not ready).
        self._stopping.set()  # a worker marks its slot stopped: its siblings take the new connections
        self._listener.stop_accepting()
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
        await self.speakers.stop()
        for service in self.services:
            await service.stop()  # a webhook gets a few seconds to deliver the last finals
        if self.redis is not None:
            await self.redis.stop()  # the last records and events, within a few command timeouts
        # 5. Close what is left: stragglers get 1001 from websockets, and every handler returns.
        if self._balancing is not None:
            await self._balancing
        if self._balancer is not None:
            self._balancer.close()
        await self._listener.close(code=1001)
        self._closed.set()
        logger.info("event=stopped")

    # -- HTTP and WebSocket ---------------------------------------------------------------------------------------

    def _route(self, connection: ServerConnection, request: Request) -> Response | None:
        """The runner's first half, for every request: steps 1-4 of :mod:`streamer.server.routes` that HTTP can answer.
        An HTTP route's endpoint answers here; a WebSocket route goes on to the handshake, then :meth:`_handle`."""
        path = urlsplit(request.path).path
        found = self.routes.match(path)
        if found is None:
            return text_response(HTTPStatus.NOT_FOUND, f"no route for {path}")
        route, policy = found.route, found.route.policy
        # 1. One Host, Origin, Authorization: duplicates would let two layers read two different values. A body
        #    only where the row takes one, within its limit (else it was left unread: 413, and the socket closes).
        duplicate = duplicated_header(request.headers)
        if duplicate is not None:
            return text_response(HTTPStatus.BAD_REQUEST, f"the {duplicate} header may appear once")
        body = request_body(connection)
        if body.too_large:
            return text_response(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"bodies are at most {policy.max_body_bytes} bytes here"
            )
        # 2. The origin rule, on every route a browser can reach.
        if policy.check_origin:
            try:
                self.authenticator.check_origin(request)
            except OriginRefused:
                return text_response(HTTPStatus.FORBIDDEN, "origin not allowed")
        # 3. Readiness.
        if policy.needs_model and not self.healthy:
            return text_response(HTTPStatus.SERVICE_UNAVAILABLE, "the server is not ready")
        endpoint = route.endpoint
        if isinstance(endpoint, HttpEndpoint):
            return endpoint.respond(self, request, body)
        # 4. Credentials that HTTP can refuse: a vendor's request signature (Twilio reads HTTP statuses, not error
        #    frames). Then what the endpoint's protocol refuses before its handshake (its query asks for the
        #    unserved); API keys and tokens are checked in _handle.
        if policy.auth is AuthRule.TWILIO_SIGNATURE:
            refusal = endpoint.signature_refusal(request)
            if refusal is not None:
                logger.warning(
                    "event=signature_refused route=%s reason=%r remote=%s",
                    route.name,
                    refusal,
                    connection.remote_address,
                )
                return text_response(HTTPStatus.FORBIDDEN, refusal)
        return endpoint.handshake_refusal(self, request)

    def _select_subprotocol(self, connection: ServerConnection, offered: Sequence[Subprotocol]) -> Subprotocol | None:
        return auth.select_token_subprotocol(offered)

    async def _handle(self, ws: ServerConnection) -> None:
        """The runner's second half, after the handshake: steps 4-5 of :mod:`streamer.server.routes` (credentials, then
        an admission slot of the route's class), then the route's adapter, driven by one
        :class:`~streamer.server.runner.Connection` whatever the route, then the slot back."""
        assert ws.request is not None  # the handshake is over
        found = self.routes.match(urlsplit(ws.request.path).path)
        assert found is not None and isinstance(found.route.endpoint, WebSocketEndpoint)  # _route let only these
        route, policy, endpoint = found.route, found.route.policy, found.route.endpoint
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
        except ProtocolError as error:
            logger.info("event=refused route=%s code=%s remote=%s", route.name, error.code, ws.remote_address)
            await _refuse(ws, endpoint.refusal(error))
            return
        try:
            # 6. The route's adapter: a request it cannot serve (bad parameters, a session it cannot resume) is
            #    refused like the steps above. Then the one runner serves it, whatever the route.
            try:
                adapter = await endpoint.open(self, Opening(ws.request, found.params, principal, time.monotonic()))
            except ProtocolError as error:
                await _refuse(ws, endpoint.refusal(error))
                return
            await self._serve(Connection(ws, adapter))
        finally:
            gate.release(ticket)

    def _gate(self, admission: Admission) -> Gate:
        if admission is Admission.STREAM:
            return self.ready_scheduler()  # _route checked readiness
        gate = self.gates.get(admission)
        if gate is None:
            raise ConfigError(f"the server was given no gate for admission class {admission}")
        return gate

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


async def _refuse(ws: ServerConnection, refusal: Refusal) -> None:
    """Refuse a connection in its protocol's shape (the endpoint's :meth:`~WebSocketEndpoint.refusal`): its error
    frame, if the protocol reads one, then its close code."""
    with contextlib.suppress(ConnectionClosed):
        if refusal.frame is not None:
            await ws.send(refusal.frame)
        await ws.close(refusal.close_code, refusal.reason)
