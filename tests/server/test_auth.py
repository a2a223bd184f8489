from __future__ import annotations

import contextlib
import json
import logging
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.http11 import Request
from websockets.typing import Subprotocol

from streamer.app import App
from streamer.core.errors import ConfigError, Unauthorized
from streamer.engine.fake import ScriptedEngine, words_from_text
from streamer.server import auth
from streamer.server.auth import ANONYMOUS, Authenticator, AuthOptions, OriginRefused, Principal, key_id
from streamer.server.serve import Server, ServerConfig

KEY = "k" * 8 + "-secret-0123"
OTHER_KEY = "another-key-abcdefgh"
OWNER = Principal(key_id(KEY))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def request(path: str = "/v1/listen", **headers: str) -> Request:
    return Request(path, Headers({k.replace("_", "-"): v for k, v in headers.items()}))


def authenticator(clock: Callable[[], float] | None = None, **options: Any) -> Authenticator:
    options.setdefault("api_keys", frozenset({KEY, OTHER_KEY}))
    return Authenticator(AuthOptions(**options), clock=clock or Clock())


# -- options --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"api_keys": frozenset({"short"})}, "at least 16"),
        ({"api_keys": frozenset({"a,b-0123456789abcdef"})}, "without spaces or commas"),
        ({"api_keys": frozenset({"has space 0123456789"})}, "without spaces or commas"),
        ({"token_secret": b"x" * 8}, "token_secret"),
        ({"token_ttl_s": 0}, "token_ttl_s"),
        ({"allowed_origins": ("example.com",)}, "allowed origin"),
        ({"allowed_origins": ("https://example.com/path",)}, "allowed origin"),
    ],
)
def test_options_validate_names_the_field_and_never_the_key(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        AuthOptions(**options).validate()
    for key in options.get("api_keys", ()):
        assert key not in str(caught.value)


def test_auth_is_off_without_keys_and_lets_everything_through() -> None:
    off = Authenticator(AuthOptions())
    assert not off.enabled
    off.check(request())
    off.check_api_key(Headers())
    off.check_origin(request(Origin="https://elsewhere.example"))


# -- API keys -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", [KEY, OTHER_KEY])
def test_bearer_key_is_accepted(key: str) -> None:
    authenticator().check(request(Authorization=f"Bearer {key}"))
    authenticator().check(request(Authorization=f"bearer   {key}  "))


@pytest.mark.parametrize(
    "header", [None, "Bearer", "Bearer ", f"Basic {KEY}", f"Bearer {KEY}x", f"Bearer {KEY[:-1]}", "Bearer \u00e9"]
)
def test_anything_but_a_configured_bearer_key_is_refused(header: str | None) -> None:
    headers = {} if header is None else {"Authorization": header}
    with pytest.raises(Unauthorized) as caught:
        authenticator().check(request(**headers))
    assert caught.value.close_code == 4401
    assert KEY not in caught.value.message


def test_deepgram_clients_present_keys_as_token_or_as_the_token_subprotocols() -> None:
    # Authorization: Token <key> (the Deepgram SDKs) and Sec-WebSocket-Protocol: token, <key> (its browser clients)
    assert authenticator().check(request(Authorization=f"Token {KEY}")) == OWNER
    assert authenticator().check_api_key(Headers({"Authorization": f"token {KEY}"})) == OWNER
    assert authenticator().check(request(Sec_WebSocket_Protocol=f"token, {KEY}")) == OWNER
    for refused in (f"token, {KEY}x", "token", f"{KEY}, token"):
        with pytest.raises(Unauthorized):
            authenticator().check(request(Sec_WebSocket_Protocol=refused))
    offered = [Subprotocol("token"), Subprotocol(KEY)]
    assert auth.select_token_subprotocol(offered) == "token"  # the scheme, never the key: the answer echoes it
    assert auth.select_token_subprotocol([Subprotocol("token")]) is None  # no key after it


def test_keys_are_compared_in_constant_time_against_every_key(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = auth.hmac.compare_digest

    def spy(a: Any, b: Any) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    authenticator().check(request(Authorization=f"Bearer {KEY}"))
    # both keys were compared, even though the first or second matched: no early exit that timing could reveal
    assert sorted(b for _a, b in calls) == sorted([KEY.encode(), OTHER_KEY.encode()])
    calls.clear()
    with pytest.raises(Unauthorized):
        authenticator().check(request(Authorization="Bearer wrong-wrong-wrong-wrong"))
    assert len(calls) == 2


# -- tokens ---------------------------------------------------------------------------------------------------------


def test_a_token_opens_one_stream_only() -> None:
    clock = Clock()
    a = authenticator(clock)
    token = a.issue_token(OWNER)
    a.check(request(Sec_WebSocket_Protocol=f"streamer.token.{token}"))
    with pytest.raises(Unauthorized):
        a.check(request(Sec_WebSocket_Protocol=f"streamer.token.{token}"))
    with pytest.raises(Unauthorized):
        a.check(request(f"/v1/listen?token={token}"))


def test_a_token_in_the_query_string_works_too() -> None:
    a = authenticator()
    a.check(request(f"/v1/listen?sample_rate=16000&token={a.issue_token(OWNER)}"))


async def redeem(a: Authenticator, token: str) -> Principal:
    """Present ``token`` as a browser does (its subprotocol) on ``/v1/listen``, through the server's own check."""
    return await a.authenticate(request(Sec_WebSocket_Protocol=f"streamer.token.{token}"))


async def test_tokens_expire_and_their_ids_are_forgotten_then() -> None:
    clock = Clock()
    a = authenticator(clock, token_ttl_s=60)
    late, used = a.issue_token(OWNER), a.issue_token(OWNER)
    await redeem(a, used)
    clock.now += 59
    fresh = a.issue_token(OWNER)
    clock.now += 1.0
    with pytest.raises(Unauthorized):
        await redeem(a, late)  # 60 s old
    await redeem(a, fresh)
    assert len(a._used) == 1  # the used id expired with its token: the memory stays bounded


async def test_tampered_forged_and_malformed_tokens_are_refused() -> None:
    clock = Clock()
    a = authenticator(clock)
    token = a.issue_token(OWNER)
    token_id, expires, scope, signature = token.split(".")
    forged_elsewhere = authenticator(clock).issue_token(OWNER)  # another secret
    flipped = signature[:-1] + ("A" if signature[-1] != "A" else "B")
    other_scope = a.issue_token(OWNER, "/v1/realtime").split(".")[2]
    for bad in [
        f"{token_id}.{int(expires) + 3600}.{scope}.{signature}",  # extended expiry
        f"{'0' * 16}.{expires}.{scope}.{signature}",  # another id
        f"{token_id}.{expires}.{other_scope}.{signature}",  # another route
        f"{token_id}.{expires}.{scope}.{flipped}",
        forged_elsewhere,
        "",
        "a.b",
        "a.b.c",
        "a.b.c.d.e",
        f"{token_id}.soon.{scope}.{signature}",
        token.upper(),
        token + "x" * 2000,
    ]:
        with pytest.raises(Unauthorized):
            await redeem(a, bad)
    assert await redeem(a, token) == OWNER  # the genuine one still works: failures use nothing up


def test_a_token_is_bound_to_its_route_and_origin_and_speaks_for_its_issuer() -> None:
    a = authenticator()
    listen = a.issue_token(OWNER)  # /v1/listen, from no origin
    with pytest.raises(Unauthorized):
        a.check(request("/v1/realtime", Sec_WebSocket_Protocol=f"streamer.token.{listen}"), "/v1/realtime")
    assert a.check(request(Sec_WebSocket_Protocol=f"streamer.token.{listen}"), "/v1/listen") == OWNER
    page = a.issue_token(OWNER, "/v1/listen", "https://app.example")
    with pytest.raises(Unauthorized):  # presented by a page of another site
        a.check(request(Sec_WebSocket_Protocol=f"streamer.token.{page}", Origin="https://evil.example"))
    with pytest.raises(Unauthorized):  # or with no origin at all
        a.check(request(Sec_WebSocket_Protocol=f"streamer.token.{page}"))
    # the refusals used nothing up: the page it was issued to can still use it
    assert a.check(request(Sec_WebSocket_Protocol=f"streamer.token.{page}", Origin="https://APP.example:443")) == OWNER


def test_token_expiry_is_wall_clock_utc() -> None:
    import time

    a = Authenticator(AuthOptions(api_keys=frozenset({KEY}), token_ttl_s=60))
    expires = int(a.issue_token(OWNER).split(".")[1])
    assert abs(expires - (time.time() + 60)) < 5  # Unix seconds, not the process's uptime clock


def test_keys_map_to_principals_and_admin_keys_see_everything() -> None:
    admin_key = "admin-key-0123456789"
    a = authenticator(admin_keys=frozenset({admin_key}))
    mine = a.check_api_key(Headers({"Authorization": f"Bearer {KEY}"}))
    theirs = a.check_api_key(Headers({"Authorization": f"Bearer {OTHER_KEY}"}))
    admin = a.check_api_key(Headers({"Authorization": f"Bearer {admin_key}"}))
    assert mine == OWNER and KEY not in mine.key_id and len(mine.key_id) == 12
    assert mine.owns(mine) and not mine.owns(theirs) and not theirs.owns(mine)
    assert admin.admin and admin.owns(mine) and admin.owns(theirs)
    assert Authenticator(AuthOptions()).check_api_key(Headers()) is ANONYMOUS


async def test_a_shared_secret_lets_another_process_redeem_tokens() -> None:
    secret = b"s" * 32
    clock = Clock()
    token = authenticator(clock, token_secret=secret).issue_token(OWNER)
    assert await redeem(authenticator(clock, token_secret=secret), token) == OWNER


def test_tokens_are_legal_subprotocol_names() -> None:
    token = authenticator().issue_token(OWNER)
    # RFC 9110 tchar, what Sec-WebSocket-Protocol values are made of
    tchar = set("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    assert set(token) <= tchar
    assert auth.select_token_subprotocol([Subprotocol("chat"), Subprotocol(f"streamer.token.{token}")]) == (
        f"streamer.token.{token}"
    )
    assert auth.select_token_subprotocol([Subprotocol("chat")]) is None


def test_a_token_cannot_buy_another_token() -> None:
    a = authenticator()
    with pytest.raises(Unauthorized):
        a.check_api_key(Headers({"Authorization": f"Bearer {a.issue_token(OWNER)}"}))


def test_openai_browser_subprotocols_carry_a_key_and_realtime_is_selected() -> None:
    a = authenticator()
    offered = f"realtime, openai-insecure-api-key.{KEY}, openai-beta.realtime-v1"
    assert a.check(request("/v1/realtime", Sec_WebSocket_Protocol=offered), "/v1/realtime") == OWNER
    for bad in ("realtime, openai-insecure-api-key.wrong-wrong-wrong-wrong", "realtime, openai-insecure-api-key."):
        with pytest.raises(Unauthorized):
            a.check(request("/v1/realtime", Sec_WebSocket_Protocol=bad), "/v1/realtime")
    key_protocol = Subprotocol(f"openai-insecure-api-key.{KEY}")
    assert auth.select_token_subprotocol([Subprotocol("realtime"), key_protocol]) == "realtime"
    assert auth.select_token_subprotocol([key_protocol]) is None  # never echo the key back


def test_a_token_presented_where_the_key_goes_opens_its_route_once() -> None:
    """OpenAI's ephemeral keys: the SDK sends them as the API key (Bearer, or the browser subprotocol)."""
    a = authenticator()
    for present in ("Authorization", "Sec-WebSocket-Protocol"):
        token = a.issue_token(OWNER, "/v1/realtime")
        headers = {"Authorization": f"Bearer {token}"} if present == "Authorization" else {}
        if present == "Sec-WebSocket-Protocol":
            headers["Sec-WebSocket-Protocol"] = f"realtime, openai-insecure-api-key.{token}"
        with pytest.raises(Unauthorized):  # another route
            a.check(Request("/v1/listen", Headers(headers)), "/v1/listen")
        assert a.check(Request("/v1/realtime", Headers(headers)), "/v1/realtime") == OWNER
        with pytest.raises(Unauthorized):  # used up
            a.check(Request("/v1/realtime", Headers(headers)), "/v1/realtime")


def test_a_token_for_any_origin_still_expires_and_is_bound_to_its_route() -> None:
    clock = Clock()
    a = authenticator(clock)
    token = a.issue_token(OWNER, "/v1/realtime", ttl_s=30, any_origin=True)
    assert auth.token_expiry(token) == 1030
    assert a.check(
        request("/v1/realtime", Authorization=f"Bearer {token}", Origin="https://app.example"), "/v1/realtime"
    )
    late = a.issue_token(OWNER, "/v1/realtime", ttl_s=30, any_origin=True)
    clock.now += 30
    with pytest.raises(Unauthorized):
        a.check(request("/v1/realtime", Authorization=f"Bearer {late}"), "/v1/realtime")
    # a token bound to no origin is not one for any origin
    plain = a.issue_token(OWNER, "/v1/realtime")
    with pytest.raises(Unauthorized):
        a.check(request("/v1/realtime", Authorization=f"Bearer {plain}", Origin="https://app.example"), "/v1/realtime")


def test_the_openai_key_subprotocol_is_redacted_in_logs() -> None:
    record = logging.LogRecord("websockets.server", logging.DEBUG, "", 0, "< Sec-WebSocket-Protocol: %s", None, None)
    record.args = (f"realtime, openai-insecure-api-key.{KEY}",)
    auth.RedactCredentials().filter(record)
    assert KEY not in record.getMessage() and "openai-insecure-api-key.[redacted]" in record.getMessage()


# -- origins --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("allowed", "keys", "origin", "host", "ok"),
    [
        ((), True, None, "h:1", True),  # not a browser
        ((), False, "https://evil.example", "h:1", True),  # auth off, no list: any origin
        ((), True, "http://h:1", "h:1", True),  # auth on, no list: same origin only
        ((), True, "http://H:1", "h:1", True),
        ((), True, "https://h", "h:443", True),  # default port
        ((), True, "http://evil.example", "h:1", False),
        ((), True, "http://h:2", "h:1", False),
        ((), True, "null", "h:1", False),
        (("https://app.example",), True, "https://app.example", "h:1", True),
        (("https://app.example",), True, "https://app.example:443", "h:1", True),
        (("https://app.example",), False, "https://evil.example", "h:1", False),  # a list binds even with auth off
        (("https://app.example",), True, "http://app.example", "h:1", False),  # scheme matters
        (("https://app.example",), True, "http://h:1", "h:1", False),  # the list replaces same-origin
        (("*",), True, "https://evil.example", "h:1", True),
    ],
)
def test_origin_rules(allowed: tuple[str, ...], keys: bool, origin: str | None, host: str, ok: bool) -> None:
    a = Authenticator(AuthOptions(api_keys=frozenset({KEY}) if keys else frozenset(), allowed_origins=allowed))
    headers = {"Host": host} | ({} if origin is None else {"Origin": origin})
    if ok:
        a.check_origin(request(**headers))
    else:
        with pytest.raises(OriginRefused):
            a.check_origin(request(**headers))


# -- through the server ---------------------------------------------------------------------------------------------


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    config = ServerConfig(port=0, auth=AuthOptions(api_keys=frozenset({KEY})))
    async with App(config, ScriptedEngine(words_from_text("hello world", 0, 16000, 800))) as srv:
        yield srv


def http(srv: Server, path: str, method: str = "GET", **headers: str) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(f"http://127.0.0.1:{srv.port}{path}", method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=5) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, dict(error.headers), error.read()


async def first_message_and_close(url: str, **kwargs: Any) -> tuple[dict[str, Any], int | None, str | None]:
    async with ws_connect(url, **kwargs) as ws:
        message = json.loads(await ws.recv())
        if message["type"] == "ready":
            await ws.send('{"type": "end"}')
        with contextlib.suppress(ConnectionClosed):
            await ws.recv()
        return message, ws.close_code, ws.subprotocol


async def test_listen_without_credentials_gets_unauthorized_then_4401(server: Server) -> None:
    message, code, _ = await first_message_and_close(f"ws://127.0.0.1:{server.port}/v1/listen")
    assert message == {"type": "error", "code": "unauthorized", "message": "missing or invalid credentials"}
    assert code == 4401


async def test_listen_with_a_bearer_key_is_ready(server: Server) -> None:
    url = f"ws://127.0.0.1:{server.port}/v1/listen"
    message, _, _ = await first_message_and_close(url, additional_headers={"Authorization": f"Bearer {KEY}"})
    assert message["type"] == "ready"


async def test_token_endpoint_then_subprotocol_then_reuse_refused(server: Server) -> None:
    status, headers, _ = await _http(server, "/v1/token", "POST")
    assert status == 401 and headers["WWW-Authenticate"] == "Bearer"
    status, _, _ = await _http(server, "/v1/token", "GET", Authorization=f"Bearer {KEY}")
    assert status == 405
    status, headers, body = await _http(server, "/v1/token", "POST", Authorization=f"Bearer {KEY}")
    assert status == 200 and headers["Cache-Control"] == "no-store"
    answer = json.loads(body)
    assert answer["expires_in"] == 60
    subprotocol = Subprotocol(f"streamer.token.{answer['token']}")
    url = f"ws://127.0.0.1:{server.port}/v1/listen?sample_rate=16000"
    message, _, selected = await first_message_and_close(url, subprotocols=[subprotocol])
    assert message["type"] == "ready"
    assert selected == subprotocol  # browsers fail the connection unless the server selects what they offered
    message, code, _ = await first_message_and_close(url, subprotocols=[subprotocol])
    assert (message["code"], code) == ("unauthorized", 4401)


async def test_a_foreign_origin_is_refused_at_the_handshake(server: Server) -> None:
    url = f"ws://127.0.0.1:{server.port}/v1/listen"
    with pytest.raises(InvalidStatus) as caught:
        await first_message_and_close(url, origin="https://evil.example")  # type: ignore[arg-type]
    assert caught.value.response.status_code == 403
    status, _, _ = await _http(server, "/v1/token", "POST", Authorization=f"Bearer {KEY}", Origin="https://x.example")
    assert status == 403


async def test_keys_and_tokens_never_reach_the_log(server: Server, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    url = f"ws://127.0.0.1:{server.port}/v1/listen"
    await first_message_and_close(url, additional_headers={"Authorization": f"Bearer {KEY}"})
    await first_message_and_close(url, additional_headers={"Authorization": "Bearer wrong-key-wrong-key-1"})
    _, _, body = await _http(server, "/v1/token", "POST", Authorization=f"Bearer {KEY}")
    token = json.loads(body)["token"]
    await first_message_and_close(url, subprotocols=[Subprotocol(f"streamer.token.{token}")])
    await first_message_and_close(f"{url}?token={token}")
    await first_message_and_close(url, subprotocols=[Subprotocol("token"), Subprotocol(KEY)])
    # what the server logged (the test's own client logs its headers too)
    logged = "\n".join(r.getMessage() for r in caplog.records if not r.name.startswith("websockets.client"))
    assert "Authorization: Bearer [redacted]" in logged  # websockets did log the headers
    for secret in (KEY, "wrong-key-wrong-key-1", token.split(".")[2]):
        assert secret not in logged


async def _http(srv: Server, path: str, method: str = "GET", **headers: str) -> tuple[int, dict[str, str], bytes]:
    import asyncio

    return await asyncio.to_thread(http, srv, path, method, **headers)


async def test_a_token_in_the_query_string_opens_a_stream(server: Server) -> None:
    _, _, body = await _http(server, "/v1/token", "POST", Authorization=f"Bearer {KEY}")
    token = json.loads(body)["token"]
    url = f"ws://127.0.0.1:{server.port}/v1/listen?sample_rate=16000&token={token}&encoding=pcm_s16le"
    message, _, _ = await first_message_and_close(url)
    assert message["type"] == "ready"  # the session's query parser skips the token


def test_replicas_sharing_the_token_secret_accept_each_others_tokens() -> None:
    shared = AuthOptions(api_keys=frozenset({KEY}), token_secret=b"s" * 32)
    one, other = auth.Authenticator(shared), auth.Authenticator(shared)
    stranger = auth.Authenticator(AuthOptions(api_keys=frozenset({KEY})))
    token = one.issue_token(auth.Principal(auth.key_id(KEY)), auth.DEFAULT_TOKEN_ROUTE, "")
    assert other.verify_token(token, auth.DEFAULT_TOKEN_ROUTE, "").principal.key_id == auth.key_id(KEY)
    with pytest.raises(Unauthorized):
        stranger.verify_token(token, auth.DEFAULT_TOKEN_ROUTE, "")
    with pytest.raises(ConfigError, match="token_secret"):
        AuthOptions(api_keys=frozenset({KEY}), token_secret=b"short").validate()
