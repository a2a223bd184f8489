"""``/v1/calls/{callSid}/events`` (:mod:`streamer.integrations.call_events`): a read-only follower of one call, served
by a real server whose call hub the tests publish to directly (the Twilio side is tested in test_twilio_session.py)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from streamer.app import App
from streamer.engine.fake import ScriptedEngine
from streamer.integrations.call_centre import CallCentreOptions
from streamer.integrations.call_events import CALL_EVENTS_PATH, CallEventsSession, call_sid_from_path
from streamer.integrations.hub import CallEvent, CallEventType, CallHub, HubOptions
from streamer.server.adapter import LOST, Close
from streamer.server.serve import Server, ServerConfig
from tests.helpers import WORDS, until

T = CallEventType


@pytest.mark.parametrize(
    ("path", "call_sid"),
    [
        ("/v1/calls/CA0123abcd/events", "CA0123abcd"),
        ("/v1/calls/call-42_a.b/events", "call-42_a.b"),  # dashes, underscores and dots after the first character
        ("/v1/calls/" + "C" * 64 + "/events", "C" * 64),
        ("/v1/calls/" + "C" * 65 + "/events", None),  # 64 characters at most
        ("/v1/calls//events", None),
        ("/v1/calls/-CA1/events", None),  # starts with a letter or digit
        ("/v1/calls/CA1/events/more", None),
        ("/v1/calls/CA%2F1/events", None),
        ("/v1/calls/CA1", None),
        ("/v1/listen", None),
    ],
)
def test_call_sid_from_path(path: str, call_sid: str | None) -> None:
    assert call_sid_from_path(path) == call_sid


def test_the_documented_path_is_one_it_serves() -> None:
    assert call_sid_from_path(CALL_EVENTS_PATH.format(call_sid="CA1")) == "CA1"


# -- the adapter alone: frames, events and `now` in, frames and a close out ------------------------------------------


def adapter(hub: CallHub, call_sid: str = "CA1", now: float = 0.0) -> CallEventsSession:
    return CallEventsSession(hub, call_sid, now)


def test_the_adapter_forwards_the_call_s_events_then_closes_1000_after_call_ended() -> None:
    hub = CallHub()
    follower = adapter(hub)
    woken: list[int] = []
    follower.wakeup = lambda: woken.append(1)
    hub.publish(CallEvent(T.CALL_STARTED, "CA1"))
    hub.publish(final("CA1", "hello"))
    assert woken  # the runner is told there is something to send
    assert [json.loads(f)["type"] for f in follower.messages_to_send(1.0, limit=1)] == ["call_started"]
    assert follower.close_action() is None
    hub.publish(CallEvent(T.CALL_ENDED, "CA1"))
    assert [json.loads(f)["type"] for f in follower.messages_to_send(2.0)] == ["final", "call_ended"]
    assert follower.close_action() == Close(1000, "call ended") and not follower.reading
    assert hub.subscribers("CA1") == 0


def test_a_late_adapter_starts_with_the_history() -> None:
    hub = CallHub()
    hub.publish(CallEvent(T.CALL_STARTED, "CA1"))
    hub.publish(CallEvent(T.PARTIAL, "CA1", track="inbound", text="he"))
    hub.publish(final("CA1", "hello"))
    follower = adapter(hub)
    assert [json.loads(f)["seq"] for f in follower.messages_to_send(0.0)] == [1, 3]


@pytest.mark.parametrize("frame", ["hello", b"\0"])
def test_any_frame_from_the_follower_is_bad_message_4400(frame: str | bytes) -> None:
    hub = CallHub()
    follower = adapter(hub)
    if isinstance(frame, str):
        follower.receive_text(frame, 1.0)
    else:
        follower.receive_bytes(frame, 1.0)
    [error] = [json.loads(f) for f in follower.messages_to_send(1.0)]
    assert (error["type"], error["code"]) == ("error", "bad_message") and "read-only" in error["message"]
    assert follower.close_action() == Close(4400, "bad_message")
    assert hub.subscribers("CA1") == 0


def test_the_idle_timeout_counts_from_the_last_event() -> None:
    hub = CallHub(HubOptions(follower_idle_timeout=30.0))
    follower = adapter(hub, now=100.0)
    assert follower.next_deadline() == 130.0
    follower.receive_timer(129.0)  # early: nothing happens
    hub.publish(CallEvent(T.CALL_STARTED, "CA1"))
    follower.messages_to_send(129.0)
    assert follower.next_deadline() == 159.0
    follower.receive_timer(159.0)
    [error] = [json.loads(f) for f in follower.messages_to_send(159.0)]
    assert error["code"] == "idle_timeout" and "30 s" in error["message"]
    assert follower.close_action() == Close(4408, "idle_timeout") and follower.next_deadline() is None


def test_an_event_waiting_for_a_slow_follower_is_not_idleness() -> None:
    hub = CallHub(HubOptions(follower_idle_timeout=30.0))
    follower = adapter(hub)
    hub.publish(CallEvent(T.CALL_STARTED, "CA1"))
    follower.receive_timer(30.0)
    assert follower.close_action() is None and follower.next_deadline() == 60.0


def test_a_follower_that_falls_behind_gets_slow_reader_and_4408_without_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    hub = CallHub(HubOptions(subscriber_queue=2))
    follower = adapter(hub)
    hub.publish(CallEvent(T.CALL_STARTED, "CA1"))
    for i in range(3):
        hub.publish(final("CA1", f"w{i}"))
    [error] = [json.loads(f) for f in follower.messages_to_send(1.0)]
    assert error["code"] == "slow_reader"
    assert follower.close_action() == Close(4408, "slow_reader")
    assert "event=follower_overflow call=CA1" in caplog.text


def test_shutdown_sends_what_is_queued_then_shutting_down_and_1001() -> None:
    hub = CallHub()
    follower = adapter(hub)
    hub.publish(CallEvent(T.CALL_STARTED, "CA1"))
    follower.receive_shutdown(5.0)
    assert [json.loads(f)["type"] for f in follower.messages_to_send(5.0)] == ["call_started", "error"]
    assert follower.close_action() == Close(1001, "shutting_down")
    follower.receive_shutdown(6.0)  # once is enough
    assert follower.messages_to_send(6.0) == []


def test_a_follower_that_leaves_is_unsubscribed_and_done() -> None:
    hub = CallHub()
    follower = adapter(hub)
    follower.receive_connection_lost(1.0)
    assert follower.close_action() == LOST and hub.subscribers("CA1") == 0
    follower.release()  # idempotent
    assert hub.subscribers("CA1") == 0


# -- over a real server ---------------------------------------------------------------------------------------------


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    # a small follower queue, so that a follower can be made to fall behind
    options = CallCentreOptions(hub=HubOptions(subscriber_queue=4))
    async with App(ServerConfig(port=0), ScriptedEngine(WORDS), call_centre=options) as srv:
        yield srv


def hub(srv: App) -> CallHub:
    return srv.call_centre.hub


async def follow(srv: Server, call_sid: str) -> ClientConnection:
    """A follower of ``call_sid``, returned once the server has subscribed it (it misses no live event)."""
    ws = await ws_connect(f"ws://127.0.0.1:{srv.port}{CALL_EVENTS_PATH.format(call_sid=call_sid)}")
    await until(lambda: hub(srv).subscribers(call_sid) == 1)
    return ws


async def read_all(ws: ClientConnection) -> list[dict[str, Any]]:
    """Every frame until the server closes (30 s at most: a hang guard)."""
    messages = []
    try:
        async with asyncio.timeout(30):
            async for frame in ws:
                messages.append(json.loads(frame))
    except ConnectionClosed:
        pass
    return messages


def publish(srv: Server, *events: CallEvent) -> list[CallEvent]:
    return [hub(srv).publish(event) for event in events]


def final(call_sid: str, text: str) -> CallEvent:
    return CallEvent(T.FINAL, call_sid, track="inbound", label="customer", text=text, start=0.0, end=1.0)


async def test_a_follower_gets_every_live_event_in_order_then_close_1000(server: Server) -> None:
    ws = await follow(server, "CA1")
    sent = publish(
        server,
        CallEvent(T.CALL_STARTED, "CA1", data={"tracks": {"inbound": "customer"}}),
        CallEvent(T.PARTIAL, "CA1", track="inbound", label="customer", segment_id=0, text="hel"),
        final("CA1", "hello"),
        CallEvent(T.CALL_ENDED, "CA1", data={"reason": "stopped"}),
    )
    received = await read_all(ws)
    assert received == [event.to_dict() for event in sent]
    assert [m["seq"] for m in received] == [1, 2, 3, 4]
    assert (ws.close_code, ws.close_reason) == (1000, "call ended")
    await until(lambda: hub(server).subscribers("CA1") == 0)


async def test_a_late_follower_gets_the_finals_so_far_then_the_live_events(server: Server) -> None:
    publish(
        server,
        CallEvent(T.CALL_STARTED, "CA2"),
        CallEvent(T.PARTIAL, "CA2", track="inbound", text="on"),  # superseded: not history
        final("CA2", "one"),
    )
    ws = await follow(server, "CA2")
    publish(server, final("CA2", "two"), CallEvent(T.CALL_ENDED, "CA2"))
    received = await read_all(ws)
    assert [(m["type"], m["seq"], m.get("text")) for m in received] == [
        ("call_started", 1, None),
        ("final", 3, "one"),
        ("final", 4, "two"),
        ("call_ended", 5, None),
    ]
    assert ws.close_code == 1000


async def test_a_follower_of_an_ended_call_gets_its_history_and_1000(server: Server) -> None:
    publish(server, CallEvent(T.CALL_STARTED, "CA3"), final("CA3", "bye"), CallEvent(T.CALL_ENDED, "CA3"))
    async with ws_connect(f"ws://127.0.0.1:{server.port}/v1/calls/CA3/events") as ws:
        received = await read_all(ws)
    assert [m["type"] for m in received] == ["call_started", "final", "call_ended"]
    assert ws.close_code == 1000


async def test_a_follower_that_sends_anything_gets_bad_message_and_4400(server: Server) -> None:
    ws = await follow(server, "CA4")
    await ws.send("hello")
    received = await read_all(ws)
    assert [(m["type"], m["code"]) for m in received] == [("error", "bad_message")]
    assert "read-only" in received[0]["message"]
    assert (ws.close_code, ws.close_reason) == (4400, "bad_message")
    await until(lambda: hub(server).subscribers("CA4") == 0)


async def test_a_follower_that_falls_behind_is_cut_with_slow_reader_and_4408(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="streamer.integrations.call_events")
    ws = await follow(server, "CA5")
    # more must-deliver events than the follower's queue holds, published before it can take any
    publish(server, CallEvent(T.CALL_STARTED, "CA5"), *(final("CA5", f"w{i}") for i in range(8)))
    received = await read_all(ws)
    assert received[-1]["type"] == "error" and received[-1]["code"] == "slow_reader"
    assert (ws.close_code, ws.close_reason) == (4408, "slow_reader")
    assert "event=follower_overflow call=CA5" in caplog.text
    await until(lambda: hub(server).subscribers("CA5") == 0)
    # the call goes on for everyone else
    publish(server, CallEvent(T.CALL_ENDED, "CA5"))


async def test_a_follower_that_leaves_is_unsubscribed(server: Server) -> None:
    ws = await follow(server, "CA6")
    await ws.close()
    await until(lambda: hub(server).subscribers("CA6") == 0 and not server.sessions)  # and its handler returned


async def test_shutdown_tells_the_follower_and_closes_1001() -> None:
    srv = App(ServerConfig(port=0), ScriptedEngine(WORDS))
    await srv.start()
    ws = await follow(srv, "CA7")
    publish(srv, CallEvent(T.CALL_STARTED, "CA7"))
    await srv.shutdown()
    received = await read_all(ws)
    assert [m["type"] for m in received] == ["call_started", "error"]
    assert received[-1]["code"] == "shutting_down"
    assert ws.close_code == 1001
