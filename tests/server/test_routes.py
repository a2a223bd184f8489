"""The front door: one route table, and one runner applying each row's policy to every endpoint (issue 14)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from http import HTTPStatus
from typing import Any

import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.http11 import Request, Response

from streamer.app import App
from streamer.core.errors import AtCapacity, ConfigError
from streamer.engine.fake import ScriptedEngine
from streamer.integrations.call_centre import CallCentreOptions
from streamer.integrations.hub import HubOptions
from streamer.server.auth import AuthOptions
from streamer.server.bodies import RequestBody
from streamer.server.endpoint import HttpEndpoint, text_response
from streamer.server.endpoints import SERVER_ROUTES, Listen, Liveness
from streamer.server.routes import STREAM_POLICY, Admission, AdmissionGate, AuthRule, Route, RoutePolicy, RouteTable
from streamer.server.serve import Server, ServerConfig
from tests.helpers import WORDS, chunks, pcm16, speech, until

KEY = "route-key-0123456789"
OTHER_KEY = "other-key-0123456789"
ADMIN_KEY = "admin-key-0123456789"
WEBSOCKET_PATHS = ("/v1/listen", "/v1/realtime", "/twilio", "/v1/calls/CA1/events")


def keyed(**changes: Any) -> ServerConfig:
    auth = AuthOptions(api_keys=frozenset({KEY, OTHER_KEY}), admin_keys=frozenset({ADMIN_KEY}))
    return replace(ServerConfig(port=0, auth=auth), **changes)


async def raw_http(port: int, request: str) -> tuple[int, list[tuple[str, str]]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request.encode())
    await writer.drain()
    raw = await reader.read()
    writer.close()
    head = raw.decode("latin-1").partition("\r\n\r\n")[0]
    status_line, *lines = head.split("\r\n")
    headers = [(k.strip().lower(), v.strip()) for k, _, v in (line.partition(":") for line in lines)]
    return int(status_line.split()[1]), headers


# -- the table ------------------------------------------------------------------------------------------------------


def test_a_route_cannot_be_made_without_a_fitting_policy_and_endpoint() -> None:
    with pytest.raises(TypeError):
        Route("new", "/v1/new", STREAM_POLICY)  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match="must be an HttpEndpoint or a WebSocketEndpoint"):
        Route("new", "/v1/new", STREAM_POLICY, object())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="needs an admission class"):
        Route("new", "/v1/new", RoutePolicy(AuthRule.OPEN, Admission.NONE), Listen())
    with pytest.raises(ConfigError, match="only stream routes take audio"):
        Route("new", "/v1/new", RoutePolicy(AuthRule.OPEN, Admission.FOLLOWER, audio_rate_limit=True), Listen())
    with pytest.raises(ConfigError, match="has no body"):
        Route("new", "/v1/new", replace(STREAM_POLICY, max_body_bytes=10), Listen())
    policy = RoutePolicy(AuthRule.OPEN, Admission.NONE)
    with pytest.raises(ConfigError, match="unique"):
        RouteTable([Route("a", "/a", policy, Liveness()), Route("a", "/b", policy, Liveness())])


def test_the_servers_own_table_has_its_own_endpoints_and_the_page_last() -> None:
    names = [r.name for r in SERVER_ROUTES.routes]
    assert names == ["healthz", "readyz", "metrics", "status", "token", "listen", "page", "page_file"]
    assert SERVER_ROUTES.token_paths == {"/v1/listen"} and SERVER_ROUTES.stream_names == ("listen",)
    assert SERVER_ROUTES["listen"].websocket and not SERVER_ROUTES["status"].websocket


class Hello(HttpEndpoint):
    """An endpoint a later layer adds: a row and this class, nothing else."""

    def respond(self, server: Server, request: Request, body: RequestBody) -> Response:
        return text_response(HTTPStatus.OK, f"hello, {len(server.sessions)} sessions")


async def test_a_new_endpoint_is_a_row_and_a_class_and_gets_its_rows_policy() -> None:
    table = RouteTable(
        [*SERVER_ROUTES.routes[:-2], Route("hello", "/hello", RoutePolicy(AuthRule.OPEN, Admission.NONE), Hello())]
    )
    config = keyed(auth=AuthOptions(api_keys=frozenset({KEY}), allowed_origins=("https://app.example",)))
    async with Server(config, ScriptedEngine(WORDS), routes=table) as srv:
        status, _ = await raw_http(srv.port, "GET /hello HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert status == 200
        # the row's policy, not the class, refuses a foreign page
        origin = "Origin: https://evil.example\r\n"
        status, _ = await raw_http(srv.port, f"GET /hello HTTP/1.1\r\nHost: localhost\r\n{origin}\r\n")
        assert status == 403
        # a table without the page's rows answers 404 for what it does not have
        status, _ = await raw_http(srv.port, "GET /index.html HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert status == 404


def test_an_admission_gate_holds_its_limit() -> None:
    gate = AdmissionGate("followers", 2)
    gate.admit("a")
    gate.admit("b")
    with pytest.raises(AtCapacity, match=r"at capacity \(2 followers\)"):
        gate.admit("c")
    gate.release("a")
    gate.release("a")  # idempotent
    gate.admit("c")
    assert len(gate) == 2


# -- the runner, over a real server -----------------------------------------------------------------------------------


@pytest.mark.parametrize("header", ["Host", "Origin", "Authorization"])
async def test_duplicated_headers_are_refused_with_400_not_a_traceback(
    header: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with App(keyed(), ScriptedEngine(WORDS)) as srv:
        for path in ("/v1/listen", "/v1/realtime", "/status"):
            lines = {"Host": "localhost", "Origin": "http://localhost", "Authorization": f"Bearer {KEY}"}
            extra = f"{header}: {lines[header]}-again\r\n"
            head = "".join(f"{k}: {v}\r\n" for k, v in lines.items())
            upgrade = "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            status, _ = await raw_http(
                srv.port, f"GET {path} HTTP/1.1\r\n{head}{extra}{upgrade}Sec-WebSocket-Version: 13\r\n\r\n"
            )
            assert status == 400, path
    assert "Traceback" not in caplog.text


@pytest.mark.parametrize("path", WEBSOCKET_PATHS)
async def test_a_foreign_origin_is_refused_on_every_websocket_route(path: str) -> None:
    config = keyed(auth=AuthOptions(api_keys=frozenset({KEY}), allowed_origins=("https://app.example",)))
    async with App(config, ScriptedEngine(WORDS)) as srv:
        url = f"ws://127.0.0.1:{srv.port}{path}"
        with pytest.raises(InvalidStatus) as refused:
            async with ws_connect(url, origin="https://evil.example"):  # type: ignore[arg-type]
                pass
        assert refused.value.response.status_code == 403


async def test_metrics_has_one_content_type() -> None:
    async with App(ServerConfig(port=0), ScriptedEngine(WORDS)) as srv:
        status, headers = await raw_http(srv.port, "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
    assert status == 200
    assert [v for k, v in headers if k == "content-type"] == ["text/plain; version=0.0.4; charset=utf-8"]


async def test_followers_take_slots_of_their_own_and_idle_out() -> None:
    hub = HubOptions(max_followers=2, follower_idle_timeout=0.2)
    async with App(ServerConfig(port=0), ScriptedEngine(WORDS), call_centre=CallCentreOptions(hub=hub)) as srv:
        url = f"ws://127.0.0.1:{srv.port}/v1/calls/CA1/events"
        async with ws_connect(url) as first, ws_connect(url) as second:
            await until(lambda: len(srv.gates[Admission.FOLLOWER]) == 2)
            async with ws_connect(url) as third:  # past --max-followers: error, then 1013
                message = json.loads(await third.recv())
                assert message["code"] == "at_capacity" and "2 followers" in message["message"]
                with pytest.raises(ConnectionClosed):
                    await third.recv()
                assert third.close_code == 1013
            # a follower whose call never says anything is closed, and gives its slot back
            for follower in (first, second):
                message = json.loads(await follower.recv())
                assert message["code"] == "idle_timeout"
                with pytest.raises(ConnectionClosed):
                    await follower.recv()
                assert follower.close_code == 4408
        await until(lambda: len(srv.gates[Admission.FOLLOWER]) == 0)
        # streams are not counted against followers, nor followers against streams
        assert srv.scheduler is not None and srv.scheduler.active_sessions == 0


async def test_a_browser_token_opens_only_the_route_it_was_issued_for() -> None:
    async with App(keyed(), ScriptedEngine(WORDS)) as srv:
        token = srv.authenticator.issue_token(srv.authenticator.check_api_key(_bearer(KEY)), "/v1/listen")
        url = f"ws://127.0.0.1:{srv.port}/v1/calls/CA1/events?token={token}"
        async with ws_connect(url) as ws:
            message = json.loads(await ws.recv())
            with pytest.raises(ConnectionClosed):
                await ws.recv()
        assert message["code"] == "unauthorized" and ws.close_code == 4401
        # the same token still opens the stream it is for (the refusal used nothing up)
        url = f"ws://127.0.0.1:{srv.port}/v1/listen?token={token}"
        async with ws_connect(url) as ws:
            assert json.loads(await ws.recv())["type"] == "ready"


def _bearer(key: str) -> Any:
    from websockets.datastructures import Headers

    return Headers({"Authorization": f"Bearer {key}"})


async def _open_and_drop(port: int, key: str) -> str:
    """Open a stream with ``key``, send some audio, and drop the connection without a close: the id to resume."""
    ws = await ws_connect(f"ws://127.0.0.1:{port}/v1/listen", additional_headers={"Authorization": f"Bearer {key}"})
    ready = json.loads(await ws.recv())
    for chunk in chunks(pcm16(speech()[:32000])):
        await ws.send(chunk)
    ws.transport.abort()  # a dropped connection, not a close: the session parks
    return str(ready["session_id"])


async def test_a_session_belongs_to_the_key_that_opened_it() -> None:
    async with App(keyed(), ScriptedEngine(WORDS)) as srv:
        session_id = await _open_and_drop(srv.port, KEY)
        await until(lambda: session_id in srv.resumable)
        # another key's holder cannot resume it: answered as if it did not exist, and it stays parked
        url = f"ws://127.0.0.1:{srv.port}/v1/listen?resume={session_id}&last_seq=0"
        async with ws_connect(url, additional_headers={"Authorization": f"Bearer {OTHER_KEY}"}) as ws:
            message = json.loads(await ws.recv())
            with pytest.raises(ConnectionClosed):
                await ws.recv()
        assert message["code"] == "unknown_session" and ws.close_code == 4404
        assert session_id in srv.resumable
        # its owner can
        async with ws_connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
            ready = json.loads(await ws.recv())
            assert ready["type"] == "ready" and ready["resumed"] and ready["session_id"] == session_id


async def test_status_shows_a_caller_only_its_own_sessions_unless_admin() -> None:
    async with App(keyed(), ScriptedEngine(WORDS)) as srv:
        headers = {"Authorization": f"Bearer {KEY}"}
        async with ws_connect(f"ws://127.0.0.1:{srv.port}/v1/listen", additional_headers=headers) as mine:
            mine_id = json.loads(await mine.recv())["session_id"]

            async def seen(key: str) -> list[str]:
                request = f"GET /status HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {key}\r\n\r\n"
                reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
                writer.write(request.encode())
                body = (await reader.read()).decode().partition("\r\n\r\n")[2]
                writer.close()
                return [s["id"] for s in json.loads(body)["sessions"]]

            assert await seen(KEY) == [mine_id]
            assert await seen(OTHER_KEY) == []
            assert await seen(ADMIN_KEY) == [mine_id]
