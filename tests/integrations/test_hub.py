from __future__ import annotations

import asyncio

import pytest

from streamer.core.errors import InvalidState
from streamer.integrations.hub import CallEvent, CallEventType, CallHub, HubOptions, SubscriberOverflow

T = CallEventType


def event(kind: CallEventType, text: str | None = None, call: str = "CA1") -> CallEvent:
    return CallEvent(kind, call, track="inbound", label="customer", text=text)


async def drain(subscription: object) -> list[CallEvent]:
    return [e async for e in subscription]  # type: ignore[attr-defined]


async def test_live_subscriber_gets_everything_in_order_then_stops() -> None:
    hub = CallHub()
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


async def test_late_subscriber_gets_the_finals_so_far_then_live() -> None:
    hub = CallHub()
    hub.publish(CallEvent(T.CALL_STARTED, "CA1"))
    hub.publish(event(T.PARTIAL, "on"))
    hub.publish(event(T.FINAL, "one"))
    sub = hub.subscribe("CA1")
    hub.publish(event(T.FINAL, "two"))
    hub.publish(CallEvent(T.CALL_ENDED, "CA1"))
    assert [e.text for e in await drain(sub) if e.type is T.FINAL] == ["one", "two"]
    # after the end, the history is still there
    assert [e.type for e in await drain(hub.subscribe("CA1"))] == [T.CALL_STARTED, T.FINAL, T.FINAL, T.CALL_ENDED]


async def test_a_late_subscriber_s_history_has_what_is_never_superseded() -> None:
    hub = CallHub()
    for kind in (T.CALL_STARTED, T.STREAM_STARTED, T.SPEECH_STARTED, T.PARTIAL, T.FINAL, T.GAP, T.DTMF, T.MARK):
        hub.publish(event(kind))
    hub.publish(CallEvent(T.STREAM_ENDED, "CA1"))
    history = [e.type for e in await asyncio.wait_for(_first(hub.subscribe("CA1"), 7), 5)]
    # a partial is replaced by its final, a speech start by the text: neither is replayed
    assert history == [T.CALL_STARTED, T.STREAM_STARTED, T.FINAL, T.GAP, T.DTMF, T.MARK, T.STREAM_ENDED]


async def _first(subscription: object, count: int) -> list[CallEvent]:
    return [await subscription.next() for _ in range(count)]  # type: ignore[attr-defined]


async def test_calls_are_kept_apart() -> None:
    hub = CallHub()
    a, b = hub.subscribe("A"), hub.subscribe("B")
    for sid in ("A", "B"):
        hub.publish(CallEvent(T.CALL_STARTED, sid))
        hub.publish(CallEvent(T.FINAL, sid, text=sid))
        hub.publish(CallEvent(T.CALL_ENDED, sid))
    assert [e.text for e in await drain(a) if e.text] == ["A"]
    assert [e.text for e in await drain(b) if e.text] == ["B"]


async def test_full_queue_drops_partials_first_then_cuts_the_subscriber() -> None:
    hub = CallHub(HubOptions(subscriber_queue=3))
    sub = hub.subscribe("CA1")
    hub.publish(CallEvent(T.CALL_STARTED, "CA1"))
    hub.publish(event(T.PARTIAL, "a"))
    hub.publish(event(T.FINAL, "b"))
    hub.publish(event(T.FINAL, "c"))  # full: the partial goes
    assert sub.dropped_partials == 1 and [e.text for e in sub.queue] == [None, "b", "c"]
    hub.publish(event(T.FINAL, "d"))  # full of must-deliver events: cut
    with pytest.raises(SubscriberOverflow):
        await sub.next()


async def test_subscriber_waits_for_live_events() -> None:
    hub = CallHub()
    hub.publish(CallEvent(T.CALL_STARTED, "CA1"))
    sub = hub.subscribe("CA1")
    assert (await sub.next()).type is T.CALL_STARTED  # type: ignore[union-attr]
    waiter = asyncio.ensure_future(sub.next())
    await asyncio.sleep(0)  # one turn of the loop: the waiter runs until it blocks
    assert not waiter.done()
    hub.publish(event(T.FINAL, "x"))
    assert (await waiter).text == "x"  # type: ignore[union-attr]


def test_publish_rules_and_listeners() -> None:
    hub = CallHub(HubOptions(retained_calls=1))
    seen: list[CallEvent] = []
    hub.add_listener(seen.append)
    hub.add_listener(lambda e: 1 / 0)  # type: ignore[arg-type,func-returns-value]  # a broken sink is logged only
    with pytest.raises(InvalidState):
        hub.publish(event(T.FINAL, "too early"))
    for sid in ("A", "B"):
        hub.publish(CallEvent(T.CALL_STARTED, sid))
        with pytest.raises(InvalidState):
            hub.publish(CallEvent(T.CALL_STARTED, sid))
        assert hub.active_calls() == [sid]
        hub.publish(CallEvent(T.CALL_ENDED, sid))
    with pytest.raises(InvalidState):
        hub.publish(CallEvent(T.FINAL, "B"))
    assert len(seen) == 4
    # only one ended call is retained: A was forgotten
    assert hub.subscribe("A").queue == type(hub.subscribe("A").queue)()
    assert len(hub.subscribe("B").queue) == 2


async def test_subscribers_counts_the_live_followers_of_a_call() -> None:
    hub = CallHub()
    assert hub.subscribers("CA1") == 0
    first, second = hub.subscribe("CA1"), hub.subscribe("CA1")
    assert (hub.subscribers("CA1"), hub.subscribers("CA2")) == (2, 0)
    hub.unsubscribe(first)
    assert hub.subscribers("CA1") == 1
    hub.publish(CallEvent(T.CALL_STARTED, "CA1"))
    hub.publish(CallEvent(T.CALL_ENDED, "CA1"))
    assert hub.subscribers("CA1") == 0  # the call is over: nobody waits for it any more
    assert [e.type for e in await drain(second)] == [T.CALL_STARTED, T.CALL_ENDED]
