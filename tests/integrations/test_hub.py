"""The call hub, in-process (:class:`CallHub`) and across replicas (:class:`RedisCallHub`): every test runs over both
implementations through the ``shared`` fixture; with Redis, hubs made by ``hubs`` are replicas sharing one
redis-server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from streamer.core.errors import InvalidState
from streamer.integrations.hub import CallEvent, CallEventType, CallHub, HubOptions, SubscriberOverflow
from streamer.integrations.hub_redis import RedisCallHub
from streamer.server.redis_link import RedisLink, RedisOptions
from tests.helpers import until

T = CallEventType

MakeHub = Callable[..., Awaitable[CallHub]]


@pytest.fixture
async def hubs(shared: str | None) -> AsyncIterator[MakeHub]:
    """``await hubs(options)``: a hub of a replica of its own (over the shared Redis, if any)."""
    made: list[tuple[CallHub, RedisLink | None]] = []

    async def make(options: HubOptions | None = None) -> CallHub:
        options = options or HubOptions()
        if shared is None:
            hub = CallHub(options)
            made.append((hub, None))
            return hub
        link = RedisLink(RedisOptions(url=shared, retry_seconds=0.05))
        await link.start()
        await until(lambda: link.up)
        redis_hub = RedisCallHub(options, link)
        made.append((redis_hub, link))
        return redis_hub

    yield make
    for hub, link in made:
        if isinstance(hub, RedisCallHub):
            await hub.close()
        if link is not None:
            await link.stop()


def event(kind: CallEventType, text: str | None = None, call: str = "CA1") -> CallEvent:
    return CallEvent(kind, call, track="inbound", label="customer", text=text)


async def drain(subscription: object) -> list[CallEvent]:
    return [e async for e in subscription]  # type: ignore[attr-defined]


async def test_live_subscriber_gets_everything_in_order_then_stops(hubs: MakeHub) -> None:
    hub = await hubs()
    sub = hub.subscribe("CA1")  # before the call starts: waits for it
    hub.publish(CallEvent(T.CALL_STARTED, "CA1"))
    hub.publish(event(T.PARTIAL, "hel"))
    hub.publish(event(T.FINAL, "hello"))
    hub.publish(CallEvent(T.CALL_ENDED, "CA1"))
    events = await drain(sub)
    assert [e.type for e in events] == [T.CALL_STARTED, T.PARTIAL, T.FINAL, T.CALL_ENDED]
    assert [e.seq for e in events] == [1, 2, 3, 4]
    assert events[2].to_dict() == {
        "type": "final",
        "call_sid": "CA1",
        "seq": 3,
        "track": "inbound",
        "label": "customer",
        "text": "hello",
    }


async def test_late_subscriber_gets_the_finals_so_far_then_live(hubs: MakeHub) -> None:
    hub = await hubs()
    hub.publish(CallEvent(T.CALL_STARTED, "CA1"))
    hub.publish(event(T.PARTIAL, "on"))
    hub.publish(event(T.FINAL, "one"))
    sub = hub.subscribe("CA1")
    hub.publish(event(T.FINAL, "two"))
    hub.publish(CallEvent(T.CALL_ENDED, "CA1"))
    assert [e.text for e in await drain(sub) if e.type is T.FINAL] == ["one", "two"]
    # after the end, the history is still there
    assert [e.type for e in await drain(hub.subscribe("CA1"))] == [T.CALL_STARTED, T.FINAL, T.FINAL, T.CALL_ENDED]


async def test_a_late_subscriber_s_history_has_what_is_never_superseded(hubs: MakeHub) -> None:
    hub = await hubs()
    for kind in (T.CALL_STARTED, T.STREAM_STARTED, T.SPEECH_STARTED, T.PARTIAL, T.FINAL, T.GAP, T.DTMF, T.MARK):
        hub.publish(event(kind))
    hub.publish(CallEvent(T.STREAM_ENDED, "CA1"))
    history = [e.type for e in await asyncio.wait_for(_first(hub.subscribe("CA1"), 7), 5)]
    # a partial is replaced by its final, a speech start by the text: neither is replayed
    assert history == [T.CALL_STARTED, T.STREAM_STARTED, T.FINAL, T.GAP, T.DTMF, T.MARK, T.STREAM_ENDED]


async def _first(subscription: object, count: int) -> list[CallEvent]:
    return [await subscription.next() for _ in range(count)]  # type: ignore[attr-defined]


async def test_calls_are_kept_apart(hubs: MakeHub) -> None:
    hub = await hubs()
    a, b = hub.subscribe("A"), hub.subscribe("B")
    for sid in ("A", "B"):
        hub.publish(CallEvent(T.CALL_STARTED, sid))
        hub.publish(CallEvent(T.FINAL, sid, text=sid))
        hub.publish(CallEvent(T.CALL_ENDED, sid))
    assert [e.text for e in await drain(a) if e.text] == ["A"]
    assert [e.text for e in await drain(b) if e.text] == ["B"]


async def test_full_queue_drops_partials_first_then_cuts_the_subscriber(hubs: MakeHub) -> None:
    hub = await hubs(HubOptions(subscriber_queue=3))
    sub = hub.subscribe("CA1")
    hub.publish(CallEvent(T.CALL_STARTED, "CA1"))
    hub.publish(event(T.PARTIAL, "a"))
    hub.publish(event(T.FINAL, "b"))
    hub.publish(event(T.FINAL, "c"))  # full: the partial goes
    assert sub.dropped_partials == 1 and [e.text for e in sub.queue] == [None, "b", "c"]
    hub.publish(event(T.FINAL, "d"))  # full of must-deliver events: cut
    with pytest.raises(SubscriberOverflow):
        await sub.next()


async def test_subscriber_waits_for_live_events(hubs: MakeHub) -> None:
    hub = await hubs()
    hub.publish(CallEvent(T.CALL_STARTED, "CA1"))
    sub = hub.subscribe("CA1")
    assert (await sub.next()).type is T.CALL_STARTED  # type: ignore[union-attr]
    waiter = asyncio.ensure_future(sub.next())
    await asyncio.sleep(0)  # one turn of the loop: the waiter runs until it blocks
    assert not waiter.done()
    hub.publish(event(T.FINAL, "x"))
    assert (await waiter).text == "x"  # type: ignore[union-attr]


async def test_publish_rules_and_listeners(hubs: MakeHub) -> None:
    hub = await hubs(HubOptions(retained_calls=1))
    seen: list[CallEvent] = []
    hub.add_listener(seen.append)
    hub.add_listener(lambda e: 1 / 0)  # type: ignore[arg-type,func-returns-value]  # a broken sink is logged only
    with pytest.raises(InvalidState):
        hub.publish(event(T.FINAL, "too early"))
    for sid in ("A", "B"):
        hub.publish(CallEvent(T.CALL_STARTED, sid))
        with pytest.raises(InvalidState):
            hub.publish(CallEvent(T.CALL_STARTED, sid))
        assert hub.has_started(sid)
        hub.publish(CallEvent(T.CALL_ENDED, sid))
    with pytest.raises(InvalidState):
        hub.publish(CallEvent(T.FINAL, "B"))
    assert len(seen) == 4
    # only one ended call is retained: A was forgotten
    assert hub.subscribe("A").queue == type(hub.subscribe("A").queue)()
    assert len(hub.subscribe("B").queue) == 2


async def test_subscribers_counts_the_live_followers_of_a_call(hubs: MakeHub) -> None:
    hub = await hubs()
    assert hub.subscribers("CA1") == 0
    first, second = hub.subscribe("CA1"), hub.subscribe("CA1")
    assert (hub.subscribers("CA1"), hub.subscribers("CA2")) == (2, 0)
    hub.unsubscribe(first)
    assert hub.subscribers("CA1") == 1
    hub.publish(CallEvent(T.CALL_STARTED, "CA1"))
    hub.publish(CallEvent(T.CALL_ENDED, "CA1"))
    assert hub.subscribers("CA1") == 0  # the call is over: nobody waits for it any more
    assert [e.type for e in await drain(second)] == [T.CALL_STARTED, T.CALL_ENDED]


# -- across replicas: a follower on one, the call on another -------------------------------------------------------


async def test_a_follower_on_another_replica_gets_the_call_live(hubs: MakeHub, shared: str | None) -> None:
    calls, desk = await hubs(), await hubs()  # the replica the call streams into; the follower's
    early = desk.subscribe("CA1")  # before the call starts
    calls.publish(CallEvent(T.CALL_STARTED, "CA1"))
    calls.publish(event(T.PARTIAL, "hel"))
    calls.publish(event(T.FINAL, "hello"))
    calls.publish(event(T.FINAL, "world"))
    calls.publish(CallEvent(T.CALL_ENDED, "CA1"))
    if shared is None:  # in-process: the follower's replica knows nothing of the call
        assert not early.queue and desk.subscribers("CA1") == 1
        return
    async with asyncio.timeout(30):
        events = await drain(early)
    # the partial reaches the follower if its relay was reading live by then; once stale, it is not worth sending
    assert [(e.type, e.seq, e.text) for e in events if e.type is not T.PARTIAL] == [
        (T.CALL_STARTED, 1, None),
        (T.FINAL, 3, "hello"),
        (T.FINAL, 4, "world"),
        (T.CALL_ENDED, 5, None),
    ]
    assert [(e.seq, e.text) for e in events if e.type is T.PARTIAL] in ([], [(2, "hel")])


async def test_a_late_follower_on_another_replica_gets_the_finals_so_far_then_live(
    hubs: MakeHub, shared: str | None
) -> None:
    calls, desk = await hubs(), await hubs(HubOptions(subscriber_queue=2))
    calls.publish(CallEvent(T.CALL_STARTED, "CA1"))
    for n in range(5):  # a history longer than the follower's queue
        calls.publish(event(T.PARTIAL, f"p{n}"))
        calls.publish(event(T.FINAL, f"f{n}"))
    assert isinstance(calls, CallHub)
    if isinstance(calls, RedisCallHub):
        await until(lambda: calls.link.settled)
    late = desk.subscribe("CA1")
    if shared is None:
        assert not late.queue
        return
    await until(lambda: len(late.queue) == 6)  # started and the five finals, not the stale partials
    calls.publish(event(T.PARTIAL, "live"))
    calls.publish(CallEvent(T.CALL_ENDED, "CA1"))
    async with asyncio.timeout(30):
        events = await drain(late)
    assert [e.text for e in events[1:]] == ["f0", "f1", "f2", "f3", "f4", "live", None]
    assert events[-1].type is T.CALL_ENDED and events[-1].seq == 13


async def test_a_call_streams_into_one_replica_only(hubs: MakeHub, shared: str | None) -> None:
    """A second stream of a call on another replica (a replayed Twilio stream) is told so; in-process, each replica
    refuses only its own second stream (has_started)."""
    first, second = await hubs(), await hubs()
    first.publish(CallEvent(T.CALL_STARTED, "CA1"))
    assert first.has_started("CA1")
    if isinstance(first, RedisCallHub):
        await until(lambda: first.link.settled)
    second.publish(CallEvent(T.CALL_STARTED, "CA1"))
    if isinstance(second, RedisCallHub):
        await until(lambda: second.link.settled)
        assert second.claimed_elsewhere("CA1") and not first.claimed_elsewhere("CA1")
    else:
        assert not second.claimed_elsewhere("CA1")
