"""Shared state between replicas (:mod:`streamer.server.redis_link`): single-use tokens over both implementations, and
Redis trouble that is no outage, against a real redis-server that the tests stop, restart and pause."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Any

from websockets.asyncio.client import connect as ws_connect

from streamer.app import App
from streamer.engine.fake import ScriptedEngine
from streamer.server.auth import AuthOptions, Principal, key_id
from streamer.server.redis_link import LocalOnce, RedisLink, RedisOnce, RedisOptions
from streamer.server.serve import ServerConfig
from tests.helpers import WORDS, chunks, config, http_get, pcm16, speech, until
from tests.redis_server import RedisProcess

KEY = "k" * 24
SECRET = b"s" * 32


def with_auth(base: ServerConfig) -> ServerConfig:
    return replace(base, auth=AuthOptions(api_keys=frozenset({KEY}), token_secret=SECRET))


async def first_message(port: int, token: str) -> tuple[dict[str, Any], int | None]:
    async with ws_connect(f"ws://127.0.0.1:{port}/v1/listen", subprotocols=[f"streamer.token.{token}"]) as ws:  # type: ignore[list-item]
        message = json.loads(await ws.recv())
        await ws.close()
    return message, ws.close_code


# -- tokens: the same test over both implementations --------------------------------------------------------------


async def test_a_token_opens_one_stream_on_one_replica_or_across_all_with_redis(shared: str | None) -> None:
    options = with_auth(config(shared))
    async with App(options, ScriptedEngine(WORDS)) as one, App(options, ScriptedEngine(WORDS)) as other:
        if one.redis is not None:
            await until(lambda: one.redis is not None and one.redis.up and other.redis is not None and other.redis.up)
        token = one.authenticator.issue_token(Principal(key_id(KEY)))
        opened, _ = await first_message(one.port, token)
        assert opened["type"] == "ready"
        again, code = await first_message(one.port, token)  # the same replica: refused, with or without Redis
        assert again["code"] == "unauthorized" and code == 4401
        elsewhere, code = await first_message(other.port, token)
        if shared is None:  # in-process: each replica remembers only its own redemptions
            assert elsewhere["type"] == "ready"
        else:
            assert elsewhere["code"] == "unauthorized" and code == 4401


async def test_once_is_once_until_the_key_expires(shared: str | None) -> None:
    clock = [1000.0]
    local = LocalOnce(lambda: clock[0])
    if shared is None:
        once: LocalOnce | RedisOnce = local
    else:
        link = RedisLink(RedisOptions(url=shared))
        await link.start()
        await until(lambda: link.up)
        once = RedisOnce(link, "test", local)
    expires = time.time() + 60
    assert await once.first("a", expires) is True
    assert await once.first("a", expires) is False
    assert await once.first("b", expires) is True
    clock[0] = expires + 1  # the in-process memory forgets expired keys (Redis expires them itself: EXAT)
    assert local.first_now("a", expires + 100) is True
    if shared is not None:
        await link.stop()


# -- Redis trouble is not an outage --------------------------------------------------------------------------------


def redis_config(url: str, **redis: Any) -> ServerConfig:
    base = config(resume_grace_seconds=30.0)
    return replace(base, redis=RedisOptions(url=url, command_timeout=0.3, retry_seconds=0.05, **redis))


async def stream_to_done(port: int, seconds: int = 4) -> list[dict[str, Any]]:
    async with ws_connect(f"ws://127.0.0.1:{port}/v1/listen", max_queue=None) as ws:
        for frame in chunks(pcm16(speech()))[: seconds * 10]:
            await ws.send(frame)
        await ws.send('{"type":"end"}')
        messages = [json.loads(m) async for m in ws]
    assert ws.close_code == 1000
    return messages


def metric(text: str, name: str) -> float:
    [line] = [line for line in text.splitlines() if line.startswith(name + " ")]
    return float(line.split()[1])


async def test_redis_down_keeps_serving_says_so_and_recovers_by_itself(redis_process: RedisProcess) -> None:
    async with App(redis_config(redis_process.url), ScriptedEngine(WORDS)) as srv:
        link = srv.redis
        assert link is not None
        await until(lambda: link.up)
        status, _, body = await http_get(srv.port, "/readyz")
        assert status == 200 and "redis up" in body
        # 1. A stream is open when Redis dies; it goes on, and a new one opens and finishes too.
        ws = await ws_connect(f"ws://127.0.0.1:{srv.port}/v1/listen", max_queue=None)
        session_id = json.loads(await ws.recv())["session_id"]
        frames = chunks(pcm16(speech()))
        for frame in frames[:30]:
            await ws.send(frame)
        redis_process.stop()
        for frame in frames[30:60]:
            await ws.send(frame)
        await until(lambda: not link.up)  # a write failed: the link knows
        assert [m for m in await stream_to_done(srv.port) if m["type"] == "final"]
        status, _, body = await http_get(srv.port, "/readyz")
        assert status == 200 and "redis down" in body  # still ready: this is no outage
        _, _, exposition = await http_get(srv.port, "/metrics")
        assert metric(exposition, "streamer_redis_up") == 0.0
        assert metric(exposition, "streamer_redis_failures_total") >= 1
        # 2. Redis is back (empty: it kept nothing): the link finds it, and the open session's record is written again.
        redis_process.start()
        await until(lambda: link.up)
        await until(lambda: link.settled)
        for frame in frames[60:70]:
            await ws.send(frame)
        await until(lambda: redis_process.command("EXISTS", f"streamer:session:{session_id}") == b":1\r\n")
        status, _, body = await http_get(srv.port, "/readyz")
        assert "redis up" in body
        await ws.send('{"type":"end"}')
        assert json.loads([m async for m in ws][-1])["type"] == "done"


async def test_a_slow_redis_never_holds_the_audio_path(redis_process: RedisProcess) -> None:
    async with App(redis_config(redis_process.url), ScriptedEngine(WORDS)) as srv:
        link = srv.redis
        assert link is not None
        await until(lambda: link.up)
        redis_process.pause()  # SIGSTOP: connections stay open, nothing is answered
        try:
            # the stream is served in full while Redis answers nothing; the link gives up on it after its timeout
            messages = await stream_to_done(srv.port)
            assert [m for m in messages if m["type"] == "final"] and messages[-1]["type"] == "done"
            await until(lambda: not link.up)
            status, _, body = await http_get(srv.port, "/readyz")
            assert status == 200 and "redis down" in body
        finally:
            redis_process.resume()
        await until(lambda: link.up)


async def test_writes_beyond_the_queue_are_dropped_and_counted(redis_process: RedisProcess) -> None:
    link = RedisLink(RedisOptions(url=redis_process.url, queue=3, command_timeout=0.3, retry_seconds=0.05))
    await link.start()
    await until(lambda: link.up)
    written: list[int] = []

    def write(n: int) -> Any:
        async def run(client: Any) -> None:
            await client.set(f"n{n}", n)
            written.append(n)

        return run

    redis_process.pause()
    try:
        accepted = [link.submit(write(n)) for n in range(10)]
        assert accepted.count(False) >= 6 and link.dropped >= 6  # the queue holds 3 (and one may be in flight)
        await until(lambda: not link.up)
    finally:
        redis_process.resume()
    await until(lambda: link.up)
    await until(lambda: link.settled)
    assert link.dropped + len(written) == 10  # each write either made or counted
    await link.stop()
