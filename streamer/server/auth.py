"""Who may open a stream: API keys, short-lived browser tokens, and the Origin allow-list.

Credentials, checked by :meth:`Authenticator.check` in this order:

1. An API key: ``Authorization: Bearer <api key>`` (servers, scripts, the Python client), or as Deepgram's clients
   present it (:mod:`streamer.integrations.deepgram`), ``Authorization: Token <api key>`` or, from browsers, the two
   subprotocols ``token, <api key>`` (the server then selects ``token``), or as OpenAI's Realtime documentation has
   browsers offer it, the subprotocols ``realtime, openai-insecure-api-key.<api key>`` (the server then selects
   ``realtime``). Keys are compared with :func:`hmac.compare_digest` against every configured key, so the time taken
   says nothing about how much of a key matched, and a key is never logged or echoed. A presented "key" that is none
   of the keys is tried as a token (below): OpenAI's ephemeral keys (``POST /v1/realtime/client_secrets``) are
   tokens that clients present where the API key goes.
2. A token issued by :meth:`Authenticator.issue_token` (``POST /v1/token`` with the API key). Browsers cannot set
   headers on a WebSocket handshake, so the page offers the token as the subprotocol ``streamer.token.<token>``
   (``Sec-WebSocket-Protocol``; the server must select that subprotocol in its answer, see
   :func:`select_token_subprotocol`) or, failing that, as ``?token=<token>`` in the query string. Tokens are
   HMAC-SHA256-signed, expire after ``token_ttl_s`` (wall-clock UTC, so that any replica sharing the secret agrees),
   are single-use (their ids are remembered until they expire, by every replica with Redis), and are bound to what
   they were issued for: one route (``/v1/listen`` unless the issuing request named another), the ``Origin`` of the
   page that asked (if any), and the key that paid for them, whose holder then owns the session the token opens.
   A client secret minted by a request without an ``Origin`` (a back end, which hands it to a page) is bound to any
   origin the route's origin rule lets in (``"o": "*"``).

Token format (every character is legal in an HTTP token, RFC 9110 section 5.6.2, hence in a subprotocol name)::

    <id: 16 hex>.<expiry: Unix seconds>.<scope: base64url JSON {"r": route, "o": origin, "k": key id}>.<mac>

where ``mac`` is the base64url HMAC-SHA256 of everything before it.

Every credential maps to a :class:`Principal`: the key's id (the first 12 hex digits of its SHA-256, never the key)
or the id of the key that issued the token. Sessions belong to the principal that opened them: only it can resume
them or see them on ``/status``, unless it holds an admin key (``--admin-key``), which sees every session.

The Origin rule (:meth:`Authenticator.check_origin`), which stops other web sites from opening streams from a
visitor's browser (cross-site WebSocket hijacking):

- no ``Origin`` header: allowed (not a browser, or a same-origin GET, which browsers send without one);
- ``allowed_origins`` not empty: the origin must be one of them exactly (scheme, host and port, e.g.
  ``https://app.example.com``), or the list holds ``*``;
- ``allowed_origins`` empty and auth off: any origin (a loopback development server);
- ``allowed_origins`` empty and auth on: same origin only, i.e. the origin's host and port equal the ``Host`` header.

Sans-I/O apart from the clock, which is an argument (``clock``) so that tests can move time.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import itertools
import json
import logging
import re
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import NewType
from urllib.parse import parse_qsl, urlsplit

from websockets.datastructures import Headers
from websockets.http11 import Request, Response
from websockets.typing import Subprotocol

from streamer.core.errors import ConfigError, Unauthorized
from streamer.server.redis_link import LocalOnce, Once
from streamer.server.static import http_response

__all__ = [
    "ADMIN_KEYS_ENV",
    "ANONYMOUS",
    "API_KEYS_ENV",
    "KEY_SCHEMES",
    "OPENAI_KEY_SUBPROTOCOL_PREFIX",
    "OPENAI_SUBPROTOCOL",
    "TOKEN_PATH",
    "TOKEN_SECRET_ENV",
    "TOKEN_SUBPROTOCOL_PREFIX",
    "AuthOptions",
    "Authenticator",
    "IssueRefusal",
    "OriginRefused",
    "Principal",
    "RedactCredentials",
    "TokenGrant",
    "TokenId",
    "is_loopback",
    "redacted_logger",
    "request_origin",
    "select_token_subprotocol",
    "subprotocol_key",
    "token_expiry",
    "token_from_request",
    "token_issuer",
    "token_response",
]

# the HTTP route that trades an API key for a token
TOKEN_PATH = "/v1/token"
# environment variable holding comma-separated API keys for `streamer serve` (added to --api-key)
API_KEYS_ENV = "STREAMER_API_KEYS"
# environment variable holding comma-separated admin keys (added to --admin-key): API keys that see every session
ADMIN_KEYS_ENV = "STREAMER_ADMIN_KEYS"
# environment variable holding the secret that signs browser tokens (at least 32 bytes): replicas that share it
# accept each other's tokens; without it each process draws its own
TOKEN_SECRET_ENV = "STREAMER_TOKEN_SECRET"
# subprotocol a browser offers to carry its token: "streamer.token.<token>"
TOKEN_SUBPROTOCOL_PREFIX = "streamer.token."
# OpenAI's browser subprotocols: "realtime" (selected in the answer) and "openai-insecure-api-key.<key>"
OPENAI_SUBPROTOCOL = "realtime"
OPENAI_KEY_SUBPROTOCOL_PREFIX = "openai-insecure-api-key."
# the scope origin of a token valid from any origin the route's origin rule allows (client secrets from a back end)
_ANY_ORIGIN = "*"
# the query parameter that may carry a token instead (it shows up in access logs: prefer the subprotocol)
TOKEN_QUERY_PARAMETER = "token"
# Authorization schemes that carry an API key: Bearer, and Deepgram's Token (its SDKs send "Token <key>")
KEY_SCHEMES = ("bearer", "token")
# shortest API key accepted: 16 characters of anything is about as strong as a 96-bit random secret
MIN_KEY_LENGTH = 16

TokenId = NewType("TokenId", str)
# the route a token is for when the issuing request names none
DEFAULT_TOKEN_ROUTE = "/v1/listen"


@dataclass(frozen=True)
class Principal:
    """Who opened a connection: the id of the API key it presented or that issued its token."""

    # the key's id (12 hex of its SHA-256), or "anonymous" with auth off
    key_id: str
    # holds an admin key: sees every session on /status
    admin: bool = False

    def owns(self, owner: Principal) -> bool:
        """Whether this principal may act on what ``owner`` opened (resume it, see it)."""
        return self.admin or self.key_id == owner.key_id


@dataclass(frozen=True)
class TokenGrant:
    """A genuine token, not yet used up: :meth:`Authenticator.verify_token`'s answer."""

    # whom the stream it opens belongs to: the key that paid for the token
    principal: Principal
    token_id: TokenId
    # Unix seconds: past this the token is refused anyway, so its id need not be remembered longer
    expires: float


# with auth off there is nobody to tell apart: every connection is the same principal and sees everything
ANONYMOUS = Principal("anonymous", admin=True)


def key_id(key: str) -> str:
    """A key's public id: the first 12 hex digits of its SHA-256 (logs and ownership name keys by it)."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:12]


# every refusal says the same: which check failed is for the server log, not for the client
_REFUSED = "missing or invalid credentials"


class OriginRefused(Unauthorized):
    """The ``Origin`` of a browser request is not allowed (answered with HTTP 403 at the handshake)."""


@dataclass(frozen=True)
class AuthOptions:
    """Authentication settings. Auth is on when :attr:`api_keys` is not empty. Validated in :meth:`validate`."""

    # keys accepted as "Authorization: Bearer <key>" and to issue tokens; empty = auth off
    api_keys: frozenset[str] = frozenset()
    # API keys that also see every session on /status (each is accepted everywhere as an API key too)
    admin_keys: frozenset[str] = frozenset()
    # secret signing the tokens; None = a random one per Authenticator (tokens then die with the process)
    token_secret: bytes | None = None
    # seconds a token stays valid after it is issued (it must open a stream within that time; once is enough)
    token_ttl_s: int = 60
    # origins (scheme://host[:port]) whose pages may open streams, or "*"; empty = see the module docstring
    allowed_origins: tuple[str, ...] = ()

    @property
    def enabled(self) -> bool:
        return bool(self.api_keys or self.admin_keys)

    def validate(self) -> None:
        """Raise :class:`~streamer.core.errors.ConfigError` naming the first invalid field (never showing a key)."""
        for key in self.api_keys | self.admin_keys:
            if len(key) < MIN_KEY_LENGTH:
                raise ConfigError(f"API keys must be at least {MIN_KEY_LENGTH} characters long")
            if not key.isascii() or not key.isprintable() or any(c.isspace() or c == "," for c in key):
                raise ConfigError("API keys must be printable ASCII without spaces or commas")
        if self.token_secret is not None and len(self.token_secret) < 32:
            raise ConfigError("token_secret must be at least 32 bytes")
        if not 1 <= self.token_ttl_s <= 3600:
            raise ConfigError("token_ttl_s must be between 1 and 3600 seconds")
        for origin in self.allowed_origins:
            if origin != "*" and _normal_origin(origin) is None:
                raise ConfigError(f"allowed origin must look like https://host[:port] or be '*', not {origin!r}")


@dataclass
class Authenticator:
    """Checks the credentials and the origin of requests; issues and redeems tokens.

    One per server. :meth:`check` raises :class:`~streamer.core.errors.Unauthorized` (close 4401) and
    :meth:`check_origin` raises :class:`OriginRefused`; both say nothing to the client about which check failed.
    """

    options: AuthOptions
    # Unix seconds (UTC): token expiry is wall-clock, so replicas sharing the secret agree on it
    clock: Callable[[], float] = time.time
    # the ids of redeemed tokens until they expire, across replicas with Redis (streamer.server.redis_link.RedisOnce)
    # or in this process: a token opens one stream only
    tokens: Once | None = None
    _used: LocalOnce = field(init=False, repr=False)
    _secret: bytes = field(default=b"", init=False, repr=False)

    def __post_init__(self) -> None:
        self.options.validate()
        self._secret = self.options.token_secret or secrets.token_bytes(32)
        self._used = LocalOnce(self.clock)

    @property
    def enabled(self) -> bool:
        return self.options.enabled

    # -- tokens -----------------------------------------------------------------------------------------------------

    def issue_token(
        self,
        principal: Principal,
        route: str = DEFAULT_TOKEN_ROUTE,
        origin: str | None = None,
        ttl_s: int | None = None,
        any_origin: bool = False,
    ) -> str:
        """A new token for one stream on ``route``, from pages of ``origin`` (None: requests without an Origin;
        ``any_origin``: whichever the route's origin rule lets in), valid for ``ttl_s`` seconds (``token_ttl_s`` by
        default; :func:`token_expiry` reads it back), opening sessions owned by ``principal``. Call only for a
        caller who passed :meth:`check_api_key`."""
        token_id = secrets.token_hex(8)
        expires = int(self.clock()) + (self.options.token_ttl_s if ttl_s is None else ttl_s)
        bound = _ANY_ORIGIN if any_origin else origin or ""
        scope = json.dumps({"r": route, "o": bound, "k": principal.key_id}, separators=(",", ":"))
        payload = f"{token_id}.{expires}.{base64.urlsafe_b64encode(scope.encode()).rstrip(b'=').decode('ascii')}"
        return f"{payload}.{self._sign(payload)}"

    def verify_token(self, token: str, route: str = DEFAULT_TOKEN_ROUTE, origin: str | None = None) -> TokenGrant:
        """What ``token`` grants on ``route`` from ``origin``, without using it up: raise
        :class:`~streamer.core.errors.Unauthorized` if it is malformed, forged, expired, or issued for another route
        or origin. The caller redeems it next (it is single-use)."""
        now = self.clock()
        parts = token.split(".")
        if len(parts) != 4 or not parts[1].isdigit() or len(token) > 1024:
            raise Unauthorized(_REFUSED)
        token_id, expires_text, scope_text, signature = parts
        if not hmac.compare_digest(self._sign(f"{token_id}.{expires_text}.{scope_text}"), signature):
            raise Unauthorized(_REFUSED)
        scope = _decode_scope(scope_text)
        if scope is None or scope["r"] != route:
            raise Unauthorized(_REFUSED)
        if scope["o"] != _ANY_ORIGIN and scope["o"] != (_normal_origin(origin or "") or ""):
            raise Unauthorized(_REFUSED)
        expires = float(expires_text)
        if now >= expires:
            raise Unauthorized(_REFUSED)
        return TokenGrant(Principal(scope["k"]), TokenId(token_id), expires)

    def _sign(self, payload: str) -> str:
        digest = hmac.new(self._secret, payload.encode("ascii", "replace"), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")

    # -- requests ---------------------------------------------------------------------------------------------------

    def check_api_key(self, headers: Headers) -> Principal:
        """The principal of ``Authorization: Bearer <key>`` or ``Token <key>`` (:data:`ANONYMOUS` with auth off);
        raise :class:`~streamer.core.errors.Unauthorized` without a configured key. Tokens are not accepted here (a
        token cannot buy another)."""
        if not self.enabled:
            return ANONYMOUS
        key = _bearer(headers)
        principal = None if key is None else self._principal(key)
        if principal is None:
            raise Unauthorized(_REFUSED)
        return principal

    def check(self, request: Request, route: str = DEFAULT_TOKEN_ROUTE) -> Principal:
        """The principal of the request's API key, or of an unused token issued for ``route`` and the request's
        ``Origin`` (which it then uses up in this process); :data:`ANONYMOUS` with auth off. Raise
        :class:`~streamer.core.errors.Unauthorized` otherwise. Call once per stream, after :meth:`check_origin`."""
        credential = self._credential(request, route)
        if not isinstance(credential, TokenGrant):
            return credential
        if not self._used.first_now(credential.token_id, credential.expires):
            raise Unauthorized(_REFUSED)
        return credential.principal

    async def authenticate(self, request: Request, route: str = DEFAULT_TOKEN_ROUTE) -> Principal:
        """:meth:`check`, a token being used up on every replica that shares :attr:`tokens` (Redis ``SET NX``; this
        process alone while Redis is down or slow, see :mod:`streamer.server.redis_link`)."""
        credential = self._credential(request, route)
        if not isinstance(credential, TokenGrant):
            return credential
        first = (
            self._used.first_now(credential.token_id, credential.expires)
            if self.tokens is None
            else await self.tokens.first(credential.token_id, credential.expires)
        )
        if not first:
            raise Unauthorized(_REFUSED)
        return credential.principal

    def _credential(self, request: Request, route: str) -> Principal | TokenGrant:
        if not self.enabled:
            return ANONYMOUS
        key = _bearer(request.headers) or subprotocol_key(request.headers)
        if key is not None:
            principal = self._principal(key)
            if principal is not None:
                return principal
            # not a key: an ephemeral key (a client secret) is a token presented where the key goes
            return self.verify_token(key, route, request.headers.get("Origin"))
        token = token_from_request(request)
        if token is None:
            raise Unauthorized(_REFUSED)
        return self.verify_token(token, route, request.headers.get("Origin"))

    def _principal(self, key: str) -> Principal | None:
        if self._is_key(key, self.options.admin_keys):
            return Principal(key_id(key), admin=True)
        if self._is_key(key, self.options.api_keys):
            return Principal(key_id(key))
        return None

    @staticmethod
    def _is_key(candidate: str, keys: frozenset[str]) -> bool:
        # compare with every key, without stopping at a match, so the time does not depend on which one matched
        given = candidate.encode("utf-8", "replace")
        matched = False
        for key in keys:
            matched |= hmac.compare_digest(given, key.encode("utf-8"))
        return matched

    def check_origin(self, request: Request) -> None:
        """Raise :class:`OriginRefused` if the request's ``Origin`` breaks the rule of the module docstring."""
        origin = request.headers.get("Origin")
        if origin is None:
            return
        allowed = self.options.allowed_origins
        if "*" in allowed:
            return
        normal = _normal_origin(origin)
        if allowed:
            if normal is not None and normal in {_normal_origin(a) for a in allowed}:
                return
            raise OriginRefused("origin not allowed")
        if not self.enabled:
            return
        host = request.headers.get("Host")
        if normal is not None and host is not None and urlsplit(normal).netloc == _normal_host(normal, host):
            return
        raise OriginRefused("origin not allowed")


# ---------------------------------------------------------------------------------------------------------------------
# Helpers


def select_token_subprotocol(offered: Sequence[Subprotocol]) -> Subprotocol | None:
    """The subprotocol to select in the handshake answer: the token one the client offered, or the scheme of a key
    offered as ``token, <key>`` (Deepgram's browser clients), or OpenAI's ``realtime`` (offered beside
    ``openai-insecure-api-key.<key>``), if any. Browsers fail the connection when they offered subprotocols and the
    server selects none of them (RFC 6455 section 4.1)."""
    for index, subprotocol in enumerate(offered):
        if subprotocol.startswith(TOKEN_SUBPROTOCOL_PREFIX):
            return subprotocol
        if subprotocol.lower() in KEY_SCHEMES and index + 1 < len(offered):
            return subprotocol  # never the key: the answer would echo it
    return Subprotocol(OPENAI_SUBPROTOCOL) if OPENAI_SUBPROTOCOL in offered else None


def token_expiry(token: str) -> int:
    """When a token :meth:`Authenticator.issue_token` made expires, in Unix seconds (its second field)."""
    return int(token.split(".")[1])


def _offered_subprotocols(headers: Headers) -> list[str]:
    return [value.strip() for header in headers.get_all("Sec-WebSocket-Protocol") for value in header.split(",")]


def subprotocol_key(headers: Headers) -> str | None:
    """An API key offered as the subprotocols ``token, <key>`` (or ``bearer, <key>``), as Deepgram's browser clients
    do: the subprotocol after the scheme; or as ``openai-insecure-api-key.<key>``, as OpenAI's Realtime browser
    clients do. None when there is none."""
    offered = _offered_subprotocols(headers)
    for scheme, key in itertools.pairwise(offered):
        if scheme.lower() in KEY_SCHEMES and key:
            return key
    for value in offered:
        if value.startswith(OPENAI_KEY_SUBPROTOCOL_PREFIX) and len(value) > len(OPENAI_KEY_SUBPROTOCOL_PREFIX):
            return value[len(OPENAI_KEY_SUBPROTOCOL_PREFIX) :]
    return None


def token_from_request(request: Request) -> str | None:
    """The token offered as a ``streamer.token.*`` subprotocol, else as the ``token`` query parameter, else None."""
    for value in _offered_subprotocols(request.headers):
        if value.startswith(TOKEN_SUBPROTOCOL_PREFIX):
            return value[len(TOKEN_SUBPROTOCOL_PREFIX) :]
    for key, value in parse_qsl(urlsplit(request.path).query):
        if key == TOKEN_QUERY_PARAMETER:
            return value
    return None


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` serves this machine only (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve to anything


def _bearer(headers: Headers) -> str | None:
    """The API key of ``Authorization: Bearer <key>`` or ``Token <key>`` (:data:`KEY_SCHEMES`), or None."""
    value = headers.get("Authorization")
    if value is None:
        return None
    scheme, _, credentials = value.partition(" ")
    if scheme.lower() not in KEY_SCHEMES or not credentials.strip():
        return None
    return credentials.strip()


def _decode_scope(text: str) -> dict[str, str] | None:
    """A token's scope ({"r": route, "o": origin, "k": key id}), or None if it is not one (the MAC already
    matched, so this only guards against tokens of an older format)."""
    try:
        scope = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(scope, dict) or not all(isinstance(scope.get(k), str) for k in ("r", "o", "k")):
        return None
    return {k: scope[k] for k in ("r", "o", "k")}


def _normal_origin(origin: str) -> str | None:
    """``scheme://host[:port]`` in lower case, without a default port; None if ``origin`` is not one."""
    try:
        parts = urlsplit(origin.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
        return None
    if parts.query or parts.fragment or parts.username or parts.password:
        return None
    host = parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    default = 443 if parts.scheme == "https" else 80
    return f"{parts.scheme}://{host}" if port in (None, default) else f"{parts.scheme}://{host}:{port}"


def _normal_host(origin: str, host: str) -> str:
    """The ``Host`` header in the form :func:`_normal_origin` gives netlocs: lower case, default port dropped."""
    host = host.strip().lower()
    default = ":443" if origin.startswith("https:") else ":80"
    return host.removesuffix(default)


# ---------------------------------------------------------------------------------------------------------------------
# The token route


@dataclass(frozen=True)
class IssueRefusal:
    """Why a route that issues tokens refuses the request: its HTTP status, error code, message and headers (each
    route answers in its own shape)."""

    status: HTTPStatus
    code: str
    message: str
    headers: Mapping[str, str] = field(default_factory=dict)


def token_issuer(authenticator: Authenticator, request: Request) -> Principal | IssueRefusal:
    """The steps every route that issues tokens takes (``/v1/token``, ``/v1/realtime/client_secrets``): POST (405),
    the requesting page's origin (403), an API key, never a token (401). The principal that pays for the token, or
    why not. With auth off: :data:`ANONYMOUS`."""
    if request.method != "POST":
        return IssueRefusal(HTTPStatus.METHOD_NOT_ALLOWED, "bad_request", "use POST", {"Allow": "POST"})
    try:
        authenticator.check_origin(request)
        return authenticator.check_api_key(request.headers)
    except OriginRefused as refusal:
        return IssueRefusal(HTTPStatus.FORBIDDEN, refusal.code, refusal.message)
    except Unauthorized as refusal:
        return IssueRefusal(HTTPStatus.UNAUTHORIZED, refusal.code, refusal.message, {"WWW-Authenticate": "Bearer"})


def request_origin(request: Request) -> str | None:
    """The request's ``Origin`` as tokens are bound to it (scheme, host, port), or None."""
    return _normal_origin(request.headers.get("Origin") or "")


def token_response(authenticator: Authenticator, request: Request, token_routes: frozenset[str]) -> Response:
    """Answer ``POST /v1/token[?route=/v1/realtime]`` (``Authorization: Bearer <api key>``, no body) with
    ``{"token": ..., "expires_in": seconds, "route": path}``: a token for one stream on that route (one of
    ``token_routes``; ``/v1/listen`` by default) from the requesting page's origin. 400 for another route, 401
    without a valid key, 403 from a refused origin, 404 when auth is off, 405 for another method."""
    if request.method == "POST" and not authenticator.enabled:
        return _json_error(HTTPStatus.NOT_FOUND, "auth_off", "authentication is off; connect without a token")
    principal = token_issuer(authenticator, request)
    if isinstance(principal, IssueRefusal):
        return _json_error(principal.status, principal.code, principal.message, principal.headers)
    route = dict(parse_qsl(urlsplit(request.path).query)).get("route", DEFAULT_TOKEN_ROUTE)
    if route not in token_routes:
        choices = ", ".join(sorted(token_routes))
        return _json_error(HTTPStatus.BAD_REQUEST, "bad_request", f"tokens are issued for {choices}, not {route!r}")
    token = authenticator.issue_token(principal, route, request_origin(request))
    body = {"token": token, "expires_in": authenticator.options.token_ttl_s, "route": route}
    return http_response(HTTPStatus.OK, json.dumps(body).encode(), "application/json", _NO_STORE)


_NO_STORE = {"Cache-Control": "no-store"}


def _json_error(status: HTTPStatus, code: str, message: str, headers: Mapping[str, str] | None = None) -> Response:
    body = json.dumps({"type": "error", "code": code, "message": message}).encode()
    return http_response(status, body, "application/json", {**_NO_STORE, **(headers or {})})


# ---------------------------------------------------------------------------------------------------------------------
# Logs


class RedactCredentials(logging.Filter):
    """Blank out API keys and tokens in log records: websockets logs every request header and the request line at
    DEBUG level (``streamer serve -vv``), which would otherwise write ``Authorization: Bearer <key>`` to the log."""

    _PATTERNS = (
        (re.compile(r"(?i)(authorization:\s*\S+\s+)\S+"), r"\1[redacted]"),
        (re.compile(re.escape(TOKEN_SUBPROTOCOL_PREFIX) + r"[^\s,]+"), TOKEN_SUBPROTOCOL_PREFIX + "[redacted]"),
        # a key offered as the subprotocols "token, <key>" (Deepgram's browser clients)
        (re.compile(r"(?i)(sec-websocket-protocol:[^\n]*?\b(?:token|bearer)\s*,\s*)[^\s,]+"), r"\1[redacted]"),
        (re.compile(r"([?&]" + TOKEN_QUERY_PARAMETER + r"=)[^&\s]+"), r"\1[redacted]"),
        (
            re.compile(re.escape(OPENAI_KEY_SUBPROTOCOL_PREFIX) + r"[^\s,]+"),
            OPENAI_KEY_SUBPROTOCOL_PREFIX + "[redacted]",
        ),
    )

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = message
        for pattern, replacement in self._PATTERNS:
            redacted = pattern.sub(replacement, redacted)
        if redacted != message:
            record.msg, record.args = redacted, None
        return True


def redacted_logger(name: str = "websockets.server") -> logging.Logger:
    """The logger ``name`` with :class:`RedactCredentials` on it (added once): give it to websockets' ``serve``."""
    logger = logging.getLogger(name)
    if not any(isinstance(f, RedactCredentials) for f in logger.filters):
        logger.addFilter(RedactCredentials())
    return logger
