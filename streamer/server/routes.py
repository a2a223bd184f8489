"""The front door: every endpoint is a row of one route table, and its policy is part of the row.

A :class:`Route` cannot be made without a :class:`RoutePolicy` and its endpoint (:mod:`streamer.server.endpoint`), and
the server's connection runner (:class:`streamer.server.serve.Server`) applies the whole policy before the endpoint
sees a byte:

1. the request itself: one ``Host``, ``Origin``, ``Authorization`` and ``X-Twilio-Signature`` header at most
   (duplicates are ambiguous: HTTP 400);
2. the origin rule (:meth:`streamer.server.auth.Authenticator.check_origin`, HTTP 403), on every route a browser can
   reach;
3. readiness: routes that need the model answer 503 until it is loaded and while draining;
4. credentials: an API key or a token issued for this route (:class:`AuthRule`), or Twilio's signature;
5. admission: a slot of the route's class (:class:`Admission`), each class with its own limit;
6. the row's endpoint: an HTTP endpoint answers; a WebSocket endpoint opens its adapter
   (:mod:`streamer.server.adapter`), which applies the limits of its protocol (frame sizes, idle timeout, audio rate)
   as a sans-I/O state machine, driven by the one connection runner (:mod:`streamer.server.runner`).

Adding an endpoint means adding a row and an endpoint class; the runner has no other way in, and nothing branches on
a route's name. The server's own rows are in :mod:`streamer.server.endpoints`; the table ``streamer serve`` serves,
with the integrations' rows, is assembled by the composition root (:mod:`streamer.app`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from streamer.core.errors import AtCapacity, ConfigError
from streamer.server.endpoint import Endpoint, HttpEndpoint, WebSocketEndpoint

__all__ = [
    "HTTP_POLICY",
    "SINGLE_HEADERS",
    "STREAM_POLICY",
    "Admission",
    "AdmissionGate",
    "AuthRule",
    "Route",
    "RouteMatch",
    "RoutePolicy",
    "RouteTable",
    "duplicated_header",
]

# request headers whose duplicates would let two parts of the stack read two different values (RFC 9110 section
# 5.3: a list-valued header may repeat, these may not): refused with HTTP 400 before anything reads them
SINGLE_HEADERS = ("Host", "Origin", "Authorization", "X-Twilio-Signature", "Sec-WebSocket-Key")


class AuthRule(StrEnum):
    """Which credentials a route takes when the server has API keys (with none configured, auth is off)."""

    # none: liveness, readiness, the page and its files (they hold no data)
    OPEN = "open"
    # an API key in ``Authorization: Bearer``: /v1/token (a token cannot buy another), /status
    API_KEY = "api_key"
    # an API key, or a token issued for this route (browsers cannot set headers on a WebSocket handshake)
    KEY_OR_TOKEN = "key_or_token"
    # Twilio's ``X-Twilio-Signature`` over the URL, when a Twilio auth token is configured (else open)
    TWILIO_SIGNATURE = "twilio_signature"


class Admission(StrEnum):
    """The admission class a connection takes a slot of; each has its own limit (``streamer serve`` options)."""

    # HTTP routes: answered at once, no slot
    NONE = "none"
    # audio streams: one slot of --max-sessions each, whatever the protocol, since each one costs engine time
    STREAM = "stream"
    # call-event followers: one slot of --max-followers each; they cost no engine time but a socket and a queue
    FOLLOWER = "follower"


@dataclass(frozen=True)
class RoutePolicy:
    """What the runner applies to every request on a route, in the order of the module docstring."""

    auth: AuthRule
    admission: Admission
    # refuse pages from origins outside the allow-list (every route a browser can reach)
    check_origin: bool = True
    # 503 until the model is loaded, and while draining
    needs_model: bool = False
    # the audio rate limit (--rate-limit-*) applies: every route that takes audio
    audio_rate_limit: bool = False
    # HTTP routes only: the request may carry a body of at most this many bytes (streamer.server.bodies; a longer
    # one is answered 413); 0: no body, as websockets' HTTP layer reads none
    max_body_bytes: int = 0


@dataclass(frozen=True)
class Route:
    """One endpoint: a path (literal, or with one ``{name}`` segment), its policy and the endpoint itself (an HTTP or
    a WebSocket one, :mod:`streamer.server.endpoint`). ``name`` labels logs and metrics; nothing branches on it."""

    name: str
    path: str
    policy: RoutePolicy
    endpoint: Endpoint
    _pattern: re.Pattern[str] = field(init=False, repr=False, compare=False)

    @property
    def websocket(self) -> bool:
        """Whether the route upgrades to a WebSocket (its endpoint is a :class:`WebSocketEndpoint`)."""
        return isinstance(self.endpoint, WebSocketEndpoint)

    def __post_init__(self) -> None:
        if not isinstance(self.endpoint, HttpEndpoint | WebSocketEndpoint):
            raise ConfigError(f"route {self.name}: its endpoint must be an HttpEndpoint or a WebSocketEndpoint")
        if not self.path.startswith("/"):
            raise ConfigError(f"route {self.name}: path must start with '/', not {self.path!r}")
        if self.policy.admission is Admission.NONE and self.websocket:
            raise ConfigError(f"route {self.name}: a WebSocket route needs an admission class")
        if self.policy.audio_rate_limit and self.policy.admission is not Admission.STREAM:
            raise ConfigError(f"route {self.name}: only stream routes take audio")
        if self.policy.max_body_bytes and self.websocket:
            raise ConfigError(f"route {self.name}: a WebSocket handshake has no body")
        parts = re.split(r"\{(\w+)\}", self.path)
        regex = "".join(
            re.escape(part) if index % 2 == 0 else f"(?P<{part}>[A-Za-z0-9][A-Za-z0-9_.-]{{0,63}})"
            for index, part in enumerate(parts)
        )
        object.__setattr__(self, "_pattern", re.compile(f"^{regex}$"))

    def match(self, path: str) -> dict[str, str] | None:
        """The path's parameters if ``path`` (without its query) is this route's, else None."""
        found = self._pattern.match(path)
        return found.groupdict() if found else None


@dataclass(frozen=True)
class RouteMatch:
    route: Route
    params: Mapping[str, str]


class RouteTable:
    """The rows, matched in order; names and paths are unique. The runner serves one table
    (:class:`streamer.server.serve.Server`'s ``routes``)."""

    def __init__(self, routes: Sequence[Route]) -> None:
        names = [r.name for r in routes]
        paths = [r.path for r in routes]
        for values, what in ((names, "name"), (paths, "path")):
            duplicates = sorted({v for v in values if values.count(v) > 1})
            if duplicates:
                raise ConfigError(f"route {what}s must be unique: {', '.join(duplicates)}")
        self.routes = tuple(routes)
        self._by_name = {r.name: r for r in routes}

    def __getitem__(self, name: str) -> Route:
        return self._by_name[name]

    @property
    def token_paths(self) -> frozenset[str]:
        """The routes a browser token can be issued for (``POST /v1/token?route=PATH``, the path as in the row)."""
        return frozenset(r.path for r in self.routes if r.policy.auth is AuthRule.KEY_OR_TOKEN)

    @property
    def stream_names(self) -> tuple[str, ...]:
        """The names of the routes whose connections take a stream slot (the ``route`` label of the session
        metrics)."""
        return tuple(r.name for r in self.routes if r.policy.admission is Admission.STREAM)

    def body_limit(self, path: str) -> int:
        """The most bytes a request to ``path`` may carry as its body (0: none; websockets refuses them)."""
        found = self.match(path)
        return 0 if found is None else found.route.policy.max_body_bytes

    def match(self, path: str) -> RouteMatch | None:
        for route in self.routes:
            params = route.match(path)
            if params is not None:
                return RouteMatch(route, params)
        return None


def duplicated_header(headers: Mapping[str, str] | object) -> str | None:
    """The first of :data:`SINGLE_HEADERS` that the request carries more than once, or None."""
    get_all = getattr(headers, "get_all", None)
    if get_all is None:
        return None
    for name in SINGLE_HEADERS:
        if len(get_all(name)) > 1:
            return name
    return None


class AdmissionGate:
    """Slots of one admission class that the runner does not hand to the scheduler (followers): ``limit`` at
    once; :meth:`admit` raises :class:`~streamer.core.errors.AtCapacity` (close 1013) past it."""

    def __init__(self, name: str, limit: int) -> None:
        self.name = name
        self.limit = limit
        self._held: set[str] = set()

    def __len__(self) -> int:
        return len(self._held)

    def admit(self, ticket: str, route: str = "") -> None:
        """Hold a slot for ``ticket`` (``route`` names the route asking, for the gates that count by route), or
        raise :class:`~streamer.core.errors.AtCapacity`."""
        if len(self._held) >= self.limit:
            raise AtCapacity(f"the server is at capacity ({self.limit} {self.name}); retry later")
        self._held.add(ticket)

    def release(self, ticket: str) -> None:
        """Idempotent."""
        self._held.discard(ticket)


# the policies most rows share: an open HTTP route, and an audio stream (credentials, model, slot, audio rate)
HTTP_POLICY = RoutePolicy(auth=AuthRule.OPEN, admission=Admission.NONE, check_origin=False)
STREAM_POLICY = RoutePolicy(
    auth=AuthRule.KEY_OR_TOKEN, admission=Admission.STREAM, needs_model=True, audio_rate_limit=True
)
