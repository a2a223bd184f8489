"""The in-process pub/sub hub of call transcripts, keyed by call id (Twilio's ``callSid``).

Telephony adapters :meth:`CallHub.publish` every transcript event of a call; followers (the read-only
``/v1/calls/{callSid}/events`` socket, :mod:`streamer.integrations.call_events`) :meth:`CallHub.subscribe`; delivery
sinks (:mod:`streamer.integrations.delivery`) register a listener that sees every event of every call.

A subscriber that arrives late first gets the call's history (``call_started``, every ``final``, ``gap``, ``dtmf``,
``mark`` and the streams' starts and ends so far), then the live events. A subscriber that arrives before the call
starts waits for it. Each subscriber has a bounded queue: when it fills, the oldest queued ``partial`` is dropped (a
newer one supersedes it anyway); when only must-deliver events fill it, the subscription is cut (the socket closes
with ``slow_reader``). Ended calls stay retained for late subscribers, the oldest forgotten first beyond
``retained_calls``.

Nothing here does I/O; the hub lives on the event loop thread.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from enum import StrEnum
from typing import Any

from streamer.core.errors import ConfigError, InvalidState

__all__ = ["CallEvent", "CallEventType", "CallHub", "HubOptions", "SubscriberOverflow", "Subscription"]

logger = logging.getLogger(__name__)


class CallEventType(StrEnum):
    CALL_STARTED = "call_started"  # the call's first media stream began; `data` has that stream's metadata
    STREAM_STARTED = "stream_started"  # a media stream of the call began (the first too); `data` has its metadata
    SPEECH_STARTED = "speech_started"
    PARTIAL = "partial"  # unstable text of `segment_id` on `track`, replaced by the next partial or final
    FINAL = "final"  # committed text, never revised
    GAP = "gap"  # media was missing on `track` for [start, end): filled with silence
    DTMF = "dtmf"  # a key pressed on `track` at `start`; `data` has the digit
    MARK = "mark"  # Twilio says audio sent to the call up to a mark has played; `data` has its name
    STREAM_ENDED = "stream_ended"  # a media stream of the call ended; `data` has its statistics and why it ended
    CALL_ENDED = "call_ended"  # the last event of a call; `data` has per-track statistics over its streams


# what a late follower gets of a call's past: what no later event of the call supersedes (call_ended is kept too, last)
_HISTORY = frozenset(
    {
        CallEventType.CALL_STARTED,
        CallEventType.STREAM_STARTED,
        CallEventType.FINAL,
        CallEventType.GAP,
        CallEventType.DTMF,
        CallEventType.MARK,
        CallEventType.STREAM_ENDED,
        CallEventType.CALL_ENDED,
    }
)


@dataclass(frozen=True)
class CallEvent:
    """One event of a call, as followers and sinks see it. Times are seconds from the start of the call's first
    stream (:mod:`streamer.integrations.twilio_calls`)."""

    type: CallEventType
    call_sid: str
    # position in the call's event sequence, from 1; set by the hub
    seq: int = 0
    # the track it belongs to ("inbound", "outbound", ...), and who speaks on it ("customer", "agent")
    track: str | None = None
    label: str | None = None
    segment_id: int | None = None
    text: str | None = None
    start: float | None = None
    end: float | None = None
    data: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON object sent to followers and sinks: fields that are None are left out."""
        return {key: value for key, value in asdict(self).items() if value is not None}


@dataclass(frozen=True)
class HubOptions:
    """Bounds of the hub. Validated in :meth:`validate`."""

    # events queued per subscriber before partials are dropped and then the subscriber is cut
    subscriber_queue: int = 256
    # ended calls kept for late subscribers
    retained_calls: int = 1000
    # finals kept per call for late subscribers (the oldest are forgotten beyond this)
    history: int = 10000
    # followers (/v1/calls/{callSid}/events sockets) open at once, over every call: each holds a socket and a queue
    max_followers: int = 64
    # seconds a follower may wait with no event of its call (not started yet, or silent) before it is closed (4408)
    follower_idle_timeout: float = 300.0

    def validate(self) -> None:
        """Raise :class:`~streamer.core.errors.ConfigError` naming the first invalid field."""
        for name in ("subscriber_queue", "retained_calls", "history", "max_followers"):
            if getattr(self, name) < 1:
                raise ConfigError(f"hub {name} must be >= 1")
        if self.follower_idle_timeout <= 0:
            raise ConfigError("hub follower_idle_timeout must be > 0")


class Subscription:
    """A follower's view of one call; iterate with ``async for event in subscription``. Ends after
    ``call_ended``; raises :class:`SubscriberOverflow` if the follower fell too far behind."""

    def __init__(self, call_sid: str, capacity: int, notify: Callable[[], None] | None = None) -> None:
        self.call_sid = call_sid
        self.capacity = capacity
        self.queue: deque[CallEvent] = deque()
        self.dropped_partials = 0
        self.overflowed = False
        self._finished = False
        self._ready = asyncio.Event()
        # called after every event put (a follower's adapter wakes its runner with it)
        self._notify = notify

    def put(self, event: CallEvent) -> None:
        if self.overflowed:
            return
        if len(self.queue) >= self.capacity:
            for queued in self.queue:
                if queued.type is CallEventType.PARTIAL:
                    self.queue.remove(queued)
                    self.dropped_partials += 1
                    break
            else:
                self.overflowed = True
        if not self.overflowed:
            self.queue.append(event)
        self._ready.set()
        if self._notify is not None:
            self._notify()

    @property
    def finished(self) -> bool:
        """Whether ``call_ended`` has been taken: nothing follows it."""
        return self._finished

    def take(self) -> CallEvent | None:
        """The next queued event without waiting: None when none is queued (or after ``call_ended``); raises
        :class:`SubscriberOverflow` once the follower fell too far behind."""
        if self._finished:
            return None
        if self.overflowed:
            raise SubscriberOverflow(f"the follower did not read {self.capacity} events in time")
        if not self.queue:
            return None
        event = self.queue.popleft()
        self._finished = event.type is CallEventType.CALL_ENDED
        return event

    async def next(self) -> CallEvent | None:
        """The next event; None once ``call_ended`` has been returned."""
        while not self.queue and not self.overflowed and not self._finished:
            self._ready.clear()
            await self._ready.wait()
        return self.take()

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> CallEvent:
        event = await self.next()
        if event is None:
            raise StopAsyncIteration
        return event


class SubscriberOverflow(Exception):
    """A subscriber's queue filled with events that must not be dropped."""


class _Topic:
    def __init__(self, call_sid: str) -> None:
        self.call_sid = call_sid
        self.seq = 0
        self.started = False
        self.ended = False
        # the call streams into this process (its events are published here, not relayed from another replica)
        self.local = False
        self.history: deque[CallEvent] = deque()
        self.subscribers: set[Subscription] = set()


Listener = Callable[[CallEvent], None]


class CallHub:
    """See the module docstring."""

    def __init__(self, options: HubOptions | None = None) -> None:
        self.options = options = options or HubOptions()
        options.validate()
        self._topics: OrderedDict[str, _Topic] = OrderedDict()
        self._listeners: list[Listener] = []

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener`` with every event of every call (after the subscribers got it). It must not raise."""
        self._listeners.append(listener)

    def subscribers(self, call_sid: str) -> int:
        """How many followers wait for ``call_sid``'s live events."""
        topic = self._topics.get(call_sid)
        return 0 if topic is None else len(topic.subscribers)

    def has_started(self, call_sid: str) -> bool:
        """Whether ``call_sid`` has a ``call_started`` already (live or ended): a second stream may not reuse it."""
        topic = self._topics.get(call_sid)
        return topic is not None and (topic.started or topic.ended)

    def claimed_elsewhere(self, call_sid: str) -> bool:
        """Whether another replica holds ``call_sid`` (a second stream of it here must stop). Never, in-process; see
        :class:`~streamer.integrations.hub_redis.RedisCallHub`."""
        return False

    def _topic(self, call_sid: str) -> _Topic:
        topic = self._topics.get(call_sid)
        if topic is None:
            topic = self._topics[call_sid] = _Topic(call_sid)
        return topic

    def publish(self, event: CallEvent) -> CallEvent:
        """Number ``event`` in its call's sequence and hand it to every subscriber and listener; returns it
        numbered. ``call_started`` must come first and ``call_ended`` last."""
        topic = self._topic(event.call_sid)
        if topic.ended:
            raise InvalidState(f"call {event.call_sid} has ended")
        if event.type is CallEventType.CALL_STARTED:
            if topic.started:
                raise InvalidState(f"call {event.call_sid} has already started")
            topic.started = topic.local = True
        elif not topic.started or not topic.local:
            raise InvalidState(f"call {event.call_sid} has not started here")
        topic.seq += 1
        event = replace(event, seq=topic.seq)
        self._fan_out(topic, event)
        for listener in self._listeners:
            try:
                listener(event)
            except Exception:  # a sink's bug must not break the call
                logger.exception("event=listener_failed call=%s", event.call_sid)
        return event

    def relay(self, event: CallEvent, backlog: bool = False) -> None:
        """Hand an event of a call streaming into another replica (numbered there) to this process's followers;
        ``backlog``: an event from before they subscribed (followers get the call's history however long). Events
        already seen, and events of a call streaming here, are ignored. Delivery sinks are not called: the replica
        of the call delivers it."""
        topic = self._topic(event.call_sid)
        if topic.local or topic.ended or event.seq <= topic.seq:
            return
        if backlog and event.type not in _HISTORY:
            topic.seq = event.seq  # a stale partial or speech_started: nobody needs it now
            return
        if event.type is CallEventType.CALL_STARTED:
            topic.started = True
        topic.seq = event.seq
        if backlog:
            for subscriber in topic.subscribers:
                subscriber.capacity += 1  # the history of a long call may exceed the queue
        self._fan_out(topic, event)

    def _fan_out(self, topic: _Topic, event: CallEvent) -> None:
        if event.type in _HISTORY and event.type is not CallEventType.CALL_ENDED:  # call_ended: below, once it is out
            topic.history.append(event)
            if len(topic.history) > self.options.history:
                topic.history.popleft()
        for subscriber in list(topic.subscribers):
            subscriber.put(event)
        if event.type is CallEventType.CALL_ENDED:
            topic.ended = True
            topic.history.append(event)
            topic.subscribers.clear()
            self._retire()

    def subscribe(self, call_sid: str, notify: Callable[[], None] | None = None) -> Subscription:
        """Follow ``call_sid``: its history first, then live events; ``notify`` is called after each event put in
        the subscription's queue. Call :meth:`unsubscribe` when done."""
        topic = self._topic(call_sid)
        # the history of a long call may exceed the queue: a late follower may hold it all
        subscription = Subscription(call_sid, self.options.subscriber_queue + len(topic.history), notify)
        for event in topic.history:
            subscription.put(event)
        if not topic.ended:
            topic.subscribers.add(subscription)
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        topic = self._topics.get(subscription.call_sid)
        if topic is None:
            return
        topic.subscribers.discard(subscription)
        if not topic.started and not topic.subscribers:
            del self._topics[subscription.call_sid]  # nobody waits for a call that never came

    def _retire(self) -> None:
        ended = [sid for sid, topic in self._topics.items() if topic.ended]
        for sid in ended[: max(0, len(ended) - self.options.retained_calls)]:
            del self._topics[sid]
