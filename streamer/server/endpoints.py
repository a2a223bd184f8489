"""The server's own endpoints and their rows: the probes, ``/metrics``, ``/status``, ``/v1/token``, the native
``/v1/listen`` stream and the browser page. ``docs/protocol.md`` and ``docs/operations.md`` describe each.

:data:`SERVER_ROUTES` is the table of a server with these alone (what :class:`~streamer.server.serve.Server` serves
when it is given no table); ``streamer serve``'s table adds the integrations' rows (:mod:`streamer.app`), with the
page's catch-all row (:data:`PAGE_FILE_ROUTE`) last.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from websockets.http11 import Request, Response

from streamer.core.errors import Unauthorized
from streamer.server import auth
from streamer.server.auth import TOKEN_PATH
from streamer.server.bodies import RequestBody
from streamer.server.endpoint import HttpEndpoint, Opening, WebSocketEndpoint, text_response
from streamer.server.listen_query import LISTEN_PATH, parse_resume_query
from streamer.server.resume import SessionRecord
from streamer.server.routes import HTTP_POLICY, STREAM_POLICY, Admission, AuthRule, Route, RoutePolicy, RouteTable
from streamer.server.static import StaticFiles, http_response
from streamer.server.takeover import open_listen_session

if TYPE_CHECKING:
    from streamer.server.adapter import Adapter
    from streamer.server.auth import Principal
    from streamer.server.serve import Server

__all__ = [
    "JSON_CONTENT_TYPE",
    "LISTEN_ROUTE",
    "METRICS_CONTENT_TYPE",
    "PAGE_FILE_ROUTE",
    "PAGE_ROUTE",
    "PROBE_ROUTES",
    "SERVER_ROUTES",
    "Listen",
    "Liveness",
    "MetricsExport",
    "Page",
    "Readiness",
    "StatusReportEndpoint",
    "TokenIssuer",
]

METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
JSON_CONTENT_TYPE = "application/json"


class Liveness(HttpEndpoint):
    """``/healthz``: 200 whenever the process answers. Never 503 while loading or draining, or an orchestrator would
    restart a process that is only busy (readiness is ``/readyz``)."""

    def respond(self, server: Server, request: Request, body: RequestBody) -> Response:
        return text_response(HTTPStatus.OK, "ok")


class Readiness(HttpEndpoint):
    """``/readyz``: 200 while serving, 503 before the model is loaded and while draining. Redis down is not an
    outage: still ready, serving from this process alone, and the body says so."""

    def respond(self, server: Server, request: Request, body: RequestBody) -> Response:
        shared = "" if server.redis is None else f"; {server.redis.status}"
        if server.healthy:
            return text_response(HTTPStatus.OK, f"ready{shared}")
        return text_response(HTTPStatus.SERVICE_UNAVAILABLE, "draining" if server.draining else "loading the model")


class MetricsExport(HttpEndpoint):
    """``/metrics``: the Prometheus text exposition (:mod:`streamer.server.metrics`) with every collector the server
    was given."""

    def respond(self, server: Server, request: Request, body: RequestBody) -> Response:
        text = server.render_metrics()
        return http_response(HTTPStatus.OK, text.encode(), METRICS_CONTENT_TYPE)


class StatusReportEndpoint(HttpEndpoint):
    """``/status``: a JSON snapshot of the engine and the live sessions. Session ids are what a resume presents: with
    auth on, only holders of an API key see them, each its own (admins: all)."""

    def respond(self, server: Server, request: Request, body: RequestBody) -> Response:
        try:
            principal = server.authenticator.check_api_key(request.headers)
        except Unauthorized as refusal:
            text = f"{refusal.message}\n".encode()
            return http_response(HTTPStatus.UNAUTHORIZED, text, "text/plain", {"WWW-Authenticate": "Bearer"})
        report = server.status(principal).to_json().encode()
        return http_response(HTTPStatus.OK, report, JSON_CONTENT_TYPE, {"Cache-Control": "no-store"})


class TokenIssuer(HttpEndpoint):
    """``POST /v1/token``: a short-lived token for browsers, for any route of the server's table that takes one."""

    def respond(self, server: Server, request: Request, body: RequestBody) -> Response:
        return auth.token_response(server.authenticator, request, server.routes.token_paths)


class Page(HttpEndpoint):
    """``/`` and the page's files (:mod:`streamer.server.static`); 404 for names it does not have."""

    def __init__(self) -> None:
        self.files = StaticFiles()

    def respond(self, server: Server, request: Request, body: RequestBody) -> Response:
        found = self.files.respond(request)
        if found is not None:
            return found
        return text_response(HTTPStatus.NOT_FOUND, f"no route for {urlsplit(request.path).path}")


class Listen(WebSocketEndpoint):
    """``/v1/listen``: the native streaming protocol, one :class:`~streamer.server.session.Session` per connection,
    resumable on any replica (:mod:`streamer.server.resume`)."""

    async def open(self, server: Server, opening: Opening) -> Adapter:
        """A resumed session keeps the owner that opened it (an admin may resume it without taking it over)."""
        scheduler = server.ready_scheduler()
        record = await self._take_over(server, opening.request, opening.principal)
        c = server.config
        return open_listen_session(
            opening.request.path,
            opening.principal,
            scheduler,
            c.core,
            c.session,
            c.model,
            server.metrics,
            server.resumable,
            opening.now,
            server.session_store,
            record,
            server.speakers,
        )

    @staticmethod
    async def _take_over(server: Server, request: Request, principal: Principal) -> SessionRecord | None:
        """The record of the session a resume names, taken over from the shared store, when this process does not
        hold it parked (or holds a stale copy: another replica took it over since); None when the request is no
        resume or the session is parked here. Raise :class:`~streamer.core.errors.UnknownSession` when nobody can
        resume it for ``principal``."""
        resume = parse_resume_query(request.path)
        if resume is None:
            return None
        if resume.session_id in server.resumable:
            if not await server.session_store.elsewhere(resume.session_id):
                return None
            server.resumable.forget(resume.session_id)
        return await server.session_store.take_over(resume.session_id, resume.last_seq, principal)


_KEY_ONLY = RoutePolicy(AuthRule.API_KEY, Admission.NONE)

# probes and scrapers: no credentials, no data about sessions; then the key holders' routes (session ids are what a
# resume presents: only key holders, and each sees its own; admins: all)
PROBE_ROUTES = (
    Route("healthz", "/healthz", HTTP_POLICY, Liveness()),
    Route("readyz", "/readyz", HTTP_POLICY, Readiness()),
    Route("metrics", "/metrics", HTTP_POLICY, MetricsExport()),
    Route("status", "/status", _KEY_ONLY, StatusReportEndpoint()),
    Route("token", TOKEN_PATH, _KEY_ONLY, TokenIssuer()),
)
LISTEN_ROUTE = Route("listen", LISTEN_PATH, STREAM_POLICY, Listen())
_PAGE = Page()
PAGE_ROUTE = Route("page", "/", HTTP_POLICY, _PAGE)
# matches every one-segment path: the table's last row
PAGE_FILE_ROUTE = Route("page_file", "/{file}", HTTP_POLICY, _PAGE)

SERVER_ROUTES = RouteTable([*PROBE_ROUTES, LISTEN_ROUTE, PAGE_ROUTE, PAGE_FILE_ROUTE])
